"""``testbed radio probe|check|loopback`` and the hardware configs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from radio.uhd_probe import find_usrps
from testbed.cli.main import main
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_hardware
from tests.radio_helpers import require_gnuradio

HW_DIR = Path(__file__).resolve().parents[1] / "hw_configs"


@pytest.mark.parametrize("name", ["sim", "lab_ota", "darkroom"])
def test_shipped_hardware_configs_validate(name: str) -> None:
    hw = load_hardware(name)
    assert hw.name == name
    assert hw.waveform.samples_per_symbol >= 2
    if name == "darkroom":
        assert hw.fading == "rayleigh" and hw.waveform.speed_kmh == 20.0
        assert hw.symbol_rate_hz * (1 + hw.waveform.rolloff) == pytest.approx(200e3)
        assert hw.snr_sweep_db
    if name == "lab_ota":
        assert hw.link == "usrp" and hw.usrp.max_tx_power_w == 0.1
        assert hw.tx_power_ref_w <= hw.usrp.max_tx_power_w


@pytest.mark.parametrize(
    "override,key",
    [
        ("waveform.rolloff=2", "waveform.rolloff"),
        ("waveform.bogus=1", "waveform.bogus"),
        ("usrp.clock_source=atomic", "usrp.clock_source"),
        ("waveform.span_symbols=15", "span_symbols"),
        ("tx_power_ref_w=0.5", "tx_power_ref_w"),
    ],
)
def test_bad_hardware_keys_are_named(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.split(".")[-1]):
        load_hardware("lab_ota", [override])


#: Discovery is pointed at the loopback address: a test never sends UDP off the host
#: (an empty filter would broadcast on every interface).
LOOPBACK_ONLY = "addr=127.0.0.1"


def test_probe_without_hardware_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["radio", "probe", "--device-args", LOOPBACK_ONLY, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["fallback"] == ["emulate", "gnuradio", "waveform"]
    if not find_usrps(LOOPBACK_ONLY).devices:
        assert out["devices"] == []
        rc = main(["radio", "probe", "--device-args", LOOPBACK_ONLY])
        text = capsys.readouterr().out
        assert rc == 0 and "no USRP found" in text or "UHD not usable" in text
        assert "gnuradio" in text


REPO = HW_DIR.parent


def _loopback_config(tmp_path: Path, **extra: str) -> Path:
    """lab_ota with every USRP on a loopback address (UHD discovery never leaves the host).

    The single-process link's transmitter and the receiver at 127.0.0.1, device ``i``'s
    USRP at 127.0.0.(11 + i).
    """
    text = (HW_DIR / "lab_ota.yaml").read_text()
    text = text.replace('"addr=192.168.10.2"', '"addr=127.0.0.1"')
    text = text.replace('"addr=192.168.10.3"', '"addr=127.0.0.1"')
    text = text.replace("192.168.10.", "127.0.0.")
    assert "192.168." not in text
    for key, value in extra.items():
        text += f"{key}:\n" + "".join(f"  {line}\n" for line in value.splitlines())
    path = tmp_path / "lab_ota_loopback.yaml"
    path.write_text(text)
    return path


def test_check_lab_ota_builds_without_opening_devices(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default check builds tx/rx with null blocks: no UHD block, no discovery packet."""
    require_gnuradio()
    monkeypatch.chdir(REPO)
    rc = main(["radio", "check", "hw_configs/lab_ota.yaml", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    checks = {c["check"]: c for c in out["checks"]}
    expected = {"build tx", "build rx", "build channel_emulator", "grc tx", "sample_rate"}
    assert expected <= set(checks)
    for role, stand_in in (("tx", "null_sink"), ("rx", "null_source")):
        device = checks[f"device {role}"]
        assert device["status"] == "not opened" and device["ok"] is None, device
        built = checks[f"build {role}"]["detail"]
        # The flowgraph's own block list: a null block in place of the UHD one ...
        assert stand_in in built, built
        assert "usrp" not in built.split("UHD blocks:")[0], built
        # ... its record of UHD blocks made, and whether gnuradio.uhd was imported at all.
        assert "UHD blocks: none" in built and "uhd imported: no" in built, built
    assert out["devices_opened"] is False
    # an uncalibrated bench is a warning (ok None), not a failure
    assert checks["radio calibration"]["status"] == "warn", checks["radio calibration"]
    assert all(c["ok"] for c in out["checks"] if c["status"] not in ("not opened", "warn"))
    rc = main(["radio", "check", "hw_configs/lab_ota.yaml"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "[not opened] device tx: 'addr=192.168.10.2'" in text
    assert "[ok] device" not in text


@pytest.mark.parametrize("name", ["virtual_lab", "virtual_darkroom"])
def test_check_passes_on_the_shipped_virtual_configs(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The virtual configs build their tx and rx flowgraphs on virtual devices, each given
    its air's address (before, rx.py refused: '--air-address is required')."""
    require_gnuradio()
    monkeypatch.chdir(REPO)
    rc = main(["radio", "check", f"hw_configs/{name}.yaml", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    checks = {c["check"]: c for c in out["checks"]}
    for role in ("tx", "rx"):
        assert checks[f"build {role}"]["status"] == "ok", checks[f"build {role}"]
        assert "virtual" in checks[f"build {role}"]["detail"], checks[f"build {role}"]
    assert all(c["status"] != "FAIL" and c["ok"] is not False for c in out["checks"]), out


#: Installed by the guard interpreter below: any import of UHD fails loudly.
UHD_GUARD = """
import sys
class _NoUhd:
    def find_spec(self, name, path=None, target=None):
        if name in ("uhd", "gnuradio.uhd") or name.startswith(("uhd.", "gnuradio.uhd.")):
            raise ImportError("UHD import blocked by the test: " + name)
        return None
sys.meta_path.insert(0, _NoUhd())
"""


def test_check_never_touches_uhd_and_runs_from_any_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Independent of the flowgraphs' own report: an interpreter that cannot import UHD."""
    require_gnuradio()
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(UHD_GUARD)
    python = tmp_path / "python3-no-uhd"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={guard} exec /usr/bin/python3 "$@"\n')
    python.chmod(0o755)
    # The guard works: opening a device (loopback address) dies on the blocked import.
    probe = subprocess.run(
        [str(python), str(REPO / "flowgraphs" / "tx.py"), "--build-only", "--open-device",
         "--device-args", LOOPBACK_ONLY],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert probe.returncode != 0 and "UHD import blocked" in probe.stderr, probe.stderr
    config = _loopback_config(tmp_path, gnuradio=f"python: {python}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rc = main(["radio", "check", str(config), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert {c["check"] for c in out["checks"]} >= {"build tx", "build rx"}
    assert not list(elsewhere.iterdir())  # nothing written to the working directory


def test_check_with_open_devices_says_no_device_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if find_usrps(LOOPBACK_ONLY).devices:
        pytest.skip("a device answered on the loopback address")
    require_gnuradio()
    rc = main(["radio", "check", str(_loopback_config(tmp_path)), "--open-devices"])
    text = capsys.readouterr().out
    assert rc == 1, text
    assert "[FAIL] device tx: no USRP found for 'addr=127.0.0.1'" in text
    assert "[FAIL] device rx: no USRP found for 'addr=127.0.0.1'" in text
    assert "no device found" in text.splitlines()[-1]


def test_check_refuses_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nlink: usrp\nwaveform:\n  samples_per_symbol: 1\n")
    assert main(["radio", "check", str(bad)]) == 2
    assert "samples_per_symbol" in capsys.readouterr().err


@pytest.mark.parametrize("link", ["symbol", "waveform"])
def test_loopback_json(link: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfo = ["--cfo-hz", "1500"] if link == "waveform" else []  # symbol refuses an offset
    rc = main(["radio", "loopback", "--link", link, "--snr-db", "15", *cfo, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in ("nmse_db", "snr_est_db", "snr_ci_db", "cfo_est_hz", "samples_lost"):
        assert key in out
    assert out["samples_lost"] == 0
    assert out["nmse_db"] == pytest.approx(-15.0, abs=1.0)
    assert out["snr_est_db"] == pytest.approx(15.0, abs=0.5)
    lo, hi = out["snr_ci_db"]
    assert lo <= out["snr_est_db"] <= hi
    if link == "waveform":
        assert out["cfo_est_hz"] == pytest.approx(1500.0, abs=25.0)


def test_loopback_gnuradio_json(capsys: pytest.CaptureFixture[str]) -> None:
    require_gnuradio()
    rc = main(
        ["radio", "loopback", "--link", "gnuradio", "--snr-db", "25", "--cfo-hz", "-2000", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["samples_lost"] == 0
    assert out["snr_est_db"] == pytest.approx(25.0, abs=0.5)
    assert out["cfo_est_hz"] == pytest.approx(-2000.0, abs=25.0)


def test_loopback_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["radio", "loopback", "--link", "waveform", "--snr-db", "10", "--trials", "0"]) == 2
    assert "--trials" in capsys.readouterr().err
    assert main(["radio", "loopback", "--link", "waveform", "--snr-db", "500"]) == 2
    assert "SNR" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag,value,allowed",
    [
        ("--seed", "-1", "an integer >= 0"),
        ("--snr-db", "nan", "a finite number"),
        ("--snr-db", "inf", "a finite number"),
        ("--cfo-hz", "nan", "a finite number"),
        ("--cfo-hz", "inf", "a finite number"),
        ("--cfo-hz", "1e9", "less than or equal to"),
        ("--delay-samples", "-1", ">= 0"),
        ("--delay-samples", "nan", ">= 0"),
        ("--n-symbols", "0", "1 .. "),
        ("--n-symbols", "1000000000", "1 .. "),
        ("--hw", "no_such_config", "allowed"),
        ("--hw", "/no/such/file.yaml", "does not exist"),
    ],
)
def test_loopback_bad_values_give_one_line_naming_the_flag(
    flag: str, value: str, allowed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["radio", "loopback", "--link", "waveform", "--snr-db", "10", f"{flag}={value}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("testbed: error:"), err
    assert (flag in err or "hw_config" in err or "config file" in err) and allowed in err, err


def test_loopback_link_that_cannot_start_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if find_usrps(LOOPBACK_ONLY).devices:
        pytest.skip("a device answered on the loopback address")
    hw = _loopback_config(tmp_path)
    assert main(["radio", "loopback", "--link", "usrp", "--hw", str(hw)]) == 1  # the air's SNR
    err = capsys.readouterr().err
    assert "link failed" in err and "no USRP found for the transmitter ('addr=127.0.0.1')" in err
    assert "Traceback" not in err
    broken = tmp_path / "broken_python"
    broken.write_text("#!/bin/sh\necho 'flowgraph start-up exploded' >&2\nexit 3\n")
    broken.chmod(0o755)
    cfg = tmp_path / "gr.yaml"
    cfg.write_text(f"name: gr\nlink: gnuradio\ngnuradio:\n  python: {broken}\n")
    rc = main(["radio", "loopback", "--link", "gnuradio", "--hw", str(cfg), "--snr-db", "10"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "link failed: gnuradio link could not start" in err
    assert "exited with code 3" in err and "flowgraph start-up exploded" in err
    assert "Traceback" not in err


def test_loopback_sweeps_the_darkroom_snr_list(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "radio",
            "loopback",
            "--link",
            "waveform",
            "--hw",
            "darkroom",
            "--n-symbols",
            "2000",
            "--delay-samples",
            "50",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [p["snr_db"] for p in out["sweep"]] == load_hardware("darkroom").snr_sweep_db
    # A deep fade may lose a frame at low SNR; from 10 dB up the estimates rise with the SNR.
    est = [p["snr_est_db"] for p in out["sweep"] if p["snr_db"] >= 10]
    assert all(b > a for a, b in zip(est, est[1:], strict=False))
    assert main(["radio", "loopback", "--link", "waveform"]) == 2
    assert "snr_sweep_db" in capsys.readouterr().err
