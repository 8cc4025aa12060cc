"""SigMF recordings of received uploads (one ``.sigmf-meta`` + ``.sigmf-data`` per upload).

Each recording holds the received complex baseband of one upload as ``cf32_le`` with the
sample rate, centre frequency, the link and hardware names, and an annotation over the
whole capture carrying the device, the round and the receiver's per-frame estimates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

#: Namespace of the testbed's own SigMF keys.
NS = "dpfl"


def recording_stem(device: int, round_index: int) -> str:
    """File stem of the recording of one upload, e.g. ``dev003_round00012``."""
    return f"dev{device:03d}_round{round_index:05d}"


@dataclass(frozen=True)
class Recording:
    """One recorded upload.

    Attributes
    ----------
    samples
        ``complex64``, shape ``(n,)``.
    sample_rate_hz, center_freq_hz
        Capture parameters.
    device, round_index, n_payload
        Which upload, and its payload length in symbols.
    annotations
        The testbed's keys of the capture annotation (without namespace).
    """

    samples: np.ndarray
    sample_rate_hz: float
    center_freq_hz: float
    device: int
    round_index: int
    n_payload: int
    annotations: Mapping[str, object]


def write_recording(
    directory: Path,
    samples: np.ndarray,
    *,
    sample_rate_hz: float,
    center_freq_hz: float,
    device: int,
    round_index: int,
    n_payload: int,
    hw: str,
    link: str,
    estimates: Mapping[str, float] | None = None,
) -> Path:
    """Write one upload's received I/Q as SigMF; returns the ``.sigmf-meta`` path."""
    import sigmf  # on use, as in read_recording: it imports jsonschema, 40 ms of every run
    from sigmf import SigMFFile

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / recording_stem(device, round_index)
    data_path = stem.with_suffix(".sigmf-data")
    np.asarray(samples, dtype=np.complex64).tofile(data_path)
    meta = SigMFFile(
        data_file=str(data_path),
        global_info={
            sigmf.DATATYPE_KEY: "cf32_le",
            sigmf.SAMPLE_RATE_KEY: float(sample_rate_hz),
            sigmf.HW_KEY: hw,
            sigmf.RECORDER_KEY: f"dpfl-testbed {link} link",
            sigmf.DESCRIPTION_KEY: f"received upload of device {device}, round {round_index}",
            sigmf.AUTHOR_KEY: "dpfl-testbed",
            sigmf.EXTENSIONS_KEY: [{"name": NS, "version": "0.1.0", "optional": True}],
        },
    )
    meta.add_capture(
        0,
        metadata={
            sigmf.FREQUENCY_KEY: float(center_freq_hz),
            sigmf.DATETIME_KEY: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    )
    annotation: dict[str, object] = {
        sigmf.LABEL_KEY: recording_stem(device, round_index),
        f"{NS}:device": int(device),
        f"{NS}:round": int(round_index),
        f"{NS}:n_payload": int(n_payload),
        f"{NS}:link": link,
    }
    for key, value in (estimates or {}).items():
        annotation[f"{NS}:{key}"] = float(value)
    meta.add_annotation(0, int(np.asarray(samples).size), metadata=annotation)
    meta_path = stem.with_suffix(".sigmf-meta")
    meta.tofile(str(meta_path))
    return meta_path


def read_recording(directory: Path, device: int, round_index: int) -> Recording:
    """Load the recording of one upload written by :func:`write_recording`.

    Raises
    ------
    FileNotFoundError
        If ``directory`` holds no recording of that device and round.
    """
    meta_path = Path(directory) / f"{recording_stem(device, round_index)}.sigmf-meta"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no recording of device {device}, round {round_index} in '{directory}'"
        )
    import sigmf
    from sigmf.sigmffile import fromfile

    handle = fromfile(str(meta_path))
    samples = handle.read_samples().astype(np.complex64)
    glob = handle.get_global_info()
    capture = handle.get_captures()[0]
    ann = handle.get_annotations()[0]
    ours = {k.split(":", 1)[1]: v for k, v in ann.items() if k.startswith(f"{NS}:")}
    return Recording(
        samples=samples,
        sample_rate_hz=float(glob[sigmf.SAMPLE_RATE_KEY]),
        center_freq_hz=float(capture[sigmf.FREQUENCY_KEY]),
        device=int(ours["device"]),
        round_index=int(ours["round"]),
        n_payload=int(ours["n_payload"]),
        annotations=ours,
    )


def append_frame_log(directory: Path, record: Mapping[str, float | int | str]) -> None:
    """Append one line of per-frame measurements to ``directory/frames.jsonl``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "frames.jsonl").open("a") as fh:
        fh.write(json.dumps(dict(record), sort_keys=True) + "\n")
