#!/usr/bin/env python3
"""Start-up of ``testbed run``: from the process start to the start of round 0.

Runs the default job (``testbed/config/default.yaml``: Fashion-MNIST, the MNIST CNN, the
in-process symbol link) as a user does, ``testbed run --set rounds=1 --no-report
--no-progress``, each in a fresh process, and reads ``startup_s`` from its
``summary.json``: the process's age when its first round began (imports, config, data set,
model, link; :func:`testbed.core.process.process_clock.process_age_s`, to the kernel's 10 ms tick).

The baseline is the floor every such process pays: a fresh interpreter that imports torch
and numpy, its age read the same way right after. Runs and baselines alternate, so a busy
machine slows both alike; each figure is the median over ``--repeats`` of each.

* ``startup_to_round0``: with the data cache warm (a first, untimed run fills it); aim: at
  most 1.5 s.
* ``startup_cold_cache``: that first run (normalising the data set and writing the cache),
  for comparison; no aim.

The data cache and the run directories live in a temporary folder (``TESTBED_CACHE_DIR``), so
the user's cache is neither read nor written. Project modules without up-to-date cached
bytecode (``make setup`` compiles them) are compiled by every run; their number is in the
note.

Usage::

    .venv/bin/python benchmarks/bench_startup.py [--repeats 5] [--full] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from testbed.bench_figures import Figure, figure, format_table

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("testbed", "edge_device", "aggregator", "radio")
#: The baseline process: torch and numpy imported, then its age (s) printed.
BASELINE_CODE = ("import torch, numpy\n"
                 "from testbed.core.process.process_clock import process_age_s\n"
                 "print(process_age_s())\n")


def stale_bytecode(root: Path = ROOT) -> tuple[int, int]:
    """``(modules without up-to-date cached bytecode, modules)`` of the project's packages
    (a ``.pyc`` whose header's source mtime and size match the ``.py``)."""
    stale = total = 0
    for pkg in PACKAGES:
        for src in (root / pkg).rglob("*.py"):
            total += 1
            try:
                header = Path(importlib.util.cache_from_source(str(src))).read_bytes()[:16]
                st = src.stat()
                fresh = (int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                         and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)
            except OSError:
                fresh = False
            stale += not fresh
    return stale, total


def testbed_command() -> list[str]:
    """How a user starts ``testbed``: the console script beside this interpreter."""
    script = Path(sys.executable).parent / "testbed"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "testbed"]


def run_startup(out: Path, env: dict[str, str]) -> float:
    """One ``testbed run`` of the default job (one round) into ``out``; its ``startup_s``."""
    cmd = [*testbed_command(), "run", "--set", "rounds=1", "--out", str(out), "--no-report",
           "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    if "startup_s" not in summary:
        raise RuntimeError("summary.json has no startup_s (no /proc on this system?)")
    return float(summary["startup_s"])


def baseline_startup(env: dict[str, str]) -> float:
    """A fresh interpreter's age right after ``import torch, numpy``."""
    proc = subprocess.run([sys.executable, "-c", BASELINE_CODE], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs and baselines each (default 5, with --full 11)")
    p.add_argument("--full", action="store_true", help="the large sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    repeats = args.repeats or (11 if args.full else 5)
    if repeats < 1:
        p.error("need --repeats >= 1")
    stale, modules = stale_bytecode()
    runs: list[float] = []
    bases: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        env = {**os.environ, "TESTBED_CACHE_DIR": str(Path(tmp) / "cache")}
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
        print("first run (cold data cache)", file=sys.stderr)
        cold = run_startup(Path(tmp) / "cold", env)
        for k in range(repeats):
            print(f"repeat {k + 1}/{repeats}", file=sys.stderr)
            pair = ("run", "base") if k % 2 == 0 else ("base", "run")
            for side in pair:
                if side == "run":
                    runs.append(run_startup(Path(tmp) / f"run{k}", env))
                else:
                    bases.append(baseline_startup(env))
    base = statistics.median(bases)
    note = (f"default job (symbol link), median of {repeats}; {stale} of {modules} project "
            f"modules without cached bytecode; load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores")
    figures: list[Figure] = [
        figure("startup_to_round0", statistics.median(runs), base, "s", better="lower",
               aim_value=1.5, baseline_name="interpreter start + import torch, numpy",
               note=f"data cache warm; {note}"),
        figure("startup_cold_cache", cold, base, "s", better="lower",
               baseline_name="interpreter start + import torch, numpy",
               note=f"the first run: data set normalised and cached; {note}"),
    ]
    result: dict[str, Any] = {
        "repeats": repeats, "startup_s": runs, "baseline_s": bases, "cold_s": cold,
        "stale_bytecode": stale, "modules": modules, "loadavg": os.getloadavg(),
        "figures": [f.to_json() for f in figures],
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("startup", f, "ok") for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
