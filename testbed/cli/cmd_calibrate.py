"""``testbed calibrate``: fit beta1, beta2 of the convergence model from pilot runs.

Builds a grid of short pilot runs of CONFIG (:mod:`testbed.calibration_pilots`), refuses a
grid whose regressors cannot identify both constants before anything trains, runs the
pilots one after the other (a line per pilot on stderr), finds the uploads each needed to
reach a common training loss (trailing mean over ``--window`` rounds, the definition the
runner uses), and fits ``K = beta1 theta_qs + beta2 N`` by non-negative least squares
(:mod:`aggregator.solver.calibration`). Record unit: ``N`` is the decoded noise energy
(``decoded-noise/v1``); device unit: 003 (25) (``paper-25``). A fit whose error exceeds
``--max-error``, or with a constant at 0, is not written (exit 3); the data are printed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.cli.overrides import UniqueOverrides
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.config.paths import check_output_dir, check_output_file
from testbed.core.config.safe_yaml import dump_yaml_text

#: Exit code of a calibration whose fit is refused (error above the bound, not identified).
EXIT_REFUSED = 3
#: Seconds between "still running" lines of a long pilot.
HEARTBEAT_S = 30.0
#: Grid keys of a pilot row (record: theta_s, noise_multiplier; device: theta_s, levels, sigma).
_SETTING_KEYS = ("theta_s", "noise_multiplier", "levels", "sigma")


def register(sub: Any) -> None:
    """Add the ``calibrate`` subcommand."""
    p = sub.add_parser(
        "calibrate",
        help="fit beta1, beta2 of the EE-DP-FL convergence model from short pilot runs",
        description=(
            "Run short trainings of CONFIG on a grid of compression and noise settings, find "
            "the uploads each needs to reach a target training loss, and fit beta1, beta2 of "
            "K = beta1 theta_qs + beta2 N (record unit: N = mean decoded noise energy, model "
            "decoded-noise/v1; device unit: N = kappa (theta_qs mean sigma^2 + mean "
            "N0/(h alpha)^2), 003 (25)). Writes the fit and its data (YAML) for `testbed "
            "plan`. Exit code: 0 written (or acceptable), 2 bad input or a grid that cannot "
            "identify both constants, 3 fit refused (error above --max-error, or a constant "
            "not identified)."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (default: the shipped default)")
    p.add_argument("--set", dest="overrides", action=UniqueOverrides, default=[],
                   metavar="KEY=VALUE",
                   help="override a config key for every pilot run; repeatable")
    p.add_argument("--hw-set", dest="hw_overrides", action=UniqueOverrides, default=[],
                   metavar="KEY=VALUE",
                   help="override a hardware config key for every pilot run; repeatable")
    p.add_argument("--unit", choices=("record", "device"),
                   help="privacy unit of the pilots (default: the config's privacy.unit)")
    p.add_argument("--theta-s", type=float, nargs="+",
                   help="sparsification ratios l/d to try (default: record 1.0, "
                        "device 1.0 0.3)")
    p.add_argument("--noise-multipliers", type=float, nargs="+", metavar="Z",
                   help="record unit: noise multipliers z to try (default: 0.5, 1 and 2 z*, "
                        "z* = the multiplier the config's epsilon target needs)")
    p.add_argument("--levels", type=int, nargs="+",
                   help="device unit: quantization levels Q to try (default 32 8)")
    p.add_argument("--sigmas", type=float, nargs="+",
                   help="device unit: artificial noise std per coordinate (default 0 0.02)")
    p.add_argument("--rounds", type=int,
                   help="rounds of each pilot (default: the config's rounds)")
    p.add_argument("--window", type=int, default=5,
                   help="rounds in the trailing mean of the training loss compared with the "
                        "target (default 5)")
    p.add_argument("--target-loss", type=float,
                   help="training loss to reach; pilots stop once they reach it (default: the "
                        "largest final smoothed loss of the pilots, which every pilot reaches)")
    p.add_argument("--max-error", type=float, default=0.25,
                   help="largest relative fit error (leave-one-out RMS) accepted for --out "
                        "(default 0.25)")
    p.add_argument("--runs-dir", type=Path, help="keep the pilot run directories here")
    p.add_argument("--out", type=Path, help="write the fit and data (YAML)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=_calibrate)


def _say(text: str) -> None:
    print(f"calibrate: {text}", file=sys.stderr, flush=True)


def _check_args(args: argparse.Namespace, unit: str) -> None:
    """Every flag checked before any work; ConfigError names the flag, value and range."""
    if args.theta_s is not None and any(
        not (math.isfinite(t) and 0 < t <= 1) for t in args.theta_s
    ):
        raise ConfigError(f"--theta-s: got {args.theta_s}; allowed: 0 < theta_s <= 1")
    if args.noise_multipliers is not None and any(
        not (math.isfinite(z) and 0 < z <= 1e6) for z in args.noise_multipliers
    ):
        raise ConfigError(
            f"--noise-multipliers: got {args.noise_multipliers}; allowed: 0 < z <= 1e6"
        )
    if args.sigmas is not None and any(
        not (math.isfinite(s) and 0 <= s <= 1e6) for s in args.sigmas
    ):
        raise ConfigError(f"--sigmas: got {args.sigmas}; allowed: 0 <= sigma <= 1e6")
    if args.levels is not None and any(q < 1 for q in args.levels):
        raise ConfigError(f"--levels: got {args.levels}; allowed: integers >= 1")
    wrong = (("--levels", args.levels), ("--sigmas", args.sigmas)) if unit == "record" else (
        ("--noise-multipliers", args.noise_multipliers),
    )
    for flag, value in wrong:
        if value is not None:
            other = "--noise-multipliers" if unit == "record" else "--sigmas"
            raise ConfigError(
                f"{flag}: got {value}; not used with the {unit} unit (its noise grid is "
                f"{other}); allowed: omit it, or pass --unit "
                f"{'device' if unit == 'record' else 'record'}"
            )
    if args.rounds is not None and not 1 <= args.rounds <= 1_000_000:
        raise ConfigError(f"--rounds: got {args.rounds}; allowed: 1 <= rounds <= 1000000")
    if not 1 <= args.window <= 1_000_000:
        raise ConfigError(f"--window: got {args.window}; allowed: 1 <= window <= 1000000")
    if args.target_loss is not None and not (
        math.isfinite(args.target_loss) and args.target_loss > 0
    ):
        raise ConfigError(f"--target-loss: got {args.target_loss}; allowed: a finite value > 0")
    if not (math.isfinite(args.max_error) and args.max_error > 0):
        raise ConfigError(f"--max-error: got {args.max_error}; allowed: a finite value > 0")
    if args.out is not None:
        check_output_file(args.out, "--out")
    if args.runs_dir is not None:
        check_output_dir(args.runs_dir, "--runs-dir")
        taken = sorted(args.runs_dir.glob("pilot-*")) if args.runs_dir.is_dir() else []
        if taken:
            raise ConfigError(
                f"--runs-dir '{args.runs_dir}': '{taken[0].name}' already exists (from an "
                "earlier calibration?); allowed: a directory without pilot-* entries"
            )


def _calibrate(args: argparse.Namespace) -> int:
    from testbed.calibration_pilots import (
        RECORD_THETA_S,
        RECORD_Z_FACTORS,
        check_grid,
        check_record_config,
        device_pilots,
        model_of,
        record_pilots,
        target_noise_multiplier,
    )
    from testbed.cli.model_size import count_params

    base = load_experiment(args.config, args.overrides)
    unit = args.unit or base.privacy.unit
    _check_args(args, unit)
    hw = load_hardware(base.hw_config, args.hw_overrides)
    rounds = args.rounds if args.rounds is not None else base.rounds
    common = {"rounds": rounds, "window": args.window, "stop_at_loss": args.target_loss}
    overrides = [*args.overrides, f"privacy.unit={unit}"]
    if unit == "record":
        check_record_config(load_experiment(args.config, overrides))
    d = count_params(base)
    from testbed.core.run_setup import prepare_data

    try:  # the data set is checked before any pilot; record pilots need its split
        _, parts = prepare_data(base)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"calibrate: the config's data set: {exc}") from None
    grid: dict[str, Any]
    if unit == "record":
        sizes = [len(p) for p in parts]
        z_star = target_noise_multiplier(load_experiment(args.config, overrides), sizes)
        zs = args.noise_multipliers or [f * z_star for f in RECORD_Z_FACTORS]
        grid = {"theta_s": list(args.theta_s or RECORD_THETA_S), "noise_multipliers": zs,
                "z_star": z_star, "z_star_for": {
                    "epsilon": base.privacy.epsilon, "delta": base.privacy.delta,
                    "rounds": base.rounds, "accountant": base.privacy.accountant}}
        pilots = record_pilots(args.config, overrides, hw, d, sizes, theta_s=grid["theta_s"],
                               noise_multipliers=zs, **common)
        flags = "--theta-s / --noise-multipliers"
    else:
        grid = {"theta_s": list(args.theta_s or [1.0, 0.3]), "levels": args.levels or [32, 8],
                "sigmas": args.sigmas or [0.0, 0.02]}
        pilots = device_pilots(args.config, overrides, hw, d, theta_s=grid["theta_s"],
                               levels=grid["levels"], sigmas=grid["sigmas"], **common)
        flags = "--theta-s / --levels / --sigmas"
    cosine = check_grid(pilots, flags)
    runs_root = args.runs_dir or Path(tempfile.mkdtemp(prefix="calibrate-"))
    _say(f"{len(pilots)} pilots ({unit} unit, model {model_of(unit)}), up to {rounds} rounds "
         f"each, regressor cosine {cosine:.3f}" + (
             f", z* = {grid['z_star']:.4g}" if unit == "record" else "") + f"; runs in {runs_root}")
    rows = [_run_pilot(k, len(pilots), p, runs_root, hw) for k, p in enumerate(pilots)]
    result = _fit(rows, unit, args, grid, cosine, d)
    return _report(result, args)


def _settings_text(settings: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in settings.items())


def _run_pilot(k: int, n: int, pilot: Any, runs_root: Path, hw: Any) -> dict[str, Any]:
    """Run one pilot with a start and an end line on stderr; its row for the output."""
    from testbed.core.runs.rundir import RunDirError
    from testbed.runner import run_experiment

    run_dir = runs_root / f"pilot-{k:02d}"
    label = f"pilot {k + 1}/{n} ({_settings_text(pilot.settings)})"
    _say(f"{label}: started, up to {pilot.cfg.rounds} rounds")
    t0 = last = time.monotonic()

    def heartbeat(line: dict[str, Any]) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= HEARTBEAT_S:
            last = now
            _say(f"{label}: round {line['round'] + 1}, train loss {line['train_loss']:.4g}, "
                 f"{now - t0:.0f} s")

    try:
        summary = run_experiment(pilot.cfg, run_dir, hw=hw, on_round=heartbeat)
    except (FileNotFoundError, RunDirError) as exc:
        # e.g. the data set is missing: the runner checks it before the first round.
        raise ConfigError(f"calibrate: {label}: {exc}") from None
    seconds = time.monotonic() - t0
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    losses = [json.loads(line)["train_loss"] for line in lines if line]
    if not losses:
        raise ConfigError(
            f"calibrate: {label} completed no round (status {summary.get('status')!r}: "
            f"{summary.get('reason')}); see {run_dir}"
        )
    from aggregator.solver.calibration import smoothed_losses

    final = float(smoothed_losses(losses, pilot.cfg.loss_target_window)[-1])
    _say(f"{label}: {summary['status']} after {len(losses)} rounds in {seconds:.1f} s, "
         f"smoothed train loss {final:.4g}")
    return {**pilot.settings, **pilot.detail, "theta_qs": pilot.theta_qs,
            "noise_term": pilot.noise_term, "status": summary["status"],
            "rounds_completed": len(losses), "rounds_planned": pilot.cfg.rounds,
            "wall_s": round(seconds, 3),
            "final_smoothed_loss": final, "train_loss": losses, "run_dir": str(run_dir)}


def _fit(rows: list[dict[str, Any]], unit: str, args: argparse.Namespace,
         grid: dict[str, Any], cosine: float, d: int) -> dict[str, Any]:
    """Target, uploads needed, fit, errors and the verdict (``refused``: reasons)."""
    from aggregator.solver.calibration import PilotRun, fit_betas, uploads_to_target
    from testbed.calibration_pilots import model_of

    finals = [r["final_smoothed_loss"] for r in rows if math.isfinite(r["final_smoothed_loss"])]
    if args.target_loss is not None:
        target = args.target_loss
    elif finals:
        target = max(finals)
    else:
        raise ConfigError("calibrate: no pilot has a finite training loss; see the run dirs")
    model = model_of(unit)
    used = []
    for r in rows:
        k = uploads_to_target(r["train_loss"], target, args.window)
        r["uploads_needed"] = k
        r["reached"] = k is not None
        # Never reached: only a lower bound (K > rounds completed). Reached at the first
        # round: the untrained model's loss, only an upper bound. Neither enters the fit.
        r["used"] = k is not None and k > 1
        if k is None:
            r["uploads_needed_lower_bound"] = r["rounds_completed"] + 1
        elif k > 1:
            used.append(PilotRun(r["theta_qs"], r["noise_term"], float(k), model))
    refused: list[str] = []
    missed = [i + 1 for i, r in enumerate(rows) if not r["reached"]]
    if missed:
        _say(f"pilots {missed} never reached the target loss {target:.4g} and are left out "
             "of the fit (their uploads needed is only a lower bound)")
    at_once = [i + 1 for i, r in enumerate(rows) if r["uploads_needed"] == 1]
    if at_once:
        _say(f"pilots {at_once} reached the target loss {target:.4g} at their first round "
             "(before any training) and are left out of the fit; pass a lower --target-loss")
    result: dict[str, Any] = {
        "model": model, "unit": unit, "beta1": None, "beta2": None, "identified": False,
        "fit_error": None, "rms_relative_error": None, "loo_relative_error": None,
        "max_error": args.max_error, "n_runs_used": len(used), "target_loss": target,
        "window": args.window, "d": d, "regressor_cosine": cosine, "grid": grid,
        "pilot_rounds": max(r["rounds_planned"] for r in rows),
        "stop_at_loss": args.target_loss,
        "config": args.config, "overrides": args.overrides, "runs": rows,
    }
    try:
        fit = fit_betas(used)
    except ValueError as exc:
        refused.append(f"no fit: {exc}")
    else:
        result |= {"beta1": fit.beta1, "beta2": fit.beta2, "identified": fit.identified,
                   "fit_error": fit.error, "rms_relative_error": fit.rms_relative_error,
                   "loo_relative_error": fit.loo_relative_error}
        if fit.n_runs < 3:
            refused.append(
                f"only {fit.n_runs} pilots reached the target: a fit of 2 constants to 2 "
                "pilots is exact, so its error cannot be measured (need >= 3)"
            )
        if not fit.identified:
            which = "beta2" if fit.beta2 <= 0 else "beta1"
            refused.append(
                f"{which} = 0: not identified (the pilots' uploads needed do not grow with "
                f"{'the noise term' if which == 'beta2' else 'theta_qs'}); widen the grid "
                "or lengthen the pilots"
            )
        if fit.error > args.max_error:
            kind = "leave-one-out" if fit.loo_relative_error is not None else "in-sample"
            refused.append(
                f"fit error {fit.error:.3g} ({kind} RMS relative) is above --max-error "
                f"{args.max_error:g}"
            )
    result["refused"] = refused
    return result


def _report(result: dict[str, Any], args: argparse.Namespace) -> int:
    refused = result["refused"]
    written = None
    if args.out is not None and not refused:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        saved = {k: v for k, v in result.items() if k != "refused"}
        args.out.write_text(dump_yaml_text(saved))
        written = str(args.out)
    if args.json:
        print(json.dumps({**result, "written": written}))
    else:
        print(f"{'theta_qs':>10} {'noise term':>12} {'uploads':>8}  settings")
        for r in result["runs"]:
            k = r["uploads_needed"]
            shown = str(k) if k is not None else f">{r['uploads_needed_lower_bound'] - 1}"
            shown += "" if r["used"] else " (not used)"
            settings = {key: r[key] for key in _SETTING_KEYS if key in r}
            print(f"{r['theta_qs']:>10.4g} {r['noise_term']:>12.4g} {shown:>8}  "
                  f"{_settings_text(settings)}")
        if result["beta1"] is not None:
            loo = result["loo_relative_error"]
            print(f"beta1 = {result['beta1']:.6g}, beta2 = {result['beta2']:.6g} "
                  f"({result['model']}) from {result['n_runs_used']} pilots, target loss "
                  f"{result['target_loss']:.4g} (mean over {result['window']} rounds); "
                  f"relative error: rms {result['rms_relative_error']:.3g}, leave-one-out "
                  f"{'n/a' if loo is None else f'{loo:.3g}'} (bound {result['max_error']:g})")
        if written:
            print(f"written to {written}")
    for reason in refused:
        _say(f"refused: {reason}")
    if refused:
        _say("no calibration written" if args.out is not None else "fit not acceptable")
        return EXIT_REFUSED
    return 0
