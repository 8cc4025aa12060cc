"""Fit beta1, beta2 of the convergence model (25) from pilot runs (pure functions).

Model: the number of uploads needed to reach a target training loss is

    K_needed = beta1 * theta_qs + beta2 * kappa * (theta_qs * s + m),

with ``s = mean_i sigma_i^2`` and ``m = mean_i n0_i / (h_i alpha_i)^2`` of the run, which is
linear in ``(beta1, beta2)``. :func:`fit_betas` solves the non-negative least-squares problem
(scipy ``nnls``), by default on relative residuals ``(pred - K) / K`` so short and long runs
weigh alike. A run that never reached the target carries no equation and is skipped by the
caller (it is only a lower bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls


@dataclass(frozen=True)
class PilotRun:
    """One pilot run's regressors and outcome.

    Attributes
    ----------
    theta_qs
        Lemma 3 factor of the run's compression (>= 1).
    kappa
        Expected non-zeros after compression (``Q (Q + sqrt(l))``, ``l`` or ``d``).
    sigma2_mean
        Mean artificial noise variance per coordinate over devices.
    chan_mean
        Mean ``n0_i / (h_i alpha_i)^2`` over devices (channel noise after inversion).
    uploads_needed
        First upload count at which the training loss reached the target (>= 1).
    """

    theta_qs: float
    kappa: float
    sigma2_mean: float
    chan_mean: float
    uploads_needed: float

    def regressors(self) -> tuple[float, float]:
        """``(theta_qs, kappa (theta_qs s + m))``."""
        return self.theta_qs, self.kappa * (self.theta_qs * self.sigma2_mean + self.chan_mean)


@dataclass(frozen=True)
class BetaFit:
    """Result of :func:`fit_betas`."""

    beta1: float
    beta2: float
    rms_relative_error: float
    n_runs: int
    identified: bool  # False when the data cannot separate beta2 from 0


def fit_betas(runs: Sequence[PilotRun], *, relative: bool = True) -> BetaFit:
    """Non-negative least-squares fit of (beta1, beta2) to pilot runs.

    Raises
    ------
    ValueError
        With fewer than 2 runs, or runs whose regressors are not linearly independent.
    """
    if len(runs) < 2:
        raise ValueError(
            f"runs: need at least 2 pilot runs that reached the target, got {len(runs)}"
        )
    for i, r in enumerate(runs):
        if not (r.theta_qs >= 1 and r.kappa > 0 and r.sigma2_mean >= 0 and r.chan_mean >= 0
                and r.uploads_needed >= 1 and math.isfinite(r.uploads_needed)):
            raise ValueError(f"runs[{i}]: invalid values {r}")
    x = np.array([r.regressors() for r in runs], dtype=np.float64)
    y = np.array([r.uploads_needed for r in runs], dtype=np.float64)
    if np.linalg.matrix_rank(x / np.maximum(np.abs(x).max(axis=0), 1e-300)) < 2:
        raise ValueError(
            "runs: the pilot settings do not vary theta_qs and the noise term independently; "
            "add runs with other compression or noise levels"
        )
    w = 1.0 / y if relative else np.ones_like(y)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) * w[:, None], y * w)
    beta = coef / scale
    pred = x @ beta
    rms = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
    return BetaFit(float(beta[0]), float(beta[1]), rms, len(runs), bool(beta[1] > 0))


def uploads_to_target(train_losses: Sequence[float], target: float) -> int | None:
    """Upload count (1-based) at which the loss first reaches ``target``; ``None`` if never."""
    for k, loss in enumerate(train_losses, start=1):
        if loss <= target:
            return k
    return None
