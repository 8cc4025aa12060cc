"""Sub-problem (31)/(32): power scaling and artificial noise for fixed (K, theta_q, theta_s).

With ``b_i = alpha_i^2``, ``a_i = alpha_i^2 sigma_i^2`` and ``n_i = N0_i / h_i^2`` the problem
is (003 (32) with SEED-NOTES items 4-7 applied and a trusted fraction ``t``)::

    min  sum_i Z^2 b_i + d a_i
    s.t. sum_i (theta_qs a_i + n_i) / b_i <= C                  (convergence, (32b))
         Z^2 b_i + d a_i <= c3_i                                 (power, (32c))
         a_i + t n_i >= c4 b_i                                   (privacy, (32d) corrected)
         a_i >= 0, b_i > 0.

The closed form re-derived in docs/solver.md: for fixed ``b_i`` the least ``a_i`` is optimal,
``a_i(b) = max(0, c4 b - t n_i)``. Eliminating ``a`` leaves a separable *convex* problem in
``b`` (the per-device energy ``e_i(b)`` and convergence term ``g_i(b)`` are convex on the
useful range ``b <= top_i``), so with one multiplier ``lam`` for the convergence constraint::

    b_i(lam) = min(top_i, argmin_b e_i(b) + lam g_i(b))
             = sqrt(lam n_i) / Z                                     if that is <= b0_i,
               max(b0_i, sqrt(lam n_i (1 - theta_qs t) / (Z^2 + d c4)))  if 1 - theta_qs t > 0,
               b0_i                                                  otherwise,
    b0_i = t n_i / c4,    a_i = max(0, c4 b_i - t n_i),

and ``lam`` solves ``sum_i g_i(b_i(lam)) = C``. ``G(lam) = sum_i g_i`` is non-increasing and
equal to ``G_c + S / sqrt(lam)`` between consecutive breakpoints (where a device enters or
leaves a regime), so the solver bisects over the sorted breakpoints and solves the last
piece exactly. Artificial noise appears only where ``t < 1 / theta_qs``: with the whole
channel noise trusted (t = 1) and ``theta_qs >= 1`` it is never used (SEED-NOTES item 7).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Regime codes per device in :class:`PowerNoiseSolution`.
REGIME_CHANNEL = "channel"  # a = 0, privacy met by channel noise alone
REGIME_ARTIFICIAL = "artificial"  # a > 0, artificial noise needed
REGIME_POWER = "power-capped"  # b at the power limit


@dataclass(frozen=True)
class PowerNoiseSolution:
    """Optimal (a, b) of (32) or, if infeasible, the max-effort point.

    Attributes
    ----------
    a, b
        ``alpha^2 sigma^2`` and ``alpha^2``, shape ``(N,)``.
    lam
        Multiplier of the convergence constraint (``inf`` at the max-effort point).
    feasible
        Whether ``sum_i g_i <= budget`` is reachable at all.
    conv_sum
        ``sum_i (theta_qs a_i + n_i) / b_i`` at the returned point.
    objective
        ``sum_i Z^2 b_i + d a_i``.
    regimes
        One of ``channel``, ``artificial``, ``power-capped`` per device.
    """

    a: np.ndarray
    b: np.ndarray
    lam: float
    feasible: bool
    conv_sum: float
    objective: float
    regimes: tuple[str, ...]


class _Terms:
    """Per-device constants of one instance (vectorised over devices)."""

    def __init__(
        self, n_eff: np.ndarray, trusted: float, theta_qs: float, z: float, d: int,
        c3: np.ndarray, c4: float,
    ) -> None:
        self.n = np.asarray(n_eff, dtype=np.float64)
        self.t = float(trusted)
        self.tq = float(theta_qs)
        self.z2 = float(z) ** 2
        self.d = float(d)
        c3 = np.asarray(c3, dtype=np.float64)
        self.c3 = c3 if c3.shape == self.n.shape else np.broadcast_to(c3, self.n.shape)
        self.c4 = float(c4)
        #: Below this, ``a`` is a rounding artefact of ``b = b0`` (see :meth:`a_of`).
        self.a_floor = 1e-12 * self.t * self.n
        self.b0 = self.t * self.n / self.c4
        self.slope2 = 1.0 - self.tq * self.t
        self.w2 = self.z2 + self.d * self.c4
        cap_channel = self.c3 / self.z2
        bmax = np.where(
            cap_channel <= self.b0, cap_channel, (self.c3 + self.d * self.t * self.n) / self.w2
        )
        self.bmax = bmax
        self.top = bmax if self.slope2 > 0 else np.minimum(bmax, self.b0)

    def b_of(self, lam: float | np.ndarray) -> np.ndarray:
        """``b`` at multiplier ``lam``: shape ``(N,)``, or ``(M, N)`` for ``lam`` of shape
        ``(M, 1)``."""
        r1 = np.sqrt(lam * self.n / self.z2)
        if self.slope2 > 0:
            r2 = np.sqrt(lam * self.n * self.slope2 / self.w2)
            other = np.maximum(r2, self.b0)
        else:
            other = self.b0
        return np.minimum(np.where(r1 <= self.b0, r1, other), self.top)

    def a_of(self, b: np.ndarray) -> np.ndarray:
        a = self.c4 * b - self.t * self.n
        # b = b0 up to rounding means no artificial noise (a ~ 1e-19 is an artefact).
        return np.where(a > self.a_floor, a, 0.0)

    def g_of(self, b: np.ndarray, a: np.ndarray | None = None) -> np.ndarray:
        """Convergence terms at ``b`` (``a``: :meth:`a_of` ``(b)`` when already known)."""
        return (self.tq * (self.a_of(b) if a is None else a) + self.n) / b

    def breakpoints(self) -> np.ndarray:
        pts = [self.z2 * self.b0**2 / self.n]
        top_in_r1 = self.top <= self.b0
        if self.slope2 > 0:
            pts.append(self.b0**2 * self.w2 / (self.n * self.slope2))
            lam_top_r2 = self.top**2 * self.w2 / (self.n * self.slope2)
        else:
            lam_top_r2 = np.zeros_like(self.n)
        pts.append(np.where(top_in_r1, self.z2 * self.top**2 / self.n, lam_top_r2))
        allp = np.concatenate(pts)
        allp = allp[np.isfinite(allp) & (allp > 0)]
        # np.unique without its generic machinery: sort, drop repeats (the same values).
        allp.sort()
        if allp.size > 1:
            allp = allp[np.concatenate(([True], allp[1:] != allp[:-1]))]
        return allp


def solve_power_noise(
    *,
    n_eff: np.ndarray,
    trusted: float,
    theta_qs: float,
    z: float,
    d: int,
    c3: np.ndarray,
    c4: float,
    budget: float,
) -> PowerNoiseSolution:
    """Solve (32) exactly (see module docstring).

    Parameters
    ----------
    n_eff
        ``N0_i / h_i^2`` per real coordinate, shape ``(N,)``, > 0.
    trusted
        Credited fraction of the channel noise, in [0, 1].
    theta_qs
        Lemma 3 factor, >= 1.
    z, d
        Clip bound Z and model size d.
    c3
        Power caps ``Z^2 b + d a <= c3_i``, shape ``(N,)`` or scalar, > 0.
    c4
        Privacy floor on ``sigma^2 + t n_i / b_i`` (> 0).
    budget
        ``C`` of the convergence constraint ``sum_i (theta_qs a_i + n_i)/b_i <= C``.
    """
    n = np.asarray(n_eff, dtype=np.float64)
    if n.ndim != 1 or n.size == 0 or not (np.isfinite(n) & (n > 0)).all():
        raise ValueError(f"n_eff: expected a non-empty 1-d array of values > 0, got {n_eff!r}")
    if not 0.0 <= trusted <= 1.0:
        raise ValueError(f"trusted: got {trusted!r}; allowed: [0, 1]")
    if not theta_qs >= 1.0:
        raise ValueError(f"theta_qs: got {theta_qs!r}; allowed: >= 1")
    if not (c4 > 0 and np.isfinite(c4)):
        raise ValueError(f"c4: got {c4!r}; allowed: finite and > 0")
    c3 = np.asarray(c3, dtype=np.float64)
    if (c3 <= 0).any():
        raise ValueError(f"c3: got {c3!r}; allowed: > 0")
    terms = _Terms(n, trusted, theta_qs, z, d, c3, c4)
    bp = terms.breakpoints()
    lam_top = float(bp[-1]) * 2.0 if bp.size else 1.0
    b_top = terms.b_of(lam_top)
    g_top = float(terms.g_of(b_top).sum())
    if not budget > 0 or g_top > budget * (1.0 + 1e-12):
        return _solution(terms, b_top, np.inf, feasible=False)
    # Bisection over the sorted breakpoints: first index whose G is within budget (G at
    # every breakpoint in one evaluation, each row the same operations as one lam alone).
    g_at = terms.g_of(terms.b_of(bp[:, None])).sum(axis=-1)
    lo, hi = 0, bp.size - 1
    if float(g_at[hi]) > budget:
        lo = hi + 1  # only the last (unbounded) piece fits: lam > bp[-1], all clamped
    else:
        while lo < hi:
            mid = (lo + hi) // 2
            if float(g_at[mid]) <= budget:
                hi = mid
            else:
                lo = mid + 1
    left = float(bp[lo - 1]) if lo >= 1 else 0.0
    right = float(bp[lo]) if lo < bp.size else lam_top
    lam = _exact_in_piece(terms, left, right, budget)
    b = terms.b_of(lam)
    # Guard the feasible side against rounding in the last digit.
    for _ in range(60):
        if float(terms.g_of(b).sum()) <= budget * (1.0 + 1e-13):
            break
        lam = min(lam * (1.0 + 1e-10), right) if lam < right else lam * (1.0 + 1e-10)
        b = terms.b_of(lam)
    return _solution(terms, b, lam, feasible=True)


def _exact_in_piece(terms: _Terms, left: float, right: float, budget: float) -> float:
    """Solve ``G_c + S / sqrt(lam) = budget`` on the piece ``(left, right]``."""
    mid = np.sqrt(left * right) if left > 0 else right / 2.0
    r1 = np.sqrt(mid * terms.n / terms.z2)
    in_r1 = (r1 <= terms.b0) & (r1 < terms.top)
    if terms.slope2 > 0:
        r2 = np.sqrt(mid * terms.n * terms.slope2 / terms.w2)
        in_r2 = (r1 > terms.b0) & (r2 > terms.b0) & (r2 < terms.top)
    else:
        in_r2 = np.zeros_like(in_r1)
    clamped = ~(in_r1 | in_r2)
    g_mid = terms.g_of(terms.b_of(mid))
    g_c = float(g_mid[clamped].sum()) + terms.tq * terms.c4 * int(np.count_nonzero(in_r2))
    s = float(np.sqrt(terms.z2 * terms.n[in_r1]).sum())
    if terms.slope2 > 0:
        s += float(np.sqrt(terms.n[in_r2] * terms.slope2 * terms.w2).sum())
    if s <= 0 or budget <= g_c:
        return right
    lam = (s / (budget - g_c)) ** 2
    return float(min(max(lam, left), right))


def _solution(terms: _Terms, b: np.ndarray, lam: float, *, feasible: bool) -> PowerNoiseSolution:
    a = terms.a_of(b)
    g = terms.g_of(b, a)
    capped = b >= terms.bmax * (1.0 - 1e-12)
    regimes = tuple(
        REGIME_POWER if c else (REGIME_ARTIFICIAL if ai else REGIME_CHANNEL)
        for c, ai in zip(capped.tolist(), (a > 0).tolist(), strict=True)
    )
    return PowerNoiseSolution(
        a=a,
        b=b,
        lam=float(lam),
        feasible=feasible,
        conv_sum=float(g.sum()),
        objective=float((terms.z2 * b + terms.d * a).sum()),
        regimes=regimes,
    )
