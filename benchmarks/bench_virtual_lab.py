#!/usr/bin/env python3
"""A virtual-lab round against the in-process round on the same settings.

Runs a small record-level channel-dp job (the lab tests' settings: ``private-fedsgd.yaml``,
4 devices of 2000 samples, Poisson batches of 256, the MNIST CNN) twice, alternating
``--repeats`` times so that a busy machine slows both alike:

* **virtual lab**: ``testbed launch ... --hw hw_configs/virtual_lab.yaml``: the virtual air,
  the aggregator with its ``rx`` flowgraph, 4 edges each with its ``tx`` flowgraph, every
  upload a timed burst in its TDMA slot, the slots set once every edge said
  ``upload_ready`` (``--train-allowance`` is only the deadline);
* **baseline**: ``testbed run`` in one process on the same hardware config with
  ``link=waveform`` (the same frames through the numpy emulator; no processes, no slots).

Figures (medians over rounds 1..R-1 and repeats):

* ``virtual_lab_round``: wall time of a lab round / the in-process round, aim <= 1.5; the
  note splits the lab round into training (the wait for every ``upload_ready``), the slots
  (the slot lead and the slots' air time, to the end of the last window), capture, decode
  and the rest;
* ``virtual_lab_cpu``: CPU seconds of all lab processes per round (air, flowgraphs, edges,
  aggregator) / the in-process run's per round.

Usage::

    .venv/bin/python benchmarks/bench_virtual_lab.py [--rounds 4] [--repeats 1]
        [--train-allowance 6] [--full] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from testbed.bench_figures import Figure, figure, format_table
from testbed.core.config.loader import load_experiment
from testbed.core.runs.rundir import read_jsonl
from testbed.lab.launch import launch
from testbed.runner import run_experiment

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "testbed" / "config" / "private-fedsgd.yaml")
HW = str(ROOT / "hw_configs" / "virtual_lab.yaml")
SETS = ["train_samples=8000", "eval_samples=300", "batch_size=256", "scheme=channel-dp",
        "eval_every=100", "privacy.trusted_channel_noise=1"]
DEVICES = 4


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def lab_run(out: Path, rounds: int, allowance: float) -> tuple[list[dict[str, Any]], float]:
    """The virtual lab; returns its metrics lines and the CPU seconds of all its processes."""
    before = _cpu_children()
    with contextlib.redirect_stdout(sys.stderr):  # launch's outcome lines: stdout is --json's
        code = launch(CONFIG, DEVICES, out, overrides=[*SETS, f"rounds={rounds}"],
                      hw_overrides=[], hw_config=HW, round_timeout_s=120,
                      join_timeout_s=180, train_allowance_s=allowance)
    if code != 0:
        raise RuntimeError(f"virtual lab run failed (exit {code}); logs in {out / 'logs'}")
    return read_jsonl(out / "aggregator" / "metrics.jsonl"), _cpu_children() - before


def in_process_run(out: Path, rounds: int) -> tuple[list[dict[str, Any]], float]:
    """The same job in one process (link waveform); its metrics and CPU seconds."""
    cfg = load_experiment(CONFIG, [*SETS, f"rounds={rounds}", f"devices={DEVICES}",
                                   f"hw_config={HW}", "link=waveform"])
    before = _cpu_self()
    with contextlib.redirect_stdout(sys.stderr):
        summary = run_experiment(cfg, out)
    if summary["status"] != "completed":
        raise RuntimeError(f"in-process run: {summary['status']}: {summary['reason']}")
    return read_jsonl(out / "metrics.jsonl"), _cpu_self() - before


def round_split(stages: dict[str, float]) -> dict[str, float]:
    """A lab round's wall time (s) by part, from its metrics line's ``wall_s``: ``train``
    (the wait for every ``upload_ready``), ``capture`` (reading the windows), ``decode``,
    ``slots`` (the rest of the capture call's wait: the slot lead and the slots' air time,
    ``slots`` in ``wall_s``) and ``rest`` (gate, settling, keeping, aggregation, evaluation
    and the control plane)."""
    total = stages.get("round", 0.0)
    parts = {k: stages.get(k, 0.0) for k in ("train", "slots", "capture", "decode")}
    return {**parts, "rest": max(0.0, total - sum(parts.values()))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds per run (default 4, with --full 8); >= 3")
    p.add_argument("--repeats", type=int, default=None,
                   help="alternating pairs of runs (default 1, with --full 2)")
    p.add_argument("--train-allowance", type=float, default=10.0,
                   help="deadline (s) for the edges' upload_ready (default 10)")
    p.add_argument("--full", action="store_true", help="the large sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    rounds = args.rounds or (8 if args.full else 4)
    repeats = args.repeats or (2 if args.full else 1)
    if rounds < 3 or repeats < 1:
        p.error("need --rounds >= 3 and --repeats >= 1")
    lab_rounds, base_rounds, lab_cpu, base_cpu = [], [], [], []
    split: dict[str, list[float]] = {"train": [], "slots": [], "capture": [], "decode": [],
                                     "rest": []}
    with tempfile.TemporaryDirectory(prefix="bench_virtual_lab_") as tmp:
        for rep in range(repeats):
            for kind in ("lab", "in-process") if rep % 2 == 0 else ("in-process", "lab"):
                print(f"repeat {rep + 1}/{repeats}: {kind}, {rounds} rounds", file=sys.stderr)
                out = Path(tmp) / f"{kind}-{rep}"
                if kind == "lab":
                    lines, cpu = lab_run(out, rounds, args.train_allowance)
                    lab_rounds += [m["wall_s"]["round"] for m in lines[1:]]
                    lab_cpu.append(cpu / rounds)
                    for m in lines[1:]:
                        for key, value in round_split(m["wall_s"]).items():
                            split[key].append(value)
                else:
                    lines, cpu = in_process_run(out, rounds)
                    base_rounds += [m["wall_s"]["round"] for m in lines[1:]]
                    base_cpu.append(cpu / rounds)
    lab_round, base_round = statistics.median(lab_rounds), statistics.median(base_rounds)
    parts = ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in split.items())
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    figures: list[Figure] = [
        figure("virtual_lab_round", lab_round, base_round, "s", better="lower", aim=1.5,
               baseline_name="in-process round, link waveform, same settings",
               note=f"{DEVICES} devices, {rounds} rounds x {repeats}; a lab round (medians): "
                    f"{parts}; {load}"),
        figure("virtual_lab_cpu", statistics.median(lab_cpu), statistics.median(base_cpu),
               "CPU s/round", better="lower",
               baseline_name="in-process run's CPU per round",
               note=f"all lab processes (air, 5 flowgraphs, 4 edges, aggregator) incl. "
                    f"start-up, over {rounds} rounds; {load}"),
    ]
    result = {"rounds": rounds, "repeats": repeats, "train_allowance_s": args.train_allowance,
              "lab_split_s": {k: statistics.median(v) for k, v in split.items()},
              "lab_rounds_s": lab_rounds, "in_process_rounds_s": base_rounds,
              "lab_cpu_s_per_round": lab_cpu, "in_process_cpu_s_per_round": base_cpu,
              "loadavg": os.getloadavg(), "figures": [f.to_json() for f in figures]}
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("virtual_lab", f, "ok") for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
