"""``testbed radio calibrate`` without flowgraphs: the calibration section and its include,
the estimators against synthetic truth, the truth checks, how runs use a calibration, the
command's input checks and its one-line failure on a bench config without radios.

The measurements through virtual radios are in ``tests/test_radio_calibrate_virtual.py``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from aggregator.outcome import outcome_line
from radio.calibration.estimates import (
    compression_amplitude,
    exponential_mean_interval,
    fit_drift,
    guard_needed,
    mean_interval,
    noise_floor,
    whole_seconds_off,
)
from radio.link import ChannelState
from radio.uhd_probe import LOOPBACK_ONLY_ENV, ProbeResult
from testbed.core.calibration_status import (
    calibration_status,
    calibration_summary,
    cap_channel_state,
    train_allowance,
)
from testbed.core.config.calibration import (
    Calibration,
    DeviceCalibration,
    NoiseFloor,
    ReceiverCalibration,
)
from testbed.core.config.errors import ConfigError
from testbed.core.config.hardware import HardwareConfig, device_radio
from testbed.core.config.loader import load_hardware
from testbed.core.config.safe_yaml import dump_yaml_text
from testbed.radio_calibration.measure import (
    CalibrateOptions,
    RadiosMissing,
    calibrate,
    transmitters,
)
from testbed.radio_calibration.truth import TOLERANCES, check_against_truth, virtual_truth

ROOT = Path(__file__).resolve().parents[1]


def bench_copy(tmp_path: Path, name: str) -> Path:
    """``hw_configs/<name>.yaml`` with its 192.168.10.x addresses on 127.0.0.x."""
    text = (ROOT / "hw_configs" / f"{name}.yaml").read_text().replace("192.168.10.", "127.0.0.")
    path = tmp_path / f"{name}_loopback.yaml"
    path.write_text(text)
    return path


def truthful_calibration(hw: HardwareConfig, **changes: object) -> Calibration:
    """A calibration holding exactly ``hw``'s virtual truth (what a perfect bench finds)."""
    truth = virtual_truth(hw)
    fs = hw.sample_rate_hz
    full_scale = 1e-3
    gain = hw.usrp.rx_gain_db
    n0_sample = truth.n0_w_per_hz * fs * 10 ** (gain / 10) / full_scale
    devices = []
    for e in hw.usrp.devices:
        t = truth.devices[e.device]
        ladder = [0.005, 0.01, 0.02, 0.04, 0.08]
        past = [a for a in ladder if a > t.compression_amplitude * 10 ** 0.05]
        devices.append(DeviceCalibration(
            device=e.device, tx_args=e.tx_args, tx_gain_db=e.tx_gain_db,
            tx_amplitude=hw.usrp.tx_amplitude, attenuation_db=10.0,
            tx_power_ref_w=min(t.tx_power_ref_w, t.max_power_w),
            tx_power_ref_w_lower=0.099, tx_power_ref_w_upper=0.101,
            configured_tx_power_ref_w=hw.tx_power_ref_w, amplitudes=ladder,
            rx_powers=[1.0] * len(ladder), compression_amplitude=min(past),
            cfo_hz=t.cfo_hz, timing_error_mean_s=t.delay_s, bursts=20,
            clock_offset_uncertainty_s=1e-3, drift_ppm=t.drift_ppm,
            drift_ppm_uncertainty=0.05, pps_seconds_off=t.pps_seconds_off))
    rx = ReceiverCalibration(
        rx_args=hw.usrp.rx_args, full_scale_w=full_scale,
        noise=[NoiseFloor(rx_gain_db=gain, n0_w_per_hz=truth.n0_w_per_hz,
                          n0_lower_w_per_hz=truth.n0_w_per_hz * 0.99, n0_sample=n0_sample,
                          n0_sample_lower=n0_sample * 0.99, samples=10**6, confidence=0.95)])
    base = Calibration(written_utc=datetime.now(timezone.utc), hw_config=hw.name, radios="virtual",
                       sample_rate_hz=fs, center_freq_hz=hw.center_freq_hz, devices=devices,
                       receiver=rx, guard_s=1e-3)
    return base.model_copy(update=changes)


def _write_with_calibration(tmp_path: Path, cal: Calibration, name: str = "virtual_lab",
                            extra: str = "") -> Path:
    (tmp_path / "cal").mkdir(parents=True, exist_ok=True)
    (tmp_path / "cal" / "CAL.yaml").write_text(dump_yaml_text(cal.model_dump(mode="json")))
    text = (ROOT / "hw_configs" / f"{name}.yaml").read_text()
    path = tmp_path / f"{name}_cal.yaml"
    path.write_text(text + f"\ncalibration: cal/CAL.yaml\n{extra}")
    return path


# -- the section and its include ---------------------------------------------------------


def test_the_include_is_read_beside_the_config_and_embedded(tmp_path: Path) -> None:
    hw0 = load_hardware("virtual_lab")
    cal = truthful_calibration(hw0)
    path = _write_with_calibration(tmp_path, cal)
    hw = load_hardware(str(path))
    assert hw.calibration is not None
    assert hw.calibration.source == str((tmp_path / "cal" / "CAL.yaml").resolve())
    assert hw.calibration.devices[1].cfo_hz == -820.0
    # a resolved config written elsewhere carries the calibration itself
    copy = tmp_path / "elsewhere" / "hw.yaml"
    copy.parent.mkdir()
    copy.write_text(dump_yaml_text(hw.model_dump(mode="json")))
    again = load_hardware(str(copy))
    assert again.calibration == hw.calibration


def test_a_missing_include_names_the_key_the_value_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "hw.yaml"
    path.write_text((ROOT / "hw_configs" / "virtual_lab.yaml").read_text()
                    + "\ncalibration: nowhere/CAL.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_hardware(str(path))
    text = str(err.value)
    assert "'calibration'" in text and "nowhere/CAL.yaml" in text
    assert str(tmp_path / "nowhere" / "CAL.yaml") in text and "allowed:" in text


def test_a_bad_calibration_value_is_refused_naming_its_key(tmp_path: Path) -> None:
    hw0 = load_hardware("virtual_lab")
    path = _write_with_calibration(tmp_path, truthful_calibration(hw0))
    cal = tmp_path / "cal" / "CAL.yaml"
    cal.write_text(cal.read_text().replace("guard_s: 0.001", "guard_s: -0.5"))
    with pytest.raises(ConfigError, match=r"calibration\.guard_s"):
        load_hardware(str(path))
    cal.write_text(dump_yaml_text({**truthful_calibration(hw0).model_dump(mode="json"),
                                   "written_utc": "2026-01-01T00:00:00"}))
    with pytest.raises(ConfigError, match=r"calibration\.written_utc.*zone"):
        load_hardware(str(path))


def test_a_lower_bound_above_its_estimate_is_refused() -> None:
    with pytest.raises(ValueError, match="lower bound above its estimate"):
        NoiseFloor(rx_gain_db=15, n0_w_per_hz=1e-20, n0_lower_w_per_hz=2e-20, n0_sample=1.0,
                   n0_sample_lower=0.5, samples=10, confidence=0.95)


# -- estimators against synthetic truth --------------------------------------------------


def test_the_noise_lower_bound_covers_the_true_power_at_its_level() -> None:
    rng = np.random.default_rng(45)
    true_power, misses, errors = 3.7e-10, 0, []
    for _ in range(200):
        n = 50_000
        y = math.sqrt(true_power / 2) * (rng.standard_normal(n) + 1j * rng.standard_normal(n))
        est = noise_floor([y[:32_000], y[32_000:]], confidence=0.95, block=2_000)
        misses += est.lower > true_power
        errors.append(est.power / true_power - 1)
        assert est.lower <= est.power and est.samples == 50_000 and est.blocks == 25
    assert misses <= 20, misses  # 5 % expected: 10 of 200
    assert abs(float(np.mean(errors))) < 0.003
    with pytest.raises(ValueError, match="at least 2"):
        noise_floor([np.ones(15_000, complex)])


def test_the_power_interval_through_rayleigh_fading_covers_the_mean() -> None:
    """Burst powers through Rayleigh fading are exponential: the interval from that law
    covers the true mean at its level, where a Student-t interval on 20 values does not."""
    rng = np.random.default_rng(3)
    exp_miss = t_miss = 0
    for _ in range(2000):
        x = rng.exponential(0.1, 20)
        e, t = exponential_mean_interval(x), mean_interval(x)
        exp_miss += not e.lower <= 0.1 <= e.upper
        t_miss += not t.lower <= 0.1 <= t.upper
    assert exp_miss <= 140, exp_miss  # 5 %: 100 of 2000
    assert t_miss > 1.3 * exp_miss, (t_miss, exp_miss)


def test_the_drift_fit_recovers_a_clock_rate_from_arrivals() -> None:
    rng = np.random.default_rng(7)
    for drift in (-2.0, 0.5, 2.5, 20.0):
        tx = np.arange(20) * 0.1
        rx = 3.0 + tx / (1 + drift * 1e-6) + rng.normal(0, 1e-7, tx.size)
        fit = fit_drift(tx, rx)
        assert abs(fit.drift_ppm - drift) <= max(0.1, fit.uncertainty_ppm), (drift, fit)
        assert 0 < fit.uncertainty_ppm < 0.5
    with pytest.raises(ValueError, match="spread over time"):
        fit_drift([1.0, 1.0, 1.0], [0.0, 0.1, 0.2])


def test_compression_is_the_first_amplitude_1_db_short_of_a_squared() -> None:
    a = np.array([0.005, 0.01, 0.02, 0.04, 0.08])
    linear = 3.0 * a**2
    assert compression_amplitude(a, linear) is None
    limited = np.minimum(linear, 3.0 * 0.025**2)  # the amplifier's limit at a = 0.025
    assert compression_amplitude(a, limited) == 0.04
    assert compression_amplitude(a[::-1], limited[::-1]) == 0.04  # order does not matter
    # a point near the noise floor, measured 1.5 dB high, does not anchor the a^2 line
    noisy = limited.copy()
    noisy[0] *= 10 ** 0.15
    assert compression_amplitude(a, noisy) == 0.01  # anchored on it: a false compression
    assert compression_amplitude(a, noisy, snr_db=[3.0, 9.0, 15.0, 21.0, 27.0]) == 0.04
    with pytest.raises(ValueError, match="> 0"):
        compression_amplitude([0.01, 0.02], [1.0, 0.0])


def test_whole_seconds_guard_and_intervals() -> None:
    assert whole_seconds_off(1.7e9 + 1.0002, 1.7e9 + 0.0001) == 1
    assert whole_seconds_off(-0.0004, 0.0003) == 0
    assert guard_needed([1e-6, 2e-6], shared_time=True) == 0.5e-3
    assert guard_needed([3e-3], shared_time=False, mapping_uncertainty_s=1e-3) == \
        pytest.approx(4.2e-3)
    iv = mean_interval([1.0, 2.0, 3.0], 0.95)
    assert iv.mean == 2.0 and iv.lower < 2.0 < iv.upper and iv.n == 3
    with pytest.raises(ValueError, match="finite"):
        mean_interval([1.0, math.nan])


# -- the truth checks --------------------------------------------------------------------


def test_a_truthful_calibration_passes_and_a_changed_truth_fails(tmp_path: Path) -> None:
    hw = load_hardware("virtual_lab")
    cal = truthful_calibration(hw)
    checks = check_against_truth(cal, hw)
    assert checks and all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
    quantities = {c.quantity for c in checks}
    assert {"tx_power_ref_w", "cfo_hz", "timing_mean_s", "drift_ppm", "n0", "n0_lower",
            "compression_amplitude"} <= quantities
    # the same measurement against a changed truth: each changed quantity fails
    data = hw.model_dump(mode="json")
    data["virtual_air"]["noise_figure_db"] = 4.0  # the lower bound now lies above the truth
    edge2 = next(p for p in data["virtual_air"]["paths"] if p["serial"] == "edge2")
    edge2["cfo_hz"] = 1200.0 + 2 * TOLERANCES["cfo_hz_static"]
    data["usrp"]["devices"][0]["tx_args"] = "type=virtual,serial=edge0,drift_ppm=2.5"
    data["usrp"]["devices"][3]["tx_args"] = \
        "type=virtual,serial=edge3,drift_ppm=2.5,full_scale_w=1.0"
    other = HardwareConfig.model_validate(data)
    failed = {(c.quantity, c.device) for c in check_against_truth(cal, other) if not c.ok}
    assert failed == {("n0", None), ("n0_lower", None), ("cfo_hz", 2), ("drift_ppm", 0),
                      ("tx_power_ref_w", 3)}, failed


# -- runs use the calibration ------------------------------------------------------------


def test_runs_take_the_measured_power_only_at_the_settings_it_was_measured_at(
        tmp_path: Path) -> None:
    hw0 = load_hardware("virtual_lab")
    cal = truthful_calibration(hw0)
    cal.devices[1] = cal.devices[1].model_copy(update={"tx_power_ref_w": 0.08})
    hw = load_hardware(str(_write_with_calibration(tmp_path, cal)))
    assert device_radio(hw, 1).tx_power_ref_w == 0.08
    assert device_radio(hw, 2).tx_power_ref_w == pytest.approx(0.1)
    data = hw.model_dump(mode="json")
    data["usrp"]["devices"][1]["tx_gain_db"] = 25.0
    other_gain = HardwareConfig.model_validate(data)
    assert device_radio(other_gain, 1).tx_power_ref_w == 0.1  # measured at 30 dB: not used
    other_amp = load_hardware(str(_write_with_calibration(tmp_path, cal)),
                              ["usrp.tx_amplitude=0.01"])
    assert device_radio(other_amp, 1).tx_power_ref_w == 0.1
    summary = calibration_summary(hw, "usrp")
    assert summary is not None and summary["state"] == "current"
    assert [d["measured"] for d in summary["devices"]] == [True, True, True, True]


def test_the_credited_n0_never_exceeds_the_calibrated_lower_bound(tmp_path: Path) -> None:
    hw0 = load_hardware("virtual_lab")
    cal = truthful_calibration(hw0)
    hw = load_hardware(str(_write_with_calibration(tmp_path, cal)))
    assert cal.receiver is not None
    bound = cal.receiver.noise[0].n0_sample_lower
    gain = np.full(4, 0.01 + 0j)
    above = ChannelState(gain, 2 * bound, 1.5 * bound, 3 * bound, estimated=True,
                         confidence=0.95)
    capped = cap_channel_state(above, hw, "usrp")
    assert capped is not None and capped.noise_var_lower == bound
    assert capped.noise_var == above.noise_var and capped.noise_var_upper == 3 * bound
    below = ChannelState(gain, bound, 0.5 * bound, 2 * bound, estimated=True, confidence=0.95)
    assert cap_channel_state(below, hw, "usrp") is below  # the pilots' lower bound stays
    assert cap_channel_state(above, hw, "waveform") is above  # other units: not capped
    assert cap_channel_state(above, hw0, "usrp") is above  # no calibration
    assert cap_channel_state(None, hw, "usrp") is None
    other_gain = load_hardware(str(_write_with_calibration(tmp_path, cal)),
                               ["usrp.rx_gain_db=20.0"])
    assert cap_channel_state(above, other_gain, "usrp") is above  # not measured there
    data = hw.model_dump(mode="json")
    data["usrp"]["rx_args"] = "type=virtual,serial=rx1"
    other_rx = HardwareConfig.model_validate(data)
    assert cap_channel_state(above, other_rx, "usrp") is above  # another receiver's


def test_the_outcome_line_says_when_the_calibration_is_missing_or_stale(tmp_path: Path) -> None:
    hw0 = load_hardware("virtual_lab")
    missing = calibration_status(hw0, "usrp")
    assert missing.state == "missing" and missing.warns
    assert calibration_status(hw0, "symbol").state == "not_needed"
    old = truthful_calibration(hw0, written_utc=datetime.now(timezone.utc) - timedelta(days=40))
    hw = load_hardware(str(_write_with_calibration(tmp_path, old)))
    stale = calibration_status(hw, "usrp")
    assert stale.state == "stale" and "40.0 days" in stale.line and stale.warns
    hw7 = load_hardware(str(_write_with_calibration(tmp_path, old)),
                        ["calibration_max_age_days=60"])
    assert calibration_status(hw7, "usrp").state == "current"
    summary = {"status": "completed", "rounds_completed": 2, "rounds_planned": 2,
               "final_accuracy": 0.5, "wall_time_s": 3.0, "radios": "virtual",
               "privacy": {"devices": [], "unit": "record", "enforced_accounting": "pld"},
               "radio_calibration": calibration_summary(hw, "usrp")}
    line = outcome_line(summary, "runs/x")
    assert "; radio calibration stale (40.0 days old, limit 30) -> runs/x" in line
    summary["radio_calibration"] = calibration_summary(hw0, "usrp")
    assert "; radios not calibrated -> runs/x" in outcome_line(summary, "runs/x")
    summary["radio_calibration"] = calibration_summary(hw7, "usrp")
    assert "calibrat" not in outcome_line(summary, "runs/x")


def test_the_calibrated_deadline_is_the_train_allowance_unless_one_is_given(
        tmp_path: Path) -> None:
    hw0 = load_hardware("virtual_lab")
    assert train_allowance(hw0, None, 10.0) == 10.0
    hw = load_hardware(str(_write_with_calibration(
        tmp_path, truthful_calibration(hw0, deadline_s=4.8))))
    assert train_allowance(hw, None, 10.0) == 4.8
    assert train_allowance(hw, 7.0, 10.0) == 7.0
    no_deadline = load_hardware(str(_write_with_calibration(
        tmp_path, truthful_calibration(hw0))))
    assert train_allowance(no_deadline, None, 10.0) == 10.0


def test_radio_check_says_whether_the_bench_is_calibrated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from testbed.cli.main import main

    hw0 = load_hardware("virtual_lab")
    old = truthful_calibration(hw0, written_utc=datetime.now(timezone.utc) - timedelta(days=40))
    for path, status, start in ((ROOT / "hw_configs" / "virtual_lab.yaml", "warn",
                                 "radios not calibrated"),
                                (_write_with_calibration(tmp_path / "old", old), "warn",
                                 "radio calibration stale: measured"),
                                (_write_with_calibration(tmp_path / "new",
                                                         truthful_calibration(hw0)),
                                 "ok", "radio calibration: measured")):
        assert main(["radio", "check", str(path), "--json"]) == 0  # a warning fails nothing
        rows = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
        row = rows["radio calibration"]
        assert row["status"] == status and row["detail"].startswith(start), row


# -- the command's input and its failure without radios ----------------------------------


class FakeProbe:
    """UHD discovery that finds nothing; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, args: str, python: str = "") -> ProbeResult:
        self.asked.append(args)
        return ProbeResult([], True)


def test_lab_ota_without_radios_fails_naming_every_missing_one(tmp_path: Path) -> None:
    hw = load_hardware("lab_ota")
    probe = FakeProbe()
    with pytest.raises(RadiosMissing) as err:
        calibrate(hw, CalibrateOptions(), log_dir=tmp_path / "logs", probe=probe)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("no USRP found for usrp.rx_args = 'addr=192.168.10.3', "
                           "usrp.devices[0].tx_args = 'addr=192.168.10.11', ")
    assert "usrp.devices[3].tx_args = 'addr=192.168.10.14'" in text
    assert sorted(probe.asked) == sorted([hw.usrp.rx_args, *(e.tx_args for e in
                                                             hw.usrp.devices)])
    assert not (tmp_path / "logs").exists()  # nothing started
    with pytest.raises(RadiosMissing, match=r"usrp.devices\[2\]") as err2:
        calibrate(hw, CalibrateOptions(devices=[2]), log_dir=tmp_path, probe=FakeProbe())
    assert "devices[0]" not in str(err2.value)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", "radio", "calibrate", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_the_command_on_a_bench_config_without_radios_fails_in_one_line(
        tmp_path: Path) -> None:
    copy = bench_copy(tmp_path, "lab_ota")
    res = _cli(str(copy), "--out", str(tmp_path / "CAL.yaml"), env={LOOPBACK_ONLY_ENV: "1"})
    assert res.returncode == 5, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("testbed radio calibrate: no USRP found for usrp.rx_args = "
                               "'addr=127.0.0.3', usrp.devices[0].tx_args = 'addr=127.0.0.11'")
    assert "usrp.devices[3].tx_args = 'addr=127.0.0.14'" in lines[0]
    assert not (tmp_path / "CAL.yaml").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--attenuation-db", "two"], "--attenuation-db: got 'two'; allowed: DB"),
    (["--attenuation-db", "1:400"], "--attenuation-db: got 1:400.0; allowed: 0 .. 300 dB"),
    (["--bursts", "2"], "--bursts: got 2; allowed: an integer 3 .. 10000"),
    (["--devices", "7"], "--devices: got [7]; hardware config 'virtual_lab' has device ids"),
    (["--devices", "a,b"], "--devices: got 'a,b'; allowed: device ids"),
    (["--train-time", "0:3"], "--train-time: got '0:3'; allowed: DEVICE=SECONDS"),
    (["--out", "cal.json"], "--out: got 'cal.json'; allowed: a .yaml path"),
    (["--burst-symbols", "20000", "--spacing", "0.05"],
     "--spacing: got 0.05 s; allowed: at least the burst (0.110 s for 20000 symbols)"),
])
def test_bad_flags_are_refused_naming_flag_value_and_allowed(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli.main import main

    assert main(["radio", "calibrate", "virtual_lab", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_every_transmitter_or_the_ones_asked_for() -> None:
    hw = load_hardware("virtual_lab")
    assert [t.device for t in transmitters(hw, None)] == [0, 1, 2, 3]
    assert [(t.device, t.key) for t in transmitters(hw, [2])] == [(2, "usrp.devices[2].tx_args")]
    single = load_hardware("virtual_lab", ["usrp.devices=[]"])
    assert [(t.device, t.key) for t in transmitters(single, None)] == [(0, "usrp.tx_args")]


def test_a_config_without_radios_to_calibrate_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli.main import main

    assert main(["radio", "calibrate", "sim"]) == 2
    assert "hardware config 'sim' has link symbol: no radios to calibrate" in \
        capsys.readouterr().err


def test_check_truth_is_refused_on_real_radios() -> None:
    res = _cli("lab_ota", "--check-truth")
    assert res.returncode == 2 and "--check-truth: hardware config 'lab_ota' is not " \
        "virtual" in res.stderr, res.stderr


# -- an edge's training time (testbed edge --calibrate) -----------------------------------


def test_an_edge_times_its_rounds_of_the_job_on_this_host() -> None:
    from edge_device.lab.train_timing import time_training
    from testbed.core.config.loader import load_experiment

    cfg = load_experiment(ROOT / "testbed" / "config" / "private-fedsgd.yaml",
                          ["devices=20", "batch_size=64"])
    timing = time_training(cfg, 3, rounds=2)
    assert timing.device == 3 and len(timing.seconds) == 2
    assert all(0 < s < 120 for s in timing.seconds) and timing.worst_s == max(timing.seconds)
    assert timing.samples == 3000  # its seeded shard of the 60000 rows
    assert f"--train-time 3={timing.worst_s:.2f}" in timing.line()
    with pytest.raises(ValueError, match="--device-id: got 20; the job has 20 devices"):
        time_training(cfg, 20)
    with pytest.raises(ValueError, match="--calibrate-rounds: got 0; allowed: 1 .. 100"):
        time_training(cfg, 0, rounds=0)


def test_an_edge_without_calibrate_still_needs_the_aggregator(
        capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli.main import main

    assert main(["edge", "--device-id", "0", "--keys", "k"]) == 2
    assert "the following arguments are required: --connect (or --calibrate CONFIG)" in \
        capsys.readouterr().err
