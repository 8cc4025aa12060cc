#!/usr/bin/env python3
"""How many virtual radios one host carries: the virtual lab at 4, 10 and 20 devices.

For each size N, ``testbed launch`` runs the lab tests' record-level channel-dp job
(``private-fedsgd.yaml``, 500 samples per device, Poisson batches of 64) on a copy of
``hw_configs/virtual_lab.yaml`` with N virtual USRPs (free-running clocks, every path at
116 dB: Es/N0 20 dB), one TDMA slot per device. While it runs, every process launch started is
sampled from ``/proc`` (its CPU seconds, kept at the last look before it exits) and sorted by
role: the air, the ``rx`` flowgraph, the ``tx`` flowgraphs, the edges, the aggregator.

Figures, per N (``--json``: one JSON object on the last stdout line):

* ``air_cpu_per_air_s_N``: the air process's CPU seconds per second of air it rendered (its
  wall time from start to stop: it renders in real time), baseline 1 (one core kept busy):
  the air keeps up while this is well under 1;
* ``flowgraphs_cpu_per_air_s_N``: the ``rx`` and N ``tx`` flowgraphs' CPU seconds per second
  of air, baseline 1;
* ``round_s_N``: the median lab round (rounds 1..R-1, wall s), baseline the air time of the
  round's N slots (what the radios alone need).

Usage::

    .venv/bin/python benchmarks/bench_virtual_scale.py [--devices 4 10 20] [--rounds 3]
        [--full] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.bench_figures import Figure, figure, format_table
from testbed.core.runs.rundir import read_jsonl
from testbed.lab.launch import launch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "testbed" / "config" / "private-fedsgd.yaml")
HW = ROOT / "hw_configs" / "virtual_lab.yaml"
ROLES = ("air", "rx", "tx", "edge", "aggregator")


def scaled_hw(n: int, path: Path) -> Path:
    """``virtual_lab.yaml`` with ``n`` virtual devices (clock offsets and drift spread as the
    shipped four's), each path at 116 dB; written to ``path``."""
    data = yaml.safe_load(HW.read_text())
    data["name"] = f"virtual_lab_{n}"
    data["usrp"]["devices"] = [
        {"device": i, "tx_gain_db": 30.0, "max_tx_power_w": 0.1,
         "tx_args": f"type=virtual,serial=edge{i},clock_offset_s={1.5 * (i % 5) - 3:g},"
                    f"drift_ppm={(i % 7) - 3:g}"} for i in range(n)]
    data["virtual_air"]["paths"] = [data["virtual_air"]["paths"][0]] + [
        {"serial": f"edge{i}", "attenuation_db": 116.0, "cfo_hz": 100.0 * ((i % 9) - 4),
         "delay_samples": 0.37 * (i % 4)} for i in range(n)]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def role_of(cmdline: str) -> str | None:
    """The lab role of a process from its command line (``None``: not one of ours)."""
    if "flowgraphs/rx.py" in cmdline:
        return "rx"
    if "flowgraphs/tx.py" in cmdline:
        return "tx"
    for role in ("air", "edge", "aggregator"):
        if f"testbed {role} " in cmdline:
            return role
    return None


class CpuSampler(threading.Thread):
    """Samples the CPU seconds and lifetime of this process's descendants by role."""

    def __init__(self, root_pid: int, period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root_pid, self.period_s = root_pid, period_s
        self.stop_event = threading.Event()
        #: pid -> (role, cpu seconds, first seen (monotonic s), last seen (monotonic s))
        self.seen: dict[int, tuple[str, float, float, float]] = {}
        self.ticks = os.sysconf("SC_CLK_TCK")

    def _children(self) -> dict[int, int]:
        parents: dict[int, int] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                    parents[int(name)] = int(stat[1])
                except (OSError, IndexError, ValueError):
                    continue
        return parents

    def _look(self) -> None:
        parents = self._children()
        ours = {self.root_pid}
        grew = True
        while grew:
            grew = False
            for pid, ppid in parents.items():
                if ppid in ours and pid not in ours:
                    ours.add(pid)
                    grew = True
        now = time.monotonic()
        for pid in ours - {self.root_pid}:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            role = role_of(cmd)
            if role is None:
                continue
            cpu = (int(stat[11]) + int(stat[12])) / self.ticks
            first = self.seen.get(pid, (role, 0.0, now, now))[2]
            self.seen[pid] = (role, cpu, first, now)

    def run(self) -> None:
        while not self.stop_event.wait(self.period_s):
            self._look()

    def by_role(self) -> dict[str, dict[str, float]]:
        """Per role: processes, CPU seconds, and the longest lifetime seen (s)."""
        out = {r: {"processes": 0.0, "cpu_s": 0.0, "alive_s": 0.0} for r in ROLES}
        for role, cpu, first, last in self.seen.values():
            out[role]["processes"] += 1
            out[role]["cpu_s"] += cpu
            out[role]["alive_s"] = max(out[role]["alive_s"], last - first)
        return out


def one_size(n: int, rounds: int, tmp: Path) -> dict[str, Any]:
    """Launch the job with ``n`` virtual radios; its CPU by role and its rounds."""
    hw = scaled_hw(n, tmp / f"hw-{n}.yaml")
    out = tmp / f"lab-{n}"
    sampler = CpuSampler(os.getpid())
    sampler.start()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            code = launch(CONFIG, n, out, overrides=[
                f"train_samples={500 * n}", "eval_samples=300", "batch_size=64",
                "scheme=channel-dp", "eval_every=100", "privacy.trusted_channel_noise=1",
                f"rounds={rounds}"], hw_overrides=[], hw_config=str(hw), round_timeout_s=180,
                join_timeout_s=300, train_allowance_s=20.0, progress=False)
    finally:
        sampler.stop_event.set()
        sampler.join()
    if code != 0:
        raise RuntimeError(f"{n} virtual radios: launch exit {code}; logs in {out / 'logs'}")
    metrics = read_jsonl(out / "aggregator" / "metrics.jsonl")
    airtime = statistics.median(
        sum(d.get("airtime_s", 0.0) for d in m["devices"]) for m in metrics[1:])
    return {"devices": n, "roles": sampler.by_role(),
            "round_s": statistics.median(m["wall_s"]["round"] for m in metrics[1:]),
            "slots_airtime_s": airtime}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, nargs="+", default=[4, 10, 20],
                   help="lab sizes (default 4 10 20)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds per run (>= 2; default 3, with --full 6)")
    p.add_argument("--full", action="store_true", help="the longer runs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (6 if args.full else 3)
    if args.rounds < 2 or any(n < 1 or n > 64 for n in args.devices):
        p.error("need --rounds >= 2 and every --devices in [1, 64]")
    results, figures = [], []
    load = lambda: f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench_virtual_scale_") as tmp:
        for n in args.devices:
            print(f"{n} virtual radios, {args.rounds} rounds", file=sys.stderr)
            r = one_size(n, args.rounds, Path(tmp))
            results.append(r)
            roles = r["roles"]
            air_s = max(roles["air"]["alive_s"], 1e-9)
            fg_cpu = roles["rx"]["cpu_s"] + roles["tx"]["cpu_s"]
            split = ", ".join(f"{k} {v['cpu_s']:.1f} s" for k, v in roles.items())
            figures += [
                figure(f"air_cpu_per_air_s_{n}", roles["air"]["cpu_s"] / air_s, 1.0,
                       "CPU s per s of air", better="lower", aim=1.0 if n == 10 else None,
                       baseline_name="one core kept busy",
                       note=f"{air_s:.0f} s of air; CPU by role: {split}; {load()}"),
                figure(f"flowgraphs_cpu_per_air_s_{n}", fg_cpu / air_s, 1.0,
                       "CPU s per s of air", better="lower",
                       baseline_name="one core kept busy",
                       note=f"rx and {n} tx flowgraphs over {air_s:.0f} s"),
                figure(f"round_s_{n}", r["round_s"], max(r["slots_airtime_s"], 1e-9), "s",
                       better="lower", baseline_name="the round's slots' air time",
                       note=f"median of rounds 1..{args.rounds - 1}; {load()}"),
            ]
    fig_list: list[Figure] = figures
    if args.json:
        print(json.dumps({"results": results, "figures": [f.to_json() for f in fig_list]},
                         sort_keys=True))
    else:
        print(format_table([("virtual_scale", f, "ok") for f in fig_list]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
