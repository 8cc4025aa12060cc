"""The aggregator's privacy book: durable ledger, both accountings, and the budget gate.

One :class:`PrivacyBook` per run. Every upload is appended (fsynced) to ``ledger.jsonl``
before its values are used, and composed in the ``paper`` and ``strict`` accountants; the
accounting named by ``enforce`` gates uploads against the epsilon target. On resume the
book is rebuilt from the ledger, never from zero.
"""

from __future__ import annotations

from pathlib import Path

from aggregator.privacy import (
    MODES,
    BudgetGuard,
    EpsilonResult,
    Ledger,
    UploadEvent,
    rebuild_accountant,
)


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
        self.accountants = {m: rebuild_accountant(self.ledger, mode=m, delta=delta) for m in MODES}
        self.enforce = enforce
        self.guard = BudgetGuard(self.accountants[enforce], target)

    def allows(self, event: UploadEvent) -> bool:
        """Whether recording ``event`` keeps its device within the target."""
        return self.guard.allows(event.device, event)

    def record(self, event: UploadEvent) -> None:
        """Append durably, then compose in every accountant."""
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
