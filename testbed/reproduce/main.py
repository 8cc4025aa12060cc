"""``testbed reproduce``: run what each result of 003 needs and write one report.

Targets: ``table1`` (accuracy per scheme and epsilon), ``fig2a`` (artificial noise per
scheme, from ``testbed plan``, with the runs' own figures when Table I's runs exist),
``fig2b``/``fig2c`` (epsilon vs SNR, ``testbed privacy-curve``; one computation gives both),
``fig3`` (energy to the target loss, from Table I's runs), ``all``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.core.config.errors import ConfigError
from testbed.core.runs.rundir import atomic_write_bytes, dumps
from testbed.reproduce.cases import (
    BASE_CONFIG,
    SHIPPED_CALIBRATION,
    TABLE1_SCHEMES,
    Settings,
    dataset_overrides,
    settings,
    table1_cases,
)
from testbed.reproduce.figures import privacy_curve
from testbed.reproduce.plans import make_plan
from testbed.reproduce.printed import TABLE1_EPSILONS
from testbed.reproduce.report import fmt, rel, scheme_label
from testbed.reproduce.runs import RunCell, run_table1
from testbed.reproduce.sections import (
    fig2a_section,
    fig2bc_section,
    fig3_section,
    table1_section,
)
from testbed.sweep.cells import read_summary

TARGETS: tuple[str, ...] = ("table1", "fig2a", "fig2b", "fig2c", "fig3", "all")


@dataclass
class Request:
    """What ``testbed reproduce`` was asked (validated by the CLI)."""

    targets: list[str]
    quick: bool
    out: Path
    address: str | None = None
    datasets: dict[str, str | None] = field(default_factory=lambda: {"fashion-mnist": None})
    calibrations: dict[str, Path] = field(default_factory=dict)
    schemes: tuple[str, ...] = TABLE1_SCHEMES
    epsilons: tuple[float, ...] = TABLE1_EPSILONS
    extra: dict[str, Any] = field(default_factory=dict)


def expand_targets(targets: list[str]) -> list[str]:
    """``all`` -> every result; duplicates dropped; order kept."""
    out: list[str] = []
    for t in targets:
        for x in (TARGETS[:-1] if t == "all" else (t,)):
            if x not in out:
                out.append(x)
    return out


def reproduce(req: Request, log: Callable[[str], None] | None = None) -> Path:
    """Run and write everything ``req`` asks for; returns the report's path."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    targets = expand_targets(req.targets)
    s = settings(req.quick, req.extra)
    out = req.out
    out.mkdir(parents=True, exist_ok=True)
    cals = {"fashion-mnist": SHIPPED_CALIBRATION, **req.calibrations}
    sections: list[str] = []
    cells: list[RunCell] = []
    notes: list[str] = []
    needs_runs = any(t in targets for t in ("table1", "fig3"))
    if needs_runs:
        say(f"reproduce: Table I's runs ({len(req.schemes)} schemes x {len(req.epsilons)} "
            f"epsilons x {len(req.datasets)} data set(s)) -> {out / 'runs'}")
        cases = [c for c in table1_cases(s) if c.scheme in req.schemes]
        cells, notes = run_table1(out, req.datasets, cases, req.epsilons, s, cals,
                                  address=req.address, log=say)
    elif "fig2a" in targets:
        cells = _existing_cells(out, req)
    if "table1" in targets:
        sections.append(table1_section(cells, out, notes, req.quick))
    if "fig2a" in targets:
        plans: dict[tuple[str, float], dict[str, Any]] = {}
        sources: dict[tuple[str, float], Path] = {}
        for ds, directory in req.datasets.items():
            cal = cals.get(ds)
            if cal is None:
                notes.append(f"Fig. 2(a) on {ds}: no calibration, no plan")
                continue
            for eps in req.epsilons:
                name = f"{ds}-eps{eps:g}"
                base = {**dataset_overrides(ds, directory), **s.fixed, "privacy.epsilon": eps}
                say(f"reproduce: planning {name}")
                path, plan_json = make_plan(out / "plans", name, base, cal, s.k_max)
                plans[(ds, eps)] = plan_json
                sources[(ds, eps)] = path.with_suffix(".json")
        sections.append(fig2a_section(plans, sources, cells, out))
    if "fig2b" in targets or "fig2c" in targets:
        say("reproduce: epsilon vs SNR (testbed privacy-curve)")
        curve = privacy_curve(out / "fig2bc", s.curve_rounds, s.realizations)
        sections.append(fig2bc_section(curve, out))
    if "fig3" in targets:
        sections.append(fig3_section(cells, out, s.target_loss))
    report = out / "report.md"
    text = _header(req, s, targets, cells, time.perf_counter() - t0) + "\n".join(sections)
    atomic_write_bytes(report, text.encode())
    atomic_write_bytes(out / "reproduce.json", dumps({
        "targets": targets, "quick": req.quick, "datasets": req.datasets,
        "schemes": list(req.schemes), "epsilons": list(req.epsilons), "extra": req.extra,
        "runs": [{"dataset": c.dataset, "scheme": c.scheme, "epsilon": c.epsilon,
                  "run_dir": rel(c.run_dir, out), "status": c.row.get("status")}
                 for c in cells],
    }, indent=1).encode())
    say(f"reproduce: wrote {report} in {time.perf_counter() - t0:.0f} s")
    return report


def _existing_cells(out: Path, req: Request) -> list[RunCell]:
    """Table I's runs already in ``out`` (for Fig. 2(a)'s measured column); none run."""
    cells = []
    for ds in req.datasets:
        for scheme in req.schemes:
            for eps in req.epsilons:
                root = out / "runs" / ds / scheme
                cands = list(root.glob(f"**/runs/*{eps:g}*")) if root.is_dir() else []
                for run_dir in cands:
                    summ = read_summary(run_dir)
                    if summ is None:
                        continue
                    cells.append(RunCell(ds, scheme, eps, {"status": summ.get("status")},
                                         run_dir))
                    break
    return cells


def _reused(cells: list[RunCell]) -> str:
    """How many of the reported runs an earlier invocation finished (skipped here)."""
    n = sum(1 for c in cells if c.row.get("action") == "skipped")
    if not n:
        return ""
    total = sum(float(c.row.get("wall_time_s") or 0) for c in cells)
    return (f"; {n} of its {len(cells)} runs were finished by an earlier invocation and "
            f"skipped (the runs' own wall times, `wall_time_s` in each summary: the last "
            f"segment of a resumed run, add up to {total:.0f} s)")


def _header(req: Request, s: Settings, targets: list[str], cells: list[RunCell],
            wall: float) -> str:
    mode = "quick (--quick: short runs that exercise the pipeline)" if req.quick else "full"
    used = ", ".join(f"{ds} ({d or 'shipped: Debian dataset-fashion-mnist'})"
                     for ds, d in req.datasets.items())
    missing = [n for n in ("mnist", "cifar10") if n not in req.datasets]
    lines = [
        "# Reproduction of 003 (piggyback DP, EE-DP-FL) and its peers",
        "",
        f"Targets: {', '.join(targets)}. Mode: {mode}. Wall time of this invocation: "
        f"{wall:.0f} s" + _reused(cells) + ".",
        "",
        "## Settings",
        "",
        f"- Data sets used: {used}."
        + (f" Not run: {', '.join(missing)} (give --data NAME=DIR)." if missing else ""),
        f"- Base config: `{BASE_CONFIG.relative_to(BASE_CONFIG.parents[2])}` (10 devices, "
        "non-IID 75%, the paper's "
        "MNIST CNN, FedSGD: one secret Poisson batch per round, per-example clip 1, record "
        "unit, delta 1e-5, PLD accountant of dp-accounting, symbol link at 20 dB AWGN).",
        f"- Overrides on every run: `{s.fixed}`.",
        f"- Schemes: {', '.join(scheme_label(x) for x in req.schemes)}; epsilons "
        f"{', '.join(fmt(e) for e in req.epsilons)}.",
        "- ee-dp-fl follows a `testbed plan` made per data set and epsilon from a measured "
        "calibration (Fashion-MNIST: the shipped `testbed/config/calibration/"
        "private-fedsgd.yaml`)"
        + (f", K at most {s.k_max}." if s.k_max else "."),
        "- Accounting: every epsilon in the tables is per device at the record unit "
        "(neighbouring data sets differ in one example), enforced by the run with "
        "dp-accounting, unless a column says otherwise. Trust: noise is added on the device "
        "(local model); credited channel noise protects against the aggregator's receiver, "
        "not an eavesdropper with a better channel (the 'no channel credit' column); "
        "zcdp-secagg's own figure assumes an honest-but-curious server and non-colluding "
        "peers. 003's own accounting ('paper') is device-level and is not a DP bound "
        "(docs/privacy.md); it appears only in Fig. 2(b)/(c), next to the strict one.",
        "",
    ]
    if req.quick:
        lines += ["**Quick mode: the numbers below come from runs of a few rounds and are not "
                  "a reproduction; run without --quick for that.**", ""]
    return "\n".join(lines) + "\n"


def parse_mapping(items: list[str], flag: str) -> dict[str, Path]:
    """``NAME=FILE`` items -> {name: path}, each file checked to exist."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value:
            raise ConfigError(f"{flag}: got {item!r}; allowed: NAME=FILE")
        if not Path(value).is_file():
            raise ConfigError(f"{flag} {name}: no such file {value!r}")
        out[name] = Path(value)
    return out
