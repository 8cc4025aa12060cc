"""Clock offsets (NTP-style) and TDMA slots: pure functions against known truths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from radio.tdma import (
    BURST_START_JITTER_S,
    SHARED_REFERENCE_GUARD_S,
    SHARED_REFERENCES,
    schedule_window,
    shared_reference,
    slot_guard_s,
    tdma_schedule,
)
from radio.time_sync import OffsetEstimate, estimate_offset, exact, measure_offset
from radio.usrp_settings import SHARED_TIME_SOURCES


def _exchanges(
    rng: np.random.Generator, offset_s: float, n: int, *, drift_ppm: float = 0.0,
    t0: float = 1000.0, spacing_s: float = 0.05,
) -> list[tuple[float, float, float]]:
    """Exchanges with asymmetric random delays; remote clock = local (1 + drift) + offset."""
    out = []
    t = t0
    for _ in range(n):
        up = rng.exponential(5e-3) + (20e-3 if rng.random() < 0.5 else 0.0)  # slow uplink
        down = rng.exponential(0.5e-3)
        process = rng.uniform(0, 1e-3)
        at_remote = t + up + rng.uniform(0, process)  # when, on the local clock, it was read
        t_remote = at_remote * (1 + drift_ppm * 1e-6) + offset_s
        out.append((t, t_remote, t + up + process + down))
        t += spacing_s
    return out


def test_true_offset_lies_within_the_uncertainty_under_asymmetric_delays() -> None:
    rng = np.random.default_rng(1)
    for _ in range(500):
        offset = rng.uniform(-5, 5)
        samples = _exchanges(rng, offset, int(rng.integers(1, 12)))
        est = estimate_offset(samples, drift_ppm=0.0, hold_s=0.0)
        # The exact bound of the minimum-RTT exchange: nothing looser, nothing tighter.
        best = min(samples, key=lambda s: s[2] - s[0])
        assert est.rtt_s == pytest.approx(best[2] - best[0])
        assert est.uncertainty_s == pytest.approx(est.rtt_s / 2)
        assert est.contains(offset), (offset, est)


def test_the_midpoint_is_biased_by_the_delay_asymmetry_but_stays_in_the_bound() -> None:
    # One exchange: 30 ms up, 1 ms down. The midpoint is off by (up - down) / 2 = 14.5 ms.
    est = estimate_offset([(0.0, 2.0 + 0.030, 0.031)], drift_ppm=0.0, hold_s=0.0)
    assert est.offset_s == pytest.approx(2.0 + 0.0145)
    assert est.uncertainty_s == pytest.approx(0.0155)
    assert est.contains(2.0)
    assert not OffsetEstimate(est.offset_s, 0.010, est.rtt_s).contains(2.0)


def test_drift_allowance_covers_the_offset_when_the_estimate_is_used_later() -> None:
    rng = np.random.default_rng(2)
    drift_ppm, hold_s = 40.0, 20.0
    for _ in range(300):
        offset = rng.uniform(-1, 1)
        samples = _exchanges(rng, offset, 8, drift_ppm=drift_ppm, spacing_s=0.5)
        est = estimate_offset(samples, drift_ppm=drift_ppm, hold_s=hold_s)
        t_use = max(s[2] for s in samples) + rng.uniform(0, hold_s)
        true_then = t_use * drift_ppm * 1e-6 + offset  # remote - local at t_use
        assert est.contains(true_then)
        without = estimate_offset(samples, drift_ppm=0.0, hold_s=0.0)
        assert est.uncertainty_s > without.uncertainty_s


def test_conversions_are_inverse_and_exact_is_exact() -> None:
    est = OffsetEstimate(offset_s=-3.25, uncertainty_s=1e-3, rtt_s=2e-3)
    assert est.to_local(est.to_remote(17.0)) == pytest.approx(17.0)
    assert est.to_remote(10.0) == pytest.approx(6.75)
    assert exact().uncertainty_s == 0.0 and exact(2.0).to_remote(1.0) == 3.0


def test_measure_offset_uses_the_fastest_round_trip() -> None:
    now = [100.0]
    delays = iter([0.040, 0.002, 0.030, 0.025])

    def clock() -> float:
        return now[0]

    def remote() -> float:
        d = next(delays)
        now[0] += d / 2
        reading = now[0] + 7.0
        now[0] += d / 2
        return reading

    est = measure_offset(remote, exchanges=4, clock=clock, drift_ppm=0.0, hold_s=0.0)
    assert est.offset_s == pytest.approx(7.0) and est.rtt_s == pytest.approx(0.002)


@pytest.mark.parametrize(
    "samples,kwargs,fragment",
    [
        ([], {}, "no exchanges"),
        ([(1.0, 2.0, 0.5)], {}, "before t_send"),
        ([(1.0, math.nan, 1.5)], {}, "finite"),
        ([(1.0, 2.0)], {}, "(t_send, t_remote, t_recv)"),
        ([(1.0, 2.0, 1.5)], {"drift_ppm": -1.0}, "drift_ppm"),
        ([(1.0, 2.0, 1.5)], {"hold_s": math.inf}, "hold_s"),
    ],
)
def test_bad_exchanges_are_refused(samples: list, kwargs: dict, fragment: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError) as info:
        estimate_offset(samples, **kwargs)
    assert fragment in str(info.value)


def test_schedule_windows_abut_and_shifted_bursts_stay_in_their_own_window() -> None:
    bursts = {3: 0.055, 0: 0.020, 7: 0.101}
    guard = 1.5e-3
    slots = tdma_schedule([3, 0, 7], bursts, guard, start_s=50.0)
    assert [s.device for s in slots] == [3, 0, 7]
    assert slots[0].window_start_s == pytest.approx(50.0)
    assert [s.burst_s for s in slots] == [0.055, 0.020, 0.101]
    for a, b in zip(slots, slots[1:], strict=False):
        assert b.window_start_s == pytest.approx(a.window_end_s)  # abut, no overlap
        assert b.start_s - a.end_s == pytest.approx(2 * guard)
    rng = np.random.default_rng(3)
    for _ in range(200):
        err = rng.uniform(-guard, guard, size=len(slots))
        actual = [(s.start_s + e, s.end_s + e) for s, e in zip(slots, err, strict=True)]
        for s, (t0, t1) in zip(slots, actual, strict=True):
            assert s.window_start_s - 1e-12 <= t0 and t1 <= s.window_end_s + 1e-12
        for (_, end), (start, _) in zip(actual, actual[1:], strict=False):
            assert end <= start + 1e-12
    w0, w1 = schedule_window(slots)
    assert w0 == slots[0].window_start_s and w1 == slots[-1].window_end_s


def test_one_burst_length_for_all_devices() -> None:
    slots = tdma_schedule(range(4), 0.01, 0.0, 0.0)  # type: ignore[arg-type]
    assert [s.start_s for s in slots] == pytest.approx([0.0, 0.01, 0.02, 0.03])


@pytest.mark.parametrize(
    "args,fragment",
    [
        (([], 0.01, 1e-3, 0.0), "at least one"),
        (([0, 0], 0.01, 1e-3, 0.0), "device 0 listed twice"),
        (([-1], 0.01, 1e-3, 0.0), "integers >= 0"),
        (([True], 0.01, 1e-3, 0.0), "integers >= 0"),
        (([0, 1], {0: 0.01}, 1e-3, 0.0), "no duration for device 1"),
        (([0], 0.0, 1e-3, 0.0), "burst_s: got 0.0; allowed: a finite number > 0"),
        (([0], {0: math.nan}, 1e-3, 0.0), "burst_s[0]"),
        (([0], 0.01, -1e-3, 0.0), "guard_s"),
        (([0], 0.01, 1e-3, math.inf), "start_s"),
    ],
)
def test_bad_schedules_are_refused(args: tuple, fragment: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError) as info:
        tdma_schedule(*args)
    assert fragment in str(info.value)


def test_guard_is_fixed_with_a_shared_reference_and_sized_from_the_offset_otherwise() -> None:
    assert set(SHARED_REFERENCES) == set(SHARED_TIME_SOURCES)
    for ref in ("external", "mimo", "gpsdo"):
        assert shared_reference(ref)
        assert slot_guard_s(0.3, ref) == SHARED_REFERENCE_GUARD_S  # offset irrelevant
    for ref in ("internal", "none"):
        assert not shared_reference(ref)
        assert slot_guard_s(2e-3, ref) == pytest.approx(4e-3 + BURST_START_JITTER_S)
        assert slot_guard_s(0.0, ref) == SHARED_REFERENCE_GUARD_S  # never below the fixed one
    with pytest.raises(ValueError, match="allowed: external, mimo, gpsdo, internal, none"):
        slot_guard_s(1e-3, "ntp")
    with pytest.raises(ValueError, match="uncertainty_s"):
        slot_guard_s(-1.0, "internal")


def test_guard_from_measured_offsets_keeps_every_burst_in_its_window() -> None:
    """End to end: measured offsets -> guard -> schedule; bursts land where the edges aim."""
    rng = np.random.default_rng(4)
    devices = [0, 1, 2, 3]
    true = {d: rng.uniform(-2, 2) for d in devices}  # aggregator clock - edge clock
    est = {d: estimate_offset(_exchanges(rng, true[d], 6), drift_ppm=0.0, hold_s=0.0)
           for d in devices}
    guard = slot_guard_s(max(e.uncertainty_s for e in est.values()), "internal")
    slots = tdma_schedule(devices, 0.05, guard, start_s=2000.0)
    for s in slots:
        # The edge aims at the slot on its own clock; the burst starts at aggregator time:
        aimed_local = est[s.device].to_local(s.start_s)
        actual_start = aimed_local + true[s.device]
        assert s.window_start_s <= actual_start
        assert actual_start + s.burst_s <= s.window_end_s
