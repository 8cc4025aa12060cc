"""Energy each run spent to reach a target training loss (003 Fig. 3), from run directories.

Reads ``metrics.jsonl`` and ``summary.json`` of each run and applies the runner's own
definition (:func:`aggregator.summary.loss_target_energy`: the first round whose training loss,
averaged over the last ``--window`` rounds, is at or below the target; energy = computing
plus radio of every device up to and including that round). The first run is the baseline;
the ratio column is baseline energy / run energy (> 1: the run needed less).

    python benchmarks/energy_to_target.py RUN_LDP RUN_EE RUN_SDP RUN_CH --target 0.8

A run that never reached the target is reported with the energy it spent in all (a lower
bound on its energy to target) and no ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from aggregator.summary import loss_target_energy


def run_row(run: Path, targets: list[float], window: int, part: str = "total") -> dict[str, Any]:
    """Energy-to-target figures of one run directory.

    ``part``: ``"total"`` (computing plus radio), ``"radio"`` or ``"computing"`` only.
    """
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    if part != "total":
        drop = "energy_comp_j" if part == "radio" else "energy_comm_j"
        metrics = [
            {**m, "devices": [{**d, drop: 0.0} for d in m.get("devices", [])]} for m in metrics
        ]
    summary = json.loads((run / "summary.json").read_text())
    spent = sum(
        d.get("energy_comm_j", 0.0) + d.get("energy_comp_j", 0.0)
        for m in metrics for d in m.get("devices", [])
    )
    sources = sorted({str(d.get("energy_comp_source", "modelled (configured e_comp_j)"))
                      for m in metrics for d in m.get("devices", [])})
    priv = summary.get("privacy") or {}
    eps = [d.get("epsilon") for d in priv.get("devices", []) if d.get("epsilon") is not None]
    return {
        "run": str(run),
        "scheme": summary.get("scheme"),
        "epsilon_target": priv.get("epsilon_target"),
        "epsilon_spent_max": max(eps) if eps else None,
        "accounting": priv.get("enforced_accounting"),
        "rounds": summary.get("rounds_completed"),
        "final_accuracy": summary.get("final_accuracy"),
        "energy_total_j": spent,
        "energy_comp_source": sources,
        "targets": loss_target_energy(metrics, targets, window),
    }


def main(argv: list[str] | None = None) -> int:
    """Print one line per run and target (or JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories; the first is the baseline")
    p.add_argument("--target", type=float, nargs="+", required=True, help="training losses")
    p.add_argument("--window", type=int, default=5, help="trailing mean over rounds (default 5)")
    p.add_argument("--part", choices=["total", "radio", "computing"], default="total",
                   help="which energy to count (default total = computing + radio)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.window < 1:
        p.error(f"--window: got {args.window}; allowed: an integer >= 1")
    for run in args.runs:
        if not (run / "metrics.jsonl").is_file() or not (run / "summary.json").is_file():
            p.error(f"run directory '{run}': needs metrics.jsonl and summary.json")
    rows = [run_row(r, args.target, args.window, args.part) for r in args.runs]
    base = rows[0]["targets"]
    for row in rows:
        for t, b in zip(row["targets"], base, strict=True):
            t["ratio_vs_baseline"] = (
                b["energy_j"] / t["energy_j"] if t["energy_j"] and b["energy_j"] else None
            )
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"window {args.window} rounds; energy = {args.part}, all devices; "
          f"baseline {rows[0]['run']}")
    print(f"{'scheme':<12} {'eps':>5} {'spent':>6} {'rounds':>6} {'acc':>7} {'target':>7} "
          f"{'round':>6} {'energy_J':>10} {'ratio':>6}  run")
    for row in rows:
        for t in row["targets"]:
            reached = t["round"] is not None
            energy = f"{t['energy_j']:10.4g}" if reached else f">{row['energy_total_j']:9.4g}"
            ratio = f"{t['ratio_vs_baseline']:6.2f}" if t["ratio_vs_baseline"] else "     -"
            acc = row["final_accuracy"]
            spent = row["epsilon_spent_max"]
            print(f"{row['scheme']:<12} {row['epsilon_target'] or 0:5.3g} "
                  f"{spent if spent is not None else float('nan'):6.3g} {row['rounds']:>6} "
                  f"{acc if acc is not None else float('nan'):7.4f} {t['target']:7.3g} "
                  f"{t['round'] if reached else 'never':>6} {energy} {ratio}  {row['run']}")
    print(f"computing energy source: {sorted({s for r in rows for s in r['energy_comp_source']})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
