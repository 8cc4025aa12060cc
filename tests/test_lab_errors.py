"""Clear one-line errors of the lab commands instead of a traceback or a wait (loopback)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testbed.core.transport.curve_keys import generate_keys
from testbed.core.transport.endpoints import check_endpoint
from tests.lab_helpers import (
    PLAIN_SETS,
    ROOT,
    Procs,
    free_port,
    intruder_keys,
    processes_mentioning,
    sets,
    tb_cmd,
)


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("endpoint", "bind", "ok"), [
    ("tcp://127.0.0.1:5555", True, True), ("tcp://0.0.0.0:*", True, True),
    ("tcp://127.0.0.1:99999", True, False), ("tcp://127.0.0.1:0", True, False),
    ("tcp://127.0.0.1:*", False, False), ("tcp://127.0.0.1:0", False, False),
    ("tcp://127.0.0.1:99999", False, False), ("tcp://127.0.0.1", False, False),
    ("tcp://[::1]:5555", False, True), ("127.0.0.1:5555", False, False),
    ("ipc:///tmp/x", True, True),
])
def test_endpoints_outside_the_port_range_are_refused(endpoint: str, bind: bool,
                                                       ok: bool) -> None:
    if ok:
        assert check_endpoint(endpoint, "--bind", bind=bind) == endpoint
    else:
        with pytest.raises(ValueError, match="--bind"):
            check_endpoint(endpoint, "--bind", bind=bind)


def test_aggregator_bind_to_port_99999_is_refused(tmp_path: Path) -> None:
    generate_keys(tmp_path / "keys", 1)
    got = _run(tb_cmd("aggregator", "--bind", "tcp://127.0.0.1:99999", "--keys",
                      str(tmp_path / "keys"), "--out", str(tmp_path / "a"), "--no-progress",
                      *sets([*PLAIN_SETS, "devices=1"])))
    assert got.returncode == 2, got.stderr
    assert "port '99999'" in got.stderr and "1..65535" in got.stderr
    assert "Traceback" not in got.stderr and not (tmp_path / "a").exists()


@pytest.mark.parametrize("port", ["0", "99999"])
def test_edge_connect_to_a_bad_port_is_refused(tmp_path: Path, port: str) -> None:
    generate_keys(tmp_path / "keys", 1)
    got = _run(tb_cmd("edge", "--connect", f"tcp://127.0.0.1:{port}", "--device-id", "0",
                      "--keys", str(tmp_path / "keys"), "--state-dir", str(tmp_path / "s")))
    assert got.returncode == 2, got.stderr
    assert f"--connect: got 'tcp://127.0.0.1:{port}'; port '{port}'" in got.stderr
    assert "Traceback" not in got.stderr


def test_edge_state_dir_naming_a_file_is_refused(tmp_path: Path) -> None:
    generate_keys(tmp_path / "keys", 1)
    state = tmp_path / "state"
    state.write_text("not a directory")
    got = _run(tb_cmd("edge", "--connect", f"tcp://127.0.0.1:{free_port()}", "--device-id",
                      "0", "--keys", str(tmp_path / "keys"), "--state-dir", str(state)))
    assert got.returncode == 2, got.stderr
    assert "exists and is not a directory" in got.stderr and "Traceback" not in got.stderr


def test_more_devices_than_the_allow_list_is_refused_before_binding(tmp_path: Path) -> None:
    generate_keys(tmp_path / "keys", 2)
    port = free_port()
    got = _run(tb_cmd("aggregator", "--bind", f"tcp://127.0.0.1:{port}", "--keys",
                      str(tmp_path / "keys"), "--out", str(tmp_path / "a"), "--no-progress",
                      "--join-timeout", "600", *sets([*PLAIN_SETS, "devices=3"])))
    assert got.returncode == 2, got.stderr
    assert "the run has 3 devices" in got.stderr and "lists 2 device keys" in got.stderr
    assert "devices 2 could never join" in got.stderr
    assert not (tmp_path / "a").exists()


def test_resume_of_a_testbed_run_directory_is_refused(tmp_path: Path) -> None:
    generate_keys(tmp_path / "keys", 1)
    run = tmp_path / "inproc"
    done = _run(tb_cmd("run", "--out", str(run), "--no-report", *sets(
        [*PLAIN_SETS, "devices=1", "rounds=1"])), timeout=300)
    assert done.returncode == 0, done.stderr
    got = _run(tb_cmd("aggregator", "--bind", f"tcp://127.0.0.1:{free_port()}", "--keys",
                      str(tmp_path / "keys"), "--resume", str(run), "--no-progress",
                      "--join-timeout", "600"))
    assert got.returncode == 2, got.stderr
    assert "a `testbed run` directory" in got.stderr and "testbed run --resume" in got.stderr
    missing = _run(tb_cmd("aggregator", "--bind", f"tcp://127.0.0.1:{free_port()}", "--keys",
                          str(tmp_path / "keys"), "--resume", str(tmp_path / "nowhere")))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr


def test_edge_whose_key_is_not_listed_says_so(tmp_path: Path) -> None:
    """The aggregator refuses an unlisted key in the handshake (ZAP 400, CurveZMQ ERROR):
    the edge sees it on its socket monitor and exits 2 at once, naming its key file and the
    allow-list, instead of waiting out its join timeout (600 s here)."""
    keys = tmp_path / "keys"
    generate_keys(keys, 1)
    intruder = intruder_keys(tmp_path, keys)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    procs = Procs(tmp_path / "logs")
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", "--bind", endpoint, "--keys", str(keys), "--out", str(tmp_path / "a"),
            "--join-timeout", "120", "--no-progress", *sets([*PLAIN_SETS, "devices=1"])))
        edge = procs.start("edge", tb_cmd(
            "edge", "--connect", endpoint, "--device-id", "0", "--keys", str(intruder),
            "--state-dir", str(tmp_path / "s"), "--join-timeout", "600", "--rejoin-after", "1"))
        assert edge.wait(120) == 2
        log = procs.log("edge")
        assert f"the aggregator at {endpoint} refused this device's key" in log, log
        assert str(intruder / "device-0.key") in log and "allowed/" in log
        assert "Traceback" not in log
        assert agg.poll() is None  # still waiting for an allowed device 0
    finally:
        procs.close()
    assert not processes_mentioning(str(tmp_path))


def test_resume_of_a_lab_run_with_an_edited_config_is_refused(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """``config.yaml`` is pinned in ``meta.json`` when the lab run starts: a resume after
    an edit names the key and refuses before any round (no edges needed)."""
    from aggregator.lab.resume import open_run
    from testbed.core.config.loader import load_experiment, load_hardware
    from testbed.core.runs.rundir import RunDirError

    cfg = load_experiment(None, [*tiny_overrides, "devices=2"])
    hw = load_hardware(cfg.hw_config)
    rundir, *_ = open_run(None, cfg, hw, tmp_path / "lab")
    rundir.close()
    path = tmp_path / "lab" / "config.yaml"
    text = path.read_text()
    assert "rounds: " in text
    path.write_text(text.replace(f"rounds: {cfg.rounds}\n", f"rounds: {cfg.rounds + 7}\n"))
    with pytest.raises(RunDirError, match=r"rounds was .* now .*refusing to resume"):
        open_run(tmp_path / "lab", None, None, None)
