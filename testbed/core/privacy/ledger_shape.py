"""Reading runs of chained ledger lines by their *shape*: byte comparisons instead of regex
searches, for the lines of a template the parser has already read (a replay of 10^6 lines).

A chained line that :class:`~testbed.core.privacy.ledger_parse.LineParser` read through a
template in the layout :meth:`~testbed.core.privacy.ledger.Ledger.append` writes is, byte for
byte, ``P0 device P1 nonce P2 prev P3 round P4`` followed by its seal ``,"sha256":"<64 hex>"}``
and the newline, where ``P0 .. P4`` are the template's bytes around the four values the
parser cut out (``P4`` may be empty). That is the line's :class:`Shape`.
:meth:`Shapes.read_run` reads the lines that follow while they have the same shape: for
each it finds the four values (the device's digits end at the comma that starts ``P1``, the
nonce at the quote that starts ``P2``, the round's digits at the next comma), and accepts
the line only when

* the line is *exactly* ``P0 device P1 nonce P2 tail P3 round P4 SEAL`` rebuilt from these
  values, the chain's tail as its ``prev`` (so ``prev`` is the previous line's seal) and its
  own seal (a ``bytes`` comparison of the whole line);
* ``device`` and ``round`` are JSON integers ``0|[1-9][0-9]*`` and ``nonce`` is
  ``[0-9A-Za-z]+``, the tokens the parser's fast path cuts out;
* the seal is the sha256 of the line's bytes before ``,"sha256":"``.

Why that reads exactly what the full parse reads: the template was accepted by the parser
(one flat JSON object, no repeated key, its four values complete tokens right after their
keys, each key after ``{`` or ``,``: see :mod:`~testbed.core.privacy.ledger_parse`). A line
of its shape is the template's line with those four tokens replaced by tokens of the same
kinds, which changes neither whether it is valid JSON nor its structure, only those leaves;
so it is the template's event with this round and device, under this nonce, chained to the
tail and sealed. Any other line (another template, a line that does not check) ends the run
and goes through the parser's usual path, which alone reports corruption.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from typing import Any

#: The seal that ends a chained line: ``,"sha256":"<64 hex>"}`` and the newline.
SEAL_HEAD = b',"sha256":"'
_END = b'"}\n'
#: Integers kept in a run's value cache (device and round texts); beyond it, parsed each time.
_INT_CACHE = 1 << 16


def seal(body: bytes) -> bytes:
    """The complete line for ``body`` (a JSON object's text without its closing ``}``): the
    body, its sha256 seal, ``}`` and the newline."""
    return b"".join((body, SEAL_HEAD, hashlib.sha256(body).hexdigest().encode("ascii"),
                     b'"}\n'))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a long ledger is read (restored after).

    Reading builds millions of long-lived, acyclic objects; each automatic collection of
    the oldest generation would walk all of them again (about a third of the read time).
    Nothing read here forms a cycle, so reference counting frees what is dropped. When the
    collector is enabled again, the objects made meanwhile go straight to the oldest
    generation (``gc.freeze`` then ``gc.unfreeze``) or, when objects are frozen already
    (:mod:`testbed.core.process.startup_gc`), join them in the permanent generation: else the first
    young collection after the read walks every one of them (0.8 s after a read of 10^6
    lines).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()  # into the oldest generation, without walking them
            else:
                gc.freeze()  # beside what is frozen (unfreezing would thaw that too)
            gc.enable()


class Shape:
    """The bytes of one template's chained lines around their values (module docstring):
    ``pieces`` ``(P0, P1, P2, P3, P4)`` and the template's checked ``event``."""

    __slots__ = ("event", "pieces", "prefix")

    def __init__(self, pieces: tuple[bytes, bytes, bytes, bytes, bytes], event: Any) -> None:
        self.pieces = pieces
        self.event = event
        self.prefix = pieces[0]  # how the parser finds the shape of a line


class Shapes:
    """The shapes of the chained lines a parser has read, and the reading of runs of lines
    by them; ``entry_type``: the parser's entry, a ``(event, nonce)`` tuple type."""

    def __init__(self, entry_type: type[tuple[Any, ...]]) -> None:
        self._entry_type = entry_type
        self._by_prefix: dict[bytes, list[Shape]] = {}
        self._ints: dict[bytes, int] = {}  # integer texts already checked

    def add(self, pieces: tuple[bytes, bytes, bytes, bytes, bytes], event: Any) -> Shape:
        """A new shape, found from then on by :meth:`of`."""
        event.for_round_and_device(event.round, event.device)  # makes the shared store
        shape = Shape(pieces, event)
        self._by_prefix.setdefault(shape.prefix, []).append(shape)
        return shape

    def of(self, raw: bytes, tail: bytes) -> Shape | None:
        """The shape whose ``P0`` starts ``raw`` (``None``: none); of several, the one that
        reads ``raw`` after ``tail``."""
        at = raw.find(b'"device":')
        found = self._by_prefix.get(raw[:at + 9]) if at > 0 else None
        if not found:
            return None
        for shape in found if len(found) > 1 else ():
            if self.read_run(shape, raw, iter(()), tail, lambda _: None)[0]:
                return shape
        return found[0]

    def read_run(self, shape: Shape, first: bytes, lines: Iterator[bytes], tail: bytes,
                 extend: Callable[[Iterable[Any]], None], *, known: int = 0
                 ) -> tuple[int, bytes, bytes | None, bytes | None]:
        """Read ``first`` and the lines after it from ``lines`` while they have ``shape``
        (module docstring), adding their entries with ``extend``; ``tail``: the seal the
        first line's ``prev`` must be. ``known``: of these lines, how many first ones have
        seals that the caller checks otherwise (their sha256 is not computed here; the
        caller reads everything again if that check fails:
        :mod:`~testbed.core.privacy.ledger_verified`).

        Returns ``(lines read, the chain's tail after them, the last line read (None:
        none), the first line not read (None: the end of lines))``.
        """
        p0, p1, p2, p3, p4 = shape.pieces
        suffix = p4 + SEAL_HEAD
        a0, l1, l2, l3, ls = len(p0), len(p1), len(p2), len(p3), len(suffix)
        body_less = len(SEAL_HEAD)
        # Each event is the template's with the line's round and device, copied as
        # JsonEvent.for_round_and_device copies it (its checks hold: JSON integers are >= 0).
        kind, state = type(shape.event), shape.event.__dict__
        new_object, set_attribute = object.__new__, object.__setattr__
        sha256, join, ints = hashlib.sha256, b"".join, self._ints
        cached = ints.get
        events: list[Any] = []
        nonces: list[bytes] = []
        add_event, add_nonce = events.append, nonces.append
        last: bytes | None = None
        raw: bytes | None = first
        j = k = u = v = w = -1  # the last line's offsets: most lines have the same
        d_end = w_end = -1  # j - l1 and w + 64 for them
        while raw is not None:
            device, nonce, rnd, digest = raw[a0:d_end], raw[j:k], raw[u:v], raw[w:w_end]
            if join((p0, device, p1, nonce, p2, tail, p3, rnd, suffix, digest, _END)) != raw:
                i = raw.find(b",", a0)  # the device's digits end at the comma that starts P1
                j = i + l1
                k = raw.find(b'"', j)  # the nonce ends at the quote that starts P2
                u = k + l2 + 64 + l3
                v = raw.find(b",", u)  # the round's digits end at the comma of P4 or SEAL
                w = v + ls
                if i < 0 or k < 0 or v < 0:
                    break
                d_end, w_end = i, w + 64
                device, nonce, rnd, digest = raw[a0:i], raw[j:k], raw[u:v], raw[w:w + 64]
                if join((p0, device, p1, nonce, p2, tail, p3, rnd, suffix, digest,
                         _END)) != raw:
                    break
            # raw is the shape's bytes around these values: check each value's kind
            if not nonce.isalnum() or (
                    known <= 0 and sha256(raw[:w - body_less]).hexdigest().encode() != digest):
                break
            known -= 1
            d = cached(device)
            if d is None:
                d = _integer(device, ints)
            r = cached(rnd)
            if r is None:
                r = _integer(rnd, ints)
            if d is None or r is None:
                break
            copy = state.copy()
            copy["round"] = r
            copy["device"] = d
            event = new_object(kind)
            set_attribute(event, "__dict__", copy)
            add_event(event)
            add_nonce(nonce)
            tail = digest
            last = raw
            raw = next(lines, None)
        extend(map(tuple.__new__, repeat(self._entry_type),
                   zip(events, map(bytes.decode, nonces), strict=True)))
        return len(events), tail, last, raw


def _integer(text: bytes, ints: dict[bytes, int]) -> int | None:
    """The value of a JSON integer token ``0|[1-9][0-9]*`` (``None``: not one), cached."""
    if not text.isdigit() or (text[0] == 48 and len(text) > 1):  # 48: b"0"
        return None
    value = int(text)
    if len(ints) < _INT_CACHE:
        ints[text] = value
    return value
