"""The collision check's preamble search (radio.preamble_search): its threshold against the
closed form, its statistic against a direct computation and the noise tail, the frames the
receiver's own search missed, and no false detection in clean frames of any root."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import signal, stats

from radio.framing import WaveformParams, device_roots, device_waveform, zadoff_chu
from radio.modem import modulate, pulse_taps
from radio.preamble_search import (
    COARSE_STEPS,
    CROSSTALK_RHO,
    FALSE_ALARM,
    FINE_STEPS,
    PreambleScan,
    detection_threshold,
    false_alarm_probability,
    find_preambles,
    preamble_statistic,
    search_roots,
)
from tests.radio_helpers import unit_payload

WF = WaveformParams()
SPS = WF.samples_per_symbol
PERIOD = WF.zc_length * SPS


def _direct_statistic(samples: np.ndarray, root: int) -> np.ndarray:
    """The zero-offset statistic by its definition, one lag at a time in index arrays:
    ``|sum_k sum_m mf[tau + k P + m sps] conj(z_m)| / sqrt(R L sum |mf|^2)``."""
    mf = signal.convolve(samples, pulse_taps(WF))
    R, L = WF.preamble_repeats, WF.zc_length
    ref = np.tile(zadoff_chu(L, root), R)
    offsets = np.arange(R * L) * SPS
    n_lag = mf.size - offsets[-1]
    idx = np.arange(n_lag)[:, None] + offsets[None, :]
    x = mf[idx]
    return np.abs(x @ np.conj(ref)) / np.sqrt(R * L * np.sum(np.abs(x) ** 2, axis=1))


def _frame(device: int, n_payload: int, rng: np.random.Generator) -> np.ndarray:
    return modulate(device_waveform(WF, device), unit_payload(n_payload, rng))[0]


def _place(n: int, frames: list[tuple[np.ndarray, int, float, float]], noise: float,
           rng: np.random.Generator) -> np.ndarray:
    """Noise of power ``noise`` plus each ``(frame, start, amplitude, cfo_hz)``."""
    out = np.sqrt(noise / 2) * (rng.standard_normal(n) + 1j * rng.standard_normal(n))
    for x, start, amplitude, cfo in frames:
        k = np.arange(x.size)
        out[start:start + x.size] += amplitude * x * np.exp(
            1j * (rng.uniform(0, 2 * np.pi) + 2 * np.pi * cfo * k / WF.sample_rate_hz))
    return out


def test_threshold_is_the_closed_form_for_the_number_of_tests() -> None:
    """tests * (1 - t^2)^(R L - 1) = FALSE_ALARM, tests = lags x offsets x roots;
    the Beta(1, n - 1) tail against scipy's."""
    known = WF.zc_length * WF.preamble_repeats
    for n, roots in ((6_000, 1), (120_000, 20), (2_000_000, 34)):
        t = detection_threshold(WF, n, roots)
        tests = n * COARSE_STEPS * FINE_STEPS * roots
        assert tests * false_alarm_probability(WF, t) == pytest.approx(FALSE_ALARM, rel=1e-9)
        assert false_alarm_probability(WF, t) == pytest.approx(
            stats.beta(1, known - 1).sf(t * t), rel=1e-9)
        assert false_alarm_probability(WF, t) < math.exp(-known * t * t)
    assert 0.37 < detection_threshold(WF, 6_000, 1) < detection_threshold(WF, 2_000_000, 34) < 0.45


def test_statistic_is_at_least_the_direct_zero_offset_one_and_one_on_a_clean_frame() -> None:
    rng = np.random.default_rng(1)
    root = device_waveform(WF, 3).zc_root
    # noise 60 dB below the frame: the search correlates in single precision (float32),
    # which keeps rho within 1e-6 of the double-precision statistic where a position's
    # energy is within about 70 dB of the strongest in its block (any receiver's noise floor)
    x = _place(9_000, [(_frame(3, 600, rng), 1_000, 1.0, 0.0)], 1e-3, rng)
    rho, _ = preamble_statistic(x, WF, [root])[root]
    direct = _direct_statistic(x, root)
    assert rho.shape == direct.shape
    # the best hypothesis is at least the zero one
    assert np.all(rho >= direct - 1e-6)
    tau = int(np.argmax(direct))
    assert direct[tau] > 0.999 and rho[tau] == pytest.approx(direct[tau], abs=1e-6)
    # the first preamble symbol: guard, then transmit and receive filter delays
    delay = (pulse_taps(WF).size - 1) // 2
    assert tau == 1_000 + WF.guard_symbols * SPS + 2 * delay


def test_noise_tail_matches_the_closed_form() -> None:
    """On noise, P(rho > t) per position is (1 - t^2)^(R L - 1) for one hypothesis, and at
    most the hypotheses' count times that for the best of them."""
    rng = np.random.default_rng(2)
    x = np.sqrt(0.5) * (rng.standard_normal(400_000) + 1j * rng.standard_normal(400_000))
    root = device_roots(WF)[0]
    t = 0.15
    p = false_alarm_probability(WF, t)
    single = np.mean(_direct_statistic(x, root)[::SPS] > t)
    best = np.mean(preamble_statistic(x, WF, [root])[root][0][::SPS] > t)
    assert 0.7 * p < single < 1.4 * p
    assert single <= best < COARSE_STEPS * FINE_STEPS * p


@pytest.mark.parametrize("periods", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 12.0])
@pytest.mark.parametrize("db", [0.0, -3.0])
def test_finds_a_second_frame_close_to_a_stronger_one(periods: float, db: float) -> None:
    """The receiver's own search keeps one candidate within two repetitions of a stronger
    peak and needs the repetition metric (about (P1 / P)^2) above 0.04: a frame starting
    1.5 periods after a stronger one, or 6 dB under another frame's payload, was missed.
    Here both are found where they start, each with its own carrier offset."""
    rng = np.random.default_rng(int(periods * 10) + int(-db))
    shift = int(periods * PERIOD)
    x0, x1 = _frame(0, 800, rng), _frame(1, 800, rng)
    x = _place(x0.size + shift + 2_000, [(x0, 1_000, 1.0, 1_700.0),
                                         (x1, 1_000 + shift, 10 ** (db / 20), -2_200.0)],
               1e-3, rng)
    roots = [device_waveform(WF, d).zc_root for d in range(6)]
    found = {(f.root, f.start) for f in find_preambles(x, WF, roots)}
    starts = {root: [s for r, s in found if r == root] for root in roots}
    assert [abs(s - 1_000) <= 2 for s in starts[roots[0]]] == [True], found
    assert [abs(s - 1_000 - shift) <= 2 for s in starts[roots[1]]] == [True], found
    assert not any(starts[r] for r in roots[2:]), found


def test_no_other_root_in_clean_frames_of_every_root() -> None:
    """Each of the 34 device roots' frames (random carrier offset over the receiver's range,
    fractional timing, 5-40 dB SNR): no other root is found, and the strongest leak of any
    other root's statistic (its preamble and the postamble next to the frame's) stays
    below CROSSTALK_RHO."""
    rng = np.random.default_rng(4)
    roots = device_roots(WF)
    leak = 0.0
    for device, root in enumerate(roots):
        x0 = _frame(device, 400, rng)
        n = x0.size + 2_000
        frac = np.exp(-2j * np.pi * np.fft.fftfreq(n) * rng.uniform(0, 1))
        placed = np.zeros(n, dtype=complex)
        placed[1_000:1_000 + x0.size] = x0
        x = np.fft.ifft(np.fft.fft(placed) * frac)
        x = _place(n, [(x, 0, 1.0, rng.uniform(-2_700, 2_700))],
                   10 ** (-rng.uniform(5, 40) / 10), rng)
        others = [r for r in roots if r != root]
        assert [f.root for f in find_preambles(x, WF, [root, *others])] == [root]
        stats = preamble_statistic(x, WF, others)
        leak = max(leak, max(float(rho.max()) for rho, _ in stats.values()))
    assert leak < CROSSTALK_RHO - 0.02, leak


def test_short_buffers_hold_no_frame() -> None:
    assert find_preambles(np.zeros(100, dtype=complex), WF, [1, 2]) == []
    assert find_preambles(np.zeros(10_000, dtype=complex), WF, []) == []


def test_a_scan_fed_piece_by_piece_is_the_whole_capture_s_statistic_bit_for_bit() -> None:
    """The receiver searches a round's capture while its later slots are on the air: fed in
    any pieces (down to single samples, across block boundaries), the statistic and the
    frames found are those of the whole capture at once, and a scan that does not hold the
    capture's start is refused."""
    rng = np.random.default_rng(8)
    frames = [(_frame(d, 4000, rng), 3000 + 26000 * d, 1.0, 150.0 * d) for d in range(3)]
    x = _place(90000, frames, 0.01, rng)
    roots = search_roots(WF, [device_waveform(WF, d).zc_root for d in range(3)])
    whole = preamble_statistic(x, WF, roots)
    for cuts in ([], [1, 2, 3, 17000, 17001, 52000], sorted(rng.integers(0, x.size, 20))):
        scan = PreambleScan(WF, roots, x.size)
        edges = [0, *cuts, x.size]
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            scan.feed(x[a:b])
            if scan.filled < x.size:  # only the lags whose samples are in
                assert scan.searched <= max(0, scan.filled - scan.tail)
        got = scan.result()
        for root in roots:
            assert np.array_equal(got[root][0], whole[root][0])
            assert np.array_equal(got[root][1], whole[root][1])
    wanted = [device_waveform(WF, d).zc_root for d in range(3)]
    part = PreambleScan(WF, roots, x.size)
    part.feed(x[:40000])
    assert part.searched > 0
    assert find_preambles(x, WF, wanted, scan=part) == find_preambles(x, WF, wanted)
    assert [f.start for f in find_preambles(x, WF, wanted)] == [3000, 29000, 55000]
    other = x.copy()
    other[100] += 1.0
    stale = PreambleScan(WF, roots, x.size)
    stale.feed(other[:1000])
    with pytest.raises(ValueError, match="not the start of these samples"):
        find_preambles(x, WF, wanted, scan=stale)
    with pytest.raises(ValueError, match="fed to a capture of"):
        PreambleScan(WF, roots, 10).feed(x[:11])
    with pytest.raises(ValueError, match="has 1000 of"):
        stale.result()
