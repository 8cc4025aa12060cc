#!/usr/bin/env python3
"""Privacy accountant time per round across many devices, and ledger replay on resume.

Per round, every participating device does what the runner asks of its privacy book
(``PrivacyBook.allows``, ``commit``, ``epsilon``) without the ledger's file writes: the
budget check (the enforced accountant's ``epsilon_if``), the composition in every accountant
(``add``) and every accountant's epsilon. The accountants are the book's own
(``make_accountants``): record unit ``rdp`` and ``pld`` side by side (``rdp`` enforced),
device unit ``strict`` and ``paper`` (``strict`` enforced). Events are built outside the
timed part, a fresh object per device and round as the runner builds them.

Workloads (``--scenarios``):

* ``record-identical``: every device the same FedSGD step each round (q = 0.01, z = 1);
* ``record-classes``: four classes of devices (data sets of 3,000 to 24,000 records, so
  q = 0.02 to 0.0025, z = 1.1 to 0.8), each device the same step every round;
* ``record-sampled``: as ``record-identical``, each device taking part in a round with
  probability 1/2 (a seeded generator: a workload, not a privacy mechanism);
* ``device-identical``: every device the same device-level upload (sigma 20, l = d/10);
* ``device-fading``: device-level uploads with a Rayleigh gain per device and round, so no
  two devices share a history: what caching cannot help with, reported as measured;
* ``record-fading`` (not run by default: seconds per round at 1,000 devices): record-level
  FedSGD steps crediting a Rayleigh-faded channel, again no shared history.

The optimised accountants run at ``--devices`` x ``--rounds`` (default 1,000 x 30, with the
replay about a minute here; ``--full``: 1,000 x 1,000, the issue's size, about 15 minutes,
most of it ``device-fading``); the unoptimised ones
(:mod:`testbed.core.privacy.accountants.reference`:
every device composes its own events, coefficient lists summed on every question) run at
``--baseline-devices`` x ``--baseline-rounds`` together with the optimised ones at that same
size, and every device's final epsilons are compared (``identical``). Ratios:
``ratio_same_size`` (both at the baseline size) and ``ratio_device_round`` (time per
device-round, unoptimised at the baseline size over optimised at scale: the unoptimised
cost per device-round grows with the rounds composed, so this understates the gain).

Replay: a ledger of ``--replay-devices`` x ``--replay-rounds`` record-level events (default
10^6) is written in a temporary directory in the byte format ``Ledger.append`` writes, then
``PrivacyBook`` is opened on it (read, check, recover intents, compose in both accountants)
and every device's epsilons are asked once; the baseline reads a smaller ledger with the
full JSON parse of every line and the unoptimised accountants (one read, where the book
used to read four times: this understates the gain too).

Timings are wall and process CPU seconds; on a shared machine the CPU figures are the
steadier. Not a test: nothing is asserted. ``--json`` prints one JSON object on the last line.

Usage::

    .venv/bin/python benchmarks/bench_accountant.py [--full] [--devices 1000] [--rounds 30]
        [--scenarios ...] [--replay-devices 1000 --replay-rounds 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.bench_figures import Figure, figure  # noqa: E402
from testbed.core.privacy import BudgetGuard, RecordEvent, UploadEvent  # noqa: E402
from testbed.core.privacy.accountants.reference import (  # noqa: E402
    ReferencePrivacyAccountant,
    ReferenceRecordAccountant,
)
from testbed.core.privacy.book import PrivacyBook, make_accountants  # noqa: E402
from testbed.core.privacy.ledger import EVENT_TYPES, HEADER_TYPE, Ledger  # noqa: E402
from testbed.core.privacy.ledger_parse import GENESIS, LineParser, seal  # noqa: E402
from testbed.core.privacy.ledger_verified import verified_path  # noqa: E402

DELTA = 1e-5
TARGET = 1e9  # never binding: every upload of the workload is composed
SCENARIOS = ("record-identical", "record-classes", "record-sampled", "device-identical",
             "device-fading", "record-fading")
DEFAULT_SCENARIOS = SCENARIOS[:-1]
ENFORCED = {"record": "rdp", "device": "strict"}
#: record-classes: (records D, noise multiplier z); q = B / D with B = 60
CLASSES = ((3000, 1.1), (6000, 1.0), (12000, 0.9), (24000, 0.8))


def record_event(device: int, round_index: int, dataset: int = 6000, z: float = 1.0,
                 gain: float = 0.0) -> RecordEvent:
    """One FedSGD step: B = 60, C = 1, q = B / D, sigma = z C / B; ``gain > 0`` credits a
    channel whose noise is a quarter of the artificial noise's variance at unit gain."""
    channel: dict[str, Any] = {}
    if gain > 0:
        channel = {"alpha": 1.0, "gain": gain, "n0": (z / 60.0) ** 2, "trusted_channel_noise": 1.0,
                   "d": 1000, "l": 500}
    return RecordEvent(round=round_index, device=device, steps=1, sampling_rate=60.0 / dataset,
                       amplified=True, example_clip=1.0, expected_batch=60.0,
                       dataset_size=dataset, sigma=z / 60.0, **channel)


def upload_event(device: int, round_index: int, gain: float = 1.0) -> UploadEvent:
    """One device-level upload (Algorithm 1, no quantization, channel credited)."""
    return UploadEvent(round=round_index, device=device, mechanism="before", sigma=20.0,
                       alpha=1.0, gain=gain, n0=1e-4, trusted_channel_noise=1.0, d=21840,
                       l=2184, q=None, clip=5.0)


def workload(name: str, devices: int, seed: int = 0) -> tuple[str, Callable[[int], list[Any]]]:
    """``(unit, events of round t)`` of a scenario."""
    rng = np.random.default_rng(seed)
    if name == "record-identical":
        return "record", lambda t: [record_event(i, t) for i in range(devices)]
    if name == "record-classes":
        return "record", lambda t: [record_event(i, t, *CLASSES[i % len(CLASSES)])
                                    for i in range(devices)]
    if name == "record-sampled":
        return "record", lambda t: [record_event(i, t) for i in range(devices)
                                    if rng.random() < 0.5]
    if name == "record-fading":
        return "record", lambda t: [record_event(i, t, gain=float(np.sqrt(rng.exponential())))
                                    for i in range(devices)]
    if name == "device-identical":
        return "device", lambda t: [upload_event(i, t) for i in range(devices)]
    if name == "device-fading":
        return "device", lambda t: [upload_event(i, t, float(np.sqrt(rng.exponential())))
                                    for i in range(devices)]
    raise ValueError(f"unknown scenario {name!r}; known: {SCENARIOS}")


def accountants(unit: str, optimised: bool) -> dict[str, Any]:
    """The book's accountants for ``unit``, or their unoptimised counterparts."""
    if optimised:
        return make_accountants(unit, DELTA)
    if unit == "record":
        return {name: ReferenceRecordAccountant(name, DELTA) for name in ("rdp", "pld")}
    return {name: ReferencePrivacyAccountant(name, DELTA) for name in ("paper", "strict")}


def run_rounds(name: str, devices: int, rounds: int, optimised: bool) -> dict[str, Any]:
    """Accountant time of ``rounds`` rounds of scenario ``name`` over ``devices`` devices."""
    unit, round_events = workload(name, devices)
    accs = accountants(unit, optimised)
    guard = BudgetGuard(accs[ENFORCED[unit]], TARGET)
    wall: list[float] = []
    cpu: list[float] = []
    device_rounds = 0
    for t in range(rounds):
        events = round_events(t)
        device_rounds += len(events)
        w, c = time.perf_counter(), time.process_time()
        for event in events:
            device = event.device
            if guard.allows(device, event):
                for acc in accs.values():
                    acc.add(event)
            for acc in accs.values():
                acc.epsilon(device)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    final = {m: [acc.epsilon(i).epsilon for i in range(devices)] for m, acc in accs.items()}
    out: dict[str, Any] = {
        "devices": devices, "rounds": rounds, "device_rounds": device_rounds,
        "round_s_mean": float(np.mean(wall)), "round_s_p99": float(np.quantile(wall, 0.99)),
        "round_s_max": max(wall), "round_s_last": wall[-1],
        "round_cpu_s_mean": float(np.mean(cpu)), "round_cpu_s_max": max(cpu),
        "total_s": math.fsum(wall), "total_cpu_s": math.fsum(cpu),
        "device_round_us": 1e6 * math.fsum(wall) / max(device_rounds, 1),
        "device_round_cpu_us": 1e6 * math.fsum(cpu) / max(device_rounds, 1),
        "epsilon_max": {m: max(v) for m, v in final.items()},
    }
    if optimised and unit == "record":
        out["compositions"] = {m: acc.compositions for m, acc in accs.items()}
    out["_final"] = final
    return out


def write_ledger(path: Path, devices: int, rounds: int) -> int:
    """A record-level ledger of ``devices x rounds`` identical steps, one nonce each, in the
    byte format :meth:`Ledger.append` writes (hash-chained and sealed; checked against a
    line written by ``Ledger.append``). Returns its size."""
    header = {"delta": DELTA, "accounting": "rdp", "epsilon_target": TARGET, "unit": "record",
              "relation": "add-remove"}
    writer = "0123456789abcdef"
    marked = record_event(0, 0).to_dict() | {"round": -1, "device": -2, "nonce": "@",
                                              "prev": "#", "writer": writer}
    text = json.dumps(marked, sort_keys=True, separators=(",", ":"))[:-1].replace("%", "%%")
    text = (text.replace('"round":-1', '"round":%d').replace('"device":-2', '"device":%d')
            .replace('"@"', '"%s"').replace('"#"', '"%s"'))
    with tempfile.TemporaryDirectory() as tmp, Ledger.open(Path(tmp) / "l.jsonl") as check:
        check.writer = writer
        check.append(record_event(0, 0), "0" * 32)
        if seal((text % (0, "0" * 32, GENESIS, 0)).encode()) != check.path.read_bytes():
            raise RuntimeError("write_ledger: the line format differs from Ledger.append's")
    with path.open("wb") as fh:
        line = seal(json.dumps({"type": HEADER_TYPE, "writer": writer, **header},
                               sort_keys=True, separators=(",", ":"))[:-1].encode())
        fh.write(line)
        for t in range(rounds):
            lines = []
            for i in range(devices):
                line = seal((text % (i, os.urandom(16).hex(), line[-67:-3].decode(), t)).encode())
                lines.append(line)
            fh.write(b"".join(lines))
    return path.stat().st_size


def _open_book(path: Path, devices: int) -> dict[str, Any]:
    """Open a book on ``path`` and ask every device's epsilons once; the times."""
    w, c = time.perf_counter(), time.process_time()
    book = PrivacyBook(path, delta=DELTA, enforce="rdp", target=TARGET, unit="record")
    open_s, open_cpu = time.perf_counter() - w, time.process_time() - c
    w, c = time.perf_counter(), time.process_time()
    epsilons = [book.epsilon(i) for i in range(devices)]
    first_s, first_cpu = time.perf_counter() - w, time.process_time() - c
    book.close()
    return {"open_s": open_s, "open_cpu_s": open_cpu,
            "first_epsilons_s": first_s, "first_epsilons_cpu_s": first_cpu,
            "total_s": open_s + first_s, "total_cpu_s": open_cpu + first_cpu,
            "epsilon": {m: r.epsilon for m, r in epsilons[0].items()}}


def replay(devices: int, rounds: int) -> dict[str, Any]:
    """Open a book on a generated ledger and ask every device's epsilons once, twice: the
    first open finds no note of what its writer checked (a ledger from elsewhere, or from
    before the notes) and checks every seal, then notes it as the testbed's writer does
    (:mod:`testbed.core.privacy.ledger_verified`); the second, a resume, reads that note."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.jsonl"
        size = write_ledger(path, devices, rounds)
        unnoted = _open_book(path, devices)
        if not verified_path(path).is_file():
            raise RuntimeError("replay: the first open left no note")
        resumed = _open_book(path, devices)
    if resumed["epsilon"] != unnoted["epsilon"]:
        raise RuntimeError("replay: the two opens differ")
    return {"events": devices * rounds, "devices": devices, "rounds": rounds,
            "ledger_bytes": size, **resumed, "unnoted": unnoted}


def replay_baseline(devices: int, rounds: int) -> dict[str, Any]:
    """The unoptimised replay of a smaller ledger: full parse, per-device composition."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.jsonl"
        write_ledger(path, devices, rounds)
        w, c = time.perf_counter(), time.process_time()
        entries = LineParser(path, EVENT_TYPES, HEADER_TYPE, templates=False).parse(
            path.read_bytes())
        accs = accountants("record", optimised=False)
        for entry in entries:
            for acc in accs.values():
                acc.add(entry.event)
        epsilons = [{m: acc.epsilon(i).epsilon for m, acc in accs.items()}
                    for i in range(devices)]
        total_s, total_cpu = time.perf_counter() - w, time.process_time() - c
    return {"events": devices * rounds, "total_s": total_s, "total_cpu_s": total_cpu,
            "event_us": 1e6 * total_s / (devices * rounds),
            "event_cpu_us": 1e6 * total_cpu / (devices * rounds), "epsilon": epsilons[0]}


def _figures(result: dict[str, Any], args: argparse.Namespace) -> list[Figure]:
    """The table figures (benchmarks/README.md): per scenario the accountant time per
    device-round against the unoptimised path (measured at the small size) and the slowest
    round at full size (aim: 1 s across all devices); the ledger replay (aim: 5 s)."""
    out = []
    for name, row in result["scenarios"].items():
        scale, base = row["optimised"], row["unoptimised_small"]
        size = f"{args.devices} devices x {args.rounds} rounds"
        small = f"{args.baseline_devices} x {args.baseline_rounds}"
        out.append(figure(
            f"{name}_device_round", scale["device_round_us"], base["device_round_us"], "us",
            better="lower", baseline_name=f"unoptimised accountant at {small}",
            note=f"{size}; same epsilons bit for bit: {row['identical']}"))
        out.append(figure(
            f"{name}_round_max", scale["round_s_max"],
            base["total_s"] / args.baseline_rounds, "s", better="lower", aim_value=1.0,
            baseline_name=f"unoptimised round at {small}",
            note=f"slowest round at {size}, all devices"))
    rep = result["replay"]
    base_s = rep["unoptimised"]["event_us"] * rep["events"] / 1e6
    out.append(figure(
        "ledger_replay", rep["total_s"], base_s, "s", better="lower", aim_value=5.0,
        baseline_name="unoptimised read: its per-event cost (measured on "
        f"{rep['unoptimised']['events']} events) x the events",
        note=f"{rep['events']} events, {rep['ledger_bytes'] / 1e6:.0f} MB; a resume: the "
             "ledger's writer noted what it checked (ledger_verified)"))
    out.append(figure(
        "ledger_replay_unnoted", rep["unnoted"]["total_s"], base_s, "s", better="lower",
        baseline_name="the same unoptimised read",
        note="the same ledger without its writer's note (every seal computed); no aim"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true",
                   help="1,000 devices x 1,000 rounds (several minutes per scenario)")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--baseline-devices", type=int, default=40)
    p.add_argument("--baseline-rounds", type=int, default=20)
    p.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS), choices=SCENARIOS)
    p.add_argument("--replay-devices", type=int, default=1000)
    p.add_argument("--replay-rounds", type=int, default=1000)
    p.add_argument("--replay-baseline-events", type=int, default=1000,
                   help="events of the unoptimised replay (20 devices)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.full:
        args.devices, args.rounds = 1000, 1000
    for name in ("devices", "rounds", "baseline_devices", "baseline_rounds", "replay_devices",
                 "replay_rounds", "replay_baseline_events"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    result: dict[str, Any] = {"delta": DELTA, "scenarios": {}}
    for name in args.scenarios:
        scale = run_rounds(name, args.devices, args.rounds, optimised=True)
        small = run_rounds(name, args.baseline_devices, args.baseline_rounds, optimised=True)
        base = run_rounds(name, args.baseline_devices, args.baseline_rounds, optimised=False)
        identical = small.pop("_final") == base.pop("_final")
        scale.pop("_final")
        row = {
            "optimised": scale, "optimised_small": small, "unoptimised_small": base,
            "identical": identical,
            "ratio_same_size": base["total_s"] / small["total_s"],
            "ratio_same_size_cpu": base["total_cpu_s"] / small["total_cpu_s"],
            "ratio_device_round": base["device_round_us"] / scale["device_round_us"],
            "ratio_device_round_cpu": base["device_round_cpu_us"] / scale["device_round_cpu_us"],
            "meets_1s_per_round": scale["round_s_max"] <= 1.0,
        }
        result["scenarios"][name] = row
        if not args.json:
            print(f"{name:17s} {args.devices} x {args.rounds}: round mean "
                  f"{scale['round_s_mean']:.3f} s (cpu {scale['round_cpu_s_mean']:.3f}), p99 "
                  f"{scale['round_s_p99']:.3f} s, max {scale['round_s_max']:.3f} s (cpu "
                  f"{scale['round_cpu_s_max']:.3f}); {scale['device_round_cpu_us']:.1f} us cpu "
                  f"per device-round | unoptimised {base['device_round_cpu_us']:.0f} us cpu at "
                  f"{args.baseline_devices} x {args.baseline_rounds}; ratio same size "
                  f"{row['ratio_same_size']:.1f} (cpu {row['ratio_same_size_cpu']:.1f}), per "
                  f"device-round (cpu) {row['ratio_device_round_cpu']:.1f}; identical "
                  f"{identical}", flush=True)
    rep = replay(args.replay_devices, args.replay_rounds)
    per_device = 20
    base_rounds = max(1, args.replay_baseline_events // per_device)
    rep_base = replay_baseline(per_device, base_rounds)
    rep["unoptimised"] = rep_base
    rep["ratio_event"] = rep_base["event_us"] / (1e6 * rep["total_s"] / rep["events"])
    rep["meets_5s"] = rep["total_s"] <= 5.0
    result["replay"] = rep
    result["figures"] = [f.to_json() for f in _figures(result, args)]
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(f"replay {rep['events']} events ({rep['ledger_bytes'] / 1e6:.0f} MB): open "
              f"{rep['open_s']:.2f} s (cpu {rep['open_cpu_s']:.2f}), first epsilons "
              f"{rep['first_epsilons_s']:.2f} s; total {rep['total_s']:.2f} s (cpu "
              f"{rep['total_cpu_s']:.2f}); without the writer's note "
              f"{rep['unnoted']['total_s']:.2f} s | unoptimised {rep_base['event_us']:.0f} us "
              f"per event at {rep_base['events']} events; ratio per event {rep['ratio_event']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
