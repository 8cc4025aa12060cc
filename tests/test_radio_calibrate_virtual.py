"""``testbed radio calibrate`` through virtual radios: each quantity recovered from the truth
the config sets, within the tolerances of :mod:`testbed.radio_calibration.truth`; the faults
named (a late burst, a PPS latch one second off, a receiver that overflows); the report; and
a run on the written calibration crediting no more channel noise than the measured N0 bound,
itself below the virtual air's true N0.

One measurement per config is shared by the tests of a module-scoped fixture (each is a
virtual air, a receiver and a transmitter per device: ~25 s on two cores).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from radio.units import db_to_ratio
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_hardware
from testbed.core.config.safe_yaml import dump_yaml_text, read_yaml_mapping
from testbed.radio_calibration.measure import CalibrateOptions, Measurement, calibrate
from testbed.radio_calibration.report import write_report
from testbed.radio_calibration.truth import (
    TOLERANCES,
    TruthCheck,
    check_against_truth,
    virtual_truth,
)
from tests.radio_helpers import require_gnuradio

ROOT = Path(__file__).resolve().parents[1]
#: The lab's devices measured: different loss, carrier offset, delay and drift each.
LAB_DEVICES = [0, 3]
#: Receive gains the lab's noise floor is measured at.
LAB_GAINS = [15.0, 25.0]


def _checks(checks: list[TruthCheck], quantity: str) -> list[TruthCheck]:
    out = [c for c in checks if c.quantity == quantity]
    assert out, f"no {quantity} check"
    return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> tuple[HardwareConfig, Measurement]:
    require_gnuradio()
    hw = load_hardware("virtual_lab")
    truth_att = {0: 112.0, 3: 121.0}  # the bench knows its attenuators
    # a one-sided bound at 0.999 lies above the truth once in a thousand calibrations (the
    # default 0.95, the pilots' level, once in twenty: the ledger's failure probability)
    opts = CalibrateOptions(devices=LAB_DEVICES, attenuation_db=dict(truth_att.items()),
                            bursts=16, spacing_s=0.15, noise_s=1.0, stream_s=0.0,
                            rx_gains_db=LAB_GAINS, confidence=0.999)
    m = calibrate(hw, opts, log_dir=tmp_path_factory.mktemp("lab") / "logs")
    return hw, m


@pytest.fixture(scope="module")
def darkroom(tmp_path_factory: pytest.TempPathFactory) -> tuple[HardwareConfig, Measurement]:
    """The darkroom (shared PPS, Rayleigh fading), device 2's host clock 1 s off at its PPS
    latch: it latches the next second."""
    require_gnuradio()
    data = read_yaml_mapping(ROOT / "hw_configs" / "virtual_darkroom.yaml")
    data["usrp"]["devices"][2]["tx_args"] = "type=virtual,serial=edge2,host_clock_error_s=1.0"
    folder = tmp_path_factory.mktemp("darkroom")
    path = folder / "darkroom_pps.yaml"
    path.write_text(dump_yaml_text(data))
    hw = load_hardware(str(path))
    # bursts of 50 ms, two coherence times at 17 Hz of Doppler: their powers spread less
    opts = CalibrateOptions(devices=[0, 2], attenuation_db={0: 113.0, 2: 117.0}, bursts=20,
                            n_symbols=8000, spacing_s=0.1, noise_s=0.5, stream_s=0.0,
                            late_burst=False)
    return hw, calibrate(hw, opts, log_dir=folder / "logs")


# -- each quantity against the virtual truth ----------------------------------------------


def test_tx_power_ref_w_is_recovered_through_the_known_attenuation(
        lab: tuple[HardwareConfig, Measurement]) -> None:
    hw, m = lab
    for c in _checks(check_against_truth(m.calibration, hw), "tx_power_ref_w"):
        assert c.ok, c.line()
        assert c.tolerance == pytest.approx(TOLERANCES["tx_power_rel_static"] * c.truth)
    for d in m.calibration.devices:
        low, ref, high = d.tx_power_ref_w_lower, d.tx_power_ref_w, d.tx_power_ref_w_upper
        assert low is not None and ref is not None and high is not None
        assert low < ref < high
        assert d.gain_offset_db is not None and abs(d.gain_offset_db) < 0.25
        # without the attenuation the power at the receiver says the path loss
        true_loss = {0: 112.0, 3: 121.0}[d.device]
        assert d.path_loss_db == pytest.approx(true_loss, abs=0.25)


def test_the_carrier_offset_is_recovered(lab: tuple[HardwareConfig, Measurement]) -> None:
    hw, m = lab
    checks = _checks(check_against_truth(m.calibration, hw), "cfo_hz")
    assert [c.truth for c in checks] == [350.0, -150.0]
    assert all(c.ok for c in checks), [c.line() for c in checks]


def test_timing_error_and_drift_are_recovered(lab: tuple[HardwareConfig, Measurement]) -> None:
    hw, m = lab
    checks = check_against_truth(m.calibration, hw)
    for c in _checks(checks, "drift_ppm") + _checks(checks, "timing_mean_s"):
        assert c.ok, c.line()
    drifts = {c.device: c for c in _checks(checks, "drift_ppm")}
    assert drifts[0].truth == 1.5 and drifts[3].truth == 2.5
    for d in m.calibration.devices:
        assert d.bursts == 16 and d.drift_ppm_uncertainty is not None
        assert d.drift_ppm_uncertainty < 1.0  # resolves the ppm of an N210's TCXO
        assert d.timing_error_worst_s is not None and d.timing_error_std_s is not None
        # the spread of bursts timed from one mapping is the drift over their span
        assert d.timing_error_std_s < 5e-6
    cal = m.calibration
    assert cal.guard_s is not None
    worst = max(d.timing_error_worst_s or 0.0 for d in cal.devices)
    assert worst < cal.guard_s < worst + 0.05  # covers the bursts seen, plus the mappings


def test_the_noise_floor_and_its_lower_bound_per_gain(
        lab: tuple[HardwareConfig, Measurement]) -> None:
    hw, m = lab
    checks = check_against_truth(m.calibration, hw)
    assert len(_checks(checks, "n0")) == 2 and len(_checks(checks, "n0_lower")) == 2
    for c in _checks(checks, "n0") + _checks(checks, "n0_lower"):
        assert c.ok, c.line()
    rx = m.calibration.receiver
    assert rx is not None and rx.full_scale_w == 1e-3
    true_n0 = virtual_truth(hw).n0_w_per_hz
    for f in rx.noise:
        assert f.n0_lower_w_per_hz is not None and f.n0_lower_w_per_hz <= true_n0
        # per sample in receiver units: the true N0 through the gain, bound below it
        true_sample = true_n0 * hw.sample_rate_hz * db_to_ratio(f.rx_gain_db) / 1e-3
        assert f.n0_sample_lower <= true_sample
        assert f.n0_sample == pytest.approx(true_sample, rel=TOLERANCES["n0_rel"])
    assert [f.rx_gain_db for f in rx.noise] == LAB_GAINS


def test_the_amplifier_limit_is_found_on_the_power_ladder(
        lab: tuple[HardwareConfig, Measurement]) -> None:
    hw, m = lab
    for c in _checks(check_against_truth(m.calibration, hw), "compression_amplitude"):
        assert c.ok and c.measured == 0.04, c.line()  # 0.1 W at 0.02: 0.04 is 6 dB short
    for d in m.calibration.devices:
        assert d.amplitudes == [0.005, 0.01, 0.02, 0.04, 0.08]
        ratio = [p / a**2 for a, p in zip(d.amplitudes, d.rx_powers, strict=True)]
        # linear up to the limit, within the 1 dB criterion (the smallest amplitude of the
        # weakest path is 3 dB above the noise: its power is known to ~10 %)
        assert max(ratio[:3]) / min(ratio[:3]) < 10 ** 0.1


def test_a_changed_truth_fails_the_same_measurement(
        lab: tuple[HardwareConfig, Measurement]) -> None:
    """The tolerances are not met when the truth moves by more than them: each check
    compares with the config, not with itself."""
    hw, m = lab
    data = hw.model_dump(mode="json")
    data["virtual_air"]["noise_figure_db"] = 4.5  # N0 0.5 dB lower: the bound is above it
    for p in data["virtual_air"]["paths"]:
        if p["serial"] == "edge0":
            p["cfo_hz"] += 3 * TOLERANCES["cfo_hz_static"]
        if p["serial"] == "edge3":
            p["attenuation_db"] = 119.0  # the bench's 121 dB attenuator is really 119 dB:
    data["usrp"]["devices"][3]["tx_args"] = "type=virtual,serial=edge3,drift_ppm=7.5"
    data["usrp"]["devices"][0]["tx_args"] = \
        "type=virtual,serial=edge0,drift_ppm=1.5,full_scale_w=1.0"  # 0.08 W, not 0.1 W
    changed = HardwareConfig.model_validate(data)
    failed = {(c.quantity, c.device) for c in check_against_truth(m.calibration, changed)
              if not c.ok}
    assert {("n0", None), ("n0_lower", None), ("cfo_hz", 0), ("drift_ppm", 3),
            ("tx_power_ref_w", 0)} <= failed, failed
    assert all(c.ok for c in check_against_truth(m.calibration, hw))


# -- faults named ---------------------------------------------------------------------


def test_a_late_burst_is_reported_and_read_as_not_sent(
        lab: tuple[HardwareConfig, Measurement]) -> None:
    _, m = lab
    for raw, d in zip(m.devices, m.calibration.devices, strict=True):
        assert raw.late is not None and raw.late.reported and not raw.late.on_air
        assert raw.late.late_count == 1
        assert d.late_burst == "reported"
    assert m.calibration.problems == []


def test_a_pps_latch_one_second_off_is_named(
        darkroom: tuple[HardwareConfig, Measurement]) -> None:
    hw, m = darkroom
    cal = m.calibration
    by_dev = {d.device: d for d in cal.devices}
    assert by_dev[0].pps_seconds_off == 0 and by_dev[2].pps_seconds_off == 1
    pps = [p for p in cal.problems if p.startswith("PPS disagreement")]
    assert len(pps) == 1 and "device 2 (usrp.devices[2].tx_args" in pps[0], cal.problems
    assert "+1 s from the receiver's" in pps[0]
    checks = {(c.quantity, c.device): c for c in check_against_truth(cal, hw)}
    assert checks[("pps_seconds_off", 0)].ok and checks[("pps_seconds_off", 2)].ok
    assert checks[("pps_seconds_off", 2)].truth == 1.0
    # its bursts timed around the second it is off are still found and measured (a deep
    # fade may hide one now and then: noted, not a problem)
    assert by_dev[2].bursts >= 16
    assert [p for p in cal.problems if not p.startswith("PPS disagreement")] == []


def test_the_darkroom_timing_under_a_shared_pps_and_power_under_fading(
        darkroom: tuple[HardwareConfig, Measurement]) -> None:
    hw, m = darkroom
    checks = check_against_truth(m.calibration, hw)
    for q in ("timing_mean_s", "tx_power_ref_w", "cfo_hz", "drift_ppm"):
        for c in _checks(checks, q):
            assert c.ok, c.line()
    fs = hw.sample_rate_hz
    timing = {c.device: c for c in _checks(checks, "timing_mean_s")}
    assert timing[0].truth == pytest.approx(0.2 / fs)
    # a quarter sample, and the resolution of float64 UNIX times the virtual devices use
    assert timing[0].tolerance == pytest.approx(0.25 / fs + 2 * 2**-22)
    assert m.calibration.guard_s == 0.5e-3
    for d in m.calibration.devices:
        # fading: the power's interval is wide and the ladder cannot show compression
        low, ref, high = d.tx_power_ref_w_lower, d.tx_power_ref_w, d.tx_power_ref_w_upper
        assert low is not None and ref is not None and high is not None
        assert (high - low) / ref > 0.1
        assert d.compression_amplitude is None
        assert any(u.startswith(f"compression of device {d.device}: its received power "
                                "varies") for u in m.calibration.unmeasured)
        assert any(u.startswith(f"tx_power_ref_w of device {d.device} through rayleigh "
                                "fading: known only to its interval")
                   for u in m.calibration.unmeasured)
        assert d.clock_offset_s is not None and d.pps_seconds_off is not None
        assert abs(d.clock_offset_s - d.pps_seconds_off) < 1e-5


def test_a_receiver_made_to_overflow_is_named_by_the_command(tmp_path: Path) -> None:
    require_gnuradio()
    data = read_yaml_mapping(ROOT / "hw_configs" / "virtual_lab.yaml")
    data["usrp"]["rx_args"] = "type=virtual,serial=rx0,gaps=2,gap_samples=5000,gap_every_s=1.5"
    path = tmp_path / "overflowing.yaml"
    path.write_text(dump_yaml_text(data))
    out = tmp_path / "cal" / "CAL.yaml"
    res = subprocess.run(
        [sys.executable, "-m", "testbed", "radio", "calibrate", str(path), "--devices", "1",
         "--bursts", "5", "--noise-seconds", "0.5", "--stream-seconds", "5",
         "--no-late-burst", "--attenuation-db", "116", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    result = json.loads(res.stdout)
    assert not result["ok"]
    rx = result["calibration"]["receiver"]
    assert rx["overflows"] == 2 and rx["lost_samples"] == 10_000
    named = [p for p in result["calibration"]["problems"] if p.startswith("receiver overflow")]
    assert len(named) == 1 and "dropped samples 2 time(s), 10000 samples lost" in named[0]
    assert "type=virtual,serial=rx0,gaps=2" in named[0]
    assert out.is_file() and out.with_suffix(".md").is_file()
    hw = load_hardware(str(path))
    assert load_hardware(str(path), [f"calibration={out}"]).calibration is not None
    assert hw.calibration is None


# -- the report, and a run on the written calibration --------------------------------------


def test_the_report_has_a_figure_per_measurement(
        lab: tuple[HardwareConfig, Measurement], tmp_path: Path) -> None:
    hw, m = lab
    checks = check_against_truth(m.calibration, hw)
    files = write_report(m, tmp_path / "CAL.md", checks=checks, cal_path=tmp_path / "CAL.yaml")
    md = files[0].read_text()
    assert md.startswith("# Radio calibration: virtual_lab (virtual radios)")
    figures = [f for f in files[1:]]
    assert {f.name for f in figures} == {"power_ladder.png", "timing.png", "cfo.png",
                                         "noise.png"}
    for f in figures:
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(CAL-figures/{f.name})" in md
    assert "## Against the virtual truth" in md and "FAIL" not in md
    assert md.count("| reported |") == 2


def test_a_run_credits_no_more_than_the_calibrated_n0_bound(
        lab: tuple[HardwareConfig, Measurement], tmp_path: Path) -> None:
    """``testbed run`` (channel-dp, full channel credit) on virtual_lab including the
    calibration written from the measurement, its N0 bound halved (a conservative bench):
    every credited N0 is that bound, below the air's true N0 (3 devices, one round)."""
    hw, m = lab
    rx = m.calibration.receiver
    assert rx is not None
    floor = rx.floor_at(hw.usrp.rx_gain_db)
    assert floor is not None
    cap = floor.n0_sample_lower / 2
    noise = [f.model_copy(update={"n0_sample_lower": cap}) if f is floor else f
             for f in rx.noise]
    cal = m.calibration.model_copy(update={"receiver": rx.model_copy(update={"noise": noise})})
    (tmp_path / "CAL.yaml").write_text(dump_yaml_text(cal.model_dump(mode="json")))
    hw_path = tmp_path / "hw.yaml"
    hw_path.write_text((ROOT / "hw_configs" / "virtual_lab.yaml").read_text()
                       + "\ncalibration: CAL.yaml\n")
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "testbed", "run",
         str(ROOT / "testbed" / "config" / "private-fedsgd.yaml"), "--hw", str(hw_path),
         "--set", "rounds=1", "--set", "devices=3", "--set", "train_samples=3000",
         "--set", "batch_size=256", "--set", "eval_samples=200", "--set", "scheme=channel-dp",
         "--set",
         "privacy.trusted_channel_noise=1", "--out", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "calibrat" not in res.stdout.splitlines()[0]  # current: nothing to warn of
    true_sample = virtual_truth(hw).n0_w_per_hz * hw.sample_rate_hz \
        * db_to_ratio(hw.usrp.rx_gain_db) / 1e-3
    events = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    credited = [2 * e["n0"] for e in events if e.get("trusted_channel_noise")]
    assert len(credited) == 3
    for n0 in credited:
        assert n0 == pytest.approx(cap, rel=1e-12)
        assert n0 <= true_sample
    summary = json.loads((out / "summary.json").read_text())
    assert summary["radio_calibration"]["state"] == "current"
    assert math.isclose(summary["radio_calibration"]["n0_cap"], cap)
    assert "radio calibration: measured" in (out / "report.md").read_text()
