"""The note beside a ledger of what its writer checked or wrote (``<ledger>.verified``): a
resume skips those lines' seals only while the noted bytes are there unchanged, and reads
exactly what a read without the note reads, errors included."""

from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path
from typing import Any

import pytest

import testbed.core.privacy.ledger_shape as ledger_shape
from testbed.core.privacy import Ledger, LedgerError, RecordEvent
from testbed.core.privacy.ledger_verified import (
    NOTE_EVERY,
    Verified,
    read_verified,
    verified_path,
    write_verified,
)

HEADER = {"delta": 1e-5, "accounting": "rdp", "epsilon_target": 1e6, "unit": "record",
          "relation": "add-remove"}


def ev(t: int, device: int = 0) -> RecordEvent:
    return RecordEvent(round=t, device=device, steps=1, sampling_rate=0.01, amplified=True,
                       example_clip=1.0, expected_batch=60.0, dataset_size=6000, sigma=0.02)


def _write(path: Path, n: int) -> None:
    with Ledger.open(path, header=HEADER) as ledger:
        for i in range(n):
            ledger.append(ev(i // 4, i % 4), f"n{i}")


@pytest.fixture
def seals(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the seals the shape reader computes (one entry per sha256 call)."""
    calls: list[int] = []

    def sha256(data: bytes) -> Any:
        calls.append(1)
        return hashlib.sha256(data)

    monkeypatch.setattr(ledger_shape, "hashlib", types.SimpleNamespace(sha256=sha256))
    return calls


def _read(path: Path) -> list[Any]:
    with Ledger.open(path) as ledger:
        return list(ledger.take_loaded())


def test_the_note_holds_what_the_writer_wrote(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    _write(path, 40)
    note = read_verified(path)
    data = path.read_bytes()
    assert note == Verified(len(data), 41, hashlib.sha256(data).hexdigest())


def test_a_note_is_written_every_so_many_appends(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    with Ledger.open(path, header=HEADER) as ledger:
        for i in range(NOTE_EVERY + 5):
            ledger.append(ev(i, 0), f"n{i}")
        note = read_verified(path)  # before the close: as a crash would leave it
        assert note is not None and note.lines == NOTE_EVERY  # the header and 1023 events
        assert note.sha256 == hashlib.sha256(path.read_bytes()[:note.bytes]).hexdigest()


def test_a_noted_ledger_is_read_without_its_seals_and_the_same(tmp_path: Path,
                                                               seals: list[int]) -> None:
    path = tmp_path / "ledger.jsonl"
    _write(path, 200)
    seals.clear()
    with_note = _read(path)
    assert seals == []  # every seal left to the one hash of the noted bytes
    verified_path(path).unlink()
    without = _read(path)
    assert len(seals) > 150  # computed line by line
    assert with_note == without
    seals.clear()
    _read(path)  # the open without a note wrote one
    assert seals == []


def test_lines_after_the_note_are_checked(tmp_path: Path, seals: list[int]) -> None:
    path = tmp_path / "ledger.jsonl"
    _write(path, 100)
    note = read_verified(path)
    with Ledger.open(path) as ledger:  # appends 30 lines, then is killed before a note
        for i in range(30):
            ledger.append(ev(100 + i, 0), f"m{i}")
        ledger._checked = None  # noqa: SLF001 - no note at close, as after a kill
    assert read_verified(path) == note
    seals.clear()
    assert len(_read(path)) == 130
    assert 25 <= len(seals) <= 30


def _edit_keeping_structure(path: Path, line: int) -> None:
    """Change the nonce of line ``line`` (1-based) without resealing it: the line keeps its
    shape, so only its seal tells."""
    lines = path.read_bytes().splitlines(keepends=True)
    edited = lines[line - 1].replace(b'"nonce":"n', b'"nonce":"q')
    assert edited != lines[line - 1]
    lines[line - 1] = edited
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize("line", [5, 60])
def test_an_edited_noted_line_is_refused_as_without_the_note(tmp_path: Path, line: int) -> None:
    path = tmp_path / "ledger.jsonl"
    _write(path, 100)
    _edit_keeping_structure(path, line)
    with pytest.raises(LedgerError) as noted:
        _read(path)
    verified_path(path).unlink()
    with pytest.raises(LedgerError) as plain:
        _read(path)
    assert str(noted.value) == str(plain.value)
    assert f"line {line}" in str(plain.value)


def test_a_note_claiming_more_lines_than_its_bytes_hold_is_not_trusted(
        tmp_path: Path, seals: list[int]) -> None:
    path = tmp_path / "ledger.jsonl"
    _write(path, 100)
    lines = path.read_bytes().splitlines(keepends=True)
    prefix = b"".join(lines[:20])
    # the hash of 20 lines, but 60 claimed: line 40's seal must still be computed
    write_verified(path, Verified(len(prefix), 60, hashlib.sha256(prefix).hexdigest()))
    _edit_keeping_structure(path, 40)
    with pytest.raises(LedgerError, match="line 40"):
        _read(path)


@pytest.mark.parametrize("text", ["", "{", '{"bytes": 10}', "[1, 2, 3]",
                                  '{"bytes": 99999999, "lines": 3, "sha256": "' + "0" * 64 + '"}',
                                  '{"bytes": 100, "lines": 3, "sha256": "' + "0" * 64 + '"}'])
def test_a_damaged_or_stale_note_costs_only_time(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ledger.jsonl"
    _write(path, 30)
    expected = _read(path)
    verified_path(path).write_text(text)
    assert _read(path) == expected
    _edit_keeping_structure(path, 10)
    verified_path(path).write_text(text)
    with pytest.raises(LedgerError, match="line 10"):
        _read(path)


def test_a_note_is_json_with_three_fields(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    _write(path, 3)
    assert set(json.loads(verified_path(path).read_text())) == {"bytes", "lines", "sha256"}


@pytest.mark.parametrize("data", [b"a\n", b"a\nbb\nccc\n", b"\n", b"a\n\nb\n", b"a\nb", b"",
                                  b"\na\n", b"ab\n" * 5000, b"x" * 9000 + b"\n\n"])
def test_lines_end_at_against_bytes_methods(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.core.privacy.ledger_verified as lv

    monkeypatch.setattr(lv, "_SCAN", 7)  # chunk edges inside the data
    for end in range(0, len(data) + 1, max(1, len(data) // 50)):
        head = data[:end]
        whole = end > 0 and head.endswith(b"\n") and b"\n\n" not in head \
            and not head.startswith(b"\n")
        assert lv._lines_end_at(data, end) == (head.count(b"\n") if whole else -1), end


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_hash_thread_costs_a_full_read_and_keeps_no_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seals: list[int]) -> None:
    import testbed.core.privacy.ledger_verified as lv

    path = tmp_path / "ledger.jsonl"
    _write(path, 50)
    note = read_verified(path)

    def fails(data: bytes, end: int) -> int:
        raise MemoryError("no room")

    monkeypatch.setattr(lv, "_lines_end_at", fails)
    seals.clear()
    with Ledger.open(path) as ledger:
        assert len(ledger.take_loaded()) == 50
        ledger.append(ev(99, 0), "late")
    assert len(seals) > 40  # every seal computed
    assert read_verified(path) == note  # nothing noted from a hash that did not finish
