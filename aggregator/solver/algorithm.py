"""Algorithm 2 of 003: alternate the GP (29) and the closed form (32), then round.

Each iteration solves (29) for (K, theta_q, theta_s) with (alpha, sigma) fixed
(:mod:`aggregator.solver.gp`, cvxpy DGP) and then (32) for (alpha, sigma) with
(K, theta_q, theta_s) fixed (:mod:`aggregator.solver.power_noise`, exact). Both steps keep
the previous point feasible, so the energy (24a) never increases; the loop stops when the
relative change is below ``tol`` (1e-6). Departures from the printed algorithm, each
explained in docs/solver.md:

* the start is the best of a few compression settings, each with its best K (a GP needs a
  feasible (alpha, sigma) to start from);
* the alternation usually stalls where it starts (with (alpha, sigma) frozen, privacy caps
  K and convergence floors it), so :func:`compression_search` (a compass search over
  (log theta_q, log theta_s) of the best-K energy) escapes, and the alternation runs again;
* after the loop, K is re-optimised by a 1-D search with (32) solved exactly at each K
  ("polish"); both can only lower the energy;
* rounding (step 9): the printed ``floor`` may break convergence or privacy, so l and Q try
  floor and ceiling, K is searched over integers, (32) is re-solved for every candidate,
  and the best feasible one is kept ("repair").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize_scalar

from aggregator.solver.compression_terms import kappa_ratio, theta_qs
from aggregator.solver.energy import comm_energy_per_upload, power_cap_c3, total_energy
from aggregator.solver.gp import GPError, GPInputs, solve_gp
from aggregator.solver.power_noise import PowerNoiseSolution, solve_power_noise
from aggregator.solver.privacy_constraint import c4, rdp_budget
from aggregator.solver.scenario import Scenario

#: Relative margin taken off the epsilon target inside the solver, so a plan that meets the
#: constraint with equality still meets it after floating-point re-evaluation.
EPS_MARGIN = 1e-6

#: Finite stand-in for "infeasible" in the scalar searches (inf breaks their arithmetic).
_PENALTY = 1e100


@dataclass(frozen=True)
class Point:
    """A feasible point: uploads, compression, and the (32) solution at it."""

    k_uploads: float
    theta_q: float
    theta_s: float
    pn: PowerNoiseSolution
    energy_j: float


@dataclass(frozen=True)
class Problem:
    """A scenario bound to one compression family and one trusted fraction."""

    scenario: Scenario
    family: str
    trusted: float

    @property
    def b_max(self) -> float:
        return rdp_budget(self.scenario.epsilon * (1.0 - EPS_MARGIN), self.scenario.delta)

    def evaluate(self, k: float, theta_q: float, theta_s: float) -> Point | None:
        """Solve (32) at (K, theta_q, theta_s); ``None`` when no (alpha, sigma) is feasible."""
        s = self.scenario
        (tq_lo, tq_hi), (ts_lo, ts_hi) = self.theta_bounds()
        if self.family == "qs":
            theta_q = min(max(theta_q, tq_lo), tq_hi)
        theta_s = min(max(theta_s, ts_lo), ts_hi)
        tqs = max(1.0, theta_qs(self.family, theta_q, theta_s))
        terms = self.constraint_terms(k, theta_q, theta_s, tqs)
        if terms is None:
            return None
        noise_ratio, noise_theta, trusted, floor = terms
        budget = s.n_devices * (k - s.beta1 * tqs) / (s.beta2 * s.d * noise_ratio)
        if not budget > 0 or k > s.k_max * (1 + 1e-12):
            return None
        c3 = power_cap_c3(s.p_max_symbol(), theta_qs=tqs, theta_s=theta_s, d=s.d)
        pn = solve_power_noise(
            n_eff=s.channel_noise_eff(), trusted=trusted, theta_qs=noise_theta,
            z=s.clip_bound, d=s.d, c3=c3, c4=floor(), budget=budget,
        )
        if not pn.feasible:
            return None
        e_comm = comm_energy_per_upload(
            pn.a, pn.b, theta_qs=tqs, d=s.d, z=s.clip_bound, t_cm_s=s.t_cm_s,
            tx_power_ref_w=s.tx_power_ref_w,
        )
        energy = total_energy(k, e_comm, np.asarray(s.e_comp_j))
        return Point(k, theta_q, theta_s, pn, energy)

    def constraint_terms(
        self, k: float, theta_q: float, theta_s: float, tqs: float
    ) -> tuple[float, float, float, Callable[[], float]] | None:
        """What (32) needs beyond the compression: ``(r, theta'', t, c4)``.

        The convergence budget is ``N (K - beta1 theta_qs) / (beta2 d r)``, ``theta''``
        multiplies the artificial noise in it, ``t`` is the trusted fraction in the privacy
        constraint and ``c4()`` its floor. Here, the paper form: ``r = kappa/d``,
        ``theta'' = theta_qs``, the scheme's ``t`` and the linear ``c4`` of (32d) corrected.
        ``None``: no point at this K.
        """
        kr = kappa_ratio(self.family, theta_q, theta_s)
        return kr, tqs, self.trusted, lambda: c4(k, kr, self.scenario.clip_bound, self.b_max)

    def k_floor(self, theta_q: float, theta_s: float) -> float:
        """Smallest K with a positive convergence budget (``K > beta1 theta_qs``), >= 1."""
        return max(1.0, self.scenario.beta1 * theta_qs(self.family, theta_q, theta_s))

    def best_k(self, theta_q: float, theta_s: float, n_grid: int = 12) -> Point | None:
        """Best continuous K for fixed compression: log grid, then bounded Brent."""
        k_lo = self.k_floor(theta_q, theta_s) * (1 + 1e-9)
        k_hi = float(self.scenario.k_max)
        if k_lo >= k_hi:
            return None
        grid = np.geomspace(k_lo, k_hi, n_grid)
        pts = [self.evaluate(float(k), theta_q, theta_s) for k in grid]
        energies = np.array([p.energy_j if p else np.inf for p in pts])
        if not np.isfinite(energies).any():
            return None
        j = int(np.argmin(energies))
        lo = math.log(grid[max(j - 1, 0)])
        hi = math.log(grid[min(j + 1, n_grid - 1)])
        best = pts[j]

        def f(logk: float) -> float:
            p = self.evaluate(math.exp(logk), theta_q, theta_s)
            return p.energy_j if p else _PENALTY

        if hi > lo:
            res = minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                  options={"xatol": 1e-8})
            cand = self.evaluate(math.exp(float(res.x)), theta_q, theta_s)
            if cand is not None and best is not None and cand.energy_j < best.energy_j:
                best = cand
        return best

    def theta_bounds(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """((theta_q_min, theta_q_max), (theta_s_min, theta_s_max))."""
        s = self.scenario
        rd = math.sqrt(s.d)
        return (rd / s.q_max, rd / s.q_min), (s.l_min / s.d, 1.0)


@dataclass
class SolveTrace:
    """What Algorithm 2 did: energies per iteration (raw, before any safeguard)."""

    energies: list[float] = field(default_factory=list)
    gp_energies: list[float] = field(default_factory=list)
    iterations: int = 0
    converged: bool = False
    polished_energy: float = math.nan


def initial_point(prob: Problem) -> Point | None:
    """Best of a small grid of compression settings, each with its best K."""
    (tq_lo, tq_hi), (ts_lo, ts_hi) = prob.theta_bounds()
    if prob.family == "qs":
        cands = [(tq, ts) for tq in np.geomspace(tq_lo, tq_hi, 3)
                 for ts in np.geomspace(ts_lo, ts_hi, 4)]
    elif prob.family == "s":
        cands = [(0.0, ts) for ts in np.geomspace(ts_lo, ts_hi, 6)]
    else:
        cands = [(0.0, 1.0)]
    best: Point | None = None
    for tq, ts in cands:
        p = prob.best_k(float(tq), float(ts), n_grid=24)
        if p is not None and (best is None or p.energy_j < best.energy_j):
            best = p
    return best


def gp_inputs(prob: Problem, pt: Point) -> GPInputs:
    """Coefficients of (29) at the current (alpha, sigma)."""
    s = prob.scenario
    a, b = pt.pn.a, pt.pn.b
    n = s.channel_noise_eff()
    sigma2 = a / b
    per_dev = s.clip_bound**2 * b + s.d * a
    worst_noise = float(np.min(sigma2 + prob.trusted * n / b))
    (tq_lo, tq_hi), (ts_lo, _) = prob.theta_bounds()
    return GPInputs(
        p_comm=s.tx_power_ref_w * s.t_cm_s * float(np.sum(per_dev)),
        e_comp=float(np.sum(s.e_comp_j)),
        beta1=s.beta1,
        beta2_d=s.beta2 * s.d,
        sigma2_mean=float(np.mean(sigma2)),
        chan_mean=float(np.mean(n / b)),
        power_ratio=float(np.max(per_dev / s.p_max_symbol())),
        privacy_coef=2 * s.clip_bound**2 / (prob.b_max * worst_noise),
        d=s.d,
        theta_s_min=ts_lo,
        theta_q_min=tq_lo,
        theta_q_max=tq_hi,
        k_min=1.0,
        k_max=float(s.k_max),
    )


def alternate(prob: Problem, start: Point, *, tol: float = 1e-6, max_iter: int = 100,
              trace: SolveTrace | None = None) -> Point:
    """Algorithm 2 steps 3-8 from a feasible start; returns the last accepted point."""
    trace = trace if trace is not None else SolveTrace()
    cur = start
    trace.energies.append(cur.energy_j)
    for it in range(max_iter):
        trace.iterations = it + 1
        try:
            gp = solve_gp(prob.family, gp_inputs(prob, cur))
        except GPError:
            break
        trace.gp_energies.append(gp.objective)
        nxt = prob.evaluate(gp.k_uploads, gp.theta_q, gp.theta_s)
        if nxt is None:
            # The GP's tolerance put K just outside the feasible set of (32): take the best K
            # for the GP's compression instead.
            nxt = prob.best_k(gp.theta_q, gp.theta_s)
            if nxt is None:
                break
        trace.energies.append(nxt.energy_j)
        change = (cur.energy_j - nxt.energy_j) / cur.energy_j
        if nxt.energy_j <= cur.energy_j:
            cur = nxt
        if abs(change) < tol:
            trace.converged = True
            break
    return cur


def polish(prob: Problem, pt: Point) -> Point:
    """Re-optimise K alone at the converged compression (never worse than ``pt``)."""
    best = prob.best_k(pt.theta_q, pt.theta_s)
    return best if best is not None and best.energy_j < pt.energy_j else pt


def compression_search(prob: Problem, pt: Point, *, max_evals: int = 200) -> Point:
    """Escape a stalled alternation: minimise the best-K energy over log compression.

    With (alpha, sigma) fixed the GP is often already optimal at the current point (privacy
    caps K, convergence floors it), so the alternation stops where it started. Here the
    energy of the best K at each compression, with (32) solved exactly, is minimised over
    ``(log theta_q, log theta_s)`` by a compass search from ``pt``; never worse than ``pt``.
    """
    if prob.family == "none":
        return polish(prob, pt)
    (tq_lo, tq_hi), (ts_lo, ts_hi) = prob.theta_bounds()
    cache: dict[tuple[float, ...], Point | None] = {}

    def unpack(x: np.ndarray) -> tuple[float, float]:
        if prob.family == "qs":
            return float(math.exp(x[0])), float(math.exp(x[1]))
        return 0.0, float(math.exp(x[0]))

    def f(x: np.ndarray) -> float:
        key = tuple(np.round(x, 12))
        if key not in cache:
            tq, ts = unpack(x)
            cache[key] = prob.best_k(tq, ts)
        p = cache[key]
        return p.energy_j if p is not None else _PENALTY

    if prob.family == "qs":
        x0 = np.log([pt.theta_q, pt.theta_s])
        bounds = [(math.log(tq_lo), math.log(tq_hi)), (math.log(ts_lo), math.log(ts_hi))]
    else:
        x0 = np.log([pt.theta_s])
        bounds = [(math.log(ts_lo), math.log(ts_hi))]
    x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
    x = _compass(f, x0, bounds, max_evals=max_evals)
    best = cache.get(tuple(np.round(x, 12)))
    for p in cache.values():
        if p is not None and (best is None or p.energy_j < best.energy_j):
            best = p
    return best if best is not None and best.energy_j < pt.energy_j else pt


def _compass(
    f: Callable[[np.ndarray], float], x0: np.ndarray, bounds: list[tuple[float, float]],
    *, max_evals: int, min_step: float = 1e-4,
) -> np.ndarray:
    """Compass (pattern) search in a box: robust to kinks and infeasible (penalised) areas."""
    x = x0.copy()
    fx = f(x)
    steps = np.array([0.25 * (hi - lo) if hi > lo else 0.0 for lo, hi in bounds])
    lo = np.array([b[0] for b in bounds])
    hi = np.array([b[1] for b in bounds])
    evals = 1
    while evals < max_evals and np.any(steps > min_step):
        moved = False
        for i in range(x.size):
            for sign in (1.0, -1.0):
                if steps[i] <= min_step:
                    continue
                y = x.copy()
                y[i] = min(max(x[i] + sign * steps[i], lo[i]), hi[i])
                if y[i] == x[i]:
                    continue
                fy = f(y)
                evals += 1
                if fy < fx:
                    x, fx, moved = y, fy, True
                    break
        if not moved:
            steps = steps / 2.0
    return x


@dataclass(frozen=True)
class IntegerPoint:
    """A rounded plan: integer K, l and Q with (32) re-solved there."""

    k_uploads: int
    l_value: int
    q_levels: int | None
    point: Point


def integer_candidates(prob: Problem, pt: Point) -> list[tuple[int, int | None]]:
    """(l, Q) pairs around the continuous optimum (floor and ceiling, clipped)."""
    s = prob.scenario
    lc = pt.theta_s * s.d
    ls = sorted({min(s.d, max(s.l_min, v)) for v in (math.floor(lc), math.ceil(lc))})
    if prob.family == "qs":
        qc = math.sqrt(s.d) / pt.theta_q
        qs = sorted({min(s.q_max, max(s.q_min, v)) for v in (math.floor(qc), math.ceil(qc))})
        return [(lv, qv) for lv in ls for qv in qs]
    if prob.family == "s":
        return [(lv, None) for lv in ls]
    return [(s.d, None)]


def best_integer_k(prob: Problem, l_value: int, q_levels: int | None) -> IntegerPoint | None:
    """Best integer K for integer (l, Q); searches outward when the neighbours fail."""
    s = prob.scenario
    ts = l_value / s.d
    tq = math.sqrt(s.d) / q_levels if q_levels is not None else 0.0
    cont = prob.best_k(tq, ts)
    if cont is None:
        return None
    k0 = cont.k_uploads
    best: Point | None = None
    tried: set[int] = set()
    span = 2
    while span <= 4096:
        for k in range(max(1, math.floor(k0) - span), math.ceil(k0) + span + 1):
            if k in tried or k > s.k_max:
                continue
            tried.add(k)
            p = prob.evaluate(float(k), tq, ts)
            if p is not None and (best is None or p.energy_j < best.energy_j):
                best = p
        if best is not None:
            break
        span *= 4
    if best is None:
        return None
    return IntegerPoint(int(round(best.k_uploads)), l_value, q_levels, best)


def round_point(prob: Problem, pt: Point) -> IntegerPoint | None:
    """Step 9 with repair: best feasible integer (K, l, Q) near the continuous point."""
    best: IntegerPoint | None = None
    for lv, qv in integer_candidates(prob, pt):
        ip = best_integer_k(prob, lv, qv)
        if ip is not None and (best is None or ip.point.energy_j < best.point.energy_j):
            best = ip
    return best
