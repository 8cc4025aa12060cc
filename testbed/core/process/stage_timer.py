"""Wall time per stage of a round (train, encode, link, decode, aggregate, eval)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageTimer:
    """Wall time per stage of a round (seconds)."""

    totals: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.totals[stage] = self.totals.get(stage, 0.0) + seconds

    def timed(self, stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.add(stage, time.perf_counter() - t0)
        return out
