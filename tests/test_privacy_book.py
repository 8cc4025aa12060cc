"""The aggregator's privacy book: write-ahead intents survive a crash mid-upload."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.core.privacy import LedgerError, UploadEvent
from testbed.core.privacy.book import PrivacyBook


def _event(device: int, round_index: int, *, n0: float, trusted: float) -> UploadEvent:
    return UploadEvent(
        round=round_index,
        device=device,
        mechanism="before",
        sigma=2.0,
        alpha=0.1,
        gain=1.0,
        n0=n0,
        trusted_channel_noise=trusted,
        d=100,
        l=100,
        q=None,
        clip=1.0,
    )


def test_intent_without_commit_is_recorded_conservatively(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    book = PrivacyBook(path, delta=1e-5, enforce="strict", target=10.0)
    gated = _event(0, 0, n0=0.0, trusted=0.0)
    nonce = book.begin(gated)
    book.commit(_event(0, 0, n0=0.5, trusted=1.0), nonce)  # committed normally
    book.begin(_event(1, 0, n0=0.0, trusted=0.0))  # ... and then the process dies
    book.ledger.close()
    with pytest.warns(UserWarning, match="device 1 round 0"):
        again = PrivacyBook(path, delta=1e-5, enforce="strict", target=10.0)
    events = again.ledger.events()
    assert [(e.device, e.round) for e in events] == [(0, 0), (1, 0)]
    assert events[0].n0 == 0.5  # the committed record is kept as it was
    assert events[1] == _event(1, 0, n0=0.0, trusted=0.0)  # no channel credit
    assert again.epsilon(1)["strict"].epsilon > again.epsilon(0)["strict"].epsilon
    again.close()
    # Recovery happens once: a third open adds nothing.
    third = PrivacyBook(path, delta=1e-5, enforce="strict", target=10.0)
    assert len(third.ledger.events()) == 2
    third.close()


def test_a_rerun_round_is_matched_by_nonce_not_by_device_and_round(tmp_path: Path) -> None:
    """Old bug: intents matched by (device, round) lost an on-air upload of a re-run round."""
    path = tmp_path / "ledger.jsonl"
    book = PrivacyBook(path, delta=1e-5, enforce="strict", target=10.0)
    nonce = book.begin(_event(0, 0, n0=0.0, trusted=0.0))
    book.commit(_event(0, 0, n0=0.5, trusted=1.0), nonce)  # first attempt at round 0 ...
    book.begin(_event(0, 0, n0=0.0, trusted=0.0))  # ... round 0 re-run, killed after the air
    book.close()
    with pytest.warns(UserWarning, match="device 0 round 0"):
        again = PrivacyBook(path, delta=1e-5, enforce="strict", target=10.0)
    assert [(e.device, e.round) for e in again.ledger.events()] == [(0, 0), (0, 0)]
    nonces = [e.nonce for e in again.ledger.entries()]
    assert len(set(nonces)) == 2 and nonces[0] == nonce
    again.close()


def test_a_ledger_for_another_target_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    PrivacyBook(path, delta=1e-5, enforce="strict", target=10.0).close()
    with pytest.raises(LedgerError, match="epsilon_target=10.0"):
        PrivacyBook(path, delta=1e-5, enforce="strict", target=20.0)
    with pytest.raises(LedgerError, match="accounting='strict'"):
        PrivacyBook(path, delta=1e-5, enforce="paper", target=10.0)


def test_guard_uses_the_enforced_accounting(tmp_path: Path) -> None:
    book = PrivacyBook(tmp_path / "l.jsonl", delta=1e-5, enforce="paper", target=1.0)
    big = _event(0, 0, n0=0.0, trusted=0.0)
    assert book.allows(big) == (book.accountants["paper"].epsilon_if(0, big).epsilon <= 1.0)
    with pytest.raises(ValueError, match="enforce"):
        PrivacyBook(tmp_path / "m.jsonl", delta=1e-5, enforce="loose", target=1.0)
    book.close()
