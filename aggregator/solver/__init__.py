"""EE-DP-FL solver (003 Section V): a pure function from a scenario to a plan. No torch.

Entry points: :func:`plan_scheme` (one scheme), :func:`plan_all` (EE-DP-FL and its peers),
:class:`Scenario` (input), :class:`Plan` with :func:`save_plan` / :func:`load_plan` (output).
Derivations and departures from the paper: docs/solver.md.
"""

from aggregator.solver.baselines import PEER_SCHEMES, plan_all
from aggregator.solver.infeasible import InfeasibleError
from aggregator.solver.planner import SCHEMES, plan_scheme
from aggregator.solver.scenario import Scenario, ScenarioError
from testbed.core.plan_file import DevicePlan, Plan, load_plan, save_plan

__all__ = [
    "PEER_SCHEMES",
    "SCHEMES",
    "DevicePlan",
    "InfeasibleError",
    "Plan",
    "Scenario",
    "ScenarioError",
    "load_plan",
    "plan_all",
    "plan_scheme",
    "save_plan",
]
