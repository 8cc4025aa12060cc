"""The solver's privacy constraint: 003 Theorem 1 corrected (SEED-NOTES items 2-5).

Per upload, device i releases its ``kappa``-sparse message through a Gaussian mechanism
with l2 sensitivity ``2 h alpha sqrt(kappa / d) Z`` (003 eq. 15) and noise variance
``(h alpha sigma)^2 + t N0`` per coordinate (t = trusted fraction of the channel noise,
``N0`` per real coordinate). Its Renyi DP at order ``rho`` is ``rho * beta`` with
``beta = 2 (kappa/d) Z^2 / (sigma^2 + t N0 / (h alpha)^2)``, and ``K = T / H`` uploads
(item 2: uploads, not iterations) compose to ``rho * B`` with ``B = K beta``. With 003
Lemma 2, ``eps(rho) = rho B + log(1/delta) / (rho - 1)``, minimised at
``rho* = 1 + sqrt(log(1/delta) / B)``:

    eps = B + 2 sqrt(B log(1/delta))                                   (exact minimum)
    eps <= eps_target  <=>  sqrt(B) <= sqrt(log(1/delta) + eps) - sqrt(log(1/delta))  (item 3)
                       <=>  sigma^2 + t N0 / (h alpha)^2 >= c4 = 2 K (kappa/d) Z^2 / B_max  (item 4)

with ``B_max = (sqrt(log(1/delta) + eps) - sqrt(log(1/delta)))^2``. The printed (27),
``B <= (eps - 1)^2 / (4 log(1/delta))``, is not used.
"""

from __future__ import annotations

import math

import numpy as np


def rdp_budget(epsilon: float, delta: float) -> float:
    """``B_max``: the largest total RDP slope ``B`` with ``min_rho eps(rho) <= epsilon``."""
    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon!r}, {delta!r}")
    log_d = math.log(1.0 / delta)
    # sqrt(L + e) - sqrt(L) = e / (sqrt(L + e) + sqrt(L)): no cancellation for small e.
    return (epsilon / (math.sqrt(log_d + epsilon) + math.sqrt(log_d))) ** 2


def c4(k_uploads: float, kappa_ratio: float, z: float, b_max: float) -> float:
    """Least effective noise variance per coordinate, ``2 K (kappa/d) Z^2 / B_max``."""
    return 2.0 * k_uploads * kappa_ratio * z * z / b_max


def rdp_slope(
    *, sigma2: np.ndarray, b: np.ndarray, n_eff: np.ndarray, trusted: float,
    k_uploads: float, kappa_ratio: float, z: float,
) -> np.ndarray:
    """``B_i`` (total RDP at order rho divided by rho), shape ``(N,)``.

    ``n_eff = N0 / h^2`` and ``b = alpha^2``; the credited channel noise is ``t n_eff / b``.
    """
    noise = np.asarray(sigma2) + trusted * np.asarray(n_eff) / np.asarray(b)
    with np.errstate(divide="ignore"):
        return 2.0 * k_uploads * kappa_ratio * z * z / noise


def epsilon_from_slope(slope: np.ndarray, delta: float) -> np.ndarray:
    """``min_rho rho B + log(1/delta)/(rho - 1) = B + 2 sqrt(B log(1/delta))``."""
    s = np.asarray(slope, dtype=np.float64)
    return s + 2.0 * np.sqrt(s * math.log(1.0 / delta))


def paper_epsilon(
    *, sigma2: np.ndarray, b: np.ndarray, n_eff: np.ndarray, trusted: float,
    k_uploads: float, kappa_ratio: float, z: float, delta: float,
) -> np.ndarray:
    """Per-device epsilon of the corrected Theorem 1 (closed form), shape ``(N,)``."""
    slope = rdp_slope(
        sigma2=sigma2, b=b, n_eff=n_eff, trusted=trusted, k_uploads=k_uploads,
        kappa_ratio=kappa_ratio, z=z,
    )
    return epsilon_from_slope(slope, delta)
