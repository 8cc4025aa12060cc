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

from dataclasses import dataclass

import numpy as np

from radio.channel import Fading, draw_block_gains
from radio.fading import clarke_gains, doppler_hz
from radio.pulse import sample_at

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


def _rotator(n: int, cycles_per_sample: float, phase0: float) -> np.ndarray:
    """``exp(j (2 pi f n + phase0))`` as ``complex64 (n,)``, built from two short tables."""
    block = 1024
    w = 2 * np.pi * cycles_per_sample
    inner = np.exp(1j * w * np.arange(block))
    outer = np.exp(1j * (w * block * np.arange(-(-n // block)) + phase0))
    return (outer[:, None] * inner[None, :]).astype(np.complex64).ravel()[:n]


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
        Channel generator: fading, offsets and noise.

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
    # Noise first, generated in place into the receive buffer (single precision).
    rx = np.empty(n_rx, dtype=np.complex64)
    flat = rx.view(np.float32)
    if noise_var > 0:
        rng.standard_normal(out=flat, dtype=np.float32)
        flat *= np.float32(np.sqrt(noise_var / 2.0))
    else:
        flat[:] = 0.0
    if params.sro_ppm == 0.0 and delay == lead:
        sig = s.astype(np.complex64)
        if params.fading != "none":
            sig *= gain
    else:
        # Receiver sample m sees the transmitted signal at time (m - delay) * ratio.
        t = (np.arange(lead, lead + n_frame, dtype=np.float64) - delay) * ratio
        t = np.clip(t, 0.0, s.size - 1)
        faded = s.astype(np.complex64) * gain
        padded = np.concatenate([np.zeros(16, np.complex64), faded, np.zeros(16, np.complex64)])
        sig = sample_at(padded, t + 16).astype(np.complex64)
    phase0 = float(rng.uniform(-np.pi, np.pi))
    sig *= _rotator(n_frame + lead, cfo / sample_rate_hz, phase0)[lead:]
    rx[lead : lead + sig.size] += sig
    truth = EmulatedTruth(
        gain=gain, noise_var=noise_var, cfo_hz=cfo, delay_samples=delay, sro_ppm=params.sro_ppm
    )
    return rx, truth
