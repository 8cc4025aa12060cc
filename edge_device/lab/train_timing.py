"""``testbed edge --calibrate CONFIG``: this host's training time for a job, before a run.

A lab round waits for each edge's upload up to the deadline (the aggregator's
``--train-allowance``); an edge slower than it sits the round out. This measures, on the
edge's own host (a Jetson: its GPU or CPU as ``compute.device`` resolves there), what one
round costs the device: train from the initial model on the device's shard, then clip,
noise, compress and scale the differential into its upload, ``rounds`` times, each timed
alone. The edge is set up as the agent sets it up for a run (its own ``--data-dir``, or the
run's seeded shard of the data set on this host), the first round included: a run's first
round also pays for building the trainer. ``testbed radio calibrate --train-time I=SECONDS``
turns the slowest edge's time into the deadline (docs/lab.md, "Calibration").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.loader import load_hardware

#: Most rounds timed (each a full local training).
MAX_ROUNDS = 100


@dataclass(frozen=True)
class TrainTiming:
    """One edge's measured round cost (s).

    Attributes
    ----------
    device
        Device id.
    seconds
        Each round's train-and-encode time (s), the first (cold) included; shape
        ``(rounds,)``.
    compute
        Where it trained (e.g. ``cuda:0``, ``cpu``) and why.
    samples
        Training rows of its shard.
    """

    device: int
    seconds: list[float]
    compute: str
    samples: int

    @property
    def worst_s(self) -> float:
        """The slowest round (s): what the deadline must cover."""
        return max(self.seconds)

    def line(self) -> str:
        """One line for a person, with the flag that carries it to the calibration."""
        rounds = ", ".join(f"{s:.2f}" for s in self.seconds)
        return (f"device {self.device}: training and encoding one round took {rounds} s on "
                f"{self.compute} ({self.samples} samples); slowest {self.worst_s:.2f} s: "
                f"testbed radio calibrate ... --train-time {self.device}={self.worst_s:.2f}")


def time_training(cfg: ExperimentConfig, device: int, *, rounds: int = 3,
                  data_dir: Path | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> TrainTiming:
    """Time ``rounds`` rounds of device ``device``'s local work for ``cfg`` on this host.

    Parameters
    ----------
    cfg
        The run's experiment config.
    device
        This edge's device id (``< cfg.devices``).
    rounds
        Rounds to time (1 .. :data:`MAX_ROUNDS`).
    data_dir
        This device's own data (as ``testbed edge --data-dir``); ``None``: the run's seeded
        shard of the data set on this host.
    clock
        Seconds (a monotonic clock).

    Raises
    ------
    ValueError
        ``device`` or ``rounds`` out of range (the message names the flag).
    ConfigError
        The config cannot run on this host (``compute.device``, data).
    """
    import numpy as np
    import torch

    from edge_device.device_worker import DeviceWorker
    from edge_device.energy_meter import make_meter
    from testbed.core.compute import resolve_device
    from testbed.core.data.coded import take_rows
    from testbed.core.models import get_flat, n_params
    from testbed.core.process.stage_timer import StageTimer
    from testbed.core.run_setup import (
        device_directory,
        device_settings,
        initial_model,
        prepare_data,
        prepare_own_shard,
    )

    if not 0 <= device < cfg.devices:
        raise ValueError(f"--device-id: got {device}; the job has {cfg.devices} devices "
                         f"(allowed: 0 .. {cfg.devices - 1})")
    if not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"--calibrate-rounds: got {rounds}; allowed: 1 .. {MAX_ROUNDS}")
    compute = resolve_device(cfg.compute.device)
    hw = load_hardware(cfg.hw_config)
    torch.set_num_threads(cfg.torch_threads)
    own = data_dir
    if own is None and cfg.partition == "files":
        own = device_directory(cfg, device)
    if own is not None:
        data = prepare_own_shard(cfg, own)
        mine = np.arange(len(data.y_train))
        sizes = [len(mine)] * cfg.devices
    else:
        data, parts = prepare_data(cfg)
        mine = parts[device]
        sizes = [len(p) for p in parts]
    model = initial_model(cfg, data.x_train.shape[1:], compute.torch_device,
                          n_classes=data.n_classes)
    uplinks, record = device_settings(cfg, hw, n_params(model), sizes)
    worker = DeviceWorker(
        cfg, model, device, take_rows(data.x_train, mine), data.y_train[mine],
        uplinks[device], record[device] if record else None, "train-timing",
        make_meter(cfg.energy.source, cfg.energy.e_comp_j), compute=compute.torch_device)
    w = get_flat(model)
    seconds: list[float] = []
    for t in range(rounds):
        t0 = clock()
        worker.encode(worker.train(w, t), StageTimer())
        seconds.append(clock() - t0)
    return TrainTiming(device, seconds, f"{compute.name} ({compute.reason})", int(len(mine)))
