#!/usr/bin/env python3
"""What a run's TensorBoard event files cost: the default job with and without them.

Runs the default job (``testbed/config/default.yaml``: Fashion-MNIST, the MNIST CNN, 10
devices, the in-process symbol link) as a user does, ``testbed run --no-report
--no-progress`` in a fresh process, with the event files (as every run writes them) and
without (``TESTBED_TENSORBOARD=0``), ``--repeats`` pairs. The two runs of a pair run at the
same time (each trains on one thread: one core each on the 2-core machine), so whatever else
loads the machine loads both alike; run one after the other, a shared machine's load
changed a 40-round run's wall time by up to 3x between two runs.

* ``event_writing_share``: the seconds a run with event files spent on them (importing the
  ``tensorboard`` package, opening the file, every round's scalars, the settings and trust
  texts, the outcome; measured inside the run around each of those calls and written into
  its event file as ``tensorboard/writing_s``) against that same run's wall time
  (``summary.json``'s ``wall_time_s``: its rounds); the median over the runs with event
  files. Aim: at most 2 %.
* ``wall_with_event_files``: the median over the pairs of the run's wall time with event
  files against the run without, of the same pair; aim: at most 1.02.
* ``cpu_with_event_files``: the same for the processes' CPU time (user + system, start-up
  included); no aim.

Default: 10 rounds, 1 pair (about 35 s with the warm-up pair on an idle 2-core machine).
``--full``: the whole default job (40 rounds), 3 pairs. ``--rounds`` and ``--repeats``
override both. Run directories and the data cache live in a temporary folder.

Usage::

    .venv/bin/python benchmarks/bench_tensorboard.py [--rounds R] [--repeats N] [--full] [--json]
"""

from __future__ import annotations

import argparse
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


def testbed_command() -> list[str]:
    """How a user starts ``testbed``: the console script beside this interpreter."""
    script = Path(sys.executable).parent / "testbed"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "testbed"]


def writing_seconds(run_dir: Path) -> float:
    """The run's own ``tensorboard/writing_s``, read back from its event files."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(run_dir / "tensorboard"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return float(acc.Scalars("tensorboard/writing_s")[-1].value)


def start_job(out: Path, rounds: int, env: dict[str, str], *, events: bool
              ) -> tuple[subprocess.Popen[bytes], Any]:
    """Start one default job into ``out`` (with or without event files); its process and
    its output file."""
    cmd = [*testbed_command(), "run", "--set", f"rounds={rounds}", "--out", str(out),
           "--no-report", "--no-progress"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, "TESTBED_TENSORBOARD": "1" if events
                                                else "0"},
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, log


def finish_job(proc: subprocess.Popen[bytes], log: Any, out: Path, *, events: bool
               ) -> dict[str, Any]:
    """Wait for a job of :func:`start_job`: its wall time (``summary.json``), its process's
    CPU time and, with ``events``, the seconds it spent on event files."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args!r}: exit {proc.returncode}\n{text[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    if (out / "tensorboard").is_dir() != events:
        raise RuntimeError(f"{out}: event files {'missing' if events else 'written'}")
    return {"wall_s": float(summary["wall_time_s"]), "cpu_s": usage.ru_utime + usage.ru_stime,
            "writing_s": writing_seconds(out) if events else None}


def run_pair(folder: Path, rounds: int, env: dict[str, str]) -> tuple[dict[str, Any],
                                                                       dict[str, Any]]:
    """The job with and without event files at the same time; their results."""
    on = start_job(folder / "on", rounds, env, events=True)
    off = start_job(folder / "off", rounds, env, events=False)
    return (finish_job(*on, folder / "on", events=True),
            finish_job(*off, folder / "off", events=False))


def _median_pair(ratios: list[float]) -> int:
    """The index of the median ratio (the lower middle one of an even count)."""
    return ratios.index(statistics.median_low(ratios))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of each run (default 10, with --full 40: the whole job)")
    p.add_argument("--repeats", type=int, default=None,
                   help="pairs of runs with and without event files (default 1, with --full 3)")
    p.add_argument("--full", action="store_true", help="the whole default job")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    rounds = args.rounds or (40 if args.full else 10)
    repeats = args.repeats or (3 if args.full else 1)
    if rounds < 1 or repeats < 1:
        p.error("need --rounds >= 1 and --repeats >= 1")
    with_files: list[dict[str, Any]] = []
    without: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_tensorboard_") as tmp:
        env = {**os.environ, "TESTBED_CACHE_DIR": str(Path(tmp) / "cache")}
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
        print("warm-up pair (data cache)", file=sys.stderr)
        run_pair(Path(tmp) / "warm", 1, env)
        for k in range(repeats):
            print(f"pair {k + 1}/{repeats}", file=sys.stderr)
            pair_on, pair_off = run_pair(Path(tmp) / f"pair{k}", rounds, env)
            with_files.append(pair_on)
            without.append(pair_off)
    shares = [r["writing_s"] / r["wall_s"] for r in with_files]
    k = shares.index(statistics.median_low(shares))
    on = [r["wall_s"] for r in with_files]
    off = [r["wall_s"] for r in without]
    cpu_on = [r["cpu_s"] for r in with_files]
    cpu_off = [r["cpu_s"] for r in without]
    wall_k = _median_pair([a / b for a, b in zip(on, off, strict=True)])
    cpu_k = _median_pair([a / b for a, b in zip(cpu_on, cpu_off, strict=True)])
    note = (f"default job, {rounds} rounds, {repeats} pairs run side by side; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    figures: list[Figure] = [
        figure("event_writing_share", with_files[k]["writing_s"], with_files[k]["wall_s"], "s",
               better="lower", aim=0.02, baseline_name="the same run's wall time",
               note=f"seconds spent on event files inside the run (median share: "
                    f"{statistics.median(shares):.2%}); {note}"),
        figure("wall_with_event_files", on[wall_k], off[wall_k], "s", better="lower",
               aim=1.02, baseline_name="the same job without event files, beside it",
               note=f"with: {', '.join(f'{x:.1f}' for x in on)} s; without: "
                    f"{', '.join(f'{x:.1f}' for x in off)} s (the median pair's ratio); "
                    f"{note}"),
        figure("cpu_with_event_files", cpu_on[cpu_k], cpu_off[cpu_k], "s", better="lower",
               baseline_name="the same job without event files, beside it",
               note=f"CPU time of the whole process (start-up included); with: "
                    f"{', '.join(f'{x:.1f}' for x in cpu_on)} s; without: "
                    f"{', '.join(f'{x:.1f}' for x in cpu_off)} s (the median pair's ratio); "
                    f"{note}"),
    ]
    result: dict[str, Any] = {
        "rounds": rounds, "repeats": repeats, "with_event_files": with_files,
        "without_event_files": without, "loadavg": os.getloadavg(),
        "figures": [f.to_json() for f in figures],
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("tensorboard", f, "ok") for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
