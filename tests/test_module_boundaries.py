"""Module boundaries: no private names reached across modules, no import circles between files.

Beside ``tests/test_import_rules.py`` (which rooms may import which), this reads every
``.py`` file of ``testbed/``, ``aggregator/``, ``edge_device/``, ``radio/`` and
``flowgraphs/`` (not ``tests/``: tests may use documented hooks) with ``ast`` and checks:

Private names
    A *private name* begins with ``_`` and is not a dunder (``__version__`` is fine). It is a
    violation to write ``from M import _x`` or, having bound ``M`` by ``import M`` /
    ``import M as m`` / ``from P import M`` (M a module), to read ``M._x``, when ``M`` is
    another module of the project. Imports at any depth count (module level, inside
    functions, under ``TYPE_CHECKING``): a private name is a private name wherever it is
    reached from. Importing a private *module* of another package (``from pkg import
    _mod``) is the same violation.

Import circles
    The graph has one node per file and one edge per import of a project module, at any
    depth (module level and inside functions: a late import dodges the circle at load time
    but the two files still need each other). Imports under ``if TYPE_CHECKING:`` are left
    out: they never run, and annotations are how two collaborators name each other's types
    without a load-order dependency. An edge goes to the file the import names: ``import
    a.b.c`` and ``from a.b import c`` (``c`` a sub-module) go to ``a/b/c.py``; ``from a.b
    import name`` goes to ``a/b/__init__.py``. The package ``__init__`` files Python runs on
    the way (``a/__init__.py``, ``a/b/__init__.py``) are *not* edges, so a package
    ``__init__`` importing its own sub-modules is no circle by itself; it becomes one only if
    such a sub-module imports back from the package ``__init__`` (a name re-exported there),
    which is a real circle and is flagged. Every strongly connected component of more than
    one file is a circle. The ``flowgraphs/`` scripts run with their own directory on
    ``sys.path``, so among themselves they import each other by bare name
    (``from usrp_common import ...``), which is resolved too.

Each test's failure message lists every violation; the self-tests plant a private import and
a circle in a temporary tree to show the checker is not vacuous.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The packages of importable code.
PACKAGES = ("testbed", "aggregator", "edge_device", "radio")
#: Scripts run by the system interpreter with their own directory on ``sys.path``.
SCRIPT_DIRS = ("flowgraphs",)

#: Private names reached across modules that stay for now: ``"file: module._name"``.
ALLOWED_PRIVATE: frozenset[str] = frozenset()
#: Import circles that stay for now, each as the sorted tuple of its files.
ALLOWED_CIRCLES: frozenset[tuple[str, ...]] = frozenset()


def is_private(name: str) -> bool:
    """A leading-underscore name that is not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in SCRIPT_DIRS:
        return parts[-1]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


class Project:
    """The files of the project under ``root`` and their module names."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: list[Path] = []
        for top in (*PACKAGES, *SCRIPT_DIRS):
            if (root / top).is_dir():
                self.files += sorted((root / top).rglob("*.py"))
        #: Dotted module name -> file, for the packages.
        self.modules: dict[str, Path] = {}
        #: Bare script name -> file, for each script directory.
        self.scripts: dict[str, dict[str, Path]] = {}
        for path in self.files:
            top = path.relative_to(root).parts[0]
            if top in SCRIPT_DIRS:
                self.scripts.setdefault(top, {})[path.stem] = path
            else:
                self.modules[_module_name(path, root)] = path

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def resolve(self, importer: Path, module: str) -> Path | None:
        """The project file of dotted ``module`` as imported from ``importer``, or ``None``."""
        top = importer.relative_to(self.root).parts[0]
        if top in SCRIPT_DIRS and module in self.scripts.get(top, {}):
            return self.scripts[top][module]
        return self.modules.get(module)


def _absolute(project: Project, path: Path, node: ast.ImportFrom) -> str:
    """The dotted module of a ``from ... import`` (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    here = _module_name(path, project.root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """``id`` of every node inside an ``if TYPE_CHECKING:`` body."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = (
                test.id
                if isinstance(test, ast.Name)
                else test.attr
                if isinstance(test, ast.Attribute)
                else None
            )
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    inside |= {id(n) for n in ast.walk(stmt)}
    return inside


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name, else ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def scan(
    project: Project, path: Path, text: str | None = None
) -> tuple[list[str], set[Path]]:
    """The private-name violations of one file (``file:line: module._name``) and the
    files it imports (leaving out ``TYPE_CHECKING`` imports)."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    rel = project.rel(path)
    hidden = _type_checking_nodes(tree)
    bad: list[str] = []
    edges: set[Path] = set()
    #: Local name -> dotted name of a project module it is bound to.
    bound: dict[str, str] = {}

    def edge(node: ast.AST, target: Path | None) -> None:
        if target is not None and target != path and id(node) not in hidden:
            edges.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = project.resolve(path, alias.name)
                edge(node, target)
                if alias.asname:
                    if target is not None:
                        bound[alias.asname] = alias.name
                else:
                    # ``import a.b.c`` binds ``a``; reads go through the whole chain.
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(project, path, node)
            owner = project.resolve(path, module)
            for alias in node.names:
                sub = project.resolve(path, f"{module}.{alias.name}") if module else None
                if sub is None and node.level and not node.module:
                    sub = None
                target = sub if sub is not None else owner
                edge(node, target)
                if sub is not None:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
                if target is not None and target != path and is_private(alias.name):
                    bad.append(f"{rel}:{node.lineno}: {module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            chain = _dotted(node.value)
            if chain is None:
                continue
            head, _, tail = chain.partition(".")
            if head not in bound:
                continue
            module = ".".join(filter(None, [bound[head], tail]))
            target = project.resolve(path, module)
            if target is not None and target != path:
                bad.append(f"{rel}:{node.lineno}: {module}.{node.attr}")
    return bad, edges


def check(
    root: Path = ROOT, edited: dict[str, str] | None = None
) -> tuple[list[str], list[tuple[str, ...]]]:
    """Every private name reached across modules and every import circle (each the sorted
    files of one strongly connected component) under ``root``; ``edited``: files (path
    from ``root``) read as the given text instead of their own."""
    edited = edited or {}
    project = Project(root)
    bad: list[str] = []
    graph: dict[str, set[str]] = {}
    for path in project.files:
        rel = project.rel(path)
        if root == ROOT and rel not in edited:  # the code as it is: read once per session
            found, edges = _scan_as_is(rel)
        else:
            found, edges = scan(project, path, edited.get(rel))
        bad += found
        graph[rel] = {project.rel(e) for e in edges}
    return bad, circles(graph)


@functools.cache
def _project_as_is() -> Project:
    return Project(ROOT)


@functools.cache
def _scan_as_is(rel: str) -> tuple[list[str], set[Path]]:
    return scan(_project_as_is(), ROOT / rel)


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[tuple[str, ...]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(tuple(sorted(comp)))
    return sorted(out)


def test_no_private_name_is_reached_across_modules() -> None:
    bad, _ = check()
    left = [v for v in bad if _allow_key(v) not in ALLOWED_PRIVATE]
    assert not left, (
        "private names reached from another module (make them public and documented, or "
        "move them to where they are used):\n" + "\n".join(left)
    )


def test_no_import_circle_between_files() -> None:
    _, found = check()
    left = [c for c in found if c not in ALLOWED_CIRCLES]
    assert not left, "import circles between files:\n" + "\n".join(
        " <-> ".join(c) for c in left
    )


def test_the_allow_lists_hold_only_what_is_still_there() -> None:
    """An allow-list entry that no longer matches anything is taken out."""
    bad, found = check()
    assert ALLOWED_PRIVATE <= {_allow_key(v) for v in bad}
    assert ALLOWED_CIRCLES <= set(found)


def _allow_key(violation: str) -> str:
    """``file:line: module._name`` without the line number, for the allow-list."""
    file, _, rest = violation.partition(":")
    return f"{file}: {rest.partition(': ')[2]}"


def _plant(tmp: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


def test_the_checker_finds_a_planted_private_import(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "radio/__init__.py": "",
            "radio/a.py": "_hidden = 1\nshown = 2\n",
            "radio/b.py": "from radio.a import _hidden, shown\n",
            "radio/c.py": "def f():\n    from . import a\n    return a._hidden\n",
            "radio/d.py": "import radio.a as ra\nimport radio.a\n"
            "x = radio.a._hidden + ra._hidden\n",
            "radio/e.py": "from radio.a import __doc__, shown\nimport os\nx = os._exit\n",
        },
    )
    bad, found = check(root)
    assert sorted(bad) == [
        "radio/b.py:1: radio.a._hidden",
        "radio/c.py:3: radio.a._hidden",
        "radio/d.py:3: radio.a._hidden",
        "radio/d.py:3: radio.a._hidden",
    ]
    assert found == []


def test_the_checker_finds_a_planted_circle(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "radio/__init__.py": "from radio import a\n",
            "radio/a.py": "from radio.b import x\n",
            "radio/b.py": "x = 1\ndef f():\n    from radio import c\n",
            "radio/c.py": "import radio.a\n",
            "radio/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from radio.untyped import T\n",
            "radio/untyped.py": "from radio.typed import U\n",
            "flowgraphs/rx.py": "from common import y\n",
            "flowgraphs/common.py": "import rx\n",
        },
    )
    bad, found = check(root)
    assert bad == []
    # the package __init__ importing its own sub-module is no circle; the TYPE_CHECKING
    # import is no edge; the late import inside f is one.
    assert found == [
        ("flowgraphs/common.py", "flowgraphs/rx.py"),
        ("radio/a.py", "radio/b.py", "radio/c.py"),
    ]
    # a sub-module importing back from its own package's __init__ is a circle
    root = _plant(tmp_path, {"radio/c.py": "from radio import a as _\nfrom radio import y\n"})
    _, found = check(root)
    assert ("radio/__init__.py", "radio/a.py", "radio/b.py", "radio/c.py") in found


def test_a_private_import_or_circle_added_to_the_code_is_found() -> None:
    """Against the real tree: a private import and a late circular import added to a file
    each make the check fail."""
    file = "radio/units.py"
    text = (ROOT / file).read_text()
    private = text + "\n\ndef _added() -> None:\n    from radio.usrp_link import _nothing\n"
    bad, _ = check(ROOT, {file: private})
    assert f"{file}:" in "\n".join(bad)
    circular = text + "\n\ndef _added() -> None:\n    import testbed.core.links\n"
    _, found = check(ROOT, {file: circular})
    assert any(file in c for c in found), found
