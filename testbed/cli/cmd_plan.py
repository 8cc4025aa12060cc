"""``testbed plan``: EE-DP-FL energy-minimising plan and the peer schemes under one target.

Solves 003 Section V (Algorithm 2, corrected; docs/solver.md) for the experiment's devices,
prints per device alpha, sigma, power, energy and epsilon in both accountings, the chosen
T, l, Q and the total energy, and the same for ldp-fedavg, s-dp-fl and channel-dp.
``--out`` writes the plan that ``testbed run`` (``scheme: ee-dp-fl``, ``plan: PATH``) reads.
Record-level plans (the default unit) need the convergence constants of a calibration:
``--calibration FILE`` (for ``testbed/config/private-fedsgd.yaml`` the shipped
:data:`SHIPPED_CALIBRATION`) or the scenario key ``solver.calibration``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from testbed.cli.model_size import count_params
from testbed.cli.overrides import UniqueOverrides
from testbed.cli.plan_aircomp import plan_aircomp_command
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.config.paths import check_output_file

#: The calibration shipped for ``testbed/config/private-fedsgd.yaml`` (``testbed calibrate``
#: output, its pilots' curves included), as the README names it from the repository root.
SHIPPED_CALIBRATION = "testbed/config/calibration/private-fedsgd.yaml"


def register(sub: Any) -> None:
    """Add the ``plan`` subcommand."""
    p = sub.add_parser(
        "plan",
        help="energy-minimising EE-DP-FL plan (T, l, Q, alpha_i, sigma_i) and peer schemes",
        description=(
            "Plan EE-DP-FL (003 Section V, Algorithm 2 with the corrections of docs/solver.md) "
            "for an experiment config: uploads K (T = K H), sparsity l, quantization levels Q, "
            "per-device power scaling alpha_i and artificial noise sigma_i minimising the "
            "devices' total energy under the epsilon target in the accounting the run enforces "
            "(record unit, the default: the run's dp-accounting accountant, FedSGD with upload "
            "noise; device unit: the paper accounting, only with privacy.accounting=paper), "
            "the power limit and the fitted convergence bound. A plan whose epsilon the run "
            "would find above the target is refused (exit 3). Also plans ldp-fedavg, s-dp-fl "
            "and channel-dp under the same targets. Record-level plans need a calibration "
            "(--calibration FILE, from `testbed calibrate`; for testbed/config/"
            "private-fedsgd.yaml the shipped " + SHIPPED_CALIBRATION + "). Other "
            "solver-only inputs (beta1, beta2 instead of a calibration, gains h_i, Q range, "
            "rounds_margin) come from --scenario FILE (see aggregator/solver/from_config.py)."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (default: the shipped default)")
    p.add_argument("--scenario", type=Path, help="solver scenario YAML (solver: mapping)")
    p.add_argument("--calibration", type=Path, metavar="CAL.yaml",
                   help="convergence constants from `testbed calibrate --out` (the scenario "
                   "key solver.calibration; a relative path is read from the current "
                   "directory); shipped for testbed/config/private-fedsgd.yaml: "
                   + SHIPPED_CALIBRATION)
    p.add_argument("--set", dest="overrides", action=UniqueOverrides, default=[],
                   metavar="KEY=VALUE",
                   help="override an experiment config key (privacy.epsilon=1.8); repeatable")
    p.add_argument("--hw-set", dest="hw_overrides", action=UniqueOverrides, default=[],
                   metavar="KEY=VALUE",
                   help="override a hardware config key (symbol_rate_hz=1e6); repeatable")
    p.add_argument("--scheme", default="ee-dp-fl",
                   choices=["ee-dp-fl", "s-dp-fl", "ldp-fedavg", "channel-dp", "dp-pasgd",
                            "fedsgd-dpc", "zcdp-secagg", "aircomp"],
                   help="scheme whose plan --out writes (default ee-dp-fl); dp-pasgd, "
                   "fedsgd-dpc, zcdp-secagg: the peer paper's own planner (settings under "
                   "'peers: SCHEME:' in --scenario); aircomp: the amplitude and noise shares "
                   "of over-the-air aggregation for an aircomp config (also planned beside "
                   "the others when the config's scheme is aircomp)")
    p.add_argument("--receiver-noise-margin", type=_margin, default=0.1, metavar="ETA",
                   help="aircomp: the receiver may add at most ETA times the noise the "
                   "devices' shares put in the sum at full power (default 0.1)")
    p.add_argument("--out", type=Path, metavar="PLAN.yaml", help="write the plan file")
    p.add_argument("--no-peers", action="store_true", help="plan only --scheme")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_plan)


def _margin(text: str) -> float:
    """``--receiver-noise-margin``: a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"--receiver-noise-margin: got {text!r}; allowed: a number >= 0")
    return value


def _plan(args: argparse.Namespace) -> int:
    from aggregator.solver.baselines import PEER_SCHEMES, plan_all
    from aggregator.solver.from_config import read_scenario_file, scenario_from_config
    from testbed.core.config.plan_file import save_plan

    cfg = load_experiment(args.config, args.overrides)
    if args.scheme in ("dp-pasgd", "fedsgd-dpc", "zcdp-secagg"):
        return _plan_peer(args, cfg)
    if args.scheme == "aircomp" or cfg.scheme == "aircomp":
        if args.out is not None:
            check_output_file(args.out, "--out")
        return plan_aircomp_command(args, cfg)
    if cfg.scheme not in ("ee-dp-fl", "s-dp-fl", "ldp-fedavg", "channel-dp", "fedavg"):
        raise ConfigError(
            f"config key 'scheme': got {cfg.scheme!r}; `testbed plan` plans ee-dp-fl and its "
            "peers (the config's scheme is not used; choose with --scheme)"
        )
    if cfg.privacy.unit == "device" and cfg.privacy.accounting != "paper":
        raise ConfigError(
            f"config key 'privacy.accounting': got {cfg.privacy.accounting!r}; device-level "
            "plans are made under the paper accounting (003 Theorem 1 corrected, which is not "
            "a DP bound: docs/privacy.md 3.3), and a run enforcing 'strict' would refuse them "
            "(a quantizer forfeits the channel credit, so sigma = 0 gives epsilon = inf). Use "
            "the record unit (default), or choose the paper accounting explicitly with "
            "--set privacy.accounting=paper"
        )
    hw = load_hardware(cfg.hw_config, args.hw_overrides)
    sf = with_calibration(read_scenario_file(args.scenario), args.calibration)
    if args.out is not None:
        check_output_file(args.out, "--out")
    schemes = (args.scheme,) if args.no_peers else (
        args.scheme, *[s for s in ("ee-dp-fl", *PEER_SCHEMES) if s != args.scheme]
    )
    if cfg.privacy.unit == "record":
        scenario, results, notes = _plan_record(cfg, hw, sf, schemes, quiet=args.json)
    else:
        scenario, notes = scenario_from_config(cfg, hw, sf, count_params=count_params)
        results = plan_all(scenario, schemes)
    main_res = results[args.scheme]
    failed = isinstance(main_res, Exception)
    if args.out is not None and not failed:
        save_plan(main_res, args.out)
    if args.json:
        out = {"scheme": args.scheme, "scenario_notes": notes, **_summary(main_res)}
        out["peers"] = {k: _summary(v) for k, v in results.items() if k != args.scheme}
        if args.out is not None and not failed:
            out["plan_file"] = str(args.out)
        print(json.dumps(_json_safe(out)))
    else:
        for line in notes:
            print(f"note: {line}")
        for name, res in results.items():
            _print_result(name, res)
        if args.out is not None and not failed:
            print(f"plan written to {args.out}")
    if failed:
        print(f"testbed plan: error: {main_res}", file=sys.stderr)
        if args.out is not None:
            print(f"testbed plan: no plan written to {args.out}", file=sys.stderr)
        return 3
    return 0


def with_calibration(sf: Any, calibration: Path | None) -> Any:
    """The scenario ``sf`` with ``--calibration`` as its ``calibration`` key.

    Parameters
    ----------
    sf
        The parsed scenario file (:class:`aggregator.solver.from_config.ScenarioFile`).
    calibration
        ``--calibration``, or ``None`` (``sf`` is returned as it is).

    Returns
    -------
    ScenarioFile
        ``sf`` with ``calibration`` set to the path given.

    Raises
    ------
    ConfigError
        The scenario file already gives the constants (``calibration`` or ``beta1``/``beta2``),
        so one of the two would be ignored.
    """
    if calibration is None:
        return sf
    if sf.calibration is not None or sf.beta1 is not None or sf.beta2 is not None:
        raise ConfigError(
            f"--calibration {calibration}: the --scenario file already sets "
            f"{'calibration' if sf.calibration is not None else 'beta1/beta2'}; give the "
            "convergence constants once (drop --calibration or that key)"
        )
    return sf.model_copy(update={"calibration": str(calibration)})


def _needs_constants(sf: Any) -> None:
    """Refuse a record-level plan without convergence constants, naming ``--calibration``
    (before the data set is loaded and the model built)."""
    if sf.calibration is None and (sf.beta1 is None or sf.beta2 is None):
        raise ConfigError(
            "record-level plans need the convergence constants beta1, beta2 fitted for the "
            "config's model and data: give --calibration CAL.yaml (for testbed/config/"
            f"private-fedsgd.yaml the shipped {SHIPPED_CALIBRATION}), or make one with "
            "`testbed calibrate CONFIG --out cal.yaml` (a scenario file's solver.calibration "
            "or beta1/beta2 serve too)"
        )


def _plan_peer(args: argparse.Namespace, cfg: ExperimentConfig) -> int:
    """A peer system's own planner (docs/peers/): its choice, and a plan file the run
    follows (``testbed run --plan``)."""
    from aggregator.peers.plan_config import (
        PeerPlanRefused,
        plan_peer,
        read_peer_scenario,
        save_peer_plan,
    )
    from testbed.core.run_setup import prepare_data

    sc = read_peer_scenario(args.scenario, args.scheme)
    if args.out is not None:
        check_output_file(args.out, "--out")
    sizes = [len(p) for p in prepare_data(cfg)[1]]
    try:
        plan, overrides = plan_peer(args.scheme, cfg, count_params(cfg), sizes, sc)
    except PeerPlanRefused as exc:
        print(f"testbed plan: refused: {exc}", file=sys.stderr)
        if args.out is not None:
            print(f"testbed plan: no plan written to {args.out}", file=sys.stderr)
        return 3
    if args.out is not None:
        save_peer_plan(args.out, args.scheme, plan, overrides)
    out = {"scheme": args.scheme, "plan": plan.to_dict(), "run_overrides": overrides,
           "accounting": "the paper's own (docs/peers/); the run enforces the testbed's "
           "dp-accounting figure and reports the paper's next to it"}
    if args.out is not None:
        out["plan_file"] = str(args.out)
    if args.json:
        print(json.dumps(_json_safe(out)))
    else:
        print(f"== {args.scheme} (the paper's own planner)")
        for key, value in overrides.items():
            print(f"  {key} = {value:.6g}" if isinstance(value, float) else f"  {key} = {value}")
        if args.out is not None:
            print(f"plan written to {args.out}")
    return 0


def _plan_record(
    cfg: ExperimentConfig, hw: Any, sf: Any, schemes: tuple[str, ...], *, quiet: bool
) -> tuple[Any, dict[str, Any], list[str]]:
    """Record-level plans of ``schemes`` (progress on stderr unless ``quiet``)."""
    from aggregator.solver.from_config import calibration_range, record_scenario_from_config
    from aggregator.solver.infeasible import InfeasibleError
    from aggregator.solver.record_planner import (
        NoiseFloor,
        PlanRefused,
        default_calibrator,
        plan_noise_term,
        plan_record_scheme,
    )
    from testbed.core.run_setup import prepare_data

    _needs_constants(sf)
    _data, parts = prepare_data(cfg)
    sizes = [len(p) for p in parts]
    scenario, terms, notes = record_scenario_from_config(
        cfg, hw, sf, d=count_params(cfg), dataset_sizes=sizes
    )

    def progress(msg: str) -> None:
        if not quiet:
            print(f"plan: {msg}", file=sys.stderr, flush=True)

    floor = NoiseFloor(terms, default_calibrator(terms, scenario.epsilon, scenario.delta),
                       scenario.k_max, progress=progress)
    span = calibration_range(sf.calibration) if sf.calibration is not None else None
    if span is not None:
        notes.append(f"the calibration's pilots reached training loss {span[2]:.4g} with noise "
                     f"terms {span[0]:.4g} to {span[1]:.4g}; the plans are for that loss")
    results: dict[str, Any] = {}
    for name in schemes:
        try:
            plan = plan_record_scheme(
                scenario, name, terms, tuple(sizes), floor=floor, progress=progress
            )
        except (InfeasibleError, PlanRefused) as exc:
            results[name] = exc
            continue
        if span is not None:
            plan = plan.model_copy(update={"target_loss": span[2]})
        noise = plan_noise_term(plan)
        if span is not None and not span[0] * 0.999 <= noise <= span[1] * 1.001:
            plan = plan.model_copy(update={"notes": [*plan.notes, (
                f"extrapolated: the plan's noise term {noise:.4g} lies outside the pilots' "
                f"range {span[0]:.4g} to {span[1]:.4g}; the convergence model was not checked "
                "there (add pilots near it)"
            )]})
        results[name] = plan
    return scenario, results, notes


def _summary(res: Any) -> dict[str, Any]:
    from aggregator.solver.infeasible import InfeasibleError

    if isinstance(res, InfeasibleError):
        return {"feasible": False, "binding": res.binding, "nearest": res.nearest,
                "error": str(res)}
    if isinstance(res, Exception):
        return {"feasible": False, "refused": True, "error": str(res)}
    return {
        "feasible": True, "unit": res.unit, "accounting": res.accounting,
        "family": res.family, "record": None if res.record is None else res.record.model_dump(),
        "T": res.T, "K": res.K, "H": res.H, "l": res.l, "Q": res.Q, "d": res.d,
        "energy_j": res.energy_j, "energy_comm_j": res.energy_comm_j,
        "energy_comp_j": res.energy_comp_j, "required_uploads": res.required_uploads,
        "strict_exceeds_target": res.strict_exceeds_target, "notes": res.notes,
        "devices": [
            {"id": d.id, "alpha": d.alpha, "sigma": d.sigma, "power_w": d.power_w,
             "e_comm_j": d.e_comm_j, "e_comp_j": d.e_comp_j, "epsilon": d.epsilon,
             "epsilon_accounting": res.accounting,
             "epsilon_paper": d.epsilon_paper, "epsilon_strict": d.epsilon_strict,
             "epsilon_no_channel": d.epsilon_no_channel,
             "epsilon_device_level": d.epsilon_device_level,
             "noise_multiplier": d.noise_multiplier, "regime": d.regime}
            for d in res.devices
        ],
        "solver_seconds": res.solver.seconds,
    }


def _json_safe(x: Any) -> Any:
    """Infinite floats as the string "Infinity" (JSON has no inf); never as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return "Infinity" if x > 0 else ("-Infinity" if x < 0 else "NaN")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def _print_result(name: str, res: Any) -> None:
    from aggregator.solver.infeasible import InfeasibleError

    print(f"== {name}")
    if isinstance(res, InfeasibleError):
        print(f"  INFEASIBLE: {res}")
        return
    if isinstance(res, Exception):
        print(f"  REFUSED: {res}")
        return
    if res.unit == "record":
        _print_record(res)
        return
    q = "-" if res.Q is None else str(res.Q)
    print(f"  T = {res.T} (K = {res.K} uploads x H = {res.H}), l = {res.l} of d = {res.d}, "
          f"Q = {q}")
    print(f"  energy {res.energy_j:.6g} J (radio {res.energy_comm_j:.6g} J, computing "
          f"{res.energy_comp_j:.6g} J); convergence bound needs K >= {res.required_uploads:.4g}")
    print("  dev      alpha      sigma   power_W  E_comm_J/up  E_comp_J/rd   eps_paper  "
          "eps_strict  regime")
    for d in res.devices:
        strict = "n/a" if d.epsilon_strict is None else f"{d.epsilon_strict:.4g}"
        print(f"  {d.id:>3} {d.alpha:10.4g} {d.sigma:10.4g} {d.power_w:9.4g} {d.e_comm_j:12.4g} "
              f"{d.e_comp_j:12.4g} {d.epsilon_paper:11.4g} {strict:>11}  {d.regime}")
    for note in res.notes:
        print(f"  note: {note}")
    if res.strict_exceeds_target:
        print(f"  WARNING: strict epsilon above the target {res.epsilon_target:g} "
              "(see note above)")


def _print_record(res: Any) -> None:
    """Human-readable record-level plan."""
    q = "-" if res.Q is None else str(res.Q)
    rec = res.record
    print(f"  unit record, accountant {res.accounting} ({rec.relation}, "
          f"{'secret' if rec.amplified else 'public'} sampling), family {res.family}")
    print(f"  K = {res.K} rounds (FedSGD), l = {res.l} of d = {res.d}, Q = {q}, "
          f"trusted {res.trusted:g}")
    print(f"  energy {res.energy_j:.6g} J (radio {res.energy_comm_j:.6g} J, computing "
          f"{res.energy_comp_j:.6g} J); convergence model needs K >= {res.required_uploads:.4g}")
    print("  dev      alpha      sigma   power_W  E_comm_J/up       z_eff  epsilon  "
          "eps_no_chan  eps_device  regime")
    for d in res.devices:
        print(f"  {d.id:>3} {d.alpha:10.4g} {d.sigma:10.4g} {d.power_w:9.4g} {d.e_comm_j:12.4g} "
              f"{d.noise_multiplier:11.4g} {d.epsilon:8.4g} {d.epsilon_no_channel:12.4g} "
              f"{d.epsilon_device_level:11.4g}  {d.regime}")
    print(f"  epsilon: record unit, delta {res.delta:g}, {res.accounting} (dp-accounting), "
          "per device, after K rounds at the assumed channel; eps_no_chan: no channel credit; "
          "eps_device: a device's whole data set")
    for note in res.notes:
        print(f"  note: {note}")
