"""One process per run directory, even when ``RUN/.lock`` is deleted; resume refuses an
edited configuration or ledger; garbled run files are named in one line."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from testbed.core.config.loader import load_experiment
from testbed.core.privacy import Ledger
from testbed.core.privacy.accountants.record_accountant import RecordAccountant
from testbed.core.runs.rundir import RunDir, RunDirError, lock_directory, read_jsonl
from testbed.runner import resume_experiment, run_experiment

REPO = Path(__file__).resolve().parents[1]
TARGET = 40.0


def _dp(tiny: list[str], rounds: int) -> list[str]:
    tiny = [o for o in tiny if not o.startswith("rounds=")]
    return [*tiny, f"rounds={rounds}", "scheme=channel-dp", f"privacy.epsilon={TARGET}",
            "snr_db=10"]


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _run_args(out: Path, overrides: list[str]) -> list[str]:
    return ["run", "--no-progress", "--out", str(out), *[a for o in overrides
                                                          for a in ("--set", o)]]


# ------------------------------------------------------------------ the directory lock


def test_deleting_the_lock_file_does_not_release_the_lock(tmp_path: Path) -> None:
    fd = lock_directory(tmp_path)
    try:
        assert f"pid {os.getpid()}" in (tmp_path / ".lock").read_text()
        with pytest.raises(RunDirError, match=f"in use by another process \\(pid {os.getpid()}"):
            lock_directory(tmp_path)
        (tmp_path / ".lock").unlink()
        with pytest.raises(RunDirError, match="in use by another process"):
            lock_directory(tmp_path)
    finally:
        os.close(fd)
    os.close(lock_directory(tmp_path))  # released with its descriptor


def _wait_for_air(proc: subprocess.Popen, air: Path, deadline_s: float = 600) -> None:
    """Until the process has put at least one upload on the air (generous: a loaded host)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        if air.exists() and read_jsonl(air):
            return
        time.sleep(0.02)
    raise AssertionError(f"the resume never transmitted (exit {proc.poll()})")


@pytest.mark.slow  # 16 s; the lock itself: test_deleting_the_lock_file_does_not_release_the_lock
def test_a_second_resume_is_refused_after_the_lock_file_is_deleted(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    run, air, air2 = tmp_path / "run", tmp_path / "air.jsonl", tmp_path / "air2.jsonl"
    rounds = 24
    killed = _cli(_run_args(run, _dp(tiny_overrides, rounds)),
                  {"TESTBED_FAULT": "after_checkpoint:3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    first = subprocess.Popen(
        [sys.executable, "-m", "testbed", "run", "--resume", str(run)], cwd=REPO,
        env={**os.environ, "TESTBED_AIR_LOG": str(air)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_air(first, air)
        os.kill(first.pid, signal.SIGSTOP)  # holds the directory mid-round
        try:
            (run / ".lock").unlink()
            second = _cli(["run", "--resume", str(run)], {"TESTBED_AIR_LOG": str(air2)})
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert second.returncode == 2, second.stderr
        assert "in use by another process" in second.stderr
        assert not air2.exists()  # it never transmitted
        _, err = first.communicate(timeout=900)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == rounds
    acc = RecordAccountant("pld", 1e-5)
    with Ledger.open(run / "ledger.jsonl") as ledger:
        events = ledger.events()
    for event in events:
        acc.add(event)
    assert set(Counter((e.device, e.round) for e in events).values()) == {1}
    assert max(acc.epsilon(d).epsilon for d in acc.devices()) <= TARGET
    per_device = Counter(e.device for e in events)
    for dev in summary["privacy"]["devices"]:
        assert dev["uploads"] == per_device[dev["device"]] == rounds


# ------------------------------------------------------------------ edits refused on resume


@pytest.fixture(scope="module")
def dp_base(tmp_path_factory: pytest.TempPathFactory, tiny_idx_dir: Path) -> Path:
    tiny = ["dataset=mnist", "model=logreg", f"data_dir={tiny_idx_dir}", "devices=4",
            "local_steps=3", "batch_size=16", "lr=0.05"]
    run = tmp_path_factory.mktemp("base") / "run"
    run_experiment(load_experiment(None, _dp(tiny, 3)), run)
    return run


@pytest.fixture
def dp_run(dp_base: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(dp_base, run)
    return run


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("rounds: 3\n", "rounds: 5\n", "config.yaml: rounds was 3 when ledger.jsonl was "
                                       "started, now 5; refusing to resume"),
        ("scheme: channel-dp\n", "scheme: fedavg\n",
         "config.yaml: scheme was 'channel-dp' when ledger.jsonl was started, now 'fedavg'"),
        ("epsilon: 40.0\n", "epsilon: 400.0\n", "config.yaml: privacy.epsilon was 40.0"),
    ],
    ids=["rounds", "scheme", "epsilon"],
)
def test_resume_refuses_an_edited_config(dp_run: Path, old: str, new: str, message: str) -> None:
    _edit(dp_run / "config.yaml", old, new)
    with pytest.raises(RunDirError, match=re.escape(message)):
        resume_experiment(dp_run)


def test_resume_refuses_an_edited_hardware_config(dp_run: Path) -> None:
    text = (dp_run / "hw_config.yaml").read_text()
    key, value = re.search(r"^(symbol_rate_hz): (.+)$", text, re.M).groups()  # type: ignore[union-attr]
    _edit(dp_run / "hw_config.yaml", f"{key}: {value}", f"{key}: {float(value) * 2}")
    with pytest.raises(RunDirError, match=f"hw_config.yaml: {key} was"):
        resume_experiment(dp_run)


def _ledger_lines(run: Path) -> list[bytes]:
    return (run / "ledger.jsonl").read_bytes().splitlines(keepends=True)


def test_resume_refuses_a_ledger_line_with_ten_times_the_sigma(dp_run: Path) -> None:
    lines = _ledger_lines(dp_run)
    sigma = float(re.search(rb'"sigma":([0-9.e-]+)', lines[3]).group(1))  # type: ignore[union-attr]
    lines[3] = re.sub(rb'"sigma":[0-9.e-]+', f'"sigma":{sigma * 10!r}'.encode(), lines[3])
    (dp_run / "ledger.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(RunDirError, match="ledger.jsonl: line 4 was changed after it was written"):
        resume_experiment(dp_run)
    proc = _cli(["run", "--resume", str(dp_run)])
    assert proc.returncode == 2 and "line 4 was changed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_refuses_reordered_ledger_lines(dp_run: Path) -> None:
    lines = _ledger_lines(dp_run)
    lines[2], lines[3] = lines[3], lines[2]
    (dp_run / "ledger.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(RunDirError, match="line 3 does not follow line 2 in the hash chain"):
        resume_experiment(dp_run)


def test_an_edited_config_of_a_run_without_dp_is_refused(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    run = tmp_path / "run"
    tiny = [o for o in tiny_overrides if not o.startswith("rounds=")]
    run_experiment(load_experiment(None, [*tiny, "rounds=2"]), run)
    assert "config_pin" in json.loads((run / "meta.json").read_text())
    _edit(run / "config.yaml", "rounds: 2\n", "rounds: 4\n")
    with pytest.raises(RunDirError, match="config.yaml: rounds was 2 when the run was started"):
        resume_experiment(run)
    _edit(run / "config.yaml", "rounds: 4\n", "rounds: 2\n")
    resume_experiment(run)  # unedited again: resumes (nothing left to run)


# ------------------------------------------------------------------ garbled run files


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"round":0}\n\xff\xfe\n{"round":1}\n', "line 2 is corrupt (not UTF-8"),
        (b'{"round":0}\n{round: 1}\n{"round":1}\n', "line 2 is corrupt (not JSON"),
        (b'{"round":0}\n[1, 2]\n', "line 2 is corrupt (a JSON list, expected an object)"),
    ],
    ids=["not-utf8", "not-json", "wrong-shape"],
)
def test_a_garbled_jsonl_file_is_named_in_one_line(
    tmp_path: Path, body: bytes, message: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(body)
    with pytest.raises(RunDirError, match=re.escape(message)) as info:
        read_jsonl(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    path.write_bytes(b'{"round":0}\n{"rou')  # a torn last line is still ignored
    assert read_jsonl(path) == [{"round": 0}]


def test_a_garbled_intents_journal_refuses_the_resume(dp_run: Path) -> None:
    (dp_run / "ledger.intents.jsonl").write_bytes(b'{"nonce":"a"}\n\xff\n{"nonce":"b"}\n')
    with pytest.raises(RunDirError, match="ledger.intents.jsonl: line 2 is corrupt"):
        resume_experiment(dp_run)


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_stray_files_in_inflight_are_ignored_and_garbled_uploads_named(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.save_inflight(1, 0, np.ones(3), {"device": 0})
    inflight = rd.inflight_path
    (inflight / "notes.txt").write_text("left by hand")
    (inflight / "r1-dx.npz").write_bytes(b"stray")
    (inflight / ".r1-d2.npz.abc.tmp").write_bytes(b"a crash during a write")
    loaded = rd.load_inflight(1)
    assert list(loaded) == [0] and loaded[0][1] == {"device": 0}
    (inflight / "r1-d3.npz").write_bytes(b"PK\x03\x04 garbled")
    with pytest.raises(RunDirError, match=r"r1-d3\.npz: unreadable in-flight upload") as info:
        rd.load_inflight(1)
    assert "\n" not in str(info.value)
    info_bytes = np.frombuffer(b"[1, 2]", dtype=np.uint8)
    (inflight / "r1-d3.npz").write_bytes(_npz(info=info_bytes))
    with pytest.raises(RunDirError, match=r"r1-d3\.npz: .*info is not a JSON object"):
        rd.load_inflight(1)
    (inflight / "r1-d3.npz").write_bytes(_npz(info=np.frombuffer(b"{}", dtype=np.uint8),
                                              decoded=np.ones((2, 2))))
    with pytest.raises(RunDirError, match=r"r1-d3\.npz: .*not a 1-D float array"):
        rd.load_inflight(1)
    rd.clear_inflight_before(2)  # the kept uploads go; the stray files stay, untouched
    assert sorted(p.name for p in inflight.iterdir()) == [".r1-d2.npz.abc.tmp", "notes.txt",
                                                          "r1-dx.npz"]
