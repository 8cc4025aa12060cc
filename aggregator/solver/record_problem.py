"""The EE-DP-FL problem under record-level privacy, accounted as the run enforces it.

A record-level FedSGD round (``privacy.unit: record``, ``privacy.noise: upload``,
``local_steps: 1``) releases, per device, ``v = (clipped per-example gradient sum) / B +
N(0, sigma^2 I)`` over a Poisson batch of rate ``q_i``, sent as ``x = alpha (d/l) v_S``.
docs/privacy.md section 10.2 shows that the channel noise, referred back to ``v``, adds
``t theta_s^2 n_i / b_i`` per coordinate (``n_i = n0_i / h_i^2``, ``b_i = alpha_i^2``,
``t`` the trusted fraction, nothing credited when a quantizer sits in between). The round is
one Poisson-subsampled Gaussian with noise multiplier ``z_eff = sigma_eff B / C``, and the
run's accountant (``dp-accounting`` PLD or RDP) composes ``K`` of them. With
``z_min(q, K)`` the smallest multiplier meeting the target (calibrated numerically), the
privacy constraint is

    sigma_i^2 + t theta_s^2 n_i / b_i >= s_min(K)^2,    s_min(K) = z_min(q_i, K) C / B,

the structure of 003 (31d)/(32d) with a new ``c4 = s_min(K)^2`` (a function of K, not the
linear ``2 K (kappa/d) Z^2 / B_max`` of the paper accounting) and a trusted fraction
``t theta_s^2``. The convergence model is ``K >= beta1 theta_qs + beta2 mean_i
(theta_qs d sigma_i^2 + l n_i / b_i)`` (:func:`~aggregator.solver.compression_terms.
decoded_noise_energy`), which in the (32) form is ``sum_i (theta'' a_i + n_i) / b_i <=
N (K - beta1 theta_qs) / (beta2 d theta_s)`` with ``theta'' = theta_qs / theta_s``. The
power bound uses ``Z = C sqrt(1 + 1/B)`` (``E||v||^2 <= C^2 (1 + 1/B)``), as the runner does.

Because ``c4`` depends on K through a numerical calibration (0.4 s per K with PLD),
``s_min`` is computed exactly at integer K and interpolated (log-log, from a geometric grid
of exact values) at the non-integer K the continuous search visits; every integer plan is
evaluated with exact values only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from aggregator.solver import algorithm as alg
from aggregator.solver.compression_terms import theta_qs

#: Calibrate to this fraction of the target (as the runner does, testbed.core.record_schemes):
#: the enforced PLD accountant composes round by round and rounds z down by 1e-3 relative.
RECORD_MARGIN = 0.995

#: Ratio between consecutive K of the grid of exact noise floors used for interpolation.
GRID_RATIO = 1.4


@dataclass(frozen=True)
class RecordTerms:
    """What the record-level accountant needs about the devices' data and sampling.

    Attributes
    ----------
    sampling_rates
        ``q_i = B / D_i`` per device, shape ``(N,)`` (the Poisson rate actually used).
    amplified
        Whether sampling is secret (CSPRNG): ``False`` credits no amplification (q = 1).
    example_clip
        ``C``, the per-example l2 clip.
    expected_batch
        ``B``, the public normaliser (``batch_size``).
    accountant
        ``"pld"`` or ``"rdp"`` (the run's ``privacy.accountant``).
    relation
        ``"add-remove"`` or ``"replace-one"``.
    """

    sampling_rates: tuple[float, ...]
    amplified: bool
    example_clip: float
    expected_batch: float
    accountant: str
    relation: str

    @property
    def effective_rates(self) -> tuple[float, ...]:
        """``q_i`` if amplification is credited, else 1 for every device."""
        return self.sampling_rates if self.amplified else tuple(1.0 for _ in self.sampling_rates)

    @property
    def norm_bound(self) -> float:
        """``Z = C sqrt(1 + 1/B)``: bound on ``sqrt(E||v||^2)`` used for power (the runner's)."""
        from testbed.core.record_schemes import record_norm_bound

        return record_norm_bound(self.example_clip, self.expected_batch)


Calibrator = Callable[[float, int], float]


@dataclass
class NoiseFloor:
    """``s_min(K)^2`` = max over devices of ``(z_min(q_i, K) C / B)^2`` (value units squared).

    ``calibrate(q, K)`` returns the smallest noise multiplier meeting the target after ``K``
    steps at rate ``q`` (exact, cached per ``(q, K)``). Non-integer K are interpolated in
    log-log space between exact values on a geometric grid (search only).
    """

    terms: RecordTerms
    calibrate: Calibrator
    k_max: int
    exact: dict[tuple[float, int], float] = field(default_factory=dict)
    calls: int = 0
    _grid: np.ndarray | None = None
    _log_s2: np.ndarray | None = None
    progress: Callable[[str], None] | None = None

    def z_min(self, q: float, k: int) -> float:
        """Exact ``z_min(q, k)`` (cached)."""
        key = (float(q), int(k))
        if key not in self.exact:
            self.calls += 1
            self.exact[key] = float(self.calibrate(float(q), int(k)))
        return self.exact[key]

    def s2_exact(self, k: int) -> float:
        """``max_i (z_min(q_i, k) C / B)^2`` at integer ``k``."""
        scale = self.terms.example_clip / self.terms.expected_batch
        return max(self.z_min(q, k) for q in set(self.terms.effective_rates)) ** 2 * scale**2

    def _ensure_grid(self) -> None:
        if self._grid is not None:
            return
        ks: list[int] = []
        k = 1.0
        while k < self.k_max:
            ki = int(math.ceil(k))
            if not ks or ki > ks[-1]:
                ks.append(ki)
            k *= GRID_RATIO
        if not ks or ks[-1] != self.k_max:
            ks.append(int(self.k_max))
        vals = []
        for j, ki in enumerate(ks):
            if self.progress is not None and j % 5 == 0:
                self.progress(f"noise floor: calibrating K = {ki} ({j + 1} of {len(ks)})")
            vals.append(self.s2_exact(ki))
        self._grid = np.log(np.asarray(ks, dtype=np.float64))
        self._log_s2 = np.log(np.asarray(vals))

    def s2(self, k: float) -> float:
        """Exact at integer ``k``; log-log interpolation elsewhere (for the search)."""
        if abs(k - round(k)) < 1e-9:
            return self.s2_exact(int(round(k)))
        self._ensure_grid()
        assert self._grid is not None and self._log_s2 is not None
        x = math.log(k)
        g, y = self._grid, self._log_s2
        if x <= g[0]:
            return float(math.exp(y[0]))
        if x >= g[-1]:
            slope = (y[-1] - y[-2]) / (g[-1] - g[-2]) if g.size > 1 else 0.0
            return float(math.exp(y[-1] + slope * (x - g[-1])))
        return float(math.exp(np.interp(x, g, y)))


@dataclass(frozen=True)
class RecordProblem(alg.Problem):
    """:class:`~aggregator.solver.algorithm.Problem` with the record-level constraints.

    ``trusted`` is the scheme's trusted fraction (0 for schemes that credit no channel and
    for the quantized family); ``scenario.clip_bound`` must be the norm bound
    ``C sqrt(1 + 1/B)``.
    """

    floor: NoiseFloor | None = None

    def constraint_terms(
        self, k: float, theta_q: float, theta_s: float, tqs: float
    ) -> tuple[float, float, float, Callable[[], float]] | None:
        """The record-level terms: ``r = theta_s``, ``theta'' = theta_qs / theta_s``,
        ``t theta_s^2`` and ``c4 = s_min(K)^2``; no point below one round."""
        floor = self.floor
        assert floor is not None
        if k < 1:
            return None
        return theta_s, tqs / theta_s, self.trusted * theta_s**2, lambda: floor.s2(k)


def required_uploads(
    *, beta1: float, beta2: float, family: str, theta_q: float, theta_s: float, d: int,
    sigma: np.ndarray, chan: np.ndarray,
) -> float:
    """Right side of the record-level convergence model at a plan's values.

    ``beta1 theta_qs + beta2 mean_i (theta_qs d sigma_i^2 + l chan_i)`` with
    ``chan_i = n0_i / (h_i alpha_i)^2``.
    """
    from aggregator.solver.compression_terms import decoded_noise_energy

    tqs = theta_qs(family, theta_q, theta_s)
    noise = [
        decoded_noise_energy(family, theta_q, theta_s, d, float(sg) ** 2, float(c))
        for sg, c in zip(np.asarray(sigma), np.asarray(chan), strict=True)
    ]
    return float(beta1 * tqs + beta2 * np.mean(noise))
