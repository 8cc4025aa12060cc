"""The ledger's hash chain and its one-writer rule: edited, reordered, inserted or deleted
lines are refused naming the line; a second writer is stopped before it transmits; old
(unchained) ledgers stay readable but are never continued."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from testbed.core.privacy import Ledger, LedgerError, RecordEvent, TornLineWarning
from testbed.core.privacy.book import PrivacyBook
from testbed.core.privacy.ledger import EVENT_TYPES, HEADER_TYPE, rebuild_accountant
from testbed.core.privacy.ledger_parse import GENESIS, LineParser

DELTA = 1e-5
HEADER = {"delta": DELTA, "accounting": "rdp", "epsilon_target": 1e6, "unit": "record",
          "relation": "add-remove"}


def ev(t: int, device: int = 0, sigma: float = 0.02) -> RecordEvent:
    return RecordEvent(round=t, device=device, steps=1, sampling_rate=0.01, amplified=True,
                       example_clip=1.0, expected_batch=60.0, dataset_size=6000, sigma=sigma)


def _book(path: Path, **header: Any) -> PrivacyBook:
    return PrivacyBook(path, delta=DELTA, enforce="rdp", target=1e6, unit="record",
                       header=header or None)


def _ledger(path: Path, n: int = 6) -> list[bytes]:
    """A chained ledger of a header and ``n`` events; returns its lines."""
    book = _book(path)
    for t in range(n):
        e = ev(t // 2, t % 2)
        book.commit(e, book.begin(e))
    book.close()
    return path.read_bytes().splitlines(keepends=True)


def test_lines_carry_prev_writer_and_seal(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    lines = _ledger(path, 3)
    records = [json.loads(line) for line in lines]
    assert records[0]["type"] == HEADER_TYPE == "ledger-header/v2"
    assert "prev" not in records[0]
    for before, line, record in zip(lines, lines[1:], records[1:], strict=False):
        assert record["prev"] == json.loads(before)["sha256"]
        assert re.fullmatch(rb'.*,"sha256":"[0-9a-f]{64}"\}\n', line)
    assert len({r["writer"] for r in records}) == 1
    with Ledger.open(path) as ledger:
        assert ledger.header == HEADER and ledger.header_type == HEADER_TYPE
        assert [e.event for e in ledger.take_loaded()] == [ev(0, 0), ev(0, 1), ev(1, 0)]


def _times_ten(line: bytes) -> bytes:
    value = float(re.search(rb'"sigma":([0-9.e-]+)', line).group(1))  # type: ignore[union-attr]
    return re.sub(rb'"sigma":[0-9.e-]+', b'"sigma":%r' % (value * 10), line).replace(b"'", b"")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda ls: ls[:3] + [_times_ten(ls[3])] + ls[4:], "line 4 was changed after it"),
        (lambda ls: ls[:-1] + [_times_ten(ls[-1])], "line 7 was changed after it"),
        (lambda ls: ls[:2] + [ls[3], ls[2]] + ls[4:], "line 3 does not follow line 2"),
        (lambda ls: ls[:2] + ls[3:], "line 3 does not follow line 2"),
        (lambda ls: ls[:4] + [ls[2]] + ls[4:], "line 5 does not follow line 4"),
        (lambda ls: [ls[0].replace(b'"delta":1e-05', b'"delta":0.1')] + ls[1:],
         "line 1 was changed after it"),
        (lambda ls: ls[:3] + [b'{"round":1}\n'] + ls[3:], "line 4 has no sha256 seal"),
        (lambda ls: ls[:1] + [ls[1].replace(b'"device":0', b'"device":5', 1)] + ls[2:],
         "line 2 was changed after it"),
    ],
    ids=["sigma-x10", "last-line-edited", "swapped", "deleted", "inserted-copy",
         "header-edited", "inserted-unchained", "device-edited"],
)
def test_tampering_is_refused_naming_the_line(tmp_path: Path, damage: Any, message: str) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"".join(damage(_ledger(path))))
    with pytest.raises(LedgerError, match=message):
        Ledger.open(path)
    with pytest.raises(LedgerError, match=message):
        rebuild_accountant(path, mode="strict", delta=DELTA)  # reports refuse it too
    with pytest.raises(LedgerError, match=message):
        _book(path)
    # the fast read and the full parse say the same
    for templates in (True, False):
        with pytest.raises(LedgerError, match=message):
            LineParser(path, EVENT_TYPES, HEADER_TYPE, templates=templates).parse(
                path.read_bytes())


def test_a_headerless_ledger_chains_from_genesis(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with Ledger.open(path) as ledger:
        for t in range(3):
            ledger.append(ev(t), f"n{t}")
    lines = path.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[0])["prev"] == GENESIS
    path.write_bytes(b"".join(lines[1:]))  # the first line deleted
    with pytest.raises(LedgerError, match="line 1 does not start the hash chain"):
        Ledger.open(path)


def test_a_torn_last_line_is_still_cut_and_the_chain_continues(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    lines = _ledger(path, 4)
    path.write_bytes(b"".join(lines) + lines[-1][:40])  # a crash during an append
    with pytest.warns(TornLineWarning):
        book = _book(path)
    e = ev(9, 1)
    book.commit(e, book.begin(e))
    book.close()
    with Ledger.open(path) as ledger:
        assert [x.event for x in ledger.take_loaded()][-1] == e
        assert len(ledger) == 5


def test_a_second_writer_is_stopped_before_it_transmits(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    first = _book(path)
    e = ev(0, 0)
    first.commit(e, first.begin(e))
    second = _book(path)  # e.g. a second resume whose directory lock was bypassed
    e = ev(0, 1)
    second.commit(e, second.begin(e))
    intents = second.intents_path.read_bytes()
    with pytest.raises(LedgerError, match=f"line 3 was written by another writer "
                                          f"\\({second.ledger.writer}\\)"):
        first.begin(ev(1, 0))
    assert second.intents_path.read_bytes() == intents  # nothing journalled, nothing sent
    with pytest.raises(LedgerError, match="another writer"):
        first.ledger.append(ev(1, 0))  # nothing written either
    first.close()
    second.close()
    with Ledger.open(path) as ledger:
        assert [(x.event.round, x.event.device) for x in ledger.take_loaded()] == [(0, 0), (0, 1)]


def test_an_upload_already_on_air_is_recorded_after_the_other_writers_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.jsonl"
    first = _book(path)
    pending = ev(1, 0)
    nonce = first.begin(pending)  # ... on air, then another writer appends
    second = Ledger.open(path, header=dict(HEADER))
    second.append(ev(1, 1), "theirs")
    with pytest.raises(LedgerError, match="recorded after its lines"):
        first.commit(pending, nonce)
    first.close()
    second.close()
    with Ledger.open(path) as ledger:  # one valid chain, both records kept
        got = [(x.event.round, x.event.device, x.nonce) for x in ledger.take_loaded()]
    assert got == [(1, 1, "theirs"), (1, 0, nonce)]


@pytest.mark.parametrize("change", ["deleted", "replaced", "truncated"])
def test_a_ledger_changed_under_its_writer_is_refused(tmp_path: Path, change: str) -> None:
    path = tmp_path / "ledger.jsonl"
    lines = _ledger(path, 3)
    book = _book(path)
    if change == "deleted":
        path.unlink()
    elif change == "replaced":
        path.unlink()
        path.write_bytes(b"".join(lines))
    else:
        path.write_bytes(b"".join(lines[:-1]))
    with pytest.raises(LedgerError, match=f"was {change}"):
        book.begin(ev(5, 0))
    book.close()


def test_reopening_with_another_config_names_the_nested_key(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    _book(path, config={"rounds": 40, "scheme": "channel-dp"}).close()
    with pytest.raises(LedgerError, match="config.rounds=40, but this run has config.rounds=60"):
        _book(path, config={"rounds": 60, "scheme": "channel-dp"})


def test_an_old_unchained_ledger_is_readable_but_never_continued(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    old = [json.dumps({"type": "ledger-header/v1", **HEADER}, sort_keys=True)]
    old += [json.dumps(ev(t).to_dict() | {"nonce": f"n{t}"}, sort_keys=True,
                       separators=(",", ":")) for t in range(3)]
    path.write_text("\n".join(old) + "\n")
    with Ledger.open(path) as ledger:  # reports read it
        assert ledger.header_type == "ledger-header/v1"
        assert ledger.events() == [ev(0), ev(1), ev(2)]
        with pytest.raises(LedgerError, match="before ledgers carried a hash chain"):
            ledger.append(ev(3))
    with pytest.raises(LedgerError, match="cannot be continued"):
        _book(path)  # a resume refuses it
    # an unchained line in a chained ledger (or the reverse) is refused
    path.write_text("\n".join(old[1:]) + "\n")
    chained = tmp_path / "c.jsonl"
    lines = _ledger(chained, 2)
    path.write_bytes(path.read_bytes() + lines[1])
    with pytest.raises(LedgerError, match="line 4 .*hash-chain fields"):
        Ledger.open(path)


def test_a_long_chained_ledger_is_read_through_templates(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    with Ledger.open(path, header=dict(HEADER)) as ledger:
        for t in range(30):
            for d in range(10):
                ledger.append(ev(t, d, sigma=0.02 if d % 3 else 0.03), f"{t}x{d}")
    data = path.read_bytes()
    fast = LineParser(path, EVENT_TYPES, HEADER_TYPE)
    full = LineParser(path, EVENT_TYPES, HEADER_TYPE, templates=False)
    assert fast.parse(data) == full.parse(data)
    assert fast.fast_lines == 300
    assert fast.tail == full.tail and fast.lines == full.lines == 301
