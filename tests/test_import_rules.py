"""The rooms of the code base and who may import whom (docs/architecture.md).

Every import of every module is read from its source (``ast``: module level, inside
functions and under ``TYPE_CHECKING`` alike), so an import made late to dodge a cycle is
still an import.

- ``testbed/core/`` (config, protocol, sockets and keys, models, data, privacy accounting,
  run directory ...) imports only ``radio/`` and third-party packages;
- ``aggregator/`` and ``edge_device/`` import the core and ``radio/``, never each other and
  never the rest of ``testbed/``;
- ``radio/`` imports none of them.

The rest of ``testbed/`` (CLI, in-process runner, launch, sweeps, reports, reproduction)
wires the rooms together and may import any of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Our top-level packages (anything else is stdlib or third-party).
OURS = ("testbed", "aggregator", "edge_device", "radio")


def room(module: str) -> str | None:
    """The room of a dotted module name: ``core``, ``aggregator``, ``edge_device``,
    ``radio``, ``testbed`` (the driving layer) or ``None`` (not ours)."""
    parts = module.split(".")
    if parts[0] not in OURS:
        return None
    if parts[0] == "testbed" and len(parts) > 1 and parts[1] == "core":
        return "core"
    return parts[0]


#: What each room may import (besides itself and third-party packages).
ALLOWED: dict[str, set[str]] = {
    "core": {"core", "radio"},
    "aggregator": {"aggregator", "core", "radio"},
    "edge_device": {"edge_device", "core", "radio"},
    "radio": {"radio"},
    "testbed": {"testbed", "core", "aggregator", "edge_device", "radio"},
}


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(
    path: Path, root: Path = ROOT, text: str | None = None
) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every import in the file (or in ``text``, read as that
    file), relative ones resolved."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod in OURS or (node.level and not node.module):
                # ``from testbed import x``: x may be a sub-module
                out += [(node.lineno, f"{mod}.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, mod))
    return out


def violations(root: Path = ROOT, edited: dict[str, str] | None = None) -> list[str]:
    """Every import that breaks the rules, as ``file:line: room -> module``; ``edited``:
    files (path from ``root``) read as the given text instead of their own."""
    edited = edited or {}
    bad = []
    for pkg in OURS:
        for path in sorted((root / pkg).rglob("*.py")):
            src = room(module_name(path, root))
            assert src is not None
            text = edited.get(str(path.relative_to(root)))
            for line, mod in imported_modules(path, root, text):
                dst = room(mod)
                if dst is not None and dst not in ALLOWED[src]:
                    bad.append(f"{path.relative_to(root)}:{line}: {src} imports {mod} ({dst})")
    return bad


def test_every_import_keeps_the_rules() -> None:
    bad = violations()
    assert not bad, "imports that break the rules of docs/architecture.md:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("file", "line", "room_of_import"),
    [
        ("testbed/core/models.py", "from aggregator.evaluate import evaluate", "aggregator"),
        ("aggregator/decoder.py", "from edge_device.uplink import UplinkEncoder", "edge_device"),
        ("edge_device/trainer.py", "from aggregator.aggregate import average", "aggregator"),
        ("edge_device/trainer.py", "from testbed.runner import run_experiment", "testbed"),
        ("radio/link.py", "from testbed.core.transport.protocol import UploadHeader", "core"),
        ("testbed/core/runs/rundir.py", "    from testbed.api import run", "testbed"),
    ],
)
def test_a_forbidden_import_is_found(file: str, line: str, room_of_import: str) -> None:
    """The check fails on a forbidden import added to a file (also one made inside a
    function)."""
    text = (ROOT / file).read_text()
    if line.startswith(" "):
        text += f"\n\ndef _added() -> None:\n{line}\n"
    else:
        text += f"\n{line}\n"
    found = [v for v in violations(ROOT, {file: text}) if v.startswith(file)]
    assert any(f"({room_of_import})" in v for v in found), found
