"""The devices of ``testbed run``, called in this process.

Every device's data are index rows into one training set loaded here; a device's state
(trainer, encoder: :class:`edge_device.device_worker.DeviceWorker`) is made when it is first
asked. With ``workers`` > 1 the local training of a round's devices runs in worker
processes (:mod:`testbed.parallel_training`); encoding, transmission and the ledger stay in
this process, in device order, one upload at a time: a device's upload is journalled and
goes on air only after the previous one was recorded, and a requested stop is seen
between a device's training and its transmission. With ``compute.batch_devices`` K > 1 the
devices train K at a time in this process (:mod:`edge_device.batched_trainer`), and are
then encoded and transmitted one at a time, in device order, as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aggregator.devices import Answered, Journal, SecAggOutcome, Upload
from aggregator.state import RunState
from edge_device.batched_trainer import BatchedTrainer, BatchingUnsupported
from edge_device.device_worker import (
    DeviceWorker,
    Trained,
    make_trainer,
    minibatch_rng,
    train_device,
    trained,
)
from edge_device.energy_meter import Measurement, ModelMeter, make_meter
from radio.link import Link
from testbed.core.compute import check_workers
from testbed.core.config.errors import ConfigError
from testbed.core.data.datasets import Dataset
from testbed.core.links import make_link
from testbed.core.process.stage_timer import StageTimer
from testbed.core.record_schemes import RecordSettings
from testbed.core.runs.interrupts import StopSignals
from testbed.core.secagg.aggregation import CARRIER as SECAGG_CARRIER
from testbed.core.secagg.aggregation import secure_sum
from testbed.core.upload_events import PrivacyEvent
from testbed.parallel_training import TrainingPool, resolve_workers

#: Devices trained together at a time by ``compute.batch_devices: auto`` where it batches
#: (1,000 logreg devices: 0.68 ms a device's round at 250, against 1.5 ms one at a time).
AUTO_BATCH = 250
#: Device trainings in a run (devices a round times rounds) from which ``auto`` batches.
AUTO_MIN_TRAININGS = 2000


class LocalDevices:
    """Every device of the run, in this process.

    Parameters
    ----------
    state
        The aggregator's state (the model object is shared: a device trains into it).
    data
        The data set; ``parts``: each device's rows of its training set.
    compute
        Where the devices train (``compute.device`` resolved,
        :func:`testbed.core.compute.resolve_device`); ``None``: where the model is (the
        run's :func:`~testbed.core.run_setup.initial_model` placed it). On a GPU the devices
        train one after another in this process (no worker processes).
    """

    lists_every_device = False

    def __init__(
        self,
        state: RunState,
        data: Dataset,
        parts: list[np.ndarray],
        *,
        compute: torch.device | None = None,
    ) -> None:
        cfg = state.cfg
        self.state = state
        if compute is None:
            compute = next(state.model.parameters()).device
        self.compute = torch.device(compute)
        self.data = data
        self.parts = parts
        # energy.source: measured on a host without a power meter is refused here (exit 2)
        self.energy_meter = make_meter(cfg.energy.source, cfg.energy.e_comp_j)
        self.energy_source = self.energy_meter.source
        #: Local training and encoding of each device asked so far (made on first use).
        self.device_workers: dict[int, DeviceWorker] = {}
        #: Devices trained together (``compute.batch_devices``, ``auto`` resolved).
        self.batch_devices = self._resolve_batch_devices()
        #: Processes that train a round's devices (1: this one, no pool).
        self.workers = self._resolve_workers()
        self._pool: TrainingPool | None = None
        #: The trainer of devices trained together (``batch_devices`` > 1), else ``None``.
        self._batched = self._batched_trainer()

    def _resolve_batch_devices(self) -> int:
        """``compute.batch_devices``, with ``auto`` resolved: :data:`AUTO_BATCH` devices at a
        time (at most a round's) where training them together gives the same model bit for
        bit and pays for its set-up, else 1.

        Bit for bit: the built-in ``logreg`` on one CPU thread (``torch_threads`` 1), tested
        against one device at a time (``tests/test_batched_trainer.py``); other models agree
        to float32 rounding only. Pays: the first batched step imports ``torch._dynamo``
        (about 1 s once per run) and each device's round saves about 0.8 ms, so ``auto``
        batches from :data:`AUTO_MIN_TRAININGS` device trainings in the run. Only where an
        explicit K would be accepted: ``workers`` 1, the device unit, the model's energy.
        """
        cfg = self.state.cfg
        k = cfg.compute.batch_devices
        if k != "auto":
            return int(k)
        per_round = cfg.sample_devices or cfg.clients_per_round or cfg.devices
        exact = (cfg.model == "logreg" and self.compute.type == "cpu"
                 and cfg.torch_threads == 1)
        allowed = (cfg.workers == 1 and not self.state.record
                   and isinstance(self.energy_meter, ModelMeter))
        pays = per_round >= 2 and per_round * cfg.rounds >= AUTO_MIN_TRAININGS
        return min(AUTO_BATCH, per_round) if exact and allowed and pays else 1

    def _batched_trainer(self) -> BatchedTrainer | None:
        """The trainer of ``batch_devices`` devices at a time, refused (before any work)
        where the devices cannot be trained together."""
        state, k = self.state, self.batch_devices
        if k == 1:
            return None
        key = f"config key 'compute.batch_devices': got {k}"
        if state.record:
            raise ConfigError(
                f"{key} at privacy.unit record, where each device trains on its own "
                "(per-example clipping, its own noise and batches); allowed: 1")
        if not isinstance(self.energy_meter, ModelMeter):
            raise ConfigError(
                f"{key}; the computing energy is measured ({self.energy_meter.source}), which "
                "needs one device training at a time; allowed: 1, or energy.source=model")
        try:
            return BatchedTrainer(state.model, self.data.x_train, self.data.y_train,
                                  device=self.compute)
        except BatchingUnsupported as exc:
            raise ConfigError(f"{key}; {exc}; allowed: 1") from exc

    def _resolve_workers(self) -> int:
        """Worker processes for local training (``workers``; see
        :func:`~testbed.parallel_training.resolve_workers`). A power meter measures the whole
        host per device's time slice, so it needs one device at a time: ``auto`` is then 1
        and an explicit number is refused (before any work). Training on a GPU is in this
        process too (:func:`~testbed.core.compute.check_workers`)."""
        cfg = self.state.cfg
        check_workers(self.compute, cfg.workers)
        if self.compute.type != "cpu":
            return 1
        if self.batch_devices > 1:  # the batched devices train in this process
            if cfg.workers not in (1, "auto"):
                raise ConfigError(
                    f"config key 'workers': got {cfg.workers} with compute.batch_devices "
                    f"{self.batch_devices}; allowed: 1 or 'auto' (devices trained "
                    "together train in the run's process), or compute.batch_devices 1"
                )
            return 1
        per_round = cfg.sample_devices or cfg.clients_per_round or cfg.devices
        n = resolve_workers(cfg.workers, cfg.torch_threads, per_round)
        if n > 1 and not isinstance(self.energy_meter, ModelMeter):
            if cfg.workers == "auto":
                return 1
            raise ConfigError(
                f"config key 'workers': got {cfg.workers}; the computing energy is measured "
                f"({self.energy_meter.source}), which needs one device training at a time; "
                "allowed: 1 or 'auto', or energy.source=model"
            )
        return n

    # -- the run -----------------------------------------------------------------------------
    def session(self) -> AbstractContextManager[Any]:
        """The run's worker processes, forked now that the training set and the partition
        exist (``nullcontext`` when training stays here); the pool is used while open."""
        if self.workers <= 1:
            return nullcontext(None)
        state, cfg, meter, parts = self.state, self.state.cfg, self.energy_meter, self.parts
        model, x, y = state.model, self.data.x_train, self.data.y_train
        compute = self.compute  # the CPU: _resolve_workers keeps a GPU run in this process

        def make(device: int, record: RecordSettings | None) -> Any:
            return make_trainer(cfg, model, x, y, record, parts[device], device=compute)

        def train(
            trainer: Any, record: RecordSettings | None, device: int, w: np.ndarray, t: int
        ) -> Trained:
            return train_device(cfg, trainer, record, meter, device, w, t)

        lock = getattr(state.rundir, "_lock_fd", None)
        pool = TrainingPool(self.workers, make, train, threads=cfg.torch_threads,
                            close_fds=() if lock is None else (lock,))
        return _Using(self, pool)

    def open_link(self, record_dir: Path | None) -> Link:
        state = self.state
        return make_link(state.cfg, state.hw, record_dir, log_dir=state.rundir.path)

    def end_run(self, summary: dict[str, Any]) -> None:
        """Nothing to let go (the pool closed with the session)."""

    # -- a round ------------------------------------------------------------------------------
    def begin_round(self, t: int, stop: StopSignals) -> None:
        """Every device is here: nothing to wait for."""

    def absent(self, devices: set[int]) -> set[int]:
        return set()

    def ask(
        self, t: int, w: np.ndarray, asked: dict[int, PrivacyEvent], journal: Journal,
        stop: StopSignals, timer: StageTimer,
    ) -> Iterator[Answered]:
        """Train (in worker processes when there are some) and encode each asked device, in
        device order, each answer taken before the next device is encoded; the loop journals
        and transmits it (``journalled=False``)."""
        order = sorted(asked)
        trained = self._training(t, w, order, stop)
        for i in order:
            result = self._next(trained, timer)
            assert result.device == i, (result.device, i)
            local = self.device(i).encode(result, timer)
            stop.check()  # a requested stop never lets another upload go on air
            up = local.upload
            yield Answered(i, None, Upload(
                up.header, up.symbols, up.symbol_energy, local.comp.energy_j, local.comp.source,
                local.train_loss), journalled=False)

    def acknowledge(self, t: int, i: int, nonce: str | None, event: PrivacyEvent) -> None:
        """Nothing to tell: the device is this process."""

    def end_round(self, t: int) -> dict[str, Any]:
        return {}

    def secure_round(
        self, t: int, w: np.ndarray, asked: dict[int, PrivacyEvent], stop: StopSignals,
        timer: StageTimer,
    ) -> SecAggOutcome:
        """002's secure aggregation with every device here: each asked device's update,
        recorded as a masked upload on the control plane (no channel credit), summed
        through the protocol."""
        state, book = self.state, self.state.book
        order = sorted(asked)
        trained = self._training(t, w, order, stop)
        entries: dict[int, dict[str, Any]] = {}
        updates: dict[int, np.ndarray] = {}
        losses: list[float] = []
        for i in order:
            result = self._next(trained, timer)
            local = self.device(i).encode(result, timer)
            if np.isfinite(local.train_loss):
                losses.append(local.train_loss)
            stop.check()  # a requested stop never lets another upload go on air
            with stop.critical():
                if book is not None:
                    nonce = book.begin(asked[i])
                    book.commit(state.event(i, t, None), nonce)
                entry: dict[str, Any] = {
                    "device": i, "transmitted": True, "train_loss": local.train_loss,
                    "carrier": SECAGG_CARRIER,
                    "energy_comm_j": 0.0, "energy_comp_j": local.comp.energy_j,
                    "energy_comp_source": local.comp.source, "sigma": state.uplinks[i].sigma,
                }
                if book is not None:
                    for name, result_ in book.epsilon(i).items():
                        entry[f"epsilon_{name}"] = result_.epsilon
                entries[i] = entry
            assert local.differential is not None
            updates[i] = local.differential
        total = timer.timed("secagg", lambda: secure_sum(updates, t)) if updates else None
        return SecAggOutcome(total, entries, losses)

    # -- the devices ---------------------------------------------------------------------------
    def _next(self, trained: Iterator[Trained], timer: StageTimer) -> Trained:
        """The next device's training result, its time added to the round's."""
        if self._pool is None:
            result = next(trained)
        else:  # the time this process waited for the workers
            result = timer.timed("train_wait", lambda: next(trained))
        timer.add("train", result.seconds)
        return result

    def _training(
        self, t: int, w: np.ndarray, devices: list[int], stop: StopSignals
    ) -> Iterator[Trained]:
        """Round ``t``'s training of ``devices`` from the global model, in their order: in
        worker processes (all dispatched at once), or here, one when asked for (so that a
        stop request is seen between a device's training and its transmission)."""
        state = self.state
        if self._pool is not None:
            if not devices:
                return
            tasks = [(i, state.record_settings(i)) for i in devices]
            yield from self._pool.train(w, t, tasks, on_wait=stop.check)
            return
        if self._batched is not None:
            k = self.batch_devices
            for start in range(0, len(devices), k):
                yield from self._train_together(t, w, devices[start : start + k])
            return
        for i in devices:
            yield self.device(i).train(w, t)

    def _train_together(self, t: int, w: np.ndarray, devices: list[int]) -> Iterator[Trained]:
        """Round ``t``'s training of ``devices`` in one batched pass: each with its own
        minibatch stream (as :func:`~edge_device.device_worker.train_device` spawns it), its
        share of the wall time and the model's computing energy per device. Each result is
        checked when it is taken, so a device that diverged stops the run where it would
        one device at a time: after the devices before it went on air."""
        cfg, meter = self.state.cfg, self.energy_meter
        assert self._batched is not None and isinstance(meter, ModelMeter)
        rngs = [minibatch_rng(cfg.seed, i, t) for i in devices]
        t0 = time.perf_counter()
        results = self._batched.train(
            w, [self.parts[i] for i in devices], steps=cfg.local_steps,
            batch_size=cfg.batch_size, lr=cfg.lr, rngs=rngs)
        seconds = (time.perf_counter() - t0) / len(devices)
        for i, local in zip(devices, results, strict=True):
            yield trained(i, t, local, Measurement(meter.reading(seconds)), seconds)

    def device(self, i: int) -> DeviceWorker:
        """Device ``i``'s worker, made when first asked (its data are index rows into the
        shared training set; nothing is copied)."""
        worker = self.device_workers.get(i)
        if worker is None:
            state = self.state
            worker = DeviceWorker(
                state.cfg, state.model, i, self.data.x_train, self.data.y_train,
                state.uplinks[i], state.record_settings(i), state.run_secret,
                self.energy_meter, index=self.parts[i], compute=self.compute,
            )
            self.device_workers[i] = worker
        return worker


class _Using:
    """The training pool, open and in use by the devices while the run's rounds go on."""

    def __init__(self, devices: LocalDevices, pool: TrainingPool) -> None:
        self.devices, self.pool = devices, pool

    def __enter__(self) -> TrainingPool:
        self.devices._pool = self.pool.__enter__()
        return self.pool

    def __exit__(self, *exc: object) -> None:
        self.devices._pool = None
        self.pool.__exit__(*exc)
