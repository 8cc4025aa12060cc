#!/usr/bin/env python3
"""Over-the-air aggregation against TDMA on the same job: air time, radio energy, accuracy.

Runs, in this process and one after the other, the shipped ``aircomp-fedsgd.yaml`` (every
device in one slot, each adding its share of the noise) and the shipped
``private-fedsgd.yaml`` as ``ldp-fedavg`` (one TDMA slot per device, each with the noise
that protects it alone), both at ``--epsilon`` (record unit, PLD, delta 1e-5, 10 devices,
the symbol link at 20 dB). Figures, each against its baseline from the same run:

* ``aircomp_airtime``: aircomp's air time per round (its one slot, values and probe) /
  the TDMA slots the same uploads need (``aircomp.tdma_airtime_s``); aim <= 0.15 (one slot
  instead of ten, with the probe's overhead).
* ``aircomp_energy``: aircomp's radio energy per round (all devices) / ldp-fedavg's per
  round; no aim (aircomp pre-equalizes every device to the weakest one's full-power reach;
  ``testbed plan --scheme aircomp`` lowers it).
* ``aircomp_accuracy`` (``--full`` only: 900 aircomp rounds, 160 ldp-fedavg rounds, the
  shipped settings): final test accuracy / ldp-fedavg's, aim >= 1 (central DP-SGD:
  ``bench_central_dpsgd.py --full``).

Default: 5 rounds of each (the air time and energy figures do not depend on the rounds).

Usage::

    .venv/bin/python benchmarks/bench_aircomp.py [--epsilon 5] [--rounds N] [--full] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.bench_figures import figure, format_table
from testbed.core.config.loader import load_experiment
from testbed.runner import run_experiment

CONFIGS = Path(__file__).resolve().parents[1] / "testbed" / "config"


def _run(config: str, sets: list[str], out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cfg = load_experiment(CONFIGS / config, sets)
    summary = run_experiment(cfg, out)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, lines


def _energy_per_round(summary: dict[str, Any]) -> float:
    return sum(summary["energy_comm_j_per_device"]) / max(1, summary["rounds_completed"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=None, help="rounds of each run (default 5)")
    p.add_argument("--full", action="store_true", help="the shipped rounds; accuracy figure")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    eps = f"privacy.epsilon={args.epsilon!r}"
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        air_sets = [eps] if args.full else [eps, f"rounds={args.rounds or 5}", "eval_every=1000"]
        tdma_sets = ([eps, "scheme=ldp-fedavg"] if args.full else
                     [eps, "scheme=ldp-fedavg", f"rounds={args.rounds or 5}", "eval_every=1000"])
        air, air_lines = _run("aircomp-fedsgd.yaml", air_sets, Path(tmp) / "aircomp")
        tdma, _ = _run("private-fedsgd.yaml", tdma_sets, Path(tmp) / "tdma")
        wall = time.perf_counter() - t0
    slots = [ln["aircomp"] for ln in air_lines if ln.get("aircomp")]
    slot_s = sum(a["airtime_s"] for a in slots) / len(slots)
    tdma_s = sum(a["tdma_airtime_s"] for a in slots) / len(slots)
    figures = [
        figure("aircomp_airtime", slot_s, tdma_s, "s", better="lower", aim=0.15,
               baseline_name="TDMA slots for the same uploads",
               note=f"{slots[0]['participants']} devices; the slot carries a 256-symbol probe"),
        figure("aircomp_energy", _energy_per_round(air), _energy_per_round(tdma), "J",
               better="lower", baseline_name="ldp-fedavg radio energy per round",
               note="aircomp at full power (no plan); all devices, per round"),
    ]
    if args.full:
        figures.append(figure(
            "aircomp_accuracy", float(air["final_accuracy"]), float(tdma["final_accuracy"]),
            "fraction", better="higher", aim=1.0,
            baseline_name="ldp-fedavg final test accuracy (shipped 160 rounds)",
            note=f"epsilon {args.epsilon:g}, record unit, PLD, delta 1e-5; central DP-SGD: "
                 "bench_central_dpsgd.py --full"))
    out = {"epsilon": args.epsilon, "wall_s": wall,
           "aircomp_status": air["status"], "tdma_status": tdma["status"],
           "figures": [f.to_json() for f in figures]}
    if args.json:
        print(json.dumps(out))
    else:
        print(format_table([("aircomp", f, "ok") for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
