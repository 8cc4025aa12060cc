"""The lab's ``usrp`` link on the aggregator's side: the round's TDMA schedule, the one
capture of every slot window, and each edge's burst report.

The edges transmit their own bursts (:mod:`aggregator.lab.usrp_split`); the aggregator only
receives. Each round is paced by the edges: the ``round`` messages ask them to train and
prepare their bursts, each says ``upload_ready`` (:meth:`SlotCapture.await_ready`, until the
train allowance's deadline), then the ready ones get the start of their slots (``slot``);
the aggregator keeps serving the control plane (``clock_req`` included) until the last
slot's window has passed, captures the schedule once, and settles each on-air ``upload``
with the reception found in that device's window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aggregator.lab.control_plane import ControlPlane
from aggregator.lab.slot_lead import SlotLead
from aggregator.lab.usrp_split import (
    CAPTURE_MARGIN_S,
    ReceiverFactory,
    SplitReceiverLink,
    burst_seconds,
    open_slot_receiver,
    round_guard_s,
    round_slots,
    slot_lead_s,
)
from aggregator.state import RunState
from radio.analog import n_symbols_for
from radio.link import LinkError, LinkFailed, ReceiverGap, Reception
from radio.tdma import Slot, schedule_window
from testbed.core.links import waveform_params
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.faults import fault_point
from testbed.core.runs.interrupts import StopSignals
from testbed.core.transport.protocol import Message

log = logging.getLogger("testbed.aggregator")

#: Seconds the round still waits for the answers after the capture was read (an edge sends
#: its ``upload`` as soon as its burst is queued, before it is on air).
ANSWER_GRACE_S = 2.0

#: Keeps a polled message that answers the round (the remote devices' ``take``).
Take = Callable[[int, tuple[int, Message] | None, dict[int, Message]], None]


class SlotCapture:
    """The split receiver of a lab run, its TDMA schedules and captures.

    Parameters
    ----------
    state
        The aggregator's state (configs, uplinks).
    plane
        The control plane (served while the slots go by).
    link
        The split receiver's link.
    train_allowance_s
        Time (s) from sending ``round`` to the first slot (the edges train in it).
    """

    answer_grace_s = ANSWER_GRACE_S

    def __init__(self, state: RunState, plane: ControlPlane, link: SplitReceiverLink,
                 train_allowance_s: float) -> None:
        self.state = state
        self.plane = plane
        self.link = link
        self.train_allowance_s = train_allowance_s
        #: Each device's last reported timing uncertainty (s), for the guard.
        self.timing_uncertainty_s: dict[int, float] = {}
        #: Seconds from the ``slot`` messages to the first slot of a paced round: the
        #: hardware config's (the most any round is given; AirComp's slots always).
        self.slot_lead_s = slot_lead_s(state.hw)
        #: The lead of each TDMA round, sized from what the bursts used of it.
        self.lead = SlotLead(self.slot_lead_s)
        #: Rounds in a row whose every captured window a gap in the stream took.
        self.gap_rounds = 0

    def paced_deadline_s(self) -> float:
        """A paced round's ``deadline_s`` (s): the train allowance plus the slot's lead,
        the longest an edge's prepared burst (and its clock offset, measured before it says
        ``upload_ready``) waits for its slot."""
        return self.train_allowance_s + self.slot_lead_s

    @classmethod
    def open(cls, state: RunState, plane: ControlPlane, record_dir: Path | None,
             train_allowance_s: float, receiver_factory: ReceiverFactory | None
             ) -> SlotCapture:
        """Start the slot receiver (``receiver_factory``, default the ``rx`` flowgraph on
        ``usrp.rx_args``).

        Raises
        ------
        LinkFailed
            No USRP (or no UHD) for the receiver.
        """
        from radio.edge_radio import RadioUnavailable

        factory = receiver_factory or open_slot_receiver
        try:
            receiver = factory(
                state.hw, record_dir=record_dir, confidence=state.cfg.n0_confidence(),
                log_dir=state.rundir.path, clock=plane.clock,
            )
        except RadioUnavailable as exc:
            raise LinkFailed(f"usrp link (lab): {exc}") from exc
        return cls(state, plane, SplitReceiverLink(receiver), train_allowance_s)

    def n_payload(self, i: int) -> int:
        """Symbols of device ``i``'s upload (what its slot is sized for)."""
        return n_symbols_for(self.state.uplinks[i].l)

    def schedule(self, t: int, order: list[int], n_payload: dict[int, int] | None = None,
                 allowance_s: float | None = None) -> dict[int, Slot]:
        """The TDMA slots of round ``t`` for ``order``, each sized for ``n_payload`` symbols
        (default: the device's upload), the first ``allowance_s`` from now (default: the
        training allowance).

        Raises
        ------
        ValueError
            The schedule spans more than the receiver holds (``ring_seconds``).
        """
        if not order:
            return {}
        hw = self.state.hw
        receiver = self.link.receiver
        measured = hw.calibration.guard_s if hw.calibration is not None else None
        guard = round_guard_s(self.timing_uncertainty_s, order, hw.usrp.time_source,
                              receiver_uncertainty_s=receiver.timing_uncertainty_s,
                              floor_s=measured or 0.0)
        sizes = n_payload or {i: self.n_payload(i) for i in order}
        now = receiver.now_s()
        slots = round_slots(order, sizes, waveform_params(hw), guard, now,
                            self.train_allowance_s if allowance_s is None else allowance_s)
        w0, w1 = schedule_window(slots)
        ring = receiver.radio.ring_seconds
        if w1 - w0 > 0.9 * ring:
            raise ValueError(f"round {t}: the TDMA schedule of {len(order)} devices spans "
                             f"{w1 - w0:.3f} s; the receiver holds {ring:g} s")
        log.info("round %d: %d slots from %.3f s to %.3f s, guard %.2f ms", t, len(slots),
                 w0, w1, 1e3 * guard)
        for s in slots:
            self.lead.set_given(s.device, s.start_s - now)
        return {s.device: s for s in slots}

    def note_misses(self, t: int, slots: dict[int, Slot], answers: dict[int, Message],
                    receptions: dict[int, Reception | LinkError]) -> None:
        """Round ``t``'s slots are settled: a device given a slot that withdrew its burst
        (``refuse``) or whose window held no frame sets the next round's lead back to the
        configured one (:meth:`aggregator.lab.slot_lead.SlotLead.missed`)."""
        missed = sorted(i for i in slots
                        if (i in answers and answers[i].type == "refuse")
                        or isinstance(receptions.get(i), LinkError))
        if missed:
            log.info("round %d: devices %s missed or lost their slots: the next slot lead is "
                     "the configured %.3f s", t, missed, self.slot_lead_s)
            self.lead.missed()

    def capture(
        self, t: int, slots: dict[int, Slot], pending: dict[int, Any],
        answers: dict[int, Message], take: Take, stop: StopSignals, timer: StageTimer,
    ) -> tuple[dict[int, Reception | LinkError], LinkFailed | None]:
        """Serve the control plane until the last window has passed, then capture and
        decode the windows of the devices that may have transmitted (``pending``, less
        those that refused).

        Returns each such device's reception (or its lost frame's error), and the
        :class:`LinkFailed` of a dead receiver (raised once the round is settled).
        """
        split = self.link
        end = max(s.window_end_s for s in slots.values()) + CAPTURE_MARGIN_S

        def may_transmit() -> list[Slot]:
            return [s for i, s in slots.items() if on_air(i)]

        def wait_for_the_slots() -> None:
            while may_transmit():
                stop.check()
                left = end - split.receiver.now_s()
                if left <= 0:
                    break
                take(t, self.plane.poll(min(0.2, left)), answers)

        def on_air(device: int) -> bool:
            return device in pending and not (device in answers
                                              and answers[device].type == "refuse")

        reception = None
        try:
            # The windows are read and decoded as their slots pass, while the control plane
            # is served: only the last ones (and the collision search) are left at the end.
            n_all = {i: self.n_payload(i) for i in slots}
            reception = split.start_round(list(slots.values()), n_all, round_index=t,
                                          on_air=on_air)
            timer.timed("slots", wait_for_the_slots)
            on_air_slots = may_transmit()
            if not on_air_slots:
                return {}, None
            fault_point("lab_before_capture")  # the bursts are on the air, none settled yet
            started = reception
            got = timer.timed("capture", lambda: started.finish(on_air_slots))
            return got, self.receiver_down(t, got)
        except LinkFailed as exc:
            lost = LinkError(f"usrp link (lab): round {t}: no capture: {exc}")
            return {i: lost for i in slots}, exc
        except LinkError as exc:  # the capture is not held: every window of it is lost
            return {i: exc for i in slots}, None
        finally:
            if reception is not None:
                reception.cancel()

    def receiver_down(self, t: int, got: dict[int, Reception | LinkError]
                      ) -> LinkFailed | None:
        """Count round ``t`` among the rounds in a row whose every window a gap in the
        receiver's stream took (:class:`~radio.link.ReceiverGap`); the run's
        :class:`LinkFailed` once ``usrp.receiver_down_rounds`` are (``None`` until then:
        a gap costs only the uploads it hit)."""
        if got and all(isinstance(r, ReceiverGap) for r in got.values()):
            self.gap_rounds += 1
        else:
            self.gap_rounds = 0
        limit = self.state.hw.usrp.receiver_down_rounds
        if self.gap_rounds < limit:
            return None
        last = next(iter(got.values()))
        return LinkFailed(f"usrp link (lab): the receiver lost every window of {limit} "
                          f"rounds in a row (usrp.receiver_down_rounds), the last at round "
                          f"{t}: {last}")

    def await_ready(self, t: int, nonces: dict[int, str], stop: StopSignals
                    ) -> tuple[list[int], dict[int, Message]]:
        """Serve the control plane until every device of ``nonces`` (device -> the nonce
        of its ``round`` request) said ``upload_ready`` or ``refuse``, or the train
        allowance has passed since now.

        Returns
        -------
        ready
            The devices ready, ascending.
        refused
            The ``refuse`` of each device that refused before it was ready (nothing went on
            air, nothing was journalled).
        """
        ready: set[int] = set()
        refused: dict[int, Message] = {}
        deadline = time.monotonic() + self.train_allowance_s
        while len(ready) + len(refused) < len(nonces):
            stop.check()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            got = self.plane.poll(min(0.2, left))
            if got is None:
                continue
            device, msg = got
            if (msg.type not in ("upload_ready", "refuse") or device not in nonces
                    or msg["round"] != t or msg["nonce"] != nonces[device]
                    or device in ready or device in refused):
                self.plane.reject(device, f"{msg.type} out of round (round {msg['round']})")
                continue
            if msg.type == "refuse":
                refused[device] = msg
            else:
                ready.add(device)
        return sorted(ready), refused

    def budget_snr_db(self, i: int) -> float | None:
        """The SNR (dB) device ``i``'s frames should arrive with through the virtual air's
        link budget (:func:`testbed.core.config.hardware.virtual_budget_snr_db`); ``None``
        on real radios."""
        from testbed.core.config.hardware import virtual_budget_snr_db

        return virtual_budget_snr_db(self.state.hw, i)

    def burst_report(self, t: int, i: int, n: int, report: dict[str, Any]
                     ) -> tuple[float, float]:
        """Device ``i``'s report of its burst of ``n`` symbols in round ``t``: the radio
        energy it spent (J) and its timing uncertainty (s, kept for the next guard)."""
        hw = self.state.hw
        slot_burst = burst_seconds(waveform_params(hw), n)
        if abs(float(report["airtime_s"]) - slot_burst) > 1.5 / hw.sample_rate_hz:
            log.warning("round %d: device %d's burst lasted %.6f s, its slot %.6f s: its "
                        "hardware config's waveform is not the run's", t, i,
                        report["airtime_s"], slot_burst)
        self.timing_uncertainty_s[i] = float(report["timing_uncertainty_s"])
        self.lead.report(i, float(report["slack_s"]))
        return float(report["tx_power_w"]) * float(report["airtime_s"]), \
            self.timing_uncertainty_s[i]
