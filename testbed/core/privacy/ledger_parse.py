"""Reading ledger lines: the full JSON parse, the hash chain, and a fast path for lines that
share a template.

A ledger line is one event's JSON (sorted keys, no spaces) plus its transmission ``nonce``
and, in a chained ledger (header ``ledger-header/v2``, see :mod:`testbed.core.privacy.ledger`),
the hex sha256 ``prev`` of the line before it, the ``writer`` id of the process that wrote
it and, as its last member, a ``sha256`` *seal*: the hex sha256 of the line's bytes up to
(not including) ``,"sha256":"``. The chain starts at the header (whose seal is the first
event's ``prev``) or, without a header, at :data:`GENESIS`. :class:`LineParser` checks each
line's seal and that its ``prev`` is the seal of the line before: an edited line fails its
seal; a deleted, inserted or reordered line breaks the chain at the next line. Old ledgers
(header ``ledger-header/v1``, or no header and no seal on the first line) have no chain and
are read as before; a chained line in them, or an unchained line in a chained ledger, is an
error.

In a long run most lines differ from another line only in ``round``, ``device``,
``nonce`` and ``prev`` (and the seal): 1,000 devices making the same upload for 1,000 rounds
write 10^6 lines with one *template*. :class:`LineParser` checks the seal of a line (one
sha256 of its bytes), cuts those four values out of the rest (four regex searches), looks
the rest up among the templates it has already parsed in full, and copies that template's
checked event with the line's round and device
(:meth:`~testbed.core.privacy.events.JsonEvent.for_round_and_device`); the lines after such a
line that have its template's exact bytes around their values are read by byte comparisons
(:mod:`~testbed.core.privacy.ledger_shape`). A line whose template is new, whose seal or
``prev`` does not check, or whose values cannot be cut out cleanly, goes through the full
parse, which is the one and only place that reports corruption (:class:`LedgerError`,
naming the line).

Why the fast path reads exactly what the full parse reads: a value is cut out only when its
key is immediately preceded by ``{`` or ``,`` (so its quote is a delimiter, not an escaped
quote inside a string) and the value is a complete token followed by ``,`` or ``}``: a
JSON integer ``0|[1-9][0-9]*`` (round, device) or a string of ASCII letters and digits
(nonce, prev). Replacing such a token by another token of the same kind (``0``, ``""``)
changes neither whether the line is valid JSON nor its structure, only that leaf. The
template is then accepted only if it parses to one flat object (no nested objects or
arrays) with no repeated key, so the key at the cut position is the object's only key of
that name and the line's value is the one cut out; the template's other fields, its event
type and its event checks are those of the full parse of the template, which are the full
parse's of the line. A sealed line is read through its body ``B`` (the bytes before the
seal) as ``B + "}"``: when that is one flat object without a ``sha256`` key, the line is
that object plus the one member ``sha256``, whose value the fast path has just checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from testbed.core.privacy.event_types import PrivacyEvent
from testbed.core.privacy.events import EventError
from testbed.core.privacy.ledger_shape import SEAL_HEAD, Shape, Shapes
from testbed.core.privacy.ledger_shape import gc_paused as gc_paused  # re-exported
from testbed.core.privacy.ledger_shape import seal as seal  # re-exported

#: The four values cut out of a line: a JSON integer (no sign, no leading zero) or a string
#: of ASCII letters and digits (lower-case hex for ``prev``), each ending where the value ends.
_ROUND = re.compile(rb'"round":(0|[1-9][0-9]*)(?=[,}])')
_DEVICE = re.compile(rb'"device":(0|[1-9][0-9]*)(?=[,}])')
_NONCE = re.compile(rb'"nonce":"([0-9A-Za-z]+)"(?=[,}])')
_PREV = re.compile(rb'"prev":"([0-9a-f]{64})"(?=[,}])')
_KEY_BEFORE = (0x7B, 0x2C)  # '{' and ','
_ROUND_BIT, _DEVICE_BIT, _NONCE_BIT, _PREV_BIT = 1, 2, 4, 8
_ALL_BITS = _ROUND_BIT | _DEVICE_BIT | _NONCE_BIT | _PREV_BIT
_LEGACY_BITS = _ROUND_BIT | _DEVICE_BIT | _NONCE_BIT

#: The seal that ends a chained line (``SEAL_HEAD``, 64 hex digits, ``"}``) and the newline.
SEAL_LEN = len(SEAL_HEAD) + 64 + 3
_SEAL = re.compile(rb',"sha256":"([0-9a-f]{64})"\}\n\Z')
#: ``prev`` of the first line of a chained ledger without a header.
GENESIS = "0" * 64
#: Header types of ledgers without a hash chain (readable, never continued).
LEGACY_HEADER_TYPES = ("ledger-header/v1",)
#: Fields a chained line carries besides its event.
CHAIN_FIELDS = ("prev", "writer", "sha256")


class LedgerEntry(NamedTuple):
    """One line of the ledger: the event and the nonce of its transmission (or ``None``).

    Immutable (a named tuple: a million of them are built on resume)."""

    event: PrivacyEvent
    nonce: str | None


class LedgerError(RuntimeError):
    """The ledger file is corrupt (a complete line does not parse or breaks the hash chain),
    written by another process, or unusable."""


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as its list of ``(key, value)`` pairs (keeps repeated keys)."""


class _Template:
    """A template's checked event (and its nonce when the template keeps one), and, once a
    line was read through it in the chained layout, that line's
    :class:`~testbed.core.privacy.ledger_shape.Shape`."""

    __slots__ = ("event", "nonce", "shape")

    def __init__(self, event: PrivacyEvent, nonce: str | None) -> None:
        self.event = event
        self.nonce = nonce
        self.shape: Shape | None = None


def _after_key_boundary(raw: bytes, match: re.Match[bytes]) -> bool:
    """Whether the key ``match`` starts with follows ``{`` or ``,`` (then its opening quote
    is a delimiter, not an escaped quote inside a string)."""
    at = match.start()
    return at > 0 and raw[at - 1] in _KEY_BEFORE


class LineParser:
    """Parses ledger lines in order; one instance per pass over a file.

    Parameters
    ----------
    path
        The ledger (for error messages).
    event_types
        Event classes by JSON ``type`` tag.
    header_type
        The type tag of the chained header line (:data:`LEGACY_HEADER_TYPES` are read too).
    templates
        Read lines through templates (default); ``False``: the full parse of every line
        (the reference for tests and benchmarks).

    Attributes
    ----------
    header, header_type, header_writer
        The header line's values (without ``type`` and ``writer``), type tag and writer
        (``None`` without a header).
    chained
        Whether the lines carry the hash chain (``None`` until a line was read).
    lines, last_line, tail
        Lines read so far (header included), the last one's bytes, and the ``prev`` the
        next line must carry (the last seal, or :data:`GENESIS`).
    """

    def __init__(self, path: Path, event_types: Mapping[str, type[PrivacyEvent]],
                 header_type: str, *, templates: bool = True) -> None:
        self._path = path
        self._types = event_types
        self._header_type = header_type
        self._use_templates = templates
        self._templates: dict[tuple[int, bytes], _Template | None] = {}
        self._cut_prev: bytes | None = None
        self._shapes = Shapes(LedgerEntry)  # of the chained lines read so far
        self._cut_shape: tuple[_Template, tuple[bytes, bytes, bytes, bytes, bytes]] | None = None
        self.header: dict[str, Any] | None = None
        self.header_type: str | None = None
        self.header_writer: str | None = None
        self.chained: bool | None = None
        self.lines = 0
        self.last_line: bytes | None = None
        self.tail = GENESIS.encode("ascii")
        self.fast_lines = 0  # lines read through a template (for tests and benchmarks)

    def resume_after(self, *, chained: bool, lines: int, last_line: bytes | None,
                     tail: bytes) -> None:
        """Continue a chain read earlier (its state), for reading only the lines after it."""
        self.chained, self.lines, self.last_line, self.tail = chained, lines, last_line, tail

    def parse(self, data: bytes, *, seals_known: int = 0) -> list[LedgerEntry]:
        """Every entry of a ledger's bytes, in order; the header is kept in :attr:`header`.

        Lines are numbered from 1 over the non-empty lines; a last line without a newline
        (torn by a crash) is not read: the caller deals with it. Raises
        :class:`LedgerError` naming the first bad line. ``seals_known``: lines (numbered so)
        whose seals the caller checks otherwise; those read through a shape skip their
        sha256 (:mod:`~testbed.core.privacy.ledger_verified`).
        """
        entries: list[LedgerEntry] = []
        append = entries.append
        number = self.lines
        last = self.last_line
        shape: Shape | None = None
        lines = iter(io.BytesIO(data))
        with gc_paused():
            raw = next(lines, None)
            while raw is not None:
                if raw[-1:] != b"\n":
                    break  # the torn last line
                if raw == b"\n":
                    raw = next(lines, None)
                    continue
                if self._use_templates and self.chained:
                    if shape is None or not raw.startswith(shape.prefix):
                        shape = self._shapes.of(raw, self.tail)
                    if shape is not None:
                        count, self.tail, read_last, raw = self._shapes.read_run(
                            shape, raw, lines, self.tail, entries.extend,
                            known=seals_known - number)
                        if count:
                            number += count
                            self.fast_lines += count
                            last = read_last
                            continue
                        shape = None
                        assert raw is not None
                number += 1
                entry = None
                if self._use_templates:
                    if self.chained:
                        entry = self._fast_sealed(raw)
                    elif self.chained is False:
                        entry = self._fast(raw)
                    elif raw[-SEAL_LEN:-67] != SEAL_HEAD:  # an unsealed first line
                        self.chained = False
                        entry = self._fast(raw)
                        if entry is None:
                            self.chained = None  # the full parse decides
                if entry is None:
                    entry = self._full(number, raw)
                else:
                    self.fast_lines += 1
                last = raw
                if entry is not None:  # None: the header
                    append(entry)
                raw = next(lines, None)
        self.lines, self.last_line = number, last
        return entries

    def _fast_sealed(self, raw: bytes) -> LedgerEntry | None:
        """:meth:`_fast` for a chained line: its seal and ``prev`` checked, then its body."""
        if raw[-SEAL_LEN:-67] != SEAL_HEAD or raw[-3:] != b'"}\n':
            return None
        body = raw[:-SEAL_LEN]
        digest = raw[-67:-3]
        if hashlib.sha256(body).hexdigest().encode("ascii") != digest:
            return None
        self._cut_prev = None
        self._cut_shape = None
        line = body + b"}\n"
        entry = self._fast_chained_layout(line)
        if entry is None:
            entry = self._fast(line)
        if entry is None or self._cut_prev != self.tail:
            return None
        self.tail = digest
        if self._cut_shape is not None:
            template, pieces = self._cut_shape
            if template.shape is None:
                template.shape = self._shapes.add(pieces, template.event)
        return entry

    def _fast_chained_layout(self, raw: bytes) -> LedgerEntry | None:
        """:meth:`_fast` for the layout :meth:`Ledger.append` writes (sorted keys: device,
        nonce, prev, round), each value searched after the one before it."""
        device_match = _DEVICE.search(raw)
        if device_match is None:
            return None
        d0, d1 = device_match.span(1)
        nonce_match = _NONCE.search(raw, d1)
        if nonce_match is None:
            return None
        n0, n1 = nonce_match.span(1)
        prev_match = _PREV.search(raw, n1)
        if prev_match is None:
            return None
        p0, p1 = prev_match.span(1)
        round_match = _ROUND.search(raw, p1)
        if round_match is None:
            return None
        r0, r1 = round_match.span(1)
        # keys follow '{' or ',' (see _after_key_boundary)
        if not (d0 > 9 and raw[d0 - 10] in _KEY_BEFORE and raw[n0 - 10] in _KEY_BEFORE
                and raw[p0 - 9] in _KEY_BEFORE and raw[r0 - 9] in _KEY_BEFORE):
            return None
        self._cut_prev = raw[p0:p1]
        pieces = (raw[:d0], raw[d1:n0], raw[n1:p0], raw[p1:r0], raw[r1:-2])
        body = b"".join((pieces[0], b"0", pieces[1], pieces[2], pieces[3], b"0", raw[r1:]))
        entry = self._from_template(_ALL_BITS, body, raw, (r0, r1), (d0, d1), (n0, n1))
        if entry is not None:
            template = self._templates[(_ALL_BITS, body)]
            if template is not None and template.shape is None:
                self._cut_shape = (template, pieces)
        return entry

    def _from_template(self, bits: int, body: bytes, raw: bytes, rnd: tuple[int, int],
                       dev: tuple[int, int], nonce: tuple[int, int]) -> LedgerEntry | None:
        """The entry of ``raw`` read through the template of its ``body`` (the line with
        the values of ``bits`` replaced by placeholders), made on first sight; ``None``
        when that template cannot be used (the full parse decides)."""
        key = (bits, body)
        try:
            template = self._templates[key]
        except KeyError:
            template = self._templates[key] = self._template(bits, body)
        if template is None:
            return None
        return LedgerEntry(
            template.event.for_round_and_device(int(raw[rnd[0]:rnd[1]]),
                                                int(raw[dev[0]:dev[1]])),
            raw[nonce[0]:nonce[1]].decode("ascii"),
        )

    def _fast(self, raw: bytes) -> LedgerEntry | None:
        round_match = _ROUND.search(raw)
        device_match = _DEVICE.search(raw)
        nonce_match = _NONCE.search(raw)
        prev_match = _PREV.search(raw)
        if (round_match is not None and device_match is not None and nonce_match is not None
                and prev_match is not None):
            # the layout Ledger.append writes (sorted keys): device, nonce, prev, round
            d0, d1 = device_match.span(1)
            n0, n1 = nonce_match.span(1)
            p0, p1 = prev_match.span(1)
            r0, r1 = round_match.span(1)
            # keys follow '{' or ',' (see _after_key_boundary); d0 - 10 is where the key's
            # quote is (len('"device":') == 9), n0 - 10, p0 - 9 and r0 - 9 likewise
            if (d1 < n0 and n1 < p0 and p1 < r0 and d0 > 9 and raw[d0 - 10] in _KEY_BEFORE
                    and raw[n0 - 10] in _KEY_BEFORE and raw[p0 - 9] in _KEY_BEFORE
                    and raw[r0 - 9] in _KEY_BEFORE):
                self._cut_prev = raw[p0:p1]
                return self._from_template(
                    _ALL_BITS, b"".join((raw[:d0], b"0", raw[d1:n0], raw[n1:p0], raw[p1:r0],
                                         b"0", raw[r1:])), raw, (r0, r1), (d0, d1), (n0, n1))
        if round_match is not None and device_match is not None and nonce_match is not None:
            # an unchained line (a ledger from before the chain): device, nonce, round
            d0, d1 = device_match.span(1)
            n0, n1 = nonce_match.span(1)
            r0, r1 = round_match.span(1)
            if (prev_match is None and d1 < n0 and n1 < r0 and d0 > 9
                    and raw[d0 - 10] in _KEY_BEFORE and raw[n0 - 10] in _KEY_BEFORE
                    and raw[r0 - 9] in _KEY_BEFORE):
                return self._from_template(
                    _LEGACY_BITS, b"".join((raw[:d0], b"0", raw[d1:n0], raw[n1:r0], b"0",
                                            raw[r1:])), raw, (r0, r1), (d0, d1), (n0, n1))
        return self._fast_any_layout(raw, round_match, device_match, nonce_match, prev_match)

    def _fast_any_layout(self, raw: bytes, round_match: re.Match[bytes] | None,
                         device_match: re.Match[bytes] | None,
                         nonce_match: re.Match[bytes] | None,
                         prev_match: re.Match[bytes] | None) -> LedgerEntry | None:
        """:meth:`_fast` for lines in another key order or without some of the values."""
        spans = []  # (start, end, placeholder)
        mask = 0
        found: dict[str, tuple[int, int]] = {}
        for name, match, bit, placeholder in (("round", round_match, _ROUND_BIT, b"0"),
                                              ("device", device_match, _DEVICE_BIT, b"0"),
                                              ("nonce", nonce_match, _NONCE_BIT, b""),
                                              ("prev", prev_match, _PREV_BIT, b"")):
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
        self._cut_prev = values.get("prev")
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
        expected = {"round": (_ROUND_BIT, 0), "device": (_DEVICE_BIT, 0),
                    "nonce": (_NONCE_BIT, ""), "prev": (_PREV_BIT, "")}
        for name, (bit, placeholder) in expected.items():
            if mask & bit and (name not in data or type(data[name]) is not type(placeholder)
                               or data[name] != placeholder):
                return None
        if "sha256" in data or bool(mask & _PREV_BIT) != bool(self.chained):
            return None  # a chained line cuts out its prev; an old one has none
        if self.chained:
            del data["prev"]
            if not isinstance(data.pop("writer", None), str):
                return None
        kind = data.get("type")
        cls = self._types.get(kind) if isinstance(kind, str) else None
        if cls is None or kind == self._header_type or "writer" in data:
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
        except (EventError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LedgerError(f"{self._path}: line {number} is not a valid event: {exc}") from exc
        kind = data.get("type")
        if self.chained is None:  # the first line decides
            self.chained = kind == self._header_type or (
                kind not in LEGACY_HEADER_TYPES and "sha256" in data)
        digest = self._check_chain(number, raw, data) if self.chained else None
        try:
            if not self.chained and any(k in data for k in CHAIN_FIELDS):
                raise EventError(
                    "it carries hash-chain fields, but the ledger's first line does not "
                    "(a line of another ledger format)")
            if kind == self._header_type or kind in LEGACY_HEADER_TYPES:
                if number != 1:
                    raise EventError("a header is only allowed on the first line")
                self.header_type = kind
                self.header_writer = data.get("writer")
                self.header = {k: v for k, v in data.items() if k not in ("type", "writer")}
                entry = None
            else:
                data.pop("writer", None)  # checked with the chain
                cls = self._types.get(kind) if isinstance(kind, str) else None
                if cls is None:
                    raise EventError(f"unknown event type {kind!r}; known: {sorted(self._types)}")
                nonce = data.pop("nonce", None)
                if nonce is not None and not isinstance(nonce, str):
                    raise EventError(f"nonce={nonce!r} must be a string")
                entry = LedgerEntry(cls.from_dict(data), nonce)
        except EventError as exc:
            raise LedgerError(f"{self._path}: line {number} is not a valid event: {exc}") from exc
        if digest is not None:
            self.tail = digest
        return entry

    def _check_chain(self, number: int, raw: bytes, data: dict[str, Any]) -> bytes:
        """Check a chained line's seal and ``prev`` (removing the chain fields from ``data``);
        returns its seal, the next line's ``prev``."""
        where = f"{self._path}: line {number}"
        match = _SEAL.search(raw)
        if match is None or data.pop("sha256", None) != match.group(1).decode("ascii"):
            raise LedgerError(
                f"{where} has no sha256 seal at its end, which every line of a chained ledger "
                "carries: it was not written by Ledger.append, or it was edited")
        digest = match.group(1)
        if hashlib.sha256(raw[:match.start()]).hexdigest().encode("ascii") != digest:
            raise LedgerError(
                f"{where} was changed after it was written: its content no longer hashes to "
                "its sha256 seal (an edited value?)")
        writer = data.get("writer")
        if not isinstance(writer, str) or not writer:
            raise LedgerError(f"{where} names no writer (its 'writer' id is missing)")
        if data.get("type") == self._header_type:
            if "prev" in data:
                raise LedgerError(f"{where}: a header starts the chain; it has no 'prev'")
            return digest
        prev = data.pop("prev", None)
        if not isinstance(prev, str) or prev.encode("ascii", "replace") != self.tail:
            if number == 1:
                raise LedgerError(
                    f"{where} does not start the hash chain (its prev should be {GENESIS[:12]}..."
                    f", got {str(prev)[:12]}...): lines were deleted from the start")
            raise LedgerError(
                f"{where} does not follow line {number - 1} in the hash chain (its prev is "
                f"{str(prev)[:12]}..., line {number - 1}'s seal is "
                f"{self.tail[:12].decode('ascii')}...): a line was deleted, inserted or "
                f"reordered just before line {number}")
        return digest
