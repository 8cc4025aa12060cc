"""EE-DP-FL solver (003 Section V): a pure function from a scenario to a plan. No torch.

Entry points: :func:`aggregator.solver.planner.plan_scheme` (one scheme),
:func:`aggregator.solver.baselines.plan_all` (EE-DP-FL and its peers),
:class:`aggregator.solver.scenario.Scenario` (input), :class:`testbed.core.config.plan_file.Plan`
with :func:`~testbed.core.config.plan_file.save_plan` /
:func:`~testbed.core.config.plan_file.load_plan`
(output). Derivations and departures from the paper: docs/solver.md.

Nothing is imported here: a run that only reads its loss curve
(:mod:`aggregator.solver.calibration`) does not pay for cvxpy (0.6 s a process).
"""
