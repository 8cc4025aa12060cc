"""Virtual radios in a hardware config: args, the air's section, and what is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from radio.virtual_device import VirtualArgs, VirtualClock, is_virtual
from testbed.core.config.errors import ConfigError
from testbed.core.config.hardware import device_radio, receiver_radio
from testbed.core.config.loader import load_hardware
from testbed.core.config.safe_yaml import dump_yaml_text, read_yaml_mapping

ROOT = Path(__file__).resolve().parents[1]
LAB = str(ROOT / "hw_configs" / "virtual_lab.yaml")


def test_virtual_configs_load_and_every_radio_points_at_the_air() -> None:
    for name in ("virtual_lab", "virtual_darkroom"):
        hw = load_hardware(str(ROOT / "hw_configs" / f"{name}.yaml"))
        assert hw.virtual and hw.link == "usrp" and len(hw.usrp.devices) == 4
        assert receiver_radio(hw).air_address == hw.virtual_air.stream_address
        for i in range(4):
            radio = device_radio(hw, i)
            assert radio.virtual and radio.air_address == hw.virtual_air.burst_address
            assert hw.virtual_air.path(VirtualArgs.parse(radio.tx_args).serial) is not None
    assert not load_hardware("lab_ota").virtual


@pytest.mark.parametrize(("override", "message"), [
    ("usrp.rx_args=addr=192.168.10.3",
     r"usrp.devices\[1\].tx_args: .* virtual, while usrp.rx_args .* is a real USRP"),
    ("usrp.rx_args=type=virtual,serial=rx0,drift_ppm=3", "usrp.rx_args: drift_ppm=3"),
    ("usrp.tx_args=type=virtual,serial=nowhere", "serial=nowhere has no virtual_air.paths"),
    ("usrp.tx_args=type=virtual,serial=tx0,color=red", "unknown key"),
    ("usrp.tx_args=type=virtual, serial", "is not key=value"),
    ("virtual_air.stream_address=tcp://127.0.0.1:5600", "same as burst_address"),
])
def test_bad_virtual_settings_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_hardware(LAB, [override])


@pytest.mark.parametrize("key", ["burst_address", "stream_address"])
@pytest.mark.parametrize("port", ["99999", "0"])
def test_air_address_with_a_port_out_of_range_is_refused(key: str, port: str) -> None:
    """Both addresses go through the one endpoint check of --bind/--connect
    (:func:`testbed.core.transport.endpoints.endpoint_problem`): a port outside 1..65535 is refused
    (it used to load, and libzmq bound some other port or none)."""
    address = f"tcp://127.0.0.1:{port}"
    with pytest.raises(ConfigError) as err:
        load_hardware(LAB, [f"virtual_air.{key}={address}"])
    assert str(err.value) == (
        f"hardware config key 'virtual_air.{key}': got '{address}'; port '{port}' is out "
        "of range; allowed: PORT 1..65535"
    )


def test_a_bad_air_address_is_named_once() -> None:
    with pytest.raises(ConfigError) as err:
        load_hardware(LAB, ["virtual_air.burst_address=nope"])
    message = str(err.value)
    assert message.count("'nope'") == 1, message
    assert "virtual_air.burst_address" in message and "allowed: tcp://HOST:PORT" in message


def test_a_virtual_config_without_a_virtual_air_section_says_the_section_is_missing(
    tmp_path: Path,
) -> None:
    data = read_yaml_mapping(LAB, "test")
    del data["virtual_air"]
    path = tmp_path / "no_air.yaml"
    path.write_text(dump_yaml_text(data))
    with pytest.raises(ConfigError) as err:
        load_hardware(str(path))
    message = str(err.value)
    assert "\n" not in message, message  # one problem, not one per transmitter
    assert f"virtual_air: section missing from '{path}'" in message
    assert "paths" in message and "attenuation_db" in message
    assert "listed: none" not in message


def test_virtual_args_and_clock() -> None:
    va = VirtualArgs.parse("type=virtual,serial=e0,clock_offset_s=3,drift_ppm=20")
    assert (va.serial, va.clock_offset_s, va.drift_ppm) == ("e0", 3.0, 20.0)
    assert va.applied_gain(10.3) == 10.5 and va.applied_gain(40) == 31.5
    assert is_virtual("type = virtual, serial") and not is_virtual("addr=192.168.10.2")
    now = [1000.25]
    clock = VirtualClock(clock_offset_s=3.0, drift_ppm=20.0, host=lambda: now[0])
    assert clock.now() == pytest.approx(1003.25)
    clock.set_time_now(0.0)
    now[0] += 10.0
    assert clock.now() == pytest.approx(10.0 * (1 + 20e-6))
    assert clock.to_true(clock.now()) == pytest.approx(now[0])
    clock.set_time_next_pps(500.0)  # at the next whole true second, 1011
    assert clock.to_true(500.0) == pytest.approx(1011.0)
    now[0] = 1011.5
    assert clock.time_last_pps() == pytest.approx(500.0)
    assert clock.now() == pytest.approx(500.5 + 0.5 * 20e-6)


def test_radio_probe_lists_virtual_devices_without_uhd() -> None:
    out = subprocess.run([sys.executable, "-m", "testbed", "radio", "probe", "--hw", LAB,
                          "--json"], capture_output=True, text=True, timeout=300, check=True)
    data = json.loads(out.stdout)
    assert data["virtual"] and data["uhd_available"] is None
    assert [d["serial"] for d in data["devices"]] == ["rx0", "tx0", "edge0", "edge1", "edge2",
                                                      "edge3"]
    assert all(d["type"] == "virtual" for d in data["devices"])
