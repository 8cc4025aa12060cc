"""Scheme ``aircomp`` over the waveform links: pilots, one superposed frame per round, the
accountant's bounds from the pilots, and the aggregation error against the symbol link."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from radio.aircomp_air import (
    PILOT_SYMBOLS,
    alignment_margin,
    decode_sum,
    draw_paths,
    estimate_pilot,
    expected_radius,
    noise_gain_lower,
    pilot_sequence,
    render,
)
from radio.link import Reception
from radio.modem import demodulate, modulate
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.links import waveform_params
from testbed.runner import run_experiment
from tests.radio_helpers import require_gnuradio
from tests.test_aircomp_run import SETS, N, _lines, make_idx_dataset

#: A static channel and a shared frequency reference (the sim config's emulator draws a
#: random CFO per upload otherwise).
SHARED_REFERENCE = ["waveform.cfo_spread_hz=0"]


def _run(tmp_path: Path, link: str, extra: list[str] = ()) -> tuple[dict, Path]:
    data = make_idx_dataset(tmp_path / "data", n_train=2000, n_test=200)
    sets = [s for s in SETS if not s.startswith(("link=", "rounds="))]
    cfg = load_experiment(None, [*sets, f"link={link}", "rounds=3", "eval_every=3",
                                 f"data_dir={data}", *extra])
    out = tmp_path / link
    return run_experiment(cfg, out, hw=load_hardware("sim", SHARED_REFERENCE)), out


def _nmse_db(out: Path) -> float:
    """Mean aggregation NMSE over the rounds (dB)."""
    values = [line["aircomp"]["nmse"] for line in _lines(out / "metrics.jsonl")]
    return 10 * math.log10(float(np.mean(values)))


def _check_run(summary: dict, out: Path) -> None:
    assert summary["status"] == "completed"
    events = [e for e in _lines(out / "ledger.jsonl") if e.get("type") == "record-aircomp/v1"]
    assert len(events) == 3 * N
    # pilot-estimated paths: own bound above 1, the others' credited below 1, and the
    # bounds' failure probability counted
    assert all(e["gain_ratio_upper"] > 1.0 for e in events)
    assert all(s < e["sigma"] for e in events for s in e["others_noise_std"])
    assert all(e["bound_failure_prob"] > 0 for e in events)
    for line in _lines(out / "metrics.jsonl"):
        air = line["aircomp"]
        assert air["participants"] == N and air["slots"] == 1 and not air["lost"]
        assert air["pilot_airtime_s"] > 0 and air["tdma_airtime_s"] == pytest.approx(
            N * air["airtime_s"], rel=0.1)  # the slot also carries the 256-symbol probe
        # the probe measures the slot's aggregation error without the values (the lab's way)
        assert abs(air["probe_nmse_db"] - air["nmse_db"]) < 3.0
    for dev in summary["privacy"]["devices"]:
        assert dev["epsilon"] <= 2.0 and dev["delta_total"] > 1e-5


def test_waveform_link_one_frame_per_round_within_3_db_of_the_symbol_link(
        tmp_path: Path) -> None:
    symbol, s_out = _run(tmp_path, "symbol")
    wave, w_out = _run(tmp_path, "waveform")
    _check_run(wave, w_out)
    # the same SNR (20 dB), the same values: the pilots' estimation and the burst timing
    # error may cost at most 3 dB of aggregation error (measured: about 1.5 dB)
    assert abs(_nmse_db(w_out) - _nmse_db(s_out)) <= 3.0


@pytest.mark.gnuradio
def test_gnuradio_link_one_frame_per_round_within_3_db_of_the_symbol_link(
        tmp_path: Path) -> None:
    require_gnuradio()
    symbol, s_out = _run(tmp_path, "symbol")
    gr, g_out = _run(tmp_path, "gnuradio")
    _check_run(gr, g_out)
    assert abs(_nmse_db(g_out) - _nmse_db(s_out)) <= 3.0


@pytest.mark.parametrize(("hw", "words"), [
    (["waveform.speed_kmh=20"], "waveform.speed_kmh: got 20.0; scheme aircomp on the waveform"),
    (["waveform.cfo_hz=100"], "waveform.cfo_hz: got 100.0"),
    ([], "waveform.cfo_spread_hz: got 500.0"),
])
def test_a_channel_the_pilots_cannot_hold_is_refused(tmp_path: Path, hw: list[str],
                                                     words: str) -> None:
    cfg = load_experiment(None, [*SETS, "link=waveform"])
    with pytest.raises(ConfigError, match=words):
        run_experiment(cfg, tmp_path / "run", hw=load_hardware("sim", hw))
    assert not (tmp_path / "run").exists()


def test_fading_is_refused_on_the_waveform_links(tmp_path: Path) -> None:
    cfg = load_experiment(None, [*SETS, "link=waveform", "fading=rayleigh"])
    with pytest.raises(ConfigError, match="fading: got 'rayleigh'"):
        run_experiment(cfg, tmp_path / "run", hw=load_hardware("sim", SHARED_REFERENCE))


# --- the pieces, against closed forms and independent computations ----------------------

def _wf():  # type: ignore[no-untyped-def]
    return waveform_params(load_hardware("sim"))


def _reception(samples: np.ndarray, n: int) -> Reception:
    d = demodulate(_wf(), samples, n, 0.9, known_cfo_hz=0.0)
    return Reception(d.payload, d.state, samples.size, samples.size, 0.0)


def _noise(n: int, n0: float, rng: np.random.Generator) -> np.ndarray:
    return math.sqrt(n0 / 2) * (rng.normal(size=n) + 1j * rng.normal(size=n))


def test_pilot_interval_covers_the_gain_at_its_confidence() -> None:
    """At confidence 0.9 the interval |h_hat| -+ r on |h| holds in at least 90 % of pilots
    (it is conservative: measured 100 % here), and the radius is what expected_radius says
    within the residual's spread."""
    rng = np.random.default_rng(5)
    wf, p = _wf(), pilot_sequence()
    frame = modulate(wf, p)[0]
    n0, hits, radii = 0.05, 0, []
    for _ in range(40):
        paths = draw_paths(np.array([0.7]), 0.0, rng)
        s = render({0: frame}, {0: 1.0}, paths)
        est = estimate_pilot(_reception(s + _noise(s.size, n0, rng), PILOT_SYMBOLS), p)
        lo, hi = est.abs_bounds()
        hits += lo <= 0.7 <= hi
        radii.append(est.radius / 0.7)
        assert est.failure_prob == pytest.approx(0.1)
    assert hits >= 36
    assert np.median(radii) == pytest.approx(expected_radius(0.49 / n0, 0.9), rel=0.15)


def test_known_reference_keeps_each_pilots_phase_for_the_slot() -> None:
    """Three paths, noiseless: pre-equalized with their pilots' estimates, the superposed
    frame decodes to the sum of the values (the phases line up)."""
    rng = np.random.default_rng(2)
    wf, p = _wf(), pilot_sequence()
    paths = draw_paths(np.array([1.0, 0.5, 0.8]), 0.0, rng)
    h_hat = {j: estimate_pilot(_reception(render({j: modulate(wf, p)[0]}, {j: 1.0}, paths),
                                          PILOT_SYMBOLS), p).h_hat for j in range(3)}
    for j in range(3):
        assert abs(h_hat[j] / paths.gain[j] - 1) < 2e-3
    x = {j: 0.3 * (rng.normal(size=800) + 1j * rng.normal(size=800)) for j in range(3)}
    c = 0.4
    y = decode_sum(_reception(render({j: modulate(wf, x[j])[0] for j in x},
                                     {j: c / h_hat[j] for j in x}, paths), 800), c)
    truth = sum(x.values())
    assert np.linalg.norm(y - truth) / np.linalg.norm(truth) < 0.01


def _raised_cosine(t: np.ndarray, beta: float) -> np.ndarray:
    """The raised-cosine pulse at ``t`` symbols (closed form, with its removable points)."""
    den = 1.0 - (2.0 * beta * t) ** 2
    edge = np.isclose(den, 0.0)
    safe = np.where(edge, 1.0, den)
    out = np.sinc(t) * np.cos(np.pi * beta * t) / safe
    return np.where(edge, np.pi / 4 * np.sinc(1 / (2 * beta)), out)


def test_noise_gain_lower_bounds_the_timing_error_map() -> None:
    """Independent computation: the singular values of principal submatrices of the
    raised-cosine response sampled at the worst relative offset (closed-form pulse) lie in
    ``[kappa, 1]``."""
    wf = _wf()
    sps, beta = wf.samples_per_symbol, wf.rolloff
    rng = np.random.default_rng(0)
    for e in (0.05, 0.2, 0.4):
        kappa = noise_gain_lower(e, sps, beta)
        delta = 2 * e / sps  # symbols
        n = 160
        k = np.arange(n)
        toeplitz = _raised_cosine(k[:, None] - k[None, :] + delta, beta)
        for _ in range(3):
            keep = np.sort(rng.choice(n, 120, replace=False))
            sv = np.linalg.svd(toeplitz[np.ix_(keep, keep)], compute_uv=False)
            assert sv.min() >= kappa - 1e-9
            assert sv.max() <= 1.0 + 1e-2  # a finite section of the pulse's tails
    assert noise_gain_lower(0.0, sps, beta) == 1.0
    with pytest.raises(ValueError, match="leaves no noise to credit"):
        noise_gain_lower(2.0, sps, beta)


def test_alignment_margin_closed_form() -> None:
    r = 1.1 * expected_radius(100.0, 1 - 1e-6)
    assert alignment_margin(100.0, 1 - 1e-6, 0.9) == pytest.approx((0.9 * (1 - r) / (1 + r)) ** 2)
    assert alignment_margin(1000.0, 1 - 1e-6, 1.0) > alignment_margin(100.0, 1 - 1e-6, 1.0)


def test_the_shares_meet_the_target_with_the_margin() -> None:
    from testbed.core.privacy.analysis.aircomp_noise import share_sigma

    z, n, m, clip, batch = 1.3, 10, 0.8, 1.0, 50.0
    s = share_sigma(z, devices=n, colluding=2, example_clip=clip, expected_batch=batch,
                    others_margin=m)
    # own share plus the 7 credited others at margin m: exactly z
    assert math.sqrt(s**2 * (1 + 7 * m)) * batch / clip == pytest.approx(z)


def test_lost_pilots_lose_the_round_not_the_run(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pilot of round 1 is lost: the round has no slot (nobody transmits, nothing is
    charged, the model stays), each device's entry says why, and the run goes on."""
    from radio.frame_link import FrameLink
    from radio.link import LinkError

    real = FrameLink.receive

    def lossy(self, carried, n_payload, *, device, round_index):  # type: ignore[no-untyped-def]
        if round_index == 1 and n_payload == PILOT_SYMBOLS:
            raise LinkError(f"pilot of device {device} lost (test)")
        return real(self, carried, n_payload, device=device, round_index=round_index)

    monkeypatch.setattr(FrameLink, "receive", lossy)
    summary, out = _run(tmp_path, "waveform")
    assert summary["status"] == "completed"
    lines = _lines(out / "metrics.jsonl")
    assert lines[1]["uploads"] == 0 and lines[1]["aircomp"]["pilots_lost"] == N
    assert {d["skipped"] for d in lines[1]["devices"]} == {"pilot lost"}
    assert lines[0]["uploads"] == lines[2]["uploads"] == N
    events = [e for e in _lines(out / "ledger.jsonl") if e.get("type") == "record-aircomp/v1"]
    assert sorted({e["round"] for e in events}) == [0, 2]


def test_binding_margin_is_the_alignment_margin_at_one_snr_and_follows_the_least_certain() -> None:
    from radio.aircomp_air import binding_margin

    c, kappa = 1 - 1e-8, 0.97
    assert binding_margin([100.0] * 5, c, kappa, 4) == pytest.approx(
        alignment_margin(100.0, c, kappa))
    # closed form with two SNRs: the weakest device's own radius against the others'
    snrs = [100.0, 50.0, 100.0, 100.0]
    r = [1.1 * expected_radius(x, c) for x in snrs]
    want = kappa**2 * ((1 - r[0]) / (1 + r[1])) ** 2
    assert binding_margin(snrs, c, kappa, 3) == pytest.approx(want)
    # between the margins at the weakest SNR and at the best one
    assert alignment_margin(50.0, c, kappa) < binding_margin(snrs, c, kappa, 3) \
        < alignment_margin(100.0, c, kappa)
    # the gate withholds the largest shares: the credited others are the least certain
    mixed = [100.0, 50.0, 60.0, 400.0]
    r = [1.1 * expected_radius(x, c) for x in mixed]
    assert binding_margin(mixed, c, kappa, 1) == pytest.approx(
        kappa**2 * ((1 - r[2]) / (1 + r[1])) ** 2)
    with pytest.raises(ValueError, match="cannot bound"):
        binding_margin([1e-4, 100.0], c, kappa, 1)


def test_virtual_radios_calibrate_the_shares_at_each_budgeted_path() -> None:
    """On virtual radios the noise shares are calibrated for each path's link budget
    (attenuations 116 to 119 dB: 20 to 17 dB), not the config's ``snr_db`` (20 dB for all):
    the shares calibrated at 20 dB spent the 900-round job's budget 12 rounds early."""
    from radio.aircomp_air import binding_margin
    from radio.link_budget import budget_snr_db
    from testbed.core.config.aircomp_checks import aircomp_margin, expected_snrs_db
    from testbed.core.config.hardware import virtual_budget_snr_db

    hw_path = "hw_configs/virtual_lab_aircomp_10.yaml"
    hw = load_hardware(hw_path)
    cfg = load_experiment("testbed/config/aircomp-fedsgd.yaml",
                          ["devices=10", f"hw_config={hw_path}", "link=usrp"])
    assert cfg.snr_db_per_device() == [20.0] * 10
    # device 3's path: 119 dB; 0.1 W of unit-power symbols at 200 kBd, 290 K, NF 5 dB
    expected = budget_snr_db(0.1 * 10 ** (-119.0 / 10), 200e3, 290.0, 5.0)
    assert virtual_budget_snr_db(hw, 3) == pytest.approx(expected)
    assert 16.5 < expected < 17.5
    snrs = expected_snrs_db(cfg, hw, "usrp")
    assert snrs[3] == pytest.approx(expected) and min(snrs) == pytest.approx(expected)
    assert max(snrs) == pytest.approx(expected + 3.0)  # the 116 dB paths
    w = hw.waveform
    kappa = noise_gain_lower(w.aircomp_timing_error_samples, w.samples_per_symbol, w.rolloff)
    margin = aircomp_margin(cfg, hw)
    conf = cfg.n0_confidence()
    assert margin == pytest.approx(binding_margin([10 ** (x / 10) for x in snrs], conf,
                                                  kappa, 9))
    # below the margin at the config's 20 dB, above the one at the weakest path for all
    assert alignment_margin(10 ** (expected / 10), conf, kappa) < margin \
        < alignment_margin(100.0, conf, kappa)
    # off the usrp link the configured snr_db stands
    wave = load_experiment("testbed/config/aircomp-fedsgd.yaml",
                           ["devices=10", f"hw_config={hw_path}", "link=waveform"])
    assert expected_snrs_db(wave, hw, "waveform") == [20.0] * 10
    assert aircomp_margin(wave, hw) == pytest.approx(alignment_margin(100.0, conf, kappa))
    assert virtual_budget_snr_db(load_hardware("sim"), 0) is None
