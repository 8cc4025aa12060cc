"""Frame structure of one analog upload: preamble, pilots, payload, postamble.

Layout in symbols (``G`` guard zeros, ``R`` repetitions of a Zadoff-Chu sequence of odd
length ``L``, pilot blocks of ``Np`` known unit-modulus symbols every ``spacing`` payload
symbols, a pilot block after the last chunk, then three repetitions of a second ZC)::

    [0]*G  [ZC]*R  P D..D  P D..D  ...  P D..D  P  [ZC']*3  [0]*G

The repeated preamble gives frame detection and a frequency-offset estimate (delay and
correlate); its cross-correlation gives fine timing; the postamble gives the sample-rate
offset; the pilot blocks give complex gain (tracked through the frame) and ``N0``. The
payload is the caller's analog symbols, unchanged (symbol-power units, see
:mod:`radio.link`); preamble and pilots have unit power.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

#: Seed of the fixed pilot pattern (part of the waveform definition, not an experiment seed).
_PILOT_PATTERN_SEED = 0x5EED_0001


def zadoff_chu(length: int, root: int) -> np.ndarray:
    """Zadoff-Chu sequence ``exp(-j pi u n (n + 1) / L)``, ``complex128``, shape ``(L,)``."""
    if length < 3 or length % 2 == 0:
        raise ValueError(f"Zadoff-Chu length must be odd and >= 3, got {length}")
    if np.gcd(root, length) != 1:
        raise ValueError(f"Zadoff-Chu root {root} must be coprime with length {length}")
    n = np.arange(length)
    return np.exp(-1j * np.pi * root * n * (n + 1) / length)


@dataclass(frozen=True)
class WaveformParams:
    """Numerology of the baseband waveform.

    Attributes
    ----------
    symbol_rate_hz
        Symbol rate (Hz); the sample rate is ``symbol_rate_hz * samples_per_symbol``.
    samples_per_symbol
        Oversampling factor of the RRC pulse.
    rolloff
        RRC excess bandwidth.
    span_symbols
        RRC filter length in symbols (even).
    zc_length, zc_root, preamble_repeats
        Preamble: ``preamble_repeats`` copies of a ZC sequence.
    postamble_root
        ZC root of the postamble (same length).
    pilot_spacing
        Payload symbols between pilot blocks.
    pilots_per_block
        Known symbols per pilot block (>= 2, one degree of freedom goes to the gain).
    pilot_smoothing
        Odd number of neighbouring pilot blocks averaged into each gain estimate (1 = none);
        keep small under fast fading.
    guard_symbols
        Zero symbols before and after the frame.
    distortion_floor_db
        Upper bound (dB relative to the received signal power) on what the receiver itself
        adds to the pilot residual (inter-symbol interference, interpolation, timing
        jitter); measured at -42 to -52 dB, so -40 dB leaves a margin. It is subtracted
        from the credited ``N0`` lower bound: distortion is a function of the data, not
        noise.
    pilot_seed
        Seed of the pilot block's QPSK pattern (:func:`device_waveform` gives each device
        of a TDMA round its own).
    """

    symbol_rate_hz: float = 200e3
    samples_per_symbol: int = 5
    rolloff: float = 0.35
    span_symbols: int = 16
    zc_length: int = 37
    zc_root: int = 5
    preamble_repeats: int = 4
    postamble_root: int = 11
    pilot_spacing: int = 96
    pilots_per_block: int = 8
    pilot_smoothing: int = 3
    guard_symbols: int = 12
    distortion_floor_db: float = -40.0
    pilot_seed: int = _PILOT_PATTERN_SEED

    def __post_init__(self) -> None:
        checks = [
            ("symbol_rate_hz", self.symbol_rate_hz > 0, "> 0"),
            ("samples_per_symbol", self.samples_per_symbol >= 2, ">= 2"),
            ("rolloff", 0 < self.rolloff <= 1, "in (0, 1]"),
            ("span_symbols", self.span_symbols >= 2 and self.span_symbols % 2 == 0, "even >= 2"),
            ("preamble_repeats", self.preamble_repeats >= 2, ">= 2"),
            ("pilot_spacing", self.pilot_spacing >= 1, ">= 1"),
            ("pilots_per_block", self.pilots_per_block >= 2, ">= 2"),
            ("pilot_smoothing", self.pilot_smoothing >= 1 and self.pilot_smoothing % 2, "odd >= 1"),
            ("guard_symbols", self.guard_symbols >= 0, ">= 0"),
            ("distortion_floor_db", self.distortion_floor_db <= -20, "<= -20"),
        ]
        for key, ok, allowed in checks:
            if not ok:
                raise ValueError(f"waveform.{key}: got {getattr(self, key)!r}; allowed: {allowed}")
        zadoff_chu(self.zc_length, self.zc_root)
        zadoff_chu(self.zc_length, self.postamble_root)

    @property
    def sample_rate_hz(self) -> float:
        """Sample rate (Hz)."""
        return self.symbol_rate_hz * self.samples_per_symbol

    @cached_property
    def preamble(self) -> np.ndarray:
        """Preamble symbols, shape ``(zc_length * preamble_repeats,)``."""
        return np.tile(zadoff_chu(self.zc_length, self.zc_root), self.preamble_repeats)

    @cached_property
    def postamble(self) -> np.ndarray:
        """Postamble symbols: three repetitions of a ZC sequence, ``(3 zc_length,)``.

        Timing is refined on the middle repetition, whose neighbours within the pulse span
        are known and periodic (see :func:`radio.sync.refine_timing`).
        """
        return np.tile(zadoff_chu(self.zc_length, self.postamble_root), 3)

    def pilot_block(self) -> np.ndarray:
        """The fixed QPSK pilot block, unit modulus, shape ``(pilots_per_block,)``."""
        bits = np.random.Generator(np.random.PCG64(self.pilot_seed)).integers(
            0, 4, self.pilots_per_block
        )
        return np.exp(1j * (np.pi / 4 + np.pi / 2 * bits))


def device_roots(params: WaveformParams) -> list[int]:
    """The preamble roots devices take in turn: every root of the ZC length other than the
    common one and the postamble's (for a prime length, ``length - 3`` of them)."""
    n = params.zc_length
    return [r for r in range(1, n) if np.gcd(r, n) == 1
            and r not in (params.zc_root, params.postamble_root)]


def device_waveform(params: WaveformParams, device: int) -> WaveformParams:
    """``params`` with device ``device``'s own preamble root and pilot pattern.

    In a TDMA round every device's frame then carries a signature the receiver can tell
    apart: another device's frame overlapping a device's is a collision
    (:meth:`radio.slot_receiver.SlotReceiver.collisions`), not that device's upload. ZC
    sequences of different roots and a prime length ``L`` correlate to ``1/sqrt(L)`` (0.16
    for 37) per repetition, far below the receiver's acceptance threshold. Devices ``k``
    apart by a multiple of the number of roots share a root (34 roots for the default
    length 37) and cannot be told apart.

    Raises
    ------
    ValueError
        A negative ``device``.
    """
    if device < 0:
        raise ValueError(f"device: got {device}; allowed: >= 0")
    roots = device_roots(params)
    return replace(params, zc_root=roots[device % len(roots)],
                   pilot_seed=_PILOT_PATTERN_SEED + 1 + device)


@dataclass(frozen=True)
class FrameLayout:
    """Symbol indices of each part of a frame of ``n_payload`` payload symbols.

    Attributes
    ----------
    n_symbols
        Total frame length in symbols, guards included.
    preamble_start, postamble_start
        Index of the first preamble / postamble symbol.
    pilot_idx
        ``int64``, shape ``(n_blocks, pilots_per_block)``.
    payload_idx
        ``int64``, shape ``(n_payload,)``.
    """

    n_symbols: int
    preamble_start: int
    postamble_start: int
    pilot_idx: np.ndarray
    payload_idx: np.ndarray

    @property
    def n_blocks(self) -> int:
        """Number of pilot blocks."""
        return int(self.pilot_idx.shape[0])

    def pilot_centers(self) -> np.ndarray:
        """Centre (symbol index) of each pilot block, ``float64``, shape ``(n_blocks,)``."""
        return self.pilot_idx.mean(axis=1)


def frame_layout(params: WaveformParams, n_payload: int) -> FrameLayout:
    """Where preamble, pilots, payload and postamble sit in a frame."""
    if n_payload < 1:
        raise ValueError(f"n_payload must be >= 1, got {n_payload}")
    npb, sp = params.pilots_per_block, params.pilot_spacing
    n_chunks = -(-n_payload // sp)
    start = params.guard_symbols + params.preamble.size
    chunk = np.arange(n_payload) // sp
    payload_idx = start + (chunk + 1) * npb + np.arange(n_payload)
    block = np.arange(n_chunks + 1)
    pilot_idx = start + block[:, None] * (npb + sp) + np.arange(npb)[None, :]
    last = n_payload - (n_chunks - 1) * sp
    pilot_idx[-1] = start + (n_chunks - 1) * (npb + sp) + npb + last + np.arange(npb)
    post = int(pilot_idx[-1, -1]) + 1
    n_symbols = post + params.postamble.size + params.guard_symbols
    return FrameLayout(
        n_symbols=n_symbols,
        preamble_start=params.guard_symbols,
        postamble_start=post,
        pilot_idx=pilot_idx.astype(np.int64),
        payload_idx=payload_idx.astype(np.int64),
    )


def build_frame(params: WaveformParams, payload: np.ndarray) -> tuple[np.ndarray, FrameLayout]:
    """Frame symbols around ``payload``.

    Parameters
    ----------
    payload
        ``complex128``, shape ``(n_payload,)``, symbol-power units.

    Returns
    -------
    tuple
        Frame symbols ``complex128`` shape ``(layout.n_symbols,)`` and the layout.
    """
    x = np.asarray(payload, dtype=np.complex128)
    if x.ndim != 1:
        raise ValueError(f"payload must be 1-d, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("payload contains NaN or inf")
    layout = frame_layout(params, x.size)
    frame = np.zeros(layout.n_symbols, dtype=np.complex128)
    frame[layout.preamble_start : layout.preamble_start + params.preamble.size] = params.preamble
    frame[layout.pilot_idx] = params.pilot_block()[None, :]
    frame[layout.payload_idx] = x
    frame[layout.postamble_start : layout.postamble_start + params.postamble.size] = (
        params.postamble
    )
    return frame, layout
