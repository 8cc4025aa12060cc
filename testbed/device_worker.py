"""One device's side of a round: local training from the global model and encoding of the
differential into symbols. The in-process run holds one :class:`DeviceWorker` per device;
an edge agent (:mod:`testbed.lab.edge`) holds its own. The round logic is written once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from edge_device.dp_trainer import RecordTrainer
from edge_device.energy_meter import EnergyMeter, Measurement
from edge_device.trainer import LocalTrainer
from edge_device.uplink import EncodedUpload, UplinkEncoder, UplinkSettings
from testbed.config.experiment import ExperimentConfig
from testbed.models import n_params
from testbed.record_schemes import RecordSettings
from testbed.schemes import DeviceUplink
from testbed.seeding import Stream, experiment_generator
from testbed.stage_timer import StageTimer


class TrainingDiverged(RuntimeError):
    """Local training produced non-finite weights (the run ends with status 'diverged')."""


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
        The device's data shard, shapes ``(n, ...)`` and ``(n,)``.
    uplink, record
        Its uplink settings and, at the record unit, record-level settings (else ``None``).
    mask_secret
        The run secret the sparsification masks derive from.
    meter
        The computing-energy meter.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        model: torch.nn.Module,
        device: int,
        x: np.ndarray,
        y: np.ndarray,
        uplink: DeviceUplink,
        record: RecordSettings | None,
        mask_secret: str,
        meter: EnergyMeter,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.uplink = uplink
        self.record = record
        self.meter = meter
        self.trainer: Any = (
            RecordTrainer(model, x, y, backend=cfg.privacy.per_example)
            if record is not None
            else LocalTrainer(model, x, y)
        )
        d = n_params(model)
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
            d,
            mask_secret,
        )

    def update(self, w: np.ndarray, round_index: int, timer: StageTimer) -> LocalUpload:
        """Train from global weights ``w`` (shape ``(d,)``) and encode the differential.

        Raises
        ------
        TrainingDiverged
            When the loss or the differential is not finite.
        """
        cfg, i, t = self.cfg, self.device, round_index
        mb_rng = experiment_generator(cfg.seed, Stream.MINIBATCH, i, t)
        with self.meter.measure() as comp:
            local = timer.timed("train", partial(self._train, w, mb_rng))
        # A record-level round whose Poisson batches were all empty has no loss (nan).
        no_examples = self.record is not None and int(np.sum(local.batch_sizes)) == 0
        if not (
            (np.isfinite(local.mean_loss) or no_examples)
            and np.all(np.isfinite(local.differential))
        ):
            raise TrainingDiverged(f"device {i} round {t}: non-finite loss or update")
        q_rng = experiment_generator(cfg.seed, Stream.QUANTIZER, i, t)
        upload = timer.timed(
            "encode",
            partial(self.encoder.encode, local.differential, device=i, round_index=t,
                    quant_rng=q_rng),
        )
        return LocalUpload(upload, float(local.mean_loss), comp, local.differential)

    def _train(self, w: np.ndarray, rng: np.random.Generator) -> Any:
        cfg = self.cfg
        if self.record is None:
            return self.trainer.train(
                w, steps=cfg.local_steps, batch_size=cfg.batch_size, lr=cfg.lr, rng=rng
            )
        rs = self.record
        if rs.noise_distribution == "laplace":  # 004: full batch, l1 clip, Laplace noise
            return self.trainer.train_laplace(
                w, lr=cfg.lr, example_clip=rs.example_clip, laplace_scale=rs.laplace_scale
            )
        return self.trainer.train(
            w,
            steps=cfg.local_steps,
            expected_batch_size=cfg.batch_size,
            lr=cfg.lr,
            example_clip=rs.example_clip,
            noise_multiplier=rs.step_noise_multiplier,
            secure_sampling=rs.amplified,
            rng=None if rs.amplified else rng,
        )
