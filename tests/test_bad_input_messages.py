"""Bad input refused before any work, with one line naming the option or key, the value and
what is allowed (exit code 2 from the CLI): ``--fallback emulate`` off the usrp link,
control characters in output paths, a ``compression.theta_s`` that keeps no coordinate,
and the message of an edge whose key the aggregator refused.

The other items of that list are tested beside their modules: the virtual air's addresses
and section (tests/test_virtual_config.py), a sweep file without ``grid``
(tests/test_sweep.py), a refused CurveZMQ key (tests/test_lab_keys.py, and the edge's exit
in tests/test_lab_errors.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed import api
from testbed.cli.main import main
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.core.radio_fallback import check_fallback_applies
from testbed.core.schemes import kept_coordinates
from testbed.core.transport.curve_client import KeyRefusedError
from testbed.core.transport.curve_keys import generate_keys
from testbed.lab.launch import launch

# --- --fallback emulate off the usrp link --------------------------------------------------


@pytest.mark.parametrize("link", ["symbol", "waveform", "gnuradio"])
def test_fallback_emulate_off_the_usrp_link_is_refused(link: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_fallback_applies("emulate", link)
    message = str(err.value)
    assert message.startswith("--fallback emulate: ")
    assert f"the link in use is '{link}'" in message and "only with link=usrp" in message
    check_fallback_applies("emulate", "usrp")
    check_fallback_applies("none", link)
    check_fallback_applies(None, link)


def test_fallback_emulate_on_an_edge_without_hw_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--fallback emulate: given without --hw.*link=usrp"):
        check_fallback_applies("emulate", None)


def test_run_with_fallback_emulate_on_the_symbol_link_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    experiment = api.load_config(None, [])  # the default: hw_config sim, the symbol link
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="the link in use is 'symbol'"):
        api.run(experiment, out, fallback="emulate")
    assert not out.exists()


def test_launch_with_fallback_emulate_on_the_symbol_link_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    out = tmp_path / "launch"
    with pytest.raises(ConfigError, match="the link in use is 'symbol'"):
        launch(None, 2, out, overrides=[], hw_overrides=[], round_timeout_s=60.0,
               join_timeout_s=60.0, fallback="emulate")
    assert not out.exists()


@pytest.mark.parametrize("command", ["run", "aggregator", "edge", "launch"])
def test_cli_fallback_emulate_on_the_symbol_link_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys, 1)
    out = tmp_path / "out"
    argv = {
        "run": ["run", "--out", str(out)],
        "aggregator": ["aggregator", "--bind", "tcp://127.0.0.1:*", "--keys", str(keys),
                       "--out", str(out), "--set", "devices=1"],
        "edge": ["edge", "--connect", "tcp://127.0.0.1:5555", "--device-id", "0", "--keys",
                 str(keys), "--state-dir", str(out), "--hw", "sim"],
        "launch": ["launch", "--devices", "2", "--out", str(out)],
    }[command]
    assert main([*argv, "--fallback", "emulate"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--fallback emulate: the link in use is 'symbol'" in err
    assert "only with link=usrp" in err and "Traceback" not in err
    assert not out.exists()


# --- control characters in output and run-directory paths ----------------------------------

BAD_PATH = "runs/a\nb"


@pytest.mark.parametrize("argv", [
    ["run", "--out", BAD_PATH],
    ["run", "--resume", BAD_PATH],
    ["aggregator", "--bind", "tcp://127.0.0.1:*", "--keys", "keys", "--out", BAD_PATH],
    ["aggregator", "--bind", "tcp://127.0.0.1:*", "--keys", "keys", "--resume", BAD_PATH],
    ["launch", "--devices", "2", "--out", BAD_PATH],
    ["sweep", "sweep.yaml", "--out", BAD_PATH],
    ["keys", "--devices", "1", "--out", BAD_PATH],
    ["reproduce", "table1", "--out", BAD_PATH],
    ["privacy-curve", "--out", BAD_PATH],
    ["edge", "--connect", "tcp://127.0.0.1:5555", "--device-id", "0", "--keys", "keys",
     "--state-dir", BAD_PATH],
], ids=lambda argv: f"{argv[0]} {argv[-2]}")
def test_an_output_path_with_a_control_character_is_refused_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # the path shown by repr: no line split
    flag = argv[-2]
    assert f"{flag}: got {BAD_PATH!r}" in err
    assert "'\\n' at position 6" in err and "without control characters" in err
    assert os.listdir(tmp_path) == []  # nothing created


@pytest.mark.parametrize("char", ["\t", "\r", "\x1b", "\x7f", "\x85", "\u2028"])
def test_every_control_character_is_refused_in_run_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    char: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--out", f"runs/x{char}y"]) == 2
    assert f"control character {char!r}" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


# --- compression.theta_s that keeps fewer than one coordinate -----------------------------


def test_theta_s_keeping_fewer_than_one_coordinate_is_refused() -> None:
    d = 21_840
    cfg = load_experiment(None, ["scheme=s-dp-fl", "compression.theta_s=1e-9"])
    with pytest.raises(ConfigError) as err:
        kept_coordinates(cfg, d)
    message = str(err.value)
    assert "\n" not in message
    assert "config key 'compression.theta_s': got 1e-09" in message
    assert f"d = {d} coordinates" in message
    assert f"allowed: theta_s >= 1/d = {1 / d!r}" in message
    # the least allowed value, as printed, is allowed: l = 1
    at_least = load_experiment(None, ["scheme=s-dp-fl", f"compression.theta_s={1 / d!r}"])
    assert kept_coordinates(at_least, d) == 1
    # a scheme that does not sparsify never reads theta_s
    assert kept_coordinates(load_experiment(None, ["compression.theta_s=1e-9"]), d) == d


def test_run_with_theta_s_keeping_no_coordinate_exits_2_before_any_round(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    sets = [*tiny_overrides, "scheme=s-dp-fl", "compression.theta_s=1e-9"]
    argv = ["run", "--out", str(out), "--no-report", "--no-progress"]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("testbed: error: config key 'compression.theta_s': got 1e-09")
    assert len(err.splitlines()) == 1, err
    assert "d = 7850 coordinates" in err  # logreg on 28x28 inputs, 10 classes
    assert not out.exists()


# --- an edge whose key the aggregator refused ----------------------------------------------


def test_the_edge_names_its_key_file_and_the_allow_list_when_refused(tmp_path: Path) -> None:
    from testbed.cli.cmd_edge import refused_key_message

    public = b"x" * 40
    line = refused_key_message(KeyRefusedError("tcp://10.0.0.1:5555", public), tmp_path, 3)
    assert "\n" not in line
    assert line.startswith("the aggregator at tcp://10.0.0.1:5555 refused this device's key")
    assert public.decode() in line and str(tmp_path / "device-3.key") in line
    assert "allowed/" in line and "testbed keys" in line
