"""The aggregator's privacy book: durable ledger, both accountings, and the budget gate.

One :class:`PrivacyBook` per run. Every upload is appended (fsynced) to ``ledger.jsonl``
before its values are used, and composed in the ``paper`` and ``strict`` accountants; the
accounting named by ``enforce`` gates uploads against the epsilon target. On resume the
book is rebuilt from the ledger, never from zero.

Write-ahead: before a device transmits, :meth:`PrivacyBook.begin` fsyncs the *gated* event
(the one the budget check used: the exact state on simulated links, no channel credit
otherwise) to ``ledger.intents.jsonl``. After reception :meth:`PrivacyBook.commit` appends
the event with the channel state the receiver credits. If the process dies in between, the
next :class:`PrivacyBook` on the same run finds the intent without a ledger record and
appends the gated event, so an upload that may have gone on air is never left uncounted.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from aggregator.privacy import (
    MODES,
    BudgetGuard,
    EpsilonResult,
    Ledger,
    UploadEvent,
    rebuild_accountant,
)
from testbed.rundir import append_jsonl, read_jsonl


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
    """

    def __init__(self, ledger_path: Path, *, delta: float, enforce: str, target: float) -> None:
        if enforce not in MODES:
            raise ValueError(f"enforce: got {enforce!r}; allowed {MODES}")
        self.ledger = Ledger.open(ledger_path)
        self.intents_path = ledger_path.with_name(ledger_path.stem + ".intents.jsonl")
        self._recover_intents()
        self.accountants = {m: rebuild_accountant(self.ledger, mode=m, delta=delta) for m in MODES}
        self.enforce = enforce
        self.guard = BudgetGuard(self.accountants[enforce], target)

    def allows(self, event: UploadEvent) -> bool:
        """Whether recording ``event`` keeps its device within the target."""
        return self.guard.allows(event.device, event)

    def _recover_intents(self) -> None:
        recorded = {(e.device, e.round) for e in self.ledger.events()}
        for data in read_jsonl(self.intents_path):
            event = UploadEvent.from_dict(data)
            if (event.device, event.round) not in recorded:
                warnings.warn(
                    f"ledger: device {event.device} round {event.round} was about to transmit "
                    "when the run stopped; recording it with its gated (conservative) values",
                    stacklevel=2,
                )
                self.ledger.append(event)
                recorded.add((event.device, event.round))
        self.intents_path.unlink(missing_ok=True)

    def begin(self, event: UploadEvent) -> None:
        """Durably note that ``event``'s device is about to transmit (before the air)."""
        append_jsonl(self.intents_path, event.to_dict())

    def commit(self, event: UploadEvent) -> None:
        """Record the upload with the credited channel state (after reception): append it
        durably, then compose it in every accountant."""
        self.ledger.append(event)
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
