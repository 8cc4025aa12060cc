"""The edge agent: one device of a lab run, in its own process (one per Jetson).

It holds its own data shard (the aggregator never sees data), trains, draws its own privacy
noise (OS CSPRNG), encodes and transmits; and it keeps its own privacy ledger under its
state directory and refuses to transmit past its own target (``--max-epsilon``), whatever
the aggregator asks.

Message flow (:mod:`testbed.core.transport.protocol`): ``hello`` -> ``welcome`` (config, mask
secret) ->
``ready`` (shard size, nonces it holds) -> ``sync`` (the aggregator's record of its uploads;
the edge adopts what it lacks) -> per round ``round`` -> ``upload`` or ``refuse`` -> ``ack``
(the credited channel fields it records) ... ``leave``. With no message for
``rejoin_after_s`` it says ``hello`` again (an aggregator restarted with ``--resume``).

On the ``usrp`` link the edge transmits its own burst on its own USRP
(:class:`radio.edge_radio.EdgeTransmitter`), due at the ``round``'s ``tx_time_s`` (its TDMA
slot's start), and its ``upload`` carries the header and the transmitter's report instead of
the symbols (``on_air``). Without a shared time reference it measures its clock offset to the
aggregator (``clock_req`` -> ``clock``, NTP-style) at set-up and before each burst; other
messages that arrive meanwhile are queued and handled afterwards.

Every ``round`` carries the aggregator's privacy event of the upload (``mechanism``); the
edge builds its own from the run's config and its shard, and refuses when they differ (both
ledgers must record the same event). Under 002's secure aggregation (``zcdp-secagg``) the
``round`` is answered with ``sa_keys`` and the round goes on in ``sa_*`` messages
(:mod:`edge_device.lab.secagg_phases`, :mod:`edge_device.lab.secagg_client`): the edge
records its upload when the aggregator relays the shares of ``U2`` (``sa_inbox``), before
it masks, and sends only its masked update. Its
fault points (:mod:`testbed.core.runs.faults`): ``edge_before_masked`` (recorded, not yet masked)
and ``edge_before_unmasking`` (masked input sent, unmasking request not answered); the
aggregator's: ``secagg_after_commit`` (``U2`` recorded, no inbox sent yet).

This module holds :class:`EdgeAgent`: its state, set-up (``welcome``), the message loop and
its dispatch. The handlers are functions of the agent in their own modules: the clock offset
(:mod:`edge_device.lab.clock`), ``sync`` and ``ack`` (:mod:`edge_device.lab.ledger_sync`),
``round`` (:mod:`edge_device.lab.rounds`), the burst (:mod:`edge_device.lab.transmit`), the
``sa_*`` phases (:mod:`edge_device.lab.secagg_phases`), the messages they share
(:mod:`edge_device.lab.replies`) and how the edge ends (:mod:`edge_device.lab.edge_end`).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_device.device_worker import DeviceWorker
from edge_device.energy_meter import make_meter
from edge_device.lab.agent_view import Prepared
from edge_device.lab.aircomp_edge import on_pilot
from edge_device.lab.clock import CLOCK_REPLY_TIMEOUT_S, measure_offset
from edge_device.lab.edge_end import (
    FINISHED_MARKER,
    give_up,
    on_finished,
    open_edge_book,
    record_end,
)
from edge_device.lab.errors import EdgeError
from edge_device.lab.ledger_sync import on_ack, on_sync, own_event
from edge_device.lab.replies import send
from edge_device.lab.rounds import on_round, on_slot
from edge_device.lab.secagg_client import EdgeSecAgg
from edge_device.lab.secagg_phases import SECAGG_MESSAGES, on_secagg
from edge_device.lab.transmit import AirFactory, open_air, open_transmitter
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.data.coded import take_rows
from testbed.core.privacy.book import PrivacyBook
from testbed.core.runs.rundir import RunDirError, atomic_write_bytes, lock_directory
from testbed.core.transport.curve_client import CurveClient
from testbed.core.transport.protocol import Message, ProtocolError, decode

if TYPE_CHECKING:
    from radio.edge_radio import EdgeTransmitter
    from radio.time_sync import OffsetEstimate

#: Seconds an edge that stops on an error gives its ``leave`` to reach the aggregator.
LEAVE_FLUSH_S = 0.3

__all__ = ["AirFactory", "EdgeAgent", "EdgeError", "open_transmitter"]

log = logging.getLogger("testbed.edge")


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
        This device's own training data (``testbed edge --data-dir``): every training row in
        it is the device's shard (:func:`testbed.core.run_setup.prepare_own_shard`), nothing
        else is read; ``None``: the run's data set at its ``data_dir`` on this host and the
        run's seeded shard of it.
    hw
        This host's hardware config (``None``: the run's).
    max_epsilon
        Its own privacy target; the ledger enforces ``min(max_epsilon, run target)``.
    rejoin_after_s
        Silence after which it says ``hello`` again.
    join_timeout_s
        Silence after which it gives up (:mod:`edge_device.lab.edge_end`).
    air_factory
        Opens the transmitter on the ``usrp`` link (default :func:`open_transmitter`; tests
        inject one with a stand-in stream).
    clock
        This host's clock (s): the one the transmitter maps burst times with.
    clock_timeout_s
        Seconds to wait for the answer to one ``clock_req``.
    keep_updates
        Keep this device's own update of every round it trained in (the model it trained
        from and its noisy differential, before encoding or masking) under
        ``state_dir/updates/``, for audits and tests; it never leaves this host.
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
        air_factory: AirFactory | None = None,
        clock: Callable[[], float] = time.time,
        clock_timeout_s: float = CLOCK_REPLY_TIMEOUT_S,
        keep_updates: bool = False,
        join_timeout_s: float = 600.0,
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
        #: Silence (s) after which the edge gives up (:func:`edge_device.lab.edge_end.give_up`).
        self.join_timeout_s = join_timeout_s
        self.run_id: str | None = None
        self.instance = secrets.token_hex(8)
        self.config_yaml: str | None = None
        self.book: PrivacyBook | None = None
        self.worker: DeviceWorker | None = None
        self.pending: dict[str, Any] = {}  # nonce -> event journalled, not yet acked
        self.withdrawn: set[str] = set()  # nonces refused or withdrawn (never on air)
        #: The upload of a paced round waiting for its ``slot`` (edge_device.lab.rounds).
        self.prepared: Prepared | None = None
        self.dropped = 0
        self.uploads = 0
        self.refusals = 0
        self.air_factory: AirFactory = air_factory or open_transmitter
        self.clock = clock
        self.clock_timeout_s = clock_timeout_s
        #: The device's transmitter (usrp link only) and whether its USRP time is shared.
        self.air: EdgeTransmitter | None = None
        self.shared_time = False
        #: The last control-plane offset (aggregator clock minus this host's).
        self.offset: OffsetEstimate | None = None
        #: Messages received while waiting for a ``clock`` reply, handled next.
        self.inbox: deque[list[bytes]] = deque()
        self.keep_updates = keep_updates
        #: 002's secure-aggregation sessions (scheme ``zcdp-secagg`` only).
        self.secagg: EdgeSecAgg | None = None

    # -- set-up ---------------------------------------------------------------------------
    def _setup(self, msg: Message) -> None:
        """Build data shard, model, worker and ledger from the run's config.

        The run's ``compute.device`` is resolved on this host first
        (:func:`testbed.core.compute.resolve_device`): ``auto`` takes this host's GPU if
        torch sees one; a CUDA device it does not see is refused before any work.
        """
        from testbed.core.compute import resolve_device
        from testbed.core.config.errors import ConfigError
        from testbed.core.config.loader import load_experiment, load_hardware
        from testbed.core.links import link_name, waveform_params
        from testbed.core.models import n_params
        from testbed.core.radio_fallback import check_same_radios
        from testbed.core.run_setup import (
            device_directory,
            device_settings,
            initial_model,
            prepare_data,
            prepare_own_shard,
        )

        cfg_path = self.state_dir / "config.yaml"
        atomic_write_bytes(cfg_path, msg["config_yaml"].encode())
        cfg: ExperimentConfig = load_experiment(cfg_path)
        if self.device >= cfg.devices:
            raise EdgeError(f"--device-id {self.device}: the run has {cfg.devices} devices")
        try:  # before any work: where this edge trains
            compute = resolve_device(cfg.compute.device)
        except ConfigError as exc:
            raise EdgeError(f"device {self.device}: {exc}") from None
        hw = self.hw_override or load_hardware(cfg.hw_config)
        import torch

        torch.set_num_threads(cfg.torch_threads)
        own = self.data_dir
        if own is None and cfg.partition == "files":  # its own directory under data_dir
            own = device_directory(cfg, self.device)
        if own is not None:  # its own data: all of it is this device's shard
            import numpy as np

            data = prepare_own_shard(cfg, own)
            mine = np.arange(len(data.y_train))
            # A device's settings depend on it only through its SNR and its sample count;
            # the other entries are not used here (the aggregator has the true sizes).
            sizes = [len(mine)] * cfg.devices
        else:  # the whole data set on this host: the run's seeded shard of it
            data, parts = prepare_data(cfg)
            mine = parts[self.device]
            sizes = [len(p) for p in parts]
        model = initial_model(cfg, data.x_train.shape[1:], compute.torch_device,
                              n_classes=data.n_classes)
        self.d = n_params(model)
        uplinks, record = device_settings(cfg, hw, self.d, sizes)
        self.uplink, self.record = uplinks[self.device], record[self.device]
        meter = make_meter(cfg.energy.source, cfg.energy.e_comp_j)
        self.worker = DeviceWorker(
            cfg, model, self.device, take_rows(data.x_train, mine), data.y_train[mine],
            self.uplink,
            self.record, msg["mask_secret"], meter, compute=compute.torch_device,
        )
        self.dataset_size = len(mine)
        self.cfg = cfg
        self.book, target = open_edge_book(cfg, self.state_dir, self.device, self.max_epsilon)
        if target is not None:
            self.target = target
        self.run_id = msg["run_id"]
        (self.state_dir / FINISHED_MARKER).unlink(missing_ok=True)  # a live run
        if cfg.scheme == "zcdp-secagg":
            self.secagg = EdgeSecAgg(self.device, self.d, cfg.clients_per_round or cfg.devices)
        self.link = link_name(cfg, hw)
        self.waveform = waveform_params(hw)
        if self.link == "usrp":
            try:
                check_same_radios(msg["radios"], hw)
            except ValueError as exc:
                raise EdgeError(f"device {self.device}: {exc}") from None
            open_air(self, hw)
        self.config_yaml = msg["config_yaml"]
        self.compute = compute
        log.info("device %d: set up for run %s (%d samples, d=%d, link %s, training on %s: "
                 "%s)", self.device, msg["run_id"], self.dataset_size, self.d, self.link,
                 compute.name, compute.reason)

    def _event(self, round_index: int, channel: dict[str, Any] | None) -> Any:
        """This device's own privacy event of its upload in a round
        (:func:`edge_device.lab.ledger_sync.own_event`)."""
        return own_event(self, round_index, channel)

    def _measure_offset(self, client: CurveClient, *, hold_s: float) -> OffsetEstimate:
        """Measure the offset to the aggregator's clock and hand it to the transmitter
        (:func:`edge_device.lab.clock.measure_offset`).

        Raises
        ------
        TimeoutError
            An exchange got no answer.
        """
        return measure_offset(self, client, hold_s=hold_s)

    # -- joining ----------------------------------------------------------------------------
    def _hello(self, client: CurveClient) -> None:
        """Say ``hello``; a full queue (no aggregator got it yet) is not an error here."""
        try:
            send(self, client, "hello", {"instance": self.instance}, timeout_s=1.0)
        except TimeoutError:
            log.info("device %d: the aggregator at %s has not taken a message yet",
                     self.device, self.endpoint)

    def _ready(self, client: CurveClient) -> None:
        """Say ``ready``: the shard's size and every nonce this device holds."""
        nonces = sorted((self.book.nonces() if self.book else set()) | set(self.pending))
        send(self, client, "ready", {"instance": self.instance,
                                     "dataset_size": self.dataset_size, "nonces": nonces})

    def _on_welcome(self, client: CurveClient, msg: Message) -> None:
        """``welcome``: set up (the first time; measure the clock offset on a usrp link
        without a shared reference), then say ``ready``.

        Raises
        ------
        EdgeError
            A later ``welcome`` carries another config.
        """
        if self.config_yaml is None:
            self._setup(msg)
            if self.air is not None and not self.shared_time:
                try:
                    self._measure_offset(client, hold_s=0.0)
                except TimeoutError as exc:  # measured again before every burst
                    log.warning("device %d: %s", self.device, exc)
        elif msg["config_yaml"] != self.config_yaml:
            raise EdgeError("the aggregator now runs another config; restart this edge")
        self._ready(client)

    # -- main loop --------------------------------------------------------------------------
    def handle(self, client: CurveClient, frames: list[bytes]) -> bool:
        """Act on one received message; ``True`` when the aggregator said ``leave``."""
        try:
            msg = decode(frames)
            if msg["device"] != self.device:
                raise ProtocolError(f"addressed to device {msg['device']}")
        except ProtocolError as exc:
            self.dropped += 1
            if self.dropped <= 20 or self.dropped % 1000 == 0:
                log.warning("device %d: dropped a message: %s", self.device, exc)
            return False
        if msg.type == "welcome":
            self._on_welcome(client, msg)
        elif msg.type == "finished":
            on_finished(self, msg)
            return True
        elif self.config_yaml is None:
            self.dropped += 1  # nothing but welcome before set-up
        elif msg.type == "sync":
            on_sync(self, msg)
        elif msg.type == "round":
            on_round(self, client, msg)
        elif msg.type == "slot":
            on_slot(self, client, msg)
        elif msg.type == "pilot":
            on_pilot(self, msg)
        elif msg.type == "ack":
            on_ack(self, msg)
        elif msg.type in SECAGG_MESSAGES:
            on_secagg(self, client, msg)
        elif msg.type == "clock":
            pass  # a late answer to an exchange given up
        elif msg.type == "leave":
            log.info("device %d: %s (%d uploads, %d refused)", self.device,
                     msg["reason"], self.uploads, self.refusals)
            if msg["reason"].startswith("run ended"):
                record_end(self.state_dir, self.run_id, msg["reason"])
            return True
        else:
            self.dropped += 1
        return False

    def _leave(self, client: CurveClient, reason: str) -> None:
        """Tell the aggregator this edge is going away (it then neither asks nor charges
        this device until it rejoins); best effort: the edge is ending anyway."""
        try:
            send(self, client, "leave", {"reason": f"edge stopped: {reason}"}, timeout_s=1.0)
            time.sleep(LEAVE_FLUSH_S)  # the socket closes without lingering: let it go out
        except Exception as exc:  # noqa: BLE001 - a dead connection changes nothing here
            log.debug("device %d: leave not sent: %s", self.device, exc)

    def run(self) -> int:
        """Serve until the aggregator says ``leave``; returns the exit code (0).

        Raises
        ------
        EdgeError
            The state directory is locked by another edge, or the edge cannot take part.
        """
        import zmq

        from testbed.core.transport.curve_keys import aggregator_public_key, load_device_keys
        from testbed.core.transport.protocol import MAX_MESSAGE_BYTES

        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            lock = lock_directory(self.state_dir)
        except RunDirError as exc:
            raise EdgeError(str(exc)) from None
        public, secret = load_device_keys(self.keys_dir, self.device)
        server_key = aggregator_public_key(self.keys_dir)
        ctx = zmq.Context()
        client = CurveClient(ctx, self.endpoint, client_public=public, client_secret=secret,
                             server_public=server_key, max_message_bytes=MAX_MESSAGE_BYTES)
        try:
            self._hello(client)
            heard = answered = time.monotonic()
            while True:
                # messages queued during a clock exchange first, in the order they came
                frames = self.inbox.popleft() if self.inbox else client.recv(0.5)
                if frames is None:
                    if time.monotonic() - answered > self.join_timeout_s:
                        return give_up(self)
                    if time.monotonic() - heard > self.rejoin_after_s:
                        self._hello(client)
                        heard = time.monotonic()
                    continue
                try:
                    if self.handle(client, frames):
                        return 0
                except EdgeError as exc:
                    self._leave(client, str(exc))
                    raise
                heard = answered = time.monotonic()
        finally:
            client.close()
            ctx.term()
            if self.air is not None:
                self.air.close()
            if self.book is not None:
                self.book.close()
            os.close(lock)
