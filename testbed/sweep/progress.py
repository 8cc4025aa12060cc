"""What a sweep prints as its cells start and end: the running count of cells and the two
lines (:func:`cell_start_line`, :func:`cell_end_line`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CellCount:
    """The running count of a sweep's cells: ``done`` (ended, skipped ones included),
    ``running`` (started, not ended) and the rest, to go.

    Attributes
    ----------
    total
        Cells of the sweep.
    done
        Cells that ended (or were skipped as finished earlier).
    running
        Names of the cells started and not ended.
    """

    total: int
    done: int = 0
    running: set[str] = field(default_factory=set)

    def text(self) -> str:
        """``2 done, 1 running, 5 to go``."""
        to_go = self.total - self.done - len(self.running)
        return f"{self.done} done, {len(self.running)} running, {to_go} to go"


def cell_start_line(n: int, count: CellCount, label: str, action: str) -> str:
    """The line of cell ``n`` (1-based) starting: ``cell 3/8 started: lr=0.1 (run); 2 done,
    1 running, 5 to go`` (``action``: ``run`` or ``resume``; ``count`` already has it
    running)."""
    return f"cell {n}/{count.total} started: {label} ({action}); {count.text()}"


def cell_end_line(n: int, count: CellCount, label: str, action: str, row: dict[str, Any],
                  wall_s: float | None) -> str:
    """The line of cell ``n`` (1-based) ending: ``cell 3/8 (lr=0.1): ran: completed,
    accuracy 0.8100, 12.3 s; 3 done, 0 running, 5 to go`` (``count`` already has it done;
    ``wall_s``: its process's wall time, ``None``: not run)."""
    took = "" if wall_s is None else f", {wall_s:.1f} s"
    return (f"cell {n}/{count.total} ({label}): {action}: {outcome_text(row)}{took}; "
            f"{count.text()}")


def outcome_text(row: dict[str, Any]) -> str:
    text = str(row["status"])
    if row["final_accuracy"] is not None:
        text += f", accuracy {row['final_accuracy']:.4f}"
    if row["epsilon_max"] is not None:
        text += f", max epsilon {row['epsilon_max']:.3g} ({row['privacy_unit']}, "
        text += f"{row['accountant']}, delta {row['delta']:g})"
    if row["note"]:
        text += f" ({row['note']})"
    return text
