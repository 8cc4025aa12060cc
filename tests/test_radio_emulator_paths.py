"""The waveform emulator's fast paths: channel noise, rotator and evenly spaced resampling.

Each is checked against the direct computation it replaces (``sample_at`` at explicit
positions, each position's filter from the interpolator's table applied sample by sample,
``exp(j phase)`` per sample) or against the distribution it must draw from.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from scipy import stats

from radio import line_sampler
from radio.channel_noise import complex_gaussian
from radio.line_sampler import _phase_taps, sample_line, sample_line_chunks
from radio.pulse import sample_at
from radio.waveform_channel import _CHUNK, EmulatorParams, _Rotator, emulate


def _band_limited(n: int, rng: np.random.Generator) -> np.ndarray:
    """Complex noise low-passed to a quarter of the band (like a pulse-shaped frame)."""
    x = rng.standard_normal(n + 64) + 1j * rng.standard_normal(n + 64)
    return np.convolve(x, np.hanning(17) / 8, "valid")[:n]


def test_channel_noise_is_circular_gaussian() -> None:
    n0, n = 0.3, 400_003  # not a multiple of the chunk
    out = np.empty(n, dtype=np.complex64)
    complex_gaussian(out, n0, np.random.default_rng(0))
    re, im = out.real.astype(float), out.imag.astype(float)
    sd = np.sqrt(n0 / 2)
    # Sample-size-based tolerances: sd of the mean power n0 / sqrt(n) ~ 0.16 % of n0.
    assert np.mean(np.abs(out) ** 2) == pytest.approx(n0, rel=0.01)
    assert stats.kstest(re / sd, "norm").pvalue > 1e-3
    assert stats.kstest(im / sd, "norm").pvalue > 1e-3
    assert stats.kstest(np.abs(out.astype(complex)) ** 2 / n0, "expon").pvalue > 1e-3
    for a, b in ((re, im), (re[1:], re[:-1]), (re**2, im**2)):
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n)
    # Tails: P(|n|^2 > 10 n0) = e^-10.
    assert np.mean(np.abs(out) ** 2 > 10 * n0) == pytest.approx(np.exp(-10), rel=0.3)


def test_channel_noise_follows_its_generator() -> None:
    a, b, c = (np.empty(70_000, dtype=np.complex64) for _ in range(3))
    complex_gaussian(a, 1.0, np.random.default_rng(5))
    complex_gaussian(b, 1.0, np.random.default_rng(5))
    complex_gaussian(c, 1.0, np.random.default_rng(6))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_rotator_matches_the_direct_phase_across_chunks() -> None:
    f, phase0 = 0.00173, 0.4
    rot = _Rotator(f, phase0)
    for m0, m in ((0, 1000), (_CHUNK - 100, 5000), (3 * _CHUNK + 7, _CHUNK)):
        want = np.exp(1j * (2 * np.pi * f * np.arange(m0, m0 + m) + phase0))
        assert np.max(np.abs(rot.chunk(m0, m) - want)) < 1e-5


@pytest.mark.parametrize(
    "start, step",
    [(0.0, 1.0), (3.37, 1.0), (0.5, 1 + 50e-6), (0.5, 1 - 50e-6), (7.9, 1 - 2e-4),
     (10.2, 1 + 2e-4), (5.0, 0.98), (2.0, 4.003)],
)
def test_sample_line_is_sample_at(start: float, step: float) -> None:
    x = _band_limited(20_000, np.random.default_rng(1))
    count = int((x.size - 1 - start) / step) + 1  # up to the last sample
    ref = sample_at(x, start + step * np.arange(count))
    got = sample_line(x, start, step, count)
    assert got.dtype == np.complex64 and got.shape == ref.shape
    assert np.max(np.abs(got - ref)) < 1e-6 * np.max(np.abs(ref))


def test_sample_line_refuses_positions_outside() -> None:
    x = np.ones(100, dtype=np.complex64)
    with pytest.raises(ValueError, match=r"inside \[0, 99\]"):
        sample_line(x, 0.5, 1.0, 100)


def _direct_line(
    x: np.ndarray, start: float, step: float, count: int, upsample: int = 8
) -> np.ndarray:
    """:func:`sample_line` position by position, in double precision.

    Position ``k`` lies ``u = upsample * (start + (step - 1) k)`` fine samples past
    ``upsample * k``: input sample ``k + base`` and phase ``q`` (``floor(u) = upsample * base +
    q``), fraction ``a = u - floor(u)``; its filter ``G[q] + a (G[q + 1] - G[q])`` from the
    table, tap ``c`` on ``x[k + base - c - e_min]`` (zero outside ``x``).
    """
    table, e_min = _phase_taps(upsample)
    out = np.empty(count, dtype=np.complex128)
    for k in range(count):
        u = upsample * start + upsample * (step - 1.0) * k
        f = int(np.floor(u))
        base, q = divmod(f, upsample)
        taps = table[q] + (u - f) * (table[q + 1] - table[q])
        at = k + base - np.arange(taps.size) - e_min
        inside = (at >= 0) & (at < x.size)
        out[k] = np.sum(taps[inside] * x[at[inside]])
    return out


@pytest.mark.parametrize("small_chunks", [False, True])
@pytest.mark.parametrize(
    "start, step, count",
    [(0.0, 1.0, None), (3.37, 1.0, None), (0.5, 1 + 50e-6, None), (40.2, 1 - 50e-6, None),
     (7.9, 1 - 2e-4, None), (10.2, 1 + 2e-4, None), (0.25, 1 + 3e-3, None),
     # Runs of ~12 samples: rows of 64 samples hold several runs.
     (2.5, 1 + 1e-2, 120), (2.5, 1 - 1e-2, 120), (1.7, 1.0, 1)],
)
def test_sample_line_is_the_filter_table_applied_per_position(
    start: float, step: float, count: int | None, small_chunks: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if small_chunks:
        # Chunks of 3 rows and products of 2 rows: every chunk and batch boundary is crossed.
        monkeypatch.setattr(line_sampler, "LINE_CHUNK", 3 * line_sampler._ROW)
        monkeypatch.setattr(line_sampler, "_BATCH_ROWS", 2)
    x = _band_limited(6000, np.random.default_rng(4))
    if count is None:
        count = int((x.size - 1 - start) / step) + 1  # up to the last sample
    ref = _direct_line(x, start, step, count)
    got = sample_line(x, start, step, count)
    assert got.dtype == np.complex64 and got.shape == ref.shape
    assert np.max(np.abs(got - ref)) < 1e-6 * np.max(np.abs(ref))


def test_sample_line_chunks_are_the_line_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_sampler, "LINE_CHUNK", 4 * line_sampler._ROW)
    x = _band_limited(3000, np.random.default_rng(5))
    for step in (1.0, 1 + 3e-4):
        whole = sample_line(x, 1.3, step, 2900)
        chunks = [c.copy() for c in sample_line_chunks(x, 1.3, step, 2900)]
        assert [c.size for c in chunks] == [256] * 11 + [2900 - 11 * 256]
        assert np.array_equal(np.concatenate(chunks), whole)


def test_sample_line_reads_any_precision_alike() -> None:
    """Double-precision input is rounded to single precision first, as a radio's samples."""
    x = _band_limited(3000, np.random.default_rng(6))
    for step in (1.0, 1 - 3e-4):
        got = sample_line(x, 2.2, step, 2900)
        assert np.array_equal(got, sample_line(x.astype(np.complex64), 2.2, step, 2900))
        real = sample_line(x.real, 2.2, step, 2900)
        assert np.array_equal(real, sample_line(x.real + 0j, 2.2, step, 2900))
        assert np.all(real.imag == 0)


@pytest.mark.parametrize(
    "sro_ppm, fading", [(0.0, "none"), (60.0, "none"), (-60.0, "none"), (60.0, "rayleigh")]
)
def test_emulated_timing_is_band_limited_resampling(sro_ppm: float, fading: str) -> None:
    """Noiseless: rx = sample_at(g s, (m - delay) (1 + sro)) times a pure rotator."""
    s = _band_limited(150_000, np.random.default_rng(2))
    em = EmulatorParams(fading=fading, cfo_hz=1500.0, delay_max_samples=40.0, sro_ppm=sro_ppm,
                        tail_samples=5)
    fs = 1e6
    rx, truth = emulate(s, em, 0.0, fs, np.random.default_rng(3))
    ratio = 1 + sro_ppm * 1e-6
    lead = int(np.ceil(truth.delay_samples))
    n_frame = rx.size - lead - em.tail_samples
    m = np.arange(lead, lead + n_frame)
    t = np.clip((m - truth.delay_samples) * ratio, 0.0, s.size - 1)
    ref = sample_at(s * truth.gain.astype(np.complex128), t)
    got = rx[lead : lead + n_frame]
    assert np.max(np.abs(np.abs(got) - np.abs(ref))) < 1e-5
    turn = got * np.conj(ref) / np.abs(ref) ** 2
    step = np.angle(turn[1:] * np.conj(turn[:-1]))
    strong = np.abs(ref[1:] * ref[:-1]) > 0.05 * np.mean(np.abs(ref) ** 2)  # phase well defined
    assert np.allclose(step[strong], 2 * np.pi * truth.cfo_hz / fs, atol=1e-4)
    assert np.all(rx[:lead] == 0) and np.all(rx[lead + n_frame :] == 0)


def _frame_segments(
    src: np.ndarray, start: float, ratio: float, inside: int, n_frame: int
) -> Iterator[tuple[int, np.ndarray]]:
    """The frame as the receiver samples it, in segments of at most ``_CHUNK`` samples: the
    reference the emulator's in-place path is checked against (chunks copied out of the
    sampler's own buffer, the held samples repeated).

    Positions ``start + ratio * k`` for ``k < inside`` (band-limited interpolation,
    :func:`radio.line_sampler.sample_line_chunks`), then the last transmitted sample held up to
    ``n_frame`` samples.

    Yields
    ------
    tuple
        Frame index ``c0`` of the segment's first sample and the segment (``complex64``,
        shape ``(m,)``, ``m <= _CHUNK``), which the consumer may overwrite; it is valid until
        the next segment is requested.
    """
    done = 0
    if inside:
        for piece in sample_line_chunks(src, start, ratio, inside):
            for a in range(0, piece.size, _CHUNK):
                yield done + a, piece[a : a + _CHUNK]
            done += piece.size
    if done < n_frame:
        held = sample_line(src, float(src.size - 1), 1.0, 1)
        for c0 in range(done, n_frame, _CHUNK):
            yield c0, np.repeat(held, min(_CHUNK, n_frame - c0))


def _emulate_segment_by_segment(s: np.ndarray, em: EmulatorParams, noise_var: float,
                                fs: float, rng: np.random.Generator) -> np.ndarray:
    """The resampled path as one thread forms it: the same draws (gains, delay, offset, the
    noise into the buffer, then the carrier phase), then each interpolated segment rotated
    and added to the noise in turn."""
    from radio.waveform_channel import fading_gains

    gain = fading_gains(em, s.size, fs, rng)
    delay = float(rng.uniform(0.0, em.delay_max_samples))
    cfo = em.cfo_hz + float(rng.uniform(-em.cfo_spread_hz, em.cfo_spread_hz))
    ratio = 1.0 + em.sro_ppm * 1e-6
    n_frame = int(np.floor((s.size - 1) / ratio)) + 1
    lead = int(np.ceil(delay))
    rx = np.zeros(lead + n_frame + em.tail_samples, dtype=np.complex64)
    if noise_var > 0:
        complex_gaussian(rx, noise_var, rng)
    rot = _Rotator(cfo / fs, float(rng.uniform(-np.pi, np.pi)))
    src = s.astype(np.complex64) * gain if em.fading != "none" else s
    start = (lead - delay) * ratio
    inside = max(min(n_frame, int(np.floor((s.size - 1 - start) / ratio)) + 1), 0)
    while inside > 0 and start + ratio * (inside - 1) > s.size - 1:
        inside -= 1
    for c0, seg in _frame_segments(src, start, ratio, inside, n_frame):
        seg *= rot.chunk(lead + c0, seg.size)
        rx[lead + c0 : lead + c0 + seg.size] += seg
    return rx


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize(("sro_ppm", "fading", "noise_var"), [
    (0.0, "none", 0.2), (50.0, "none", 0.2), (-30.0, "rayleigh", 0.2), (50.0, "none", 0.0)])
def test_noise_drawn_beside_the_resampling_gives_the_same_samples(
    monkeypatch: pytest.MonkeyPatch, threaded: bool, sro_ppm: float, fading: str,
    noise_var: float,
) -> None:
    """A long frame's noise is drawn in a worker thread while the frame is interpolated:
    bit for bit the samples of forming, rotating and adding each segment after the noise
    (several segments: the frame is longer than ``_CHUNK``), with the worker or without."""
    import radio.waveform_channel as wc

    monkeypatch.setattr(wc, "_PARALLEL_MIN", 0 if threaded else 1 << 40)
    s = _band_limited(3 * _CHUNK + 1234, np.random.default_rng(4))
    em = EmulatorParams(fading=fading, speed_kmh=30.0 if fading != "none" else 0.0,
                        cfo_hz=900.0, cfo_spread_hz=200.0, delay_max_samples=300.0,
                        sro_ppm=sro_ppm, tail_samples=17)
    rx, _ = emulate(s, em, noise_var, 1e6, np.random.default_rng(8))
    ref = _emulate_segment_by_segment(s, em, noise_var, 1e6, np.random.default_rng(8))
    assert rx.dtype == ref.dtype and np.array_equal(rx.view(np.uint32), ref.view(np.uint32))


def test_a_failed_noise_draw_in_the_worker_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    import radio.waveform_channel as wc
    from radio.channel_noise import SeededNoise

    class Broken(SeededNoise):
        def fill(self, out: np.ndarray, noise_var: float, rng: np.random.Generator) -> None:
            raise OSError("no entropy")

    monkeypatch.setattr(wc, "_PARALLEL_MIN", 0)
    em = EmulatorParams(delay_max_samples=10.0, sro_ppm=20.0)
    with pytest.raises(OSError, match="no entropy"):
        emulate(np.ones(5000, np.complex64), em, 0.1, 1e6, np.random.default_rng(1), Broken())


@pytest.mark.parametrize("slow", ["worker", "interpolation"])
def test_segments_rotated_by_either_thread_give_the_same_samples(
    monkeypatch: pytest.MonkeyPatch, slow: str,
) -> None:
    """The worker rotates and adds the segments it is handed once the noise is drawn; the
    interpolating thread, when it is done, takes those still waiting. A slow worker leaves
    most segments to the interpolating thread, a slow interpolation most to the worker.
    Either way bit for bit the samples of forming, rotating and adding after the noise."""
    import threading
    import time
    from collections import Counter

    import radio.waveform_channel as wc

    turned_by: Counter[bool] = Counter()
    turn = wc._Beside._turn

    def counted_turn(self: wc._Beside, rot: _Rotator, segment: tuple[int, int]) -> None:
        in_worker = threading.current_thread() is not threading.main_thread()
        turned_by[in_worker] += 1
        if slow == "worker" and in_worker:
            time.sleep(0.2)
        turn(self, rot, segment)

    def slow_chunks(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        for chunk in sample_line_chunks(*args, **kwargs):  # type: ignore[arg-type]
            time.sleep(0.05)
            yield chunk

    monkeypatch.setattr(wc, "_PARALLEL_MIN", 0)
    monkeypatch.setattr(wc._Beside, "_turn", counted_turn)
    monkeypatch.setattr(line_sampler, "LINE_CHUNK", _CHUNK)  # a segment per chunk
    if slow == "interpolation":
        monkeypatch.setattr(wc, "sample_line_chunks", slow_chunks)
    s = _band_limited(5 * _CHUNK + 321, np.random.default_rng(7))
    em = EmulatorParams(cfo_hz=700.0, delay_max_samples=90.0, sro_ppm=-40.0, tail_samples=9)
    rx, _ = emulate(s, em, 0.3, 1e6, np.random.default_rng(9))
    assert turned_by[slow == "interpolation"] >= 1
    ref = _emulate_segment_by_segment(s, em, 0.3, 1e6, np.random.default_rng(9))
    assert np.array_equal(rx.view(np.uint32), ref.view(np.uint32))


def test_sample_line_chunks_into_a_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Into the caller's buffer: the same chunks, as views of it; an exact-size buffer (no
    room for the last row) is written up to the line's end and not past it."""
    monkeypatch.setattr(line_sampler, "LINE_CHUNK", 4 * line_sampler._ROW)
    x = _band_limited(3000, np.random.default_rng(5))
    for step in (1.0, 1 + 3e-4, 1.02):
        want = [c.copy() for c in sample_line_chunks(x, 1.3, step, 2900)]
        for size in (2900, 2900 + line_sampler._ROW):
            buf = np.full(size + 5, 7.0 + 0j, dtype=np.complex64)
            out = buf[:size]
            got = list(sample_line_chunks(x, 1.3, step, 2900, out=out))
            assert all(np.shares_memory(g, out) for g in got)
            assert [g.size for g in got] == [w.size for w in want]
            assert np.array_equal(out[:2900], np.concatenate(want))
            assert np.all(buf[size:] == 7.0)
