"""Fit beta1, beta2 of the convergence model from pilot runs (pure functions).

Model: the number of uploads needed to reach a target training loss is

    K_needed = beta1 * theta_qs + beta2 * N,

linear in ``(beta1, beta2)``, with ``N`` the noise term of the model the pilots were run for:

* ``"decoded-noise/v1"`` (:data:`DECODED_NOISE_MODEL`, record-level FedSGD plans):
  ``N = mean_i (theta_qs d sigma_i^2 + l n0_i / (h_i alpha_i)^2)``, the noise energy of a
  decoded upload (:func:`aggregator.solver.compression_terms.decoded_noise_energy`);
* ``"paper-25"`` (:data:`PAPER_MODEL`, device-level plans, 003 eq. 25):
  ``N = kappa (theta_qs s + m)`` with ``s = mean_i sigma_i^2``, ``m = mean_i n0_i/(h_i alpha_i)^2``.

:func:`fit_betas` solves the non-negative least-squares problem (scipy ``nnls``), by
default on relative residuals ``(pred - K) / K`` so short and long runs weigh alike, and
reports the in-sample and leave-one-out relative errors. :func:`uploads_to_target` is the
one definition of "the round at which a run reached a training loss" (a trailing moving
average over ``window`` rounds), shared with the runner's ``loss_targets`` and
``stop_at_loss``. :func:`design_problem` says, before any pilot runs, whether a grid of
regressors can identify both constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aggregator.solver.compression_terms import DECODED_NOISE_MODEL

#: Name of the device-level model, 003 eq. (25) (stored in calibration files).
PAPER_MODEL = "paper-25"
#: The convergence models a calibration can be made for.
MODELS: tuple[str, ...] = (DECODED_NOISE_MODEL, PAPER_MODEL)
#: A grid whose two regressor columns have a cosine above this is refused (near-collinear:
#: the fit could trade beta1 for beta2 freely).
MAX_COLUMN_COSINE = 0.99
#: A regressor column whose largest value is below this multiple of its smallest does not
#: vary enough to tell its constant from the other's.
MIN_COLUMN_RATIO = 1.5


@dataclass(frozen=True)
class PilotRun:
    """One pilot run's regressors and outcome.

    Build it with :meth:`paper` or :meth:`decoded`.

    Attributes
    ----------
    theta_qs
        Lemma 3 factor of the run's compression (>= 1, dimensionless).
    noise_term
        The model's noise regressor ``N`` (>= 0; value units squared for the decoded-noise
        model, ``kappa`` times variance for the paper model).
    uploads_needed
        First upload count at which the (smoothed) training loss reached the target (>= 1).
    model
        One of :data:`MODELS`.
    """

    theta_qs: float
    noise_term: float
    uploads_needed: float
    model: str = PAPER_MODEL

    @classmethod
    def paper(
        cls,
        *,
        theta_qs: float,
        kappa: float,
        sigma2_mean: float,
        chan_mean: float,
        uploads_needed: float,
    ) -> PilotRun:
        """A pilot for 003 (25): ``N = kappa (theta_qs sigma2_mean + chan_mean)``.

        Parameters
        ----------
        theta_qs
            Lemma 3 factor (>= 1).
        kappa
            Expected non-zeros after compression (``Q (Q + sqrt(l))``, ``l`` or ``d``), > 0.
        sigma2_mean
            Mean artificial noise variance per coordinate over devices.
        chan_mean
            Mean ``n0_i / (h_i alpha_i)^2`` over devices (channel noise after inversion).
        uploads_needed
            Uploads to the target (>= 1).
        """
        if not (kappa > 0 and sigma2_mean >= 0 and chan_mean >= 0):
            raise ValueError(
                f"PilotRun.paper: kappa={kappa}, sigma2_mean={sigma2_mean}, "
                f"chan_mean={chan_mean}; allowed: kappa > 0, the variances >= 0"
            )
        noise = kappa * (theta_qs * sigma2_mean + chan_mean)
        return cls(theta_qs, noise, uploads_needed, PAPER_MODEL)

    @classmethod
    def decoded(
        cls, *, theta_qs: float, noise_energy_mean: float, uploads_needed: float
    ) -> PilotRun:
        """A pilot for ``decoded-noise/v1``: ``N = mean_i decoded_noise_energy_i``.

        Parameters
        ----------
        theta_qs
            Lemma 3 factor (``d / l`` with sparsification only), >= 1.
        noise_energy_mean
            Mean over devices of ``theta_qs d sigma_i^2 + l n0_i / (h_i alpha_i)^2`` (value
            units squared), >= 0.
        uploads_needed
            Uploads to the target (>= 1).
        """
        return cls(theta_qs, noise_energy_mean, uploads_needed, DECODED_NOISE_MODEL)

    def regressors(self) -> tuple[float, float]:
        """``(theta_qs, N)``: the two columns of the design matrix."""
        return self.theta_qs, self.noise_term


@dataclass(frozen=True)
class BetaFit:
    """Result of :func:`fit_betas`.

    Attributes
    ----------
    beta1, beta2
        The fitted constants (>= 0).
    rms_relative_error
        RMS over the pilots of ``(pred - K) / K`` with the fit on all pilots.
    loo_relative_error
        RMS of the same relative error when each pilot is predicted by a fit on the others
        (``None`` with fewer than 3 pilots, or when leaving one out leaves a set that cannot
        be fitted).
    n_runs
        Pilots used.
    identified
        ``False`` when a constant came out 0 (the data cannot tell it from 0).
    model
        The model the pilots were run for.
    """

    beta1: float
    beta2: float
    rms_relative_error: float
    loo_relative_error: float | None
    n_runs: int
    identified: bool
    model: str

    @property
    def error(self) -> float:
        """The error to judge the fit by: leave-one-out when available, else in-sample."""
        return self.rms_relative_error if self.loo_relative_error is None else (
            self.loo_relative_error
        )


def design_problem(regressors: Sequence[tuple[float, float]]) -> str | None:
    """Why a set of regressor rows cannot identify ``(beta1, beta2)``; ``None`` if it can.

    Checks, in order: at least 2 rows; the noise column varies (largest >=
    :data:`MIN_COLUMN_RATIO` times smallest, and not all zero) and ``theta_qs`` is not all
    zero; the columns are not near-collinear (cosine <= :data:`MAX_COLUMN_COSINE`); the
    matrix has rank 2. A constant ``theta_qs`` (every pilot at the same compression) is
    allowed: ``beta1 theta_qs`` is then the intercept, identified through the noise
    column's variation, and the ``theta_qs`` scaling itself is not checked by the data.

    Parameters
    ----------
    regressors
        Rows ``(theta_qs, N)``, shape ``(n, 2)``.
    """
    x = np.asarray(regressors, dtype=np.float64).reshape(-1, 2)
    if len(x) < 2:
        return f"{len(x)} pilot(s); at least 2 are needed"
    if not np.all(np.isfinite(x)):
        return "a regressor is not finite"
    names = ("theta_qs", "the noise term")
    if np.abs(x[:, 0]).max() == 0:
        return "theta_qs is 0 for every pilot"
    for j in (1,):
        col = np.abs(x[:, j])
        if col.max() == 0 or col.max() < MIN_COLUMN_RATIO * col.min():
            return (
                f"{names[j]} does not vary enough across the pilots (from {col.min():.4g} to "
                f"{col.max():.4g}; need largest >= {MIN_COLUMN_RATIO} x smallest)"
            )
    cos = float(x[:, 0] @ x[:, 1] / (np.linalg.norm(x[:, 0]) * np.linalg.norm(x[:, 1])))
    if cos > MAX_COLUMN_COSINE:
        return (
            f"theta_qs and the noise term vary together (cosine {cos:.4f} > "
            f"{MAX_COLUMN_COSINE}), so beta1 and beta2 cannot be told apart"
        )
    if np.linalg.matrix_rank(x / np.abs(x).max(axis=0)) < 2:
        return "the regressor columns are linearly dependent"
    return None


def column_cosine(regressors: Sequence[tuple[float, float]]) -> float:
    """Cosine between the two regressor columns (1: collinear), shape ``(n, 2)`` input."""
    x = np.asarray(regressors, dtype=np.float64).reshape(-1, 2)
    den = np.linalg.norm(x[:, 0]) * np.linalg.norm(x[:, 1])
    return float(x[:, 0] @ x[:, 1] / den) if den > 0 else 1.0


def _nnls_fit(x: np.ndarray, y: np.ndarray, relative: bool) -> np.ndarray:
    from scipy.optimize import nnls

    w = 1.0 / y if relative else np.ones_like(y)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) * w[:, None], y * w)
    return np.asarray(coef / scale)


def _rank2(x: np.ndarray) -> bool:
    scale = np.abs(x).max(axis=0)
    return bool(np.all(scale > 0) and np.linalg.matrix_rank(x / scale) == 2)


def fit_betas(runs: Sequence[PilotRun], *, relative: bool = True) -> BetaFit:
    """Non-negative least-squares fit of (beta1, beta2) to pilot runs of one model.

    Parameters
    ----------
    runs
        Pilots that reached the target, all of the same ``model``.
    relative
        Minimise relative residuals ``(pred - K) / K`` (default) instead of absolute ones.

    Raises
    ------
    ValueError
        With fewer than 2 runs, runs of different models, invalid values, or runs whose
        regressors are not linearly independent.
    """
    if len(runs) < 2:
        raise ValueError(
            f"runs: need at least 2 pilot runs that reached the target, got {len(runs)}"
        )
    models = {r.model for r in runs}
    if len(models) != 1 or not models <= set(MODELS):
        raise ValueError(f"runs: models {sorted(models)}; allowed: one of {MODELS}")
    for i, r in enumerate(runs):
        if not (r.theta_qs >= 1 and math.isfinite(r.theta_qs)
                and r.noise_term >= 0 and math.isfinite(r.noise_term)
                and r.uploads_needed >= 1 and math.isfinite(r.uploads_needed)):
            raise ValueError(
                f"runs[{i}]: invalid values {r}; allowed: finite theta_qs >= 1, "
                "noise_term >= 0, uploads_needed >= 1"
            )
    x = np.array([r.regressors() for r in runs], dtype=np.float64)
    y = np.array([r.uploads_needed for r in runs], dtype=np.float64)
    if not _rank2(x):
        raise ValueError(
            "runs: the pilot settings do not vary theta_qs and the noise term independently; "
            "add runs with other compression or noise levels"
        )
    beta = _nnls_fit(x, y, relative)
    rms = float(np.sqrt(np.mean(((x @ beta - y) / y) ** 2)))
    loo: float | None = None
    if len(runs) >= 3:
        errs: list[float] = []
        for i in range(len(runs)):
            keep = np.arange(len(runs)) != i
            if not _rank2(x[keep]):
                errs = []
                break
            b = _nnls_fit(x[keep], y[keep], relative)
            errs.append((float(x[i] @ b) - y[i]) / y[i])
        loo = float(np.sqrt(np.mean(np.square(errs)))) if errs else None
    return BetaFit(
        beta1=float(beta[0]),
        beta2=float(beta[1]),
        rms_relative_error=rms,
        loo_relative_error=loo,
        n_runs=len(runs),
        identified=bool(beta[0] > 0 and beta[1] > 0),
        model=models.pop(),
    )


def smoothed_losses(train_losses: Sequence[float], window: int = 1) -> np.ndarray:
    """Trailing moving average of a training-loss curve.

    Entry ``k`` (0-based) is the mean of the finite losses among rounds
    ``max(0, k - window + 1) .. k`` (fewer than ``window`` at the start); ``nan`` when none
    of them is finite (a round with no examples has loss ``nan``).

    Parameters
    ----------
    train_losses
        Per-round mean training loss, shape ``(rounds,)``.
    window
        Rounds averaged (>= 1; 1 = the raw curve).

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(rounds,)``.
    """
    if isinstance(window, bool) or not isinstance(window, int | np.integer) or window < 1:
        raise ValueError(f"window: got {window!r}; allowed: an integer >= 1")
    v = np.array([float(x) if isinstance(x, int | float) else math.nan for x in train_losses],
                 dtype=np.float64)
    ok = np.isfinite(v)
    csum = np.concatenate([[0.0], np.cumsum(np.where(ok, v, 0.0))])
    ccount = np.concatenate([[0], np.cumsum(ok)])
    hi = np.arange(1, len(v) + 1)
    lo = np.maximum(0, hi - int(window))
    count = ccount[hi] - ccount[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (csum[hi] - csum[lo]) / count
    out[count == 0] = math.nan
    return np.asarray(out, dtype=np.float64)


def uploads_to_target(
    train_losses: Sequence[float], target: float, window: int = 1
) -> int | None:
    """Upload count (1-based) at which the smoothed loss first reaches ``target``.

    The smoothed loss is :func:`smoothed_losses` (trailing mean over ``window`` rounds);
    the run's summary (``loss_targets``), its early stop (``stop_at_loss``) and
    ``testbed calibrate`` all use this definition. ``None`` if never reached.
    """
    if not math.isfinite(target):
        raise ValueError(f"target: got {target!r}; allowed: a finite loss")
    hits = np.flatnonzero(smoothed_losses(train_losses, window) <= target)
    return int(hits[0]) + 1 if hits.size else None
