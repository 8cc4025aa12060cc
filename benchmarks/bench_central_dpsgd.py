#!/usr/bin/env python3
"""Central DP-SGD (Opacus) on pooled Fashion-MNIST: the accuracy a private FL run should approach.

Trains the project's MNIST CNN (``testbed.core.models.build_model("mnist-cnn", ...)``) on the
whole Fashion-MNIST training set with Opacus' ``PrivacyEngine.make_private_with_epsilon``:
Poisson-sampled batches of expected size ``--batch``, per-example clipping to ``--clip``,
Gaussian noise calibrated so that ``--epochs`` epochs spend ``(--epsilon, --delta)``
(record level, Opacus' accountant ``--accountant``), plain SGD with momentum. Then it
evaluates on the test set. With ``--fl-summary PATH`` (a testbed run's ``summary.json``)
it prints the run's final accuracy beside the central one and, unless given, takes epsilon
and delta from that run.

The central figure is an upper reference for record-level private FL at the same epsilon
(one curator, IID data, all examples in one sampler). Opacus runs without ``secure_mode``
(which needs torchcsprng): fine for an accuracy reference, not for a deployment.

In the same run the same model is trained again with the same Poisson batches and
per-example clipping but no noise (same examples, epochs, learning rate and seed; not
private): the figure ``central_accuracy`` is the private test accuracy against that
noise-free baseline (ratio = private / noise-free, the accuracy the noise costs; no aim, it
is a reference). Plain unclipped SGD is not the baseline: at the learning rate that suits
clipped gradients (0.5) it diverges. By default a short run (2
epochs on the first 12,000 training examples, batch 256) that fits in ``testbed bench``'s
budget; ``--full`` the reference setting (15 epochs on all 60,000, batch 1024).

Usage::

    .venv/bin/python benchmarks/bench_central_dpsgd.py [--epsilon 5] [--epochs N]
        [--examples N] [--batch N] [--lr 0.5] [--clip 1.0] [--full]
        [--fl-summary runs/x/summary.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from testbed.bench_figures import figure, format_table
from testbed.core.data.datasets import load_dataset
from testbed.core.models import build_model

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch: int = 2000) -> float:
    """Fraction of ``x`` (``(n, 1, 28, 28)`` float32) classified as ``y`` (``(n,)``)."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(y), batch):
            logits = model(torch.from_numpy(np.asarray(x[s : s + batch])))
            correct += int((logits.argmax(1).numpy() == y[s : s + batch]).sum())
    model.train()
    return correct / len(y)


def train_central(
    *, data_dir: str, examples: int | None, epsilon: float | None, delta: float, epochs: int,
    batch: int, lr: float, momentum: float, clip: float, accountant: str, seed: int,
    clip_only: bool = False,
) -> dict[str, Any]:
    """Train once; returns accuracy (fraction), noise multiplier, spent epsilon, wall time (s).

    ``epsilon=None`` trains without privacy (same batch size, no clipping or noise);
    ``clip_only`` keeps Opacus' Poisson batches and per-example clipping but adds no noise
    (not private: the baseline that isolates the noise's cost). ``examples`` keeps the first
    that many training examples (``None``: all).
    """
    from opacus import PrivacyEngine

    ds = load_dataset("fashion-mnist", data_dir)
    x_train, y_train = ds.x_train[:examples], ds.y_train[:examples]
    torch.manual_seed(seed)
    model = build_model("mnist-cnn", (1, 28, 28), seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loader = DataLoader(
        TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
        batch_size=batch, shuffle=True,
    )
    engine = None
    history = []
    with warnings.catch_warnings():
        # Opacus' notices (secure RNG off, order grid) and torch's full-backward-hook note
        warnings.simplefilter("ignore", UserWarning)
        if clip_only:
            engine = PrivacyEngine(accountant=accountant)
            model, optimizer, loader = engine.make_private(  # type: ignore[misc,assignment]
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=0.0,
                max_grad_norm=clip,
            )
        elif epsilon is not None:
            engine = PrivacyEngine(accountant=accountant)
            model, optimizer, loader = engine.make_private_with_epsilon(  # type: ignore[misc,assignment]
                module=model, optimizer=optimizer, data_loader=loader, target_epsilon=epsilon,
                target_delta=delta, epochs=epochs, max_grad_norm=clip,
            )
        t0 = time.perf_counter()
        for epoch in range(epochs):
            for xb, yb in loader:
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(xb), yb).backward()
                optimizer.step()
            history.append(accuracy(model, ds.x_test, ds.y_test))
            print(f"epoch {epoch + 1}/{epochs}: test accuracy {history[-1]:.4f}", file=sys.stderr)
    wall = time.perf_counter() - t0
    return {
        "central_accuracy": history[-1],
        "accuracy_per_epoch": history,
        "noise_multiplier": None if engine is None else float(optimizer.noise_multiplier),  # type: ignore[attr-defined]
        "epsilon_spent": (
            None if engine is None or clip_only else float(engine.get_epsilon(delta))
        ),
        "train_seconds": wall,
        "n_train": int(len(y_train)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, default=None,
                   help="target epsilon (default: the FL run's, else 5); 0 = no privacy")
    p.add_argument("--delta", type=float, default=None, help="default: the FL run's, else 1e-5")
    p.add_argument("--epochs", type=int, default=None, help="default 2, with --full 15")
    p.add_argument("--examples", type=int, default=None,
                   help="training examples used (default 12000, with --full all 60000)")
    p.add_argument("--batch", type=int, default=None,
                   help="expected (Poisson) batch size (default 256, with --full 1024)")
    p.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (with clip 1)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--clip", type=float, default=1.0, help="per-example l2 clip")
    p.add_argument("--accountant", default="prv", choices=["prv", "rdp", "gdp"])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0, help="model init and data order")
    p.add_argument("--data-dir", default=DEFAULT_DATA)
    p.add_argument("--fl-summary", type=Path, default=None, help="a testbed run's summary.json")
    p.add_argument("--full", action="store_true", help="the reference setting (see above)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = 15 if args.full else 2
    if args.batch is None:
        args.batch = 1024 if args.full else 256
    if args.examples is None and not args.full:
        args.examples = 12_000
    fl: dict[str, Any] | None = None
    if args.fl_summary is not None:
        summary = json.loads(args.fl_summary.read_text())
        privacy = summary.get("privacy") or {}
        fl = {
            "path": str(args.fl_summary),
            "scheme": summary.get("scheme"),
            "final_accuracy": summary.get("final_accuracy"),
            "epsilon_target": privacy.get("epsilon_target"),
            "delta": privacy.get("delta"),
        }
    epsilon = args.epsilon
    if epsilon is None:
        epsilon = fl["epsilon_target"] if fl and fl["epsilon_target"] is not None else 5.0
    delta = args.delta if args.delta is not None else (fl or {}).get("delta") or 1e-5
    if args.epochs < 1 or args.batch < 1 or args.lr <= 0 or args.clip <= 0 or args.threads < 1:
        p.error("need --epochs, --batch, --threads >= 1 and --lr, --clip > 0")
    if args.examples is not None and args.examples < args.batch:
        p.error(f"--examples {args.examples}: need at least --batch ({args.batch})")
    if not (math.isfinite(epsilon) and epsilon >= 0 and 0 < delta < 1):
        p.error(f"need epsilon >= 0 and 0 < delta < 1, got {epsilon}, {delta}")
    torch.set_num_threads(args.threads)
    common = {
        "data_dir": args.data_dir, "examples": args.examples, "delta": delta,
        "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "momentum": args.momentum,
        "clip": args.clip, "accountant": args.accountant, "seed": args.seed,
    }
    result: dict[str, Any] = {
        "epsilon": epsilon if epsilon > 0 else None,
        "delta": delta,
        "epochs": args.epochs,
        "examples": args.examples,
        "batch": args.batch,
        "lr": args.lr,
        "momentum": args.momentum,
        "clip": args.clip,
        "accountant": args.accountant,
        "threads": args.threads,
        "seed": args.seed,
        **train_central(epsilon=epsilon if epsilon > 0 else None, **common),
    }
    figures = []
    if epsilon > 0:
        print("baseline (clipping, no noise):", file=sys.stderr)
        base = train_central(epsilon=None, clip_only=True, **common)
        result["noise_free_accuracy"] = base["central_accuracy"]
        result["noise_free_train_seconds"] = base["train_seconds"]
        figures.append(figure(
            "central_accuracy", result["central_accuracy"], base["central_accuracy"],
            "fraction", better="higher",
            baseline_name="the same training with clipping and no noise (not private)",
            note=f"test accuracy after {args.epochs} epochs on {result['n_train']} examples, "
            f"eps {epsilon:g} (spent {result['epsilon_spent']:.3f}, delta {delta:g}, record "
            f"level, Opacus {args.accountant}, central trusted curator)",
        ))
    result["figures"] = [f.to_json() for f in figures]
    if fl is not None:
        result["fl"] = fl
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    eps_txt = "no privacy" if result["epsilon"] is None else (
        f"eps {epsilon:g} (spent {result['epsilon_spent']:.3f}), delta {delta:g}, "
        f"noise multiplier {result['noise_multiplier']:.3f}"
    )
    print(f"central DP-SGD, {eps_txt}: {args.epochs} epochs, batch {args.batch}, lr {args.lr}, "
          f"clip {args.clip}; {result['train_seconds']:.0f} s")
    print(f"{'central accuracy':24s} {100 * result['central_accuracy']:.2f} %")
    if figures:
        print(format_table([("central_dpsgd", f, "ok") for f in figures]))
    if fl is not None:
        acc = fl["final_accuracy"]
        print(f"{'FL run accuracy':24s} {'n/a' if acc is None else f'{100 * acc:.2f} %'}  "
              f"({fl['scheme']}, eps target {fl['epsilon_target']}, {fl['path']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
