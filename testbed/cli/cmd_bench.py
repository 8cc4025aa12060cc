"""``testbed bench``: run the benchmark scripts in ``benchmarks/`` and tabulate their figures.

Each ``benchmarks/bench_<name>.py`` measures something and its baseline in the same run
and, with ``--json``, prints one JSON object whose ``figures`` follow
:mod:`testbed.bench_figures` (``benchmarks/README.md``). This command runs each script with
``--json`` (and ``--full`` when given) in its own process group, under a per-script timeout
and an overall budget, and prints every figure in one table: value, baseline, ratio, aim
and whether it is met. Nothing is asserted: an unmet aim is reported, not an error; a
script that fails, times out or prints no figures makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.bench_figures import Figure, FigureError, format_table, parse_figures

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "benchmarks"
#: Default per-script timeout (s) and overall budget (s) without and with ``--full``.
TIMEOUT_S = {False: 150.0, True: 3600.0}
BUDGET_S = {False: 300.0, True: 0.0}


def available(bench_dir: Path = BENCH_DIR) -> list[str]:
    """Names of the benchmark scripts (``bench_<name>.py`` -> ``<name>``)."""
    return sorted(p.stem.removeprefix("bench_") for p in bench_dir.glob("bench_*.py"))


def register(sub: Any) -> None:
    """Add the ``bench`` subcommand."""
    p = sub.add_parser(
        "bench",
        help="run the speed benchmarks (ratios against baselines measured in the same run)",
        description=(
            "Run benchmarks/bench_*.py (each measures its baseline in the same run) and print "
            "every figure in one table. By default the small sizes, within a 5 minute budget; "
            "--full runs the large sizes without a budget."
        ),
    )
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {available()})")
    p.add_argument("--full", action="store_true", help="the large sizes (passed to each script)")
    p.add_argument(
        "--timeout", type=float, default=None,
        help="seconds one script may run before it is stopped and reported as timed out "
        f"(default {TIMEOUT_S[False]:g}, with --full {TIMEOUT_S[True]:g})",
    )
    p.add_argument(
        "--budget", type=float, default=None,
        help="seconds for all scripts together; scripts that would start after it are "
        f"skipped (default {BUDGET_S[False]:g}, with --full none; 0 = none)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with every result")
    # Where the scripts are (tests point it at a directory of small scripts).
    p.add_argument("--dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS)
    p.set_defaults(func=_bench)


@dataclass
class Outcome:
    """What one script gave: ``status`` is ``ok``, ``failed``, ``timed out``, ``bad output``
    or ``skipped``; ``detail`` says why when not ``ok``."""

    name: str
    status: str
    wall_s: float = 0.0
    detail: str = ""
    figures: list[Figure] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """Stop the script's process group (the script and whatever it started)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_script(script: Path, *, full: bool, timeout_s: float, limit: str = "--timeout") -> Outcome:
    """Run one benchmark script with ``--json`` and read its figures.

    ``limit`` names what set ``timeout_s`` (for the report).
    """
    name = script.stem.removeprefix("bench_")
    cmd = [sys.executable, str(script), "--json", *(["--full"] if full else [])]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
    )
    t0 = time.perf_counter()
    # stderr goes to the terminal (progress); the script runs in its own process group so a
    # timeout or Ctrl-C stops the processes it started too.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=None, text=True, cwd=REPO_ROOT, env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return Outcome(name, "timed out", time.perf_counter() - t0,
                       f"stopped after {round(timeout_s, 1):g} s ({limit})")
    except BaseException:
        _stop_group(proc)
        raise
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return Outcome(name, "failed", wall, f"exit status {proc.returncode} (see its stderr)")
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    try:
        raw: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        figures = parse_figures(raw, f"bench_{name}.py")
    except (json.JSONDecodeError, FigureError) as exc:
        msg = str(exc) if isinstance(exc, FigureError) else f"last line is not JSON: {exc}"
        return Outcome(name, "bad output", wall, msg)
    return Outcome(name, "ok", wall, figures=figures, raw=raw)


def _bench(args: argparse.Namespace) -> int:
    bench_dir: Path = args.dir
    known = available(bench_dir)
    names = args.names or known
    unknown = [n for n in names if n not in known]
    if unknown:
        print(
            f"testbed bench: unknown benchmark(s) {unknown}; allowed: {known} "
            f"(scripts bench_<name>.py in {bench_dir})",
            file=sys.stderr,
        )
        return 2
    timeout = TIMEOUT_S[args.full] if args.timeout is None else args.timeout
    budget = BUDGET_S[args.full] if args.budget is None else args.budget
    for key, val in (("--timeout", timeout), ("--budget", budget)):
        if not val >= 0 or (key == "--timeout" and val == 0):
            print(f"testbed bench: {key} {val:g}; allowed: > 0"
                  + (" (0 = no budget for --budget)" if key == "--budget" else ""),
                  file=sys.stderr)
            return 2
    t_start = time.perf_counter()
    outcomes: list[Outcome] = []
    for name in names:
        left = budget - (time.perf_counter() - t_start) if budget > 0 else float("inf")
        if left <= 0:
            outcomes.append(Outcome(name, "skipped", 0.0, f"the {budget:g} s budget is spent"))
            continue
        if not args.json:
            print(f"testbed bench: running {name} ...", file=sys.stderr, flush=True)
        outcomes.append(
            run_script(bench_dir / f"bench_{name}.py", full=args.full,
                       timeout_s=min(timeout, left),
                       limit="--timeout" if timeout <= left else "what is left of --budget")
        )
    total = time.perf_counter() - t_start
    code = 0 if all(o.status == "ok" for o in outcomes) else 1
    if args.json:
        print(json.dumps({
            "full": args.full,
            "wall_s": total,
            "benchmarks": {
                o.name: {"status": o.status, "detail": o.detail, "wall_s": o.wall_s,
                         "figures": [f.to_json() for f in o.figures], "output": o.raw}
                for o in outcomes
            },
        }))
        return code
    rows: list[tuple[str, Figure | None, str]] = []
    for o in outcomes:
        if o.status != "ok" or not o.figures:
            rows.append((o.name, None, f"{o.status}: {o.detail}" if o.detail else o.status))
        rows.extend((o.name, f, "ok") for f in o.figures)
    print(format_table(rows))
    notes = [
        f"  {o.name}/{f.name}: baseline = {f.baseline_name or '?'}"
        + (f"; {f.note}" if f.note else "")
        for o in outcomes for f in o.figures
    ]
    if notes:
        print("\nratio = value / baseline, both measured in the same run.")
        print("\n".join(notes))
    walls = ", ".join(f"{o.name} {o.wall_s:.0f} s" for o in outcomes if o.status != "skipped")
    print(f"\n{'full' if args.full else 'default'} sizes; {total:.0f} s in all ({walls})")
    return code
