"""The reproduction report: CSV tables, PNG figures and ``report.md``.

Every measured number in a table is read from a file the same row names (a run's
``summary.json``, a plan's JSON or ``privacy_curve.csv``), so a reader or a test can trace
it back. Printed values are quoted from :mod:`testbed.reproduce.printed`.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.core.runs.rundir import atomic_write_bytes
from testbed.reproduce.figures import Sourced
from testbed.reproduce.printed import PAPER_NAMES, TABLE1


def fmt(x: Any, digits: int = 4) -> str:
    """A number for a markdown cell (``-`` when missing)."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        if math.isnan(x):
            return "nan"
        return f"{x:.{digits}g}"
    return str(x)


def rel(path: str | Path, root: Path) -> str:
    """``path`` relative to ``root`` when inside it (reports stay valid when moved)."""
    try:
        return os.path.relpath(Path(path).resolve(), root.resolve())
    except ValueError:
        return str(path)


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Path:
    """Write a CSV atomically."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(["" if c is None else c for c in r] for r in rows)
    atomic_write_bytes(path, buf.getvalue().encode())
    return path


def printed_accuracy(scheme: str, eps: float, dataset: str) -> float | None:
    """Table I's printed accuracy (%) for a scheme, epsilon and data set, if printed."""
    return TABLE1.get((eps, scheme), {}).get(dataset)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_fig(fig: Any, path: Path) -> Path:
    """Save a figure atomically (temp name, then rename)."""
    tmp = path.with_name(f".{path.name}.part")
    fig.savefig(tmp, dpi=110, format="png")
    _plt().close(fig)
    tmp.replace(path)
    return path


def bar_plot(
    path: Path,
    groups: list[str],
    series: dict[str, list[float | None]],
    *,
    title: str,
    ylabel: str,
    log: bool = False,
) -> Path:
    """Grouped bars: one group per entry of ``groups``, one bar per series (missing: none)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(7.5, 1.1 * len(groups) + 3.5), 4.2))
    n = max(1, len(series))
    width = 0.8 / n
    for k, (name, vals) in enumerate(series.items()):
        xs = [g + (k - (n - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None and math.isfinite(v) else 0.0 for v in vals]
        bars = ax.bar(xs, ys, width, label=name)
        for b, v in zip(bars, vals, strict=True):
            if v is None or not math.isfinite(v) or v == 0:  # a bar of height 0 is invisible
                ax.annotate("n/a" if v is None or not math.isfinite(v) else "0",
                            (b.get_x() + b.get_width() / 2, 0), ha="center", va="bottom",
                            fontsize=7, rotation=90, color=b.get_facecolor())
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("symlog", linthresh=1e-8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return save_fig(fig, path)


def sourced_cell(s: Sourced, digits: int = 4) -> str:
    """A sourced number, or ``-`` with the reason."""
    return fmt(s.value, digits) if s.value is not None else f"- ({s.why})"


def scheme_label(scheme: str) -> str:
    """``scheme`` with the paper's name."""
    return f"{scheme} ({PAPER_NAMES[scheme]})" if scheme in PAPER_NAMES else scheme
