"""The one way the project reads YAML: bounded, strict, and with readable errors.

Every YAML file the testbed reads (experiment and hardware configs, solver scenario files,
plan files, calibration files) and every ``--set`` / ``--hw-set`` value goes through
:func:`read_yaml_mapping` or :func:`parse_yaml_text`. Compared with ``yaml.safe_load``:

* a file larger than :data:`MAX_YAML_BYTES` (1 MiB) is refused before it is parsed;
* anchors and aliases (``&a`` / ``*a``) are refused: a 390-byte "billion laughs" document
  would otherwise expand to gigabytes, and config files never need them;
* nesting deeper than :data:`MAX_YAML_DEPTH` is refused (no ``RecursionError``);
* a key repeated in one mapping is refused, naming the key and both lines (PyYAML keeps
  the last one silently);
* a file that is not UTF-8 text, or holds NUL bytes, is refused as binary;
* ``1e-5``, ``1e12`` and ``915.0e6`` are numbers, as in YAML 1.2 (PyYAML's YAML 1.1
  rules read them as strings, which strict number keys would then refuse);
* ``!!binary``, ``!!set``, ``!!omap`` and ``!!pairs`` are refused (configs hold plain
  scalars, lists and mappings); an unquoted date stays the string it was written as;
* errors are :class:`YamlError` (a ``ValueError``) with one short message; a value echoed
  in any message is cut to :data:`MAX_ECHO_CHARS` characters by :func:`short_repr`.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

from testbed.core.config.errors import ConfigError

#: Largest YAML file read (bytes). Real configs and plans are a few kilobytes.
MAX_YAML_BYTES = 1 << 20
#: Deepest nesting of lists / mappings accepted.
MAX_YAML_DEPTH = 64
#: Longest echo of a user value inside an error message (characters).
MAX_ECHO_CHARS = 200


class YamlError(ConfigError):
    """A YAML file or value was refused; the message names the file and the reason."""


def short_repr(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters, saying how long it was.

    Parameters
    ----------
    value
        Anything; very large containers are cut without building their whole repr when
        they are lists, tuples or mappings of more than ``limit`` items.
    limit
        Characters kept.
    """
    if isinstance(value, list | tuple | dict) and len(value) > limit:
        head = list(value.items())[:limit] if isinstance(value, dict) else list(value[:limit])
        text = repr(head)
        return f"{text[:limit]}... ({type(value).__name__} of {len(value)} items)"
    if isinstance(value, str) and len(value) > 10 * limit:
        # Do not build the repr of a megabyte string only to cut it.
        return f"{repr(value[:limit])[:limit]}... ({len(value)} characters)"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def short_text(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to about ``limit`` characters (for messages from other libraries)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without anchors/aliases, duplicate keys or exotic tags, depth-bounded."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise ConstructorError(
                None, None,
                f"alias '*{event.anchor}' refused: anchors and aliases are not allowed "
                "in testbed YAML (write the value out)",
                event.start_mark,
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise ConstructorError(
                None, None,
                f"anchor '&{short_text(anchor, 40)}' refused: anchors and aliases are not "
                "allowed in testbed YAML (write the value out)",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise ConstructorError(
                    None, None, f"nesting deeper than {MAX_YAML_DEPTH} levels refused",
                    event.start_mark,
                )
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: SafeLoader reports it with its own message
                if first is not None:
                    raise ConstructorError(
                        "while reading a mapping", node.start_mark,
                        f"duplicate key {short_repr(key, 80)} (first given on line "
                        f"{first.start_mark.line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def _refuse_tag(self, node: Node) -> Any:
        raise ConstructorError(
            None, None,
            f"tag '{node.tag}' refused: use plain values, lists and mappings",
            node.start_mark,
        )

    def _timestamp_as_text(self, node: Node) -> Any:
        return self.construct_scalar(node)  # type: ignore[arg-type]


for _tag in ("binary", "set", "omap", "pairs"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _StrictLoader._refuse_tag)
_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _StrictLoader._timestamp_as_text)
# YAML 1.2 floats that YAML 1.1 misses: an exponent without a dot or without a sign.
_YAML12_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?)$""",
    re.X,
)
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes strings the loader above would read as numbers (``"1e5"``)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # never write anchors: the loader refuses them


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))


def dump_yaml_text(data: Any) -> str:
    """YAML text that :func:`parse_yaml_text` reads back to ``data`` (no anchors, keys in order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def _yaml_problem(exc: BaseException) -> str:
    """One line from a PyYAML (or conversion) error, with its line and column."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = exc.problem or exc.context or "invalid YAML"
        return f"{short_text(problem)}{where}"
    if isinstance(exc, RecursionError):
        return f"nesting too deep (more than {MAX_YAML_DEPTH} levels)"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return "an integer with more than 4300 digits"
    return short_text(str(exc)) or type(exc).__name__


def parse_yaml_text(text: str, source: str) -> Any:
    """Parse one YAML document with the strict rules of this module.

    Parameters
    ----------
    text
        The document.
    source
        How to name it in errors, e.g. ``"config file 'exp.yaml'"`` or ``"--set 'a=b'"``.

    Raises
    ------
    YamlError
        ``"<source> is not valid YAML: <problem> (line L, column C)"``.
    """
    if "\x00" in text:
        raise YamlError(f"{source} holds NUL bytes: a binary file, not YAML text")
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except (yaml.YAMLError, ValueError, RecursionError, OverflowError) as exc:
        # ValueError: e.g. an integer longer than Python's 4300-digit conversion limit.
        raise YamlError(f"{source} is not valid YAML: {_yaml_problem(exc)}") from None


def read_yaml_mapping(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping (an empty file gives ``{}``).

    Parameters
    ----------
    path
        The file.
    what
        How to name the file in errors: ``"config file"``, ``"hardware config file"``,
        ``"scenario file"``, ``"plan file"``, ``"calibration file"``.

    Raises
    ------
    YamlError
        When the file is missing, not a regular file, larger than :data:`MAX_YAML_BYTES`,
        not UTF-8 text, not valid YAML under the rules above, or not a mapping.
    """
    p = Path(path)
    source = f"{what} '{short_text(str(p), 300)}'"
    try:
        st = p.stat()
    except FileNotFoundError:
        raise YamlError(f"{source} does not exist") from None
    except OSError as exc:
        raise YamlError(f"{source} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise YamlError(f"{source} is a directory, not a YAML file")
    if not stat.S_ISREG(st.st_mode):
        raise YamlError(f"{source} is not a regular file")
    if st.st_size > MAX_YAML_BYTES:
        raise YamlError(
            f"{source} is {st.st_size} bytes; allowed: at most {MAX_YAML_BYTES} bytes (1 MiB)"
        )
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise YamlError(f"{source} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_YAML_BYTES:  # grew since stat
        raise YamlError(f"{source} is over {MAX_YAML_BYTES} bytes (1 MiB); allowed: at most that")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YamlError(
            f"{source} is not UTF-8 text (byte {exc.start}): a binary file, not YAML"
        ) from None
    data = parse_yaml_text(text, source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YamlError(
            f"{source} must hold a mapping (key: value lines) at the top level, "
            f"got {type(data).__name__}"
        )
    return data
