"""Traps a new user met, each now refused, warned about or said plainly.

1. ``testbed plan CONFIG`` needs a calibration: ``--calibration`` names it, the shipped one
   serves the shipped record config from any directory, and the refusal says so.
2. ``testbed privacy`` defaults to a run's unit and accountant (record, PLD).
3. A scheme that asks for the channel credit but cannot get it warns, saying why.
4. ``testbed radio loopback`` refuses ``--cfo-hz``/``--delay-samples`` on links that
   ignore them.
5. The privacy-curve figure names unit, delta, accountants and the trust assumption.
6. The report's settings table says what compression was actually applied.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cli import cmd_plan
from testbed.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CONFIG = ROOT / "testbed" / "config" / "private-fedsgd.yaml"
SHIPPED_CALIBRATION = ROOT / cmd_plan.SHIPPED_CALIBRATION


# -- 1. plan needs a calibration ---------------------------------------------------------------


class _Stop(Exception):
    """Ends a command where a test has seen what it needs."""


def test_readme_plan_command_names_the_shipped_calibration() -> None:
    """The README's plan lines give --calibration, and the file they name exists."""
    readme = (ROOT / "README.md").read_text()
    table = next(ln for ln in readme.splitlines() if ln.startswith("| `testbed plan CONFIG"))
    assert "--calibration" in table and cmd_plan.SHIPPED_CALIBRATION in table
    block = readme.split("## Planning with EE-DP-FL\n", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"testbed plan (testbed/config/private-fedsgd\.yaml) \\\n\s+"
                        r"--calibration (\S+)", block)
    assert command is not None, "README: no plan command with --calibration"
    assert (ROOT / command.group(1)).is_file() and (ROOT / command.group(2)).is_file()
    assert command.group(2) == cmd_plan.SHIPPED_CALIBRATION


def test_shipped_calibration_holds_no_absolute_path() -> None:
    def strings(x: Any) -> list[str]:
        if isinstance(x, dict):
            return [s for v in x.values() for s in strings(v)]
        if isinstance(x, list):
            return [s for v in x for s in strings(v)]
        return [x] if isinstance(x, str) else []

    data = yaml.safe_load(SHIPPED_CALIBRATION.read_text())
    found = strings(data)
    assert any("pilot-00" in s for s in found)
    assert not [s for s in found if s.startswith("/") or "/work/" in s]


def test_plan_without_calibration_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Refused (exit 2) before any data is loaded, naming --calibration and the shipped file."""
    assert main(["plan", str(SHIPPED_CONFIG)]) == 2
    err = capsys.readouterr().err
    assert "--calibration" in err and cmd_plan.SHIPPED_CALIBRATION in err


def test_plan_calibration_reaches_the_planner_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--calibration`` is the scenario's calibration; the shipped file is read from
    another working directory (the planner itself is replaced: it takes a minute)."""
    from aggregator.solver.from_config import calibration_range, read_calibration_betas

    seen: dict[str, Any] = {}

    def fake_plan_record(cfg: Any, hw: Any, sf: Any, schemes: Any, *, quiet: bool) -> Any:
        seen["betas"] = read_calibration_betas(sf.calibration, model="decoded-noise/v1")
        seen["range"] = calibration_range(sf.calibration)
        raise _Stop  # the plan itself is not under test

    monkeypatch.setattr(cmd_plan, "_plan_record", fake_plan_record)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(_Stop):
        main(["plan", str(SHIPPED_CONFIG), "--calibration", str(SHIPPED_CALIBRATION)])
    assert seen["betas"] == pytest.approx((143.51463058964026, 123.33772579255827))
    assert seen["range"] is not None and seen["range"][2] == 0.7
    # Given twice (flag and scenario key) is refused rather than one silently winning.
    scn = tmp_path / "scn.yaml"
    scn.write_text("solver: {beta1: 1.0, beta2: 2.0}\n")
    assert main(["plan", str(SHIPPED_CONFIG), "--calibration", str(SHIPPED_CALIBRATION),
                 "--scenario", str(scn)]) == 2
    assert "--calibration" in capsys.readouterr().err


# -- 2. privacy defaults -----------------------------------------------------------------------


def test_privacy_defaults_are_a_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.core.config.loader import load_experiment

    cfg = load_experiment(str(SHIPPED_CONFIG), [])
    default = load_experiment(None, [])
    assert (cfg.privacy.unit, cfg.privacy.accountant) == ("record", "pld")
    assert (default.privacy.unit, default.privacy.accountant) == ("record", "pld")
    assert main(["privacy", "--q", "0.01", "--z", "1.1", "--steps", "50", "--json"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert (out["unit"], out["accountant"], out["relation"]) == ("record", "pld", "add-remove")
    with pytest.raises(SystemExit):
        main(["privacy", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "record (default" in help_text and "PLD (default" in help_text


# -- 3. a channel credit the config cannot get -------------------------------------------------


@pytest.mark.parametrize(("sets", "fix"), [
    (["scheme=channel-dp"], "privacy.noise=upload and local_steps=1"),
    (["scheme=ee-dp-fl", "privacy.noise=upload", "local_steps=1",
      "compression.quantize=true"], "compression.quantize=false"),
    (["scheme=ee-dp-fl", "privacy.unit=device", "clip.mode=coordinate"],
     "compression.quantize=false"),
])
def test_uncreditable_channel_credit_warns(sets: list[str], fix: str) -> None:
    from testbed.core.channel_credit import (
        ChannelCreditWarning,
        channel_noise_report,
        credited_config,
    )
    from testbed.core.config.loader import load_experiment, load_hardware

    cfg = load_experiment(None, sets)
    hw = load_hardware(cfg.hw_config)
    with pytest.warns(ChannelCreditWarning, match="nothing is credited") as record:
        credited_config(cfg, hw)
    assert len(record) == 1
    message = str(record[0].message)
    assert cfg.scheme in message and fix in message
    if cfg.privacy.unit == "record":  # the summary's reason says the same
        assert channel_noise_report(cfg, hw, [])["reason"] == message


@pytest.mark.parametrize("sets", [
    ["scheme=channel-dp", "privacy.noise=upload", "local_steps=1"],  # credited
    ["scheme=ldp-fedavg"],  # does not ask for the credit
    ["scheme=channel-dp", "privacy.trusted_channel_noise=0"],
])
def test_no_warning_where_nothing_is_lost(sets: list[str]) -> None:
    import warnings

    from testbed.core.channel_credit import ChannelCreditWarning, credited_config
    from testbed.core.config.loader import load_experiment, load_hardware

    cfg = load_experiment(None, sets)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChannelCreditWarning)
        credited_config(cfg, load_hardware(cfg.hw_config))


# -- 4. loopback impairments on links that ignore them ------------------------------------------


@pytest.mark.parametrize(("link", "extra", "named"), [
    ("symbol", ["--cfo-hz", "2000"], "--cfo-hz"),
    ("usrp", ["--cfo-hz", "-300"], "--cfo-hz"),
    ("symbol", ["--delay-samples", "40"], "--delay-samples"),
    ("symbol", ["--cfo-hz", "2000", "--delay-samples", "4"], "--cfo-hz/--delay-samples"),
])
def test_loopback_refuses_an_impairment_the_link_ignores(
    link: str, extra: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["radio", "loopback", "--link", link, "--snr-db", "20", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("testbed: error:") and "\n" not in err
    assert named in err and f"the {link} link does not apply" in err
    assert "waveform" in err and "gnuradio" in err


def test_loopback_applies_the_offset_where_it_can(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["radio", "loopback", "--link", "symbol", "--snr-db", "20", "--cfo-hz", "0",
                 "--n-symbols", "500", "--json"]) == 0
    capsys.readouterr()
    assert main(["radio", "loopback", "--link", "waveform", "--snr-db", "20", "--cfo-hz",
                 "2000", "--n-symbols", "2000", "--json"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["cfo_est_hz"] == pytest.approx(2000.0, abs=50.0)


# -- 5. the privacy-curve figure says what its epsilon is ---------------------------------------


def test_privacy_curve_figure_names_unit_delta_accountants_and_trust(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    assert main(["privacy-curve", "--out", str(tmp_path), "--snr-min", "-60", "--snr-max",
                 "-40", "--snr-step", "20", "--realizations", "2", "--rounds", "3",
                 "--delta", "1e-6", "--trusted", "0.5", "--json"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["unit"] == "device" and out["accountings"] == ["paper", "strict"]
    assert "fraction 0.5" in out["trust"]
    with Image.open(tmp_path / "privacy_curve.png") as png:
        title = png.text["Title"]
    for fragment in ("Device-level epsilon", "K = 3 uploads", "delta = 1e-06", "paper",
                     "strict", "not a DP bound", "trust: fraction 0.5",
                     "no better than the aggregator's receiver"):
        assert fragment in title, (fragment, title)
