"""Errors that end a run with a named outcome, raised on the device side and handled by the
aggregator's run loop (``summary.json``'s ``status``)."""

from __future__ import annotations


class TrainingDiverged(RuntimeError):
    """Local training produced non-finite weights (the run ends with status 'diverged')."""
