"""Computing-energy meters on fake sysfs trees: Jetson INA3221 (JetPack 4 and 5), RAPL."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from edge_device import power_sensors
from edge_device.energy_meter import (
    MODEL_LABEL,
    EnergySourceUnavailable,
    JetsonMeter,
    MeterReadError,
    ModelMeter,
    RaplMeter,
    make_meter,
    probe_meters,
)
from edge_device.power_sensors import find_ina3221_rails, find_rapl_domains
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.loader import default_experiment_dict, validate

DRIVERS = "sys/bus/i2c/drivers"


class FakeClock:
    """A clock the test sets by hand (s)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def put(path: Path, value: object) -> None:
    """Write a sysfs-like file atomically (a sampling thread never sees it half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


def jp4_tree(root: Path, vdd_in_mw: int = 5000) -> Path:
    """TX2-like: two INA3221 with three rails each; returns VDD_IN's power file."""
    dev0 = root / DRIVERS / "ina3221x/0-0040/iio:device0"
    for n, (name, mw) in enumerate([("VDD_SYS_GPU", 800), ("VDD_SYS_SOC", 900)]):
        put(dev0 / f"rail_name_{n}", name)
        put(dev0 / f"in_power{n}_input", mw)
    dev1 = root / DRIVERS / "ina3221x/0-0041/iio:device1"
    put(dev1 / "rail_name_0", "VDD_IN")
    put(dev1 / "in_power0_input", vdd_in_mw)
    put(dev1 / "rail_name_1", "VDD_SYS_CPU")
    put(dev1 / "in_power1_input", 1200)
    return dev1 / "in_power0_input"


def jp5_tree(root: Path) -> Path:
    """Orin-AGX-like hwmon layout (no VDD_IN rail, NC and disabled channels)."""
    d = root / DRIVERS / "ina3221/1-0040/hwmon/hwmon3"
    for n, (label, mv, ma) in enumerate(
        [("VDD_GPU_SOC", 5000, 400), ("VDD_CPU_CV", 5000, 200), ("VIN_SYS_5V0", 5000, 600)], 1
    ):
        put(d / f"in{n}_label", label)
        put(d / f"in{n}_input", mv)
        put(d / f"curr{n}_input", ma)
    put(d / "in4_input", 123)  # shunt voltage (uV): not a rail
    d2 = root / DRIVERS / "ina3221/1-0041/hwmon/hwmon4"
    for n, label in enumerate(["NC", "VDDQ_VDD2_1V8AO", "VDD_OFF"], 1):
        put(d2 / f"in{n}_label", label)
        put(d2 / f"in{n}_input", 5000)
        put(d2 / f"curr{n}_input", 100)
    put(d2 / "in3_enable", 0)
    return d


def rapl_tree(root: Path, packages: int = 1, max_uj: int = 262_143_328_850) -> list[Path]:
    """Powercap tree with package domains, a core sub-domain and a psys domain."""
    base = root / "sys/class/powercap"
    files = []
    for k in range(packages):
        d = base / f"intel-rapl:{k}"
        put(d / "name", f"package-{k}")
        put(d / "energy_uj", 1_000_000)
        put(d / "max_energy_range_uj", max_uj)
        put(base / f"intel-rapl:{k}:0" / "name", "core")
        put(base / f"intel-rapl:{k}:0" / "energy_uj", 5)
        files.append(d / "energy_uj")
    put(base / f"intel-rapl:{packages}" / "name", "psys")
    put(base / f"intel-rapl:{packages}" / "energy_uj", 7)
    return files


# --- discovery ------------------------------------------------------------------------


def test_jp4_rails_and_board_input_chosen(tmp_path: Path) -> None:
    jp4_tree(tmp_path)
    names = [r.name for r in find_ina3221_rails(tmp_path)]
    assert names == ["VDD_SYS_GPU", "VDD_SYS_SOC", "VDD_IN", "VDD_SYS_CPU"]
    meter = make_meter("measured", 0.5, root=tmp_path)
    assert isinstance(meter, JetsonMeter)
    assert meter.power_w() == pytest.approx(5.0)
    assert "VDD_IN board input" in meter.source
    assert "whole board" in meter.source and "time slice" in meter.source


def test_jp5_sum_of_rails_skips_nc_disabled_and_shunt(tmp_path: Path) -> None:
    jp5_tree(tmp_path)
    names = [r.name for r in find_ina3221_rails(tmp_path)]
    assert names == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
    meter = make_meter("auto", 0.5, root=tmp_path)
    assert isinstance(meter, JetsonMeter)
    # 5 V x (0.4 + 0.2 + 0.6 + 0.1) A
    assert meter.power_w() == pytest.approx(6.5)
    assert "sum of rails VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0+VDDQ_VDD2_1V8AO" in meter.source


def test_jp5_board_input_rail_is_used_alone(tmp_path: Path) -> None:
    d = jp5_tree(tmp_path)
    put(d / "in1_label", "VDD_IN")  # Orin Nano names its first channel VDD_IN
    meter = make_meter("measured", 0.5, root=tmp_path)
    assert isinstance(meter, JetsonMeter)
    assert [r.name for r in meter.rails] == ["VDD_IN"]
    assert meter.power_w() == pytest.approx(2.0)


# --- integration ----------------------------------------------------------------------


def test_trapezoid_exact_for_linear_power_on_fake_clock(tmp_path: Path) -> None:
    """P(t) = 2 W + 0.5 W/s t over T = 10 s: E = 2 T + 0.25 T^2 = 45 J exactly."""
    power = jp4_tree(tmp_path, vdd_in_mw=2000)
    clock = FakeClock()
    meter = JetsonMeter(find_ina3221_rails(tmp_path), interval_s=None, clock=clock)
    t0 = clock.t
    meter.start()
    for k in range(1, 21):
        clock.t = t0 + 0.5 * k
        put(power, 2000 + 500 * 0.5 * k)
        if k < 20:
            meter.poll()
    reading = meter.stop()
    assert reading.energy_j == pytest.approx(45.0, rel=1e-12)
    assert reading.duration_s == pytest.approx(10.0)
    assert reading.samples == 21
    assert reading.source == meter.source


def test_constant_power_background_thread(tmp_path: Path) -> None:
    """Constant P: the trapezoid integral is P x duration whatever the sampling times."""
    d = jp5_tree(tmp_path)
    put(d / "in1_label", "VDD_IN")
    put(d / "curr1_input", 1000)  # 5 V x 1 A = 5 W
    meter = make_meter("measured", 0.5, root=tmp_path, interval_s=0.01)
    with meter.measure() as m:
        time.sleep(0.3)
    reading = m.reading
    assert reading is not None
    assert reading.samples >= 4  # start, stop and background samples
    assert 0.29 <= reading.duration_s < 5
    assert m.energy_j == pytest.approx(5.0 * reading.duration_s, rel=1e-9)


def test_power_step_written_by_a_thread(tmp_path: Path) -> None:
    """2 W then 6 W: E = 2 t1 + 6 (T - t1), within |dP| x (a few sampling intervals)."""
    power = jp4_tree(tmp_path, vdd_in_mw=2000)
    meter = make_meter("measured", 0.5, root=tmp_path, interval_s=0.01)
    switched: list[float] = []

    def writer() -> None:
        time.sleep(0.2)
        put(power, 6000)
        switched.append(time.monotonic())

    thread = threading.Thread(target=writer)
    t_start = time.monotonic()
    with meter.measure() as m:
        thread.start()
        thread.join()
        time.sleep(0.2)
    t_stop = time.monotonic()
    t1 = switched[0] - t_start
    expected = 2.0 * t1 + 6.0 * (t_stop - switched[0])
    assert m.energy_j == pytest.approx(expected, abs=4.0 * 0.05)
    assert 2.0 * 0.4 < m.energy_j < 6.0 * (t_stop - t_start)


def test_rapl_sums_package_domains_only(tmp_path: Path) -> None:
    files = rapl_tree(tmp_path, packages=2)
    clock = FakeClock()
    meter = make_meter("measured", 0.5, root=tmp_path, clock=clock)
    assert isinstance(meter, RaplMeter)
    assert [d.name for d in meter.domains] == ["package-0", "package-1"]
    assert "RAPL package-0+package-1" in meter.source and "time slice" in meter.source
    meter.start()
    clock.t += 2.0
    put(files[0], 1_000_000 + 30_000_000)  # 30 J
    put(files[1], 1_000_000 + 12_500_000)  # 12.5 J
    reading = meter.stop()
    assert reading.energy_j == pytest.approx(42.5)
    assert reading.duration_s == pytest.approx(2.0)


def test_rapl_wraparound_counted_at_each_poll(tmp_path: Path) -> None:
    """Range 1 J: 0.9 -> 0.1 -> 0.8 -> 0.2 J is 0.2 + 0.7 + 0.4 = 1.3 J (two wraps)."""
    (energy,) = rapl_tree(tmp_path, max_uj=1_000_000)
    put(energy, 900_000)
    meter = RaplMeter(find_rapl_domains(tmp_path), interval_s=None)  # polls by hand only
    meter.start()
    for value in (100_000, 800_000):
        put(energy, value)
        meter.poll()
    put(energy, 200_000)
    assert meter.stop().energy_j == pytest.approx(1.3)


# --- unavailable meters, refusal, fallback ----------------------------------------------


def test_probe_on_bare_host(tmp_path: Path) -> None:
    results = probe_meters(tmp_path)
    assert [(r.name, r.available) for r in results] == [
        ("jetson-ina3221", False),
        ("intel-rapl", False),
        ("model", True),
    ]
    name, available, reason = results[0]
    assert "no INA3221 rails" in reason and "ina3221x" in reason and "hwmon" in reason
    assert "powercap" in results[1].reason


def test_rapl_permission_denied_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rapl_tree(tmp_path)
    real = power_sensors._read

    def denied(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(power_sensors, "_read", denied)
    rapl = probe_meters(tmp_path)[1]
    assert rapl.name == "intel-rapl" and not rapl.available
    assert "permission denied" in rapl.reason and "intel-rapl:0/energy_uj" in rapl.reason
    assert "root" in rapl.reason


def test_rapl_without_package_domain(tmp_path: Path) -> None:
    put(tmp_path / "sys/class/powercap/intel-rapl:0/name", "psys")
    put(tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj", 1)
    rapl = probe_meters(tmp_path)[1]
    assert not rapl.available and "no intel-rapl:N package domain" in rapl.reason


def test_unreadable_jetson_rail_is_unavailable(tmp_path: Path) -> None:
    power = jp4_tree(tmp_path)
    put(power, "n/a")
    jetson = probe_meters(tmp_path)[0]
    assert not jetson.available
    assert "cannot read INA3221 power" in jetson.reason and "in_power0_input" in jetson.reason


def test_measured_refused_with_every_probe_reason(tmp_path: Path) -> None:
    put(tmp_path / "sys/class/powercap/intel-rapl:0/name", "psys")
    with pytest.raises(EnergySourceUnavailable) as info:
        make_meter("measured", 0.5, root=tmp_path)
    msg = str(info.value)
    assert isinstance(info.value, ConfigError)
    assert "energy.source: 'measured'" in msg
    assert "jetson-ina3221: no INA3221 rails" in msg
    assert "intel-rapl: no intel-rapl:N package domain" in msg
    assert "'model' or 'auto'" in msg


def test_auto_falls_back_to_model_label(tmp_path: Path) -> None:
    meter = make_meter("auto", 0.7, root=tmp_path)
    assert isinstance(meter, ModelMeter)
    assert "auto" in meter.detail and "jetson-ina3221" in meter.detail
    with meter.measure() as m:
        pass
    assert m.energy_j == 0.7
    assert m.source == MODEL_LABEL == "modelled (configured e_comp_j)"


def test_auto_prefers_jetson_then_rapl(tmp_path: Path) -> None:
    rapl_tree(tmp_path)
    assert isinstance(make_meter("auto", 0.5, root=tmp_path), RaplMeter)
    jp4_tree(tmp_path)
    assert isinstance(make_meter("auto", 0.5, root=tmp_path), JetsonMeter)


def test_model_ignores_available_meters(tmp_path: Path) -> None:
    jp4_tree(tmp_path)
    meter = make_meter("model", 0.25, root=tmp_path)
    assert isinstance(meter, ModelMeter)
    meter.start()
    reading = meter.stop()
    assert (reading.energy_j, reading.source, reading.samples) == (0.25, MODEL_LABEL, 0)


@pytest.mark.parametrize(
    ("source", "e_comp_j", "words"),
    [
        ("measure", 0.5, ["energy.source", "'measure'", "model, measured, auto"]),
        ("model", -1.0, ["energy.e_comp_j", "-1.0", ">= 0"]),
        ("model", float("nan"), ["energy.e_comp_j", "nan"]),
        ("model", True, ["energy.e_comp_j", "True"]),
    ],
)
def test_bad_arguments_named(source: str, e_comp_j: float, words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        make_meter(source, e_comp_j)
    for word in words:
        assert word in str(info.value)


def test_bad_interval_named(tmp_path: Path) -> None:
    jp4_tree(tmp_path)
    with pytest.raises(ValueError, match=r"interval_s=0.*allowed: None or > 0"):
        make_meter("measured", 0.5, root=tmp_path, interval_s=0)


# --- failures during a measurement, misuse ---------------------------------------------


def test_rail_vanishing_mid_measurement_fails_loudly(tmp_path: Path) -> None:
    power = jp4_tree(tmp_path)
    meter = JetsonMeter(find_ina3221_rails(tmp_path), interval_s=None)
    meter.start()
    power.unlink()
    with pytest.raises(MeterReadError, match=r"jetson-ina3221: reading failed.*in_power0_input"):
        meter.stop()
    put(power, 1000)  # the meter is usable again
    meter.start()
    assert meter.stop().energy_j >= 0


def test_exception_in_block_aborts_and_meter_restarts(tmp_path: Path) -> None:
    jp4_tree(tmp_path)
    meter = make_meter("measured", 0.5, root=tmp_path, interval_s=0.01)
    with pytest.raises(KeyError), meter.measure():
        raise KeyError("training failed")
    assert meter._thread is None
    with meter.measure() as m:
        pass
    assert m.energy_j >= 0


def test_misuse_is_refused() -> None:
    meter = ModelMeter(0.5)
    with pytest.raises(RuntimeError, match="stop\\(\\) without start"):
        meter.stop()
    with meter.measure() as m:
        with pytest.raises(RuntimeError, match="after the `with` block"):
            _ = m.energy_j
        with pytest.raises(RuntimeError, match="already measuring"):
            meter.start()


# --- config key ------------------------------------------------------------------------


def test_config_energy_source_default_and_refusal() -> None:
    data = default_experiment_dict()
    assert validate(ExperimentConfig, data).energy.source == "model"
    data["energy"] = {"source": "auto"}
    assert validate(ExperimentConfig, data).energy.source == "auto"
    data["energy"] = {"source": "rapl"}
    with pytest.raises(ConfigError, match=r"energy\.source.*'rapl'.*'model', 'measured' or"):
        validate(ExperimentConfig, data)
