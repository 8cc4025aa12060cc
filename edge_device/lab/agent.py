"""The edge agent: one device of a lab run, in its own process (one per Jetson).

It holds its own data shard (the aggregator never sees data), trains, draws its own privacy
noise (OS CSPRNG), encodes and transmits; and it keeps its own privacy ledger under its
state directory and refuses to transmit past its own target (``--max-epsilon``), whatever
the aggregator asks.

Message flow (:mod:`testbed.core.protocol`): ``hello`` -> ``welcome`` (config, mask secret) ->
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
(:mod:`edge_device.lab.secagg_client`): the edge records its upload when the aggregator relays the
shares of ``U2`` (``sa_inbox``), before it masks, and sends only its masked update. Its
fault points (:mod:`testbed.core.faults`): ``edge_before_masked`` (recorded, not yet masked) and
``edge_before_unmasking`` (masked input sent, unmasking request not answered); the
aggregator's: ``secagg_after_commit`` (``U2`` recorded, no inbox sent yet).
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

import numpy as np

from edge_device.device_worker import DeviceWorker, TrainingDiverged
from edge_device.energy_meter import make_meter
from edge_device.lab.edge_end import (
    FINISHED_MARKER,
    give_up,
    on_finished,
    open_edge_book,
    record_end,
)
from edge_device.lab.secagg_client import SESSION_ERRORS, EdgeSecAgg
from radio.link import LinkError, LinkFailed
from radio.usrp_settings import DeviceRadio
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.faults import fault_point
from testbed.core.privacy_book import PrivacyBook
from testbed.core.protocol import Message, ProtocolError, decode, encode
from testbed.core.rundir import RunDirError, atomic_write_bytes, lock_directory
from testbed.core.secure_socket import CurveClient
from testbed.core.stage_timer import StageTimer
from testbed.core.upload_events import CHANNEL_KEYS, channel_fields, upload_event

if TYPE_CHECKING:
    from radio.edge_radio import EdgeTransmitter
    from radio.time_sync import OffsetEstimate

log = logging.getLogger("testbed.edge")

#: Opens the device's transmitter: (its radio settings, the folder for ``tx.log``).
AirFactory = Callable[[DeviceRadio, Path], "EdgeTransmitter"]
#: Seconds an edge waits for the aggregator's answer to one ``clock_req``.
CLOCK_REPLY_TIMEOUT_S = 2.0
#: Seconds added to a burst's lead when sizing the offset's drift allowance (``hold_s``).
HOLD_MARGIN_S = 1.0
#: Messages kept while waiting for a ``clock`` reply; beyond, the oldest are dropped.
MAX_QUEUED = 10_000


def open_transmitter(radio: DeviceRadio, log_dir: Path) -> EdgeTransmitter:
    """The device's ``tx`` flowgraph on its own USRP (looked for first)."""
    from radio.edge_radio import EdgeTransmitter

    return EdgeTransmitter(radio, log_dir=log_dir)


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
        #: Nonces recorded from the aggregator's ``sync`` that this edge never began, and
        #: the last simulated-link upload sent (nonce, fields, payload): a restarted
        #: aggregator asks for either again under the recorded nonce (aggregator.lab.resume).
        self.adopted: set[str] = set()
        self.last_sent: tuple[str, dict[str, Any], bytes] | None = None
        self.resend_ok: str | None = None  # last_sent's nonce once a sync recorded it
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
        """Build data shard, model, worker and ledger from the run's config."""
        from testbed.core.config.loader import load_experiment, load_hardware
        from testbed.core.links import link_name, waveform_params
        from testbed.core.models import n_params
        from testbed.core.run_setup import device_settings, initial_model, prepare_data

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
        model = initial_model(cfg, data.x_train.shape[1:])
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
            self._open_air(hw)
        self.config_yaml = msg["config_yaml"]
        log.info("device %d: set up for run %s (%d samples, d=%d, link %s)", self.device,
                 msg["run_id"], self.dataset_size, self.d, self.link)

    def _open_air(self, hw: HardwareConfig) -> None:
        """Open this device's transmitter (usrp link)."""
        from radio.edge_radio import RadioUnavailable
        from radio.tdma import shared_reference
        from testbed.core.config.hardware import device_radio

        self.shared_time = shared_reference(hw.usrp.time_source)
        try:
            self.air = self.air_factory(device_radio(hw, self.device), self.state_dir)
        except RadioUnavailable as exc:
            raise EdgeError(str(exc)) from None

    def _event(self, round_index: int, channel: dict[str, Any] | None) -> Any:
        fields = channel_fields(None, self.uplink, self.d)
        if channel is not None:
            fields |= {k: channel[k] for k in CHANNEL_KEYS if k in channel}
        return upload_event(self.cfg, self.uplink, self.record, self.device, round_index,
                            fields)

    # -- handlers ---------------------------------------------------------------------------
    def _send(self, client: CurveClient, msg_type: str, fields: dict[str, Any],
              payload: bytes | None = None, timeout_s: float = 5.0) -> None:
        client.send(encode(msg_type, {"device": self.device, **fields}, payload), timeout_s)

    def _hello(self, client: CurveClient) -> None:
        """Say ``hello``; a full queue (no aggregator got it yet) is not an error here."""
        try:
            self._send(client, "hello", {"instance": self.instance}, timeout_s=1.0)
        except TimeoutError:
            log.info("device %d: the aggregator at %s has not taken a message yet",
                     self.device, self.endpoint)

    def _ready(self, client: CurveClient) -> None:
        nonces = sorted((self.book.nonces() if self.book else set()) | set(self.pending))
        self._send(client, "ready", {"instance": self.instance,
                                     "dataset_size": self.dataset_size, "nonces": nonces})

    def _on_welcome(self, client: CurveClient, msg: Message) -> None:
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

    # -- the control-plane clock offset (usrp link without a shared reference) --------------
    def _queue(self, frames: list[bytes]) -> None:
        if len(self.inbox) >= MAX_QUEUED:
            self.inbox.popleft()
            self.dropped += 1
        self.inbox.append(frames)

    def _read_aggregator_clock(self, client: CurveClient) -> float:
        """One exchange: ask for the aggregator's clock and wait for the matching answer;
        every other message meanwhile is queued.

        Raises
        ------
        TimeoutError
            No answer within ``clock_timeout_s``.
        """
        t_send = float(self.clock())
        self._send(client, "clock_req", {"t_send": t_send})
        end = time.monotonic() + self.clock_timeout_s
        while (left := end - time.monotonic()) > 0:
            frames = client.recv(left)
            if frames is None:
                break
            try:
                msg = decode(frames)
            except ProtocolError:
                self._queue(frames)  # the main loop drops and logs it
                continue
            if msg.type == "clock" and msg["device"] == self.device and msg["t_send"] == t_send:
                return float(msg["t_remote"])
            self._queue(frames)
        raise TimeoutError(f"device {self.device}: no clock reply from the aggregator within "
                           f"{self.clock_timeout_s:g} s")

    def _measure_offset(self, client: CurveClient, *, hold_s: float) -> OffsetEstimate:
        """Measure the offset to the aggregator's clock and hand it to the transmitter.

        ``hold_s``: how long (s) after the exchanges the estimate will be used (its drift
        allowance; at least the library's default).

        Raises
        ------
        TimeoutError
            An exchange got no answer.
        """
        from radio.time_sync import DEFAULT_HOLD_S, measure_offset

        assert self.air is not None
        offset = measure_offset(lambda: self._read_aggregator_clock(client), clock=self.clock,
                                hold_s=max(DEFAULT_HOLD_S, hold_s))
        self.air.set_offset(offset)
        self.offset = offset
        log.info("device %d: clock offset to the aggregator %+.6f s +- %.3f ms (rtt %.3f ms)",
                 self.device, offset.offset_s, 1e3 * offset.uncertainty_s, 1e3 * offset.rtt_s)
        return offset

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
            if self.pending.pop(nonce, None) is None:
                self.adopted.add(nonce)  # never begun here: it may still be asked for
            self.book.commit(mine, nonce)
            log.info("device %d: recorded upload %s of round %d as the aggregator did",
                     self.device, nonce, data["round"])
        if self.last_sent is not None and self.last_sent[0] in theirs:
            self.resend_ok = self.last_sent[0]  # a restarted aggregator may ask for it again
        missing = recorded - theirs
        if missing:
            log.warning("device %d: the aggregator holds no record of %d uploads of this "
                        "device's ledger", self.device, len(missing))

    def _refuse(self, client: CurveClient, t: int, nonce: str, reason: str) -> None:
        """Say ``refuse`` (nothing went on air); a replay of the request is then ignored."""
        self.refusals += 1
        self.withdrawn.add(nonce)
        self._send(client, "refuse", {"round": t, "nonce": nonce, "reason": reason})

    def _withdraw(self, client: CurveClient, t: int, nonce: str, reason: str) -> None:
        """Withdraw a journalled intent whose burst was not sent, and refuse."""
        if self.book is not None:
            self.book.cancel(nonce)
        self.pending.pop(nonce, None)
        self._refuse(client, t, nonce, reason)

    def _on_round(self, client: CurveClient, msg: Message) -> None:
        assert self.worker is not None
        t, nonce, tx_time = msg["round"], msg["nonce"], msg["tx_time_s"]
        if self.last_sent is not None and self.last_sent[0] == nonce == self.resend_ok:
            self._send(client, "upload", *self.last_sent[1:])  # the same upload, again
            return
        again = nonce in self.adopted  # recorded already; no second record
        known = (self.book.nonces() if self.book else set()) | set(self.pending) | self.withdrawn
        known -= {nonce} if again else set()
        if self.secagg is not None:
            known |= self.secagg.seen
        rounds = {e.round for _, e in self.book.entries(self.device)} if self.book else set()
        if again:
            rounds.discard(t)
        if nonce in known or t < max(rounds, default=-1) or msg["d"] != self.d:
            self.dropped += 1
            log.warning("device %d: ignored a replayed or out-of-round request (round %d)",
                        self.device, t)
            return
        if t in rounds:  # e.g. asked again after the aggregator restarted: one per round
            self._refuse(client, t, nonce, f"this device's ledger already records an upload "
                                           f"in round {t}")
            return
        if tx_time is not None and self.air is None:
            self._refuse(client, t, nonce, (
                f"the aggregator runs the usrp link, but this edge's link is {self.link} "
                "(no transmitter); start it with --hw naming the lab's usrp config"))
            return
        if tx_time is None and self.air is not None and self.secagg is None:
            log.warning("device %d: round %d without a slot time: the aggregator's link is "
                        "simulated; sending the symbols over the control plane", self.device, t)
        event = self._event(t, msg["channel"])
        differs = self._mechanism_differs(event, msg["mechanism"])
        if differs:
            self._refuse(client, t, nonce, differs)
            return
        if self.book is not None and not again and not self.book.allows(event):
            self._refuse(client, t, nonce, (
                f"this upload would pass the device's own epsilon target "
                f"{self.target:g} ({self.book.enforce} accounting)"))
            return
        w = np.frombuffer(msg.payload or b"", dtype="<f8").astype(np.float64)
        try:
            local = self.worker.update(w, t, StageTimer())
        except TrainingDiverged as exc:
            self._refuse(client, t, nonce, str(exc))
            return
        self._keep(t, nonce, w, local.differential)
        if self.secagg is not None:
            self._secagg_begin(client, t, nonce, w, local, event)
            return
        if tx_time is not None:
            self._transmit(client, t, nonce, event, local, float(tx_time))
            return
        fault_point("edge_before_intent")
        if self.book is not None and not again:
            self.book.begin(event, nonce)  # before the air
        if not again:
            self.pending[nonce] = event
        fault_point("edge_after_intent")
        symbols = np.ascontiguousarray(local.upload.symbols, dtype="<c16")
        fields = {**self._upload_fields(t, nonce, local, int(symbols.size)), "on_air": False,
                  "tx_report": None}
        self.last_sent = (nonce, fields, symbols.tobytes())
        self._send(client, "upload", fields, self.last_sent[2])
        self.adopted.discard(nonce)
        self.uploads += 1

    def _upload_fields(self, t: int, nonce: str, local: Any, n_symbols: int) -> dict[str, Any]:
        up = local.upload
        loss = local.train_loss if math.isfinite(local.train_loss) else None
        return {
            "round": t, "nonce": nonce, "header": up.header.to_dict(),
            "n_symbols": n_symbols, "symbol_energy": float(up.symbol_energy),
            "train_loss": loss, "energy_comp_j": float(local.comp.energy_j),
            "energy_comp_source": str(local.comp.source),
        }

    def _transmit(
        self, client: CurveClient, t: int, nonce: str, event: Any, local: Any, tx_time_s: float
    ) -> None:
        """Usrp link: send this round's burst at ``tx_time_s`` (the slot's start, schedule
        time base), the intent journalled before the air; then ``upload`` its report.

        Raises
        ------
        EdgeError
            The transmitter is dead (the intent is withdrawn and the round refused first).
        """
        from radio.modem import modulate

        assert self.air is not None
        if not self.shared_time:
            # Re-measured before every burst; its drift allowance covers the time to the slot.
            lead = tx_time_s - (self.offset.to_remote(self.clock()) if self.offset else
                                tx_time_s)
            try:
                self._measure_offset(client, hold_s=max(0.0, lead) + HOLD_MARGIN_S)
            except TimeoutError as exc:
                self._refuse(client, t, nonce, f"not sent: {exc}; the slot time cannot be "
                                               "mapped to this host's clock")
                return
        fault_point("edge_before_intent")
        if self.book is not None:
            self.book.begin(event, nonce)  # before the air
        self.pending[nonce] = event
        fault_point("edge_after_intent")
        up = local.upload
        samples, _ = modulate(self.waveform, np.asarray(up.symbols, dtype=np.complex128))
        try:
            report = self.air.transmit(samples, tx_time_s)
        except LinkFailed as exc:
            self._withdraw(client, t, nonce, f"transmitter failed: {exc}")
            raise EdgeError(f"device {self.device}: the transmitter failed: {exc}") from exc
        except (LinkError, ValueError) as exc:  # not sent: slot missed, power, time base
            self._withdraw(client, t, nonce, f"not sent: {exc}")
            log.warning("device %d: round %d: burst not sent: %s", self.device, t, exc)
            return
        self._send(client, "upload", {
            **self._upload_fields(t, nonce, local, int(up.symbols.size)),
            "on_air": True,
            "tx_report": {
                "airtime_s": float(report.airtime_s), "tx_power_w": float(report.tx_power_w),
                "tx_time_usrp_s": float(report.tx_time_usrp_s),
                "timing_uncertainty_s": float(report.timing_uncertainty_s),
            },
        }, b"")
        self.uploads += 1

    def _on_ack(self, msg: Message) -> None:
        nonce = msg["nonce"]
        event = self.pending.pop(nonce, None)
        if event is None:
            self.dropped += 1
            return
        if self.book is not None:
            self.book.commit(self._event(event.round, msg["channel"]), nonce)

    def _mechanism_differs(self, event: Any, theirs: dict[str, Any] | None) -> str | None:
        """Why the aggregator's event of this upload is not this device's own (``None``:
        they agree, or either side keeps no ledger)."""
        if self.book is None or theirs is None:
            return None
        mine = event.to_dict()
        if mine == theirs:
            return None
        keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        diff = ", ".join(f"{k}: aggregator {theirs.get(k)!r}, this device {mine.get(k)!r}"
                         for k in keys)
        return (f"the aggregator's privacy event of this upload differs from this device's "
                f"own ({diff}); do both run the same config and data?")

    def _keep(self, t: int, nonce: str, w: np.ndarray, update: np.ndarray | None) -> None:
        """``--keep-updates``: write round ``t``'s model and noisy differential
        (``updates/round-T-NONCE.npz``, float64 ``w`` and ``update``, shape ``(d,)``)."""
        if not self.keep_updates or update is None:
            return
        import io

        buf = io.BytesIO()
        np.savez(buf, w=np.asarray(w, np.float64), update=np.asarray(update, np.float64),
                 round=np.int64(t))
        folder = self.state_dir / "updates"
        folder.mkdir(exist_ok=True)
        atomic_write_bytes(folder / f"round-{t}-{nonce}.npz", buf.getvalue())

    # -- 002's secure aggregation --------------------------------------------------------------
    def _secagg_begin(self, client: CurveClient, t: int, nonce: str, w: np.ndarray,
                      local: Any, event: Any) -> None:
        """Trained: start the round's session and advertise its keys."""
        assert self.secagg is not None and local.differential is not None
        loss = local.train_loss if math.isfinite(local.train_loss) else None
        meta = {"train_loss": loss, "energy_comp_j": float(local.comp.energy_j),
                "energy_comp_source": str(local.comp.source)}
        fields = self.secagg.begin(t, nonce, local.differential, event, meta)
        self._send(client, "sa_keys", {**fields, "nonce": nonce})

    def _secagg_refuse(self, client: CurveClient, msg: Message, reason: str) -> None:
        assert self.secagg is not None
        self.secagg.end()
        log.warning("device %d: round %d: %s", self.device, msg["round"], reason)
        self._refuse(client, msg["round"], msg["nonce"], reason)

    def _on_secagg(self, client: CurveClient, msg: Message) -> None:
        """A secure-aggregation message of the aggregator (``sa_*``)."""
        s = self.secagg.current(msg) if self.secagg is not None else None
        if s is None:
            self.dropped += 1  # another round's, a replay, or no session
            return
        assert self.secagg is not None
        t, nonce = s.round, s.nonce
        if msg.type == "sa_abort":
            log.info("device %d: round %d: %s", self.device, t, msg["reason"])
            self.secagg.end()
            return
        try:
            if msg.type == "sa_roster":
                self._send(client, "sa_shares", {**self.secagg.share(s, msg), "nonce": nonce})
            elif msg.type == "sa_inbox":
                self._secagg_masked(client, s, msg)
            elif msg.type == "sa_unmask_req":
                fault_point("edge_before_unmasking")
                self._send(client, "sa_unmask", {**self.secagg.reveal(s, msg), "nonce": nonce})
        except SESSION_ERRORS as exc:
            self._secagg_refuse(client, msg, f"secure aggregation: {type(exc).__name__}: {exc}")

    def _secagg_masked(self, client: CurveClient, s: Any, msg: Message) -> None:
        """``sa_inbox``: record the upload (the aggregator recorded it before relaying the
        inbox), then mask the update and send it."""
        if self.book is not None and s.nonce not in self.book.nonces():
            if not self.book.allows(s.event):
                raise ValueError(f"this upload would pass the device's own epsilon target "
                                 f"{self.target:g} ({self.book.enforce} accounting)")
            self.book.commit(s.event, s.nonce)
        fault_point("edge_before_masked")
        assert self.secagg is not None
        payload = self.secagg.mask(s, msg)
        self._send(client, "sa_masked", {"round": s.round, "nonce": s.nonce, "d": self.d,
                                         **s.meta}, payload)
        self.uploads += 1

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
            self._on_sync(msg)
        elif msg.type == "round":
            self._on_round(client, msg)
        elif msg.type == "ack":
            self._on_ack(msg)
        elif msg.type in ("sa_roster", "sa_inbox", "sa_unmask_req", "sa_abort"):
            self._on_secagg(client, msg)
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

    def run(self) -> int:
        """Serve until the aggregator says ``leave``; returns the exit code (0)."""
        import zmq

        from testbed.core.curve_keys import aggregator_public_key, load_device_keys
        from testbed.core.protocol import MAX_MESSAGE_BYTES

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
                if self.handle(client, frames):
                    return 0
                heard = answered = time.monotonic()
        finally:
            client.close()
            ctx.term()
            if self.air is not None:
                self.air.close()
            if self.book is not None:
                self.book.close()
            os.close(lock)
