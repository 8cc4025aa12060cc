"""The paced round's slot lead, sized from the bursts' reported slack (SlotLead)."""

from __future__ import annotations

import pytest

from aggregator.lab.slot_lead import (
    HISTORY_ROUNDS,
    MARGIN_S,
    MIN_LEAD_S,
    SAFETY_FACTOR,
    WARMUP_ROUNDS,
    SlotLead,
)


def _round(lead: SlotLead, given: dict[int, float], slack: dict[int, float]) -> float:
    """One round: the lead it gets, each device's lead given, then its reported slack."""
    out = lead.next_s()
    for i, g in given.items():
        lead.set_given(i, g)
    for i, sl in slack.items():
        lead.report(i, sl)
    return out


def test_the_configured_lead_until_rounds_reported_then_twice_the_worst_use() -> None:
    lead = SlotLead(0.4)
    # each burst used 30 ms of its lead (slot k starts 0.07 s after slot k - 1)
    leads = [_round(lead, {0: 0.4, 1: 0.47}, {0: 0.37, 1: 0.44}) for _ in range(WARMUP_ROUNDS)]
    assert leads == [0.4] * WARMUP_ROUNDS
    assert lead.next_s() == pytest.approx(max(MIN_LEAD_S, SAFETY_FACTOR * 0.03 + MARGIN_S))


def test_the_lead_never_exceeds_the_configured_one_nor_falls_below_the_floor() -> None:
    slow = SlotLead(0.4)
    for _ in range(WARMUP_ROUNDS):
        _round(slow, {0: 0.4}, {0: 0.05})  # used 0.35 s: twice that is over the configured
    assert slow.next_s() == 0.4
    quick = SlotLead(0.4)
    for _ in range(WARMUP_ROUNDS):
        _round(quick, {0: 0.4}, {0: 0.399})
    assert quick.next_s() == MIN_LEAD_S


def test_a_missed_slot_restores_the_configured_lead_and_forgets_the_history() -> None:
    lead = SlotLead(0.4)
    for _ in range(HISTORY_ROUNDS):
        _round(lead, {0: 0.4}, {0: 0.38})
    shrunk = lead.next_s()
    assert shrunk < 0.4
    lead.set_given(0, shrunk)
    lead.missed()
    assert [_round(lead, {0: 0.4}, {0: 0.38}) for _ in range(WARMUP_ROUNDS)] == [0.4] * 2
    assert lead.next_s() == shrunk


def test_the_worst_round_in_the_history_sizes_the_lead_until_it_ages_out() -> None:
    lead = SlotLead(1.0)
    _round(lead, {0: 1.0}, {0: 0.7})  # one slow hand-over: 0.3 s used
    for _ in range(HISTORY_ROUNDS - 1):
        _round(lead, {0: 1.0}, {0: 0.98})
    assert lead.next_s() == pytest.approx(SAFETY_FACTOR * 0.3 + MARGIN_S)
    _round(lead, {0: 1.0}, {0: 0.98})
    assert lead.next_s() == pytest.approx(max(MIN_LEAD_S, SAFETY_FACTOR * 0.02 + MARGIN_S))


def test_a_report_of_a_device_without_a_slot_is_ignored_and_bad_leads_refused() -> None:
    lead = SlotLead(0.4)
    lead.next_s()
    assert lead.report(3, 0.1) is None
    with pytest.raises(ValueError, match="configured_s"):
        SlotLead(0.0)
