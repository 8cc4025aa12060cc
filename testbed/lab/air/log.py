"""The air log, ``<log-dir>/air.jsonl``: one JSON line per burst, then one summary line.

A burst's line is written when its last sample has been rendered (so ``overlaps`` names the
bursts that arrived after it too), or at shutdown for one still held. Keys of a rendered
burst: ``serial``, ``t_true_s``, ``start_index`` (fractional air index), ``n``, ``power_w``
(radiated, from its header), ``rx_power_w`` (mean power added at the receiver over its ``n``
samples, noise excluded; W), ``path_gain_db``, ``fading_gain_db``, ``budget_snr_db`` (the
``Es/N0`` of :func:`radio.link_budget.budget_snr_db`), ``overlaps`` (serials of the other
bursts overlapping it in time), ``late_to_air_samples``, ``ahead_of_air_s`` (how long
before the air rendered its first sample the burst arrived: the margin its transmitter's
lead left, s; negative when late). A dropped burst has ``serial``,
``t_true_s``, ``n`` and ``dropped`` (the reason). The last line is ``{"summary": {...}}``.
The file is appended to and every line flushed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

#: File name of the air log in its directory.
AIR_LOG = "air.jsonl"


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats as strings ("-inf"), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class AirLog:
    """Writer of ``air.jsonl`` (a no-op without a directory).

    Parameters
    ----------
    log_dir
        Directory (created if missing); ``None``: nothing is written.
    """

    def __init__(self, log_dir: str | Path | None) -> None:
        self.path: Path | None = None
        self._file: IO[str] | None = None
        if log_dir is not None:
            d = Path(log_dir)
            d.mkdir(parents=True, exist_ok=True)
            self.path = d / AIR_LOG
            self._file = self.path.open("a", encoding="utf-8")

    def write(self, line: dict[str, Any]) -> None:
        """Append one line and flush it."""
        if self._file is not None:
            self._file.write(json.dumps(_clean(line), allow_nan=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_air_log(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The burst lines and the last summary of an air log (``None``: no summary yet)."""
    bursts: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        if not raw.strip():
            continue
        line = json.loads(raw)
        if "summary" in line:
            summary = line["summary"]
        else:
            bursts.append(line)
    return bursts, summary
