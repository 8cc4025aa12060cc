"""Reading chained ledger lines by their template's shape (byte comparisons, no regex) reads
exactly what the full parse reads, refuses nothing the full parse accepts and accepts nothing
it refuses; a replay composed with ``add_all`` is bit for bit the one composed event by event.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.privacy.accountants.record_accountant import RecordAccountant
from testbed.core.privacy.events import DERIVED_STORE
from testbed.core.privacy.ledger import EVENT_TYPES, HEADER_TYPE, LedgerError
from testbed.core.privacy.ledger_parse import GENESIS, LineParser, seal
from testbed.core.privacy.ledger_shape import Shapes
from testbed.core.privacy.record_events import RecordEvent

WRITER = "0123456789abcdef"


def _event(t: int, d: int, dataset: int = 6000) -> RecordEvent:
    return RecordEvent(round=t, device=d, steps=1, sampling_rate=60.0 / dataset, amplified=True,
                       example_clip=1.0, expected_batch=60.0, dataset_size=dataset, sigma=0.02)


def _body(event: RecordEvent, nonce: str, prev: str) -> str:
    """A line's text before its seal, as Ledger.append writes it."""
    data = event.to_dict() | {"nonce": nonce, "prev": prev, "writer": WRITER}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))[:-1]


def _chain(bodies: list[Any]) -> bytes:
    """Sealed lines; each item is an event (chained to the line before) or a function of the
    previous seal giving the body text (a hand-made line, sealed as it is)."""
    out, tail = [], GENESIS
    for i, item in enumerate(bodies):
        text = item(tail) if callable(item) else _body(item, f"n{i}x", tail)
        out.append(seal(text.encode()))
        tail = out[-1][-67:-3].decode()
    return b"".join(out)


def _parse_both(data: bytes) -> tuple[Any, Any, int]:
    """(result through templates and shapes, result of the full parse, lines read fast);
    a result is the entries as comparable tuples, or the error."""
    out: list[Any] = []
    fast_lines = 0
    for templates in (True, False):
        parser = LineParser(Path("ledger.jsonl"), EVENT_TYPES, HEADER_TYPE, templates=templates)
        try:
            entries = parser.parse(data)
            out.append([(type(e.event), e.event.to_dict(), type(e.event.round),
                         type(e.event.device), e.nonce) for e in entries])
        except LedgerError as exc:
            out.append(str(exc))
        if templates:
            fast_lines = parser.fast_lines
    return out[0], out[1], fast_lines


#: Edits of a line's text before it is sealed (its seal then checks): the shape must read
#: each as the full parse does, or leave it to the full parse.
EDITS = [
    ('"round":12', '"round":012'), ('"round":12', '"round":-12'), ('"round":12', '"round":1.5'),
    ('"round":12', '"round": 12'), ('"round":12', '"round":12,"round":13'),
    ('"round":12', '"round":99999999999999999999'), ('"device":3', '"device":03'),
    ('"device":3', '"device":3,"device":4'), ('"device":3', '"device":"3"'),
    ('"device":3', '"device":+3'), ('"nonce":"n2x"', '"nonce":"n2 x"'),
    ('"nonce":"n2x"', '"nonce":""'), ('"nonce":"n2x"', '"nonce":"n2\\u0078"'),
    ('"nonce":"n2x"', '"nonce":"n2x","nonce":"zz"'), ('"nonce":"n2x"', '"nonce":5'),
    ('"nonce":"n2x"', '"nonce":"n,2"'), ('"sigma":0.02', '"sigma":0.03'),
    ('"steps":1', '"steps":1,"extra":0'), ('"writer"', '"writer":"x","wr"'),
    ('{"alpha"', '{"device":7,"alpha"'), ('"prev":"', '"prev":"0'),
]


@pytest.mark.parametrize(("old", "new"), EDITS)
def test_an_edited_sealed_line_is_read_as_the_full_parse_reads_it(old: str, new: str) -> None:
    edited = lambda tail: _body(_event(12, 3), "n2x", tail).replace(old, new, 1)  # noqa: E731
    data = _chain([_event(10, 3), _event(11, 3), edited, _event(13, 3)])
    fast, full, fast_lines = _parse_both(data)
    assert fast == full
    assert fast_lines >= 1  # the second line was read by the first one's shape


def test_a_line_whose_seal_or_prev_does_not_check_is_refused_by_both() -> None:
    good = _chain([_event(t, 3) for t in range(4)])
    lines = good.splitlines(keepends=True)
    wrong_seal = lines[2][:-10] + (b"0" if lines[2][-10:-9] != b"0" else b"1") + lines[2][-9:]
    for data in (b"".join([*lines[:2], wrong_seal, lines[3]]),
                 b"".join([lines[0], lines[1], lines[3]]),  # a line deleted: the chain breaks
                 b"".join([lines[0], lines[2], lines[1], lines[3]])):
        fast, full, _ = _parse_both(data)
        assert isinstance(full, str) and fast == full


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 400), st.integers(0, 4), st.binary(max_size=4), st.booleans())
def test_damaged_lines_are_read_as_the_full_parse_reads_them(
    cut: int, drop: int, insert: bytes, reseal: bool
) -> None:
    """Damage before the seal (the seal checks, the structure may not) or after it."""

    def damaged(tail: str) -> str:
        text = _body(_event(12, 3), "n2x", tail).encode()
        text = text[:cut] + insert + text[cut + drop:]
        return text.decode("utf-8", "replace")

    if reseal:
        data = _chain([_event(10, 3), _event(11, 3), damaged, _event(13, 3)])
    else:
        good = _chain([_event(10, 3), _event(11, 3), _event(12, 3), _event(13, 3)])
        lines = good.splitlines(keepends=True)
        lines[2] = lines[2][:cut] + insert + lines[2][cut + drop:]
        if not lines[2].endswith(b"\n"):
            lines[2] += b"\n"
        data = b"".join(lines)
    fast, full, _ = _parse_both(data)
    assert fast == full


def test_a_long_ledger_of_interleaved_templates_is_read_by_shapes(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(5)
    events = [_event(t, d, dataset=(3000, 6000, 12000)[d % 3] if d < 9 else 6000)
              for t in range(30) for d in range(12) if rng.random() < 0.9]
    data = _chain(events)
    shaped: list[int] = []
    real = Shapes.read_run

    def counted(self: Shapes, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        shaped.append(out[0])
        return out

    monkeypatch.setattr(Shapes, "read_run", counted)
    parser = LineParser(Path("l"), EVENT_TYPES, HEADER_TYPE)
    entries = parser.parse(data)
    assert [e.event for e in entries] == events
    assert [e.nonce for e in entries] == [f"n{i}x" for i in range(len(events))]
    assert parser.fast_lines == len(events) - 1  # the first line is parsed in full
    # all but the first line (parsed in full) and the first one of each template after it
    assert sum(shaped) == len(events) - 4
    monkeypatch.undo()
    fast, full, _ = _parse_both(data)
    assert fast == full
    # copies of one template share its store of derived values, and only those (the first
    # line, parsed in full, is no copy)
    stores = {}
    for e in entries[1:]:
        stores.setdefault(e.event.dataset_size, e.event.__dict__[DERIVED_STORE])
        assert e.event.__dict__[DERIVED_STORE] is stores[e.event.dataset_size]
        assert {k: v for k, v in e.event.__dict__.items() if k != DERIVED_STORE} == \
            vars(_event(e.event.round, e.event.device, e.event.dataset_size))
    assert len({id(s) for s in stores.values()}) == 3


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_add_all_is_add_event_by_event_bit_for_bit(accountant: str) -> None:
    rng = random.Random(accountant)
    shared = [_event(0, 0, dataset) for dataset in (3000, 6000)]
    events = []
    for t in range(25):
        for d in range(8):
            if rng.random() < 0.8:
                events.append(shared[d % 2].for_round_and_device(t, d) if d < 6
                              else _event(t, d, 4000 + 100 * (t % 3)))
    one, many = RecordAccountant(accountant, 1e-5), RecordAccountant(accountant, 1e-5)
    for event in events:
        one.add(event)
    many.add_all(events)
    for d in range(8):
        assert one.history(d) == many.history(d)
        assert one.epsilon(d) == many.epsilon(d)
        assert one.epsilon_without_channel(d) == many.epsilon_without_channel(d)
    assert one.compositions == many.compositions
