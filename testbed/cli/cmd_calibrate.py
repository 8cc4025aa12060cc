"""``testbed calibrate``: fit beta1, beta2 of the convergence model (25) from pilot runs.

Runs the experiment config briefly at every combination of ``--theta-s``, ``--levels`` and
``--sigmas`` (scheme ee-dp-fl, the given sigma, alpha at full power, paper accounting
with a relaxed target so no budget stops a pilot), records the uploads each needed to reach
a common training loss, and fits ``K = beta1 theta_qs + beta2 kappa (theta_qs s + m)``
by non-negative least squares (:mod:`aggregator.solver.calibration`). The output file keeps
the fit and the data it came from; pass it to ``testbed plan`` through the scenario
file's ``calibration:`` key.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from testbed.config.loader import ConfigError, load_experiment, load_hardware
from testbed.config.paths import check_output_dir, check_output_file
from testbed.config.safe_yaml import dump_yaml_text


def register(sub: Any) -> None:
    """Add the ``calibrate`` subcommand."""
    p = sub.add_parser(
        "calibrate",
        help="fit beta1, beta2 of the EE-DP-FL convergence model from short pilot runs",
        description=(
            "Run short trainings of CONFIG at several compression and noise settings, find the "
            "uploads each needs to reach a target training loss, and fit beta1, beta2 of "
            "003 (25): K = beta1 theta_qs + beta2 kappa (theta_qs mean sigma^2 + mean "
            "N0/(h alpha)^2). Writes the fit and its data (YAML) for `testbed plan`."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (default: the shipped default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for every pilot run; repeatable")
    p.add_argument("--hw-set", dest="hw_overrides", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="override a hardware config key for every pilot run; repeatable")
    p.add_argument("--theta-s", type=float, nargs="+", default=[1.0, 0.3],
                   help="sparsification ratios l/d to try (default 1.0 0.3)")
    p.add_argument("--levels", type=int, nargs="+", default=[32, 8],
                   help="quantization levels Q to try (default 32 8)")
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.02],
                   help="artificial noise std per coordinate to try (default 0 0.02)")
    p.add_argument("--target-loss", type=float,
                   help="training loss to reach (default: the largest final loss of the pilots, "
                        "which every pilot reaches)")
    p.add_argument("--runs-dir", type=Path, help="keep the pilot run directories here")
    p.add_argument("--out", type=Path, help="write the fit and data (YAML)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    from aggregator.solver.calibration import PilotRun, fit_betas, uploads_to_target
    from testbed.cli.cmd_plan import count_params
    from testbed.rundir import RunDirError
    from testbed.runner import run_experiment
    from testbed.schemes import mean_n0_per_real, resolve_uplinks

    for name, values in (("--theta-s", args.theta_s), ("--sigmas", args.sigmas)):
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ConfigError(f"{name}: got {values}; allowed: finite values >= 0")
    if any(not 0 < t <= 1 for t in args.theta_s):
        raise ConfigError(f"--theta-s: got {args.theta_s}; allowed: 0 < theta_s <= 1")
    if any(q < 1 for q in args.levels):
        raise ConfigError(f"--levels: got {args.levels}; allowed: integers >= 1")
    if args.target_loss is not None and not (
        math.isfinite(args.target_loss) and args.target_loss > 0
    ):
        raise ConfigError(f"--target-loss: got {args.target_loss}; allowed: a finite value > 0")
    if args.out is not None:
        check_output_file(args.out, "--out")
    if args.runs_dir is not None:
        check_output_dir(args.runs_dir, "--runs-dir")
    base = load_experiment(args.config, args.overrides)
    hw = load_hardware(base.hw_config, args.hw_overrides)
    settings = list(itertools.product(args.theta_s, args.levels, args.sigmas))
    if len(settings) < 2:
        raise ConfigError("calibrate: need at least 2 settings (vary --theta-s/--levels/--sigmas)")
    cfgs = []
    for ts, q, sg in settings:
        cfgs.append(load_experiment(args.config, [
            *args.overrides, "scheme=ee-dp-fl", "privacy.unit=device", "plan=null",
            f"compression.theta_s={ts}",
            f"compression.levels={q}", "compression.sparsify=true", "compression.quantize=true",
            f"privacy.sigma={sg}", "privacy.epsilon=1e12", "privacy.accounting=paper",
            "privacy.trusted_channel_noise=1.0", "power.alpha=null",
        ]))
    if args.runs_dir is not None:
        for k in range(len(settings)):
            taken = args.runs_dir / f"pilot-{k:02d}"
            if taken.exists():
                raise ConfigError(
                    f"--runs-dir '{args.runs_dir}': '{taken.name}' already exists (from an "
                    "earlier calibration?); allowed: a new or empty directory"
                )
    d = count_params(base)
    runs_root = args.runs_dir or Path(tempfile.mkdtemp(prefix="calibrate-"))
    rows = []
    for k, (cfg, (ts, q, sg)) in enumerate(zip(cfgs, settings, strict=True)):
        run_dir = runs_root / f"pilot-{k:02d}"
        try:
            summary = run_experiment(cfg, run_dir, hw=hw)
        except (FileNotFoundError, RunDirError) as exc:
            # e.g. the data set is missing: the runner checks it before the first round.
            raise ConfigError(f"calibrate: pilot {k}: {exc}") from None
        metrics = run_dir / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        losses = [json.loads(line)["train_loss"] for line in lines if line]
        if not losses:
            raise ConfigError(
                f"calibrate: pilot {k} (theta_s={ts}, Q={q}, sigma={sg}) completed no round "
                f"(status {summary.get('status')!r}); see {run_dir}"
            )
        ups = resolve_uplinks(cfg, hw, d)
        n0 = [mean_n0_per_real(cfg, i) for i in range(cfg.devices)]
        alphas = [float(u.alpha) for u in ups if u.alpha is not None]
        if len(alphas) != len(ups):
            raise ConfigError(f"calibrate: pilot {k} has no fixed alpha (scheme without DP?)")
        chan = sum(n / a**2 for n, a in zip(n0, alphas, strict=True)) / len(ups)
        l_val = ups[0].l
        theta_qs = d / l_val + (math.sqrt(d) / q) / math.sqrt(l_val / d)
        rows.append({"theta_s": ts, "levels": q, "sigma": sg, "l": l_val, "d": d,
                     "theta_qs": theta_qs, "kappa": q * (q + math.sqrt(l_val)),
                     "sigma2_mean": sg**2, "chan_mean": chan, "train_loss": losses,
                     "run_dir": str(run_dir)})
    target = args.target_loss if args.target_loss is not None else max(
        r["train_loss"][-1] for r in rows)
    pilots = []
    for r in rows:
        r["uploads_needed"] = uploads_to_target(r["train_loss"], target)
        if r["uploads_needed"] is not None:
            pilots.append(PilotRun(r["theta_qs"], r["kappa"], r["sigma2_mean"], r["chan_mean"],
                                   float(r["uploads_needed"])))
    fit = fit_betas(pilots)
    result = {"beta1": fit.beta1, "beta2": fit.beta2, "identified": fit.identified,
              "rms_relative_error": fit.rms_relative_error, "n_runs_used": fit.n_runs,
              "target_loss": target, "config": args.config, "overrides": args.overrides,
              "runs": rows}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(dump_yaml_text(result))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"beta1 = {fit.beta1:.6g}, beta2 = {fit.beta2:.6g} from {fit.n_runs} pilot runs "
              f"(target loss {target:.4g}, rms relative error {fit.rms_relative_error:.3g})")
        if not fit.identified:
            print("warning: beta2 = 0: the noise levels tried did not change the rounds needed; "
                  "try larger --sigmas")
        if args.out is not None:
            print(f"written to {args.out}")
    return 0
