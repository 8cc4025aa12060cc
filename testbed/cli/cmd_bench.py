"""``testbed bench``: run the benchmark scripts in ``benchmarks/`` and collect their output.

Each ``benchmarks/bench_<name>.py`` is a standalone script that measures a baseline in the
same run and prints ratios; with ``--json`` it prints one JSON object. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def available() -> list[str]:
    """Names of the benchmark scripts (``bench_<name>.py`` -> ``<name>``)."""
    return sorted(p.stem.removeprefix("bench_") for p in BENCH_DIR.glob("bench_*.py"))


def register(sub: Any) -> None:
    """Add the ``bench`` subcommand."""
    p = sub.add_parser(
        "bench",
        help="run the speed benchmarks (ratios against baselines measured in the same run)",
        description="Run benchmarks/bench_*.py. Each measures its baseline in the same run.",
    )
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {available()})")
    p.add_argument("--json", action="store_true", help="print one JSON object with every result")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(
            f"testbed bench: unknown benchmark(s) {unknown}; allowed: {available()}",
            file=sys.stderr,
        )
        return 2
    results: dict[str, Any] = {}
    code = 0
    for name in names:
        script = BENCH_DIR / f"bench_{name}.py"
        cmd = [sys.executable, str(script), *(["--json"] if args.json else [])]
        proc = subprocess.run(cmd, capture_output=args.json, text=True, check=False)
        if proc.returncode != 0:
            code = 1
            if args.json:
                results[name] = {"error": proc.stderr.strip()[-2000:]}
            continue
        if args.json:
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(results))
    return code
