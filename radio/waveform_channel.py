"""The waveform channel emulator (numpy): fading, offsets and noise on I/Q samples.

Order of effects, as in a radio link: flat fading (block or Clarke/Jakes with Doppler) on
the transmitted samples; the receiver's clock (a delay and a sample-rate offset); the
carrier frequency offset with a random phase; white Gaussian noise on every received sample.

Noise level: the pulse has unit energy (:mod:`radio.pulse`), so white noise of variance
``N0`` per complex sample leaves ``N0`` per symbol after the matched filter. The emulator
therefore adds ``N0 = 10 ** (-snr_db / 10)`` per sample to get a symbol-level SNR of
``snr_db`` for a unit-power stream at unit mean channel gain (:mod:`radio.link`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass

import numpy as np

from radio.channel import Fading, draw_block_gains
from radio.channel_noise import SEEDED, ChannelNoise
from radio.fading import clarke_gains, doppler_hz
from radio.line_sampler import sample_line, sample_line_chunks
from radio.side_thread import side_thread

#: Largest spacing (samples) of the grid on which Doppler fading is evaluated.
_FADING_GRID_MAX = 4096


@dataclass(frozen=True)
class EmulatorParams:
    """Impairments of the waveform channel.

    Attributes
    ----------
    fading
        ``none``, ``rayleigh`` or ``rician``.
    rician_k_db
        K-factor (dB) for ``rician``.
    speed_kmh, carrier_hz
        Doppler ``fD = v fc / c``; ``speed_kmh = 0`` gives block fading (constant over
        ``coherence_samples`` or the whole upload).
    coherence_samples
        Block length for block fading without Doppler; ``None`` = one block per upload.
    cfo_hz
        Fixed carrier frequency offset (Hz).
    cfo_spread_hz
        A uniform random offset in ``[-cfo_spread_hz, cfo_spread_hz]`` added per upload.
    delay_max_samples
        Leading samples before the frame, uniform in ``[0, delay_max_samples]`` (fractional).
    sro_ppm
        Receiver sample-rate offset (parts per million).
    tail_samples
        Noise-only samples after the frame.
    """

    fading: Fading = "none"
    rician_k_db: float = 6.0
    speed_kmh: float = 0.0
    carrier_hz: float = 915e6
    coherence_samples: int | None = None
    cfo_hz: float = 0.0
    cfo_spread_hz: float = 0.0
    delay_max_samples: float = 512.0
    sro_ppm: float = 0.0
    tail_samples: int = 256

    def __post_init__(self) -> None:
        if self.fading not in ("none", "rayleigh", "rician"):
            raise ValueError(
                f"fading: got {self.fading!r}; allowed: 'none', 'rayleigh', 'rician'"
            )
        for key in ("speed_kmh", "cfo_spread_hz", "delay_max_samples", "tail_samples"):
            if getattr(self, key) < 0:
                raise ValueError(f"emulator.{key}: got {getattr(self, key)}; allowed: >= 0")
        if self.carrier_hz <= 0:
            raise ValueError(f"emulator.carrier_hz: got {self.carrier_hz}; allowed: > 0")
        if abs(self.sro_ppm) > 200:
            raise ValueError(f"emulator.sro_ppm: got {self.sro_ppm}; allowed: [-200, 200]")


@dataclass(frozen=True)
class EmulatedTruth:
    """What the emulator actually did to one upload (for tests and logs).

    Attributes
    ----------
    gain
        Channel gain per transmitted sample, ``complex64``, shape ``(n_tx,)``, or ``(1,)``
        when it is constant over the upload.
    noise_var
        ``N0`` per complex sample.
    cfo_hz, delay_samples, sro_ppm
        Offsets applied.
    """

    gain: np.ndarray
    noise_var: float
    cfo_hz: float
    delay_samples: float
    sro_ppm: float


def _grid_interpolate(grid_values: np.ndarray, step: int, n: int) -> np.ndarray:
    """Linear interpolation of values on a grid of ``step`` samples, ``complex64 (n,)``."""
    g = grid_values.astype(np.complex64)
    frac = (np.arange(step, dtype=np.float32) / step)[None, :]
    out = g[:-1, None] + (g[1:] - g[:-1])[:, None] * frac
    return out.ravel()[:n]


#: Samples per chunk of the streaming loops: a few chunk-sized scratch arrays stay in cache.
_CHUNK = 1 << 16
#: Length of the rotator's inner table (samples).
_ROT_BLOCK = 1024


class _Rotator:
    """``exp(j (2 pi f m + phase0))`` chunk by chunk, from a ``complex64`` table.

    The table holds ``exp(j w k)`` for the ``k`` of a chunk, as ``outer[b] * inner[k']``
    with ``inner[k'] = exp(j w k')`` for ``k' < 1024`` and ``outer[b] = exp(j w 1024 b)``;
    a chunk is the table times its start phase ``w m0 + phase0``, computed in double
    precision, so rounding does not accumulate along the upload.
    """

    def __init__(self, cycles_per_sample: float, phase0: float) -> None:
        self.w = 2 * np.pi * cycles_per_sample
        self.phase0 = phase0
        self.inner = np.exp(1j * self.w * np.arange(_ROT_BLOCK)).astype(np.complex64)
        steps = np.arange(_CHUNK // _ROT_BLOCK)
        self.outer = np.exp(1j * self.w * _ROT_BLOCK * steps).astype(np.complex64)
        self._table = np.empty(0, dtype=np.complex64)  # grown to the longest chunk asked for
        self._buf = np.empty(0, dtype=np.complex64)

    def chunk(self, m0: int, m: int) -> np.ndarray:
        """Rotator at samples ``m0 .. m0 + m - 1`` (``m <= _CHUNK``), ``complex64 (m,)``.

        The returned array is a view of a buffer reused by the next call.
        """
        if self._table.size < m:
            rows = -(-m // _ROT_BLOCK)
            self._table = (self.outer[:rows, None] * self.inner[None, :]).reshape(-1)
            self._buf = np.empty(self._table.size, dtype=np.complex64)
        start = np.complex64(np.exp(1j * (self.w * m0 + self.phase0)))
        return np.multiply(self._table[:m], start, out=self._buf[:m])


def fading_gains(
    params: EmulatorParams, n: int, sample_rate_hz: float, rng: np.random.Generator
) -> np.ndarray:
    """Channel gain per transmitted sample, ``complex64``, shape ``(n,)``; ``(1,)`` if flat."""
    if params.fading == "none":
        return np.ones(1, dtype=np.complex64)
    if params.speed_kmh > 0:
        fd = doppler_hz(params.speed_kmh, params.carrier_hz)
        # A grid point every 1/64 of a Doppler period (at most 4096, at least 8 samples):
        # the process turns by <= 0.1 rad between points, linear interpolation errs < -60 dB.
        step = int(np.clip(sample_rate_hz / (64.0 * fd), 8, _FADING_GRID_MAX))
        grid = np.arange(0, n + 2 * step, step)
        k_db = params.rician_k_db if params.fading == "rician" else None
        g = clarke_gains(grid / sample_rate_hz, fd, rng, rician_k_db=k_db)
        return _grid_interpolate(g, step, n)
    block = params.coherence_samples or n
    blocks = draw_block_gains(params.fading, -(-n // block), rng, rician_k_db=params.rician_k_db)
    if blocks.size == 1:
        return blocks.astype(np.complex64)
    return blocks.astype(np.complex64)[np.arange(n) // block]


def emulate(
    samples: np.ndarray,
    params: EmulatorParams,
    noise_var: float,
    sample_rate_hz: float,
    rng: np.random.Generator,
    noise: ChannelNoise = SEEDED,
) -> tuple[np.ndarray, EmulatedTruth]:
    """Pass transmitted samples through the emulated channel.

    Parameters
    ----------
    samples
        Transmitted complex baseband, shape ``(n_tx,)``.
    noise_var
        ``N0`` per complex sample (0 for a noiseless channel).
    sample_rate_hz
        Sample rate (Hz).
    rng
        Channel generator: fading and offsets (and the noise when ``noise`` is seeded).
    noise
        Source of the white noise; default: ``rng`` (seeded, the same draws as always). A
        secret source leaves ``rng`` to the fading and offsets.

    Returns
    -------
    tuple
        Received samples ``complex64`` shape ``(n_rx,)`` (single precision, like a radio's
        sample stream) and the realised impairments.
    """
    s = np.asarray(samples)
    gain = fading_gains(params, s.size, sample_rate_hz, rng)
    delay = float(rng.uniform(0.0, params.delay_max_samples))
    cfo = params.cfo_hz + float(rng.uniform(-params.cfo_spread_hz, params.cfo_spread_hz))
    ratio = 1.0 + params.sro_ppm * 1e-6
    n_frame = int(np.floor((s.size - 1) / ratio)) + 1
    lead = int(np.ceil(delay))
    n_rx = lead + n_frame + params.tail_samples
    rx = np.empty(n_rx, dtype=np.complex64)
    faded = params.fading != "none"
    if params.sro_ppm == 0.0 and delay == lead:
        # Whole-sample delay: the noise first, then the transmitted samples, copied,
        # rotated and added chunkwise (each chunk in the cache).
        _draw_noise(noise, rx, noise_var, rng)
        rot = _Rotator(cfo / sample_rate_hz, float(rng.uniform(-np.pi, np.pi)))
        buf = np.empty(min(_CHUNK, n_frame), dtype=np.complex64)
        for c0 in range(0, n_frame, _CHUNK):
            m = min(_CHUNK, n_frame - c0)
            seg = buf[:m]
            seg[:] = s[c0 : c0 + m]
            if faded:
                seg *= gain[c0 : c0 + m] if gain.size > 1 else gain[0]
            seg *= rot.chunk(lead + c0, m)
            rx[lead + c0 : lead + c0 + m] += seg
    else:
        # Resampled: this thread interpolates the faded frame into its own buffer (no
        # draws) and hands it over segment by segment; the noise, then the carrier phase
        # (the generator's draws keep their order), then the rotation and addition of each
        # segment are done beside it for a long frame (:class:`_Beside`): the same products
        # and sums, in the same segments (the rotator's start phase is rounded per
        # segment), as interpolating, rotating and adding segment by segment after the noise.
        # The frame's buffer has a little slack: the interpolator writes whole rows into it.
        frame = np.empty(n_frame + _FRAME_SLACK, dtype=np.complex64)
        with _Beside(noise, rx, noise_var, rng, cfo / sample_rate_hz, frame, lead,
                     parallel=n_rx >= _PARALLEL_MIN) as beside:
            for segment in _resampled_segments(frame, n_frame, s, gain if faded else None,
                                               delay, lead, ratio):
                beside.put(segment)
    truth = EmulatedTruth(
        gain=gain, noise_var=noise_var, cfo_hz=cfo, delay_samples=delay, sro_ppm=params.sro_ppm
    )
    return rx, truth


def _resampled_segments(
    out: np.ndarray, n_frame: int, s: np.ndarray, gain: np.ndarray | None, delay: float,
    lead: int, ratio: float,
) -> Iterator[tuple[int, int]]:
    """The noiseless received frame before the carrier offset, into ``out[:n_frame]``
    (``out``: ``complex64``, contiguous, at least ``n_frame`` samples; those past ``n_frame``
    are scratch): ``s`` faded by ``gain`` (``None``: not faded), delayed by ``delay``
    samples (``lead`` its ceiling: receiver sample ``lead + c`` is frame sample ``c``) and
    resampled by ``ratio``: receiver sample ``m`` sees the transmitted signal at time
    ``(m - delay) * ratio``, held at the last transmitted sample past the end.

    Yields
    ------
    tuple
        The segments ``(first frame sample, length)``, in order, each once it is
        written: the interpolator's chunks, cut at every ``_CHUNK`` samples,
        then the held samples.
    """
    src = s
    if gain is not None:
        src = s.astype(np.complex64)
        src *= gain
    start = (lead - delay) * ratio
    inside = max(min(n_frame, int(np.floor((s.size - 1 - start) / ratio)) + 1), 0)
    while inside > 0 and start + ratio * (inside - 1) > s.size - 1:
        inside -= 1
    done = 0
    if inside:
        # The interpolator writes straight into ``out``.
        for piece in sample_line_chunks(src, start, ratio, inside, out=out):
            for a in range(0, piece.size, _CHUNK):
                yield done + a, min(_CHUNK, piece.size - a)
            done += piece.size
    if done < n_frame:
        out[done:n_frame] = sample_line(src, float(src.size - 1), 1.0, 1)[0]
        for c0 in range(done, n_frame, _CHUNK):
            yield c0, min(_CHUNK, n_frame - c0)


def _draw_noise(noise: ChannelNoise, rx: np.ndarray, noise_var: float,
                rng: np.random.Generator) -> None:
    """The receiver noise into ``rx`` (``ChannelNoise.fill``; zeros when ``noise_var`` is
    0)."""
    if noise_var > 0:
        noise.fill(rx, noise_var, rng)
    else:
        rx.view(np.float32)[:] = 0.0


class _Beside:
    """The resampled path's receiver noise and carrier offset, around the interpolation.

    The noise is drawn into ``rx`` (:func:`_draw_noise`), then the carrier phase from
    ``rng``, then each frame segment handed over (:meth:`put`) is rotated
    (:class:`_Rotator`) and added to ``rx``. With ``parallel`` that runs in the process's
    side thread (:func:`radio.side_thread.side_thread`; numpy releases the GIL in its draws
    and ufuncs) while the ``with`` block interpolates: the segments are rotated as they come
    once the noise is drawn, and on leaving the block this thread takes the ones still
    waiting too (the two threads add disjoint segments, with rotators of the same phase),
    then waits for the side thread and raises what it raised. Otherwise the noise is drawn
    on entry and the segments rotated in order on leaving. Each segment gets the same
    products and sums either way; the block must not draw from ``rng``.

    Parameters
    ----------
    noise, rx, noise_var, rng
        As :func:`_draw_noise`; ``rng`` then gives the carrier phase.
    cycles
        Carrier offset (cycles per sample).
    frame
        The interpolated frame; receiver sample ``lead + c`` is frame sample ``c``.
    lead
        Receiver samples before the frame.
    parallel
        Work in the side thread.
    """

    def __init__(self, noise: ChannelNoise, rx: np.ndarray, noise_var: float,
                 rng: np.random.Generator, cycles: float, frame: np.ndarray, lead: int, *,
                 parallel: bool) -> None:
        self._noise = (noise, rx, noise_var, rng)
        self._cycles, self._frame, self._lead, self._rx = cycles, frame, lead, rx
        self._parallel = parallel
        self._waiting: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._later: list[tuple[int, int]] = []
        self._phase: float | None = None  # set once the noise is drawn
        self._drawn = threading.Event()  # set when the noise is drawn or failed
        self._future: Future[None] | None = None

    def __enter__(self) -> _Beside:
        if self._parallel:
            self._future = side_thread().submit(self._beside)
        else:
            _draw_noise(*self._noise)
        return self

    def put(self, segment: tuple[int, int]) -> None:
        """Hand over a written segment ``(first frame sample, length)``."""
        if self._parallel:
            self._waiting.put(segment)
        else:
            self._later.append(segment)

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._future is None:
            if exc_type is None:
                rot = _Rotator(self._cycles, float(self._noise[3].uniform(-np.pi, np.pi)))
                for segment in self._later:
                    self._turn(rot, segment)
            return
        try:
            if exc_type is None:
                self._drawn.wait()
                if self._phase is not None:
                    rot = _Rotator(self._cycles, self._phase)
                    while True:
                        try:
                            item = self._waiting.get_nowait()
                        except queue.Empty:
                            break
                        assert item is not None  # only this thread ends the queue, below
                        self._turn(rot, item)
        finally:
            self._waiting.put(None)  # the side thread stops after the segments before it
            if exc_type is None:
                self._future.result()  # waits and re-raises
            else:
                wait([self._future])  # the block's exception goes on

    def _beside(self) -> None:
        """The side thread's part: noise, phase, then segments until ``None``."""
        try:
            _draw_noise(*self._noise)
            self._phase = float(self._noise[3].uniform(-np.pi, np.pi))
        finally:
            self._drawn.set()
        rot = _Rotator(self._cycles, self._phase)
        while (segment := self._waiting.get()) is not None:
            self._turn(rot, segment)

    def _turn(self, rot: _Rotator, segment: tuple[int, int]) -> None:
        """Rotate a segment of the frame and add it to ``rx``; the product goes into the
        rotator's buffer (in the cache), not back into the frame."""
        c0, m = segment
        turned = rot.chunk(self._lead + c0, m)
        np.multiply(self._frame[c0 : c0 + m], turned, out=turned)
        self._rx[self._lead + c0 : self._lead + c0 + m] += turned


#: Receive buffers from this many samples draw their noise (and rotate) in a worker thread.
_PARALLEL_MIN = 1 << 17
#: Spare samples after a resampled frame: the interpolator computes rows of 64 samples
#: (:mod:`radio.line_sampler`) and writes the last one whole when there is room.
_FRAME_SLACK = 64
