"""One round of over-the-air aggregation (scheme ``aircomp``).

1. **probe** every asked device's path for the round (:mod:`aggregator.aircomp_slot`: on
   the symbol link the drawn gain, on a waveform link a pilot frame per device; a device
   pre-equalizes with that estimate, and a channel that changes within the upload or an
   estimate's error leaves a misalignment the accountant bounds);
2. **amplitude and gate**: the common received amplitude ``c`` is the largest every
   participant can reach within ``power.p_max_w`` (:func:`radio.aircomp.amplitude_for`);
   each participant's :class:`~testbed.core.privacy.aircomp_events.AirCompEvent` (its own
   noise share, the honest others' and the receiver's, ``privacy.colluding_devices``
   removed) is checked against its budget; a refused device sits out and the rest are
   gated again, since its noise no longer protects them;
3. **ask** the participants for their noisy values (each trains and adds its share);
4. **journal** every participant's intent, then all transmit **in one slot**:
   ``y = sum_j h_j (c / h_hat_j) x_j + n``, with the receiver noise of the link's source
   (the OS CSPRNG where it is credited);
5. **decode** ``y / c`` (the sum), **record** every event, keep the round in ``inflight/``
   and report the aggregation error (NMSE of the received sum against the sum sent), the
   slot's and the pilots' air time and what TDMA would have taken.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from aggregator.aircomp_slot import AirCompSlot, make_slot
from aggregator.devices import Devices, Upload
from aggregator.state import RunState
from radio.aircomp import aggregation_nmse, amplitude_for, pre_equalize
from radio.aircomp_air import probe_nmse
from radio.analog import n_symbols_for, symbols_to_reals
from radio.link import Link
from radio.units import ratio_to_db
from testbed.core.config.aircomp_checks import aircomp_colluding
from testbed.core.privacy.aircomp_events import AirCompEvent
from testbed.core.privacy.analysis.aircomp_noise import round_events
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.faults import fault_point
from testbed.core.runs.interrupts import StopSignals


class AirCompRound:
    """The slot of one aircomp round: channels, amplitude and events of its participants.

    Parameters
    ----------
    state
        The aggregator's state of the run.
    link
        The run's link (the symbol link).
    t
        The round.
    asked
        Devices that may take part (selected, not kept from before an interruption).
    """

    def __init__(self, state: RunState, link: Link, t: int, asked: list[int],
                 slot: AirCompSlot | None = None) -> None:
        self.state, self.link, self.t = state, link, t
        self.n_sym = n_symbols_for(state.d)
        timing = state.hw.waveform.aircomp_timing_error_samples
        self.slot = slot or make_slot(link, state.cfg.seed, t, asked, self.n_sym, timing)
        self.h_hat = self.slot.h_hat
        self.p_max = state.cfg.power.p_max_w / state.hw.tx_power_ref_w
        #: ``c`` over the largest every participant reaches, from the config's aircomp plan
        #: (``None``: 1, full power)
        self.planned_ratio: float | None = None
        if state.cfg.aircomp_plan is not None:
            from testbed.core.config.aircomp_plan_file import checked_aircomp_plan

            self.planned_ratio = checked_aircomp_plan(state.cfg, state.d).amplitude_ratio

    def no_slot(self, asked: list[int]
                ) -> tuple[dict[int, dict[str, Any]], None, list[float], dict[str, Any]] | None:
        """The round when the gate let no one transmit: ``None`` when every asked device
        with a pilot was refused by its budget and no pilot was lost (the budget is spent);
        else a round without a slot (the model stays as it is), each asked device's entry
        saying why it sat out."""
        lost = [i for i in asked if i not in self.h_hat]
        if not lost:
            return None
        entries = {i: {"device": i, "transmitted": False,
                       "skipped": "pilot lost" if i in lost else "budget"} for i in asked}
        report = {"participants": 0, "slots": 0, "airtime_s": 0.0,
                  "pilot_airtime_s": self.slot.pilot_airtime_s, "tdma_airtime_s": 0.0,
                  "lost": True, "pilots_lost": len(lost)}
        return entries, None, [], report

    def signal_power(self, devices: list[int]) -> float:
        """The bound on ``E|x|^2`` per symbol of the unscaled values (data-independent),
        the largest over ``devices``: every participant is scaled against it."""
        powers: list[float] = []
        for i in devices:
            power = self.state.uplinks[i].expected_power
            assert power is not None  # every aircomp uplink has its bound
            powers.append(power)
        return max(powers)

    def plan(self, participants: list[int]) -> tuple[float, dict[int, AirCompEvent]]:
        """``c`` and each participant's event if exactly ``participants`` transmit."""
        h = np.array([self.h_hat[i] for i in participants])
        c = amplitude_for(h, self.p_max, self.signal_power(participants), len(participants))
        if self.planned_ratio is not None:  # testbed plan --scheme aircomp: less power
            c *= self.planned_ratio
        return c, self.events_at(participants, c)

    def events_at(self, participants: list[int], c: float, colluding: int | None = None
                  ) -> dict[int, AirCompEvent]:
        """Each participant's event when exactly ``participants`` transmit at amplitude
        ``c`` (the others' noise credited is theirs only), with ``colluding`` others' shares
        not credited (default :func:`~testbed.core.config.aircomp_checks.aircomp_colluding`)."""
        state, cfg = self.state, self.state.cfg
        rho = [self.slot.rho_bounds(i) for i in participants]
        recs = [state.record_settings(i) for i in participants]
        assert all(r is not None for r in recs)
        trusted = state.uplinks[participants[0]].trusted
        events = round_events(
            round_index=self.t, devices=participants,
            sigma=[state.uplinks[i].sigma for i in participants],
            rho_lower=[r[0] for r in rho], rho_upper=[r[1] for r in rho],
            sampling_rate=[r.sampling_rate for r in recs],  # type: ignore[union-attr]
            expected_batch=[r.expected_batch for r in recs],  # type: ignore[union-attr]
            dataset_size=[r.dataset_size for r in recs],  # type: ignore[union-attr]
            example_clip=cfg.privacy.example_clip,
            receiver_noise_var=trusted * (self.slot.n0_lower / 2.0) / c**2,
            colluding=aircomp_colluding(cfg) if colluding is None else colluding,
            amplified=recs[0].amplified,  # type: ignore[union-attr]
            relation=cfg.privacy.relation,
            bound_failure_prob=self.slot.failure_prob(len(participants), trusted > 0),
        )
        return dict(zip(participants, events, strict=True))

    def gate(self, asked: list[int]) -> tuple[float, dict[int, AirCompEvent]]:
        """The participants that pass their budgets when they transmit together (a device
        refused sits out, and the others are gated again without its noise)."""
        book = self.state.book
        participants = sorted(i for i in asked if i in self.h_hat)  # pilot received
        while participants:
            c, events = self.plan(participants)
            refused = [i for i, e in events.items() if book is not None and not book.allows(e)]
            if not refused:
                return c, events
            participants = [i for i in participants if i not in refused]
        return 0.0, {}

    def transmit(self, uploads: dict[int, Upload], c: float) -> np.ndarray | None:
        """All participants in one slot; the decoded sum ``y / c`` (``(n_sym,)``, complex),
        ``None`` when the slot's frame was lost."""
        order = sorted(uploads)
        h = np.array([self.h_hat[i] for i in order])
        power = self.signal_power(order)
        eq = pre_equalize(h, c, self.p_max, power)
        if not eq.participating.all():
            raise RuntimeError("a gated participant cannot reach the amplitude it was gated at")
        alpha = {i: complex(eq.alpha[k]) for k, i in enumerate(order)}
        return self.slot.transmit({i: uploads[i].symbols for i in order}, alpha, c, self.t,
                                  power)


def aircomp_round(
    state: RunState, devices: Devices, link: Link, t: int, asked: list[int],
    stop: StopSignals, timer: StageTimer,
) -> tuple[dict[int, dict[str, Any]], np.ndarray | None, list[float], dict[str, Any]] | None:
    """Round ``t``'s slot among ``asked``: the participants' metrics entries, the decoded
    sum (``(d,)``; ``None`` when no one transmitted), their training losses and the round's
    ``aircomp`` metrics. ``None``: no asked device passes its budget."""
    lab = getattr(devices, "aircomp_round", None)
    if lab is not None:  # edges on radios: each transmits its own frame in the slot
        return lab(t, link, asked, stop, timer)  # type: ignore[no-any-return]
    book = state.book
    air = AirCompRound(state, link, t, asked)
    c, events = timer.timed("gate", lambda: air.gate(asked))
    if not events:
        return air.no_slot(asked)
    uploads: dict[int, Upload] = {}
    for got in devices.ask(t, state.w, dict(events), _no_journal, stop, timer):
        if not isinstance(got.answer, Upload):
            raise RuntimeError(f"device {got.device}: aircomp needs every participant's upload "
                               f"in this process, got {type(got.answer).__name__}")
        uploads[got.device] = got.answer
    order = sorted(uploads)
    entries: dict[int, dict[str, Any]] = {}
    with stop.critical():
        nonces = {i: book.begin(events[i]) if book is not None else None for i in order}
        fault_point("after_intent")
        y = timer.timed("link", lambda: air.transmit(uploads, c))
        fault_point("after_transmit")
        total = None if y is None else symbols_to_reals(y[:air.n_sym], state.d)
        for i in order:
            if book is not None:
                nonce = nonces[i]
                assert nonce is not None
                book.commit(events[i], nonce)
        fault_point("after_commit")
        sent = None if y is None else sum(
            (symbols_to_reals(uploads[i].symbols, state.d) for i in order), np.zeros(state.d))
        report = slot_report(air, c, order, y, total, sent)
        for i in order:
            up = uploads[i]
            entries[i] = slot_entry(air, i, c, events[i], order, up.train_loss,
                                    abs(c / air.h_hat[i])**2 * up.symbol_energy
                                    * state.hw.tx_power_ref_w / state.hw.symbol_rate_hz,
                                    up.energy_comp_j, up.energy_comp_source)
        keep_slot(state, t, order, entries, total, timer)
    losses = [float(uploads[i].train_loss) for i in order
              if np.isfinite(uploads[i].train_loss)]
    return entries, total, losses, report


def slot_report(air: AirCompRound, c: float, order: list[int], y: np.ndarray | None,
                total: np.ndarray | None, sent: np.ndarray | None) -> dict[str, Any]:
    """The round's ``aircomp`` metrics: participants, ``c``, air times, the receiver's
    ``N0`` credited, and the aggregation error of the probe (and of the values where they
    are known here, ``sent``: in process)."""
    hz = air.state.hw.symbol_rate_hz
    report: dict[str, Any] = {
        "participants": len(order), "amplitude": c, "slots": 1,
        "airtime_s": air.slot.slot_airtime_s(air.n_sym, hz),
        "pilot_airtime_s": air.slot.pilot_airtime_s,
        "tdma_airtime_s": len(order) * air.slot.slot_airtime_s(air.n_sym, hz, probe=False),
        "receiver_noise_var": air.slot.n0_lower, "lost": y is None}
    if y is not None:
        if sent is not None and total is not None:
            report |= _nmse_fields("", aggregation_nmse(total, sent))
        probe = probe_nmse(y[air.n_sym:], air.t, order, math.sqrt(air.signal_power(order)))
        report |= _nmse_fields("probe_", probe)
    return report


def slot_entry(air: AirCompRound, i: int, c: float, ev: AirCompEvent, order: list[int],
               train_loss: float, energy_comm_j: float | None, energy_comp_j: float,
               energy_comp_source: str) -> dict[str, Any]:
    """Participant ``i``'s metrics entry of the slot."""
    state = air.state
    entry: dict[str, Any] = {
        "device": i, "transmitted": True, "train_loss": train_loss,
        "alpha": abs(c / air.h_hat[i]), "sigma": state.uplinks[i].sigma,
        "h_abs": abs(air.h_hat[i]), "rho_upper": ev.gain_ratio_upper,
        "airtime_s": air.slot.slot_airtime_s(air.n_sym, state.hw.symbol_rate_hz),
        "energy_comm_j": energy_comm_j, "energy_comp_j": energy_comp_j,
        "energy_comp_source": energy_comp_source,
        "noise_multiplier": ev.effective_noise_multiplier,
        "noise_multiplier_all_colluding": ev.noise_multiplier_all_colluding,
        "aircomp_participants": order, "signal_power": air.signal_power(order),
    }
    if state.book is not None:
        entry |= {f"epsilon_{name}": r.epsilon for name, r in state.book.epsilon(i).items()}
    return entry


def keep_slot(state: RunState, t: int, order: list[int], entries: dict[int, dict[str, Any]],
              total: np.ndarray | None, timer: StageTimer) -> None:
    """Keep the round in ``inflight/``: the sum once, under the first participant (the
    others: ``None``; :func:`usable_kept`)."""
    for k, i in enumerate(order):
        vec = total if k == 0 else None
        timer.timed("keep", partial(state.rundir.keep_upload, t, i, vec, entries[i]))
    timer.timed("keep", state.rundir.sync_kept)  # one group commit for the slot
    fault_point("after_inflight")


def _nmse_fields(prefix: str, nmse: float) -> dict[str, float]:
    """``{prefix}nmse`` and ``{prefix}nmse_db``."""
    return {f"{prefix}nmse": nmse,
            f"{prefix}nmse_db": ratio_to_db(nmse) if nmse > 0 else -math.inf}


def _no_journal(i: int, event: Any, nonce: str | None) -> str | None:  # pragma: no cover
    raise AssertionError("in-process devices are journalled by the aircomp round itself")


def usable_kept(kept: dict[int, tuple[np.ndarray | None, dict[str, Any]]]
                ) -> dict[int, tuple[np.ndarray | None, dict[str, Any]]]:
    """An interrupted aircomp round's kept entries, with the sum dropped unless every
    participant of its slot was kept (the missing participants are lost for the round,
    :mod:`aggregator.resumed_round`, so a sum with their contributions in it is not used;
    dropping it costs no privacy)."""
    slots = {tuple(info.get("aircomp_participants", ())) for _, info in kept.values()}
    complete = all(set(s) <= set(kept) for s in slots)
    return kept if complete else {i: (None, info) for i, (_, info) in kept.items()}
