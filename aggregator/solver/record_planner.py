"""Record-level plans: Algorithm 2's search under the accounting the run enforces.

``plan_record_scheme(scenario, scheme, terms)`` searches the compression (theta_s, and Q for
the quantized family), the uploads K and the per-device (alpha_i, sigma_i) of
:class:`~aggregator.solver.record_problem.RecordProblem`, rounds to integers, and then
checks the integer plan the way the run will: every device's epsilon after K rounds is
composed by the run's own
:class:`~testbed.core.privacy.accountants.record_accountant.RecordAccountant`
from the :class:`~testbed.core.privacy.record_events.RecordEvent` the run will record at the
plan's values; a plan whose epsilon exceeds the target is refused
(:class:`PlanRefused`), never emitted.

Departures from Algorithm 2 (docs/solver.md section 12): the GP step is not used, because
its privacy constraint is linear in K (the paper accounting) while ``s_min(K)^2`` comes from
a numerical calibration; the search is the start grid, the compass search over the
compression with the best K at each point (32 solved exactly), the K polish and the rounding
with repair, all already part of :mod:`aggregator.solver.algorithm`.

Scheme options under the record unit:

==============  =============================================  =========================
scheme          family                                         channel credited
==============  =============================================  =========================
ee-dp-fl        sparsify (s) with credit, or sparsify +        trusted fraction / none
                quantize (qs) without: the cheaper feasible
ldp-fedavg      none                                           none
s-dp-fl         s                                              none
channel-dp      none                                           trusted fraction
==============  =============================================  =========================

A quantizer between the noise and the channel forfeits the credit (docs/privacy.md 10.2).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aggregator.outcome import noiseless_devices, noiseless_plan_note
from aggregator.solver import algorithm as alg
from aggregator.solver.compression_terms import DECODED_NOISE_MODEL, theta_qs
from aggregator.solver.energy import comm_energy_per_upload, power_symbol
from aggregator.solver.infeasible import InfeasibleError
from aggregator.solver.record_problem import (
    RECORD_MARGIN,
    NoiseFloor,
    RecordProblem,
    RecordTerms,
    required_uploads,
)
from aggregator.solver.scenario import Scenario
from testbed.core.config.plan_file import DevicePlan, Plan, RecordPlanInfo, SolverInfo

#: scheme -> candidate (family, credits channel) options
RECORD_SCHEMES: dict[str, tuple[tuple[str, bool], ...]] = {
    "ee-dp-fl": (("s", True), ("qs", False)),
    "s-dp-fl": (("s", False),),
    "ldp-fedavg": (("none", False),),
    "channel-dp": (("none", True),),
}


class PlanRefused(ValueError):
    """The integer plan would be refused by the run (its enforced epsilon exceeds the target)."""


def default_calibrator(
    terms: RecordTerms, epsilon: float, delta: float
) -> Callable[[float, int], float]:
    """``(q, K) -> z_min``: dp-accounting calibration to ``RECORD_MARGIN * epsilon``."""
    from testbed.core.privacy.accountants.record_planning import calibrate_noise_multiplier

    def calibrate(q: float, k: int) -> float:
        return calibrate_noise_multiplier(
            q=q, steps=k, target_epsilon=epsilon * RECORD_MARGIN, delta=delta,
            accountant=terms.accountant, relation=terms.relation,
        )

    return calibrate


@dataclass(frozen=True)
class RecordCheck:
    """The run's own accounting of an integer plan, per device (arrays of shape ``(N,)``)."""

    epsilon: np.ndarray
    epsilon_no_channel: np.ndarray
    epsilon_device_level: np.ndarray
    noise_multiplier: np.ndarray


def account_plan(
    *, scenario: Scenario, terms: RecordTerms, dataset_sizes: tuple[int, ...], k_uploads: int,
    l_value: int, credited: float, alpha: np.ndarray, sigma: np.ndarray,
) -> RecordCheck:
    """Compose ``k_uploads`` of the run's events per device with the run's accountant.

    Devices with identical events share one composition. ``credited`` is the trusted
    fraction the run will credit (0 for a scheme without credit or with a quantizer).
    """
    from testbed.core.privacy.accountants.record_accountant import RecordAccountant
    from testbed.core.privacy.analysis.record_device_level import device_level_epsilon
    from testbed.core.privacy.record_events import RecordEvent

    s = scenario
    cache: dict[tuple[float, ...], tuple[float, float, float, float]] = {}
    out = np.zeros((4, s.n_devices))
    for i in range(s.n_devices):
        key = (terms.sampling_rates[i], float(sigma[i]), float(alpha[i]), s.h[i], s.n0[i],
               float(dataset_sizes[i]))
        if key not in cache:
            acc = RecordAccountant(terms.accountant, s.delta, relation=terms.relation)
            events = []
            for r in range(k_uploads):
                ev = RecordEvent(
                    round=r, device=0, steps=1, sampling_rate=terms.sampling_rates[i],
                    amplified=terms.amplified, example_clip=terms.example_clip,
                    expected_batch=terms.expected_batch, dataset_size=int(dataset_sizes[i]),
                    sigma=float(sigma[i]), alpha=float(alpha[i]) if credited > 0 else 0.0,
                    gain=float(s.h[i]) if credited > 0 else 0.0,
                    n0=float(s.n0[i]) if credited > 0 else 0.0,
                    trusted_channel_noise=float(credited), d=s.d, l=l_value,
                    relation=terms.relation,
                )
                acc.add(ev)
                events.append(ev)
            cache[key] = (
                float(acc.epsilon(0).epsilon),
                float(acc.epsilon_without_channel(0).epsilon),
                float(device_level_epsilon(events, s.delta)),
                float(events[0].effective_noise_multiplier),
            )
        out[:, i] = cache[key]
    return RecordCheck(out[0], out[1], out[2], out[3])


def _solve(prob: RecordProblem) -> alg.IntegerPoint | None:
    from aggregator.solver.planner import fine_start

    start = alg.initial_point(prob) or fine_start(prob, n_q=6, n_s=10)
    if start is None:
        return None
    p2 = alg.compression_search(prob, start)
    p3 = alg.polish(prob, p2)
    return alg.round_point(prob, p3)


def plan_record_scheme(
    scenario: Scenario, scheme: str, terms: RecordTerms, dataset_sizes: tuple[int, ...], *,
    calibrate: Callable[[float, int], float] | None = None,
    floor: NoiseFloor | None = None,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Plan ``scheme`` for record-level privacy; the plan's epsilon is the run's accounting.

    Parameters
    ----------
    scenario
        Devices, channel, power, energy, targets; ``clip_bound`` must equal
        ``terms.norm_bound`` and ``local_steps`` must be 1 (FedSGD).
    scheme
        One of :data:`RECORD_SCHEMES`.
    terms
        Sampling and accountant of the run.
    dataset_sizes
        ``D_i`` per device.
    calibrate
        ``(q, K) -> z_min`` (default: dp-accounting, :func:`default_calibrator`).
    floor
        A :class:`NoiseFloor` to share between schemes (its exact values are cached).
    progress
        Called with one-line progress messages.

    Raises
    ------
    InfeasibleError
        No feasible plan (binding constraint named).
    PlanRefused
        The rounded plan's epsilon in the run's accounting exceeds the target.
    """
    if scheme not in RECORD_SCHEMES:
        raise ValueError(f"scheme: got {scheme!r}; allowed: {sorted(RECORD_SCHEMES)}")
    s = scenario
    if s.local_steps != 1:
        raise ValueError(f"local_steps: got {s.local_steps}; record-level plans are FedSGD (1)")
    if not math.isclose(s.clip_bound, terms.norm_bound, rel_tol=1e-12):
        raise ValueError(f"clip_bound: got {s.clip_bound}; must be C sqrt(1 + 1/B) = "
                         f"{terms.norm_bound}")
    if len(terms.sampling_rates) != s.n_devices or len(dataset_sizes) != s.n_devices:
        raise ValueError("terms.sampling_rates and dataset_sizes need one value per device")
    t0 = time.perf_counter()
    if floor is None:
        calibrate = calibrate or default_calibrator(terms, s.epsilon, s.delta)
        floor = NoiseFloor(terms, calibrate, min(s.k_max, 100_000), progress=progress)
    best: tuple[alg.IntegerPoint, str, float] | None = None
    for family, credit in RECORD_SCHEMES[scheme]:
        trusted = s.trusted if credit else 0.0
        if progress is not None:
            progress(f"{scheme}: searching family {family!r} "
                     f"({'channel credited' if credit else 'no channel credit'})")
        prob = RecordProblem(s, family, trusted, floor=floor)
        ip = _solve(prob)
        if ip is not None and (best is None or ip.point.energy_j < best[0].point.energy_j):
            best = (ip, family, trusted)
    if best is None:
        raise InfeasibleError(
            scheme, "privacy", {},
            "no feasible record-level plan: the privacy noise the target needs "
            f"(epsilon {s.epsilon:g}, delta {s.delta:g}) slows convergence more than more "
            f"rounds make up for under beta1 = {s.beta1:g}, beta2 = {s.beta2:g} (or the "
            "power limit cannot carry it); raise epsilon, k_max or the power limit",
        )
    ip, family, trusted = best
    return build_record_plan(s, scheme, family, trusted, ip, terms, dataset_sizes, floor,
                             seconds=time.perf_counter() - t0)


def build_record_plan(
    s: Scenario, scheme: str, family: str, trusted: float, ip: alg.IntegerPoint,
    terms: RecordTerms, dataset_sizes: tuple[int, ...], floor: NoiseFloor, *, seconds: float,
) -> Plan:
    """Assemble and check a record-level integer plan (refused if the run would refuse it)."""
    k, lv, qv = ip.k_uploads, ip.l_value, ip.q_levels
    pt = ip.point
    alpha = np.sqrt(pt.pn.b)
    sigma = np.sqrt(pt.pn.a / pt.pn.b)
    tq = math.sqrt(s.d) / qv if qv is not None else 0.0
    ts = lv / s.d
    tqs = theta_qs(family, tq, ts)
    p_w = s.tx_power_ref_w * power_symbol(pt.pn.a, pt.pn.b, theta_qs=tqs, theta_s=ts, d=s.d,
                                          z=s.clip_bound)
    if np.any(p_w > np.asarray(s.p_max_w) * (1 + 1e-9)):
        raise PlanRefused(f"{scheme}: internal error: the rounded plan exceeds a power limit")
    e_comm = comm_energy_per_upload(pt.pn.a, pt.pn.b, theta_qs=tqs, d=s.d, z=s.clip_bound,
                                    t_cm_s=s.t_cm_s, tx_power_ref_w=s.tx_power_ref_w)
    check = account_plan(scenario=s, terms=terms, dataset_sizes=dataset_sizes, k_uploads=k,
                         l_value=lv, credited=trusted, alpha=alpha, sigma=sigma)
    over = [i for i in range(s.n_devices) if check.epsilon[i] > s.epsilon]
    if over:
        raise PlanRefused(
            f"{scheme}: the plan's epsilon in the run's accounting ({terms.accountant}) is "
            f"{float(np.max(check.epsilon)):.6g} > target {s.epsilon:g} for devices {over}; "
            "the run would stop them, so no plan is written"
        )
    chan = np.asarray(s.n0) / (np.asarray(s.h) * alpha) ** 2
    needed = required_uploads(beta1=s.beta1, beta2=s.beta2, family=family, theta_q=tq,
                              theta_s=ts, d=s.d, sigma=sigma, chan=chan)
    notes = [
        f"record-level plan: epsilon per device in the run's accounting ({terms.accountant}, "
        f"{terms.relation}, {'secret' if terms.amplified else 'public'} Poisson sampling), "
        "computed by composing the run's own events at the plan's values",
        f"convergence model {DECODED_NOISE_MODEL}: K >= beta1 theta_qs + beta2 mean_i "
        "(theta_qs d sigma_i^2 + l n0_i / (h_i alpha_i)^2)",
    ]
    if scheme == "ee-dp-fl":
        notes.append(
            "family 's' (no quantizer: the channel noise is credited)" if family == "s" else
            "family 'qs' (quantized: no channel noise credited, privacy from sigma alone)"
        )
    if trusted > 0:
        notes.append(
            f"with no channel credit (an eavesdropper with a better channel) epsilon would be "
            f"up to {float(np.max(check.epsilon_no_channel)):.4g}"
        )
    if k >= s.k_max:
        notes.append(f"K reached k_max = {s.k_max}: a boundary point")
    silent = noiseless_devices([float(x) for x in sigma])
    if silent:
        notes.append(noiseless_plan_note(silent, s.n_devices, credited=trusted, unit="record"))
    regimes = pt.pn.regimes
    devices = [
        DevicePlan.model_validate(dict(
            id=i, h=s.h[i], n0=s.n0[i], alpha=float(alpha[i]), sigma=float(sigma[i]),
            power_w=float(p_w[i]), p_max_w=s.p_max_w[i], e_comm_j=float(e_comm[i]),
            e_comp_j=s.e_comp_j[i], epsilon_paper=None, epsilon_strict=None, regime=regimes[i],
            epsilon=float(check.epsilon[i]), epsilon_no_channel=float(check.epsilon_no_channel[i]),
            epsilon_device_level=float(check.epsilon_device_level[i]),
            noise_multiplier=float(check.noise_multiplier[i]),
        ))
        for i in range(s.n_devices)
    ]
    zf = [floor.z_min(q, k) for q in terms.effective_rates]
    e_comm_total = float(k * np.sum(e_comm))
    e_comp_total = float(k * np.sum(s.e_comp_j))
    return Plan.model_validate(dict(
        unit="record", accounting=terms.accountant, scheme=scheme, family=family, T=k, K=k, H=1,
        d=s.d, l=lv, Q=qv, clip_bound=s.clip_bound, epsilon_target=s.epsilon, delta=s.delta,
        trusted=trusted, energy_j=e_comm_total + e_comp_total, energy_comm_j=e_comm_total,
        energy_comp_j=e_comp_total, tx_power_ref_w=s.tx_power_ref_w, t_cm_s=s.t_cm_s,
        beta1=s.beta1, beta2=s.beta2, required_uploads=needed, strict_exceeds_target=None,
        notes=notes, devices=devices,
        solver=SolverInfo(iterations=0, converged=True, alternation_energies=[],
                          continuous_energy_j=float(pt.energy_j), seconds=seconds),
        record=RecordPlanInfo(
            accountant=terms.accountant, relation=terms.relation, amplified=terms.amplified,
            example_clip=terms.example_clip, expected_batch=terms.expected_batch,
            dataset_sizes=list(dataset_sizes), sampling_rates=list(terms.sampling_rates),
            noise_floor_z=zf, margin=RECORD_MARGIN, convergence_model=DECODED_NOISE_MODEL,
        ),
    ))


def plan_noise_term(plan: Plan) -> float:
    """Mean decoded noise energy of a record plan (the convergence model's noise regressor)."""
    tq = math.sqrt(plan.d) / plan.Q if plan.Q is not None else 0.0
    tqs = theta_qs(plan.family, tq, plan.l / plan.d)
    return (plan.required_uploads - plan.beta1 * tqs) / plan.beta2
