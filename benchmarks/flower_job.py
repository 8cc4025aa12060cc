#!/usr/bin/env python3
"""The Flower side of ``bench_flower.py``: the testbed's jobs under Flower's simulation engine.

Run as a child process by ``bench_flower.py`` (with Flower importable)::

    python benchmarks/flower_job.py --job default --rounds 40 --parallel 2

It runs the job under ``flwr.simulation.run_simulation`` (Ray backend, one Ray actor per
``--parallel`` client slot, ``num_cpus = cores / parallel`` each) and prints one JSON line
with the accuracies at the testbed's evaluation cadence.

What is the same as ``testbed run`` of the job, taken from the testbed's own functions: the
config (``testbed/config/default.yaml`` or ``private-fedsgd.yaml``, ``rounds`` overridden),
the data (:func:`testbed.core.run_setup.prepare_data`: Fashion-MNIST, the seeded non-IID
split over 10 devices), the model and its seeded initial weights
(:func:`testbed.core.run_setup.initial_model`), the learning rate, the batch size and the
local steps, every device training in every round, the uniform mean of the devices' models
(003 eq. 14; every Flower reply weighs the same), and the server-side evaluation
(:mod:`aggregator.evaluate`: the fixed seeded subset of ``eval_subset`` test samples every
round, the full test set every ``eval_every`` rounds and in the last).

* ``--job default``: each client runs ``local_steps`` steps of ``torch.optim.SGD`` (no
  momentum) on minibatches of ``batch_size`` drawn without replacement from its shard with the
  testbed's minibatch stream for that device and round (the batches ``testbed run`` draws).
* ``--job private``: each client runs one DP-SGD step with Opacus 1.6
  (``GradSampleModule``, ``DPOptimizer``, ``DPDataLoader``): Poisson sampling at the
  testbed's rate ``q = batch_size / D_i``, per-example clipping to ``example_clip``, Gaussian
  noise ``N(0, (z C)^2)`` on the clipped sum with the noise multiplier ``z`` the testbed
  calibrates for the job (:func:`testbed.core.run_setup.device_settings`, computed here at the
  start like the testbed does), divided by the expected batch size, one ``lr`` step.

What differs: the testbed's devices compress every upload as the job's config says (default
job: norm clip 10, random sparsification to 10 % of the coordinates, 16-level quantization;
private job: the same sparsification, no quantizer) and send it through the in-process symbol
link (20 dB AWGN), with the testbed's run directory, ledger and metrics; Flower's clients
send their full-precision models through its in-memory simulation transport, with no
channel. So the two sides' models, and accuracies, differ a little. The Flower client uses
Opacus's own (non-cryptographic) generators; the testbed draws private batches and noise from
the OS CSPRNG.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The jobs: ``None`` is the shipped default config.
CONFIGS: dict[str, Path | None] = {
    "default": None,
    "private": REPO_ROOT / "testbed" / "config" / "private-fedsgd.yaml",
}

#: What the ServerApp runs (set by :func:`main` in the driver process, where Flower's
#: simulation runs the ServerApp in a thread) and what it measured.
SPEC: dict[str, Any] = {}
RESULTS: dict[str, Any] = {}
#: Per-process cache (the driver and each Ray actor): config, data, split, model, trainers.
_CACHE: dict[str, Any] = {}


def job_config(job: str, rounds: int | None = None) -> Any:
    """The testbed's config of ``job`` (``default`` or ``private``), ``rounds`` overridden.

    Raises
    ------
    KeyError
        An unknown job.
    """
    from testbed.core.config.loader import load_experiment

    overrides = [] if rounds is None else [f"rounds={rounds}"]
    return load_experiment(CONFIGS[job], overrides)


def _state(job: str, rounds: int, *, server: bool = False) -> dict[str, Any]:
    """This process's config, data, split and model of the job (loaded once). The server
    (``server=True``) loads the test set only; a client process the whole training set
    (an actor trains whichever device it is given)."""
    key = f"{job}:{rounds}:{server}"
    if key not in _CACHE:
        from testbed.core.run_setup import initial_model, prepare_data, prepare_test_data

        cfg = job_config(job, rounds)
        parts: list[np.ndarray] = []
        if server:
            data = prepare_test_data(cfg)
        else:
            data, parts = prepare_data(cfg)
        model = initial_model(cfg, data.x_test.shape[1:], torch.device("cpu"),
                              n_classes=data.n_classes)
        _CACHE[key] = {"cfg": cfg, "data": data, "parts": parts, "model": model}
    return _CACHE[key]


def _float32_mapped(x: Any) -> np.ndarray:
    """The training images as one ``float32`` array mapped from a file, which the job's
    processes share: what the Flower side trained on before the testbed kept its images
    coded (then the data cache held the float32 arrays), so that its memory is measured as
    it was. Written once per data set (its sha256), atomically, in the temporary folder."""
    from testbed.core.data.coded import CodedImages

    if not isinstance(x, CodedImages):
        return np.asarray(x, dtype=np.float32)
    digest = hashlib.sha256(np.ascontiguousarray(x.codes).tobytes())
    digest.update(x.lut.tobytes())
    path = Path(tempfile.gettempdir()) / f"flower-job-images-{digest.hexdigest()[:24]}.npy"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:  # a file object: np.save adds no ".npy" to the name
            np.save(fh, np.asarray(x))
        os.replace(tmp, path)
    return np.load(path, mmap_mode="c")


def _shard(st: dict[str, Any], i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training set as tensors (sharing the loaded arrays' memory, no copy) and device
    ``i``'s rows of it, as ``testbed run``'s devices index the one training set."""
    if "x" not in st:
        st["x"] = torch.from_numpy(_float32_mapped(st["data"].x_train))
        st["y"] = torch.from_numpy(st["data"].y_train)
    return st["x"], st["y"], torch.from_numpy(np.asarray(st["parts"][i], dtype=np.int64))


def sgd_round(st: dict[str, Any], i: int, t: int, state_dict: dict[str, torch.Tensor]
              ) -> tuple[dict[str, torch.Tensor], float]:
    """Device ``i``'s local training of round ``t`` (the default job): ``local_steps`` SGD
    steps from ``state_dict``; returns the new weights and the mean training loss."""
    from testbed.core.seeding import Stream, experiment_generator

    cfg, model = st["cfg"], st["model"]
    x, y, rows = _shard(st, i)
    model.load_state_dict(state_dict)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = experiment_generator(cfg.seed, Stream.MINIBATCH, i, t)
    n, losses = len(rows), []
    for _ in range(cfg.local_steps):
        idx = rows[torch.from_numpy(rng.choice(n, size=min(cfg.batch_size, n), replace=False))]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    new = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return new, float(np.mean(losses))


def dpsgd_round(st: dict[str, Any], i: int, conf: dict[str, Any],
                state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
    """Device ``i``'s round of the private job: one Opacus DP-SGD step from ``state_dict``
    (Poisson rate ``conf['sample-rate']``, clip, noise multiplier, expected batch size and
    learning rate from ``conf``); returns the new weights and the batch's mean loss. One
    private model and optimizer per process (plain SGD keeps no state between devices);
    one Poisson data loader per device."""
    from opacus import GradSampleModule
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer

    if "dp" not in st:
        model = GradSampleModule(st["model"], loss_reduction="mean")
        opt = DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=float(conf["lr"])),
            noise_multiplier=float(conf["noise-multiplier"]),
            max_grad_norm=float(conf["clip"]),
            expected_batch_size=int(conf["expected-batch"]),
            loss_reduction="mean",
        )
        st["dp"] = (model, opt, {})
    model, opt, loaders = st["dp"]
    if i not in loaders:
        x, y, rows = _shard(st, i)
        shard = torch.utils.data.Subset(torch.utils.data.TensorDataset(x, y), rows.tolist())
        loader = DPDataLoader(shard, sample_rate=float(conf["sample-rate"]))
        loaders[i] = [loader, iter(loader)]
    try:
        xb, yb = next(loaders[i][1])
    except StopIteration:
        loaders[i][1] = iter(loaders[i][0])
        xb, yb = next(loaders[i][1])
    model._module.load_state_dict(state_dict)
    model.train()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(xb), yb) if len(yb) else None
    if loss is not None:
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)  # frees the per-example gradients
    new = {k: v.detach().clone() for k, v in model._module.state_dict().items()}
    return new, float("nan") if loss is None else float(loss.detach())


def make_apps() -> tuple[Any, Any]:
    """Flower's ``ClientApp`` and ``ServerApp`` of the bench."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        conf = dict(msg.content["config"])
        torch.set_num_threads(int(conf["threads"]))
        st = _state(str(conf["job"]), int(conf["rounds"]))
        i = int(context.node_config["partition-id"])
        t = int(conf["server-round"]) - 1
        state_dict = msg.content["arrays"].to_torch_state_dict()
        if conf["job"] == "private":
            new, loss = dpsgd_round(st, i, conf, state_dict)
        else:
            new, loss = sgd_round(st, i, t, state_dict)
        metrics = MetricRecord({"train_loss": loss, "num-examples": int(conf["weight"])})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}),
                       reply_to=msg)

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        from aggregator.evaluate import evaluate, sample_scores, subset_indices
        from testbed.core.models import get_flat
        from testbed.core.seeding import Stream, experiment_generator

        job, rounds = SPEC["job"], SPEC["rounds"]
        st = _state(job, rounds, server=True)
        cfg, data, model = st["cfg"], st["data"], st["model"]
        sub = None
        if cfg.eval_subset is not None:
            sub = subset_indices(len(data.y_test), cfg.eval_subset,
                                 experiment_generator(cfg.seed, Stream.EVAL))
        evals: list[dict[str, Any]] = []

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0:  # the testbed does not evaluate the initial model
                return None
            model.load_state_dict(arrays.to_torch_state_dict())
            w = get_flat(model)
            out: dict[str, float] = {"round": server_round - 1}
            if server_round % cfg.eval_every == 0 or server_round == rounds:
                scores = sample_scores(model, w, data.x_test, data.y_test)
                ev = scores.summary()
                out["test_accuracy"], out["test_loss"] = ev.accuracy, ev.loss
                if sub is not None:
                    out["subset_accuracy"] = scores.summary(sub).accuracy
            elif sub is not None:
                out["subset_accuracy"] = evaluate(model, w, data.x_test[sub],
                                                  data.y_test[sub]).accuracy
            evals.append(out)
            return MetricRecord({k: float(v) for k, v in out.items()})

        train_config = ConfigRecord({
            "job": job, "rounds": rounds, "threads": SPEC["threads"],
            "weight": cfg.local_steps * cfg.batch_size, "lr": float(cfg.lr),
            **SPEC.get("dp", {}),
        })
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                          min_train_nodes=cfg.devices, min_available_nodes=cfg.devices)
        result = strategy.start(
            grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
            train_config=train_config, evaluate_fn=evaluate_fn,
        )
        RESULTS["evaluations"] = evals
        RESULTS["train_loss"] = [
            float(m["train_loss"]) for _, m in sorted(result.train_metrics_clientapp.items())
        ]

    return client_app, server_app


def dp_settings(cfg: Any, d: int, sizes: list[int]) -> dict[str, float]:
    """The private job's per-step mechanism as the testbed calibrates it (device 0's; every
    device of the job has the same shard size): sampling rate, clip, noise multiplier and
    expected batch size."""
    from testbed.core.config.loader import load_hardware
    from testbed.core.run_setup import device_settings

    _, records = device_settings(cfg, load_hardware(cfg.hw_config), d, sizes)
    rs = records[0]
    if rs is None or len({r.sampling_rate for r in records if r is not None}) != 1:
        raise ValueError("the private job's devices must share one record-level mechanism")
    return {"sample-rate": rs.sampling_rate, "clip": rs.example_clip,
            "noise-multiplier": rs.target_noise_multiplier,
            "expected-batch": float(rs.expected_batch)}


def main(argv: list[str] | None = None) -> int:
    """Run one job under Flower's simulation; print one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", choices=sorted(CONFIGS), default="default")
    p.add_argument("--rounds", type=int, default=None, help="default: the config's")
    p.add_argument("--parallel", type=int, default=1,
                   help="clients training at once (Ray actors of cores/parallel CPUs each)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    from flwr.simulation import run_simulation

    from testbed.core.models import n_params

    rounds = args.rounds or job_config(args.job).rounds
    cores = len(os.sched_getaffinity(0))
    cpus = max(1, cores // args.parallel)
    SPEC.update(job=args.job, rounds=rounds, threads=cpus)
    if args.job == "private":
        from testbed.core.run_setup import prepare_data

        cfg = job_config(args.job, rounds)
        sizes = [len(p) for p in prepare_data(cfg)[1]]  # the split's sizes; data dropped
        SPEC["dp"] = dp_settings(cfg, n_params(_state(args.job, rounds, server=True)["model"]),
                                 sizes)
    client_app, server_app = make_apps()
    # Ray's session files (logs, sockets) in a directory of this run's, removed afterwards.
    ray_tmp = tempfile.mkdtemp(prefix="ray_bench_", dir="/tmp")
    try:
        run_simulation(
            server_app=server_app, client_app=client_app,
            num_supernodes=job_config(args.job, rounds).devices,
            backend_config={"client_resources": {"num_cpus": cpus, "num_gpus": 0.0},
                            "init_args": {"num_cpus": cores, "num_gpus": 0,
                                          "_temp_dir": ray_tmp}},
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    evals = RESULTS.get("evaluations", [])
    full = [e for e in evals if "test_accuracy" in e]
    if len(evals) != rounds or not full:
        raise RuntimeError(f"the simulation evaluated {len(evals)} of {rounds} rounds")
    trained = len(RESULTS.get("train_loss", []))
    if trained != rounds:  # a client that fails is left out of the round, without an error
        raise RuntimeError(f"the simulation's clients returned results in {trained} of "
                           f"{rounds} rounds (a client failed: see Flower's log above)")
    print(json.dumps({
        "job": args.job, "rounds": rounds, "parallel": args.parallel, "cpus_per_client": cpus,
        "final_accuracy": full[-1]["test_accuracy"],
        "final_subset_accuracy": evals[-1].get("subset_accuracy"),
        "evaluations": evals, "train_loss": RESULTS.get("train_loss", []),
        "dp": SPEC.get("dp"), "wall_s": time.perf_counter() - t0,
        "flwr": __import__("flwr").__version__,
    }))
    return 0


if __name__ == "__main__":
    # The apps must live in an importable module (``flower_job``), not ``__main__``, for
    # Ray's workers to find them: this directory is on sys.path, which Flower hands on.
    import flower_job

    sys.exit(flower_job.main())
