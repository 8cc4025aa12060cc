"""Over-the-air aggregation (scheme ``aircomp``) in a lab run: edges on radios (real or
virtual), each transmitting its own frame into one shared slot.

Per round, on the aggregator:

1. **pilots** (:class:`LabPilots`): every asked, connected device gets a ``pilot`` with its
   own short TDMA slot; the receiver captures the slots and estimates each device's path
   from its public pilot frame (:func:`radio.aircomp_air.estimate_pilot`, demodulated on the
   receiver's own frequency reference: a shared 10 MHz and PPS are required);
2. **gate** (:meth:`aggregator.aircomp_round.AirCompRound.gate`): ``c`` and every
   participant's event, checked against its budget;
3. **ask**: each participant's ``round`` request carries its event, the round's part of it
   and ``aircomp`` (its ``alpha = c / h_hat``, ``c``, the bound on ``E|x|^2``); each edge
   trains, checks the event against its own ledger and budget, prepares its frame and says
   ``upload_ready``. Once all are ready (or the train allowance has passed) the one slot is
   set, each ready participant's intent is journalled and its ``slot`` carries the slot's
   ``tx_time_s``; each journals it and transmits (:mod:`edge_device.lab.aircomp_edge`). A
   participant not ready gets no slot, does not transmit and is not charged (it counts as
   one that failed, below);
4. **capture** the slot once its window has passed and decode the sum ``y / c``
   (:meth:`radio.slot_receiver.SlotReceiver.decode_shared`,
   :func:`radio.aircomp_air.decode_sum`); the aggregator never sees a device's values, so
   the slot's aggregation error is measured on the participants' public probes
   (``probe_nmse``);
5. **settle**: a device that refused did not transmit (its intent is cancelled); one that
   did not answer may have. Only the confirmed transmitters' noise is credited: when ``f``
   participants failed, the others' events are recomputed with ``t + m - f`` shares
   withheld (``m = privacy.dropout_margin``), which never credits more than the gate did
   while ``f <= m``; beyond the margin the ledger records what the round was worth (it may
   pass a target: the summary says so, and the closing log line warns).
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from aggregator.aircomp_round import AirCompRound, keep_slot, slot_entry, slot_report
from aggregator.aircomp_slot import PilotSlot
from aggregator.lab.usrp_split import CAPTURE_MARGIN_S
from radio.aircomp import pre_equalize
from radio.aircomp_air import (
    PILOT_SYMBOLS,
    PROBE_SYMBOLS,
    PilotEstimate,
    decode_sum,
    estimate_pilot,
    noise_gain_lower,
    pilot_sequence,
    slot_symbols,
)
from radio.analog import symbols_to_reals
from radio.link import Link, LinkError
from testbed.core.links import waveform_params
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.faults import fault_point
from testbed.core.runs.interrupts import StopSignals
from testbed.core.transport.protocol import Message

if TYPE_CHECKING:
    from aggregator.lab.remote_devices import RemoteDevices

#: Least time (s) from the ``slot`` messages to the shared slot. A participant whose burst
#: misses the slot takes its noise share out of every other participant's credit (beyond
#: ``privacy.dropout_margin`` the others' events credit less noise than the gate assumed:
#: on a host loaded to a load average of 8, 7 of 10 bursts missed a 0.4 s lead, and the
#: other 3 devices were charged 2.4 epsilon for that round), so the shared slot gets more
#: lead than a TDMA slot, whose miss costs only that device's upload.
AIRCOMP_SLOT_LEAD_S = 1.0

log = logging.getLogger("testbed.aggregator")



def _serve_until(remote: RemoteDevices, t: int, end_s: float, stop: StopSignals,
                 answers: dict[int, Message] | None = None) -> None:
    """Serve the control plane until the receiver's time passes ``end_s``; keep the round's
    answers in ``answers`` (``None``: none expected, anything else is rejected)."""
    receiver = remote.capture.link.receiver  # type: ignore[union-attr]
    while True:
        stop.check()
        left = end_s - receiver.now_s()
        if left <= 0:
            return
        got = remote.plane.poll(min(0.2, left))
        if got is None:
            continue
        if answers is not None:
            remote.take(t, got, answers)
        else:
            remote.plane.reject(got[0], f"{got[1].type} during round {t}'s pilots")


class LabPilots(PilotSlot):
    """The pilots of one lab round: each connected asked device's pilot frame in its own
    short slot, captured and estimated by the aggregator's receiver.

    Attributes
    ----------
    lost
        Device -> why its pilot was not found (it sits the round out).
    """

    def __init__(self, remote: RemoteDevices, t: int, asked: list[int], stop: StopSignals,
                 timer: StageTimer) -> None:
        capture = remote.capture
        assert capture is not None
        state = remote.state
        wf = waveform_params(state.hw)
        receiver = capture.link.receiver
        self.kappa = noise_gain_lower(state.hw.waveform.aircomp_timing_error_samples,
                                      wf.samples_per_symbol, wf.rolloff)
        self.alpha_fail = 1.0 - state.cfg.n0_confidence()
        order = [i for i in sorted(asked) if remote.plane.ready(i)]
        self.pilot_airtime_s = len(order) * slot_symbols(wf, PILOT_SYMBOLS) / wf.symbol_rate_hz
        self.lost: dict[int, str] = {i: "not connected" for i in asked if i not in order}
        estimates: dict[int, PilotEstimate] = {}
        if order:
            # not before the receiver's stream starts (a shared PPS: on a whole second)
            stream = receiver.stream
            # no training before a pilot: the messages and the transmitters' lead only
            # (the slot lead of a paced round)
            allowance = capture.slot_lead_s if stream is None else max(
                capture.slot_lead_s, stream.start_time + 0.5 - receiver.now_s())
            slots = capture.schedule(t, order, {i: PILOT_SYMBOLS for i in order}, allowance)
            for i in order:
                remote.plane.send(i, "pilot", {"round": t, "tx_time_s": slots[i].start_s,
                                               "n_symbols": PILOT_SYMBOLS})
            end = max(s.window_end_s for s in slots.values()) + CAPTURE_MARGIN_S
            _serve_until(remote, t, end, stop)
            windows = timer.timed("capture", lambda: receiver.receive(
                list(slots.values()), round_index=t))
            pilots = pilot_sequence()
            for i, window in windows.items():
                try:
                    rec = receiver.decode_shared(window, PILOT_SYMBOLS, device=i, round_index=t)
                except LinkError as exc:
                    self.lost[i] = str(exc)
                    log.warning("round %d: device %d's pilot not found: %s", t, i, exc)
                    continue
                estimates[i] = estimate_pilot(rec, pilots)
        self._settle(estimates)

    def transmit(self, values: dict[int, np.ndarray], alpha: dict[int, complex],
                 amplitude: float, round_index: int, signal_power: float) -> np.ndarray | None:
        raise NotImplementedError("in a lab run the edges transmit their own frames")


def lab_aircomp_round(
    remote: RemoteDevices, link: Link, t: int, asked: list[int], stop: StopSignals,
    timer: StageTimer,
) -> tuple[dict[int, dict[str, Any]], np.ndarray | None, list[float], dict[str, Any]] | None:
    """Round ``t`` of a lab aircomp run (module docstring); the same result as
    :func:`aggregator.aircomp_round.aircomp_round`."""
    state, capture, book = remote.state, remote.capture, remote.state.book
    assert capture is not None
    pilots = LabPilots(remote, t, asked, stop, timer)
    air = AirCompRound(state, link, t, asked, slot=pilots)
    c, events = timer.timed("gate", lambda: air.gate(asked))
    if not events:
        return air.no_slot(asked)
    order = sorted(events)
    power = air.signal_power(order)
    eq = pre_equalize(np.array([air.h_hat[i] for i in order]), c, air.p_max, power)
    n_slot = air.n_sym + PROBE_SYMBOLS
    weights = np.ascontiguousarray(state.w, dtype="<f8").tobytes()
    nonces = {i: secrets.token_hex(16) for i in order}
    for k, i in enumerate(order):
        a = complex(eq.alpha[k])
        remote.plane.send(i, "round", {
            "round": t, "nonce": nonces[i], "d": state.d,
            "channel": remote.channel(events[i]),
            "mechanism": events[i].to_dict() if book is not None else None,
            "slot": 0, "deadline_s": capture.paced_deadline_s(), "tx_time_s": None,
            "await_slot": True,
            "aircomp": {"alpha_re": a.real, "alpha_im": a.imag, "amplitude": c,
                        "signal_power": power},
        }, weights)
    # Paced by the edges: the shared slot is set once every participant is ready (or the
    # train allowance has passed); only the ready ones are journalled and get it.
    ready, answers = timer.timed("train", lambda: capture.await_ready(t, nonces, stop))
    remote.start_requests()
    slot = None
    if ready:
        slot = capture.schedule(t, ready[:1], {ready[0]: n_slot},
                                allowance_s=max(capture.slot_lead_s,
                                                AIRCOMP_SLOT_LEAD_S))[ready[0]]
    for i in order:
        if i in ready:
            assert slot is not None
            nonce = book.begin(events[i], nonces[i]) if book is not None else nonces[i]
            remote.expect(i, nonce, events[i])
            remote.plane.send(i, "slot", {"round": t, "nonce": nonce,
                                          "tx_time_s": slot.start_s})
        elif i not in answers:
            remote.plane.send(i, "slot", {"round": t, "nonce": nonces[i], "tx_time_s": None})
            log.warning("round %d: device %d was not ready within %g s (train allowance); "
                        "it sits the slot out, not charged", t, i, capture.train_allowance_s)
    fault_point("lab_after_request")
    receiver = capture.link.receiver
    y: np.ndarray | None = None
    if slot is not None:
        _serve_until(remote, t, slot.window_end_s + CAPTURE_MARGIN_S, stop, answers)
        try:
            window = timer.timed("capture", lambda: receiver.receive([slot], round_index=t))
            rec = receiver.decode_shared(window[ready[0]], n_slot, device=ready[0],
                                         round_index=t)
            y = decode_sum(rec, c)
        except LinkError as exc:  # LinkFailed (a dead receiver) propagates
            log.warning("round %d: the shared slot's frame was lost: %s", t, exc)
        remote.collect(t, answers, time.monotonic() + capture.answer_grace_s, stop)
    return _settle(remote, air, t, c, order, events, answers, y, timer)


def _settle(remote: RemoteDevices, air: AirCompRound, t: int, c: float, order: list[int],
            events: dict[int, Any], answers: dict[int, Message], y: np.ndarray | None,
            timer: StageTimer,
            ) -> tuple[dict[int, dict[str, Any]], np.ndarray | None, list[float], dict[str, Any]]:
    """Record what the round was worth (module docstring, step 5), keep it, report it."""
    state, book = remote.state, remote.state.book
    pending = remote.open_requests()  # a device that rejoined mid-round was settled already
    sent = [i for i in order if i in pending and i in answers
            and answers[i].type == "upload" and answers[i]["on_air"]]
    refused = [i for i in order if i in pending and i in answers and i not in sent]
    unknown = [i for i in order if i in pending and i not in answers]
    failed = len(order) - len(sent)
    margin = state.cfg.privacy.dropout_margin
    final = dict(events)
    if failed:
        withheld = state.cfg.privacy.colluding_devices + max(0, margin - failed)
        final = air.events_at(sent, c, withheld) if sent else {}
        for i in unknown:  # charged (it may have transmitted), crediting the survivors' noise
            final[i] = air.events_at([*sent, i], c, withheld)[i]
        if failed > margin:
            log.warning("round %d: %d participants did not transmit, more than "
                        "privacy.dropout_margin = %d: the others' events credit less noise "
                        "than the gate assumed", t, failed, margin)
    with_book = book is not None
    for i in refused:
        log.warning("round %d: device %d refused: %s", t, i, answers[i]["reason"]
                    if answers[i].type == "refuse" else "bad upload")
        if with_book:
            book.cancel(pending[i][0])  # type: ignore[union-attr]
    for i in [*sent, *unknown]:
        if with_book:
            book.commit(final[i], pending[i][0])  # type: ignore[union-attr]
    remote.close_requests()
    fault_point("after_commit")
    for i in sent:
        remote.acknowledge(t, i, pending[i][0], final[i])
    total = None if y is None else symbols_to_reals(y[:air.n_sym], state.d)
    report = slot_report(air, c, order, y, total, None)
    report |= {"transmitted": len(sent), "refused": len(refused), "no_answer": len(unknown)}
    entries: dict[int, dict[str, Any]] = {}
    losses: list[float] = []
    kept = sorted([*sent, *unknown])
    for i in kept:
        msg = answers.get(i)
        loss = float("nan") if msg is None or msg["train_loss"] is None \
            else float(msg["train_loss"])
        tx = msg["tx_report"] if msg is not None else None
        entries[i] = slot_entry(
            air, i, c, final[i], kept, loss,
            None if tx is None else float(tx["tx_power_w"]) * float(tx["airtime_s"]),
            0.0 if msg is None else float(msg["energy_comp_j"]),
            "none" if msg is None else str(msg["energy_comp_source"]))
        if msg is None:
            entries[i]["answered"] = False
        if np.isfinite(loss):
            losses.append(loss)
    for i in refused:
        entries[i] = {"device": i, "transmitted": False, "skipped": "refused"}
    for i in order:
        if i not in pending:  # refused before it was ready, or not ready: no slot, no charge
            msg = answers.get(i)
            entries[i] = {"device": i, "transmitted": False, "charged": False,
                          "skipped": "refused" if msg is not None else "not ready"}
            if msg is None:
                entries[i]["straggler"] = True
    keep_slot(state, t, kept, entries, total if kept else None, timer)
    return entries, total, losses, report
