"""The lab aggregator: the rounds of a run directory, with every device a remote edge agent.

The round logic is :class:`testbed.runner.Experiment`'s (gate, link, decode, aggregate,
evaluate, commit); this module only replaces "train and encode device i here" by "ask edge
i over the authenticated control plane and wait for its upload".

Per round and device the aggregator

1. gates the upload against the device's budget and journals the intent under a fresh nonce
   (before the edge may transmit, so an upload that went on air is never missing from its
   ledger);
2. sends the ``round`` message (global model, nonce, the channel fields the gated event
   credits, TDMA slot, deadline);
3. waits until every asked device answered (``upload`` or ``refuse``) or ``round_timeout_s``;
4. in device order: carries each upload over the link, records it (ledger commit), decodes
   it and acks it with the credited channel fields; a refusal withdraws the intent (nothing
   went on air); a device that did not answer in time is recorded with its gated event (it
   may have transmitted) and the round closes without it.

An edge that rejoins (``hello`` then ``ready``) reports the nonces its own ledger holds; the
aggregator settles an open intent of that device with it and sends ``sync``, every upload it
recorded for the device, which the edge adopts: after every round both ledgers hold the same
uploads under the same nonces.

Under 002's secure aggregation (``zcdp-secagg``) a round is instead
:class:`aggregator.lab.secagg_server.LabSecAggRound`: ``clients_per_round`` devices drawn with
the OS CSPRNG, their masked updates on the control plane, the aggregator the protocol's
server (it relays and learns only the sum).

On the ``usrp`` link the edges transmit their own bursts (:mod:`aggregator.lab.usrp_split`):
the ``round`` message carries the start of the device's TDMA slot (``tx_time_s``), the
aggregator keeps serving the control plane (``clock_req`` included) until the last slot's
window has passed, captures the schedule once, and settles each on-air ``upload`` with the
reception found in that device's window. On simulated links ``tx_time_s`` is null and the
edges send their symbols in the ``upload``; the aggregator applies the channel.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.lab.resume import ask_again, charged_in_round, lost_entry, settle_again
from aggregator.lab.secagg_server import DEFAULT_PHASE_TIMEOUT_S, EDGE_MESSAGES, LabSecAggRound
from aggregator.lab.usrp_split import (
    CAPTURE_MARGIN_S,
    DEFAULT_TRAIN_ALLOWANCE_S,
    ReceiverFactory,
    SplitReceiverLink,
    burst_seconds,
    open_slot_receiver,
    round_guard_s,
    round_slots,
)
from radio.analog import n_symbols_for
from radio.link import Link, LinkError, LinkFailed, Reception
from radio.tdma import Slot, schedule_window
from testbed.core.config.experiment import SAMPLED_SCHEMES, ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.faults import fault_point
from testbed.core.interrupts import StopSignals
from testbed.core.links import link_name, waveform_params
from testbed.core.protocol import (
    MAX_MESSAGE_BYTES,
    Message,
    ProtocolError,
    UploadHeader,
    decode,
    encode,
)
from testbed.core.rundir import RunDir
from testbed.core.secure_socket import CurveServer
from testbed.core.stage_timer import StageTimer
from testbed.core.upload_events import CHANNEL_KEYS
from testbed.runner import Experiment, RoundCallback, tally

log = logging.getLogger("testbed.aggregator")

#: Usrp link: seconds the round still waits for the answers after the capture was read
#: (an edge sends its ``upload`` as soon as its burst is queued, before it is on air).
ANSWER_GRACE_S = 2.0


@dataclass
class Peer:
    """A joined edge agent."""

    device: int
    identity: bytes
    instance: str
    dataset_size: int | None = None
    nonces: set[str] = field(default_factory=set)
    ready: bool = False


class ControlPlane:
    """The aggregator's side of the control plane: joins, welcomes and validated receipt.

    Parameters
    ----------
    server
        The CurveZMQ ROUTER (only allow-listed device keys get through).
    devices
        Number of devices of the run.
    welcome
        ``run_id``, ``config_yaml`` and ``mask_secret`` sent in every ``welcome``.
    next_round
        The round the run continues with (sent in ``welcome``).
    clock
        The aggregator's clock (s) that ``clock_req`` is answered with: the schedule's time
        base without a shared reference (:mod:`radio.edge_radio`).
    """

    def __init__(
        self, server: CurveServer, devices: int, welcome: dict[str, str], next_round: int,
        *, clock: Callable[[], float] = time.time,
    ) -> None:
        self.server = server
        self.clock = clock
        self.devices = devices
        self.welcome = welcome
        self.next_round = next_round
        self.peers: dict[int, Peer] = {}
        self.rejected = 0
        #: Called with the device id when an edge (re)reports ``ready``.
        self.on_ready: Any = None

    def ready(self, device: int) -> bool:
        peer = self.peers.get(device)
        return peer is not None and peer.ready

    def all_ready(self) -> bool:
        return all(self.ready(i) for i in range(self.devices))

    def send(self, device: int, msg_type: str, fields: dict[str, Any],
             payload: bytes | None = None) -> None:
        peer = self.peers.get(device)
        if peer is None:
            return
        try:
            self.server.send(peer.identity, encode(msg_type, {"device": device, **fields},
                                                   payload))
        except Exception as exc:  # noqa: BLE001 - a peer gone away is a straggler, not a crash
            log.warning("send %s to device %d failed: %s", msg_type, device, exc)

    def poll(self, timeout_s: float) -> tuple[int, Message] | None:
        """Receive one message; joins and clock requests are handled here, uploads and
        refusals are returned.

        Malformed messages, messages whose ``device`` is not the sender's key's device, and
        messages of unknown peers are dropped and logged (``rejected`` counts them). The
        secure aggregation's edge messages (``sa_*``) are returned too.
        """
        got = self.server.recv(timeout_s)
        if got is None:
            return None
        identity, device, frames = got
        try:
            msg = decode(frames)
        except ProtocolError as exc:
            self._reject(device, f"malformed: {exc}")
            return None
        if msg["device"] != device:
            self._reject(device, f"claims device {msg['device']}")
            return None
        if device >= self.devices:
            self._reject(device, f"device {device} is not in this run ({self.devices} devices)")
            return None
        if msg.type == "hello":
            known = self.peers.get(device)
            if known is None or (known.identity, known.instance) != (identity, msg["instance"]):
                # a new edge process (first join or a restart): it must report ready again
                self.peers[device] = Peer(device, identity, msg["instance"])
                log.info("device %d joined (instance %s)", device, msg["instance"])
            self.send(device, "welcome", {**self.welcome, "next_round": self.next_round})
            return None
        peer = self.peers.get(device)
        if peer is None or peer.identity != identity:
            self._reject(device, f"{msg.type} before hello")
            return None
        if msg.type == "ready":
            if msg["instance"] != peer.instance:
                self._reject(device, "ready of another instance")
                return None
            peer.dataset_size = msg["dataset_size"]
            peer.nonces = set(msg["nonces"])
            rejoined = not peer.ready  # else the same process saying it is still there
            peer.ready = True
            if self.on_ready is not None and rejoined:
                self.on_ready(device)
            return None
        if msg.type == "leave":
            log.info("device %d left: %s", device, msg["reason"])
            peer.ready = False
            return None
        if msg.type == "clock_req":  # answered at once, whatever else is under way
            self.send(device, "clock", {"t_send": msg["t_send"], "t_remote": self.clock()})
            return None
        if msg.type not in ("upload", "refuse", *EDGE_MESSAGES):
            self._reject(device, f"unexpected {msg.type}")
            return None
        return device, msg

    def _reject(self, device: int, why: str) -> None:
        self.rejected += 1
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("dropped a message from device %d: %s (%d dropped)", device, why,
                        self.rejected)

    def wait_all_ready(self, timeout_s: float, stop: StopSignals) -> None:
        """Serve joins until every device is ready.

        Raises
        ------
        TimeoutError
            Naming the devices that did not join within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        last_note = time.monotonic()
        while not self.all_ready():
            stop.check()
            now = time.monotonic()
            if now > deadline:
                missing = [i for i in range(self.devices) if not self.ready(i)]
                raise TimeoutError(
                    f"devices {missing} did not join within {timeout_s:g} s "
                    "(--join-timeout); check their `testbed edge` processes and keys"
                )
            if now - last_note > 10:
                missing = [i for i in range(self.devices) if not self.ready(i)]
                log.info("waiting for devices %s to join", missing)
                last_note = now
            self.poll(0.2)


class LabAggregator(Experiment):
    """An :class:`~testbed.runner.Experiment` whose devices are remote edge agents.

    Parameters
    ----------
    cfg, hw, rundir
        As for :class:`~testbed.runner.Experiment`.
    plane
        The control plane with every device ready (their shard sizes reported).
    round_timeout_s
        How long a round waits for uploads before it closes without the missing devices.
    train_allowance_s
        Usrp link: time (s) from sending ``round`` to the first TDMA slot (the edges train
        in it).
    receiver_factory
        Usrp link: opens the slot receiver (default: the ``rx`` flowgraph on
        ``usrp.rx_args``; tests inject a stand-in stream).
    phase_timeout_s
        ``zcdp-secagg``: seconds each secure-aggregation phase after the keys waits (the
        keys phase, which includes the training, waits ``round_timeout_s``).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        hw: HardwareConfig,
        rundir: RunDir,
        plane: ControlPlane,
        *,
        round_timeout_s: float,
        train_allowance_s: float = DEFAULT_TRAIN_ALLOWANCE_S,
        receiver_factory: ReceiverFactory | None = None,
        progress: bool = False,
        on_round: RoundCallback | None = None,
        rejoin_wait_s: float = 0.0,
        phase_timeout_s: float = DEFAULT_PHASE_TIMEOUT_S,
    ) -> None:
        if not 0 < train_allowance_s < 1e6:
            raise ValueError(f"train_allowance_s: got {train_allowance_s}; allowed: > 0 s")
        if not 0 < phase_timeout_s < 1e6:
            raise ValueError(f"phase_timeout_s: got {phase_timeout_s}; allowed: 0 < s < 1e6")
        sizes = [plane.peers[i].dataset_size for i in range(cfg.devices)]
        super().__init__(cfg, hw, rundir, progress=progress, on_round=on_round,
                         dataset_sizes=[int(s or 0) for s in sizes])
        self.plane = plane
        self.round_timeout_s = round_timeout_s
        self.phase_timeout_s = phase_timeout_s
        #: How long a round waits for a device that dropped out to rejoin (once per absence).
        self.rejoin_wait_s = rejoin_wait_s
        self._waited_for: set[int] = set()
        self.train_allowance_s = train_allowance_s
        self.receiver_factory: ReceiverFactory = receiver_factory or open_slot_receiver
        #: The split usrp link once opened (``None``: a simulated link).
        self._split: SplitReceiverLink | None = None
        #: Usrp link: each device's last reported timing uncertainty (s), for the guard.
        self.timing_uncertainty_s: dict[int, float] = {}
        #: Open authorizations of the round under way: device -> (nonce, gated event).
        self._pending: dict[int, tuple[str, Any]] = {}
        self._settled: dict[int, dict[str, Any]] = {}
        plane.on_ready = self._on_ready

    def _wait_for_rejoins(self, stop: StopSignals) -> None:
        """Give devices that dropped out up to ``rejoin_wait_s`` to rejoin, once per absence
        (a device that stays away does not slow every round)."""
        n = self.cfg.devices
        self._waited_for &= {i for i in range(n) if not self.plane.ready(i)}
        new = {i for i in range(n) if not self.plane.ready(i)} - self._waited_for
        if not new or self.rejoin_wait_s <= 0:
            return
        log.info("waiting up to %g s for devices %s to rejoin", self.rejoin_wait_s, sorted(new))
        end = time.monotonic() + self.rejoin_wait_s
        while any(not self.plane.ready(i) for i in new) and time.monotonic() < end:
            stop.check()
            self.plane.poll(0.2)
        self._waited_for |= {i for i in new if not self.plane.ready(i)}

    def sync(self, device: int) -> None:
        """Send ``device`` every upload recorded for it (its ledger adopts what it lacks)."""
        events = []
        if self.book is not None:
            events = [{"nonce": n, "event": e.to_dict()} for n, e in self.book.entries(device)
                      if n is not None]
        self.plane.send(device, "sync", {"events": events})

    def _on_ready(self, device: int) -> None:
        """An edge (re)joined: settle its open intent of this round, then sync it."""
        pending = self._pending.pop(device, None)
        if pending is not None:
            nonce, gated = pending
            peer = self.plane.peers[device]
            if self.book is not None and nonce not in self.book.nonces():
                if nonce in peer.nonces:  # the edge journalled it: it may have gone on air
                    self.book.commit(gated, nonce)
                else:  # the edge never began it: nothing went on air
                    self.book.cancel(nonce)
            self._settled[device] = {
                "device": device, "transmitted": nonce in peer.nonces, "rejoined": True,
                "charged": self.book is not None and nonce in peer.nonces,
            }
            log.info("device %d rejoined during round; open upload %s", device,
                     "recorded (may have gone on air)" if nonce in peer.nonces else "withdrawn")
        self.sync(device)

    def run(self, start_round: int = 0) -> dict[str, Any]:
        self._first_round = start_round  # a resumed round may hold recorded uploads
        summary: dict[str, Any] = {}
        try:
            summary = super().run(start_round)
            return summary
        finally:
            for i in range(self.cfg.devices):
                self.plane.send(i, "leave", {
                    "reason": f"run ended ({summary.get('status', 'stopped')})"})

    def _charged(self, t: int, kept: set[int]) -> dict[int, tuple[str, Any]]:
        """The first round after a restart: devices already charged for it, not in ``kept``
        (:func:`aggregator.lab.resume.charged_in_round`); ``{}`` in every other round."""
        if t != getattr(self, "_first_round", None):
            return {}
        return charged_in_round(self.book, t, kept)

    def _open_link(self, record_dir: Path | None) -> Link:
        """Simulated links as in process; on ``usrp`` only the slot receiver (the edges
        drive their own transmitters)."""
        if link_name(self.cfg, self.hw) != "usrp":
            return super()._open_link(record_dir)
        from radio.edge_radio import RadioUnavailable

        try:
            receiver = self.receiver_factory(
                self.hw, record_dir=record_dir, confidence=self.cfg.n0_confidence(),
                log_dir=self.rundir.path, clock=self.plane.clock,
            )
        except RadioUnavailable as exc:
            raise LinkFailed(f"usrp link (lab): {exc}") from exc
        self._split = SplitReceiverLink(receiver)
        return self._split

    def _channel(self, event: Any) -> dict[str, Any] | None:
        """The channel fields ``event`` credits (``None``: no ledger, or an event with no
        channel part: 004's Laplace replies)."""
        if self.book is None:
            return None
        data = event.to_dict()
        if not all(k in data for k in CHANNEL_KEYS):
            return None
        return {k: data[k] for k in CHANNEL_KEYS}

    def _n_payload(self, i: int) -> int:
        """Symbols of device ``i``'s upload (what its slot is sized for)."""
        return n_symbols_for(self.uplinks[i].l)

    def _schedule(self, t: int, order: list[int]) -> dict[int, Slot]:
        """Usrp link: the TDMA slots of round ``t`` for ``order`` (``{}`` on simulated links).

        Raises
        ------
        ValueError
            The schedule spans more than the receiver holds (``ring_seconds``).
        """
        if self._split is None or not order:
            return {}
        receiver = self._split.receiver
        guard = round_guard_s(self.timing_uncertainty_s, order, self.hw.usrp.time_source,
                              receiver_uncertainty_s=receiver.timing_uncertainty_s)
        slots = round_slots(order, {i: self._n_payload(i) for i in order},
                            waveform_params(self.hw), guard, receiver.now_s(),
                            self.train_allowance_s)
        w0, w1 = schedule_window(slots)
        ring = receiver.radio.ring_seconds
        if w1 - w0 > 0.9 * ring:
            raise ValueError(f"round {t}: the TDMA schedule of {len(order)} devices spans "
                             f"{w1 - w0:.3f} s; the receiver holds {ring:g} s")
        log.info("round %d: %d slots from %.3f s to %.3f s, guard %.2f ms", t, len(slots),
                 w0, w1, 1e3 * guard)
        return {s.device: s for s in slots}

    def _take(self, t: int, got: tuple[int, Message] | None, answers: dict[int, Message]
              ) -> None:
        """Keep a polled ``upload``/``refuse`` that answers this round's request."""
        if got is None:
            return
        device, msg = got
        want = self._pending.get(device)
        if (msg.type not in ("upload", "refuse") or want is None or msg["round"] != t
                or msg["nonce"] != want[0] or device in answers):
            self.plane._reject(device, f"{msg.type} out of round (round {msg['round']})")
            return
        answers[device] = msg

    def _collect(self, t: int, answers: dict[int, Message], deadline: float,
                 stop: StopSignals) -> None:
        """Poll until every pending device answered or the (monotonic) ``deadline``."""
        while any(i not in answers for i in self._pending) and time.monotonic() < deadline:
            stop.check()
            self._take(t, self.plane.poll(min(0.2, max(0.0, deadline - time.monotonic()))),
                       answers)

    def _capture(
        self, t: int, slots: dict[int, Slot], answers: dict[int, Message], stop: StopSignals,
        timer: StageTimer,
    ) -> tuple[dict[int, Reception | LinkError], LinkFailed | None]:
        """Usrp link: serve the control plane until the last window has passed, then
        capture and decode the windows of the devices that may have transmitted.

        Returns each such device's reception (or its lost frame's error), and the
        :class:`LinkFailed` of a dead receiver (raised once the round is settled).
        """
        assert self._split is not None
        split = self._split
        end = max(s.window_end_s for s in slots.values()) + CAPTURE_MARGIN_S

        def may_transmit() -> list[Slot]:
            return [s for i, s in slots.items() if i in self._pending
                    and not (i in answers and answers[i].type == "refuse")]

        try:
            while may_transmit():
                stop.check()
                left = end - split.receiver.now_s()
                if left <= 0:
                    break
                self._take(t, self.plane.poll(min(0.2, left)), answers)
            on_air = may_transmit()
            if not on_air:
                return {}, None
            n_payload = {s.device: self._n_payload(s.device) for s in on_air}
            return timer.timed("capture", lambda: split.receive(on_air, n_payload,
                                                                round_index=t)), None
        except LinkFailed as exc:
            lost = LinkError(f"usrp link (lab): round {t}: no capture: {exc}")
            return {i: lost for i in slots}, exc
        except LinkError as exc:  # the capture is not held: every window of it is lost
            return {i: exc for i in slots}, None

    def _await_edges(self, t: int, stop: StopSignals) -> None:
        """Before round ``t``: wait (one round timeout) for an edge if every one is gone,
        then give devices that dropped out their ``--rejoin-wait``.

        Raises
        ------
        LinkFailed
            No edge connected within the round timeout.
        """
        wait_until = time.monotonic() + self.round_timeout_s
        while not any(self.plane.ready(i) for i in range(self.cfg.devices)):
            stop.check()
            if time.monotonic() > wait_until:
                raise LinkFailed(f"round {t}: no edge device connected for "
                                 f"{self.round_timeout_s:g} s (--round-timeout)")
            self.plane.poll(0.2)
        self._wait_for_rejoins(stop)

    def _round(self, t: int, link: Link, stop: StopSignals) -> dict[str, Any] | None:
        if self.cfg.scheme == "zcdp-secagg":
            return self._secagg_round(t, stop)
        cfg = self.cfg
        timer = StageTimer()
        t0 = time.perf_counter()
        kept = self.rundir.load_inflight(t)
        charged = self._charged(t, set(kept))
        self._await_edges(t, stop)
        absent = {i for i in range(cfg.devices) if not self.plane.ready(i)} - set(charged)
        unselected = set(range(cfg.devices)) - self.selected_devices(t)  # 004's round robin
        gated, ch_rngs = timer.timed(
            "gate", lambda: self._gate(t, link, set(kept) | set(charged) | absent | unselected)
        )
        if not kept and not charged and not absent and all(
            g is None for i, g in enumerate(gated) if i not in unselected
        ):
            return None
        self._pending, self._settled = {}, {}
        order = [i for i, event in enumerate(gated) if event is not None and i not in absent]
        slots = self._schedule(t, order)
        weights = np.ascontiguousarray(self.w, dtype="<f8").tobytes()
        for k, i in enumerate(order):
            event = gated[i]
            nonce = self.book.begin(event) if self.book is not None else secrets.token_hex(16)
            self._pending[i] = (nonce, event)
            self.plane.send(i, "round", {
                "round": t, "nonce": nonce, "d": self.d, "channel": self._channel(event),
                "mechanism": event.to_dict() if self.book is not None else None,
                "slot": k, "deadline_s": float(self.round_timeout_s),
                "tx_time_s": slots[i].start_s if i in slots else None,
            }, weights)
        ask_again(self, t, charged)
        fault_point("lab_after_request")  # journalled and asked, nothing received yet
        answers: dict[int, Message] = {}
        deadline = time.monotonic() + self.round_timeout_s
        receptions: dict[int, Reception | LinkError] = {}
        failure: LinkFailed | None = None
        if slots:
            receptions, failure = self._capture(t, slots, answers, stop, timer)
            deadline = max(deadline, time.monotonic() + ANSWER_GRACE_S)
        self._collect(t, answers, deadline, stop)
        decoded: list[np.ndarray] = []
        losses: list[float] = []
        per_device: list[dict[str, Any]] = []
        for i in range(cfg.devices):
            if i in kept:
                vec, info = kept[i]
                tally({**info, "resumed": True}, vec, decoded, losses, per_device)
            elif i in self._settled or (i in charged and i not in self._pending):
                per_device.append(self._settled.get(i) or lost_entry(i, "not connected"))
            elif i not in self._pending:
                reason = ("not selected" if i in unselected else "absent" if i in absent
                          else "budget")
                per_device.append({"device": i, "transmitted": False, "skipped": reason})
            else:
                nonce, event = self._pending[i]
                got = answers.get(i)
                with stop.critical():
                    entry, vec = (settle_again(self, t, i, nonce, event, got, link, ch_rngs[i],
                                               timer) if i in charged else self._settle(
                        t, i, nonce, event, got, link, ch_rngs[i], timer, receptions.get(i)))
                tally(entry, vec, decoded, losses, per_device)
        self._pending = {}
        if failure is not None:
            raise failure
        n_avg = cfg.devices - len(unselected) if cfg.scheme in SAMPLED_SCHEMES else None
        line = self._close_round(t, decoded, losses, per_device, timer, t0, n_avg=n_avg)
        line["uploads"] = len(decoded)
        if slots:
            line["tdma_guard_s"] = next(iter(slots.values())).guard_s
        return line

    def _secagg_round(self, t: int, stop: StopSignals) -> dict[str, Any] | None:
        """Round ``t`` of ``zcdp-secagg``: the selected devices the budget allows sum their
        updates through the secure aggregation (:mod:`aggregator.lab.secagg_server`); ``None``
        when no selected device may upload (as in ``testbed run``)."""
        cfg = self.cfg
        timer = StageTimer()
        t0 = time.perf_counter()
        self._await_edges(t, stop)
        selected = self.selected_devices(t)  # r of n, OS CSPRNG
        charged = self._charged(t, set())
        absent = {i for i in selected if not self.plane.ready(i)} - set(charged)
        gated = {i: self._event(i, t, None) for i in sorted(selected - absent - set(charged))}
        asked = {i: e for i, e in gated.items() if self.book is None or self.book.allows(e)}
        if not absent and not asked and not charged:
            return None
        weights = np.ascontiguousarray(self.w, dtype="<f8").tobytes()
        work = LabSecAggRound(self, t, asked, stop, self.phase_timeout_s)
        outcome = timer.timed("secagg", lambda: work.run(weights))
        per_device: list[dict[str, Any]] = []
        for i in range(cfg.devices):
            if i in outcome.devices or i in charged:
                per_device.append(outcome.devices.get(i) or lost_entry(i, "secure aggregation"))
            else:
                reason = ("not selected" if i not in selected else "absent" if i in absent
                          else "budget")
                per_device.append({"device": i, "transmitted": False, "skipped": reason})
        # An abandoned round adds nothing: a zero step leaves the model as it was.
        total = outcome.total if outcome.total is not None else np.zeros(self.d)
        line = self._close_round(t, [total], outcome.losses, per_device, timer, t0,
                                 n_avg=len(selected))
        if outcome.total is None:
            line["uploads"] = 0
        line["secagg"] = outcome.report
        return line

    def _summary(self, status: str, reason: str, wall: float) -> dict[str, Any]:
        summary = super()._summary(status, reason, wall)
        if self.cfg.scheme == "zcdp-secagg":
            summary["secagg_rounds_abandoned"] = sum(
                1 for m in self.rundir.metrics() if m.get("secagg", {}).get("status")
                == "abandoned")
        return summary

    def _lost(self, t: int, i: int, nonce: str, error: str) -> dict[str, Any]:
        """Record an upload that may have gone on air but cannot be decoded: it counts,
        with no channel credit."""
        lost = self._event(i, t, None)
        if self.book is not None:
            self.book.commit(lost, nonce)
        self.plane.send(i, "ack", {"round": t, "nonce": nonce, "channel": self._channel(lost)})
        return {"device": i, "transmitted": True, "lost": True, "error": error}

    def _settle(
        self, t: int, i: int, nonce: str, gated: Any, msg: Message | None, link: Link,
        rng: np.random.Generator, timer: StageTimer,
        received: Reception | LinkError | None = None,
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """Record (or withdraw) device ``i``'s authorized upload of round ``t``.

        ``received``: usrp link, what the receiver found in the device's window.
        """
        split = self._split is not None
        if msg is None:  # straggler: it may have transmitted, so it counts (gated values)
            if self.book is not None:
                self.book.commit(gated, nonce)
            self.plane.send(i, "ack", {"round": t, "nonce": nonce,
                                       "channel": self._channel(gated)})
            log.warning("round %d: device %d did not answer within %g s; round closes without "
                        "it", t, i, self.round_timeout_s)
            entry: dict[str, Any] = {"device": i, "transmitted": None, "straggler": True,
                                     "charged": self.book is not None}
            if split:  # a frame without its upload cannot be decoded (no header)
                entry["frame_found"] = isinstance(received, Reception)
            return entry, None
        if msg.type == "refuse":
            if self.book is not None:
                self.book.cancel(nonce)
            log.warning("round %d: device %d refused: %s", t, i, msg["reason"])
            if isinstance(received, Reception):
                log.warning("round %d: device %d refused, yet a frame was found in its window",
                            t, i)
            return {"device": i, "transmitted": False, "refused": msg["reason"]}, None
        on_air = bool(msg["on_air"])
        try:
            header = UploadHeader.from_dict(msg["header"])
            if (header.device, header.round_index, header.d) != (i, t, self.d):
                raise ValueError("header names another device, round or model size")
        except (TypeError, ValueError) as exc:
            # It went on air but cannot be decoded: it counts, with no channel credit.
            return self._lost(t, i, nonce, f"bad upload header: {exc}"), None
        n = int(msg["n_symbols"])
        if on_air != split:
            return self._lost(t, i, nonce, (
                "bad upload: sent over the radio, but the run's link is simulated" if on_air
                else "bad upload: symbols over the control plane, but the run's link is usrp "
                "(is the edge's --hw link usrp?)")), None
        energy_comm_j: float | None = None
        if on_air:
            if n != self._n_payload(i) or n != n_symbols_for(header.n_values):
                return self._lost(t, i, nonce, f"bad upload: {n} symbols; its slot was sized "
                                               f"for {self._n_payload(i)}"), None
            report = msg["tx_report"]
            slot_burst = burst_seconds(waveform_params(self.hw), n)
            if abs(float(report["airtime_s"]) - slot_burst) > 1.5 / self.hw.sample_rate_hz:
                log.warning("round %d: device %d's burst lasted %.6f s, its slot %.6f s: its "
                            "hardware config's waveform is not the run's", t, i,
                            report["airtime_s"], slot_burst)
            self.timing_uncertainty_s[i] = float(report["timing_uncertainty_s"])
            energy_comm_j = float(report["tx_power_w"]) * float(report["airtime_s"])
            # Only their mean power enters the metrics (snr_db): the edge's symbol energy.
            symbols = np.full(n, np.sqrt(float(msg["symbol_energy"]) / n), np.complex128)
            if received is None:
                received = LinkError(f"usrp link (lab): device {i}, round {t}: its window "
                                     "was not captured")
        else:
            assert msg.payload is not None
            symbols = np.frombuffer(msg.payload, dtype="<c16").astype(np.complex128)
            received = None
        loss = msg["train_loss"]
        info, vec = self._receive(
            t, i, nonce, header, symbols, float(msg["symbol_energy"]),
            float(msg["energy_comp_j"]), str(msg["energy_comp_source"]), link, rng, timer,
            received=received, energy_comm_j=energy_comm_j,
        )
        if on_air:
            info.setdefault("energy_comm_j", energy_comm_j)  # also when its frame was lost
            info["timing_uncertainty_s"] = self.timing_uncertainty_s[i]
        info["train_loss"] = float("nan") if loss is None else float(loss)
        self.rundir.save_inflight(t, i, vec, info)
        fault_point("after_inflight")
        self.plane.send(i, "ack", {"round": t, "nonce": nonce,
                                   "channel": self._channel(self.last_committed)})
        return info, vec


def serve(
    *,
    bind: str,
    keys_dir: Path,
    cfg: ExperimentConfig | None = None,
    hw: HardwareConfig | None = None,
    out_dir: Path | None = None,
    resume_dir: Path | None = None,
    round_timeout_s: float = 60.0,
    join_timeout_s: float = 600.0,
    rejoin_wait_s: float = 0.0,
    train_allowance_s: float = DEFAULT_TRAIN_ALLOWANCE_S,
    phase_timeout_s: float = DEFAULT_PHASE_TIMEOUT_S,
    endpoint_file: Path | None = None,
    progress: bool = False,
    receiver_factory: ReceiverFactory | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Run (``cfg`` into ``out_dir``) or continue (``resume_dir``) a lab run as aggregator.

    Binds the CurveZMQ server, waits for every device to join, then runs the rounds.
    Returns the run's summary (``status`` says how it ended). ``train_allowance_s``,
    ``receiver_factory``: the usrp link's, ``phase_timeout_s``: the secure aggregation's
    (:class:`LabAggregator`); ``clock``: the clock
    ``clock_req`` is answered with and the receiver maps the schedule with (s).

    Raises
    ------
    RunDirError, TimeoutError, ConfigError
        Before any round: a bad run directory, devices that never joined, bad configs.
    """
    import zmq

    from aggregator.lab.resume import endpoint_note, open_run, serve_finished
    from testbed.core.lab_checks import check_allow_list
    from testbed.core.rundir import RunDirError

    if resume_dir is None and cfg is not None:
        check_allow_list(keys_dir, cfg.devices)  # before anything is written
    rundir, cfg, hw, start, weights, finished = open_run(resume_dir, cfg, hw, out_dir)
    try:
        check_allow_list(keys_dir, cfg.devices)
    except BaseException:
        rundir.close()
        raise
    welcome = {
        "run_id": rundir.path.name,
        "config_yaml": (rundir.path / "config.yaml").read_text(),
        "mask_secret": (rundir.path / "run_secret").read_text().strip(),
    }
    ctx = zmq.Context()
    server: CurveServer | None = None
    try:
        server = CurveServer(ctx, bind, keys_dir=keys_dir, allowed_dir=keys_dir / "allowed",
                             max_message_bytes=MAX_MESSAGE_BYTES)
        endpoint_note(endpoint_file, server.last_endpoint)
        if finished is not None:
            serve_finished(server, rundir, cfg.devices, finished, join_timeout_s)
            rundir.close()
            return finished
        log.info("aggregator bound to %s; waiting for %d devices", server.last_endpoint,
                 cfg.devices)
        plane = ControlPlane(server, cfg.devices, welcome, start, clock=clock)
        with StopSignals() as stop:
            plane.wait_all_ready(join_timeout_s, stop)
        try:
            exp = LabAggregator(cfg, hw, rundir, plane, round_timeout_s=round_timeout_s,
                                rejoin_wait_s=rejoin_wait_s,
                                train_allowance_s=train_allowance_s,
                                phase_timeout_s=phase_timeout_s,
                                receiver_factory=receiver_factory, progress=progress)
        except Exception as exc:
            from testbed.core.privacy import LedgerError

            if isinstance(exc, LedgerError):
                raise RunDirError(str(exc)) from None
            raise
        if weights is not None:
            exp.w = weights
        for i in range(cfg.devices):
            exp.sync(i)
        return exp.run(start)
    except BaseException:
        rundir.close()
        if resume_dir is None and start == 0 and not rundir.metrics_path.exists():
            from testbed.core.recovery import directory_is_pristine

            if directory_is_pristine(rundir.path):
                rundir.remove()
        raise
    finally:
        if server is not None:
            server.close()
        ctx.term()
