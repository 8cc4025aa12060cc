"""``testbed radio probe|check|loopback`` and the hardware configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radio.uhd_probe import find_usrps
from testbed.cli.main import main
from testbed.config.loader import ConfigError, load_hardware
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
    assert out["fallback"] == ["gnuradio", "waveform"]
    if not find_usrps(LOOPBACK_ONLY).devices:
        assert out["devices"] == []
        rc = main(["radio", "probe", "--device-args", LOOPBACK_ONLY])
        text = capsys.readouterr().out
        assert rc == 0 and "no USRP found" in text or "UHD not usable" in text
        assert "gnuradio" in text


def test_check_lab_ota_passes_without_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    require_gnuradio()
    rc = main(["radio", "check", str(HW_DIR / "lab_ota.yaml"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    names = {c["check"] for c in out["checks"]}
    assert {"build tx", "build rx", "build channel_emulator", "grc tx", "sample_rate"} <= names
    assert all(c["ok"] for c in out["checks"])


def test_check_refuses_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nlink: usrp\nwaveform:\n  samples_per_symbol: 1\n")
    assert main(["radio", "check", str(bad)]) == 2
    assert "samples_per_symbol" in capsys.readouterr().err


@pytest.mark.parametrize("link", ["symbol", "waveform"])
def test_loopback_json(link: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["radio", "loopback", "--link", link, "--snr-db", "15", "--cfo-hz", "1500", "--json"])
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
