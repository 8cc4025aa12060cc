"""The peer schemes of 003 Section VI-A planned under the same targets and energy model.

==============  ==========================  =========================================
scheme          compression                 privacy noise
==============  ==========================  =========================================
ee-dp-fl        sparsify + quantize (qs)    channel noise (trusted fraction) + artificial
s-dp-fl         sparsify only (s)           artificial only (no channel credit)
ldp-fedavg      none                        artificial only (no channel credit)
channel-dp      none                        channel noise (trusted fraction) + artificial
==============  ==========================  =========================================

Each is solved by the same Algorithm 2 code with its family's ``kappa/d`` and ``theta_qs``
(:mod:`compression_terms`); for ``none`` the GP has K as its only variable.
"""

from __future__ import annotations

from aggregator.solver.infeasible import InfeasibleError
from aggregator.solver.planner import SCHEMES, plan_scheme
from aggregator.solver.scenario import Scenario
from testbed.core.config.plan_file import Plan

PEER_SCHEMES: tuple[str, ...] = ("ldp-fedavg", "s-dp-fl", "channel-dp")


def plan_all(
    scenario: Scenario, schemes: tuple[str, ...] = ("ee-dp-fl", *PEER_SCHEMES),
    *, use_accountant: bool = True,
) -> dict[str, Plan | InfeasibleError]:
    """Plan every scheme; an infeasible one maps to its :class:`InfeasibleError`."""
    out: dict[str, Plan | InfeasibleError] = {}
    for scheme in schemes:
        if scheme not in SCHEMES:
            raise ValueError(f"schemes: got {scheme!r}; allowed: {sorted(SCHEMES)}")
        try:
            out[scheme] = plan_scheme(scenario, scheme, use_accountant=use_accountant)
        except InfeasibleError as exc:
            out[scheme] = exc
    return out
