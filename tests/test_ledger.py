"""The ledger is append-only and survives a crash that tears its last line."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.core.privacy import (
    Ledger,
    LedgerError,
    PrivacyAccountant,
    TornLineWarning,
    UploadEvent,
    rebuild_accountant,
)


def ev(r: int, device: int = 0, gain: float = 1.0) -> UploadEvent:
    return UploadEvent(round=r, device=device, mechanism="before", sigma=0.8, alpha=1.5,
                       gain=gain, n0=0.1, trusted_channel_noise=0.5, d=1000, l=100, q=None,
                       clip=5.0)


def test_append_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    events = [ev(r, device=r % 3, gain=0.2 * (r + 1)) for r in range(6)]
    with Ledger.open(path) as ledger:
        for e in events:
            ledger.append(e)
        assert len(ledger) == 6
    with Ledger.open(path) as ledger:
        assert ledger.events() == events
        assert len(ledger) == 6
    assert path.read_text().count("\n") == 6


def test_torn_last_line_is_ignored_and_the_ledger_continues(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    with Ledger.open(path) as ledger:
        for r in range(3):
            ledger.append(ev(r))
    intact = path.read_bytes()
    first_two = intact[: intact.index(b"\n", intact.index(b"\n") + 1) + 1]
    # crash in the middle of writing the third line
    cut = len(first_two) + (len(intact) - len(first_two)) // 2
    path.write_bytes(intact[:cut])
    with pytest.warns(TornLineWarning), Ledger.open(path) as ledger:
        assert ledger.events() == [ev(0), ev(1)]
        ledger.append(ev(2))
        ledger.append(ev(3))
    data = path.read_bytes()
    assert data.startswith(first_two)  # earlier lines never rewritten
    with Ledger.open(path) as ledger:
        assert ledger.events() == [ev(0), ev(1), ev(2), ev(3)]
    assert (tmp_path / "ledger.jsonl.torn").read_bytes() == intact[len(first_two):cut] + b"\n"


def test_torn_line_when_only_the_newline_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text(ev(0).to_json() + "\n" + ev(1).to_json())
    with pytest.warns(TornLineWarning), Ledger.open(path) as ledger:
        assert ledger.events() == [ev(0)]


def test_corrupt_complete_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text(ev(0).to_json() + "\n{not json}\n" + ev(1).to_json() + "\n")
    with pytest.raises(LedgerError, match="line 2"):
        Ledger.open(path)


def test_closed_ledger_refuses_appends(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path / "l.jsonl")
    ledger.close()
    ledger.close()
    with pytest.raises(LedgerError, match="closed"):
        ledger.append(ev(0))


@pytest.mark.parametrize("mode", ["paper", "strict"])
def test_rebuild_accountant_matches_the_live_one(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "ledger.jsonl"
    live = PrivacyAccountant(mode=mode, delta=1e-5)
    with Ledger.open(path) as ledger:
        for r in range(8):
            e = ev(r, device=r % 2, gain=0.3 + 0.25 * r)
            ledger.append(e)
            live.add(e)
    rebuilt = rebuild_accountant(path, mode=mode, delta=1e-5)
    for device in (0, 1):
        assert rebuilt.epsilon(device) == live.epsilon(device)
