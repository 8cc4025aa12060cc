"""Reading ledger lines: the full JSON parse, and a fast path for lines that share a template.

A ledger line is one event's JSON (sorted keys, no spaces) plus its transmission ``nonce``.
In a long run most lines differ from another line only in ``round``, ``device`` and
``nonce``: 1,000 devices making the same upload for 1,000 rounds write 10^6 lines with one
*template*. :class:`LineParser` cuts those three values out of a line (three regex
searches), looks the rest up among the templates it has already parsed in full, and copies
that template's checked event with the line's round and device
(:meth:`~aggregator.privacy.events.JsonEvent.for_round_and_device`). A line whose template is
new, or whose values cannot be cut out cleanly, goes through the full parse, which is the
one and only place that reports corruption (:class:`LedgerError`, naming the line).

Why the fast path reads exactly what the full parse reads: a value is cut out only when its
key is immediately preceded by ``{`` or ``,`` (so its quote is a delimiter, not an escaped
quote inside a string) and the value is a complete token followed by ``,`` or ``}``: a
JSON integer ``0|[1-9][0-9]*`` (round, device) or a string of ASCII letters and digits
(nonce). Replacing such a token by another token of the same kind (``0``, ``""``) changes
neither whether the line is valid JSON nor its structure, only that leaf. The template is
then accepted only if it parses to one flat object (no nested objects or arrays) with no
repeated key, so the key at the cut position is the object's only key of that name and the
line's value is the one cut out; the template's other fields, its event type and its event
checks are those of the full parse of the template, which are the full parse's of the line.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from aggregator.privacy.events import EventError

#: The three values cut out of a line: a JSON integer (no sign, no leading zero) or a string
#: of ASCII letters and digits, each ending where the value ends.
_ROUND = re.compile(rb'"round":(0|[1-9][0-9]*)(?=[,}])')
_DEVICE = re.compile(rb'"device":(0|[1-9][0-9]*)(?=[,}])')
_NONCE = re.compile(rb'"nonce":"([0-9A-Za-z]+)"(?=[,}])')
_KEY_BEFORE = (0x7B, 0x2C)  # '{' and ','
_ROUND_BIT, _DEVICE_BIT, _NONCE_BIT = 1, 2, 4
_ALL_BITS = _ROUND_BIT | _DEVICE_BIT | _NONCE_BIT


class LedgerEntry(NamedTuple):
    """One line of the ledger: the event and the nonce of its transmission (or ``None``).

    Immutable (a named tuple: a million of them are built on resume)."""

    event: Any
    nonce: str | None


class LedgerError(RuntimeError):
    """The ledger file is corrupt (a complete line does not parse) or unusable."""


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as its list of ``(key, value)`` pairs (keeps repeated keys)."""


@dataclass(frozen=True)
class _Template:
    event: Any
    nonce: str | None


def _after_key_boundary(raw: bytes, match: re.Match[bytes]) -> bool:
    """Whether the key ``match`` starts with follows ``{`` or ``,`` (then its opening quote
    is a delimiter, not an escaped quote inside a string)."""
    at = match.start()
    return at > 0 and raw[at - 1] in _KEY_BEFORE


def _no_template(raw: bytes) -> None:
    return None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a long ledger is read (restored after).

    Reading builds millions of long-lived, acyclic objects; each automatic collection of
    the oldest generation would walk all of them again (about a third of the read time).
    Nothing read here forms a cycle, so reference counting frees what is dropped.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class LineParser:
    """Parses ledger lines in order; one instance per pass over a file.

    Parameters
    ----------
    path
        The ledger (for error messages).
    event_types
        Event classes by JSON ``type`` tag.
    header_type
        The type tag of the optional header line.
    templates
        Read lines through templates (default); ``False``: the full parse of every line
        (the reference for tests and benchmarks).
    """

    def __init__(self, path: Path, event_types: Mapping[str, Any], header_type: str, *,
                 templates: bool = True) -> None:
        self._path = path
        self._types = event_types
        self._header_type = header_type
        self._use_templates = templates
        self._templates: dict[tuple[int, bytes], _Template | None] = {}
        self.header: dict[str, Any] | None = None
        self.fast_lines = 0  # lines read through a template (for tests and benchmarks)

    def parse(self, data: bytes) -> list[LedgerEntry]:
        """Every entry of a ledger's bytes, in order; the header is kept in :attr:`header`.

        Lines are numbered from 1 over the non-empty lines; a last line without a newline
        (torn by a crash) is not read: the caller deals with it. Raises
        :class:`LedgerError` naming the first bad line.
        """
        entries: list[LedgerEntry] = []
        append = entries.append
        fast = self._fast if self._use_templates else _no_template
        number = 0
        with gc_paused():
            for raw in io.BytesIO(data):
                if raw[-1:] != b"\n":
                    break  # the torn last line
                if raw == b"\n":
                    continue
                number += 1
                entry = fast(raw)
                if entry is None:
                    entry = self._full(number, raw)
                    if entry is None:
                        continue  # the header
                else:
                    self.fast_lines += 1
                append(entry)
        return entries

    def _fast(self, raw: bytes) -> LedgerEntry | None:
        round_match = _ROUND.search(raw)
        device_match = _DEVICE.search(raw)
        nonce_match = _NONCE.search(raw)
        if round_match is not None and device_match is not None and nonce_match is not None:
            # the layout Ledger.append writes (sorted keys): device, nonce, round
            d0, d1 = device_match.span(1)
            n0, n1 = nonce_match.span(1)
            r0, r1 = round_match.span(1)
            # keys follow '{' or ',' (see _after_key_boundary); d0 - 10 is where the key's
            # quote is (len('"device":') == 9), n0 - 10 and r0 - 9 likewise
            if (d1 < n0 and n1 < r0 and d0 > 9 and raw[d0 - 10] in _KEY_BEFORE
                    and raw[n0 - 10] in _KEY_BEFORE and raw[r0 - 9] in _KEY_BEFORE):
                key = (_ALL_BITS, b"".join((raw[:d0], b"0", raw[d1:n0], raw[n1:r0], b"0",
                                            raw[r1:])))
                try:
                    template = self._templates[key]
                except KeyError:
                    template = self._templates[key] = self._template(_ALL_BITS, key[1])
                if template is None:
                    return None
                return LedgerEntry(
                    template.event.for_round_and_device(int(raw[r0:r1]), int(raw[d0:d1])),
                    raw[n0:n1].decode("ascii"),
                )
        return self._fast_any_layout(raw, round_match, device_match, nonce_match)

    def _fast_any_layout(self, raw: bytes, round_match: re.Match[bytes] | None,
                         device_match: re.Match[bytes] | None,
                         nonce_match: re.Match[bytes] | None) -> LedgerEntry | None:
        """:meth:`_fast` for lines in another key order or without some of the values."""
        spans = []  # (start, end, placeholder)
        mask = 0
        found: dict[str, tuple[int, int]] = {}
        for name, match, bit, placeholder in (("round", round_match, _ROUND_BIT, b"0"),
                                              ("device", device_match, _DEVICE_BIT, b"0"),
                                              ("nonce", nonce_match, _NONCE_BIT, b"")):
            if match is not None and _after_key_boundary(raw, match):
                found[name] = match.span(1)
                spans.append((*found[name], placeholder))
                mask |= bit
        if not spans:
            return None
        spans.sort()
        pieces = []
        last = 0
        for start, end, placeholder in spans:
            pieces.append(raw[last:start])
            pieces.append(placeholder)
            last = end
        pieces.append(raw[last:])
        key = (mask, b"".join(pieces))
        try:
            template = self._templates[key]
        except KeyError:
            template = self._templates[key] = self._template(mask, key[1])
        if template is None:
            return None
        event = template.event
        values = {name: raw[start:end] for name, (start, end) in found.items()}
        return LedgerEntry(
            event.for_round_and_device(
                int(values["round"]) if "round" in values else event.round,
                int(values["device"]) if "device" in values else event.device,
            ),
            values["nonce"].decode("ascii") if "nonce" in values else template.nonce,
        )

    def _template(self, mask: int, template: bytes) -> _Template | None:
        """The checked event of a template, or ``None`` (then the line is parsed in full)."""
        try:
            pairs = json.loads(template.decode("utf-8"), object_pairs_hook=_Pairs)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(pairs, _Pairs):
            return None
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys) or any(isinstance(v, list) for _, v in pairs):
            return None
        data = dict(pairs)
        expected = {"round": (_ROUND_BIT, 0), "device": (_DEVICE_BIT, 0), "nonce": (_NONCE_BIT, "")}
        for name, (bit, placeholder) in expected.items():
            if mask & bit and (name not in data or type(data[name]) is not type(placeholder)
                               or data[name] != placeholder):
                return None
        kind = data.get("type")
        cls = self._types.get(kind) if isinstance(kind, str) else None
        if cls is None or kind == self._header_type:
            return None
        nonce = data.pop("nonce", None)
        if nonce is not None and not isinstance(nonce, str):
            return None
        try:
            event = cls.from_dict(data)
        except EventError:
            return None
        return _Template(event, None if mask & _NONCE_BIT else nonce)

    def _full(self, number: int, raw: bytes) -> LedgerEntry | None:
        """The full parse of one line: the only place that reports a bad line."""
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict):
                raise EventError(f"expected a JSON object, got {type(data).__name__}")
            kind = data.get("type")
            if kind == self._header_type:
                if number != 1:
                    raise EventError("a header is only allowed on the first line")
                self.header = {k: v for k, v in data.items() if k != "type"}
                return None
            cls = self._types.get(kind)  # type: ignore[arg-type]
            if cls is None:
                raise EventError(f"unknown event type {kind!r}; known: {sorted(self._types)}")
            nonce = data.pop("nonce", None)
            if nonce is not None and not isinstance(nonce, str):
                raise EventError(f"nonce={nonce!r} must be a string")
            return LedgerEntry(cls.from_dict(data), nonce)
        except (EventError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LedgerError(f"{self._path}: line {number} is not a valid event: {exc}") from exc
