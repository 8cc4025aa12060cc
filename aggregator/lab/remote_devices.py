"""The devices of a lab run: edge agents reached over the authenticated control plane.

The round loop (:class:`aggregator.round_loop.RoundLoop`) asks them through
:meth:`RemoteDevices.ask`, which per round

1. journals each gated device's intent under a fresh nonce (before the edge may transmit,
   so an upload that went on air is never missing from its ledger);
2. sends the ``round`` messages (global model, nonce, the channel fields the gated event
   credits, TDMA slot, deadline);
3. serves the control plane until every asked device answered (``upload`` or ``refuse``)
   or ``round_timeout_s``; on the ``usrp`` link the edges transmit their own bursts
   (:mod:`aggregator.lab.usrp_split`): the ``round`` message carries the start of the
   device's TDMA slot (``tx_time_s``), and the schedule is captured once its last window
   has passed;
4. hands the answers to the loop in device order, each checked (header, carrier, size)
   and turned into an :class:`~aggregator.devices.Upload`, a refusal, a straggler or an
   undecodable upload; the loop records each and :meth:`RemoteDevices.acknowledge` acks it
   with the credited channel fields.

An edge that rejoins (``hello`` then ``ready``) reports the nonces its own ledger holds; an
open intent of that device is settled with it, and the edge gets ``sync``, every upload
recorded for it, which it adopts: after every round both ledgers hold the same uploads under
the same nonces. A restarted aggregator never asks a device recorded for the round already
(:mod:`aggregator.resumed_round`): the round loop settles it as lost.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.devices import (
    Answer,
    Answered,
    Journal,
    NoAnswer,
    Refused,
    SecAggOutcome,
    Settled,
    Undecodable,
    Upload,
)
from aggregator.lab.aircomp_lab import lab_aircomp_round
from aggregator.lab.control_plane import ControlPlane
from aggregator.lab.secagg_server import DEFAULT_PHASE_TIMEOUT_S, LabSecAggRound
from aggregator.lab.usrp_capture import SlotCapture
from aggregator.lab.usrp_split import DEFAULT_TRAIN_ALLOWANCE_S, ReceiverFactory
from aggregator.state import RunState
from radio.analog import n_symbols_for
from radio.link import Link, LinkError, Reception
from testbed.core.links import make_link
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.faults import fault_point
from testbed.core.runs.interrupts import StopSignals
from testbed.core.transport.protocol import Message, UploadHeader
from testbed.core.upload_events import PrivacyEvent, event_channel

log = logging.getLogger("testbed.aggregator")


class RemoteDevices:
    """Every device of a lab run, an edge agent on the control plane.

    Parameters
    ----------
    state
        The aggregator's state of the run.
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
    rejoin_wait_s
        How long a round waits for a device that dropped out to rejoin (once per absence).
    phase_timeout_s
        ``zcdp-secagg``: seconds each secure-aggregation phase after the keys waits (the
        keys phase, which includes the training, waits ``round_timeout_s``).
    """

    lists_every_device = True
    workers = 1
    batch_devices = 1

    def __init__(
        self,
        state: RunState,
        plane: ControlPlane,
        *,
        round_timeout_s: float,
        train_allowance_s: float = DEFAULT_TRAIN_ALLOWANCE_S,
        receiver_factory: ReceiverFactory | None = None,
        rejoin_wait_s: float = 0.0,
        phase_timeout_s: float = DEFAULT_PHASE_TIMEOUT_S,
    ) -> None:
        if not 0 < train_allowance_s < 1e6:
            raise ValueError(f"train_allowance_s: got {train_allowance_s}; allowed: > 0 s")
        if not 0 < phase_timeout_s < 1e6:
            raise ValueError(f"phase_timeout_s: got {phase_timeout_s}; allowed: 0 < s < 1e6")
        self.state = state
        self.plane = plane
        self.round_timeout_s = round_timeout_s
        self.phase_timeout_s = phase_timeout_s
        self.rejoin_wait_s = rejoin_wait_s
        self._waited_for: set[int] = set()
        self.energy_source = (
            f"reported by each edge device (energy.source {state.cfg.energy.source})")
        #: The usrp link's TDMA schedule and capture once the link is open (``None``: a
        #: simulated link).
        self.capture: SlotCapture | None = None
        self._train_allowance_s = train_allowance_s
        self._receiver_factory = receiver_factory
        #: Open authorizations of the round under way: device -> (nonce, gated event).
        self._pending: dict[int, tuple[str, Any]] = {}
        #: Devices settled outside the answers (rejoined mid-round).
        self._settled: dict[int, dict[str, Any]] = {}
        self._round_fields: dict[str, Any] = {}
        self._failure: Exception | None = None
        plane.on_ready = self._on_ready

    @property
    def d(self) -> int:
        return self.state.d

    # -- the run -----------------------------------------------------------------------------
    def session(self) -> AbstractContextManager[Any]:
        return nullcontext(None)

    def open_link(self, record_dir: Path | None) -> Link:
        """Simulated links as in process; on ``usrp`` only the slot receiver (the edges
        drive their own transmitters)."""
        state = self.state
        from testbed.core.links import link_name

        if link_name(state.cfg, state.hw) != "usrp":
            return make_link(state.cfg, state.hw, record_dir, log_dir=state.rundir.path)
        self.capture = SlotCapture.open(
            state, self.plane, record_dir, self._train_allowance_s, self._receiver_factory)
        return self.capture.link

    def end_run(self, summary: dict[str, Any]) -> None:
        """Tell every edge the run ended (``leave``)."""
        for i in range(self.state.cfg.devices):
            self.plane.send(i, "leave", {
                "reason": f"run ended ({summary.get('status', 'stopped')})"})

    def sync(self, device: int) -> None:
        """Send ``device`` every upload recorded for it (its ledger adopts what it lacks)."""
        book = self.state.book
        events = []
        if book is not None:
            events = [{"nonce": n, "event": e.to_dict()} for n, e in book.entries(device)
                      if n is not None]
        self.plane.send(device, "sync", {"events": events})

    def _on_ready(self, device: int) -> None:
        """An edge (re)joined: settle its open intent of this round, then sync it."""
        book = self.state.book
        pending = self._pending.pop(device, None)
        if pending is not None:
            nonce, gated = pending
            peer = self.plane.peers[device]
            if book is not None and nonce not in book.nonces():
                if nonce in peer.nonces:  # the edge journalled it: it may have gone on air
                    book.commit(gated, nonce)
                else:  # the edge never began it: nothing went on air
                    book.cancel(nonce)
            self._settled[device] = {
                "device": device, "transmitted": nonce in peer.nonces, "rejoined": True,
                "charged": book is not None and nonce in peer.nonces,
            }
            log.info("device %d rejoined during round; open upload %s", device,
                     "recorded (may have gone on air)" if nonce in peer.nonces else "withdrawn")
        self.sync(device)

    # -- a round ------------------------------------------------------------------------------
    def begin_round(self, t: int, stop: StopSignals) -> None:
        """Before round ``t``: wait (one round timeout) for an edge if every one is gone,
        then give devices that dropped out their ``--rejoin-wait``.

        Raises
        ------
        LinkFailed
            No edge connected within the round timeout.
        """
        from radio.link import LinkFailed

        n = self.state.cfg.devices
        wait_until = time.monotonic() + self.round_timeout_s
        while not any(self.plane.ready(i) for i in range(n)):
            stop.check()
            if time.monotonic() > wait_until:
                raise LinkFailed(f"round {t}: no edge device connected for "
                                 f"{self.round_timeout_s:g} s (--round-timeout)")
            self.plane.poll(0.2)
        self._wait_for_rejoins(stop)

    def _wait_for_rejoins(self, stop: StopSignals) -> None:
        """Give devices that dropped out up to ``rejoin_wait_s`` to rejoin, once per absence
        (a device that stays away does not slow every round)."""
        n = self.state.cfg.devices
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

    def absent(self, devices: set[int]) -> set[int]:
        return {i for i in devices if not self.plane.ready(i)}

    def channel(self, event: Any) -> dict[str, Any] | None:
        """The channel fields ``event`` credits (``None``: no ledger, or an event with no
        channel part: 004's Laplace replies)."""
        if self.state.book is None:
            return None
        return event_channel(event)

    def n_payload(self, i: int) -> int:
        """Symbols of device ``i``'s upload (what its slot is sized for)."""
        return n_symbols_for(self.state.uplinks[i].l)

    def ask(
        self, t: int, w: np.ndarray, asked: dict[int, PrivacyEvent], journal: Journal,
        stop: StopSignals, timer: StageTimer,
    ) -> Iterator[Answered]:
        """Journal and send the round's requests, collect the answers (on the usrp link:
        the edges' ``upload_ready``, their slots, the TDMA capture), then yield each
        device's answer in device order."""
        self._pending, self._settled, self._round_fields = {}, {}, {}
        self._failure = None
        order = sorted(asked)
        weights = np.ascontiguousarray(w, dtype="<f8").tobytes()
        if self.capture is not None:
            yield from self._ask_paced(t, order, asked, weights, journal, stop, timer)
            return
        for i in order:
            event = asked[i]
            nonce = journal(i, event, None) or secrets.token_hex(16)
            self._pending[i] = (nonce, event)
            self._send_round(t, i, nonce, event, weights, await_slot=False)
        fault_point("lab_after_request")
        answers: dict[int, Message] = {}
        self.collect(t, answers, time.monotonic() + self.round_timeout_s, stop)
        for i in order:
            if i in self._settled:
                yield Answered(i, None, Settled(self._settled[i]))
            elif i in self._pending:
                nonce, _ = self._pending[i]
                yield Answered(i, nonce, self.check_answer(t, i, answers.get(i), None))
        self._pending = {}

    def _send_round(self, t: int, i: int, nonce: str, event: PrivacyEvent, weights: bytes,
                    *, await_slot: bool) -> None:
        """Device ``i``'s ``round`` request: train from ``weights`` under ``nonce``; its
        ``deadline_s``: the round's timeout, or for a paced round the longest a prepared
        burst may wait for its slot (:meth:`SlotCapture.paced_deadline_s`)."""
        self.plane.send(i, "round", {
            "round": t, "nonce": nonce, "d": self.state.d, "channel": self.channel(event),
            "mechanism": event.to_dict() if self.state.book is not None else None,
            "slot": 0, "deadline_s": (self.capture.paced_deadline_s()
                                      if await_slot and self.capture is not None
                                      else float(self.round_timeout_s)),
            "tx_time_s": None, "await_slot": await_slot, "aircomp": None,
        }, weights)

    def _ask_paced(
        self, t: int, order: list[int], asked: dict[int, PrivacyEvent], weights: bytes,
        journal: Journal, stop: StopSignals, timer: StageTimer,
    ) -> Iterator[Answered]:
        """The usrp link: a round paced by the edges (:mod:`aggregator.lab.usrp_capture`).

        Each device trains and prepares its burst, then says ``upload_ready``; nothing is
        journalled until the round's slots are set, once every device is ready or the
        train allowance has passed. A ready device's intent is journalled just before its
        ``slot`` goes out (it may transmit from then on); a device not ready by then is told
        it has no slot, cannot transmit, and is not charged (a straggler)."""
        capture = self.capture
        assert capture is not None
        nonces = {i: secrets.token_hex(16) for i in order}
        for i in order:
            self._send_round(t, i, nonces[i], asked[i], weights, await_slot=True)
        ready, refused = timer.timed("train", lambda: capture.await_ready(t, nonces, stop))
        lead_s = capture.lead.next_s()
        if capture.lead.history:
            log.info("round %d: slot lead %.3f s (the last rounds' bursts used up to %.3f s "
                     "of theirs)", t, lead_s, max(capture.lead.history))
        slots = capture.schedule(t, ready, allowance_s=lead_s)
        for i in ready:
            nonce = journal(i, asked[i], nonces[i]) or nonces[i]
            self._pending[i] = (nonce, asked[i])
            self.plane.send(i, "slot", {"round": t, "nonce": nonce,
                                        "tx_time_s": slots[i].start_s})
        allowance = capture.train_allowance_s
        for i in order:
            if i not in ready and i not in refused:
                self.plane.send(i, "slot", {"round": t, "nonce": nonces[i], "tx_time_s": None})
                log.warning("round %d: device %d was not ready within %g s (train "
                            "allowance); it sits the round out, not charged", t, i, allowance)
                self._settled.setdefault(i, {
                    "device": i, "transmitted": False, "straggler": True, "charged": False,
                    "skipped": f"not ready within the train allowance ({allowance:g} s)"})
        fault_point("lab_after_request")  # journalled and given slots, nothing received yet
        answers: dict[int, Message] = {}
        receptions: dict[int, Reception | LinkError] = {}
        if slots:
            receptions, self._failure = capture.capture(
                t, slots, self._pending, answers, self.take, stop, timer)
            self._round_fields["tdma_guard_s"] = next(iter(slots.values())).guard_s
            self._round_fields["slot_lead_s"] = lead_s
            self.collect(t, answers, time.monotonic() + capture.answer_grace_s, stop)
            capture.note_misses(t, slots, answers, receptions)
        for i in order:
            if i in self._settled:
                yield Answered(i, None, Settled(self._settled[i]))
            elif i in refused:
                log.warning("round %d: device %d refused: %s", t, i, refused[i]["reason"])
                yield Answered(i, None, Refused(refused[i]["reason"]))
            elif i in self._pending:
                nonce, _ = self._pending[i]
                yield Answered(i, nonce, self.check_answer(t, i, answers.get(i),
                                                           receptions.get(i)))
        self._pending = {}

    def take(self, t: int, got: tuple[int, Message] | None, answers: dict[int, Message]
             ) -> None:
        """Keep a polled ``upload``/``refuse`` that answers this round's request."""
        if got is None:
            return
        device, msg = got
        want = self._pending.get(device)
        if (msg.type not in ("upload", "refuse") or want is None or msg["round"] != t
                or msg["nonce"] != want[0] or device in answers):
            self.plane.reject(device, f"{msg.type} out of round (round {msg['round']})")
            return
        answers[device] = msg

    def collect(self, t: int, answers: dict[int, Message], deadline: float,
                stop: StopSignals) -> None:
        """Poll until every pending device answered or the (monotonic) ``deadline``."""
        while any(i not in answers for i in self._pending) and time.monotonic() < deadline:
            stop.check()
            self.take(t, self.plane.poll(min(0.2, max(0.0, deadline - time.monotonic()))),
                      answers)

    # -- the round's open authorizations, for a round run outside ``ask`` (scheme aircomp:
    # :mod:`aggregator.lab.aircomp_lab`) -----------------------------------------------------
    def start_requests(self) -> None:
        """Begin a round's requests: no authorization open, no device settled on rejoining."""
        self._pending, self._settled = {}, {}

    def expect(self, device: int, nonce: str, event: PrivacyEvent) -> None:
        """``device``'s upload is authorized (its intent journalled under ``nonce`` for the
        gated ``event``): its answer is awaited (:meth:`take`), and should it rejoin before
        the round is settled, its intent is settled then."""
        self._pending[device] = (nonce, event)

    def open_requests(self) -> dict[int, tuple[str, PrivacyEvent]]:
        """A copy of the round's open authorizations, device -> ``(nonce, gated event)``; a
        device that rejoined mid-round was settled then and is not in it."""
        return dict(self._pending)

    def close_requests(self) -> None:
        """The round's authorizations are settled: none is open any more."""
        self._pending = {}

    def check_answer(self, t: int, i: int, msg: Message | None,
                received: Reception | LinkError | None) -> Answer:
        """Device ``i``'s answer, checked (``received``: usrp link, what the receiver found
        in the device's window)."""
        split = self.capture is not None
        if msg is None:  # straggler: it may have transmitted, so it counts (gated values)
            log.warning("round %d: device %d did not answer within %g s; round closes without "
                        "it", t, i, self.round_timeout_s)
            # a frame without its upload cannot be decoded (no header)
            return NoAnswer({"frame_found": isinstance(received, Reception)} if split else {})
        if msg.type == "refuse":
            log.warning("round %d: device %d refused: %s", t, i, msg["reason"])
            if isinstance(received, Reception):
                log.warning("round %d: device %d refused, yet a frame was found in its window",
                            t, i)
            return Refused(msg["reason"])
        on_air = bool(msg["on_air"])
        try:
            header = UploadHeader.from_dict(msg["header"])
            if (header.device, header.round_index, header.d) != (i, t, self.d):
                raise ValueError("header names another device, round or model size")
        except (TypeError, ValueError) as exc:
            return Undecodable(f"bad upload header: {exc}")
        n = int(msg["n_symbols"])
        if on_air != split:
            return Undecodable(
                "bad upload: sent over the radio, but the run's link is simulated" if on_air
                else "bad upload: symbols over the control plane, but the run's link is usrp "
                "(is the edge's --hw link usrp?)")
        energy_comm_j: float | None = None
        extra: dict[str, Any] = {}
        if on_air:
            assert self.capture is not None
            if n != self.n_payload(i) or n != n_symbols_for(header.n_values):
                return Undecodable(f"bad upload: {n} symbols; its slot was sized "
                                   f"for {self.n_payload(i)}")
            energy_comm_j, uncertainty = self.capture.burst_report(t, i, n, msg["tx_report"])
            extra = {"energy_comm_j": energy_comm_j, "timing_uncertainty_s": uncertainty}
            budget = self.capture.budget_snr_db(i)
            if budget is not None:
                extra["budget_snr_db"] = budget
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
        return Upload(header, symbols, float(msg["symbol_energy"]), float(msg["energy_comp_j"]),
                      str(msg["energy_comp_source"]),
                      float("nan") if loss is None else float(loss),
                      received=received, energy_comm_j=energy_comm_j, extra=extra)

    def acknowledge(self, t: int, i: int, nonce: str | None, event: PrivacyEvent) -> None:
        self.plane.send(i, "ack", {"round": t, "nonce": nonce, "channel": self.channel(event)})

    def end_round(self, t: int) -> dict[str, Any]:
        """The round's TDMA guard (usrp link); a dead receiver's failure, held back until
        every upload of the round was settled, is raised here."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        return self._round_fields

    def aircomp_round(
        self, t: int, link: Link, asked: list[int], stop: StopSignals, timer: StageTimer,
    ) -> tuple[dict[int, dict[str, Any]], np.ndarray | None, list[float], dict[str, Any]] | None:
        """Scheme ``aircomp``: round ``t`` with every participant in one slot
        (:func:`aggregator.lab.aircomp_lab.lab_aircomp_round`)."""
        if self.capture is None:
            raise RuntimeError("scheme aircomp in a lab run needs the usrp link")
        return lab_aircomp_round(self, link, t, asked, stop, timer)

    def secure_round(
        self, t: int, w: np.ndarray, asked: dict[int, PrivacyEvent], stop: StopSignals,
        timer: StageTimer,
    ) -> SecAggOutcome:
        """002's secure aggregation over the control plane
        (:class:`aggregator.lab.secagg_server.LabSecAggRound`); the aggregator relays and
        learns only the sum."""
        weights = np.ascontiguousarray(w, dtype="<f8").tobytes()
        work = LabSecAggRound(self, t, asked, stop, self.phase_timeout_s)
        return timer.timed("secagg", lambda: work.run(weights))
