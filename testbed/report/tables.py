"""Report tables whose every number names where it comes from in the run directory.

A :class:`Cell` holds the text shown and, for a number, the file and key path it was read
from (:class:`Ref`), or the operation (``sum``, ``mean``, ``min``, ``max``, ``count``) over
several such values. ``report/sources.json`` keeps every table with these references, so a
check can re-read each file and confirm each number (:func:`check_sources`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.report.load import as_float

#: A key into a JSON/YAML document: a mapping key or a list index (for ``metrics.jsonl``
#: the first key is the 0-based line).
Key = str | int
#: Operations a cell may apply to the numbers it references (``count``: how many
#: referenced keys exist, whatever they hold).
OPS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda v: math.fsum(v),
    "mean": lambda v: math.fsum(v) / len(v),
    "min": min,
    "max": max,
    # Spread: the population standard deviation (0 for one value).
    "std": lambda v: math.sqrt(max(0.0, math.fsum((x - math.fsum(v) / len(v)) ** 2
                                                  for x in v) / len(v))),
}


def apply_op(op: str, values: Sequence[Any]) -> Any:
    """``op`` over the looked-up ``values``: an ``int`` for ``count``, a ``float`` for the
    others, ``None`` when there is no number to apply it to."""
    if op == "count":
        return len(values)
    nums = [x for x in (as_float(v) for v in values) if x is not None]
    return OPS[op](nums) if nums else None


@dataclass(frozen=True)
class Ref:
    """Where a value lives: ``file`` (relative to the run directory) and the ``path`` of
    keys into it."""

    file: str
    path: tuple[Key, ...]

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "path": list(self.path)}


@dataclass(frozen=True)
class Cell:
    """One table cell: ``text`` as shown; ``op`` ``None`` for a label, ``"value"`` for the
    value at ``refs[0]``, else the operation of :data:`OPS` over the values at ``refs``."""

    text: str
    op: str | None = None
    refs: tuple[Ref, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text}
        if self.op is not None:
            out["op"] = self.op
            out["refs"] = [r.to_json() for r in self.refs]
        return out


def fmt(value: Any) -> str:
    """The one way a value is shown: floats to 4 significant digits, non-finite floats as
    ``inf``/``-inf``/``nan``, ``None`` as ``n/a``, booleans as yes/no, lists joined."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return value
    return str(value)


def label(text: str) -> Cell:
    """A cell of text that is not read from the run directory (a name, a unit)."""
    return Cell(text)


def value_cell(doc: Any, file: str, path: Sequence[Key]) -> Cell:
    """The value at ``path`` in ``doc`` (the parsed ``file``), or ``n/a`` when absent."""
    value = lookup(doc, path)
    if value is _MISSING:
        return Cell("n/a")
    return Cell(fmt(value), "value", (Ref(file, tuple(path)),))


def op_cell(op: str, file: str, paths: Sequence[Sequence[Key]], doc: Any) -> Cell:
    """Operation ``op`` (:func:`apply_op`) over the values at ``paths`` in ``doc`` (paths
    missing from ``doc`` are left out; ``n/a`` when nothing is left to apply it to)."""
    paths = [p for p in paths if lookup(doc, p) is not _MISSING]
    result = apply_op(op, [lookup(doc, p) for p in paths])
    if result is None:
        return Cell("n/a")
    return Cell(fmt(result), op, tuple(Ref(file, tuple(p)) for p in paths))


_MISSING = object()


def lookup(doc: Any, path: Sequence[Key]) -> Any:
    """Follow ``path`` into ``doc``; a private sentinel when a key is missing."""
    node = doc
    for k in path:
        if isinstance(node, dict) and isinstance(k, str) and k in node:
            node = node[k]
        elif isinstance(node, list) and isinstance(k, int) and 0 <= k < len(node):
            node = node[k]
        else:
            return _MISSING
    return node


def escape(text: str) -> str:
    """``text`` safe inside a Markdown table cell (pipes escaped, one line)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


@dataclass
class Table:
    """A titled table: ``header`` names, ``rows`` of cells, ``note`` below it."""

    key: str
    header: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    note: str = ""

    def markdown(self) -> str:
        lines = [
            "| " + " | ".join(escape(h) for h in self.header) + " |",
            "|" + "|".join(" --- " for _ in self.header) + "|",
        ]
        lines += ["| " + " | ".join(escape(c.text) for c in row) + " |" for row in self.rows]
        out = "\n".join(lines)
        return out + (f"\n\n{self.note}" if self.note else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.key,
            "header": self.header,
            "rows": [[c.to_json() for c in row] for row in self.rows],
        }


def read_source(run_dir: Path, file: str) -> Any:
    """A run file parsed afresh from disk for :func:`check_sources`: JSON, YAML, or for
    a ``.jsonl`` file the list of its complete lines."""
    p = run_dir / file
    if file.endswith(".jsonl"):
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return out
    if file.endswith(".yaml"):
        from testbed.core.config.safe_yaml import read_yaml_mapping

        return read_yaml_mapping(p, what=file)
    return json.loads(p.read_text(encoding="utf-8"))


def check_report(run_dir: Path) -> list[str]:
    """Check ``run_dir/report.md`` against the run directory; returns the problems found
    (none: every number in the report's tables comes from the run directory as stated).

    Every table row of ``report.md`` must be a row of ``report/sources.json``; every cell
    holding a digit must reference run files; each referenced value, re-read from disk
    (and put through its operation), must format to the text shown.
    """
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    sources = json.loads((run_dir / "report" / "sources.json").read_text(encoding="utf-8"))
    known_rows = set()
    cache: dict[str, Any] = {}
    bad = []
    for table in sources["tables"]:
        name = table["table"]
        known_rows.add("| " + " | ".join(escape(h) for h in table["header"]) + " |")
        for row in table["rows"]:
            known_rows.add("| " + " | ".join(escape(c["text"]) for c in row) + " |")
            for cell in row:
                op = cell.get("op")
                if op is None:
                    if any(ch.isdigit() for ch in cell["text"]):
                        bad.append(f"{name}: {cell['text']!r} has no source")
                    continue
                values = []
                for ref in cell["refs"]:
                    if ref["file"] not in cache:
                        cache[ref["file"]] = read_source(run_dir, ref["file"])
                    values.append(lookup(cache[ref["file"]], ref["path"]))
                if any(v is _MISSING for v in values):
                    bad.append(f"{name}: {cell['text']!r} refers to a missing key")
                    continue
                expected = fmt(values[0] if op == "value" else apply_op(op, values))
                if expected != cell["text"]:
                    bad.append(f"{name}: shows {cell['text']!r}, the run gives {expected!r}")
    for line in report.splitlines():
        if line.startswith("|") and not line.startswith("|---") and "| --- |" not in line:
            if line not in known_rows:
                bad.append(f"report.md row not in sources.json: {line[:80]!r}")
    return bad
