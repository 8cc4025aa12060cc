"""The figures protocol of the benchmark scripts (``benchmarks/bench_*.py``).

Each script measures something and a baseline in the same run and, with ``--json``, prints
one JSON object on its last stdout line with a list ``"figures"``; each figure is a
:class:`Figure` (``benchmarks/README.md`` has the protocol). ``testbed bench`` reads them
back with :func:`parse_figures` and prints them in one table with :func:`format_table`.

``ratio`` is always ``value / baseline``; ``better`` says which way is good, so an aim is a
lower bound on the ratio when ``better == "higher"`` (a throughput) and an upper bound when
``better == "lower"`` (a time).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

#: Directions a figure can improve in.
BETTER = ("higher", "lower")


class FigureError(ValueError):
    """A benchmark's output does not follow the figures protocol."""


@dataclass(frozen=True)
class Figure:
    """One measured figure next to its baseline from the same run.

    Attributes
    ----------
    name
        Short identifier, unique within its benchmark.
    value, baseline
        The measurement and the baseline's, both in ``unit``.
    unit
        Unit of ``value`` and ``baseline`` (``"s"``, ``"Msample/s"``, ``"fraction"``, ...).
    better
        ``"higher"`` or ``"lower"``: which way ``value`` improves.
    ratio
        ``value / baseline``.
    aim
        Bound on ``ratio`` (``>=`` when ``better == "higher"``, ``<=`` otherwise); ``None``:
        none.
    aim_value
        Bound on ``value`` itself in ``unit`` (same direction); ``None``: none.
    met
        Every given aim holds; ``None`` when there is no aim.
    baseline_name
        What the baseline is.
    note
        Anything a reader needs to judge the figure (sizes, caveats).
    """

    name: str
    value: float
    baseline: float
    unit: str
    better: str
    ratio: float
    aim: float | None = None
    aim_value: float | None = None
    met: bool | None = None
    baseline_name: str = ""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The figure as a JSON-ready dict (the protocol's keys)."""
        return asdict(self)


def _holds(x: float, bound: float, better: str) -> bool:
    return x >= bound if better == "higher" else x <= bound


def figure(
    name: str,
    value: float,
    baseline: float,
    unit: str,
    *,
    better: str,
    aim: float | None = None,
    aim_value: float | None = None,
    baseline_name: str = "",
    note: str = "",
) -> Figure:
    """Build a :class:`Figure`, computing ``ratio`` and ``met``.

    Raises
    ------
    FigureError
        ``better`` not in :data:`BETTER`, or a non-finite or non-positive baseline.
    """
    if better not in BETTER:
        raise FigureError(f"figure {name!r}: better={better!r}; allowed: {BETTER}")
    value, baseline = float(value), float(baseline)
    if not (math.isfinite(value) and math.isfinite(baseline) and baseline > 0):
        raise FigureError(
            f"figure {name!r}: value={value}, baseline={baseline}; need finite numbers and "
            "baseline > 0"
        )
    ratio = value / baseline
    checks = [_holds(ratio, aim, better)] if aim is not None else []
    if aim_value is not None:
        checks.append(_holds(value, aim_value, better))
    return Figure(
        name=name, value=value, baseline=baseline, unit=unit, better=better, ratio=ratio,
        aim=None if aim is None else float(aim),
        aim_value=None if aim_value is None else float(aim_value),
        met=all(checks) if checks else None, baseline_name=baseline_name, note=note,
    )


def _number(raw: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    x = raw.get(key)
    if x is None and optional:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise FigureError(f"{where}: key {key!r} must be a number, got {x!r}")
    return float(x)


def parse_figures(obj: Any, where: str = "benchmark output") -> list[Figure]:
    """The figures of one benchmark's JSON object.

    ``ratio`` and ``met`` are recomputed from ``value``, ``baseline``, ``better`` and the
    aims (a script's own ``ratio`` must agree with ``value / baseline`` to 1e-6).

    Raises
    ------
    FigureError
        ``obj`` has no list ``figures`` or a figure misses or misstates a key.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("figures"), list):
        raise FigureError(f"{where}: need a JSON object with a list 'figures'")
    out: list[Figure] = []
    for i, raw in enumerate(obj["figures"]):
        at = f"{where}, figure {i}"
        if not isinstance(raw, dict):
            raise FigureError(f"{at}: need an object, got {raw!r}")
        name, unit = raw.get("name"), raw.get("unit")
        if not isinstance(name, str) or not name:
            raise FigureError(f"{at}: key 'name' must be a non-empty string, got {name!r}")
        at = f"{where}, figure {name!r}"
        if not isinstance(unit, str):
            raise FigureError(f"{at}: key 'unit' must be a string, got {unit!r}")
        fig = figure(
            name, _number(raw, "value", at), _number(raw, "baseline", at), unit,
            better=raw.get("better", "higher"),
            aim=_number(raw, "aim", at, optional=True),
            aim_value=_number(raw, "aim_value", at, optional=True),
            baseline_name=str(raw.get("baseline_name", "")), note=str(raw.get("note", "")),
        )
        given = _number(raw, "ratio", at, optional=True)
        if given is not None and not math.isclose(given, fig.ratio, rel_tol=1e-6):
            raise FigureError(
                f"{at}: ratio {given} != value / baseline = {fig.ratio} (the protocol's ratio "
                "is value / baseline; say which way is good with 'better')"
            )
        out.append(fig)
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise FigureError(f"{where}: figure names repeat: {names}")
    return out


def _num(x: float) -> str:
    return f"{x:.4g}"


def _ratio_text(r: float) -> str:
    return f"{r:.2f}x" if 0.01 <= r < 1000 else f"{r:.3g}x"


def _aim_text(f: Figure) -> str:
    op = ">=" if f.better == "higher" else "<="
    parts = []
    if f.aim is not None:
        parts.append(f"{op}{f.aim:g}x")
    if f.aim_value is not None:
        parts.append(f"{op}{f.aim_value:g} {f.unit}")
    return " and ".join(parts) or "-"


def format_table(rows: list[tuple[str, Figure | None, str]]) -> str:
    """One table of ``(benchmark, figure or None, status)`` rows.

    A row without a figure reports a benchmark that gave none (``status`` says why).
    """
    head = ("benchmark", "figure", "value", "baseline", "ratio", "aim", "met")
    lines: list[tuple[str, ...]] = [head]
    for bench, f, status in rows:
        if f is None:
            lines.append((bench, status))
            continue
        met = "n/a" if f.met is None else ("yes" if f.met else "NO")
        lines.append((
            bench, f.name, f"{_num(f.value)} {f.unit}", f"{_num(f.baseline)} {f.unit}",
            _ratio_text(f.ratio), _aim_text(f), met,
        ))
    widths = [max(len(r[c]) for r in lines if len(r) == len(head)) for c in range(len(head))]
    widths[0] = max(len(r[0]) for r in lines)
    text = []
    for k, r in enumerate(lines):
        if len(r) != len(head):
            text.append(f"{r[0]:<{widths[0]}}  {r[1]}")
            continue
        text.append("  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            text.append("  ".join("-" * w for w in widths))
    return "\n".join(text)
