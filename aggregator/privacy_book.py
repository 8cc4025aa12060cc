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
"""

from __future__ import annotations

import secrets
import warnings
from pathlib import Path
from typing import Any

from aggregator.privacy import (
    MODES,
    BudgetGuard,
    EpsilonResult,
    Ledger,
    UploadEvent,
    rebuild_accountant,
)
from aggregator.privacy.events import EventError
from testbed.rundir import append_jsonl, atomic_write_bytes, read_jsonl


class PrivacyBook:
    """Ledger plus per-mode accountants plus a guard on the enforcing mode.

    Parameters
    ----------
    ledger_path
        ``ledger.jsonl`` of the run (created if absent, replayed if present).
    delta
        Target delta.
    enforce
        ``paper`` or ``strict``: the accounting whose epsilon may not pass ``target``.
    target
        Per-device epsilon target.
    header
        Extra values pinned in the ledger's header (with ``delta``, ``enforce`` and
        ``target``); reopening a ledger written for other values is refused.
    """

    def __init__(
        self,
        ledger_path: Path,
        *,
        delta: float,
        enforce: str,
        target: float,
        header: dict[str, Any] | None = None,
    ) -> None:
        if enforce not in MODES:
            raise ValueError(f"enforce: got {enforce!r}; allowed {MODES}")
        pinned = {"delta": delta, "accounting": enforce, "epsilon_target": target}
        self.ledger = Ledger.open(ledger_path, header={**pinned, **(header or {})})
        self.intents_path = ledger_path.with_name(ledger_path.stem + ".intents.jsonl")
        self._recover_intents()
        self.accountants = {m: rebuild_accountant(self.ledger, mode=m, delta=delta) for m in MODES}
        self.enforce = enforce
        self.guard = BudgetGuard(self.accountants[enforce], target)

    def allows(self, event: UploadEvent) -> bool:
        """Whether recording ``event`` keeps its device within the target."""
        return self.guard.allows(event.device, event)

    def _recover_intents(self) -> None:
        """Record every intent whose nonce has no ledger entry (it may have gone on air)."""
        recorded = {entry.nonce for entry in self.ledger.entries()}
        self.recovered: list[UploadEvent] = []
        for number, data in enumerate(read_jsonl(self.intents_path), start=1):
            nonce = data.get("nonce") if isinstance(data, dict) else None
            if not isinstance(nonce, str) or not isinstance(data.get("event"), dict):
                raise EventError(
                    f"{self.intents_path}: line {number} is not an intent (nonce + event)"
                )
            if nonce in recorded:
                continue
            event = UploadEvent.from_dict(data["event"])
            warnings.warn(
                f"ledger: device {event.device} round {event.round} was about to transmit "
                "when the run stopped; recording it with its gated (conservative) values",
                stacklevel=2,
            )
            self.ledger.append(event, nonce)
            recorded.add(nonce)
            self.recovered.append(event)
        if self.intents_path.exists():
            # Every intent now has its record: start the journal afresh (atomic).
            atomic_write_bytes(self.intents_path, b"")

    def begin(self, event: UploadEvent) -> str:
        """Durably note that ``event``'s device is about to transmit (before the air).

        Returns the nonce that :meth:`commit` must be given for this transmission.
        """
        nonce = secrets.token_hex(16)
        append_jsonl(self.intents_path, {"nonce": nonce, "event": event.to_dict()})
        return nonce

    def commit(self, event: UploadEvent, nonce: str) -> None:
        """Record the upload with the credited channel state (after reception): append it
        durably under the transmission's ``nonce``, then compose it in every accountant."""
        self.ledger.append(event, nonce)
        for acc in self.accountants.values():
            acc.add(event)

    def epsilon(self, device: int) -> dict[str, EpsilonResult]:
        """The device's current epsilon in each accounting."""
        return {m: acc.epsilon(device) for m, acc in self.accountants.items()}

    def uploads(self, device: int) -> int:
        """Uploads recorded for ``device``."""
        return len(self.accountants[self.enforce].history(device))

    def close(self) -> None:
        self.ledger.close()
