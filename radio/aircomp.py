"""Over-the-air computation (AirComp) at the symbol level: pre-equalization with truncated
channel inversion, superposition in one slot, and the aggregation error.

Every participating device ``j`` sends ``alpha_j x_j`` with ``alpha_j = c / h_hat_j`` in the
same slot; the receiver gets ``y = sum_j h_j alpha_j x_j + n`` and estimates the sum of the
``x_j`` as ``y / c``. With perfect estimates every device arrives at the common amplitude
``c``; an estimate off by a factor leaves a misalignment ``rho_j = h_j / h_hat_j``
(docs/privacy.md section 12 accounts for it). A device whose channel would need more than
its power limit to reach ``c`` sits the round out (truncated inversion).

Power unit: symbol power (``E|x|^2`` per complex symbol, the unit of every link here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radio.channel_noise import SEEDED, ChannelNoise


@dataclass(frozen=True)
class PreEqualization:
    """The devices' transmit scalings for one AirComp round.

    Attributes
    ----------
    amplitude
        ``c > 0``: the common received amplitude per unit of ``x`` (symbol-amplitude units).
    alpha
        ``complex128``, shape ``(N,)``: ``c / h_hat_j`` for participating devices, 0 for the
        others.
    participating
        ``bool``, shape ``(N,)``.
    """

    amplitude: float
    alpha: np.ndarray
    participating: np.ndarray


def _reach(h_hat: np.ndarray, p_max: np.ndarray, signal_power: float) -> np.ndarray:
    """``|h_hat_j| sqrt(P_max,j / E|x|^2)``: the largest ``c`` each device can reach."""
    if not signal_power > 0:
        raise ValueError(f"signal_power must be > 0, got {signal_power}")
    return np.abs(h_hat) * np.sqrt(np.asarray(p_max, dtype=np.float64) / signal_power)


def pre_equalize(h_hat: np.ndarray, amplitude: float, p_max: np.ndarray | float,
                 signal_power: float) -> PreEqualization:
    """Truncated channel inversion: ``alpha_j = c / h_hat_j`` where ``|alpha_j|^2 E|x|^2 <=
    P_max,j``, else the device sits out.

    Parameters
    ----------
    h_hat
        ``complex``, shape ``(N,)``: each device's channel estimate (from its pilot).
    amplitude
        ``c > 0``.
    p_max
        Shape ``(N,)`` (or scalar): each device's power limit (symbol-power units).
    signal_power
        ``E|x_j|^2`` per symbol before scaling (the same bound for every device).

    Raises
    ------
    ValueError
        ``c <= 0``, or an estimate of zero gain.
    """
    h_hat = np.asarray(h_hat, dtype=np.complex128)
    if not amplitude > 0:
        raise ValueError(f"amplitude c must be > 0, got {amplitude}")
    if np.any(h_hat == 0):
        raise ValueError("a channel estimate is exactly zero: that device cannot pre-equalize")
    p_max = np.broadcast_to(np.asarray(p_max, dtype=np.float64), h_hat.shape)
    ok = _reach(h_hat, p_max, signal_power) >= amplitude * (1 - 1e-12)
    alpha = np.where(ok, amplitude / h_hat, 0.0).astype(np.complex128)
    return PreEqualization(float(amplitude), alpha, ok)


def amplitude_for(h_hat: np.ndarray, p_max: np.ndarray | float, signal_power: float,
                  participants: int) -> float:
    """The largest ``c`` at which ``participants`` devices (those with the strongest
    reach) can transmit: the ``participants``-th largest reach.

    Raises
    ------
    ValueError
        ``participants`` outside ``[1, N]``.
    """
    h_hat = np.asarray(h_hat, dtype=np.complex128)
    n = h_hat.size
    if not 1 <= participants <= n:
        raise ValueError(f"participants must lie in [1, {n}], got {participants}")
    p_max = np.broadcast_to(np.asarray(p_max, dtype=np.float64), h_hat.shape)
    reach = np.sort(_reach(h_hat, p_max, signal_power))[::-1]
    return float(reach[participants - 1])


def superpose(transmitted: np.ndarray, gains: np.ndarray, noise_var: float,
              rng: np.random.Generator, noise: ChannelNoise = SEEDED) -> np.ndarray:
    """``y = sum_j h_j s_j + n`` for one slot.

    Parameters
    ----------
    transmitted
        ``complex``, shape ``(N, n_symbols)``: each device's scaled symbols ``alpha_j x_j``
        (zeros for a device that sits out).
    gains
        ``complex``, shape ``(N,)`` (one block per upload) or ``(N, n_symbols)``.
    noise_var
        ``N0`` per complex symbol at the receiver.
    rng
        The slot's channel generator (the noise is drawn from it only when ``noise`` is
        not secret).
    noise
        Source of the receiver noise.

    Returns
    -------
    numpy.ndarray
        ``complex128``, shape ``(n_symbols,)``.
    """
    s = np.asarray(transmitted, dtype=np.complex128)
    if s.ndim != 2:
        raise ValueError(f"transmitted must be (N, n_symbols), got shape {s.shape}")
    h = np.asarray(gains, dtype=np.complex128)
    h = h[:, None] if h.ndim == 1 else h
    if h.shape[0] != s.shape[0] or h.shape[1] not in (1, s.shape[1]):
        raise ValueError(f"gains shape {np.shape(gains)} does not match {s.shape}")
    y = np.sum(h * s, axis=0)
    if noise_var > 0:
        y = y + noise.complex_normal(s.shape[1], noise_var, rng)
    return y


def misalignment_bounds(h_hat: np.ndarray, h_abs_lower: np.ndarray,
                        h_abs_upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rho_lo, rho_hi)``: bounds on ``|h_j alpha_j| / c = |h_j| / |h_hat_j|`` from
    confidence bounds on ``|h_j|`` (what the accountant credits, docs/privacy.md §12)."""
    mag = np.abs(np.asarray(h_hat, dtype=np.complex128))
    lo, hi = np.asarray(h_abs_lower, np.float64), np.asarray(h_abs_upper, np.float64)
    if np.any(lo < 0) or np.any(hi < lo):
        raise ValueError("need 0 <= h_abs_lower <= h_abs_upper")
    return lo / mag, hi / mag


def aggregation_nmse(estimate: np.ndarray, truth: np.ndarray) -> float:
    """``||estimate - truth||^2 / ||truth||^2`` (``inf`` for a zero truth and any error)."""
    e = np.asarray(estimate) - np.asarray(truth)
    den = float(np.vdot(truth, truth).real)
    num = float(np.vdot(e, e).real)
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den
