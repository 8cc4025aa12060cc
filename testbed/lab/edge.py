"""The edge agent: one device of a lab run, in its own process (one per Jetson).

It holds its own data shard (the aggregator never sees data), trains, draws its own privacy
noise (OS CSPRNG), encodes and transmits; and it keeps its own privacy ledger under its
state directory and refuses to transmit past its own target (``--max-epsilon``), whatever
the aggregator asks.

Message flow (:mod:`testbed.protocol`): ``hello`` -> ``welcome`` (config, mask secret) ->
``ready`` (shard size, nonces it holds) -> ``sync`` (the aggregator's record of its uploads;
the edge adopts what it lacks) -> per round ``round`` -> ``upload`` or ``refuse`` -> ``ack``
(the credited channel fields it records) ... ``leave``. With no message for
``rejoin_after_s`` it says ``hello`` again (an aggregator restarted with ``--resume``).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.privacy_book import PrivacyBook
from edge_device.energy_meter import make_meter
from testbed.config.experiment import ExperimentConfig
from testbed.config.hardware import HardwareConfig
from testbed.device_worker import DeviceWorker, TrainingDiverged
from testbed.faults import fault_point
from testbed.lab.secure_socket import CurveClient
from testbed.protocol import Message, ProtocolError, decode, encode
from testbed.rundir import RunDirError, _lock, atomic_write_bytes
from testbed.stage_timer import StageTimer
from testbed.upload_events import CHANNEL_KEYS, channel_fields, upload_event

log = logging.getLogger("testbed.edge")


class EdgeError(RuntimeError):
    """The edge cannot take part (bad state directory, config it cannot run, no radio)."""


class EdgeAgent:
    """One device's agent.

    Parameters
    ----------
    endpoint
        The aggregator's control endpoint (``tcp://HOST:PORT``).
    device
        This device's id (must match its key's id on the aggregator's allow-list).
    keys_dir
        Holds ``device-I.key``, ``device-I.key_secret`` and ``aggregator.key``.
    state_dir
        Its own ledger and intents (one process per directory: locked).
    data_dir
        Overrides the config's ``data_dir`` (the data as found on this host).
    hw
        This host's hardware config (``None``: the run's).
    max_epsilon
        Its own privacy target; the ledger enforces ``min(max_epsilon, run target)``.
    rejoin_after_s
        Silence after which it says ``hello`` again.
    """

    def __init__(
        self,
        endpoint: str,
        device: int,
        keys_dir: Path,
        state_dir: Path,
        *,
        data_dir: Path | None = None,
        hw: HardwareConfig | None = None,
        max_epsilon: float | None = None,
        rejoin_after_s: float = 10.0,
    ) -> None:
        if max_epsilon is not None and not (math.isfinite(max_epsilon) and max_epsilon > 0):
            raise ValueError(f"--max-epsilon: got {max_epsilon}; allowed: a finite value > 0")
        self.endpoint = endpoint
        self.device = device
        self.keys_dir = keys_dir
        self.state_dir = state_dir
        self.data_dir = data_dir
        self.hw_override = hw
        self.max_epsilon = max_epsilon
        self.rejoin_after_s = rejoin_after_s
        self.instance = secrets.token_hex(8)
        self.config_yaml: str | None = None
        self.book: PrivacyBook | None = None
        self.worker: DeviceWorker | None = None
        self.pending: dict[str, Any] = {}  # nonce -> event journalled, not yet acked
        self.dropped = 0
        self.uploads = 0
        self.refusals = 0

    # -- set-up ---------------------------------------------------------------------------
    def _setup(self, msg: Message) -> None:
        """Build data shard, model, worker and ledger from the run's config."""
        from testbed.config.loader import load_experiment, load_hardware
        from testbed.models import build_model, n_params
        from testbed.runner import device_settings, prepare_data
        from testbed.seeding import Stream, experiment_generator

        cfg_path = self.state_dir / "config.yaml"
        atomic_write_bytes(cfg_path, msg["config_yaml"].encode())
        overrides = [f"data_dir={self.data_dir}"] if self.data_dir is not None else []
        cfg: ExperimentConfig = load_experiment(cfg_path, overrides)
        if self.device >= cfg.devices:
            raise EdgeError(f"--device-id {self.device}: the run has {cfg.devices} devices")
        hw = self.hw_override or load_hardware(cfg.hw_config)
        import torch

        torch.set_num_threads(cfg.torch_threads)
        data, parts = prepare_data(cfg)
        mine = parts[self.device]
        sizes = [len(p) for p in parts]
        shape = tuple(int(s) for s in data.x_train.shape[1:])
        init_seed = int(experiment_generator(cfg.seed, Stream.MODEL_INIT).integers(2**31))
        model = build_model(cfg.model, shape, init_seed)  # type: ignore[arg-type]
        self.d = n_params(model)
        uplinks, record = device_settings(cfg, hw, self.d, sizes)
        self.uplink, self.record = uplinks[self.device], record[self.device]
        meter = make_meter(cfg.energy.source, cfg.energy.e_comp_j)
        self.worker = DeviceWorker(
            cfg, model, self.device, data.x_train[mine], data.y_train[mine], self.uplink,
            self.record, msg["mask_secret"], meter,
        )
        self.dataset_size = len(mine)
        self.cfg = cfg
        unit = None if cfg.scheme == "fedavg" else cfg.privacy.unit
        if unit is not None:
            target = cfg.privacy.epsilon
            if self.max_epsilon is not None:
                target = min(target, self.max_epsilon)
            self.book = PrivacyBook(
                self.state_dir / "ledger.jsonl", delta=cfg.privacy.delta,
                enforce=cfg.privacy.enforced, target=target, unit=unit,
                relation=cfg.privacy.relation, header={"device": self.device},
            )
            self.target = target
        self.config_yaml = msg["config_yaml"]
        log.info("device %d: set up for run %s (%d samples, d=%d)", self.device,
                 msg["run_id"], self.dataset_size, self.d)

    def _event(self, round_index: int, channel: dict[str, Any] | None) -> Any:
        fields = channel_fields(None, self.uplink, self.d)
        if channel is not None:
            fields |= {k: channel[k] for k in CHANNEL_KEYS if k in channel}
        return upload_event(self.cfg, self.uplink, self.record, self.device, round_index,
                            fields)

    # -- handlers ---------------------------------------------------------------------------
    def _send(self, client: CurveClient, msg_type: str, fields: dict[str, Any],
              payload: bytes | None = None) -> None:
        client.send(encode(msg_type, {"device": self.device, **fields}, payload))

    def _ready(self, client: CurveClient) -> None:
        nonces = sorted((self.book.nonces() if self.book else set()) | set(self.pending))
        self._send(client, "ready", {"instance": self.instance,
                                     "dataset_size": self.dataset_size, "nonces": nonces})

    def _on_welcome(self, client: CurveClient, msg: Message) -> None:
        if self.config_yaml is None:
            self._setup(msg)
        elif msg["config_yaml"] != self.config_yaml:
            raise EdgeError("the aggregator now runs another config; restart this edge")
        self._ready(client)

    def _on_sync(self, msg: Message) -> None:
        if self.book is None:
            return
        recorded = self.book.nonces()
        theirs = set()
        for item in msg["events"]:
            nonce, data = item["nonce"], item["event"]
            theirs.add(nonce)
            if not isinstance(data.get("round"), int) or data.get("device") != self.device:
                self.dropped += 1
                continue
            mine = self._event(data["round"], data)
            if nonce in recorded:
                if mine.to_dict() != self.book.entries_by_nonce().get(nonce, mine).to_dict():
                    log.warning("device %d: ledgers differ on upload %s", self.device, nonce)
                continue
            self.pending.pop(nonce, None)
            self.book.commit(mine, nonce)
            log.info("device %d: recorded upload %s of round %d as the aggregator did",
                     self.device, nonce, data["round"])
        missing = recorded - theirs
        if missing:
            log.warning("device %d: the aggregator holds no record of %d uploads of this "
                        "device's ledger", self.device, len(missing))

    def _on_round(self, client: CurveClient, msg: Message) -> None:
        assert self.worker is not None
        t, nonce = msg["round"], msg["nonce"]
        known = (self.book.nonces() if self.book else set()) | set(self.pending)
        last = max((e.round for _, e in self.book.entries(self.device)), default=-1) if (
            self.book) else -1
        if nonce in known or t < last or msg["d"] != self.d:
            self.dropped += 1
            log.warning("device %d: ignored a replayed or out-of-round request (round %d)",
                        self.device, t)
            return
        event = self._event(t, msg["channel"])
        if self.book is not None and not self.book.allows(event):
            self.refusals += 1
            self._send(client, "refuse", {
                "round": t, "nonce": nonce,
                "reason": f"this upload would pass the device's own epsilon target "
                          f"{self.target:g} ({self.book.enforce} accounting)",
            })
            return
        w = np.frombuffer(msg.payload or b"", dtype="<f8").astype(np.float64)
        try:
            local = self.worker.update(w, t, StageTimer())
        except TrainingDiverged as exc:
            self._send(client, "refuse", {"round": t, "nonce": nonce, "reason": str(exc)})
            return
        fault_point("edge_before_intent")
        if self.book is not None:
            self.book.begin(event, nonce)  # before the air
        self.pending[nonce] = event
        fault_point("edge_after_intent")
        up = local.upload
        symbols = np.ascontiguousarray(up.symbols, dtype="<c16")
        loss = local.train_loss if math.isfinite(local.train_loss) else None
        self._send(client, "upload", {
            "round": t, "nonce": nonce, "header": up.header.to_dict(),
            "n_symbols": int(symbols.size), "symbol_energy": float(up.symbol_energy),
            "train_loss": loss, "energy_comp_j": float(local.comp.energy_j),
            "energy_comp_source": str(local.comp.source),
        }, symbols.tobytes())
        self.uploads += 1

    def _on_ack(self, msg: Message) -> None:
        nonce = msg["nonce"]
        event = self.pending.pop(nonce, None)
        if event is None:
            self.dropped += 1
            return
        if self.book is not None:
            self.book.commit(self._event(event.round, msg["channel"]), nonce)

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until the aggregator says ``leave``; returns the exit code (0)."""
        import zmq

        from testbed.lab.aggregator import MAX_MESSAGE_BYTES
        from testbed.lab.curve_keys import aggregator_public_key, load_device_keys

        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            lock = _lock(self.state_dir)
        except RunDirError as exc:
            raise EdgeError(str(exc)) from None
        public, secret = load_device_keys(self.keys_dir, self.device)
        server_key = aggregator_public_key(self.keys_dir)
        ctx = zmq.Context()
        client = CurveClient(ctx, self.endpoint, client_public=public, client_secret=secret,
                             server_public=server_key, max_message_bytes=MAX_MESSAGE_BYTES)
        try:
            self._send(client, "hello", {"instance": self.instance})
            heard = time.monotonic()
            while True:
                frames = client.recv(0.5)
                if frames is None:
                    if time.monotonic() - heard > self.rejoin_after_s:
                        self._send(client, "hello", {"instance": self.instance})
                        heard = time.monotonic()
                    continue
                heard = time.monotonic()
                try:
                    msg = decode(frames)
                    if msg["device"] != self.device:
                        raise ProtocolError(f"addressed to device {msg['device']}")
                except ProtocolError as exc:
                    self.dropped += 1
                    if self.dropped <= 20 or self.dropped % 1000 == 0:
                        log.warning("device %d: dropped a message: %s", self.device, exc)
                    continue
                if msg.type == "welcome":
                    self._on_welcome(client, msg)
                elif self.config_yaml is None:
                    self.dropped += 1  # nothing but welcome before set-up
                elif msg.type == "sync":
                    self._on_sync(msg)
                elif msg.type == "round":
                    self._on_round(client, msg)
                elif msg.type == "ack":
                    self._on_ack(msg)
                elif msg.type == "leave":
                    log.info("device %d: %s (%d uploads, %d refused)", self.device,
                             msg["reason"], self.uploads, self.refusals)
                    return 0
                else:
                    self.dropped += 1
        finally:
            client.close()
            ctx.term()
            if self.book is not None:
                self.book.close()
            os.close(lock)
