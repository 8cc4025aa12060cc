"""The messages between virtual USRPs and the virtual air (ZeroMQ, two frames each).

* **Bursts** (a virtual transmitter -> the air): the air binds a PULL socket at
  ``virtual_air.burst_address``; each ``tx`` flowgraph with a virtual device connects a
  PUSH socket. Frame 0 is a JSON header (:class:`BurstHeader`), frame 1 the burst's samples
  as ``complex64`` in radiated amplitude: ``|x|^2`` is the instantaneous radiated power (W).
* **Stream** (the air -> the virtual receiver): the air binds a PUSH socket at
  ``virtual_air.stream_address``; the ``rx`` flowgraph with a virtual device connects a PULL
  socket. Frame 0 is a JSON header (:class:`ChunkHeader`), frame 1 the samples at the
  receiver's antenna, ``complex64`` in amplitude (``|y|^2`` in W), thermal noise included.
  Chunks are consecutive: ``index`` of one is ``index + n`` of the one before.

Times are true times (s): the host UNIX clock of the process that stamps them
(:mod:`radio.virtual_device`). numpy and the standard library only (both interpreters).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

import numpy as np

#: Version of the message layout; a mismatch is refused.
WIRE_VERSION = 1


@dataclass(frozen=True)
class BurstHeader:
    """One transmitted burst.

    Attributes
    ----------
    serial
        The transmitter's ``serial``.
    t_true_s
        True time (s) at which the burst's first sample leaves the antenna.
    sample_rate_hz
        The transmitter's sample rate (S/s).
    center_freq_hz
        Its carrier (Hz) as applied.
    gain_db
        Its gain (dB) as applied.
    n
        Samples in the burst.
    power_w
        Mean radiated power over the burst (W).
    """

    serial: str
    t_true_s: float
    sample_rate_hz: float
    center_freq_hz: float
    gain_db: float
    n: int
    power_w: float


@dataclass(frozen=True)
class ChunkHeader:
    """One chunk of the receiver's stream.

    Attributes
    ----------
    index
        Air sample index of the chunk's first sample (sample ``k`` is at true time
        ``t0_true_s + k / sample_rate_hz``).
    t0_true_s
        True time (s) of air sample 0.
    sample_rate_hz
        The air's sample rate (S/s).
    n
        Samples in the chunk.
    """

    index: int
    t0_true_s: float
    sample_rate_hz: float
    n: int

    @property
    def t_true_s(self) -> float:
        """True time (s) of the chunk's first sample."""
        return self.t0_true_s + self.index / self.sample_rate_hz


def _encode(header: BurstHeader | ChunkHeader, samples: np.ndarray) -> list[bytes]:
    x = np.ascontiguousarray(samples, dtype=np.complex64)
    if x.ndim != 1 or x.size != header.n:
        raise ValueError(f"samples: shape {x.shape}; the header says n={header.n}")
    meta = {"v": WIRE_VERSION, **asdict(header)}
    return [json.dumps(meta).encode(), x.tobytes()]


def encode_burst(header: BurstHeader, samples: np.ndarray) -> list[bytes]:
    """The two frames of a burst message."""
    return _encode(header, samples)


def encode_chunk(header: ChunkHeader, samples: np.ndarray) -> list[bytes]:
    """The two frames of a stream chunk."""
    return _encode(header, samples)


def _decode(frames: list[bytes], cls: type[BurstHeader] | type[ChunkHeader]
            ) -> tuple[dict, np.ndarray]:
    if len(frames) != 2:
        raise ValueError(f"virtual air message: {len(frames)} frames; expected 2")
    try:
        meta = json.loads(frames[0])
    except ValueError as exc:
        raise ValueError(f"virtual air message: header is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.pop("v", None) != WIRE_VERSION:
        raise ValueError(f"virtual air message: wire version is not {WIRE_VERSION}")
    names = {f.name for f in fields(cls)}
    if set(meta) != names:
        raise ValueError(f"virtual air message: header keys {sorted(meta)}; "
                         f"expected {sorted(names)}")
    x = np.frombuffer(frames[1], dtype=np.complex64)
    if x.size != int(meta["n"]):
        raise ValueError(f"virtual air message: {x.size} samples; the header says {meta['n']}")
    return meta, x


def decode_burst(frames: list[bytes]) -> tuple[BurstHeader, np.ndarray]:
    """A burst message's header and samples (read-only view).

    Raises
    ------
    ValueError
        Not a burst message of this wire version.
    """
    meta, x = _decode(frames, BurstHeader)
    return BurstHeader(**meta), x


def decode_chunk(frames: list[bytes]) -> tuple[ChunkHeader, np.ndarray]:
    """A stream chunk's header and samples (read-only view).

    Raises
    ------
    ValueError
        Not a stream chunk of this wire version.
    """
    meta, x = _decode(frames, ChunkHeader)
    return ChunkHeader(**meta), x
