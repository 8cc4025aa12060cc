"""One device's side of a round: local training from the global model and encoding of the
differential into symbols. The in-process run holds one :class:`DeviceWorker` per device
selected so far; an edge agent (:mod:`edge_device.lab.agent`) holds its own. The round logic is
written once.

Training and encoding are separate steps (:meth:`DeviceWorker.train`,
:meth:`DeviceWorker.encode`) so that the training may run in another process
(:mod:`testbed.parallel_training`, which calls :func:`train_device` there) while the
encoding, which draws the upload's quantizer stream and precedes transmission, stays with
the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from edge_device.dp_trainer import RecordTrainer
from edge_device.energy_meter import EnergyMeter, Measurement
from edge_device.trainer import LocalTrainer
from edge_device.uplink import EncodedUpload, UplinkEncoder, UplinkSettings
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.data.coded import CodedImages
from testbed.core.models import n_params
from testbed.core.process.stage_timer import StageTimer
from testbed.core.record_schemes import RecordSettings
from testbed.core.runs.run_errors import TrainingDiverged
from testbed.core.scheme_api import BuiltinScheme, checked, scheme_of
from testbed.core.schemes import DeviceUplink
from testbed.core.seeding import Stream, experiment_generator


@dataclass(frozen=True)
class Trained:
    """A device's local training of one round, before encoding.

    Attributes
    ----------
    device, round_index
        Which device and round.
    differential
        ``float64``, shape ``(d,)``: ``(w_global - w_local) / lr`` (noisy at the record
        unit with per-step noise).
    train_loss
        Mean training loss of the round's local steps (``nan`` when a record-level round's
        Poisson batches were all empty).
    comp
        The computing energy of the local training (J) and where it came from.
    seconds
        Wall time of the training (s), in the process that trained.
    """

    device: int
    round_index: int
    differential: np.ndarray
    train_loss: float
    comp: Measurement
    seconds: float


@dataclass
class LocalUpload:
    """What a device sends in one round.

    Attributes
    ----------
    upload
        The encoded upload (symbols, header, symbol energy).
    train_loss
        Mean training loss of the round's local steps (``nan`` when a record-level round's
        Poisson batches were all empty).
    comp
        The computing energy of the local training (J) and where it came from.
    differential
        The (noisy) local differential before encoding, shape ``(d,)``; what a scheme that
        does not use the analog link (secure aggregation) sends.
    """

    upload: EncodedUpload
    train_loss: float
    comp: Measurement
    differential: np.ndarray | None = None


def make_trainer(
    cfg: ExperimentConfig,
    model: torch.nn.Module,
    x: np.ndarray | CodedImages,
    y: np.ndarray,
    record: RecordSettings | None,
    index: np.ndarray | None = None,
    *,
    device: torch.device | None = None,
) -> Any:
    """The device's trainer: :class:`RecordTrainer` at the record unit, else
    :class:`LocalTrainer`; ``index``: the device's rows of shared ``x``, ``y``; ``device``:
    where it trains (``cfg.compute.device`` resolved; ``None``: where the model is)."""
    if record is not None:
        return RecordTrainer(
            model, x, y, index=index, backend=cfg.privacy.per_example, device=device
        )
    return LocalTrainer(model, x, y, index, device=device)


def minibatch_rng(seed: int, device: int, round_index: int) -> np.random.Generator:
    """Device ``device``'s minibatch stream in round ``round_index``, spawned from the
    experiment seed (the draws a resumed run repeats)."""
    return experiment_generator(seed, Stream.MINIBATCH, device, round_index)


def train_device(
    cfg: ExperimentConfig,
    trainer: Any,
    record: RecordSettings | None,
    meter: EnergyMeter,
    device: int,
    w: np.ndarray,
    round_index: int,
) -> Trained:
    """Device ``device``'s local training of round ``round_index`` from global weights ``w``
    (``(d,)``), with its minibatch stream spawned from the experiment seed for this device
    and round (privacy noise and secret Poisson batches come from the OS CSPRNG).

    Raises
    ------
    TrainingDiverged
        When the loss or the differential is not finite.
    """
    i, t = device, round_index
    mb_rng = minibatch_rng(cfg.seed, i, t)
    t0 = time.perf_counter()
    with meter.measure() as comp:
        local = _train(cfg, trainer, record, w, mb_rng)
    seconds = time.perf_counter() - t0
    # A record-level round whose Poisson batches were all empty has no loss (nan).
    no_examples = record is not None and int(np.sum(local.batch_sizes)) == 0
    return trained(i, t, local, comp, seconds, no_examples=no_examples)


def trained(
    device: int, round_index: int, local: Any, comp: Measurement, seconds: float,
    *, no_examples: bool = False,
) -> Trained:
    """A local training's :class:`Trained`, refused when it diverged.

    Parameters
    ----------
    device, round_index
        Which device and round.
    local
        The trainer's result (``differential``, ``mean_loss``).
    comp, seconds
        Its computing energy and wall time (s).
    no_examples
        A record-level round whose Poisson batches were all empty (its loss is ``nan``).

    Raises
    ------
    TrainingDiverged
        When the loss or the differential is not finite.
    """
    if not (
        (np.isfinite(local.mean_loss) or no_examples) and np.all(np.isfinite(local.differential))
    ):
        raise TrainingDiverged(f"device {device} round {round_index}: non-finite loss or update")
    return Trained(device, round_index, local.differential, float(local.mean_loss), comp, seconds)


def _train(
    cfg: ExperimentConfig,
    trainer: Any,
    record: RecordSettings | None,
    w: np.ndarray,
    rng: np.random.Generator,
) -> Any:
    if record is None:
        return trainer.train(
            w, steps=cfg.local_steps, batch_size=cfg.batch_size, lr=cfg.lr, rng=rng
        )
    rs = record
    if rs.noise_distribution == "laplace":  # 004: full batch, l1 clip, Laplace noise
        return trainer.train_laplace(
            w, lr=cfg.lr, example_clip=rs.example_clip, laplace_scale=rs.laplace_scale,
            normaliser=rs.dataset_size,
        )
    return trainer.train(
        w,
        steps=cfg.local_steps,
        expected_batch_size=cfg.batch_size,
        lr=cfg.lr,
        example_clip=rs.example_clip,
        noise_multiplier=rs.step_noise_multiplier,
        secure_sampling=rs.amplified,
        rng=None if rs.amplified else rng,
    )


class DeviceWorker:
    """Local training and encoding of one device.

    Parameters
    ----------
    cfg
        The run's config.
    model
        The model (its weights are overwritten from the global model each round).
    device
        Device index.
    x, y
        The device's data shard, shapes ``(n, ...)`` and ``(n,)``; with ``index``, the
        training set shared by every device.
    uplink, record
        Its uplink settings and, at the record unit, record-level settings (else ``None``).
    mask_secret
        The run secret the sparsification masks derive from.
    meter
        The computing-energy meter.
    index
        ``None``, or the device's rows of ``x`` and ``y`` (``int``, ``(D,)``): nothing is
        copied per device.
    compute
        Where it trains: ``cfg.compute.device`` resolved on this host
        (:func:`testbed.core.compute.resolve_device`); ``None``: where the model is. The
        differential comes back to the CPU; privacy noise is drawn on the CPU.

    The trainer is made on the first :meth:`train` (a run whose training happens in worker
    processes never makes one here).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        model: torch.nn.Module,
        device: int,
        x: np.ndarray | CodedImages,
        y: np.ndarray,
        uplink: DeviceUplink,
        record: RecordSettings | None,
        mask_secret: str,
        meter: EnergyMeter,
        *,
        index: np.ndarray | None = None,
        compute: torch.device | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.compute = compute
        self.uplink = uplink
        self.record = record
        self.meter = meter
        self._model, self._x, self._y, self._index = model, x, y, index
        self._trainer: Any = None
        self.scheme = scheme_of(cfg)
        self.encoder = UplinkEncoder(
            UplinkSettings(
                # record unit: every example is clipped already; no update clipping
                clip_mode="none" if record is not None else cfg.clip.mode,
                clip_bound=cfg.clip.bound,
                alpha=uplink.alpha,
                mechanism=uplink.mechanism,
                sigma=uplink.sigma,
                l=uplink.l,
                levels=uplink.levels,
                quantizer_scale=uplink.quantizer_scale,
            ),
            n_params(model),
            mask_secret,
        )

    @property
    def trainer(self) -> Any:
        """The device's :class:`LocalTrainer` or :class:`RecordTrainer` (made when first
        asked for)."""
        if self._trainer is None:
            self._trainer = make_trainer(
                self.cfg, self._model, self._x, self._y, self.record, self._index,
                device=self.compute,
            )
        return self._trainer

    def train(self, w: np.ndarray, round_index: int) -> Trained:
        """Train from global weights ``w`` (shape ``(d,)``); see :func:`train_device`."""
        return train_device(
            self.cfg, self.trainer, self.record, self.meter, self.device, w, round_index
        )

    def encode(self, trained: Trained, timer: StageTimer) -> LocalUpload:
        """Encode a training's differential into the round's upload (the quantizer's stream
        is spawned from the experiment seed for this device and round); a lab's own scheme's
        ``prepare`` maps the differential first."""
        i, t = self.device, trained.round_index
        q_rng = experiment_generator(self.cfg.seed, Stream.QUANTIZER, i, t)
        g = trained.differential
        if not isinstance(self.scheme, BuiltinScheme):  # a lab's own scheme's device side
            g = checked(self.scheme.prepare(g, device=i, round_index=t), g.size,
                        f"{self.scheme.name}.prepare")
        upload = timer.timed(
            "encode",
            partial(self.encoder.encode, g, device=i, round_index=t, quant_rng=q_rng),
        )
        return LocalUpload(upload, trained.train_loss, trained.comp, g)

    def update(self, w: np.ndarray, round_index: int, timer: StageTimer) -> LocalUpload:
        """Train from global weights ``w`` (shape ``(d,)``) and encode the differential.

        Raises
        ------
        TrainingDiverged
            When the loss or the differential is not finite.
        """
        trained = self.train(w, round_index)
        timer.add("train", trained.seconds)
        return self.encode(trained, timer)
