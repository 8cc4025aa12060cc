"""Inputs that used to be accepted silently (issue 21, item 12): each is now one
``testbed: error:`` line naming the argument or key, the value and what is allowed (exit 2),
or, for a report, a problem naming the file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.cli.overrides import override_key
from testbed.report.load import load_run


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("testbed: error: ") and "\n" not in err, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "{}\n"])
def test_empty_experiment_config_is_refused(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "empty.yaml"
    config.write_text(text)
    _refused(["run", str(config), "--out", str(tmp_path / "run")], capsys,
             "config file", "empty.yaml", "is empty", "without CONFIG")
    assert not (tmp_path / "run").exists()


def test_empty_hardware_config_is_refused_by_radio_check_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hw = tmp_path / "hw.yaml"
    hw.write_text("# nothing here\n")
    _refused(["radio", "check", str(hw)], capsys, "hardware config file", "hw.yaml", "is empty")
    _refused(["run", "--set", f"hw_config={hw}", "--out", str(tmp_path / "run")], capsys,
             "hardware config file", "is empty")


@pytest.mark.parametrize(
    "argv,key",
    [
        (["run", "--set", "privacy.epsilon=3", "--set", "privacy.epsilon=7"], "privacy.epsilon"),
        (["run", "--set", "rounds=3", "--set", " rounds =4"], "rounds"),
        (["run", "--hw-set", "waveform.speed_kmh=20", "--hw-set", "waveform.speed_kmh=3"],
         "waveform.speed_kmh"),
        (["plan", "--set", "devices=3", "--set", "devices=4"], "devices"),
        (["calibrate", "--hw-set", "symbol_rate_hz=1e6", "--hw-set", "symbol_rate_hz=2e6"],
         "symbol_rate_hz"),
        (["reproduce", "--set", "rounds=1", "--set", "rounds=2"], "rounds"),
    ],
)
def test_a_key_given_twice_is_refused(
    argv: list[str], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = "--hw-set" if "--hw-set" in argv else "--set"
    _refused(argv, capsys, flag, f"key '{key}' given twice", "each key once")


def test_distinct_keys_and_sections_still_combine() -> None:
    assert override_key("privacy.epsilon=3") == "privacy.epsilon"
    assert override_key(" privacy . epsilon =3") == "privacy.epsilon"
    assert override_key("privacy=3") != override_key("privacy.epsilon=3")
    assert override_key("no-equals-sign") is None


def test_report_names_a_wrongly_typed_summary_value(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({
        "status": "completed", "final_accuracy": "0.99 (trust me)", "best_accuracy": 7.5,
        "rounds_completed": 2.5, "final_train_loss": "nan", "wall_time_s": 3.0,
    }))
    data = load_run(run)
    problems = "\n".join(data.problems)
    assert "summary.json key 'final_accuracy' is '0.99 (trust me)' (str)" in problems
    assert "allowed: a number in [0, 1]" in problems
    assert "summary.json key 'best_accuracy' is 7.5" in problems
    assert "summary.json key 'rounds_completed' is 2.5 (float); allowed: an integer" in problems
    assert data.summary is not None
    assert "final_accuracy" not in data.summary and "best_accuracy" not in data.summary
    assert data.summary["final_train_loss"] == "nan" and data.summary["wall_time_s"] == 3.0
    assert main(["report", str(run)]) == 0
    report = (run / "report.md").read_text()
    assert "summary.json key 'final_accuracy'" in report
    assert "0.99" not in report.split("summary.json key 'final_accuracy'")[1].split("\n", 1)[1]


@pytest.mark.parametrize("trials", ["0", "10001", "1000000000"])
def test_loopback_trials_have_an_upper_bound(
    trials: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["radio", "loopback", "--link", "symbol", "--snr-db", "10", "--trials", trials],
             capsys, "--trials", f"got {trials}", "1 .. 10000")


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["radio", "loopback", "--link", "symbol", "--snr-db", "-1e308"], "snr_db"),
        (["radio", "loopback", "--link", "waveform", "--snr-db", "10", "--cfo-hz", "-1e308"],
         "--cfo-hz"),
        (["radio", "loopback", "--link", "symbol", "--snr-db", "10", "--delay-samples",
          "-1E3"], "--delay-samples"),
        (["radio", "loopback", "--link", "symbol", "--snr-db", "-inf"], "--snr-db"),
        (["privacy", "--unit", "record", "--q", "0.5", "--z", "-1e-3", "--steps", "3"], "--z"),
        (["privacy", "--unit", "record", "--q", "-5e-1", "--z", "1", "--steps", "3"], "--q"),
        (["privacy", "--unit", "record", "--q", "0.5", "--z", "1", "--steps", "-3"],
         "--steps"),
        (["privacy-curve", "--snr-min", "-1e308"], "--snr-min"),
        (["privacy-curve", "--sigma", "-1e308"], "--sigma"),
    ],
)
def test_negative_numbers_parse_and_are_refused_by_range(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-1e308`` no longer reads as an option ("expected one argument")."""
    err = _refused(argv, capsys, fragment)
    assert "expected one argument" not in err


def test_negative_numbers_in_range_are_used(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["radio", "loopback", "--link", "symbol", "--snr-db", "-5", "--n-symbols", "500",
               "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["snr_db"] == -5.0
