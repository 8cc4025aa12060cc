"""Run a federated-learning experiment over a link, round by round, into a run directory.

One round (003 Algorithm 1): every device trains H local SGD steps from the global model,
encodes its differential (clip, noise, compress, scale) into analog symbols and sends them
over the link; the aggregator inverts the channel, decodes, averages and updates the
global model, then evaluates it on a fixed subset of the test set (``eval_subset``) and,
every ``eval_every`` rounds and at the end, on the full test set.

The devices asked in a round are every device, or a sample of them (``clients_per_round``
for the peer schemes that sample, ``sample_devices`` for the others); a device's state
(trainer, encoder) is made when it is first asked. With ``workers`` > 1 the local training
of a round's devices runs in worker processes (:mod:`testbed.parallel_training`); the
gate, encoding, transmission and ledger stay here, in device order.
"""

from __future__ import annotations

import platform
import secrets
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aggregator.aggregate import average, global_update
from aggregator.decoder import decode_differential, project_coordinates
from aggregator.evaluate import Evaluation, evaluate, sample_scores, subset_indices
from aggregator.outcome import exit_code, trust_fields
from aggregator.peer_accounting import peer_report
from aggregator.solver.calibration import smoothed_losses, uploads_to_target
from edge_device.device_worker import (
    DeviceWorker,
    LocalUpload,
    Trained,
    TrainingDiverged,
    make_trainer,
    train_device,
)
from edge_device.energy_meter import ModelMeter, make_meter
from radio.analog import n_symbols_for
from radio.link import ChannelState, Link, LinkError, LinkFailed, Reception
from radio.units import linear_to_db
from testbed import __version__
from testbed.core.blas_threads import limit_blas_threads
from testbed.core.channel_credit import channel_noise_source
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import ConfigError, dump_yaml, load_experiment, load_hardware
from testbed.core.faults import fault_point, log_air
from testbed.core.interrupts import StopSignals
from testbed.core.links import check_link_config, link_name, make_link
from testbed.core.masks import sparsify_mask
from testbed.core.models import get_flat, n_params
from testbed.core.privacy import LedgerError
from testbed.core.privacy_book import PrivacyBook
from testbed.core.protocol import UploadHeader
from testbed.core.record_schemes import RecordSettings, check_delta_bound
from testbed.core.recovery import check_config_pin, config_pin, directory_is_pristine, resume_point
from testbed.core.run_setup import (
    device_settings,
    initial_model,
    prepare_data,
    prepare_test_data,
)
from testbed.core.rundir import RunDir, RunDirError
from testbed.core.secure_aggregation import CARRIER as SECAGG_CARRIER
from testbed.core.secure_aggregation import secure_sum
from testbed.core.seeding import Stream, experiment_generator, new_run_secret
from testbed.core.stage_timer import StageTimer
from testbed.core.upload_events import PrivacyEvent, channel_fields, upload_event
from testbed.parallel_training import TrainingPool, resolve_workers

__all__ = ["Experiment", "StageTimer", "TrainingDiverged", "run_experiment", "resume_experiment"]


#: Called after every round with the round's metrics line.
RoundCallback = Callable[[dict[str, Any]], None]


def round_devices(cfg: ExperimentConfig, t: int) -> set[int]:
    """Devices asked to upload in round ``t``: every device; for 004 the ``b`` next in round
    robin and for 002 ``r`` drawn with the OS CSPRNG (``clients_per_round``); for the other
    schemes ``sample_devices`` drawn uniformly without replacement from the experiment seed
    (stream DEVICE_SAMPLING, the same after a resume; no amplification by device sampling is
    credited)."""
    n = cfg.devices
    if cfg.sample_devices is not None and cfg.sample_devices < n:
        rng = experiment_generator(cfg.seed, Stream.DEVICE_SAMPLING, 0, t)
        return {int(i) for i in rng.choice(n, size=cfg.sample_devices, replace=False)}
    k = cfg.clients_per_round
    if k is None or k >= n:
        return set(range(n))
    if cfg.scheme == "fedsgd-dpc":
        return {(t * k + j) % n for j in range(k)}
    return set(secrets.SystemRandom().sample(range(n), k))


def tally(
    info: dict[str, Any],
    vec: np.ndarray | None,
    decoded: list[np.ndarray],
    losses: list[float],
    per_device: list[dict[str, Any]],
) -> None:
    """Add one device's upload of a round (metrics entry ``info``, decoded differential
    ``vec`` or ``None``) to the round's lists."""
    if vec is not None:
        decoded.append(vec)
    loss = info.get("train_loss")
    if isinstance(loss, float) and np.isfinite(loss):
        losses.append(loss)
    per_device.append(info)


def reception_metrics(reception: Reception, symbols: np.ndarray) -> dict[str, float]:
    """Per-upload channel numbers for the metrics line."""
    state = reception.state
    gain_power = state.mean_gain_power()
    signal_power = float(np.mean(np.abs(symbols) ** 2)) if symbols.size else 0.0
    snr = (
        float(linear_to_db(gain_power * signal_power / state.noise_var))
        if state.noise_var > 0 and signal_power > 0
        else float("inf")
    )
    h0 = complex(state.gain[0]) if state.gain.size else 0j
    return {
        "snr_db": snr,
        "h_abs": abs(h0),
        "h_phase_rad": float(np.angle(h0)),
        "gain_power_mean": gain_power,
        "noise_var": state.noise_var,
        "airtime_s": reception.airtime_s,
    }


class Experiment:
    """State of one run: data, model, devices, link, run directory."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        hw: HardwareConfig,
        rundir: RunDir,
        *,
        progress: bool = False,
        on_round: RoundCallback | None = None,
        dataset_sizes: list[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.hw = hw
        self.rundir = rundir
        self.progress = progress
        self.on_round = on_round
        torch.set_num_threads(cfg.torch_threads)
        limit_blas_threads(cfg.torch_threads)
        # energy.source: measured on a host without a power meter is refused here (exit 2)
        self.energy_meter = make_meter(cfg.energy.source, cfg.energy.e_comp_j)
        if dataset_sizes is None:  # in process: the data and every device live here
            self.data, parts = prepare_data(cfg)
            dataset_sizes = [len(p) for p in parts]
        else:  # aggregator of a lab run: the test set only; the shards stay on the edges
            self.data, parts = prepare_test_data(cfg), None
        self.model = initial_model(cfg, self.data.x_test.shape[1:])
        self.d = n_params(self.model)
        #: ``"record"`` or ``"device"`` for a DP scheme, ``None`` without DP.
        self.unit = None if cfg.scheme == "fedavg" else cfg.privacy.unit
        #: ``{}``, or the summary's note on a delta >= 1/min D_i allowed by the config
        self.delta_bound = check_delta_bound(cfg, dataset_sizes)  # refuses it otherwise
        self.uplinks, record = device_settings(cfg, hw, self.d, dataset_sizes)
        self.record: list[RecordSettings] = [r for r in record if r is not None]
        self.run_secret = (rundir.path / "run_secret").read_text().strip()
        #: Each device's rows of the training set (``None`` on a lab aggregator).
        self.parts = parts
        #: Local training and encoding of each device asked so far (made on first use; none
        #: on a lab aggregator).
        self.device_workers: dict[int, DeviceWorker] = {}
        #: Processes that train a round's devices (1: this one, no pool).
        self.n_workers = 1 if parts is None else self._resolve_workers()
        self._pool: TrainingPool | None = None
        #: The fixed evaluation subset (test-set indices, ``(k,)``) and its samples.
        self.eval_index: np.ndarray | None = None
        if cfg.eval_subset is not None:
            self.eval_index = subset_indices(
                len(self.data.y_test), cfg.eval_subset,
                experiment_generator(cfg.seed, Stream.EVAL),
            )
            if len(self.eval_index) == len(self.data.y_test):
                self._x_sub, self._y_sub = self.data.x_test, self.data.y_test
            else:
                self._x_sub = self.data.x_test[self.eval_index]
                self._y_sub = self.data.y_test[self.eval_index]
        #: Training losses of the committed rounds (``stop_at_loss``).
        self._losses: list[float] = []
        self._eps_max = 0.0
        self.book: PrivacyBook | None = None
        if self.unit is not None:
            if self.unit == "device" and cfg.privacy.accounting == "paper":
                warnings.warn(
                    "privacy.accounting=paper enforces the budget with 003's Theorem 1, which "
                    "is not a DP bound (docs/privacy.md); the strict epsilon is reported next "
                    "to it",
                    PaperAccountingWarning,
                    stacklevel=2,
                )
            self.book = PrivacyBook(
                rundir.ledger_path,
                delta=cfg.privacy.delta,
                enforce=cfg.privacy.enforced,
                target=cfg.privacy.epsilon,
                unit=self.unit,
                relation=cfg.privacy.relation,
                header=config_pin(cfg, hw),  # resume with an edited config is refused
            )
        self.w = get_flat(self.model)

    def _resolve_workers(self) -> int:
        """Worker processes for local training (``workers``; see
        :func:`~testbed.parallel_training.resolve_workers`). A power meter measures the whole
        host per device's time slice, so it needs one device at a time: ``auto`` is then 1
        and an explicit number is refused (before any work)."""
        cfg = self.cfg
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

    def _training_pool(self) -> TrainingPool | nullcontext[None]:
        """The run's worker processes (a context manager), forked now that the training set
        and the partition exist; ``nullcontext(None)`` when training stays here."""
        if self.n_workers <= 1 or self.parts is None:
            return nullcontext(None)
        cfg, model, meter, parts = self.cfg, self.model, self.energy_meter, self.parts
        x, y = self.data.x_train, self.data.y_train

        def make(device: int, record: RecordSettings | None) -> Any:
            return make_trainer(cfg, model, x, y, record, parts[device])

        def train(
            trainer: Any, record: RecordSettings | None, device: int, w: np.ndarray, t: int
        ) -> Trained:
            return train_device(cfg, trainer, record, meter, device, w, t)

        lock = getattr(self.rundir, "_lock_fd", None)
        return TrainingPool(self.n_workers, make, train, threads=cfg.torch_threads,
                            close_fds=() if lock is None else (lock,))

    def run(self, start_round: int = 0) -> dict[str, Any]:
        """Run rounds ``start_round .. rounds-1``; returns the summary.

        Never raises for an outcome: the summary's ``status`` (one of :data:`OUTCOMES`) and
        ``reason`` say how the run ended, and the run directory's lock is released.
        """
        cfg = self.cfg
        t_start = time.perf_counter()
        status, reason = "completed", ""
        record_dir = self.rundir.recordings_path if cfg.record else None
        bar = _progress_bar(cfg.rounds, start_round, enabled=self.progress)
        # stop_at_loss: the training losses committed so far (a resumed run that had already
        # reached the target completes without running another round).
        losses: list[float] = []
        self._losses = losses
        if cfg.stop_at_loss is not None and start_round > 0:
            losses += [m.get("train_loss", float("nan")) for m in self.rundir.metrics()]
            hit = uploads_to_target(losses, cfg.stop_at_loss, cfg.loss_target_window)
            if hit is not None:
                reason = self._target_reason(hit - 1)
                start_round = cfg.rounds
        try:
            # The pool first: its workers fork before signal handlers, link processes and
            # threads exist, and it is closed (workers reaped) after the link.
            with (
                self._training_pool() as pool,
                StopSignals() as stop,
                self._open_link(record_dir) as link,
            ):
                self._pool = pool
                for t in range(start_round, cfg.rounds):
                    stop.check()
                    line = self._round(t, link, stop)
                    if line is None:
                        status = "budget_exhausted"
                        reason = (
                            f"round {t}: no device can upload without passing its epsilon "
                            f"target {cfg.privacy.epsilon} ({cfg.privacy.enforced} accounting)"
                        )
                        break
                    with stop.critical():
                        self.rundir.commit_round(t, self.w, {"d": self.d}, line)
                    if self.on_round is not None:
                        self.on_round(line)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(self._progress_fields(line))
                    if cfg.stop_at_loss is not None:
                        # After the commit: the round that reached the target is kept.
                        losses.append(line["train_loss"])
                        if self._reaches_target(losses):
                            reason = self._target_reason(t)
                            break
        except KeyboardInterrupt:
            status, reason = "interrupted", "stopped by a signal (SIGINT/SIGTERM)"
        except LinkFailed as exc:
            status, reason = "link_failed", str(exc)
        except TrainingDiverged as exc:
            status, reason = "diverged", str(exc)
        except Exception as exc:  # noqa: BLE001 - every other failure is reported, not lost
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            (self.rundir.path / "error.log").write_text(traceback.format_exc())
        finally:
            self._pool = None
            if bar is not None:
                bar.close()
            summary = self._summary(status, reason, time.perf_counter() - t_start)
            if self.book is not None:
                self.book.close()
            self.rundir.write_summary(summary)
            self.rundir.close()
        return summary

    def _open_link(self, record_dir: Path | None) -> Link:
        """The run's link, started (closed when the run ends); ``record_dir``: where I/Q
        recordings go (``record: true``). A subclass may open another (the lab's split
        ``usrp`` receiver)."""
        return make_link(self.cfg, self.hw, record_dir, log_dir=self.rundir.path)

    def _reaches_target(self, losses: list[float]) -> bool:
        """Whether the training losses ``losses`` (one per round, the last one the newest)
        reach ``stop_at_loss`` (trailing mean over ``loss_target_window`` rounds)."""
        cfg = self.cfg
        if cfg.stop_at_loss is None or not losses:
            return False
        window = cfg.loss_target_window
        return bool(smoothed_losses(losses[-window:], window)[-1] <= cfg.stop_at_loss)

    def _target_reason(self, t: int) -> str:
        """The summary's reason of a run ended by ``stop_at_loss`` at round ``t``."""
        cfg = self.cfg
        return (
            f"target loss reached at round {t}: training loss averaged over "
            f"{cfg.loss_target_window} rounds <= stop_at_loss {cfg.stop_at_loss:g}"
        )

    def _progress_fields(self, line: dict[str, Any]) -> dict[str, str]:
        fields = {"loss": f"{line['train_loss']:.3f}"}
        if "test_accuracy" in line:
            self._last_accuracy = line["test_accuracy"]
        fields["acc"] = f"{getattr(self, '_last_accuracy', float('nan')):.3f}"
        if "subset_accuracy" in line:
            fields["acc_subset"] = f"{line['subset_accuracy']:.3f}"
        if self.book is not None:
            # Epsilon only grows with uploads: the running maximum needs this round's only.
            sent = [d["device"] for d in line["devices"] if d.get("transmitted")]
            self._eps_max = max([self._eps_max, *map(self.book.enforced_epsilon, sent)])
            fields["eps_max"] = f"{self._eps_max:.3g}"
        return fields

    def _event(self, i: int, t: int, state: ChannelState | None) -> PrivacyEvent:
        """The privacy event of device ``i``'s upload in round ``t`` given a channel state
        (``None``: unknown channel or a lost upload, no channel credit); see
        :func:`testbed.core.upload_events.upload_event`."""
        up = self.uplinks[i]
        rs = self.record[i] if self.record else None
        return upload_event(self.cfg, up, rs, i, t, channel_fields(state, up, self.d))

    def _gate(
        self, t: int, link: Link, skip: set[int]
    ) -> tuple[list[PrivacyEvent | None], list[np.random.Generator]]:
        """Per device (lists over every device): the gated event of its upload in round
        ``t`` (``None``: it may not upload), and its channel generator. Devices in ``skip``
        already uploaded or are not asked. See :meth:`_gate_devices`."""
        cfg = self.cfg
        asked = [i for i in range(cfg.devices) if i not in skip]
        events, probed = self._gate_devices(t, link, asked)
        rngs = [
            probed[i] if i in probed else experiment_generator(cfg.seed, Stream.CHANNEL, i, t)
            for i in range(cfg.devices)
        ]
        return [events.get(i) for i in range(cfg.devices)], rngs

    def _gate_devices(
        self, t: int, link: Link, devices: list[int]
    ) -> tuple[dict[int, PrivacyEvent | None], dict[int, np.random.Generator]]:
        """For each of ``devices``: the gated event of its upload in round ``t`` (``None``:
        it may not upload) and its channel generator (the probe drew from it; the
        transmission continues it). Decided before any of the round's training."""
        cfg = self.cfg
        gated_events: dict[int, PrivacyEvent | None] = {}
        rngs: dict[int, np.random.Generator] = {}
        for i in devices:
            up = self.uplinks[i]
            ch_rng = experiment_generator(cfg.seed, Stream.CHANNEL, i, t)
            rngs[i] = ch_rng
            state = link.probe(device=i, round_index=t, n_symbols=n_symbols_for(up.l), rng=ch_rng)
            # Only a link whose reception reports exactly the probed state may have the
            # budget checked against it; otherwise assume no channel-noise credit.
            gated = self._event(i, t, state if link.exact_state else None)
            ok = self.book is None or self.book.allows(gated)
            gated_events[i] = gated if ok else None
        return gated_events, rngs

    def _round(self, t: int, link: Link, stop: StopSignals) -> dict[str, Any] | None:
        cfg = self.cfg
        timer = StageTimer()
        t0 = time.perf_counter()
        kept = self.rundir.load_inflight(t)  # uploads of this round before an interruption
        selected = self.selected_devices(t)
        asked = sorted(i for i in selected if i not in kept)
        gated, ch_rngs = timer.timed("gate", lambda: self._gate_devices(t, link, asked))
        if not kept and all(gated[i] is None for i in asked):
            return None
        decoded: list[np.ndarray] = []
        losses: list[float] = []
        per_device: list[dict[str, Any]] = []
        secagg: dict[int, np.ndarray] = {}
        # Every gated device trains (in worker processes when there are some); the results
        # come back in device order, and each is encoded and sent before the next is taken.
        trained = self._local_training(t, [i for i in asked if gated[i] is not None], stop)
        for i in sorted({*asked, *kept}):
            if i in kept:
                vec, info = kept[i]
                tally({**info, "resumed": True}, vec, decoded, losses, per_device)
                continue
            event = gated[i]
            if event is None:
                per_device.append({"device": i, "transmitted": False})
                continue
            if self._pool is None:
                result = next(trained)
            else:  # the time this process waited for the workers
                result = timer.timed("train_wait", lambda: next(trained))
            assert result.device == i, (result.device, i)
            timer.add("train", result.seconds)
            local = self._device(i).encode(result, timer)
            if np.isfinite(local.train_loss):
                losses.append(local.train_loss)
            stop.check()  # a requested stop never lets another upload go on air
            if cfg.scheme == "zcdp-secagg":
                with stop.critical():
                    per_device.append(self._masked_upload(t, i, event, local))
                assert local.differential is not None
                secagg[i] = local.differential
                continue
            with stop.critical():
                info, g_hat = self._transmit(t, i, event, local, link, ch_rngs[i], timer)
                info["train_loss"] = local.train_loss
                timer.timed("keep", partial(self.rundir.save_inflight, t, i, g_hat, info))
                fault_point("after_inflight")
            if g_hat is not None:
                decoded.append(g_hat)
            per_device.append(info)
        if secagg:
            decoded.append(timer.timed("secagg", lambda: secure_sum(secagg, t)))
        line = self._close_round(t, decoded, losses, per_device, timer, t0, n_avg=len(selected))
        if len(selected) < cfg.devices:
            # Entries for the devices asked only: the line does not grow with the population.
            line["selected"] = len(selected)
            line["population"] = cfg.devices
        return line

    @property
    def pool_size(self) -> int:
        """Worker processes training this round (1: training in this process)."""
        return 1 if self._pool is None else self._pool.size

    def _local_training(self, t: int, devices: list[int], stop: StopSignals) -> Iterator[Trained]:
        """Round ``t``'s training of ``devices`` from the global model, in their order: in
        worker processes (all dispatched at once), or here, one when asked for (so that a
        stop request is seen between a device's training and its transmission)."""
        if self._pool is not None:
            if not devices:
                return
            tasks = [(i, self.record[i] if self.record else None) for i in devices]
            yield from self._pool.train(self.w, t, tasks, on_wait=stop.check)
            return
        for i in devices:
            yield self._device(i).train(self.w, t)

    def _device(self, i: int) -> DeviceWorker:
        """Device ``i``'s worker, made when first asked (its data are index rows into the
        shared training set; nothing is copied)."""
        worker = self.device_workers.get(i)
        if worker is None:
            assert self.parts is not None, "a lab aggregator trains no device"
            worker = DeviceWorker(
                self.cfg, self.model, i, self.data.x_train, self.data.y_train, self.uplinks[i],
                self.record[i] if self.record else None, self.run_secret, self.energy_meter,
                index=self.parts[i],
            )
            self.device_workers[i] = worker
        return worker

    def selected_devices(self, t: int) -> set[int]:
        """Devices asked to upload in round ``t`` (:func:`round_devices`)."""
        return round_devices(self.cfg, t)

    def _masked_upload(
        self, t: int, i: int, gated: PrivacyEvent, local: LocalUpload
    ) -> dict[str, Any]:
        """Record device ``i``'s secure-aggregation upload of round ``t``: masked integers on
        the control plane (they cannot cross an analog channel), so no channel credit."""
        if self.book is not None:
            nonce = self.book.begin(gated)
            self.last_committed = self._event(i, t, None)
            self.book.commit(self.last_committed, nonce)
        info: dict[str, Any] = {
            "device": i, "transmitted": True, "train_loss": local.train_loss,
            "carrier": SECAGG_CARRIER,
            "energy_comm_j": 0.0, "energy_comp_j": local.comp.energy_j,
            "energy_comp_source": local.comp.source, "sigma": self.uplinks[i].sigma,
        }
        if self.book is not None:
            for name, result in self.book.epsilon(i).items():
                info[f"epsilon_{name}"] = result.epsilon
        return info

    def _close_round(
        self,
        t: int,
        decoded: list[np.ndarray],
        losses: list[float],
        per_device: list[dict[str, Any]],
        timer: StageTimer,
        t0: float,
        *,
        n_avg: int | None = None,
    ) -> dict[str, Any]:
        """Aggregate round ``t``'s decoded differentials, evaluate, and build its metrics
        line (``per_device``: one entry per device asked, in device order). ``n_avg``: the
        number the sum is divided by (default every device, 003 eq. 14, or the
        ``sample_devices`` asked; the devices asked, for the schemes that sample devices)."""
        cfg = self.cfg
        default = cfg.sample_devices if cfg.sample_devices is not None else cfg.devices
        over = default if n_avg is None else max(1, n_avg)
        if decoded:  # nothing received (every upload lost): the model stays as it is
            self.w = timer.timed(
                "aggregate", lambda: global_update(self.w, average(decoded, over), cfg.lr)
            )
        lost = [d["device"] for d in per_device if d.get("lost")]
        train_loss = float(np.mean(losses)) if losses else float("nan")
        line: dict[str, Any] = {
            "round": t,
            "train_loss": train_loss,
            "uploads": len(decoded),
            "lost_uploads": len(lost),
        }
        line |= self._evaluations(t, train_loss, timer)
        line["devices"] = per_device
        line["wall_s"] = {k: round(v, 6) for k, v in timer.totals.items()}
        line["wall_s"]["round"] = round(time.perf_counter() - t0, 6)
        return line

    def _evaluations(self, t: int, train_loss: float, timer: StageTimer) -> dict[str, float]:
        """Round ``t``'s evaluations of the new global model: ``subset_accuracy`` and
        ``subset_loss`` on the fixed subset every round (``eval_subset``), and
        ``test_accuracy`` and ``test_loss`` on the full (capped) test set every
        ``eval_every`` rounds, in the last round and in the round that reaches
        ``stop_at_loss`` (so a run's final accuracy is always a full-set one). A round with
        both takes the subset's figures from the full pass."""
        cfg = self.cfg
        full = (
            (t + 1) % cfg.eval_every == 0
            or t + 1 == cfg.rounds
            or self._reaches_target([*self._losses, train_loss])
        )
        out: dict[str, float] = {}
        sub: Evaluation | None = None
        if full:
            data = self.data
            scores = timer.timed(
                "eval", lambda: sample_scores(self.model, self.w, data.x_test, data.y_test)
            )
            ev = scores.summary()
            out["test_accuracy"], out["test_loss"] = ev.accuracy, ev.loss
            if self.eval_index is not None:
                sub = scores.summary(self.eval_index)
        elif self.eval_index is not None:
            sub = timer.timed(
                "eval_subset", lambda: evaluate(self.model, self.w, self._x_sub, self._y_sub)
            )
        if sub is not None:
            out["subset_accuracy"], out["subset_loss"] = sub.accuracy, sub.loss
        return out

    def _transmit(
        self,
        t: int,
        i: int,
        gated: PrivacyEvent,
        local: LocalUpload,
        link: Link,
        rng: np.random.Generator,
        timer: StageTimer,
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """Journal, transmit, record and decode device ``i``'s upload of round ``t``.

        Returns its metrics entry and decoded differential (``None`` when lost). A dead
        link raises :class:`LinkFailed` after the upload is recorded without channel credit.
        """
        nonce = self.book.begin(gated) if self.book is not None else None
        fault_point("after_intent")
        return self._receive(
            t, i, nonce, local.upload.header, local.upload.symbols, local.upload.symbol_energy,
            local.comp.energy_j, local.comp.source, link, rng, timer,
        )

    def _receive(
        self,
        t: int,
        i: int,
        nonce: str | None,
        header: UploadHeader,
        symbols: np.ndarray,
        symbol_energy: float,
        energy_comp_j: float,
        energy_comp_source: str,
        link: Link,
        rng: np.random.Generator,
        timer: StageTimer,
        *,
        received: Reception | LinkError | None = None,
        energy_comm_j: float | None = None,
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """Carry device ``i``'s symbols over the link, record the upload under the intent
        ``nonce`` (journalled before the air) and decode it.

        ``received``: what a receiver already captured of this upload (the lab's USRP split,
        where the edge transmitted its own burst), instead of carrying ``symbols`` over
        ``link``; ``energy_comm_j``: the radio energy the edge reported (J), instead of the
        one computed from ``symbol_energy``.

        Returns its metrics entry and decoded differential (``None`` when lost). A dead
        link raises :class:`LinkFailed` after the upload is recorded without channel credit.
        """
        log_air(i, t, nonce)

        def carry() -> Reception:
            if isinstance(received, LinkError):
                raise received
            if received is not None:
                return received
            return link.transmit(device=i, round_index=t, symbols=symbols, rng=rng)

        try:
            reception = timer.timed("link", carry)
        except LinkError as exc:
            # It may have gone on air: it counts for privacy, with no channel credit.
            self.last_committed = self._event(i, t, None)
            if self.book is not None:
                assert nonce is not None
                self.book.commit(self.last_committed, nonce)
            if isinstance(exc, LinkFailed):
                raise
            return {"device": i, "transmitted": True, "lost": True, "error": str(exc)}, None
        fault_point("after_transmit")
        info: dict[str, Any] = dict(reception_metrics(reception, symbols))
        info["device"] = i
        info["transmitted"] = True
        committed = self._event(i, t, reception.state)
        self.last_committed = committed
        if self.book is not None:
            assert nonce is not None
            self.book.commit(committed, nonce)
            fault_point("after_commit")
            for name, result in self.book.epsilon(i).items():
                info[f"epsilon_{name}"] = result.epsilon
        g_hat = timer.timed("decode", lambda: decode_differential(reception, header, self._mask))
        cfg = self.cfg
        if self.unit != "record" and cfg.project_decoded and cfg.clip.mode == "coordinate":
            up = self.uplinks[i]
            g_hat = project_coordinates(
                g_hat, (self.d / up.l) * self.cfg.clip.bound / np.sqrt(self.d)
            )
        info["energy_comm_j"] = (
            symbol_energy * self.hw.tx_power_ref_w / self.hw.symbol_rate_hz
            if energy_comm_j is None
            else energy_comm_j
        )
        info["energy_comp_j"] = energy_comp_j  # J, this device's local training
        info["energy_comp_source"] = energy_comp_source
        info["alpha"] = header.alpha
        info["sigma"] = self.uplinks[i].sigma
        return info, g_hat

    def _mask(self, header: UploadHeader) -> np.ndarray:
        return sparsify_mask(
            self.run_secret, header.device, header.round_index, header.d, header.n_values
        )

    def _summary(self, status: str, reason: str, wall: float) -> dict[str, Any]:
        metrics = self.rundir.metrics()
        completed = len(metrics)  # the files are the truth (one line per committed round)
        evals = [m for m in metrics if "test_accuracy" in m]
        energy = np.zeros(self.cfg.devices)
        energy_comp = np.zeros(self.cfg.devices)
        lost = np.zeros(self.cfg.devices, dtype=int)
        for m in metrics:
            for dev in m.get("devices", []):
                energy[dev["device"]] += dev.get("energy_comm_j", 0.0)
                energy_comp[dev["device"]] += dev.get("energy_comp_j", 0.0)
                lost[dev["device"]] += int(bool(dev.get("lost")))
        listed = self._reported_devices(metrics)
        devices = []
        for i in listed:
            up = self.uplinks[i]
            entry: dict[str, Any] = {
                "device": i,
                "mechanism": up.mechanism,
                "sigma": up.sigma,
                "noise_variance": up.sigma**2,
                "alpha": up.alpha,
                "l": up.l,
                "levels": up.levels,
                "trusted_channel_noise": up.trusted,
                "expected_power_w": (
                    None
                    if up.expected_power is None
                    else up.expected_power * self.hw.tx_power_ref_w
                ),
            }
            if self.record:
                rs = self.record[i]
                entry |= {
                    "noise": rs.noise,
                    "noise_multiplier": rs.target_noise_multiplier,
                    "sampling_rate": rs.sampling_rate,
                    "secure_sampling": rs.amplified,
                    "example_clip": rs.example_clip,
                    "dataset_size": rs.dataset_size,
                    "channel_credited": rs.credit_channel,
                }
            if self.book is not None:
                entry |= self.book.report(i)
                if self.record:
                    peer = peer_report(self.cfg, self.record[i], int(entry["uploads"]))
                    if peer is not None:
                        entry["epsilon_peer_paper"] = peer
            else:
                entry["epsilon"] = None
            devices.append(entry)
        return {
            "status": status,
            "reason": reason,
            "exit_code": exit_code(status, completed, self.cfg),
            "scheme": self.cfg.scheme,
            "link": link_name(self.cfg, self.hw),
            "rounds_completed": completed,
            "rounds_planned": self.cfg.rounds,
            "d": self.d,
            "final_accuracy": evals[-1]["test_accuracy"] if evals else None,
            "final_accuracy_round": evals[-1]["round"] if evals else None,
            "best_accuracy": max((m["test_accuracy"] for m in evals), default=None),
            "final_subset_accuracy": next(
                (m["subset_accuracy"] for m in reversed(metrics) if "subset_accuracy" in m), None
            ),
            "evaluation": {
                "test_samples": len(self.data.y_test),
                "subset_samples": None if self.eval_index is None else len(self.eval_index),
                "eval_every": self.cfg.eval_every,
            },
            "workers": self.n_workers,
            "final_train_loss": metrics[-1]["train_loss"] if metrics else None,
            "lost_uploads": int(lost.sum()),
            "lost_uploads_per_device": lost.tolist(),
            "loss_targets": loss_target_energy(
                metrics, self.cfg.loss_targets, self.cfg.loss_target_window
            ),
            "energy_comm_j_per_device": energy.tolist(),
            "energy_comp_j_per_device": energy_comp.tolist(),
            "energy_comp_source": self.energy_meter.source,
            "privacy": {
                "unit": self.unit,
                "epsilon_target": self.cfg.privacy.epsilon if self.book is not None else None,
                "delta": self.cfg.privacy.delta,
                "enforced_accounting": self.cfg.privacy.enforced if self.unit else None,
                **self.delta_bound,
                **trust_fields(self.cfg, self.hw, self.unit, self.uplinks),
                "devices": devices,
                **(
                    {"population": self.cfg.devices, "devices_never_asked":
                     self.cfg.devices - len(listed)}
                    if self.cfg.sample_devices is not None
                    else {}
                ),
            },
            "wall_time_s": round(wall, 3),
        }


    def _reported_devices(self, metrics: list[dict[str, Any]]) -> list[int]:
        """Devices the summary lists: every device, or with ``sample_devices`` those asked
        in a committed round or holding a ledger record (so every upload's epsilon is
        reported, and the summary does not grow with devices never asked)."""
        if self.cfg.sample_devices is None:
            return list(range(self.cfg.devices))
        seen = {dev["device"] for m in metrics for dev in m.get("devices", [])}
        if self.book is not None:
            seen |= {event.device for event in self.book.ledger.events()}
        return sorted(seen)


def loss_target_energy(
    metrics: list[dict[str, Any]], targets: list[float], window: int = 1
) -> list[dict[str, Any]]:
    """For each target training loss: the first round whose training loss, averaged over the
    last ``window`` rounds (:func:`~aggregator.solver.calibration.uploads_to_target`), is at or
    below it, and the energy (J, computing plus radio, summed over devices) spent up to and
    including that round; ``round`` and ``energy_j`` are ``None`` when never reached."""
    losses = [m.get("train_loss", float("nan")) for m in metrics]
    energy = np.cumsum([
        sum(d.get("energy_comm_j", 0.0) + d.get("energy_comp_j", 0.0)
            for d in m.get("devices", []))
        for m in metrics
    ])
    out = []
    for target in targets:
        k = uploads_to_target(losses, target, window)
        out.append({
            "target": target,
            "window": window,
            "round": None if k is None else metrics[k - 1]["round"],
            "energy_j": None if k is None else float(energy[k - 1]),
        })
    return out


class PaperAccountingWarning(UserWarning):
    """The budget is enforced with 003's own accounting, which is not a DP bound."""


def _progress_bar(total: int, initial: int, *, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="round", desc="rounds", dynamic_ncols=True)


def _write_metadata(rundir: RunDir, cfg: ExperimentConfig, hw: HardwareConfig) -> None:
    import json

    rundir.write_text("config.yaml", dump_yaml(cfg))
    rundir.write_text("hw_config.yaml", dump_yaml(hw))
    rundir.write_text("run_secret", new_run_secret() + "\n", mode=0o600)
    meta = {
        "testbed_version": __version__,
        "seed": cfg.seed,
        "seed_streams": {s.name: int(s) for s in Stream},
        "link": link_name(cfg, hw),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "host": platform.node(),
        "privacy_noise_source": (
            "artificial privacy noise and secret Poisson batch sampling: OS CSPRNG (never "
            "the experiment seed)"
        ),
        "device_sampling_source": (
            "experiment seed (stream DEVICE_SAMPLING): reproducible, no amplification by "
            "device sampling credited"
            if cfg.sample_devices is not None
            else "OS CSPRNG (zcdp-secagg's r of n), no amplification by device sampling credited"
            if cfg.clients_per_round is not None and cfg.scheme == "zcdp-secagg"
            else "round robin (fedsgd-dpc's b of N)"
            if cfg.clients_per_round is not None
            else "none: every device every round"
        ),
        "channel_noise_source": channel_noise_source(cfg, hw),
    }
    meta["config_pin"] = config_pin(cfg, hw)  # checked on resume (testbed.core.recovery)
    rundir.write_text("meta.json", json.dumps(meta, indent=2) + "\n")


def run_experiment(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    progress: bool = False,
    hw: HardwareConfig | None = None,
    on_round: RoundCallback | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` into a new run directory ``out_dir``; returns the summary.

    Everything is validated (configs, data, link) before the first round. A run that
    fails or is stopped before anything went on air leaves no directory behind.
    """
    hw = hw if hw is not None else load_hardware(cfg.hw_config)
    check_link_config(cfg, hw, record=cfg.record)
    out_dir = Path(out_dir)
    rundir = RunDir.create(out_dir)
    try:
        _write_metadata(rundir, cfg, hw)
        exp = Experiment(cfg, hw, rundir, progress=progress, on_round=on_round)
    except BaseException:
        rundir.remove()
        raise
    summary = exp.run(0)
    if (
        summary["status"] in ("failed", "link_failed", "interrupted")
        and summary["rounds_completed"] == 0
        and directory_is_pristine(out_dir)
    ):
        rundir.remove()
        summary["run_dir_removed"] = True
    return summary


def resume_experiment(
    run_dir: Path, *, progress: bool = False, on_round: RoundCallback | None = None
) -> dict[str, Any]:
    """Continue an interrupted run from its last completed round.

    Raises
    ------
    RunDirError
        When the run's files are missing or disagree (see :mod:`testbed.core.recovery`).
    """
    rundir = RunDir.open(Path(run_dir))
    try:
        cfg = load_experiment(rundir.path / "config.yaml")
        hw = load_hardware(str(rundir.path / "hw_config.yaml"))
        check_config_pin(rundir, cfg, hw)
        point = resume_point(rundir, private=cfg.scheme != "fedavg")
        try:
            exp = Experiment(cfg, hw, rundir, progress=progress, on_round=on_round)
        except LedgerError as exc:
            raise RunDirError(str(exc)) from None
    except BaseException:
        rundir.close()
        raise
    if point.weights is not None:
        exp.w = point.weights
    return exp.run(point.next_round)
