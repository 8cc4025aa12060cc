"""Infeasible scenarios: which constraint binds, and the nearest value that would work.

A plan can fail for three reasons (see docs/solver.md):

* ``privacy``: the epsilon target cannot be met together with convergence at any K and
  compression (noise needed for privacy grows with K as fast as the rounds it costs);
* ``power``: the privacy noise drowns the signal at the allowed transmit power, so the
  channel noise after inversion breaks the convergence bound;
* ``convergence``: even without a privacy target the rounds needed exceed ``k_max``.

:func:`diagnose` tests relaxed copies of the scenario (power x 1e6, epsilon x 1e6) to name
the binding constraint, then bisects (in log scale) for the smallest epsilon, or the
smallest power scale, that is feasible with everything else unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from aggregator.solver.scenario import Scenario


@dataclass
class InfeasibleError(ValueError):
    """No plan meets every constraint for ``scheme``.

    Attributes
    ----------
    scheme
        The scheme planned.
    binding
        ``privacy`` (only a larger epsilon helps), ``power`` (only more power helps),
        ``privacy+power`` (either helps) or ``convergence`` (neither helps).
    nearest
        Nearest feasible values with the rest of the scenario unchanged, e.g.
        ``{"epsilon": 3.1}`` or ``{"p_max_scale": 12.0}`` (multiply every ``p_max_w``).
    detail
        Human-readable explanation.
    """

    scheme: str
    binding: str
    nearest: dict[str, float] = field(default_factory=dict)
    detail: str = ""

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        near = ", ".join(f"{k} >= {v:.6g}" for k, v in self.nearest.items())
        tail = f"; nearest feasible: {near}" if near else ""
        head = f"scheme '{self.scheme}' infeasible, binding constraint: {self.binding}"
        return f"{head}{tail}. {self.detail}"


def _bisect_log(
    feasible: Callable[[float], bool], lo: float, hi: float, steps: int = 14
) -> float:
    """Smallest x in [lo, hi] (log scale) with ``feasible(x)``; ``feasible(hi)`` must hold."""
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


def diagnose(
    scenario: Scenario, scheme: str, is_feasible: Callable[[Scenario], bool]
) -> InfeasibleError:
    """Name the binding constraint of an infeasible scenario and the nearest feasible value.

    ``is_feasible(scenario)`` must say whether ``scheme`` has a feasible plan.
    """
    big = 1e6
    eps_ok = is_feasible(scenario.replace(epsilon=scenario.epsilon * big))
    pw_ok = is_feasible(
        scenario.replace(p_max_w=tuple(p * big for p in scenario.p_max_w))
    )
    if eps_ok:
        eps_min = _bisect_log(
            lambda e: is_feasible(scenario.replace(epsilon=e)),
            scenario.epsilon, scenario.epsilon * big,
        )
        nearest = {"epsilon": eps_min}
        detail = (
            f"epsilon {scenario.epsilon:g} (delta {scenario.delta:g}) is below the smallest "
            f"epsilon reachable with these P_max, N0 and convergence constants (~{eps_min:.4g})."
        )
        if pw_ok:
            scale = _bisect_log(
                lambda s: is_feasible(
                    scenario.replace(p_max_w=tuple(p * s for p in scenario.p_max_w))
                ),
                1.0, big,
            )
            nearest["p_max_scale"] = scale
            detail += f" Alternatively raise every P_max by a factor ~{scale:.4g}."
            binding = "privacy+power"
        else:
            binding = "privacy"
        return InfeasibleError(scheme, binding, nearest, detail)
    if pw_ok:
        scale = _bisect_log(
            lambda s: is_feasible(
                scenario.replace(p_max_w=tuple(p * s for p in scenario.p_max_w))
            ),
            1.0, big,
        )
        return InfeasibleError(
            scheme, "power", {"p_max_scale": scale},
            f"the artificial noise needed for epsilon {scenario.epsilon:g} leaves too little "
            f"signal power at P_max; every P_max must grow by ~{scale:.4g}x.",
        )
    return InfeasibleError(
        scheme, "convergence", {},
        f"no K <= k_max = {scenario.k_max} meets the convergence bound (25) even with "
        "relaxed privacy and power; check beta1, beta2 and k_max.",
    )
