#!/usr/bin/env python3
"""Round cost and memory of large device populations.

Every configuration is a run of the same job (multinomial logistic regression on
Fashion-MNIST, IID split, no DP, the in-process symbol link, ``--steps`` local steps of
batch 8, no per-round subset evaluation) in **its own child process**, which reports its
metrics and its peak resident memory (``ru_maxrss`` of itself, and of its own children when
it trains in worker processes). The cost of a round is its wall time without the test-set
evaluation and without keeping the uploads durably (``wall_s.round - wall_s.eval -
wall_s.keep``), the least over the rounds after the first (the first also makes the devices'
state); the first round's cost is reported beside it. ``keep`` (each upload written to
``inflight/``, made durable by one fsync per batch of uploads and one per round:
:mod:`testbed.core.runs.inflight`) is left out of the ratio figures because its fsyncs wait for
the disk, which other work on a shared machine slows; it is reported per upload in the
output (``keep_per_upload_s``) and counted in ``per_device_1000_abs``. The compared
configurations run next to each other.

Figures (baselines measured in the same run, the configurations run one after another):

* ``per_device_100``, ``per_device_1000``: cost per device of a round with every one of 100
  (1,000) devices uploading / the same with 10 devices; aim <= 1.5 (a round costs in
  proportion to its devices).
* ``per_device_1000_abs``: the whole cost per device of a round of 1,000 devices with the
  default settings, keeping the uploads included (``wall_s.round - wall_s.eval``) / the same
  with the devices trained one after another; aim: at most 1 ms. The devices' own local
  training (``wall_s.train``) is part of it: ``compute.batch_devices: auto`` (the default)
  trains these logreg devices 250 at a time, the same model bit for bit as one at a time.
* ``per_device_1000_abs_one_at_a_time``: the same with ``compute.batch_devices: 1`` / the
  same with 10 devices; no aim.
* ``per_device_1000_aggregator``: the same without the devices' local training (what the
  aggregator spends per device: gate, link, decode, keep, the round's bookkeeping) / the
  same with 10 devices; no aim.
* ``sampled_10000``: a round of 10,000 devices with ``sample_devices: 100`` / a round of
  100 devices without sampling; aim <= 1.5 (a round costs in proportion to the devices
  asked, not to the population).
* ``rss_10000``: peak resident memory (MiB) of the 10,000-device run / the 100-device run's;
  aim: at most 4096 MiB.

``--full`` adds 10,000 devices sampling 1,000 per round (against 1,000 unsampled) and the
sampled run with 2 training workers. Usage::

    .venv/bin/python benchmarks/bench_population.py [--rounds 3] [--steps 5] [--full] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.bench_figures import Figure, figure, format_table

BASE = ["model=logreg", "partition=iid", "batch_size=8", "eval_subset=null",
        "eval_every=1000000", "name=bench-population"]


def child(devices: int, sample: int | None, rounds: int, steps: int, workers: int,
          batch: int = 1) -> int:
    """One configuration, in this (child) process: prints one JSON line. ``batch`` 0: the
    default ``compute.batch_devices`` (``auto``)."""
    from testbed.core.config.loader import load_experiment
    from testbed.core.runs.rundir import read_jsonl
    from testbed.runner import run_experiment

    sets = [*BASE, f"devices={devices}", f"rounds={rounds}", f"local_steps={steps}",
            f"workers={workers}", f"compute.batch_devices={batch or 'auto'}"]
    if sample is not None:
        sets.append(f"sample_devices={sample}")
    t0 = time.perf_counter()
    cfg = load_experiment(None, sets)
    with tempfile.TemporaryDirectory(prefix="bench_population_") as tmp:
        summary = run_experiment(cfg, Path(tmp) / "run")
        lines = read_jsonl(Path(tmp) / "run" / "metrics.jsonl")
    if summary["status"] != "completed":
        raise RuntimeError(f"{sets}: {summary['status']}: {summary['reason']}")
    costs = [m["wall_s"]["round"] - m["wall_s"].get("eval", 0.0) - m["wall_s"].get("keep", 0.0)
             for m in lines]
    whole = [m["wall_s"]["round"] - m["wall_s"].get("eval", 0.0) for m in lines]
    # this process's time in the devices' training: its own, or its wait for the workers
    training = [m["wall_s"].get("train_wait", m["wall_s"].get("train", 0.0)) if workers > 1
                else m["wall_s"].get("train", 0.0) for m in lines]
    asked = sample if sample is not None else devices
    print(json.dumps({
        "devices": devices, "sample_devices": sample, "asked": asked, "workers": workers,
        "batch_devices": summary["batch_devices"],
        "round_costs_s": costs, "whole_round_costs_s": whole,
        "aggregator_round_costs_s": [w - tr for w, tr in zip(whole, training, strict=True)],
        "stages": [m["wall_s"] for m in lines],
        "entries_per_line": [len(m["devices"]) for m in lines],
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "workers_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }))
    return 0


def measure(devices: int, sample: int | None, rounds: int, steps: int,
            workers: int = 1, batch: int = 1) -> dict[str, Any]:
    """Run one configuration in a child process; its JSON with the steady round cost."""
    cmd = [sys.executable, __file__, "--child", str(devices), str(sample or 0), str(rounds),
           str(steps), str(workers), str(batch)]
    label = f"{devices} devices" + (f", {sample} asked" if sample else "") + (
        f", {workers} workers" if workers > 1 else "") + (
        f", trained {batch} at a time" if batch > 1 else "") + (
        ", the default compute.batch_devices (auto)" if batch == 0 else "")
    print(f"{label} ...", file=sys.stderr)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             p for p in (str(Path(__file__).resolve().parents[1]),
                                         os.environ.get("PYTHONPATH", "")) if p)})
    if out.returncode != 0:
        raise RuntimeError(f"{label}: exit {out.returncode}\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["round_cost_s"] = min(res["round_costs_s"][1:])
    keeps = [st.get("keep", 0.0) / res["asked"] for st in res["stages"]]
    res["keep_per_upload_s"] = sum(keeps) / len(keeps)
    res["first_round_cost_s"] = res["round_costs_s"][0]
    res["per_device_s"] = res["round_cost_s"] / res["asked"]
    res["whole_per_device_s"] = min(res["whole_round_costs_s"][1:]) / res["asked"]
    res["aggregator_per_device_s"] = min(res["aggregator_round_costs_s"][1:]) / res["asked"]
    return res


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        d, s, r, h, w, b = (int(x) for x in sys.argv[2:8])
        return child(d, s or None, r, h, w, b)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds per configuration (default 3, with --full 5); >= 2")
    p.add_argument("--steps", type=int, default=5, help="H, local steps per round")
    p.add_argument("--full", action="store_true", help="the large sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    rounds = args.rounds or (5 if args.full else 3)
    if rounds < 2 or args.steps < 1:
        p.error("need --rounds >= 2 and --steps >= 1")
    runs = {
        "10": measure(10, None, rounds, args.steps),
        "100": measure(100, None, rounds, args.steps),
        "10000/100": measure(10000, 100, rounds, args.steps),
        "1000": measure(1000, None, rounds, args.steps),
        "1000 default": measure(1000, None, rounds, args.steps, batch=0),
    }
    if args.full:
        runs["10000/1000"] = measure(10000, 1000, rounds, args.steps)
        runs["10000/100 workers=2"] = measure(10000, 100, rounds, args.steps, workers=2)
    base = runs["10"]["per_device_s"]
    note = (f"logreg, H = {args.steps}, {rounds} rounds (cost: least round after the first); load "
            f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    figures: list[Figure] = [
        figure(f"per_device_{n}", runs[n]["per_device_s"], base, "s", better="lower", aim=1.5,
               baseline_name="cost per device of a round of 10 devices",
               note=f"{n} devices, all uploading; {note}")
        for n in ("100", "1000")
    ]
    figures.append(figure(
        "per_device_1000_abs", runs["1000 default"]["whole_per_device_s"],
        runs["1000"]["whole_per_device_s"], "s", better="lower", aim_value=0.001,
        baseline_name="the same one device at a time",
        note=f"1,000 devices, default settings (compute.batch_devices auto: trained "
             f"{runs['1000 default']['batch_devices']} at a time, the same model bit for bit "
             f"for logreg), keeping the uploads and the devices' local training included; "
             f"{note}"))
    figures.append(figure(
        "per_device_1000_abs_one_at_a_time", runs["1000"]["whole_per_device_s"],
        runs["10"]["whole_per_device_s"], "s", better="lower",
        baseline_name="the same with 10 devices",
        note=f"1,000 devices trained one after another (compute.batch_devices 1), keeping the "
             f"uploads and the devices' local training included; {note}"))
    figures.append(figure(
        "per_device_1000_aggregator", runs["1000"]["aggregator_per_device_s"],
        runs["10"]["aggregator_per_device_s"], "s", better="lower",
        baseline_name="the same with 10 devices",
        note=f"1,000 devices, keeping the uploads included, local training not; {note}"))
    figures.append(figure(
        "sampled_10000", runs["10000/100"]["round_cost_s"], runs["100"]["round_cost_s"], "s",
        better="lower", aim=1.5, baseline_name="round of 100 devices, no sampling",
        note=f"10,000 devices, sample_devices 100; {note}"))
    if args.full:
        figures.append(figure(
            "sampled_10000_1000", runs["10000/1000"]["round_cost_s"],
            runs["1000"]["round_cost_s"], "s", better="lower", aim=1.5,
            baseline_name="round of 1,000 devices, no sampling",
            note=f"10,000 devices, sample_devices 1000; {note}"))
        figures.append(figure(
            "sampled_10000_2_workers", runs["10000/100 workers=2"]["round_cost_s"],
            runs["10000/100"]["round_cost_s"], "s", better="lower",
            baseline_name="the same sampled round with workers=1",
            note=f"10,000 devices, sample_devices 100, workers=2; {note}"))
    figures.append(figure(
        "rss_10000", runs["10000/100"]["peak_rss_mib"], runs["100"]["peak_rss_mib"], "MiB",
        better="lower", aim_value=4096.0, baseline_name="peak RSS of the 100-device run",
        note="10,000 devices, sample_devices 100; the child process's ru_maxrss"))
    result: dict[str, Any] = {"rounds": rounds, "steps": args.steps, "runs": runs,
              "figures": [f.to_json() for f in figures]}
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("population", f, "ok") for f in figures]))
        for name, run in runs.items():
            print(f"{name:22s} round {run['round_cost_s']:.3f} s (first "
                  f"{run['first_round_cost_s']:.3f} s), per device "
                  f"{1e3 * run['per_device_s']:.2f} ms (with keep "
                  f"{1e3 * run['whole_per_device_s']:.2f} ms, without training "
                  f"{1e3 * run['aggregator_per_device_s']:.2f} ms), peak RSS "
                  f"{run['peak_rss_mib']:.0f} MiB, "
                  f"entries per line {run['entries_per_line'][0]}, keep "
                  f"{1e3 * run['keep_per_upload_s']:.1f} ms per upload")
    return 0


if __name__ == "__main__":
    sys.exit(main())
