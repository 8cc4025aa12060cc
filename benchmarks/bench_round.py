#!/usr/bin/env python3
"""Round time of the default job against its sequential training floor.

Runs the default job (``testbed/config/default.yaml``: 10 devices, Fashion-MNIST, the MNIST
CNN, H = 20 local steps, the in-process symbol link, no DP) for ``--rounds`` rounds, once
with ``workers=1`` and once with ``workers=2``, alternating the two ``--repeats`` times so
that a busy machine slows both alike. Both evaluate the fixed test subset
(``eval_subset``, default 500 samples) every round and the full test set in the last.

The baseline of every figure is the **sequential training floor** of a round: the summed
wall time of the devices' local training (``wall_s.train``) in the ``workers=1`` run, i.e.
what one core needs to train the round's devices one after another. Rounds are compared
with the floor of the same round index in the ``workers=1`` run of the same repeat (the
first round, which warms caches up, and the last, which evaluates the full set, are left
out); each figure is the median over those rounds and repeats.

* ``round_subset_eval``: a sequential round (training, encoding, link, decoding, keeping
  the upload, aggregation and the subset evaluation) / floor; aim <= 1.10.
* ``round_default_job``: the same plus the full-set evaluation spread over
  ``eval_every`` rounds (its cost measured in the last round) / floor; aim <= 1/0.9, i.e. a
  non-training share below 10 %.
* ``round_2_workers``: a round with 2 training workers / floor; aim <= 0.65.

Usage::

    .venv/bin/python benchmarks/bench_round.py [--rounds 5] [--repeats 1] [--full] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from testbed.bench_figures import Figure, figure, format_table
from testbed.core.config.loader import load_experiment
from testbed.core.runs.rundir import read_jsonl
from testbed.runner import run_experiment


def run_once(workers: int, rounds: int, out: Path, extra: list[str]) -> list[dict[str, Any]]:
    """Run the default job with ``workers`` into ``out``; returns its metrics lines."""
    cfg = load_experiment(None, [f"rounds={rounds}", f"workers={workers}", *extra])
    summary = run_experiment(cfg, out)
    if summary["status"] != "completed":
        raise RuntimeError(f"workers={workers}: {summary['status']}: {summary['reason']}")
    return read_jsonl(out / "metrics.jsonl")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds per run (default 5, with --full 12); >= 3")
    p.add_argument("--repeats", type=int, default=None,
                   help="alternating pairs of runs (default 1, with --full 2)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config overrides for both runs (e.g. model=logreg)")
    p.add_argument("--full", action="store_true", help="the large sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    rounds = args.rounds or (12 if args.full else 5)
    repeats = args.repeats or (2 if args.full else 1)
    if rounds < 3 or repeats < 1:
        p.error("need --rounds >= 3 and --repeats >= 1")
    seq_ratio, job_ratio, par_ratio, floors = [], [], [], []
    raw: list[dict[str, Any]] = []
    eval_every = load_experiment(None, args.overrides).eval_every
    with tempfile.TemporaryDirectory(prefix="bench_round_") as tmp:
        for rep in range(repeats):
            lines = {}
            for workers in (1, 2) if rep % 2 == 0 else (2, 1):
                print(f"repeat {rep + 1}/{repeats}: workers={workers}, {rounds} rounds",
                      file=sys.stderr)
                lines[workers] = run_once(workers, rounds, Path(tmp) / f"r{rep}w{workers}",
                                          args.overrides)
            seq, par = lines[1], lines[2]
            full_eval = seq[-1]["wall_s"].get("eval", 0.0)
            for t in range(1, rounds - 1):
                floor = seq[t]["wall_s"]["train"]
                floors.append(floor)
                seq_ratio.append(seq[t]["wall_s"]["round"] / floor)
                job_ratio.append((seq[t]["wall_s"]["round"] + full_eval / eval_every) / floor)
                par_ratio.append(par[t]["wall_s"]["round"] / floor)
            raw.append({"workers_1": [m["wall_s"] for m in seq],
                        "workers_2": [m["wall_s"] for m in par]})
    floor = statistics.median(floors)
    note = (f"default job, {rounds} rounds x {repeats}, median of rounds 1..{rounds - 2}; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    figures: list[Figure] = [
        figure("round_subset_eval", statistics.median(seq_ratio) * floor, floor, "s",
               better="lower", aim=1.10, baseline_name="sequential training floor of a round",
               note=f"workers=1, subset evaluation; {note}"),
        figure("round_default_job", statistics.median(job_ratio) * floor, floor, "s",
               better="lower", aim=1 / 0.9, baseline_name="sequential training floor of a round",
               note=f"workers=1, plus the full evaluation / eval_every={eval_every}; {note}"),
        figure("round_2_workers", statistics.median(par_ratio) * floor, floor, "s",
               better="lower", aim=0.65, baseline_name="sequential training floor of a round",
               note=f"workers=2, subset evaluation; {note}"),
    ]
    result = {"rounds": rounds, "repeats": repeats, "overrides": args.overrides,
              "eval_every": eval_every, "loadavg": os.getloadavg(), "runs": raw,
              "figures": [f.to_json() for f in figures]}
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("round", f, "ok") for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
