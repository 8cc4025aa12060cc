"""Runs: directory contents, interruption, resume, and the CLI's handling of bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from testbed.cli.main import main
from testbed.core.config.loader import load_experiment
from testbed.core.runs.rundir import RunDir, RunDirError, read_jsonl
from testbed.runner import resume_experiment, run_experiment
from tests.overrides import merge_sets

REPO = Path(__file__).resolve().parents[1]


def test_run_directory_contents(tmp_path: Path, tiny_overrides: list[str]) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "fading=rayleigh", "snr_db=15", "eval_every=1"])
    summary = run_experiment(cfg, tmp_path / "run")
    run = tmp_path / "run"
    for name in ("config.yaml", "hw_config.yaml", "meta.json", "metrics.jsonl", "summary.json"):
        assert (run / name).is_file(), name
    assert oct((run / "run_secret").stat().st_mode & 0o777) == "0o600"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["round"] for m in metrics] == [0, 1, 2]
    for m in metrics:
        assert 0 <= m["test_accuracy"] <= 1 and m["train_loss"] > 0
        assert len(m["devices"]) == 4
        for dev in m["devices"]:
            assert {"snr_db", "h_abs", "energy_comm_j", "airtime_s"} <= set(dev)
            # realized SNR = |h|^2 * signal power / N0 around the set 15 dB
            assert np.isfinite(dev["snr_db"]) and dev["energy_comm_j"] > 0
        assert {"train", "link", "eval", "round"} <= set(m["wall_s"])
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    assert json.loads((run / "summary.json").read_text()) == summary
    # the resolved config reloads to the same object
    assert load_experiment(run / "config.yaml") == cfg


def test_learns_the_tiny_task(tmp_path: Path, tiny_overrides: list[str]) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "clip.mode=norm", "clip.bound=50"])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["final_accuracy"] > 0.5  # chance is 0.1


def test_existing_run_directory_is_never_overwritten(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, tiny_overrides)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "precious.txt").write_text("keep me")
    with pytest.raises(RunDirError, match="--resume"):
        run_experiment(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "precious.txt").read_text() == "keep me"


def test_interrupted_then_resumed_equals_uninterrupted(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "rounds=4", "snr_db=12", "fading=rayleigh"])
    run_experiment(cfg, tmp_path / "full")

    def stop_after_round_1(line: dict) -> None:
        if line["round"] == 1:
            raise KeyboardInterrupt

    summary = run_experiment(cfg, tmp_path / "cut", on_round=stop_after_round_1)
    assert summary["status"] == "interrupted" and summary["exit_code"] == 130
    cut = RunDir(tmp_path / "cut")
    summary = json.loads(cut.summary_path.read_text())
    assert summary["status"] == "interrupted" and summary["rounds_completed"] == 2
    resume_experiment(tmp_path / "cut")
    full = RunDir(tmp_path / "full")
    a, b = full.load_checkpoint(), cut.load_checkpoint()
    assert a is not None and b is not None and a[0] == b[0] == 3
    np.testing.assert_array_equal(a[1], b[1])
    strip = lambda ms: [{k: v for k, v in m.items() if k != "wall_s"} for m in ms]  # noqa: E731
    assert strip(full.metrics()) == strip(cut.metrics())


def test_resume_refuses_metrics_ahead_of_the_checkpoint(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "rounds=3"])
    run_experiment(cfg, tmp_path / "run")
    rd = RunDir(tmp_path / "run")
    # The checkpoint is written before the metrics line, so a metrics line beyond the
    # checkpoint is not a crash artefact: the files disagree and nothing is guessed.
    ckpt = rd.load_checkpoint()
    assert ckpt is not None
    rd.save_checkpoint(1, ckpt[1], ckpt[2])
    with pytest.raises(RunDirError, match="checkpoint.npz is at round 1"):
        resume_experiment(tmp_path / "run")
    assert [m["round"] for m in rd.metrics()] == [0, 1, 2]


def test_cli_refuses_bad_config_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--set", "rounds=0", "--out", str(tmp_path / "r")])
    assert code == 2
    err = capsys.readouterr().err
    assert "rounds" in err and "0" in err
    assert not (tmp_path / "r").exists()


def test_cli_missing_dataset_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--set", f"data_dir={tmp_path}", "--out", str(tmp_path / "r")])
    assert code == 2
    assert "train-images-idx3-ubyte" in capsys.readouterr().err


def test_sigint_leaves_a_consistent_run_directory(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    out = tmp_path / "run"
    args = [sys.executable, "-m", "testbed", "run", "--no-progress", "--out", str(out)]
    for o in merge_sets(tiny_overrides, ["rounds=200"]):
        args += ["--set", o]
    proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(out / "metrics.jsonl")) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err
    rd = RunDir(out)
    summary = json.loads(rd.summary_path.read_text())
    ckpt = rd.load_checkpoint()
    assert ckpt is not None
    assert summary["status"] == "interrupted"
    assert summary["rounds_completed"] == ckpt[0] + 1 == len(rd.metrics())


def test_run_files_are_strict_json(tmp_path: Path, tiny_overrides: list[str]) -> None:
    """A noiseless channel has infinite SNR: written as "inf", never a bare Infinity."""

    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard JSON constant {token}")

    cfg = load_experiment(None, [*tiny_overrides, "noiseless=true", "rounds=1"])
    run_experiment(cfg, tmp_path / "run")
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line, parse_constant=refuse)
        assert all(dev["snr_db"] == "inf" for dev in record["devices"])
    json.loads((tmp_path / "run" / "summary.json").read_text(), parse_constant=refuse)
