"""``testbed watch`` (testbed/cli/cmd_watch.py): TensorBoard on a run, a running virtual-lab
launch and a sweep, opened in a real headless Chromium (Debian's ``chromium``); bad input
refused in one line.

The browser tests read what the page shows (the series' group names TensorBoard renders)
and ask TensorBoard's data API from inside the page for the series by name and their points
(tests/watch_helpers.py). Without ``chromium`` they skip, saying so; CI installs it
(scripts/ensure-system.sh).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")

from testbed.cli.cmd_watch import exposure_note, is_loopback  # noqa: E402
from testbed.cli.main import main  # noqa: E402
from testbed.core.config.loader import load_experiment  # noqa: E402
from testbed.core.config.safe_yaml import dump_yaml_text  # noqa: E402
from testbed.runner import run_experiment  # noqa: E402
from tests.watch_helpers import (  # noqa: E402
    REPO,
    Chromium,
    Watch,
    chromium_path,
    free_port,
    scan_events,
)

PRIVATE = str(REPO / "testbed" / "config" / "private-fedsgd.yaml")
needs_chromium = pytest.mark.skipif(
    chromium_path() is None,
    reason="Debian's chromium is not installed (apt-get install chromium; "
           "scripts/ensure-system.sh installs it for CI)")


def _finished_run(folder: Path, data_dir: Path) -> dict[str, Any]:
    cfg = load_experiment(PRIVATE, [
        "dataset=mnist", "model=logreg", f"data_dir={data_dir}", "devices=4", "rounds=3",
        "local_steps=1", "batch_size=16", "lr=0.05",
    ])
    summary = run_experiment(cfg, folder)
    assert summary["status"] == "completed"
    return summary


# --- bad input: one line, exit 2 ------------------------------------------------------------

def test_watch_refuses_what_it_cannot_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    cases = [
        ([str(tmp_path / "missing")], "no such directory"),
        ([str(tmp_path / "file")], "is a file"),
        ([str(tmp_path / "empty")], "no TensorBoard event files under"),
    ]
    for argv, text in cases:
        code = main(["watch", *argv])
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert text in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as stop:
        main(["watch", str(tmp_path / "empty"), "--port", "0"])
    assert stop.value.code == 2 and "--port: got '0'" in capsys.readouterr().err
    events = tmp_path / "run" / "tensorboard"
    events.mkdir(parents=True)
    (events / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["watch", str(tmp_path / "run"), "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert f"port {port} on 127.0.0.1 is taken" in err and len(err.strip().splitlines()) == 1
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert main(["watch", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("testbed watch: error: the tensorboard package is not installed "
                           "(pip install tensorboard, or `make`, installs it)")


def test_only_loopback_is_quiet_and_another_address_says_what_it_exposes(
    tmp_path: Path,
) -> None:
    for address in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(address) and exposure_note(address, 6006, tmp_path) is None
    for address in ("0.0.0.0", "192.168.10.5", "::", "lab-server"):
        assert not is_loopback(address)
        note = exposure_note(address, 7000, tmp_path)
        assert note is not None
        assert f"--bind {address}" in note and "port 7000" in note
        assert f"every run under '{tmp_path}'" in note and "no login" in note


# --- in a real browser ------------------------------------------------------------------------

@needs_chromium
def test_a_finished_run_in_the_browser(tmp_path: Path, tiny_idx_dir: Path) -> None:
    """``testbed watch RUN`` on a finished 3-round run: Chromium renders TensorBoard with the
    epsilon, SNR and accuracy groups, and the page's data API has each device's epsilon and
    SNR series and the accuracy, with every round's point."""
    run = tmp_path / "run"
    _finished_run(run, tiny_idx_dir)
    with Watch(run) as watch, Chromium() as browser:
        assert watch.url.startswith("http://127.0.0.1:")
        browser.open(watch.url)
        text = browser.page_text(["epsilon", "snr_db", "accuracy"])
        for group in ("epsilon", "snr_db", "accuracy", "uploads", "energy_j"):
            assert group in text, f"{group!r} not shown: {text[:2000]}"
        points = browser.scalar_points(["epsilon/", "snr_db/", "accuracy/"])
        output = watch.output()
        assert watch.close() == 0  # Ctrl-C: stopped, exit 0
    assert output.splitlines()[0] == (f"TensorBoard for {run.resolve()} at {watch.url} "
                                      "(Ctrl-C stops it)")
    for i in range(4):
        assert points[f"tensorboard|epsilon/device_{i:02d}"] == 3
        assert points[f"tensorboard|snr_db/device_{i:02d}"] == 3
    assert points["tensorboard|accuracy/subset"] == 3
    assert points["tensorboard|accuracy/test"] == 1  # evaluated on the full set at the end


@needs_chromium
@pytest.mark.slow
def test_a_two_cell_sweep_in_the_hparams_view(tmp_path: Path, tiny_idx_dir: Path) -> None:
    """``testbed sweep`` of two cells, then ``testbed watch OUT``: the HParams view lists
    both cells with their epsilon target and their final accuracy and epsilon, as in
    results.csv."""
    import csv

    spec = {
        "name": "tb", "grid": {"privacy.epsilon": [2, 8]},
        "base": PRIVATE,
        "set": {"dataset": "mnist", "model": "logreg", "data_dir": str(tiny_idx_dir),
                "devices": 4, "rounds": 3, "local_steps": 1, "batch_size": 16, "lr": 0.05},
    }
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(dump_yaml_text(spec), encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "testbed", "sweep", str(sweep_file), "--out",
                           str(out), "--cpus", "2"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "results.csv").open(newline="") as fh:
        rows = {float(r["privacy.epsilon"]): r for r in csv.DictReader(fh)}
    with Watch(out) as watch, Chromium() as browser:
        browser.open(watch.url + "#hparams")
        text = browser.page_text(["privacy.epsilon", "final test accuracy",
                                  "largest device epsilon"])
        groups = browser.hparams_groups()
    assert "privacy.epsilon" in text and "final test accuracy" in text, text[:2000]
    assert len(groups) == 2, groups
    seen = {}
    for group in groups:
        metrics = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
        seen[float(group["hparams"]["privacy.epsilon"])] = metrics
    assert set(seen) == {2.0, 8.0}
    for eps, metrics in seen.items():
        assert metrics["hparams/accuracy"] == pytest.approx(
            float(rows[eps]["final_accuracy"]), rel=1e-6)
        assert metrics["hparams/epsilon_max"] == pytest.approx(
            float(rows[eps]["epsilon_max"]), rel=1e-6)
        assert metrics["hparams/epsilon_max"] <= eps


@needs_chromium
@pytest.mark.slow
@pytest.mark.gnuradio
def test_a_running_virtual_lab_gains_points_in_the_browser(tmp_path: Path) -> None:
    """``testbed launch`` on the virtual lab (4 edges, virtual USRPs, the virtual air) and
    ``testbed watch`` on its folder while it runs: the page shows the epsilon, SNR and
    accuracy series by name; looked at again later, the series have more points (and the
    launch was still running at the first look). The launch is then stopped with Ctrl-C; its
event files hold the air's burst timeline and neither the run's secret nor any key."""
    from tests.radio_helpers import require_gnuradio

    require_gnuradio()
    out = tmp_path / "lab"
    log = (tmp_path / "launch.log").open("w")
    launch = subprocess.Popen(
        [sys.executable, "-m", "testbed", "launch", PRIVATE, "--devices", "4", "--hw",
         str(REPO / "hw_configs" / "virtual_lab.yaml"), "--out", str(out),
         "--set", "rounds=40", "--set", "train_samples=6000", "--set", "eval_samples=300",
         "--set", "batch_size=256", "--set", "scheme=channel-dp", "--set", "eval_every=100",
         "--set", "privacy.trusted_channel_noise=1"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        metrics = out / "aggregator" / "metrics.jsonl"
        deadline = time.monotonic() + 400
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 1):
            assert launch.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no round committed in 400 s"
            time.sleep(1)
        with Watch(out, free_port()) as watch, Chromium() as browser:
            browser.open(watch.url)
            text = browser.page_text(["epsilon", "snr_db", "accuracy"])
            for group in ("epsilon", "snr_db", "accuracy", "air"):
                assert group in text, f"{group!r} not shown: {text[:2000]}"
            first = browser.scalar_points(["epsilon/device_00", "snr_db/device_00",
                                           "accuracy/subset"])
            assert launch.poll() is None, "the launch ended before the first look"
            names = {key.split("|", 1)[1] for key in first}
            assert names == {"epsilon/device_00", "snr_db/device_00", "accuracy/subset"}, first
            assert {key.split("|", 1)[0] for key in first} == {"aggregator/tensorboard"}
            deadline = time.monotonic() + 300
            while True:
                later = browser.scalar_points(["epsilon/device_00", "snr_db/device_00",
                                               "accuracy/subset"])
                if all(later[k] > first[k] for k in first):
                    break
                assert time.monotonic() < deadline, (first, later)
                time.sleep(2)
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
        try:
            launch.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(launch.pid, signal.SIGKILL)  # the launch and everything it started
            launch.wait()
        log.close()
    summary = json.loads((out / "aggregator" / "summary.json").read_text())
    assert summary["rounds_completed"] >= 2
    # nothing sensitive: neither the run's secret nor any CurveZMQ secret key
    secrets = [(out / "aggregator" / "run_secret").read_text().strip()]
    for key_file in (out / "keys").glob("*.key_secret"):
        secrets += re.findall(r'secret-key = "([^"]+)"', key_file.read_text())
    assert len(secrets) == 1 + 5  # the aggregator's and the 4 edges'
    _, images = scan_events(out / "aggregator" / "tensorboard", secrets)
    assert images.get("air/burst_timeline", 0) >= 1  # round 0's at least
