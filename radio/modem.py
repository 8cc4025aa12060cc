"""Transmitter and receiver of one analog upload (numpy).

:func:`modulate` turns payload symbols into complex baseband samples at
``params.sample_rate_hz``; :func:`demodulate` finds the frame in a received buffer,
removes the frequency, timing and sample-rate offsets, estimates the channel from the
pilots and returns the synchronised (not equalised) payload with the channel state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from radio.estimation import (
    estimate_from_pilots,
    interpolate_gain,
    off_frame_noise,
    smooth_gains,
)
from radio.framing import FrameLayout, WaveformParams, build_frame, frame_layout
from radio.link import ChannelState
from radio.pulse import Interpolant, matched_filter, rrc_taps, shape
from radio.sync import (
    CORRELATION_THRESHOLD,
    Coarse,
    SyncError,
    coarse_sync,
    correct_cfo,
    fine_timing,
    refine_timing,
)
from radio.units import db_to_linear, linear_to_db

#: Largest sample-rate offset the receiver accepts as plausible (parts per million).
MAX_SRO_PPM = 500.0
#: Half-width (samples) of the coarse grid of timing corrections tried at each end of the
#: frame (:func:`_least_residual_timing`); the fine grid adds a quarter of it.
TIMING_SEARCH_SAMPLES = 0.5


@lru_cache(maxsize=8)
def _taps(sps: int, rolloff: float, span: int) -> np.ndarray:
    return rrc_taps(sps, rolloff, span)


def pulse_taps(params: WaveformParams) -> np.ndarray:
    """The RRC taps of ``params`` (cached), shape ``(span * sps + 1,)``."""
    return _taps(params.samples_per_symbol, params.rolloff, params.span_symbols)


def modulate(params: WaveformParams, payload: np.ndarray) -> tuple[np.ndarray, FrameLayout]:
    """Baseband samples of one frame carrying ``payload``.

    Parameters
    ----------
    payload
        ``complex128``, shape ``(n_payload,)``, symbol-power units.

    Returns
    -------
    tuple
        Samples ``complex128`` shape ``((n_symbols - 1) * sps + n_taps,)`` and the layout.
        A unit-power symbol stream gives ``mean |s|^2 = 1 / sps`` per sample.
    """
    frame, layout = build_frame(params, payload)
    return shape(frame, pulse_taps(params), params.samples_per_symbol), layout


def frame_samples(params: WaveformParams, n_payload: int) -> int:
    """Number of samples :func:`modulate` produces for ``n_payload`` symbols."""
    n_sym = frame_layout(params, n_payload).n_symbols
    return (n_sym - 1) * params.samples_per_symbol + pulse_taps(params).size


@dataclass(frozen=True)
class Demodulated:
    """The receiver's output for one frame.

    Attributes
    ----------
    payload
        Synchronised, not equalised payload ``y = h x + n``, ``complex128``, ``(n_payload,)``.
    state
        Estimated channel state (gain per payload symbol, ``N0`` with bounds).
    info
        ``snr_est_db``, ``snr_ci_lo_db``, ``snr_ci_hi_db``, ``cfo_est_hz``,
        ``timing_samples`` (frame start in the buffer), ``sro_ppm``, ``detect_metric``.
    """

    payload: np.ndarray
    state: ChannelState
    info: dict[str, float] = field(default_factory=dict)


def demodulate(
    params: WaveformParams, samples: np.ndarray, n_payload: int, confidence: float = 0.95,
    known_cfo_hz: float | None = None,
) -> Demodulated:
    """Receive one frame of ``n_payload`` payload symbols from ``samples``.

    Parameters
    ----------
    samples
        Received complex baseband at ``params.sample_rate_hz``, shape ``(n,)``; the frame
        may start anywhere, preceded and followed by noise.
    n_payload
        Payload length the control plane announced.
    confidence
        Confidence level of the ``N0`` interval and of the gain upper bound.
    known_cfo_hz
        The frequency offset when the receiver knows it (a shared reference: 0); ``None``
        estimates it from the preamble. A known offset keeps the phase of every frame on
        the receiver's own reference (over-the-air aggregation pre-equalizes with it).

    Raises
    ------
    SyncError
        No frame found, or the frame does not fit the buffer.
    """
    sps = params.samples_per_symbol
    layout = frame_layout(params, n_payload)
    taps = pulse_taps(params)
    delay = (taps.size - 1) // 2
    r = np.asarray(samples, dtype=np.complex128)
    coarse, r, mf, t_pre = _lock(r, params, taps, known_cfo_hz)
    span = layout.postamble_start - layout.preamble_start
    post_guess = t_pre + span * sps
    slack = int(np.ceil(span * sps * MAX_SRO_PPM * 1e-6)) + 2 * sps
    t_post, _ = fine_timing(mf, params.postamble, sps, post_guess, half_window=slack)
    # Refine both ends on their inner repetitions (unbiased, see refine_timing), twice:
    # the second pass spaces the reference symbols by the measured clock ratio.
    zc = params.zc_length
    inner_pre = params.preamble[zc : (params.preamble_repeats - 1) * zc]
    inner_post = params.postamble[:zc]
    scale = (t_post - t_pre) / (span * sps)
    for _ in range(2):
        period = zc * sps * scale
        t_pre = refine_timing(mf, inner_pre, sps * scale, t_pre + period) - period
        t_post = refine_timing(mf, inner_post, sps * scale, t_post + period) - period
        scale = (t_post - t_pre) / (span * sps)
    wanted = np.concatenate([layout.pilot_idx.ravel(), layout.payload_idx])
    frac = (wanted - layout.preamble_start) / span  # 0 at the preamble, 1 at the postamble
    positions = t_pre + frac * (t_post - t_pre)
    reach = 2 * TIMING_SEARCH_SAMPLES
    if positions.min() < reach or positions.max() > mf.size - 1 - reach:
        raise SyncError("frame runs past the end of the buffer")
    interp = Interpolant(mf, positions.min() - reach, positions.max() + reach)
    n_pilots = layout.pilot_idx.size
    a, b = _least_residual_timing(interp, positions[:n_pilots], frac[:n_pilots],
                                  params.pilot_block())
    t_pre, t_post = t_pre + a, t_post + b
    scale = (t_post - t_pre) / (span * sps)
    # scale < 1: the receiver's clock runs fast (sees the frame shorter).
    sro_ppm = (1.0 / scale - 1.0) * 1e6
    if abs(sro_ppm) > MAX_SRO_PPM:
        raise SyncError(f"implausible sample-rate offset {sro_ppm:.1f} ppm")
    values = interp.at(positions + a + frac * (b - a))
    pilots_rx = values[:n_pilots].reshape(layout.pilot_idx.shape)
    payload = values[n_pilots:]
    est = estimate_from_pilots(pilots_rx, params.pilot_block(), confidence)
    smoothed = smooth_gains(est.block_gain, params.pilot_smoothing)
    gain = interpolate_gain(layout.pilot_centers(), smoothed, layout.payload_idx.astype(float))
    # E|h_b|^2 = |h|^2 + N0 / Np: remove the estimation noise from the power estimate.
    mean_gain_power = max(
        float(np.mean(np.abs(est.block_gain) ** 2)) - est.noise_var / params.pilots_per_block,
        1e-12,
    )
    # Never credit the receiver's own distortion as noise (see WaveformParams).
    allowance = float(db_to_linear(params.distortion_floor_db)) * mean_gain_power
    credited_lower = max(est.noise_var_lower - allowance, 0.0)
    # Nor distortion the pilots met on the way (a frame's residual can hold more than
    # noise): the noise measured off the frame, in the same capture, bounds what is credited.
    first_peak = t_pre - layout.preamble_start * sps * scale
    last_peak = t_pre + (layout.n_symbols - 1 - layout.preamble_start) * sps * scale
    off = off_frame_noise(mf, first_peak, last_peak, sps, taps.size, confidence)
    if off is not None:
        credited_lower = min(credited_lower, off.noise_var_lower)
    state = ChannelState(
        gain=gain,
        noise_var=est.noise_var,
        noise_var_lower=credited_lower,
        noise_var_upper=est.noise_var_upper,
        estimated=True,
        confidence=confidence,
        gain_power_upper=est.gain_power_upper,
    )
    cfo_hz = coarse.cfo_hz + (0.0 if known_cfo_hz is not None
                              else _residual_cfo_hz(est.block_gain, params, scale))
    frame_start = t_pre - 2 * delay - layout.preamble_start * sps
    info = {
        "snr_est_db": float(linear_to_db(mean_gain_power / est.noise_var)),
        "snr_ci_lo_db": float(linear_to_db(mean_gain_power / est.noise_var_upper)),
        "snr_ci_hi_db": float(linear_to_db(mean_gain_power / max(credited_lower, 1e-300))),
        "cfo_est_hz": cfo_hz,
        "timing_samples": float(frame_start),
        "sro_ppm": float(sro_ppm),
        "detect_metric": coarse.metric,
        "n0_est": est.noise_var,
        "n0_distortion_allowance": allowance,
    }
    if off is not None:  # how much more than the noise off the frame the residual held
        info |= {"n0_off_frame": off.noise_var, "off_frame_samples": float(off.samples),
                 "n0_off_frame_before": off.side_noise_var[0],
                 "n0_off_frame_after": off.side_noise_var[1]}
        if off.noise_var > 0:
            info["residual_over_noise_db"] = float(linear_to_db(est.noise_var / off.noise_var))
    return Demodulated(payload=payload, state=state, info=info)


def _least_residual_timing(
    interp: Interpolant, pilot_pos: np.ndarray, frac: np.ndarray, pilots: np.ndarray
) -> tuple[float, float]:
    """Timing corrections at the preamble and postamble (samples) that leave the least pilot
    residual.

    The preamble and postamble timings come from a few repetitions each; a fade across one
    of them moves its estimate by tenths of a sample (measured: up to 0.3 samples at 17 Hz
    Doppler), and the clock ratio between them with it. Sampled that far off, the pilots
    carry intersymbol interference that the residual counts as noise: up to +1.3 dB of N0
    that is not there (and would be credited). This tries corrections ``(a, b)`` on a
    5 x 5 grid of half-width :data:`TIMING_SEARCH_SAMPLES`, then a 5 x 5 grid a quarter as
    wide around the best, the correction moving linearly from ``a`` at the preamble to ``b``
    at the postamble, and keeps the one with the smallest pilot residual. Noise has the
    same variance at every timing, so the least residual is the least interference, and
    the N0 estimated there is never above the one at the best timing on the grid.

    Parameters
    ----------
    interp
        The matched-filter output's interpolant.
    pilot_pos
        Pilot positions at the initial timing (samples), shape ``(B * Np,)``, block-major.
    frac
        Each pilot's place in the frame, 0 at the preamble and 1 at the postamble, shape
        ``(B * Np,)``.
    pilots
        The known pilot block, unit modulus, shape ``(Np,)``.
    """
    npb = pilots.size
    conj = np.conj(pilots) / float(np.sum(np.abs(pilots) ** 2))
    grid = np.arange(-2, 3) / 2.0

    def residual(a: float, b: float) -> float:
        y = interp.at(pilot_pos + a + frac * (b - a)).reshape(-1, npb)
        h = y @ conj
        return float(np.sum(np.abs(y - h[:, None] * pilots[None, :]) ** 2))

    best = (0.0, 0.0)
    for width in (TIMING_SEARCH_SAMPLES, TIMING_SEARCH_SAMPLES / 4):
        a0, b0 = best
        tries = [(a0 + width * i, b0 + width * j) for i in grid for j in grid]
        best = min(tries, key=lambda ab: residual(*ab))
    return best


def _residual_cfo_hz(block_gain: np.ndarray, params: WaveformParams, scale: float) -> float:
    """Frequency offset left after the preamble estimate, from the pilot phase advance.

    Uses the equally spaced blocks only (the last block follows a shorter chunk); the
    unambiguous range is +-1 / (2 block period), far wider than the preamble's error.
    Under fading the Doppler adds zero-mean noise to this estimate.
    """
    if block_gain.size < 3:
        return 0.0
    advance = np.sum(block_gain[1:-1] * np.conj(block_gain[:-2]))
    period_s = (params.pilot_spacing + params.pilots_per_block) / params.symbol_rate_hz
    return float(np.angle(advance)) / (2 * np.pi * period_s / scale)


def _lock(
    r: np.ndarray, params: WaveformParams, taps: np.ndarray, known_cfo_hz: float | None = None,
) -> tuple[Coarse, np.ndarray, np.ndarray, float]:
    """Try the preamble candidates, best first; keep the first whose correlation verifies.

    Returns the candidate, the CFO-corrected samples, their matched-filter output and the
    fractional index in it of the first preamble symbol.
    """
    sps = params.samples_per_symbol
    delay = (taps.size - 1) // 2
    best_rho = 0.0
    for cand in coarse_sync(r, params):
        if known_cfo_hz is not None:
            cand = replace(cand, cfo_hz=float(known_cfo_hz))
        corrected = correct_cfo(r, cand.cfo_hz, params.sample_rate_hz)
        mf = matched_filter(corrected, taps)
        # The repetition window starts within about a pulse length of the first preamble
        # peak, which sits at cand.start + delay in r and one more delay later in mf.
        try:
            t_pre, rho = fine_timing(
                mf, params.preamble, sps, cand.start + 2 * delay,
                half_window=params.zc_length * sps // 2,
            )
        except SyncError:
            continue
        if rho >= CORRELATION_THRESHOLD:
            return cand, corrected, mf, t_pre
        best_rho = max(best_rho, rho)
    raise SyncError(
        f"no frame found: best preamble correlation {best_rho:.3f} < {CORRELATION_THRESHOLD}"
    )
