"""The aggregator's privacy book: durable ledger, both accountings, and the budget gate.

One :class:`PrivacyBook` per run. Every upload is appended (fsynced) to ``ledger.jsonl``
before its values are used, and composed in the ``paper`` and ``strict`` accountants; the
accounting named by ``enforce`` gates uploads against the epsilon target. On resume the
book is rebuilt from the ledger, never from zero.

Write-ahead: just before a device transmits, :meth:`PrivacyBook.begin` fsyncs the *gated*
event (the one the budget check used: the exact state on simulated links, no channel credit
otherwise) to ``ledger.intents.jsonl`` under a fresh random nonce, and returns the nonce.
After reception :meth:`PrivacyBook.commit` appends the event with the channel state the
receiver credits, carrying the same nonce. If the process dies in between, the next
:class:`PrivacyBook` on the same run finds the intent whose nonce has no ledger record and
appends the gated event under that nonce, so an upload that may have gone on air is never
left uncounted, and one that was recorded is never recorded twice (matching by nonce, not by
device and round: a round re-run after a crash is a new transmission with a new nonce).

One writer: :meth:`PrivacyBook.begin` first checks that the ledger still ends with the line
this book last read or wrote (:meth:`~testbed.core.privacy.ledger.Ledger.check_tail`); a line
written by another process (a second run on the same directory) raises
:class:`~testbed.core.privacy.ledger.LedgerError` before the intent is journalled, so this
process stops before transmitting. :meth:`PrivacyBook.commit` records an upload that
already went on air even then (after the other writer's lines, unless one of them already
carries its nonce) and then raises. The ledger's header pins the book's values (and the
run's configuration, given as ``header``); see :mod:`testbed.core.privacy.ledger` for the
hash chain that makes edited, reordered or deleted lines detectable.
"""

from __future__ import annotations

import math
import secrets
import warnings
from operator import itemgetter
from pathlib import Path
from typing import Any

from testbed.core.privacy import (
    MODES,
    BudgetGuard,
    Ledger,
    LedgerError,
    PrivacyAccountant,
)
from testbed.core.privacy.accountants.record_accountant import RecordAccountant
from testbed.core.privacy.aircomp_events import AirCompEvent
from testbed.core.privacy.analysis.record_epsilon import RECORD_ACCOUNTANTS
from testbed.core.privacy.event_types import UNIT_CLASSES, PrivacyEvent
from testbed.core.privacy.events import EventError
from testbed.core.privacy.ledger import EVENT_TYPES, LedgerEntry, intents_path
from testbed.core.privacy.ledger_parse import gc_paused
from testbed.core.runs.rundir import append_jsonl, atomic_write_bytes, read_jsonl

#: Accountings kept side by side, per privacy unit; the first is the default enforced one.
ACCOUNTINGS = {"device": MODES, "record": RECORD_ACCOUNTANTS}


def make_accountants(unit: str, delta: float, relation: str = "add-remove") -> dict[str, Any]:
    """The accountants a book keeps side by side for ``unit``, by accounting name.

    ``"device"``: :class:`PrivacyAccountant` ``paper`` and ``strict``; ``"record"``:
    :class:`RecordAccountant` ``rdp`` and ``pld`` under ``relation``.
    """
    if unit not in ACCOUNTINGS:
        raise ValueError(f"unit: got {unit!r}; allowed {tuple(ACCOUNTINGS)}")
    if unit == "device":
        return {name: PrivacyAccountant(mode=name, delta=delta) for name in ACCOUNTINGS[unit]}
    return {name: RecordAccountant(name, delta, relation=relation) for name in ACCOUNTINGS[unit]}


class PrivacyBook:
    """Ledger plus one accountant per accounting plus a guard on the enforced one.

    Parameters
    ----------
    ledger_path
        ``ledger.jsonl`` of the run (created if absent, replayed if present).
    delta
        Target delta.
    enforce
        The accounting whose epsilon may not pass ``target``: ``paper`` or ``strict`` for
        the device unit (:class:`UploadEvent`), ``rdp`` or ``pld`` for the record unit
        (:class:`RecordEvent`, composed with dp-accounting).
    target
        Per-device epsilon target.
    unit
        ``"device"`` or ``"record"``.
    relation
        Record unit only: ``"add-remove"`` or ``"replace-one"``.
    header
        Extra values pinned in the ledger's header (with the unit, ``delta``, ``enforce``
        and ``target``); reopening a ledger written for other values is refused.
    """

    def __init__(
        self,
        ledger_path: Path,
        *,
        delta: float,
        enforce: str,
        target: float,
        unit: str = "device",
        relation: str = "add-remove",
        header: dict[str, Any] | None = None,
    ) -> None:
        if unit not in ACCOUNTINGS:
            raise ValueError(f"unit: got {unit!r}; allowed {tuple(ACCOUNTINGS)}")
        if enforce not in ACCOUNTINGS[unit]:
            raise ValueError(f"enforce: got {enforce!r}; allowed {ACCOUNTINGS[unit]} ({unit} unit)")
        self.unit = unit
        self.event_class = UNIT_CLASSES[unit]  # the event types the unit records
        pinned: dict[str, Any] = {"delta": delta, "accounting": enforce, "epsilon_target": target}
        if unit == "record":
            pinned |= {"unit": unit, "relation": relation}
        self.intents_path = intents_path(ledger_path)
        # One read of the ledger: Ledger.open has checked every line; recovery appends.
        # (The collector is paused for all of it: it would walk each line's objects again.)
        with gc_paused():
            self.ledger = Ledger.open(ledger_path, header={**pinned, **(header or {})})
            entries = self.ledger.take_loaded()
            nonces = set(map(itemgetter(1), entries))  # LedgerEntry: (event, nonce)
            entries += self._recover_intents(nonces)  # adds the recovered nonces
            nonces.discard(None)
            self._nonces: set[str] = nonces
            events: list[PrivacyEvent] = list(map(itemgetter(0), entries))
            del entries
            event_class = self.event_class
            if not all(issubclass(kind, event_class) for kind in set(map(type, events))):
                wrong = next(e for e in events if not isinstance(e, event_class))
                names = " or ".join(c.__name__ for c in event_class)
                raise LedgerError(
                    f"{ledger_path}: holds a {type(wrong).__name__}, but this run accounts "
                    f"at the {unit} level ({names})"
                )
            self.accountants: dict[str, Any] = make_accountants(unit, delta, relation)
            for acc in self.accountants.values():
                acc.add_all(events)
            del events
        self.enforce = enforce
        self.delta = delta
        self.guard = BudgetGuard(self.accountants[enforce], target)

    def _compose(self, event: PrivacyEvent) -> None:
        for acc in self.accountants.values():
            acc.add(event)

    def allows(self, event: PrivacyEvent) -> bool:
        """Whether recording ``event`` keeps its device within the target."""
        return self.guard.allows(event.device, event)

    def _recover_intents(self, recorded: set[str | None]) -> list[LedgerEntry]:
        """Record every intent whose nonce is not among ``recorded`` (the ledger's nonces,
        to which the recorded intents' nonces are added): it may have gone on air. Returns
        the entries appended, in order."""
        self.recovered: list[PrivacyEvent] = []
        appended: list[LedgerEntry] = []
        lines = read_jsonl(self.intents_path)
        cancelled = {
            d.get("nonce") for d in lines if isinstance(d, dict) and d.get("cancelled") is True
        }
        for number, data in enumerate(lines, start=1):
            if isinstance(data, dict) and data.get("cancelled") is True:
                continue
            nonce = data.get("nonce") if isinstance(data, dict) else None
            if nonce in cancelled:
                continue  # it never went on air (the device said so before it could)
            if not isinstance(nonce, str) or not isinstance(data.get("event"), dict):
                raise EventError(
                    f"{self.intents_path}: line {number} is not an intent (nonce + event)"
                )
            if nonce in recorded:
                continue
            kind = data["event"].get("type")
            cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
            if cls is None:
                raise EventError(f"{self.intents_path}: line {number}: unknown event type {kind!r}")
            event = cls.from_dict(data["event"])
            warnings.warn(
                f"ledger: device {event.device} round {event.round} was about to transmit "
                "when the run stopped; recording it with its gated (conservative) values",
                stacklevel=2,
            )
            self.ledger.append(event, nonce, adopt=True)
            recorded.add(nonce)
            self.recovered.append(event)
            appended.append(LedgerEntry(event, nonce))
        if self.intents_path.exists():
            # Every intent now has its record: start the journal afresh (atomic).
            atomic_write_bytes(self.intents_path, b"")
        return appended

    def begin(self, event: PrivacyEvent, nonce: str | None = None) -> str:
        """Durably note that ``event``'s device is about to transmit (before the air).

        ``nonce``: the transmission's id when a peer chose it (a lab aggregator authorizes
        each upload under a fresh nonce, and the edge journals it under the same one); by
        default a fresh random one. Returns the nonce that :meth:`commit` must be given.

        Raises
        ------
        LedgerError
            The nonce is recorded already, or another process has written to the ledger
            since this book last read or wrote it (then nothing is journalled: stop, do not
            transmit).
        """
        nonce = secrets.token_hex(16) if nonce is None else nonce
        if nonce in self._nonces:
            raise LedgerError(f"nonce {nonce} is already in the ledger (a replay)")
        self.ledger.check_tail()
        append_jsonl(self.intents_path, {"nonce": nonce, "event": event.to_dict()})
        return nonce

    def cancel(self, nonce: str) -> None:
        """Durably withdraw an intent whose upload never went on air (the device refused
        before transmitting). Only for an intent that has no ledger record."""
        if nonce in self._nonces:
            raise LedgerError(f"nonce {nonce} is recorded; a recorded upload is never withdrawn")
        append_jsonl(self.intents_path, {"nonce": nonce, "cancelled": True})

    def nonces(self) -> set[str]:
        """Nonces of every recorded upload."""
        return set(self._nonces)

    def entries_by_nonce(self) -> dict[str, PrivacyEvent]:
        """Every recorded event by its nonce."""
        return {e.nonce: e.event for e in self.ledger.entries() if e.nonce is not None}

    def entries(self, device: int) -> list[tuple[str | None, PrivacyEvent]]:
        """``(nonce, event)`` of every recorded upload of ``device``, in ledger order."""
        return [(e.nonce, e.event) for e in self.ledger.entries() if e.event.device == device]

    def commit(self, event: PrivacyEvent, nonce: str) -> None:
        """Record the upload with the credited channel state (after reception): append it
        durably under the transmission's ``nonce``, then compose it in every accountant.

        Raises
        ------
        LedgerError
            Another process has written to the ledger since this book last did: the upload
            is recorded after its lines all the same (it went on air), then this is raised
            so that the run stops.
        """
        self.ledger.append(event, nonce, adopt=True)
        self._nonces.add(nonce)
        self._compose(event)

    def epsilon(self, device: int) -> dict[str, Any]:
        """The device's current epsilon in each accounting (results with ``.epsilon``)."""
        return {m: acc.epsilon(device) for m, acc in self.accountants.items()}

    def enforced_epsilon(self, device: int) -> float:
        """The device's epsilon in the enforced accounting."""
        return float(self.accountants[self.enforce].epsilon(device).epsilon)

    def report(self, device: int) -> dict[str, Any]:
        """The device's privacy figures for the summary, each with its unit and meaning.

        Device unit: ``epsilon_paper``, ``epsilon_strict``. Record unit: ``epsilon_rdp``,
        ``epsilon_pld``, ``epsilon_no_channel`` (the enforced accountant with no channel
        credit, as an eavesdropper with a better channel would see it) and
        ``epsilon_device_level`` (the same run with a device's whole data set as the unit).
        Both: ``epsilon`` (enforced), ``delta_total`` (delta plus the failure probability
        of every confidence bound credited).
        """
        out: dict[str, Any] = {f"epsilon_{m}": r.epsilon for m, r in self.epsilon(device).items()}
        out["epsilon"] = self.enforced_epsilon(device)
        out["unit"] = self.unit
        out["accountant"] = self.enforce
        if self.unit == "record":
            acc = self.accountants[self.enforce]
            out["epsilon_no_channel"] = acc.epsilon_without_channel(device).epsilon
            out["epsilon_device_level"] = acc.device_epsilon(device)
        history = self.accountants[self.enforce].history(device)
        if any(isinstance(e, AirCompEvent) for e in history):
            out |= self._aircomp_figures(history)
        failure = math.fsum(getattr(e, "bound_failure_prob", 0.0) for e in history)
        out["delta"] = self.delta
        out["delta_total"] = self.delta + failure
        out["uploads"] = len(history)
        return out

    def _aircomp_figures(self, history: tuple[PrivacyEvent, ...]) -> dict[str, Any]:
        """Over-the-air rounds: the colluders the budget was enforced under (the summary's
        ``privacy.trust`` says it in words), and the epsilon with every other device
        colluding (own noise and the receiver's only), composed by the enforced accountant
        from the same events (docs/privacy.md section 12)."""
        colluding = max(e.colluding for e in history if isinstance(e, AirCompEvent))
        acc = self.accountants[self.enforce]
        return {"epsilon_all_colluding": acc.epsilon_all_colluding(history[0].device).epsilon,
                "colluding_devices": colluding}

    def close(self) -> None:
        self.ledger.close()
