#!/usr/bin/env python3
"""Cost of a record-level private local round next to a non-private one.

Measured in the same run, on the same device data (``--examples`` Fashion-MNIST training
images when ``--data-dir`` holds them, else Fashion-MNIST-shaped random data), the same
model and the same H:

* ``nonprivate``: :class:`edge_device.trainer.LocalTrainer`, H steps with batch B;
* ``record``: :class:`edge_device.dp_trainer.RecordTrainer` with the runs' default
  per-example backend (``--backend auto``: the layer-wise formulas where they cover the
  model), H steps with Poisson batches of expected size B drawn from the OS CSPRNG,
  per-example clipping and per-step noise (DP-SGD on the device);
* ``record_upload``: the same with ``noise_multiplier = 0`` and the one draw of ``d``
  Gaussians from the OS CSPRNG that the uplink encoder then adds to the upload (noise at
  the upload);
* ``record_<before>`` (``--before``, default ``vmap``: the per-example backend runs used
  before ``auto`` became the default): the ``record`` round with that backend, so the
  before / after comparison is measured in the same run; ``--before none`` skips it.

Each variant runs ``--repeats`` rounds, the variants alternating (so a busy machine slows
all of them alike). A ratio is the **median** record round over the **median** non-private
round, not the best of each: a record round's cost grows with its realized Poisson batch
sizes, and the fastest of several record rounds is mostly the one that drew the fewest
examples (measured: best-of ratios of 1.31-1.34x where the median was 1.39x; a round's time
correlates 0.73 with its examples), which would flatter the private side. The best-of ratios
are in the JSON (``ratio_best``, ``ratio_upload_best``). The aim is <= 1.3 for the default
backend, none for ``--before``; ratios are given in wall time (``record_B``,
``record_upload_B``, ``record_vmap_B``) and in process CPU time (``record_cpu_B``,
``record_vmap_cpu_B``, steadier on a shared machine). The remainder above 1x is mostly the
per-step noise (about 1 ms per step for d = 21,840 from ``os.urandom``), which
``record_upload`` draws once a round, and the per-example weight gradients of the convolutions
(about twice the batched weight gradients they replace).
Default B = 64 with H = 10 steps; ``--full`` B = 32, 64, 128, 256 with H = 20; both also
the private job's round (``testbed/config/private-fedsgd.yaml``: FedSGD, one step of
B = 1024; with H = 1 the per-step noise is one draw a round, as the upload's), unless
``--batch`` is given. Usage::

    .venv/bin/python benchmarks/bench_record_round.py [--batch 32 64 128] [--steps 20]
        [--repeats 9] [--threads 1] [--backend auto] [--before vmap] [--full] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge_device.dp_trainer import RecordTrainer
from edge_device.trainer import LocalTrainer
from testbed.bench_figures import Figure, figure, format_table
from testbed.core.data.datasets import load_dataset
from testbed.core.models import build_model, get_flat
from testbed.core.noise import gaussian

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
#: Bound on record / non-private round time (wall and process CPU) for the default backend.
AIM = 1.3
#: The private job's batch (testbed/config/private-fedsgd.yaml: FedSGD, one step of B = 1024
#: per round); measured with H = 1 beside the sizes unless --batch is given.
JOB_BATCH = 1024


def device_data(n: int, data_dir: str) -> tuple[np.ndarray, np.ndarray, str]:
    """``n`` training examples ``(n, 1, 28, 28)`` float32 / ``(n,)`` int64, and their source."""
    if Path(data_dir).is_dir():
        try:
            ds = load_dataset("fashion-mnist", data_dir)
            return ds.x_train[:n], ds.y_train[:n], f"fashion-mnist ({data_dir})"
        except FileNotFoundError:
            pass
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    return x, rng.integers(0, 10, n).astype(np.int64), "random, Fashion-MNIST-shaped"


def round_seconds(
    fns: dict[str, Callable[[], object]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process-CPU times (s) of each function's ``repeats`` calls, the functions
    alternating, after one warm-up call each. CPU time is the steadier figure on a shared
    machine."""
    for fn in fns.values():
        fn()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - c)
            wall[name].append(time.perf_counter() - t)
    return wall, cpu


def upload_round(record: RecordTrainer, w0: np.ndarray, dp: dict[str, Any]) -> None:
    """A record round in upload-noise mode and the upload's noise: the trainer adds none,
    the uplink encoder adds ``N(0, sigma^2 I)`` once to the ``d``-vector it sends."""
    record.train(w0, noise_multiplier=0.0, **dp)
    gaussian(record.d, 1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mnist-cnn", choices=["mnist-cnn", "logreg"])
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="(expected) batch sizes B (default 64, with --full 32 64 128)")
    p.add_argument("--steps", type=int, default=None,
                   help="H, local steps per round (default 10, with --full 20)")
    p.add_argument("--examples", type=int, default=6000, help="D, the device's examples")
    p.add_argument("--noise-multiplier", type=float, default=1.0, help="per-step z")
    p.add_argument("--clip", type=float, default=1.0, help="per-example clip C")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--repeats", type=int, default=9,
                   help="rounds per variant (the ratios are of the medians)")
    p.add_argument("--data-dir", default=DEFAULT_DATA)
    p.add_argument("--backend", default="auto", choices=["auto", "layers", "vmap"],
                   help="per-example gradients (privacy.per_example; default auto, as runs)")
    p.add_argument("--before", default="vmap", choices=["vmap", "layers", "none"],
                   help="also the record round with this backend (default vmap, the previous "
                        "default), alternating with the others; none: skip")
    p.add_argument("--full", action="store_true", help="the large sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.batch is None:  # the sizes, and the private job's FedSGD round (B = 1024, H = 1)
        steps = args.steps or (20 if args.full else 10)
        sizes = [(b, steps) for b in ([32, 64, 128, 256] if args.full else [64])]
        sizes.append((JOB_BATCH, 1))
    else:
        sizes = [(b, args.steps or (20 if args.full else 10)) for b in args.batch]
    if min(h for _, h in sizes) < 1 or args.repeats < 1 or args.threads < 1 or (
            args.examples < max(b for b, _ in sizes)):
        p.error("need --steps, --repeats, --threads >= 1 and --examples >= every --batch")
    torch.set_num_threads(args.threads)
    x, y, source = device_data(args.examples, args.data_dir)
    model = build_model(args.model, (1, 28, 28), seed=0)
    w0 = get_flat(model)
    plain = LocalTrainer(model, x, y)
    record = RecordTrainer(model, x, y, backend=args.backend)
    before = None if args.before == "none" else RecordTrainer(model, x, y, backend=args.before)
    rows = []
    for b, steps in sizes:
        dp = {"steps": steps, "lr": args.lr, "expected_batch_size": b,
              "example_clip": args.clip}
        fns: dict[str, Callable[[], object]] = {
            "nonprivate": partial(plain.train, w0, steps=steps, batch_size=b, lr=args.lr,
                                  rng=np.random.default_rng(1)),
            "record": partial(record.train, w0, noise_multiplier=args.noise_multiplier, **dp),
            "record_upload": partial(upload_round, record, w0, dp),
        }
        if before is not None:
            fns["before"] = partial(before.train, w0, noise_multiplier=args.noise_multiplier,
                                    **dp)
        wall, cpu = round_seconds(fns, args.repeats)
        t = {name: float(np.median(v)) for name, v in wall.items()}  # median round, s
        best = {name: min(v) for name, v in wall.items()}
        c = {name: float(np.median(v)) for name, v in cpu.items()}
        rows.append({
            "batch": b,
            "nonprivate_round_s": t["nonprivate"],
            "record_round_s": t["record"],
            "record_upload_round_s": t["record_upload"],
            "steps": steps,
            "nonprivate_step_ms": 1e3 * t["nonprivate"] / steps,
            "record_step_ms": 1e3 * t["record"] / steps,
            "ratio": t["record"] / t["nonprivate"],
            "ratio_upload": t["record_upload"] / t["nonprivate"],
            "ratio_cpu": c["record"] / c["nonprivate"],
            "ratio_upload_cpu": c["record_upload"] / c["nonprivate"],
            "ratio_best": best["record"] / best["nonprivate"],
            "ratio_upload_best": best["record_upload"] / best["nonprivate"],
            "nonprivate_round_cpu_s": c["nonprivate"],
            "record_round_cpu_s": c["record"],
            **({} if before is None else {
                "before_round_s": t["before"],
                "before_round_cpu_s": c["before"],
                "ratio_before": t["before"] / t["nonprivate"],
                "ratio_before_cpu": c["before"] / c["nonprivate"],
            }),
        })
    result = {
        "model": args.model,
        "backend": record.clipped_sum.backend,
        "before_backend": None if before is None else before.clipped_sum.backend,
        "data": source,
        "examples": args.examples,
        "noise_multiplier": args.noise_multiplier,
        "clip": args.clip,
        "threads": args.threads,
        "repeats": args.repeats,
        "rounds": rows,
        "ratio_max": max(r["ratio"] for r in rows),
        "ratio_cpu_max": max(r["ratio_cpu"] for r in rows),
    }
    figures: list[Figure] = []
    for r in rows:
        b, t, nonpriv = r["batch"], r["record_round_s"], r["nonprivate_round_s"]
        note = f"B = {b}, H = {r['steps']}, {args.model}, {record.clipped_sum.backend}"
        if (b, r["steps"]) == (JOB_BATCH, 1) and args.batch is None:
            note += " (the private job's FedSGD round)"
        noise = "per-step noise" if r["steps"] > 1 else "noise drawn once (H = 1)"
        figures += [
            figure(f"record_{b}", t, nonpriv, "s", better="lower", aim=AIM,
                   baseline_name="non-private LocalTrainer round (wall)",
                   note=f"{note}, {noise}"),
            figure(f"record_cpu_{b}", r["record_round_cpu_s"], r["nonprivate_round_cpu_s"], "s",
                   better="lower", aim=AIM, baseline_name="non-private round (process CPU)",
                   note=f"{note}, {noise}"),
            figure(f"record_upload_{b}", r["record_upload_round_s"], nonpriv, "s",
                   better="lower", aim=AIM, baseline_name="non-private round (wall)",
                   note=f"{note}, noise at the upload"),
        ]
        if before is not None:
            old = f"B = {b}, H = {r['steps']}, {args.model}, {before.clipped_sum.backend}"
            figures += [
                figure(f"record_{args.before}_{b}", r["before_round_s"], nonpriv, "s",
                       better="lower", baseline_name="non-private round (wall)",
                       note=f"{old}, per-step noise (before)"),
                figure(f"record_{args.before}_cpu_{b}", r["before_round_cpu_s"],
                       r["nonprivate_round_cpu_s"], "s", better="lower",
                       baseline_name="non-private round (process CPU)",
                       note=f"{old}, per-step noise (before)"),
            ]
    result["figures"] = [f.to_json() for f in figures]
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("record_round", f, "ok") for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
