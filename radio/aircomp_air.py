"""Over-the-air aggregation at the sample level: pilots, superposed bursts, the received sum.

The waveform links (``waveform``: the numpy emulator; ``gnuradio``: GNU Radio's channel
model in its own process) carry one AirComp round as

1. **pilot slots**: each device alone sends a frame whose payload is the public pilot
   sequence :func:`pilot_sequence`; the receiver demodulates it and estimates the device's
   complex gain ``h_hat_j`` (:func:`estimate_pilot`) with a confidence radius;
2. **one shared slot**: every participant sends the whole frame (preamble, pilots and its
   values) scaled by ``alpha_j = c / h_hat_j``; the frames superpose in the medium
   (:func:`render`), the receiver adds its noise once, synchronises on the summed
   preamble, and :func:`decode_sum` divides by ``c`` after removing the common phase that
   the summed pilots measure.

Each device ``j`` reaches the receiver over its own path (:class:`AirPaths`): a complex gain
(path loss and a carrier phase, constant over the round: a shared 10 MHz reference leaves no
frequency offset between devices) and a burst timing error of at most
``timing_error_samples`` (a shared PPS aligns the bursts to within it). The timing error
shows up in the measured aggregation error, and the accountant bounds what it does to the
noise of the others (:func:`noise_gain_lower`, docs/privacy.md section 12).

Power unit: symbol power, as every link (:mod:`radio.link`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from radio.framing import WaveformParams
from radio.link import Reception

#: Symbols of each device's pilot (its frame's payload in the pilot slot).
PILOT_SYMBOLS = 512
#: Seed of the public pilot sequence (anyone may know it).
_PILOT_SEED = 0x41C0
#: Symbols of the public aggregation probe each participant appends to its values.
PROBE_SYMBOLS = 256
#: Seed of the probe sequences (public).
_PROBE_SEED = 0x41C1
#: Noise-only samples before and after a slot's frames (sync and the off-frame N0 bound).
LEAD_SAMPLES = 256
TAIL_SAMPLES = 256


def pilot_sequence(n: int = PILOT_SYMBOLS) -> np.ndarray:
    """The public pilot: ``n`` unit-modulus QPSK symbols, ``complex128`` ``(n,)``."""
    bits = np.random.default_rng(_PILOT_SEED).integers(0, 4, n)
    return np.exp(1j * (np.pi / 4 + np.pi / 2 * bits))


def probe_sequence(round_index: int, device: int, n: int = PROBE_SYMBOLS) -> np.ndarray:
    """Device ``device``'s public aggregation probe in round ``round_index``: ``n``
    unit-modulus QPSK symbols (``complex128``), independent across devices and rounds.

    Every participant appends its probe (at the amplitude its values are bounded by) to its
    values in the shared slot; the receiver, which knows every probe, compares the received
    sum of the probes with their true sum (:func:`probe_nmse`): the aggregation error of
    the slot measured without knowing any device's values (in the lab the aggregator never
    sees them).
    """
    rng = np.random.default_rng([_PROBE_SEED, int(round_index), int(device)])
    return np.exp(1j * (np.pi / 4 + np.pi / 2 * rng.integers(0, 4, n)))


def with_probe(values: np.ndarray, round_index: int, device: int, amplitude: float
               ) -> np.ndarray:
    """``values`` (complex symbols) followed by ``amplitude`` times the device's probe."""
    return np.concatenate([np.asarray(values, dtype=np.complex128),
                           amplitude * probe_sequence(round_index, device)])


def probe_nmse(decoded: np.ndarray, round_index: int, devices: list[int],
               amplitude: float) -> float:
    """The aggregation NMSE of a slot's probe part: ``decoded`` (the last
    :data:`PROBE_SYMBOLS` of the decoded sum) against ``amplitude`` times the sum of the
    participants' probes."""
    truth = amplitude * sum(probe_sequence(round_index, j) for j in devices)
    err = np.asarray(decoded, dtype=np.complex128) - truth
    return float(np.vdot(err, err).real / np.vdot(truth, truth).real)


def slot_frame(waveform: WaveformParams, values: np.ndarray, round_index: int, device: int,
               signal_power: float) -> np.ndarray:
    """Device ``device``'s frame for the shared slot before its pre-equalization: its values
    and its probe normalised by ``a = sqrt(signal_power)`` (the bound on ``E|x|^2``), so that
    the frame's preamble and pilots go at the power of its values once scaled by
    :func:`frame_scale`. ``complex128`` samples."""
    from radio.modem import modulate

    if not signal_power > 0:
        raise ValueError(f"signal_power must be > 0, got {signal_power}")
    a = math.sqrt(signal_power)
    return modulate(waveform, with_probe(values, round_index, device, a) / a)[0]


def frame_scale(alpha: complex, signal_power: float) -> complex:
    """What a device multiplies its :func:`slot_frame` by: ``alpha sqrt(signal_power)``
    (its values then go on air as ``alpha x``)."""
    return complex(alpha) * math.sqrt(signal_power)


@dataclass(frozen=True)
class AirPaths:
    """Each device's path to the receiver in one round.

    Attributes
    ----------
    gain
        ``complex128``, shape ``(N,)``: amplitude (path loss) and carrier phase.
    timing_samples
        ``float64``, shape ``(N,)``: each burst's timing error (samples, signed).
    """

    gain: np.ndarray
    timing_samples: np.ndarray


def draw_paths(gain_abs: np.ndarray, timing_error_samples: float,
               rng: np.random.Generator) -> AirPaths:
    """Paths with the given amplitudes, uniform carrier phases and timing errors uniform in
    ``[-timing_error_samples, timing_error_samples]`` (from the round's channel generator:
    the channel, not privacy noise)."""
    mag = np.asarray(gain_abs, dtype=np.float64)
    if mag.ndim != 1 or np.any(mag <= 0):
        raise ValueError("gain_abs must be a 1-d array of positive amplitudes")
    if not timing_error_samples >= 0:
        raise ValueError(f"timing_error_samples must be >= 0, got {timing_error_samples}")
    phase = rng.uniform(0.0, 2 * np.pi, mag.size)
    timing = rng.uniform(-timing_error_samples, timing_error_samples, mag.size)
    return AirPaths(mag * np.exp(1j * phase), timing)


def _delay(x: np.ndarray, samples: float) -> np.ndarray:
    """``x`` delayed by a fractional number of samples (exact for a band-limited ``x``
    padded with zeros: a linear phase in frequency)."""
    if samples == 0.0:
        return x
    n = x.size
    f = np.fft.fftfreq(n)
    return np.fft.ifft(np.fft.fft(x) * np.exp(-2j * np.pi * f * samples))


def render(frames: dict[int, np.ndarray], scale: dict[int, complex], paths: AirPaths,
           ) -> np.ndarray:
    """The noiseless superposition of the devices' frames at the receiver.

    Parameters
    ----------
    frames
        Device -> its modulated frame (samples, ``complex``), all the same length.
    scale
        Device -> the complex factor it transmits the frame with (``alpha_j``; 1 for a pilot).
    paths
        The round's paths (indexed by device).

    Returns
    -------
    numpy.ndarray
        ``complex128``, shape ``(LEAD_SAMPLES + n + TAIL_SAMPLES,)``.
    """
    sizes = {f.size for f in frames.values()}
    if len(sizes) != 1:
        raise ValueError(f"frames of one slot must have equal lengths, got {sorted(sizes)}")
    n = sizes.pop() + LEAD_SAMPLES + TAIL_SAMPLES
    out = np.zeros(n, dtype=np.complex128)
    for j, frame in frames.items():
        padded = np.zeros(n, dtype=np.complex128)
        padded[LEAD_SAMPLES:LEAD_SAMPLES + frame.size] = frame
        out += paths.gain[j] * scale[j] * _delay(padded, float(paths.timing_samples[j]))
    return out


@dataclass(frozen=True)
class PilotEstimate:
    """A device's gain from its pilot slot.

    Attributes
    ----------
    h_hat
        The pooled least-squares estimate of the gain.
    radius
        ``r``: ``|h - h_hat| <= r`` except with probability ``failure_prob``.
    noise_var_lower
        The receiver's credited lower bound on ``N0`` from the pilot frame (one-sided,
        fails with probability at most ``(1 - confidence) / 2``).
    failure_prob
        Probability that the interval ``|h_hat| -+ r`` on ``|h|`` is wrong.
    """

    h_hat: complex
    radius: float
    noise_var_lower: float
    failure_prob: float

    def abs_bounds(self) -> tuple[float, float]:
        """``(lower, upper)`` on ``|h|``."""
        m = abs(self.h_hat)
        return max(m - self.radius, 0.0), m + self.radius


def _n0_upper(rss: float, dof: int, alpha: float) -> float:
    """One-sided upper bound on ``N0`` from a residual of ``dof`` real degrees of freedom
    (``2 rss / N0 ~ chi^2(dof)``), failing with probability ``alpha``."""
    from scipy import stats  # imported on use (start-up time)

    return 2.0 * rss / float(stats.chi2.ppf(alpha, dof))


def estimate_pilot(reception: Reception, pilots: np.ndarray) -> PilotEstimate:
    """The gain of a pilot frame and its radius.

    ``h_hat = sum_k conj(p_k) y_k / L`` over the ``L`` unit-modulus pilot symbols of a
    static path; its error is ``CN(0, N0 / L)``, so ``P(|h_hat - h| > r) = exp(-r^2 L /
    N0)``. ``N0`` is bounded from the pilot's own residual ``y - h_hat p`` (independent of
    ``h_hat``; ``2 (L - 1)`` real degrees of freedom, chi-square), one-sided at ``alpha / 2``
    with ``alpha = 1 - confidence``, and ``r = sqrt(N0_up ln(2 / alpha) / L)``: the interval
    fails with probability at most ``alpha``.
    """
    y = np.asarray(reception.symbols, dtype=np.complex128)
    p = np.asarray(pilots, dtype=np.complex128)
    if y.shape != p.shape or p.size < 2:
        raise ValueError(f"pilot reception has shape {y.shape}, the pilot {p.shape}")
    state = reception.state
    alpha = 1.0 - state.confidence
    h_hat = complex(np.vdot(p, y) / p.size)
    rss = float(np.sum(np.abs(y - h_hat * p) ** 2))
    n0_up = _n0_upper(rss, 2 * (p.size - 1), alpha / 2.0)
    radius = math.sqrt(n0_up * math.log(2.0 / alpha) / p.size)
    return PilotEstimate(h_hat, radius, state.noise_var_lower, alpha)


def expected_radius(snr_linear: float, confidence: float,
                    pilot_symbols: int = PILOT_SYMBOLS) -> float:
    """The radius of :func:`estimate_pilot` relative to ``|h|`` when the residual equals its
    mean (``N0 (L - 1) / L`` per symbol): ``r / |h|`` at receive SNR ``snr_linear``."""
    alpha = 1.0 - confidence
    dof = 2 * (pilot_symbols - 1)
    n0_up = _n0_upper(dof / 2.0, dof, alpha / 2.0)  # N0 = 1
    return math.sqrt(n0_up * math.log(2.0 / alpha) / (pilot_symbols * snr_linear))


def decode_sum(reception: Reception, amplitude: float) -> np.ndarray:
    """The received sum ``y / c`` after removing the common phase the summed pilots measure
    (``complex128``, shape as the payload)."""
    if not amplitude > 0:
        raise ValueError(f"amplitude c must be > 0, got {amplitude}")
    g = np.asarray(reception.state.gain, dtype=np.complex128)
    mag = np.abs(g)
    rot = np.where(mag > 0, np.conj(g) / np.where(mag > 0, mag, 1.0), 1.0)
    return np.asarray(reception.symbols, dtype=np.complex128) * rot / amplitude


def noise_gain_lower(timing_error_samples: float, samples_per_symbol: int,
                     rolloff: float) -> float:
    """``kappa``: a lower bound on the singular values of the map that a burst timing error
    applies to a device's symbols at the receiver.

    With a raised-cosine overall response ``P`` (root-raised-cosine at both ends) and a
    relative offset ``delta`` (symbols) between a device's burst and the receiver's timing,
    the device's symbols reach the receiver through the convolution with taps
    ``p(m + delta)``; its frequency response is ``sum_k P(f - k) e^{2 pi j (f - k) delta}``
    (weights ``P >= 0`` summing to 1), so ``|P_delta(f) - 1| <= 2 sin(pi (1 + beta)
    |delta| / 2)``. Any principal submatrix of ``I - P_delta`` has at most that norm, so
    the map on a frame's symbols has singular values at least ``1 - 2 sin(pi (1 + beta)
    |delta| / 2)`` (and at most 1: ``|P_delta(f)| <= 1``). The receiver's timing lies
    within the devices' (each ``+-e`` of the slot), so ``|delta| <= 2 e``.

    Returns
    -------
    float
        ``kappa`` in ``(0, 1]``.

    Raises
    ------
    ValueError
        A timing error so large that nothing can be credited.
    """
    if not timing_error_samples >= 0:
        raise ValueError(f"timing_error_samples must be >= 0, got {timing_error_samples}")
    delta = 2.0 * timing_error_samples / samples_per_symbol
    kappa = 1.0 - 2.0 * math.sin(math.pi * (1.0 + rolloff) * delta / 2.0)
    if not kappa > 0:
        raise ValueError(f"timing error {timing_error_samples} samples at "
                         f"{samples_per_symbol} samples per symbol leaves no noise to credit")
    return kappa


def alignment_margin(snr_linear: float, confidence: float, kappa: float,
                     pilot_symbols: int = PILOT_SYMBOLS) -> float:
    """The ``(rho_lo / rho_hi)^2`` a round is expected to credit on a pilot-estimated path of
    receive SNR ``snr_linear`` (for calibrating the noise shares before any pilot), with
    :func:`expected_radius` and a tenth more for the spread of the residual. A round whose
    pilots come out worse is refused by the budget gate, never over-credited. The case of
    one SNR for every device of :func:`binding_margin`."""
    return binding_margin([snr_linear, snr_linear], confidence, kappa, 1, pilot_symbols)


def binding_margin(snrs_linear: Sequence[float], confidence: float, kappa: float,
                   credited_others: int, pilot_symbols: int = PILOT_SYMBOLS) -> float:
    """The ``others_margin`` to calibrate the noise shares with when the devices' pilots
    arrive at different SNRs: the expected ``(rho_lo_j / rho_hi_w)^2`` of the device ``w``
    whose gain is least certain (the lowest SNR: its events spend the most), averaged over
    the ``credited_others`` of the others whose shares it credits least (the gate withholds
    the largest shares), each with :func:`expected_radius` and a tenth more:

        m = kappa^2 mean_j ((1 - r_j) / (1 + r_w))^2.

    With every SNR equal it is :func:`alignment_margin`. A round whose pilots come out
    worse is refused by the budget gate, never over-credited.

    Raises
    ------
    ValueError
        Fewer than one SNR, a non-positive SNR, ``confidence`` outside ``(0, 1)``, ``kappa``
        outside ``(0, 1]``, or a pilot that cannot bound a gain away from 0.
    """
    if not snrs_linear or not all(x > 0 for x in snrs_linear):
        raise ValueError(f"need at least one SNR, all > 0; got {list(snrs_linear)}")
    if not (0 < confidence < 1 and 0 < kappa <= 1):
        raise ValueError("need confidence in (0, 1) and kappa in (0, 1]")
    radii = [1.1 * expected_radius(x, confidence, pilot_symbols) for x in snrs_linear]
    worst = max(range(len(radii)), key=lambda k: radii[k])
    if radii[worst] >= 1:
        raise ValueError(f"a pilot of {pilot_symbols} symbols at SNR "
                         f"{snrs_linear[worst]:.3g} cannot bound the gain away from 0")
    others = sorted(radii[:worst] + radii[worst + 1:], reverse=True)[:max(credited_others, 0)]
    credited = others or [radii[worst]]
    return kappa**2 * sum(((1.0 - r) / (1.0 + radii[worst])) ** 2
                          for r in credited) / len(credited)


def slot_symbols(waveform: WaveformParams, n_payload: int) -> int:
    """Symbols on the air for one frame of ``n_payload`` (preamble, pilots, payload)."""
    from radio.framing import frame_layout

    return frame_layout(waveform, n_payload).n_symbols
