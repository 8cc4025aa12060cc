"""The virtual air (``testbed air``, :mod:`testbed.lab.air`): credited noise, superposition,
link budget, fading, fractional delay and carrier offset, and the real CLI process."""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zmq
from scipy import stats

import testbed.lab.air.timeline as timeline_mod
from radio.fading import FadingProcess, clarke_gains, doppler_hz
from radio.link_budget import SPEED_OF_LIGHT, noise_psd_w_per_hz, sample_noise_power_w
from radio.virtual_wire import BurstHeader, decode_chunk, encode_burst
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_hardware
from testbed.lab.air import VirtualAir, place, read_air_log

ROOT = Path(__file__).resolve().parents[1]
T0 = 1000.0  # true time (s) of air sample 0 in the in-process tests: cfo * t0 is exact
FC = 915e6


def hw_config(tmp_path: Path, paths: list[dict[str, Any]], *, symbol_rate_hz: float = 200e3,
              name: str = "hw.yaml", **air: Any) -> tuple[Path, HardwareConfig]:
    """A virtual hardware config (receiver rx0, one transmitter per path) written to YAML
    and loaded as the CLI loads it; ``fs = 5 symbol_rate_hz``."""
    serials = [p["serial"] for p in paths]
    data = {
        "name": "virtual-test", "link": "usrp", "symbol_rate_hz": symbol_rate_hz,
        "center_freq_hz": FC,
        "usrp": {
            "rx_args": "type=virtual,serial=rx0",
            "tx_args": f"type=virtual,serial={serials[0]}",
            "devices": [{"device": i, "tx_args": f"type=virtual,serial={s}", "tx_gain_db": 10.0,
                         "max_tx_power_w": 0.1} for i, s in enumerate(serials)],
        },
        "virtual_air": {"paths": paths, **air},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path, load_hardware(str(path))


def header(serial: str, t: float, x: np.ndarray, fs: float) -> BurstHeader:
    """The header of burst ``x`` sent by ``serial`` at true time ``t``."""
    return BurstHeader(serial=serial, t_true_s=t, sample_rate_hz=fs, center_freq_hz=FC,
                       gain_db=10.0, n=int(x.size), power_w=float(np.mean(np.abs(x) ** 2)))


def render(air: VirtualAir, n: int, block: int = 1 << 20) -> np.ndarray:
    """The next ``n`` air samples as one ``complex64`` array (rendered in blocks)."""
    out = np.empty(n, dtype=np.complex64)
    for a in range(0, n, block):
        m = min(block, n - a)
        h, y = air.render_chunk(m)
        assert h.n == m and h.t0_true_s == air.t0
        out[a : a + m] = y
    return out


def random_burst(n: int, power_w: float, seed: int) -> np.ndarray:
    """A complex Gaussian burst of mean power about ``power_w`` (W), ``complex64``."""
    g = np.random.default_rng(seed)
    z = (g.standard_normal(n) + 1j * g.standard_normal(n)) * math.sqrt(power_w / 2)
    return z.astype(np.complex64)


# ---------------------------------------------------------------- 1. the credited noise


def test_noise_is_white_gaussian_of_budget_power_aperiodic_and_fresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[int] = []
    real_gaussian = timeline_mod.gaussian

    def spy(shape: int, sigma: float, **kw: Any) -> np.ndarray:
        drawn.append(int(shape))
        return real_gaussian(shape, sigma, **kw)

    monkeypatch.setattr(timeline_mod, "gaussian", spy)
    _, hw = hw_config(tmp_path, [{"serial": "tx0", "attenuation_db": 60.0}], fading_seed=7)
    air = VirtualAir(hw, t0_true_s=T0, warn=lambda m: None)
    n = 10**7
    z = render(air, n)
    # every sample's noise came from the OS-CSPRNG sampler (two normals per sample)
    assert sum(drawn) == 2 * n
    p_expected = sample_noise_power_w(hw.virtual_air.temperature_k,
                                      hw.virtual_air.noise_figure_db, hw.sample_rate_hz)
    zz = z.astype(np.complex128)
    p = float(np.mean(zz.real**2 + zz.imag**2))
    assert abs(p / p_expected - 1) < 0.01
    assert p_expected == pytest.approx(noise_psd_w_per_hz(290.0, 5.0) * hw.sample_rate_hz)
    # Gaussian: KS on a subsample of each quadrature, fourth moments, circularity. The noise
    # is the OS CSPRNG's (it cannot be seeded), so each bound is set for a false failure
    # under 1e-6 per run: KS p > 1e-7 (at 1e-3 it failed one run in a few hundred), which
    # still refuses any other shape of this variance (uniform: D = 0.058, p = 0 in floats at
    # 200,000 samples); the fourth moment and lags at 6 standard errors.
    sigma = math.sqrt(p_expected / 2)
    sub = zz[:: n // 200_000]
    for part in (sub.real, sub.imag):
        assert stats.kstest(part / sigma, "norm").pvalue > 1e-7
    for part in (zz.real, zz.imag):
        m4 = float(np.mean((part / sigma) ** 4))
        assert abs(m4 - 3.0) < 6 * math.sqrt(96.0 / n)  # Var(x^4) = 105 - 9
    assert abs(np.mean(zz.real * zz.imag)) / (sigma**2) < 6 / math.sqrt(n)
    # white: the normalised autocorrelation at lags 1..64, each quadrature within 6 s.e.
    se = 1 / math.sqrt(2 * n)
    for lag in range(1, 65):
        r = np.vdot(zz[:-lag], zz[lag:]) / (n - lag) / p
        assert abs(r.real) < 6 * se and abs(r.imag) < 6 * se, (lag, r)
    # no period: complex64 values repeat only by chance (expected 0.01 pairs in 1e7 draws:
    # (1.37e-8)^2 per pair of float32 pairs); any period below 1e7 repeats them all
    values = z.view(np.uint64)
    repeats = values.size - np.unique(values).size
    assert repeats <= 2
    # not reproducible: the same config (same fading_seed) twice gives other noise
    np.random.seed(0)  # noqa: NPY002 - the global legacy seed must not matter either
    a = render(VirtualAir(hw, t0_true_s=T0), 10_000)
    np.random.seed(0)  # noqa: NPY002 - the global legacy seed must not matter either
    b = render(VirtualAir(hw, t0_true_s=T0), 10_000)
    assert not np.array_equal(a, b)
    corr = abs(np.vdot(a.astype(np.complex128), b)) / np.linalg.norm(a) / np.linalg.norm(b)
    assert corr < 0.05


# ---------------------------------------------------------------- 2. collisions


def test_overlapping_bursts_superpose_and_name_each_other(tmp_path: Path) -> None:
    paths = [{"serial": "tx0", "attenuation_db": 0.0},
             {"serial": "tx1", "attenuation_db": 3.0, "delay_samples": 2.0}]
    _, hw = hw_config(tmp_path, paths, temperature_k=0.001)
    fs = hw.sample_rate_hz
    air = VirtualAir(hw, log_dir=tmp_path / "log", t0_true_s=T0, warn=lambda m: None)
    xa, xb = random_burst(3000, 1e-3, 1), random_burst(2000, 2e-3, 2)
    air.add_burst(header("tx0", T0 + 1000 / fs, xa, fs), xa)   # air 1000 .. 3999
    air.add_burst(header("tx1", T0 + 3000 / fs, xb, fs), xb)   # air 3002 .. 5001
    xc = random_burst(500, 1e-3, 3)
    air.add_burst(header("tx0", T0 + 7000 / fs, xc, fs), xc)   # alone
    y = render(air, 8000).astype(np.complex128)
    expected = np.zeros(8000, dtype=np.complex128)
    expected[1000:4000] += xa
    expected[3002:5002] += math.sqrt(10 ** -0.3) * xb
    expected[7000:7500] += xc
    noise_amp = math.sqrt(air.noise_power_w)
    err = np.abs(y - expected)
    # complex64 rounding of ~0.05 W^0.5 amplitudes, plus a noise far below it
    assert err.max() < 1e-6 + 8 * noise_amp
    overlap = slice(3002, 4000)
    assert np.abs(y[overlap] - expected[overlap]).max() < 1e-6 + 8 * noise_amp
    # neither burst alone explains the overlap
    assert np.abs(y[overlap] - xa[2002:3000]).mean() > 100 * err[overlap].mean()
    summary = air.close()
    bursts, logged_summary = read_air_log(tmp_path / "log" / "air.jsonl")
    assert [b["serial"] for b in bursts] == ["tx0", "tx1", "tx0"]
    assert bursts[0]["overlaps"] == ["tx1"] and bursts[1]["overlaps"] == ["tx0"]
    assert bursts[2]["overlaps"] == []
    assert bursts[1]["start_index"] == pytest.approx(3002.0, abs=1e-6)
    assert bursts[1]["rx_power_w"] == pytest.approx(10 ** -0.3 * bursts[1]["power_w"], rel=1e-5)
    assert logged_summary is not None and logged_summary["bursts"] == 3 == summary["bursts"]
    assert logged_summary["dropped"] == 0 and logged_summary["late"] == 0


def _air_rendered_to_1000(tmp_path: Path) -> tuple[VirtualAir, float, np.ndarray]:
    """One quiet path ``tx0``, 1000 samples already rendered; the air, its rate and a burst
    of 600 samples."""
    _, hw = hw_config(tmp_path, [{"serial": "tx0", "attenuation_db": 0.0}],
                      temperature_k=0.001)
    air = VirtualAir(hw, log_dir=tmp_path, t0_true_s=T0, warn=lambda m: None)
    render(air, 1000)
    return air, hw.sample_rate_hz, random_burst(600, 1e-3, 4)


def test_a_burst_says_how_far_ahead_of_the_air_it_arrived(tmp_path: Path) -> None:
    air, fs, x = _air_rendered_to_1000(tmp_path)
    early = air.add_burst(header("tx0", T0 + 1500 / fs, x, fs), x)   # 500 samples ahead
    assert early["late_to_air_samples"] == 0
    assert early["ahead_of_air_s"] == pytest.approx(500 / fs)


def test_late_past_and_unknown_bursts(tmp_path: Path) -> None:
    air, fs, x = _air_rendered_to_1000(tmp_path)
    rec = air.add_burst(header("tx0", T0 + 700 / fs, x, fs), x)      # 300 samples late
    assert rec["late_to_air_samples"] == 300
    assert rec["ahead_of_air_s"] == pytest.approx(-300 / fs)
    past = air.add_burst(header("tx0", T0 + 100 / fs, x, fs), x)     # ends at 700 < 1000
    assert past["dropped"] == "past"
    unknown = air.add_burst(header("txZ", T0 + 2000 / fs, x, fs), x)
    assert unknown["dropped"] == "unknown_serial"
    assert air.take([b"not json", b""])["dropped"] == "malformed"
    y = render(air, 1000).astype(np.complex128)
    assert np.abs(y[:300] - x[300:]).max() < 1e-6                    # the tail went on air
    s = air.close()
    assert s["late"] == 1 and s["late_samples"] == 300 and s["dropped"] == 3
    assert s["dropped_by_reason"] == {"past": 1, "unknown_serial": 1, "malformed": 1}
    bursts, _ = read_air_log(tmp_path / "air.jsonl")
    assert sorted(b.get("dropped", "") for b in bursts) == ["", "malformed", "past",
                                                            "unknown_serial"]


# ---------------------------------------------------------------- 3. link budget


def test_received_power_over_noise_matches_the_budget(tmp_path: Path) -> None:
    d = 100.0
    paths = [{"serial": "tx0", "attenuation_db": 100.0},
             {"serial": "tx1", "distance_m": d}]
    _, hw = hw_config(tmp_path, paths)
    fs, rs = hw.sample_rate_hz, hw.symbol_rate_hz
    air = VirtualAir(hw, log_dir=tmp_path, t0_true_s=T0, warn=lambda m: None)
    n = 200_000
    fspl_gain = (SPEED_OF_LIGHT / (4 * math.pi * d * FC)) ** 2       # -71.7 dB
    xa = random_burst(n, 1e-3, 5)                                    # 1e-13 W received
    xb = random_burst(n, 1e-3 * 1e-10 / fspl_gain, 6)                # about the same
    air.add_burst(header("tx0", T0 + 100_000 / fs, xa, fs), xa)
    air.add_burst(header("tx1", T0 + 400_000 / fs, xb, fs), xb)
    y = render(air, 700_000).astype(np.complex128)
    pw = y.real**2 + y.imag**2
    p_noise = float(np.mean(np.concatenate([pw[:100_000], pw[650_000:]])))
    n0 = noise_psd_w_per_hz(290.0, 5.0)
    assert p_noise == pytest.approx(n0 * fs, rel=0.02)
    air.close()
    bursts, _ = read_air_log(tmp_path / "air.jsonl")
    for first, x, gain, rec in ((100_000, xa, 1e-10, bursts[0]), (400_000, xb, fspl_gain,
                                                                  bursts[1])):
        power = float(np.mean(np.abs(x.astype(np.complex128)) ** 2))
        measured = float(np.mean(pw[first : first + n])) - p_noise
        budget_db = 10 * math.log10(power * gain / (n0 * fs))
        assert 10 * math.log10(measured / p_noise) == pytest.approx(budget_db, abs=0.2)
        assert rec["path_gain_db"] == pytest.approx(10 * math.log10(gain), abs=1e-9)
        assert rec["rx_power_w"] == pytest.approx(power * gain, rel=1e-5)
        assert rec["budget_snr_db"] == pytest.approx(
            10 * math.log10(power * gain / (n0 * rs)), abs=1e-4)
        assert rec["fading_gain_db"] == 0.0


# ---------------------------------------------------------------- 4. fading


def fading_run(tmp_path: Path, name: str, **air_kw: Any) -> list[dict[str, Any]]:
    """40 bursts of 1 ms spaced 0.1 s from one transmitter at 100 kS/s; their log lines."""
    _, hw = hw_config(tmp_path, [{"serial": "tx0", "attenuation_db": 0.0}],
                      symbol_rate_hz=20e3, name=f"{name}.yaml", **air_kw)
    fs = hw.sample_rate_hz
    air = VirtualAir(hw, log_dir=tmp_path / name, t0_true_s=T0, warn=lambda m: None)
    x = np.full(100, math.sqrt(1e-3), dtype=np.complex64)           # constant envelope
    for i in range(40):
        air.add_burst(header("tx0", T0 + (1000 + i * 10_000) / fs, x, fs), x)
    render(air, 410_000)
    air.close()
    bursts, _ = read_air_log(tmp_path / name / "air.jsonl")
    assert len(bursts) == 40
    return bursts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rayleigh_fading_varies_between_bursts_around_unit_power(tmp_path: Path,
                                                                 seed: int) -> None:
    bursts = fading_run(tmp_path, f"ray{seed}", fading="rayleigh", speed_kmh=20.0,
                        fading_seed=seed)
    g = np.array([b["fading_gain_db"] for b in bursts])
    assert g.std() > 2.0
    assert abs(10 * math.log10(np.mean(10 ** (g / 10)))) < 2.0
    # the fading is on the samples: with a constant envelope, rx = P G mean|h|^2
    for b in bursts:
        assert b["rx_power_w"] == pytest.approx(b["power_w"] * 10 ** (b["fading_gain_db"] / 10),
                                                rel=1e-4)


def test_no_fading_is_exactly_unit_and_rician_fades_less(tmp_path: Path) -> None:
    assert all(b["fading_gain_db"] == 0.0 for b in fading_run(tmp_path, "none"))
    ric = fading_run(tmp_path, "ric", fading="rician", speed_kmh=20.0, rician_k_db=20.0,
                     fading_seed=1)
    g = np.array([b["fading_gain_db"] for b in ric])
    assert 0 < g.std() < 1.0 and abs(g.mean()) < 0.5


def test_fading_process_is_clarke_and_continuous_across_pieces() -> None:
    fd = doppler_hz(20.0, FC)
    t = np.linspace(0.0, 2.0, 4001)
    for k_db in (None, 6.0):
        ref = clarke_gains(t, fd, np.random.default_rng(11), rician_k_db=k_db)
        proc = FadingProcess.draw(fd, np.random.default_rng(11), rician_k_db=k_db)
        assert np.allclose(proc.at(t), ref, atol=1e-12)
    proc = FadingProcess.draw(fd, np.random.default_rng(12))
    fs = 1e6
    whole = proc.uniform(0.25, 300_000, 1 / fs)
    a = proc.uniform(0.25, 100_000, 1 / fs)
    b = proc.uniform(0.25 + 100_000 / fs, 200_000, 1 / fs)
    assert np.allclose(np.concatenate([a, b]), whole, atol=1e-9)
    exact = proc.at(0.25 + np.arange(0, 300_000, 997) / fs)
    assert np.abs(whole[::997] - exact).max() < 1e-3


# ---------------------------------------------------------------- 5. delay and CFO


def test_fractional_delay_and_carrier_offset_land_where_expected(tmp_path: Path) -> None:
    cfo, delay = 1000.0, 0.5
    _, hw = hw_config(tmp_path, [{"serial": "tx0", "attenuation_db": 0.0, "cfo_hz": cfo,
                                  "delay_samples": delay}], temperature_k=0.001)
    fs = hw.sample_rate_hz
    air = VirtualAir(hw, t0_true_s=T0, warn=lambda m: None)
    n, ramp = 4000, 200
    tones = [(-0.2, 1.0), (0.05, 0.7 + 0.3j), (0.3, -0.5j)]           # (f / fs, amplitude)

    def signal_at(tau: np.ndarray) -> np.ndarray:
        return sum(a * np.exp(2j * np.pi * f * tau) for f, a in tones)

    k = np.arange(n)
    w = np.ones(n)
    w[:ramp] = 0.5 - 0.5 * np.cos(np.pi * k[:ramp] / ramp)
    w[-ramp:] = w[:ramp][::-1]
    x = (0.03 * w * signal_at(k)).astype(np.complex64)
    starts = [10_000, 50_000]                                        # two bursts, one phase
    for s in starts:
        air.add_burst(header("tx0", T0 + s / fs, x, fs), x)
    y = render(air, 60_000).astype(np.complex128)
    for s in starts:
        s_true = (T0 + s / fs - T0) * fs + delay                     # fractional air index
        idx = np.arange(s + ramp + 40, s + n - ramp - 40)            # the ramps' taps away
        rot = np.exp(2j * np.pi * cfo * (T0 + idx / fs))
        expected = 0.03 * signal_at(idx - s_true) * rot
        assert np.abs(y[idx] - expected).max() < 1e-3 * 0.03 * 2.2
        # a wrong half sample or no carrier offset would be far off
        assert np.abs(y[idx] - 0.03 * signal_at(idx - s) * rot).max() > 0.1 * 0.03
        no_cfo = 0.03 * signal_at(idx - s_true)
        assert np.abs(y[idx] - no_cfo).max() > 0.1 * 0.03
        # phase slope: y / undelayed-uncorrected signal, per tone, gives delay and CFO
        ratio = y[idx] / no_cfo
        slope = np.polyfit(idx / fs, np.unwrap(np.angle(ratio)), 1)[0] / (2 * np.pi)
        assert slope == pytest.approx(cfo, abs=1.0)
    # cross-correlation: an integer delay lands at exactly its index
    _, hw3 = hw_config(tmp_path, [{"serial": "tx0", "attenuation_db": 0.0,
                                   "delay_samples": 3.0}], temperature_k=0.001, name="d3.yaml")
    air3 = VirtualAir(hw3, t0_true_s=T0, warn=lambda m: None)
    xw = random_burst(1000, 1e-3, 8)
    air3.add_burst(header("tx0", T0 + 2000 / fs, xw, fs), xw)
    y3 = render(air3, 5000)
    corr = np.abs(np.correlate(y3, xw, mode="valid"))
    assert int(np.argmax(corr)) == 2003


def test_place_interpolates_band_limited_signals() -> None:
    k = np.arange(3000)
    x = np.exp(2j * np.pi * 0.12 * k)
    first, y = place(x, 100.25)
    q = first + np.arange(y.size)
    inner = slice(40, -40)
    assert np.abs(y[inner] - np.exp(2j * np.pi * 0.12 * (q - 100.25))[inner]).max() < 1e-3
    first, y = place(x, 100.0000000001)                              # snaps to the grid
    assert first == 100 and np.array_equal(y, x)


# ---------------------------------------------------------------- 6. the CLI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lines_of(stream: Any) -> queue.Queue[str]:
    """A queue filled with the lines of ``stream`` by a reader thread."""
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def start_air(cfg: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "testbed", "air", "--hw", str(cfg), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_cli_streams_a_pushed_burst_and_stops_cleanly(tmp_path: Path) -> None:
    burst_addr = f"tcp://127.0.0.1:{free_port()}"
    stream_addr = f"tcp://127.0.0.1:{free_port()}"
    cfg, hw = hw_config(tmp_path, [{"serial": "tx0", "attenuation_db": 0.0}],
                        symbol_rate_hz=20e3, burst_address=burst_addr,
                        stream_address=stream_addr, render_delay_s=0.3)
    fs = hw.sample_rate_hz
    log_dir = tmp_path / "airlog"
    proc = start_air(cfg, "--log-dir", str(log_dir), "--parent-pid", str(os.getpid()))
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        out = lines_of(proc.stdout)
        first = out.get(timeout=60)
        assert first.startswith("air: ") and burst_addr in first and stream_addr in first
        assert "100000 S/s" in first and "tx0 0.0 dB" in first
        pull.connect(stream_addr)
        push.connect(burst_addr)
        assert pull.poll(30_000), "no chunk from the air"
        h, _ = decode_chunk(pull.recv_multipart())
        assert h.sample_rate_hz == fs
        # a burst 1 s ahead, on the air's sample grid
        k = h.index + int(1.0 * fs)
        x = random_burst(2000, 1e-3, 9)
        t_true = h.t0_true_s + k / fs
        push.send_multipart(encode_burst(header("tx0", t_true, x, fs), x))
        got: dict[int, np.ndarray] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert pull.poll(10_000), "the stream stopped"
            ch, samples = decode_chunk(pull.recv_multipart())
            assert ch.t0_true_s == h.t0_true_s
            got[ch.index] = samples.copy()
            if ch.index + ch.n > k + x.size + 100:
                break
        start = min(got)
        y = np.concatenate([got[i] for i in sorted(got)])
        assert sum(v.size for v in got.values()) == y.size
        assert sorted(got)[-1] - start + got[max(got)].size == y.size  # no gap
        corr = np.abs(np.correlate(y, x, mode="valid"))
        assert int(np.argmax(corr)) + start == k
        seg = y[k - start : k - start + x.size].astype(np.complex128)
        assert np.abs(np.vdot(seg, x)) / np.linalg.norm(seg) / np.linalg.norm(x) > 0.999
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        pull.close(0)
        push.close(0)
        ctx.term()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    bursts, summary = read_air_log(log_dir / "air.jsonl")
    assert len(bursts) == 1 and bursts[0]["serial"] == "tx0"
    assert bursts[0]["start_index"] == pytest.approx(k, abs=0.05)
    assert bursts[0]["late_to_air_samples"] == 0
    assert summary is not None and summary["bursts"] == 1 and summary["chunks_sent"] > 0
    assert json.loads((log_dir / "air.jsonl").read_text().splitlines()[-1])["summary"]


def test_cli_stops_when_its_parent_is_gone_and_refuses_real_radios(tmp_path: Path) -> None:
    cfg, _ = hw_config(tmp_path, [{"serial": "tx0", "attenuation_db": 60.0}],
                       symbol_rate_hz=20e3, burst_address=f"tcp://127.0.0.1:{free_port()}",
                       stream_address=f"tcp://127.0.0.1:{free_port()}")
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    proc = start_air(cfg, "--parent-pid", str(parent.pid))
    try:
        assert lines_of(proc.stdout).get(timeout=60).startswith("air: ")
        parent.kill()
        parent.wait()
        assert proc.wait(timeout=30) == 0
    finally:
        for p in (parent, proc):
            if p.poll() is None:
                p.kill()
                p.wait()
    real = start_air(Path("sim"))
    _, err = real.communicate(timeout=60)
    assert real.returncode == 2
    assert "usrp.rx_args" in err and "virtual" in err and "Traceback" not in err
