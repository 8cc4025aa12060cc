"""From a scenario to a validated :class:`Plan`: the solver's public entry point.

``plan_scheme(scenario, "ee-dp-fl")`` runs Algorithm 2 (:mod:`algorithm`), rounds, checks
every constraint again on the integer plan, and reports epsilon in both accountings of
:mod:`testbed.core.privacy` (``paper`` and ``strict``) when that package is importable. The
solver's own constraint is the paper accounting; if the accountant's paper epsilon exceeds
the target (e.g. a coarser order grid), the solver tightens its internal target and solves
again. The strict epsilon is reported, never hidden: ``strict_exceeds_target`` and a note
say when it is above the target.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aggregator.outcome import noiseless_devices, noiseless_plan_note
from aggregator.solver import algorithm as alg
from aggregator.solver.compression_terms import kappa_ratio, theta_qs
from aggregator.solver.energy import comm_energy_per_upload, power_symbol
from aggregator.solver.infeasible import diagnose
from aggregator.solver.privacy_constraint import paper_epsilon
from aggregator.solver.scenario import Scenario
from testbed.core.config.plan_file import DevicePlan, Plan, SolverInfo

#: scheme -> (compression family, whether channel noise is credited)
SCHEMES: dict[str, tuple[str, bool]] = {
    "ee-dp-fl": ("qs", True),
    "s-dp-fl": ("s", False),
    "ldp-fedavg": ("none", False),
    "channel-dp": ("none", True),
}

EpsilonFn = Callable[..., Any]


def accountant_epsilon_for() -> EpsilonFn | None:
    """``testbed.core.privacy.epsilon_for`` if that package is importable, else ``None``."""
    try:
        from testbed.core.privacy import epsilon_for
    except ImportError:
        return None
    return epsilon_for


def problem_for(scenario: Scenario, scheme: str) -> alg.Problem:
    """The scenario bound to a scheme's compression family and channel credit."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: got {scheme!r}; allowed: {sorted(SCHEMES)}")
    family, credit = SCHEMES[scheme]
    return alg.Problem(scenario, family, scenario.trusted if credit else 0.0)


@dataclass(frozen=True)
class Solved:
    """Continuous and integer solutions with the trace of Algorithm 2."""

    continuous: alg.Point
    integer: alg.IntegerPoint
    trace: alg.SolveTrace
    seconds: float


def solve(prob: alg.Problem) -> Solved | None:
    """Algorithm 2 with the escape step and rounding; ``None`` if nothing is feasible."""
    t0 = time.perf_counter()
    start = alg.initial_point(prob)
    if start is None:
        start = fine_start(prob)
        if start is None:
            return None
    trace = alg.SolveTrace()
    p1 = alg.alternate(prob, start, trace=trace)
    p2 = alg.compression_search(prob, p1)
    p3 = alg.alternate(prob, p2, trace=trace) if p2 is not p1 else p2
    p4 = alg.polish(prob, p3)
    trace.polished_energy = p4.energy_j
    ip = alg.round_point(prob, p4)
    if ip is None:
        return None
    return Solved(p4, ip, trace, time.perf_counter() - t0)


def fine_start(prob: alg.Problem, *, n_q: int = 8, n_s: int = 12) -> alg.Point | None:
    """Best point of a fine compression grid (each with its best K), or ``None``."""
    (tq_lo, tq_hi), (ts_lo, ts_hi) = prob.theta_bounds()
    tqs = np.geomspace(tq_lo, tq_hi, n_q) if prob.family == "qs" else [0.0]
    tss = np.geomspace(ts_lo, ts_hi, n_s) if prob.family != "none" else [1.0]
    best = None
    for tq in tqs:
        for ts in tss:
            p = prob.best_k(float(tq), float(ts), n_grid=40)
            if p is not None and (best is None or p.energy_j < best.energy_j):
                best = p
    return best


def is_feasible(scenario: Scenario, scheme: str) -> bool:
    """Whether ``scheme`` has any feasible continuous point (coarse then fine search)."""
    prob = problem_for(scenario, scheme)
    return alg.initial_point(prob) is not None or fine_start(prob) is not None


def plan_scheme(
    scenario: Scenario, scheme: str = "ee-dp-fl", *, use_accountant: bool = True
) -> Plan:
    """Plan ``scheme`` for ``scenario``; raises :class:`InfeasibleError` when impossible."""
    epsilon_for = accountant_epsilon_for() if use_accountant else None
    scn = scenario
    for _attempt in range(4):
        solved = solve(problem_for(scn, scheme))
        if solved is None:
            raise diagnose(scenario, scheme, lambda s: is_feasible(s, scheme))
        plan = build_plan(scenario, scheme, solved, epsilon_for)
        worst = max(dev.epsilon_paper or 0.0 for dev in plan.devices)
        if worst <= scenario.epsilon:
            return plan
        # The accountant's paper epsilon is above target: tighten and solve again.
        scn = scn.replace(epsilon=scn.epsilon * (scenario.epsilon / worst) * (1 - 1e-6))
    raise RuntimeError(
        f"could not bring the accountant's paper epsilon to {scenario.epsilon} for {scheme}"
    )


def build_plan(
    scenario: Scenario, scheme: str, solved: Solved, epsilon_for: EpsilonFn | None
) -> Plan:
    """Assemble the plan of an integer solution and re-check every constraint on it."""
    family, credit = SCHEMES[scheme]
    trusted = scenario.trusted if credit else 0.0
    ip = solved.integer
    pt = ip.point
    s = scenario
    k = ip.k_uploads
    a, b = pt.pn.a, pt.pn.b
    alpha = np.sqrt(b)
    sigma = np.sqrt(a / b)
    checks = evaluate_plan_values(
        scenario=s, family=family, trusted=trusted, k_uploads=k, l_value=ip.l_value,
        q_levels=ip.q_levels, alpha=alpha, sigma=sigma,
    )
    if not checks["ok"]:
        raise RuntimeError(f"internal error: rounded plan violates {checks['violations']}")
    eps_paper = checks["epsilon_paper"]
    eps_strict: list[float | None] = [None] * s.n_devices
    notes: list[str] = []
    if epsilon_for is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(s.n_devices):
                common = dict(
                    sigma=float(sigma[i]), alpha=float(alpha[i]), h=s.h[i], n0=s.n0[i],
                    rounds=k, d=s.d, l=ip.l_value, q=ip.q_levels, clip=s.clip_bound,
                    delta=s.delta, trusted=trusted,
                )
                paper = float(epsilon_for(mode="paper", **common).epsilon)
                eps_paper[i] = max(eps_paper[i], paper)
                eps_strict[i] = float(epsilon_for(mode="strict", **common).epsilon)
        for msg in sorted({str(w.message) for w in caught}):
            notes.append(f"accountant warning: {msg}")
    else:
        notes.append("testbed.core.privacy not importable: epsilon_paper is the solver's own "
                     "closed form and epsilon_strict is not reported")
    if k >= s.k_max:
        notes.append(
            f"K reached k_max = {s.k_max}: the energy still falls with more rounds (e.g. no "
            "computing energy); the plan is a boundary point, set e_comp_j or k_max"
        )
    strict_exceeds = None
    if epsilon_for is not None:
        over = [i for i, e in enumerate(eps_strict) if e is not None and e > s.epsilon]
        strict_exceeds = bool(over)
        if over:
            worst = max(e for e in eps_strict if e is not None)
            notes.append(
                f"strict accounting exceeds the target epsilon {s.epsilon:g} for "
                f"{len(over)} of {s.n_devices} devices (worst {worst:.4g}): the paper "
                "accounting credits compression and channel noise that the strict one does not"
            )
    silent = noiseless_devices([float(x) for x in sigma])
    if silent:
        notes.append(noiseless_plan_note(silent, s.n_devices, credited=trusted, unit="device"))
    regimes = pt.pn.regimes
    devices = [
        DevicePlan.model_validate(dict(
            id=i, h=s.h[i], n0=s.n0[i], alpha=float(alpha[i]), sigma=float(sigma[i]),
            power_w=float(checks["power_w"][i]), p_max_w=s.p_max_w[i],
            e_comm_j=float(checks["e_comm_j"][i]), e_comp_j=s.e_comp_j[i],
            epsilon_paper=float(eps_paper[i]), epsilon_strict=eps_strict[i],
            regime=regimes[i], epsilon=float(eps_paper[i]),
        ))
        for i in range(s.n_devices)
    ]
    e_comm = float(k * np.sum(checks["e_comm_j"]))
    e_comp = float(k * np.sum(s.e_comp_j))
    return Plan.model_validate(dict(
        scheme=scheme, family=family, T=k * s.local_steps, K=k, H=s.local_steps, d=s.d,
        l=ip.l_value, Q=ip.q_levels, clip_bound=s.clip_bound, epsilon_target=s.epsilon,
        delta=s.delta, trusted=trusted, energy_j=e_comm + e_comp, energy_comm_j=e_comm,
        energy_comp_j=e_comp, tx_power_ref_w=s.tx_power_ref_w, t_cm_s=s.t_cm_s,
        beta1=s.beta1, beta2=s.beta2, required_uploads=float(checks["required_uploads"]),
        strict_exceeds_target=strict_exceeds, notes=notes, devices=devices,
        solver=SolverInfo(
            iterations=solved.trace.iterations, converged=solved.trace.converged,
            alternation_energies=[float(e) for e in solved.trace.energies],
            continuous_energy_j=float(solved.continuous.energy_j), seconds=solved.seconds,
        ),
    ))


def evaluate_plan_values(
    *, scenario: Scenario, family: str, trusted: float, k_uploads: int, l_value: int,
    q_levels: int | None, alpha: np.ndarray, sigma: np.ndarray, rtol: float = 1e-9,
) -> dict[str, Any]:
    """Recompute power, energy, epsilon and the convergence bound of an integer plan.

    Returns a mapping with ``power_w``, ``e_comm_j``, ``epsilon_paper`` (arrays, shape
    ``(N,)``), ``required_uploads``, ``violations`` (list of names) and ``ok``.
    """
    s = scenario
    tq = math.sqrt(s.d) / q_levels if q_levels is not None else 0.0
    ts = l_value / s.d
    tqs = theta_qs(family, tq, ts)
    kr = kappa_ratio(family, tq, ts)
    b = np.asarray(alpha) ** 2
    a = b * np.asarray(sigma) ** 2
    n_eff = s.channel_noise_eff()
    p_w = s.tx_power_ref_w * power_symbol(a, b, theta_qs=tqs, theta_s=ts, d=s.d, z=s.clip_bound)
    e_comm = comm_energy_per_upload(
        a, b, theta_qs=tqs, d=s.d, z=s.clip_bound, t_cm_s=s.t_cm_s,
        tx_power_ref_w=s.tx_power_ref_w,
    )
    eps = paper_epsilon(
        sigma2=np.asarray(sigma) ** 2, b=b, n_eff=n_eff, trusted=trusted, k_uploads=k_uploads,
        kappa_ratio=kr, z=s.clip_bound, delta=s.delta,
    )
    kappa = s.d * kr
    required = s.beta1 * tqs + s.beta2 * float(
        np.mean(kappa * (tqs * np.asarray(sigma) ** 2 + n_eff / b))
    )
    violations = []
    if np.any(p_w > np.asarray(s.p_max_w) * (1 + rtol)):
        violations.append("power")
    if np.any(eps > s.epsilon * (1 + rtol)):
        violations.append("privacy")
    if required > k_uploads * (1 + rtol):
        violations.append("convergence")
    return {
        "power_w": p_w, "e_comm_j": e_comm, "epsilon_paper": eps,
        "required_uploads": required, "violations": violations, "ok": not violations,
    }
