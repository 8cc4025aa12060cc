"""TensorBoard event files of a run, written as it goes (``RUN_DIR/tensorboard/``).

Every run (``testbed run``, the lab's ``testbed aggregator``, each sweep cell) writes them
through :class:`RunBoard`, from :func:`aggregator.run_rounds.run_rounds` (the one loop
around the rounds of both): ``testbed watch RUN_DIR`` shows them. Per committed round
(step = the 0-based round, as in ``metrics.jsonl``), read from the round's metrics line:

=========================== ========================================================
tag                         what
=========================== ========================================================
``accuracy/test``,          full test set (every ``eval_every`` rounds and the last);
``accuracy/subset``         the fixed evaluation subset (every round)
``loss/train``, ``loss/…``  the round's training loss; test and subset losses
``epsilon/device_NN``       each device's enforced epsilon after its upload (its unit
                            and accounting in the settings text), ``epsilon/target``,
                            ``epsilon/max`` (largest so far)
``snr_db/device_NN``        each frame's estimated SNR (a TDMA slot's ``snr_est_db``,
                            else the reception's ``snr_db``); ``snr_db/device_NN_budget``
                            the configured SNR of a simulated link; ``snr_db/min``,
                            ``snr_db/mean``
``n0/device_NN``            the reception's noise-variance estimate; ``n0_lower/…``
                            its lower confidence bound (an estimated channel: what
                            the credit rests on, before a calibration's cap);
                            ``n0_off_frame/…``
                            a slot capture's off-frame noise (where the line has them)
``uploads/…``               ``received``, ``lost``, ``late`` (no answer in time),
                            ``refused``, per round; ``uploads_cause/<kind>_<cause>``
                            the running count of each cause seen
``energy_j/device_NN``      each device's energy so far (radio + computing, J);
                            ``energy_j/total``, ``energy_j/round``
``round_time_s/<stage>``    the round's wall time by stage (the line's ``wall_s``)
``air/budget_snr_db/<serial>`` a virtual air's link-budget SNR of each burst
=========================== ========================================================

Per-device tags are written for the first :data:`PER_DEVICE_TAGS` devices (the aggregates
for all). Images every :data:`IMAGE_EVERY` rounds, the first and the last: the virtual
air's burst timeline (its ``air.jsonl``, in the run directory or beside it in a launch
folder) and, with ``record: true``, the density of the newest recorded upload's received
constellation. Text: the run's settings (``config.yaml``), its trust statement, and at the
end its outcome. The event files never hold an update, a key, a secret or a noise draw:
only the figures of the metrics line, the config, and images of aggregates (burst times
and powers; a 2-D histogram of received samples).

Without the ``tensorboard`` package a run writes nothing here and says so in one line.
``TESTBED_TENSORBOARD=0`` turns the event files off (the benchmark's baseline).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: Folder of a run directory that holds its event files.
TB_DIR = "tensorboard"
#: Environment variable: ``0`` (or ``off``, ``false``, ``no``) turns the event files off.
ENV_SWITCH = "TESTBED_TENSORBOARD"
#: Devices that get tags of their own (ids below this); the aggregates cover every device.
PER_DEVICE_TAGS = 64
#: Rounds between two images (the first and the last round always get them).
IMAGE_EVERY = 10
#: Bursts at most in one timeline image (the newest).
TIMELINE_BURSTS = 400
#: The one line a run prints when the package is missing.
MISSING_NOTE = ("tensorboard: not installed, so no event files are written "
                "(pip install tensorboard, or `make`, installs it)")

Note = Callable[[str], None]


def tensorboard_available() -> bool:
    """Whether the ``tensorboard`` package (its event writer) can be imported."""
    try:
        import tensorboard.summary.writer.event_file_writer  # noqa: F401
    except ImportError:
        return False
    return True


def switched_off() -> bool:
    """Whether :data:`ENV_SWITCH` turns the event files off."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("0", "off", "false", "no")


def device_tag(device: int, devices: int) -> str:
    """``device_07`` (two digits, more for 100 devices or more)."""
    return f"device_{device:0{max(2, len(str(max(devices - 1, 0))))}d}"


def classify_cause(text: str) -> str:
    """A short cause of a lost, refused or late upload from its message."""
    low = text.lower()
    for cause, pattern in (
        ("late_burst", r"\blate\b"),
        ("collision", r"\bcollision"),
        ("receiver_gap", r"\bgaps?\b"),
        ("budget", r"\bepsilon\b|\bbudget\b"),
        ("no_frame", r"\bpreamble|\bnot found\b|\bsync|\bframe\b"),
        ("timeout", r"\btime ?out\b|\btimed out\b"),
    ):
        if re.search(pattern, low):
            return cause
    return "other"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


class RoundFigures:
    """The scalars of each round from its metrics line, with the running figures (the
    largest epsilon, energy so far, causes counted) that a resumed run rebuilds from the
    lines committed before.

    Parameters
    ----------
    devices
        Devices of the run.
    epsilon_key
        The metrics entry that holds a device's enforced epsilon (``epsilon_pld``, ...);
        ``None``: no privacy accounting.
    epsilon_target
        The run's epsilon target (``None``: none).
    budget_snr_db
        Each device's configured SNR (a simulated link's link budget; ``None``: none).
    """

    def __init__(self, devices: int, *, epsilon_key: str | None,
                 epsilon_target: float | None,
                 budget_snr_db: Sequence[float] | None = None) -> None:
        self.devices = devices
        self.epsilon_key = epsilon_key
        self.epsilon_target = epsilon_target
        self.budget = list(budget_snr_db) if budget_snr_db is not None else None
        self.eps_max = 0.0
        self.energy = [0.0] * devices
        self.causes: dict[str, int] = {}

    def _tag(self, device: int) -> str | None:
        return device_tag(device, self.devices) if device < PER_DEVICE_TAGS else None

    def scalars(self, line: dict[str, Any]) -> dict[str, float]:
        """The tags and values of one round's metrics ``line`` (running figures updated)."""
        out: dict[str, float] = {}
        for key, name in (("test_accuracy", "accuracy/test"),
                         ("subset_accuracy", "accuracy/subset"),
                         ("train_loss", "loss/train"), ("test_loss", "loss/test"),
                         ("subset_loss", "loss/subset")):
            x = _finite(line.get(key))
            if x is not None:
                out[name] = x
        counts = {"received": 0, "lost": 0, "late": 0, "refused": 0}
        snrs: list[float] = []
        round_energy = 0.0
        for d in line.get("devices", []):
            i = int(d.get("device", -1))
            if not 0 <= i < self.devices:
                continue
            tag = self._tag(i)
            kind = self._kind(d)
            counts[kind] += 1
            if kind != "received":
                text = str(d.get("refused") or d.get("error") or d.get("reason") or "")
                cause = f"{kind}_{classify_cause(text) if text else 'no_answer'}"
                self.causes[cause] = self.causes.get(cause, 0) + 1
            if self.epsilon_key is not None:
                eps = _finite(d.get(self.epsilon_key))
                if eps is not None:
                    self.eps_max = max(self.eps_max, eps)
                    if tag:
                        out[f"epsilon/{tag}"] = eps
            snr = _finite(d.get("snr_est_db", d.get("snr_db")))
            if snr is not None:
                snrs.append(snr)
                if tag:
                    out[f"snr_db/{tag}"] = snr
            if tag and self.budget is not None and kind == "received" and i < len(self.budget):
                out[f"snr_db/{tag}_budget"] = float(self.budget[i])
            for key, group in (("noise_var", "n0"), ("noise_var_lower", "n0_lower"),
                               ("n0_off_frame", "n0_off_frame")):
                x = _finite(d.get(key))
                if x is not None and tag:
                    out[f"{group}/{tag}"] = x
            spent = sum(_finite(d.get(k)) or 0.0 for k in ("energy_comm_j", "energy_comp_j"))
            self.energy[i] += spent
            round_energy += spent
            if tag:
                out[f"energy_j/{tag}"] = self.energy[i]
        if self.epsilon_key is not None:
            out["epsilon/max"] = self.eps_max
            if self.epsilon_target is not None:
                out["epsilon/target"] = float(self.epsilon_target)
        if snrs:
            out["snr_db/min"] = min(snrs)
            out["snr_db/mean"] = sum(snrs) / len(snrs)
        out |= {f"uploads/{k}": float(v) for k, v in counts.items()}
        out |= {f"uploads_cause/{k}": float(v) for k, v in self.causes.items()}
        out["energy_j/round"] = round_energy
        out["energy_j/total"] = sum(self.energy)
        for stage, seconds in (line.get("wall_s") or {}).items():
            x = _finite(seconds)
            if x is not None:
                out[f"round_time_s/{stage}"] = x
        return out

    @staticmethod
    def _kind(d: dict[str, Any]) -> str:
        if d.get("straggler"):
            return "late"
        if d.get("refused") is not None or d.get("transmitted") is False:
            return "refused"
        if d.get("lost"):
            return "lost"
        return "received"


def air_log_paths(run_dir: Path) -> list[Path]:
    """Where a run's virtual air logs its bursts: ``RUN/air/air.jsonl`` (the aggregator's
    own air), else ``LAUNCH/air/air.jsonl`` beside a launch's ``aggregator`` folder (one
    whose folder holds the launch's ``hw.yaml``)."""
    from testbed.core.lab_checks import LAUNCH_HW

    paths = [run_dir / "air" / "air.jsonl"]
    if (run_dir.parent / LAUNCH_HW).is_file():
        paths.append(run_dir.parent / "air" / "air.jsonl")
    return paths


class AirTail:
    """The burst lines of an air log that arrived since the last read (a file still being
    appended to: a partial last line waits for the next read)."""

    def __init__(self, candidates: Sequence[Path]) -> None:
        self.candidates = list(candidates)
        self.path: Path | None = None
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        """New complete burst lines (summary lines skipped)."""
        if self.path is None:
            self.path = next((p for p in self.candidates if p.is_file()), None)
            if self.path is None:
                return []
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out: list[dict[str, Any]] = []
        for raw in data[:end].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and "summary" not in line:
                out.append(line)
        return out


class RunBoard:
    """The event files of one run (a no-op once closed or after a failure: TensorBoard
    never stops a run; a failure is said in one line and the files stop there).

    Parameters
    ----------
    run_dir
        The run directory; files go to ``run_dir/tensorboard``.
    figures
        The per-round scalars (:class:`RoundFigures`).
    rounds
        Rounds planned (the last round gets images).
    note
        Where the one-line notes go.
    sample_rate_hz
        The air's sample rate (burst lengths in the timeline; ``None``: drawn as points).
    recordings
        The run's SigMF recordings of received uploads (``record: true``), else ``None``.
    """

    def __init__(self, run_dir: Path, figures: RoundFigures, *, rounds: int, note: Note,
                 sample_rate_hz: float | None = None,
                 recordings: Path | None = None) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        t0 = time.perf_counter()
        self.run_dir = Path(run_dir)
        self.figures = figures
        self.rounds = rounds
        self.note = note
        self.sample_rate_hz = sample_rate_hz
        self.recordings = recordings
        self.air = AirTail(air_log_paths(self.run_dir))
        self.bursts: list[dict[str, Any]] = []  # the newest, for the next timeline
        self.round_bursts: list[dict[str, Any]] = []  # logged during the last round
        self.writer: Any = EventFileWriter(str(self.run_dir / TB_DIR), max_queue_size=50,
                                           flush_secs=30)
        self.images = 0
        #: Seconds this run spent on its event files (importing the package included).
        self.spent_s = time.perf_counter() - t0

    # -- events --------------------------------------------------------------------------

    def _event(self, step: int, values: list[Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self.writer.add_event(event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))

    @staticmethod
    def _scalar(tag: str, value: float) -> Any:
        from tensorboard.compat.proto import summary_pb2

        return summary_pb2.Summary.Value(tag=tag, simple_value=value)

    def _guard(self, what: Callable[[], None]) -> None:
        if self.writer is None:
            return
        t0 = time.perf_counter()
        try:
            what()
        except Exception as exc:  # noqa: BLE001 - never stop a run for its event files
            self.note(f"tensorboard: event files stopped ({type(exc).__name__}: {exc})")
            self._drop()
        finally:
            self.spent_s += time.perf_counter() - t0

    def _drop(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001, S110 - already failing
                pass

    def text(self, tag: str, body: str, step: int = 0) -> None:
        """A text (markdown) under ``tag``."""
        def write() -> None:
            self._event(step, [text_value(tag, body)])
            self.writer.flush()
        self._guard(write)

    def start(self, settings: str, trust: str | None, layout: bool = True) -> None:
        """The run's settings and trust statement as text, and the custom-scalars layout
        (each device's SNR estimate next to its budget)."""
        self.text("settings", settings)
        self.text("trust", trust or "No privacy accounting (no epsilon): nothing to trust.")
        if layout and self.figures.budget is not None:
            self._guard(self._layout)

    def _layout(self) -> None:
        from tensorboard.plugins.custom_scalar import layout_pb2, metadata

        n = min(self.figures.devices, PER_DEVICE_TAGS)
        charts = [
            layout_pb2.Chart(
                title=f"SNR {device_tag(i, self.figures.devices)}: estimate vs budget (dB)",
                multiline=layout_pb2.MultilineChartContent(
                    tag=[rf"snr_db/{device_tag(i, self.figures.devices)}(_budget)?$"]),
            )
            for i in range(n)
        ]
        proto = layout_pb2.Layout(category=[layout_pb2.Category(title="SNR vs link budget",
                                                                 chart=charts)])
        self._event(0, [string_value(metadata.CONFIG_SUMMARY_TAG,
                                     metadata.create_summary_metadata(),
                                     proto.SerializeToString())])

    def round(self, line: dict[str, Any]) -> None:
        """Round ``line["round"]`` was committed with metrics ``line``."""
        def write() -> None:
            t = int(line["round"])
            values = [self._scalar(k, v) for k, v in self.figures.scalars(line).items()]
            bursts = self.air.read()
            self.round_bursts = bursts
            self.bursts.extend(bursts)
            del self.bursts[:-TIMELINE_BURSTS]
            for b in bursts:
                snr, serial = _finite(b.get("budget_snr_db")), b.get("serial")
                if snr is not None and isinstance(serial, str) and serial.isprintable():
                    values.append(self._scalar(f"air/budget_snr_db/{serial}", snr))
            if t == 0 or (t + 1) % IMAGE_EVERY == 0 or t + 1 == self.rounds:
                values += self._images(t)
            self._event(t, values)
            self.writer.flush()
        self._guard(write)

    def _images(self, t: int) -> list[Any]:
        from tensorboard.compat.proto import summary_pb2

        from testbed.core.runs.tensorboard_images import (
            constellation_png,
            newest_recording,
            timeline_png,
        )

        out = []
        pictures: list[tuple[str, tuple[bytes, int, int] | None]] = []
        if self.bursts:
            pictures.append(("air/burst_timeline", timeline_png(
                self.bursts, self.round_bursts, self.sample_rate_hz, t)))
            self.bursts = []
        recording = newest_recording(self.recordings) if self.recordings else None
        if recording is not None:
            pictures.append(("radio/received_constellation", constellation_png(recording)))
        for tag, png in pictures:
            if png is None:
                continue
            data, width, height = png
            image = summary_pb2.Summary.Image(height=height, width=width, colorspace=4,
                                              encoded_image_string=data)
            out.append(summary_pb2.Summary.Value(tag=tag, image=image))
            self.images += 1
        return out

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """The outcome (``summary.json``'s figures) as text and ``final/`` scalars, then
        this writer's own time (``tensorboard/writing_s``); closes the files."""
        if self.writer is None:
            return
        if summary is not None:
            def final() -> None:
                step = max(0, int(summary.get("rounds_completed") or 0) - 1)
                values = [self._scalar(f"final/{k}", v) for k, v in final_figures(summary)
                          .items()]
                self._event(step, values)
                status = summary.get("status", "?")
                trust = (summary.get("privacy") or {}).get("trust")
                body = f"**{status}**: {summary.get('reason') or 'all rounds ran'}"
                if trust:
                    body += f"\n\n{trust}"
                self._event(step, [text_value("outcome", body)])
            self._guard(final)
            step = max(0, int(summary.get("rounds_completed") or 0) - 1)
            spent = self.spent_s
            self._guard(lambda: self._event(step, [
                self._scalar("tensorboard/writing_s", spent),
                self._scalar("tensorboard/run_wall_s",
                             float(summary.get("wall_time_s") or 0.0))]))
        self._guard(self._drop)


def string_value(tag: str, metadata: Any, data: bytes) -> Any:
    """A summary value holding one string tensor ``data`` with a plugin's ``metadata``
    (what the text and custom-scalars plugins read; built without TensorFlow)."""
    from tensorboard.compat.proto import (
        summary_pb2,
        tensor_pb2,
        tensor_shape_pb2,
        types_pb2,
    )

    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[data],
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto())
    return summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)


def text_value(tag: str, body: str) -> Any:
    """A text-plugin summary value (markdown ``body``) under ``tag``."""
    from tensorboard.plugins.text import metadata

    return string_value(tag, metadata.create_summary_metadata(display_name=tag,
                                                              description=""),
                        body.encode("utf-8"))


def final_figures(summary: dict[str, Any]) -> dict[str, float]:
    """A finished run's figures for HParams: ``accuracy`` (final test accuracy),
    ``epsilon_max`` (largest enforced epsilon), ``energy_j`` (every device, radio and
    computing), ``rounds``; missing ones left out."""
    out: dict[str, float] = {}
    acc = _finite(summary.get("final_accuracy"))
    if acc is not None:
        out["accuracy"] = acc
    eps = [_finite(d.get("epsilon")) for d in (summary.get("privacy") or {}).get("devices", [])]
    finite = [e for e in eps if e is not None]
    if finite:
        out["epsilon_max"] = max(finite)
    energy = [_finite(x) or 0.0 for key in ("energy_comm_j_per_device",
                                            "energy_comp_j_per_device")
              for x in summary.get(key) or []]
    out["energy_j"] = sum(energy)
    out["rounds"] = float(summary.get("rounds_completed") or 0)
    return out


def open_board(run_dir: Path, figures: RoundFigures, *, rounds: int, note: Note,
               settings: str, trust: str | None, sample_rate_hz: float | None = None,
               recordings: Path | None = None) -> RunBoard | None:
    """A run's :class:`RunBoard` with its settings and trust written, or ``None``: turned
    off (:data:`ENV_SWITCH`), or the package missing (``note`` gets
    :data:`MISSING_NOTE`), or the folder could not be made (said in one line)."""
    if switched_off():
        return None
    t0 = time.perf_counter()
    if not tensorboard_available():
        note(MISSING_NOTE)
        return None
    try:
        board = RunBoard(run_dir, figures, rounds=rounds, note=note,
                         sample_rate_hz=sample_rate_hz, recordings=recordings)
    except Exception as exc:  # noqa: BLE001 - never stop a run for its event files
        note(f"tensorboard: no event files ({type(exc).__name__}: {exc})")
        return None
    board.spent_s = time.perf_counter() - t0
    board.start(settings, trust)
    return board
