"""The aggregator's round, written once (003 Algorithm 1, the aggregator's side).

One round ``t``:

1. **plan**: the uploads of the round kept before an interruption (``inflight/``), those
   recorded but not kept (lost for the round and not asked again: a (device, round) is
   released and charged at most once, :mod:`aggregator.resumed_round`), the devices
   selected (:func:`aggregator.sampling.round_devices`) and those that cannot be asked now;
2. **gate**: each device's upload checked against its budget before any of the round's
   training (on a link with an exact channel state, with the probed state's credit);
3. **ask** the gated devices through :class:`aggregator.devices.Devices` (in this process,
   or edge agents over the control plane, TDMA slots and all) and **receive** their
   answers in device order;
4. **decode and record** each (:func:`aggregator.settle.settle`): the ledger commit comes
   before the upload is kept in ``inflight/``, whose copies are made durable by one group
   commit per batch of uploads and one after the round's last (:mod:`testbed.core.runs.inflight`);
5. **aggregate and evaluate** (:func:`aggregator.round_close.close_round`).

Under 002's secure aggregation (``zcdp-secagg``) step 3-4 is one secure sum
(:meth:`Devices.secure_round`): masked integers on the control plane, each recorded before
the sum is revealed, no channel credit.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from aggregator.aircomp_round import aircomp_round, usable_kept
from aggregator.devices import Devices, Upload
from aggregator.resumed_round import lost_entry, recorded_in_round
from aggregator.round_close import close_round
from aggregator.sampling import round_devices
from aggregator.settle import settle, tally
from aggregator.state import RunState
from radio.analog import n_symbols_for
from radio.link import Link
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.faults import fault_point
from testbed.core.runs.interrupts import StopSignals
from testbed.core.seeding import Stream, experiment_generator
from testbed.core.upload_events import PrivacyEvent


class RoundLoop:
    """The rounds of one run: the aggregator's state and the devices it asks.

    Parameters
    ----------
    state
        The aggregator's state of the run (model, settings, ledger).
    devices
        The devices, in this process or over the control plane.
    """

    def __init__(self, state: RunState, devices: Devices) -> None:
        self.state = state
        self.devices = devices
        #: Training losses of the committed rounds (``stop_at_loss``).
        self.losses: list[float] = []
        #: The first round this process ran (only it can find uploads recorded, not kept).
        self.first_round: int | None = None

    def recorded_not_kept(self, t: int, kept: set[int]) -> set[int]:
        """Devices (not in ``kept``) whose upload of round ``t`` is in the ledger already:
        lost for the round, never asked again (:mod:`aggregator.resumed_round`). Only the
        first round this process runs is searched; in any later one a device is recorded
        after it was asked."""
        if self.first_round is None:
            self.first_round = t
        if t != self.first_round:
            return set()
        return set(recorded_in_round(self.state.book, t, kept))

    def selected_devices(self, t: int) -> set[int]:
        """Devices asked to upload in round ``t`` (:func:`round_devices`)."""
        return round_devices(self.state.cfg, t)

    def gate_devices(
        self, t: int, link: Link, devices: list[int]
    ) -> tuple[dict[int, PrivacyEvent | None], dict[int, np.random.Generator]]:
        """For each of ``devices``: the gated event of its upload in round ``t`` (``None``:
        it may not upload) and its channel generator (the probe drew from it; the
        transmission continues it). Decided before any of the round's training."""
        state, cfg = self.state, self.state.cfg
        gated_events: dict[int, PrivacyEvent | None] = {}
        rngs: dict[int, np.random.Generator] = {}
        for i in devices:
            up = state.uplinks[i]
            ch_rng = experiment_generator(cfg.seed, Stream.CHANNEL, i, t)
            rngs[i] = ch_rng
            probed = link.probe(device=i, round_index=t, n_symbols=n_symbols_for(up.l),
                                rng=ch_rng)
            # Only a link whose reception reports exactly the probed state may have the
            # budget checked against it; otherwise assume no channel-noise credit.
            gated = state.event(i, t, probed if link.exact_state else None)
            ok = state.book is None or state.book.allows(gated)
            gated_events[i] = gated if ok else None
        return gated_events, rngs

    def gate_secure(self, t: int, devices: list[int]) -> dict[int, PrivacyEvent | None]:
        """The gated events of a secure-aggregation round: masked integers on the control
        plane never cross the channel, so no probe and no channel credit."""
        book = self.state.book
        events = {i: self.state.event(i, t, None) for i in devices}
        return {i: e if book is None or book.allows(e) else None for i, e in events.items()}

    def run_one_round(self, t: int, link: Link, stop: StopSignals) -> dict[str, Any] | None:
        """Round ``t``: its metrics line, or ``None`` when no device may upload without
        passing its budget (the run ends ``budget_exhausted``)."""
        state, cfg, devices = self.state, self.state.cfg, self.devices
        secure = cfg.scheme == "zcdp-secagg"
        timer = StageTimer()
        t0 = time.perf_counter()
        kept = state.rundir.load_inflight(t)  # uploads of this round before an interruption
        recorded = self.recorded_not_kept(t, set(kept))
        devices.begin_round(t, stop)
        selected = self.selected_devices(t)
        absent = devices.absent(selected) - recorded
        asked = sorted(selected - set(kept) - recorded - absent)
        if cfg.scheme == "aircomp":
            return self._aircomp(t, link, stop, timer, t0, usable_kept(kept), selected, asked,
                                 recorded)
        if secure:
            gated, ch_rngs = self.gate_secure(t, asked), {}
        else:
            gated, ch_rngs = timer.timed("gate", lambda: self.gate_devices(t, link, asked))
        if not kept and not recorded and not absent and all(gated[i] is None for i in asked):
            return None
        allowed = {i: e for i, e in gated.items() if e is not None}
        entries: dict[int, dict[str, Any]] = {}
        vectors: dict[int, np.ndarray | None] = {}
        decoded: list[np.ndarray] = []
        losses: list[float] = []
        extra: dict[str, Any] = {}
        if secure:
            outcome = devices.secure_round(t, state.w, allowed, stop, timer)
            entries = outcome.devices
            losses = outcome.losses
            if outcome.total is not None:  # an abandoned round leaves the model as it was
                decoded.append(outcome.total)
            if outcome.report is not None:
                extra["secagg"] = outcome.report
        else:
            self._uploads(t, link, stop, timer, allowed, ch_rngs, entries, vectors)
            extra = devices.end_round(t)  # a dead receiver fails the round here
        listed = (range(cfg.devices) if devices.lists_every_device
                  else sorted(selected | set(kept) | recorded))
        per_device: list[dict[str, Any]] = []
        for i in listed:
            if i in kept:
                vec, info = kept[i]
                tally({**info, "resumed": True}, vec, decoded, losses, per_device)
            elif i in recorded:
                per_device.append(lost_entry(i))
            elif i in vectors:
                tally(entries[i], vectors[i], decoded, losses, per_device)
            elif i in entries:  # secure aggregation: the sum is decoded, not each upload
                per_device.append(entries[i])
            else:
                reason = ("not selected" if i not in selected else "absent" if i in absent
                          else "budget")
                per_device.append({"device": i, "transmitted": False, "skipped": reason})
        line = close_round(state, t, decoded, losses, per_device, timer, t0, self.losses,
                           n_avg=len(selected))
        line |= extra
        if len(selected) < cfg.devices:
            # Entries for the devices asked only: the line does not grow with the population.
            line["selected"] = len(selected)
            line["population"] = cfg.devices
        return line

    def _aircomp(
        self, t: int, link: Link, stop: StopSignals, timer: StageTimer, t0: float,
        kept: dict[int, tuple[np.ndarray | None, dict[str, Any]]], selected: set[int],
        asked: list[int], recorded: set[int],
    ) -> dict[str, Any] | None:
        """Round ``t`` of over-the-air aggregation: ``asked`` in one slot
        (:func:`aggregator.aircomp_round.aircomp_round`), ``kept`` from before an
        interruption, ``recorded`` (not kept) lost; ``None`` when no device may transmit."""
        state = self.state
        out = aircomp_round(state, self.devices, link, t, asked, stop, timer) if asked else None
        if out is None and not kept and not recorded:
            return None
        entries, total, losses, report = out or ({}, None, [], {})
        decoded: list[np.ndarray] = [] if total is None else [total]
        per_device: list[dict[str, Any]] = []
        for i in sorted(selected | set(kept) | recorded):
            if i in kept:
                vec, info = kept[i]
                tally({**info, "resumed": True}, vec, decoded, losses, per_device)
            elif i in recorded:
                per_device.append(lost_entry(i))
            elif i in entries:
                per_device.append(entries[i])
            else:
                reason = "not selected" if i not in selected else "budget"
                per_device.append({"device": i, "transmitted": False, "skipped": reason})
        line = close_round(state, t, decoded, losses, per_device, timer, t0, self.losses,
                           n_avg=len(selected))
        line |= self.devices.end_round(t)
        line["uploads"] = sum(1 for d in per_device if d.get("transmitted"))  # one slot
        if report:
            line["aircomp"] = report
        return line

    def _uploads(
        self, t: int, link: Link, stop: StopSignals, timer: StageTimer,
        allowed: dict[int, PrivacyEvent], ch_rngs: dict[int, np.random.Generator],
        entries: dict[int, dict[str, Any]], vectors: dict[int, np.ndarray | None],
    ) -> None:
        """Ask the ``allowed`` devices for their uploads of round ``t`` and settle each
        answer, in device order, into ``entries`` (metrics) and ``vectors`` (decoded
        differentials, ``None`` when lost)."""
        state, cfg, devices = self.state, self.state.cfg, self.devices
        book = state.book

        def journal(i: int, event: PrivacyEvent, nonce: str | None = None) -> str | None:
            return book.begin(event, nonce) if book is not None else nonce

        for got in devices.ask(t, state.w, allowed, journal, stop, timer):
            i, nonce = got.device, got.nonce
            gated = allowed[i]
            rng = ch_rngs.get(i) or experiment_generator(cfg.seed, Stream.CHANNEL, i, t)
            with stop.critical():
                if not got.journalled:
                    assert isinstance(got.answer, Upload)
                    nonce = journal(i, gated)
                    fault_point("after_intent")
                info, vec = settle(state, devices, t, i, nonce, gated, got.answer, link, rng,
                                   timer)
            entries[i], vectors[i] = info, vec
        # The group commit of the uploads kept since the last batch's (one fsync).
        timer.timed("keep", state.rundir.sync_kept)
