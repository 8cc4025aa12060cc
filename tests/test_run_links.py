"""`testbed run` over the waveform and GNU Radio links: same learning as the symbol link.

The `gnuradio` run goes through a real GNU Radio flowgraph process (channel emulator under
/usr/bin/python3, ZMQ PUSH/PULL); it fails in CI if GNU Radio is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.core.config.loader import load_experiment
from testbed.core.runs.rundir import RunDir
from testbed.runner import run_experiment
from tests.radio_helpers import require_gnuradio


def _final(tmp_path: Path, name: str, overrides: list[str]) -> dict:
    summary = run_experiment(load_experiment(None, overrides), tmp_path / name)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    return summary


@pytest.mark.parametrize("link", ["waveform", "gnuradio"])
def test_accuracy_close_to_symbol_link(
    tmp_path: Path, tiny_overrides: list[str], link: str
) -> None:
    if link == "gnuradio":
        require_gnuradio()
    # enough local work that the tiny task saturates: the comparison is then not seed luck
    base = [
        *tiny_overrides,
        "snr_db=15",
        "clip.mode=norm",
        "clip.bound=50",
        "local_steps=10",
        "lr=0.1",
    ]
    ref = _final(tmp_path, "symbol", base)
    other = _final(tmp_path, link, [*base, f"link={link}"])
    assert other["link"] == link
    assert ref["final_accuracy"] > 0.9
    assert abs(other["final_accuracy"] - ref["final_accuracy"]) <= 0.05
    # The link really estimated the channel: realized SNR near the set 15 dB.
    snrs = [d["snr_db"] for m in RunDir(tmp_path / link).metrics() for d in m["devices"]]
    assert all(12.0 < s < 18.0 for s in snrs), snrs


def test_cli_run_over_gnuradio_three_rounds(tmp_path: Path, tiny_overrides: list[str]) -> None:
    """The issue's command line, on the tiny data set."""
    require_gnuradio()
    args = ["run", "--no-progress", "--set", "link=gnuradio", "--set", "rounds=3"]
    for o in tiny_overrides:
        if not o.startswith("rounds="):
            args += ["--set", o]
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    assert len(RunDir(tmp_path / "run").metrics()) == 3


def test_usrp_run_without_a_usrp_fails_at_link_start(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """No USRP: the run stops at link start, saying so (discovery on loopback only)."""
    from radio.uhd_probe import find_usrps
    from testbed.core.config.loader import load_hardware

    loopback = "addr=127.0.0.1"
    if find_usrps(loopback).devices:
        pytest.skip("a device answered on the loopback address")
    hw = load_hardware("lab_ota", [f"usrp.tx_args={loopback}", f"usrp.rx_args={loopback}"])
    cfg = load_experiment(None, [*tiny_overrides, "link=usrp"])
    summary = run_experiment(cfg, tmp_path / "run", hw=hw)
    assert summary["status"] == "link_failed", summary
    assert summary["rounds_completed"] == 0
    assert "no USRP found for the transmitter ('addr=127.0.0.1')" in summary["reason"]
