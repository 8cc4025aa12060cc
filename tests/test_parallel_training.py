"""Devices trained in worker processes: the same run as in one process, and nothing left
behind by an error, a Ctrl-C or a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_device.device_worker import Trained, TrainingDiverged
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.core.runs.rundir import RunDir, read_jsonl
from testbed.parallel_training import TrainingPool, WorkerFailed, resolve_workers
from testbed.runner import run_experiment
from tests.lab_helpers import processes_mentioning
from tests.overrides import merge_sets

REPO = Path(__file__).resolve().parents[1]


def _weights(run: Path) -> np.ndarray:
    ckpt = RunDir(run).load_checkpoint()
    assert ckpt is not None
    return ckpt[1]


def _lines(run: Path) -> list[dict[str, Any]]:
    lines = read_jsonl(run / "metrics.jsonl")
    return [{k: v for k, v in m.items() if k != "wall_s"} for m in lines]


def test_two_workers_give_the_sequential_run(tmp_path: Path, tiny_overrides: list[str]) -> None:
    sets = [*tiny_overrides, "model=mnist-cnn", "eval_every=2", "fading=rayleigh", "snr_db=15"]
    one = run_experiment(load_experiment(None, [*sets, "workers=1"]), tmp_path / "one")
    two = run_experiment(load_experiment(None, [*sets, "workers=2"]), tmp_path / "two")
    assert one["status"] == two["status"] == "completed"
    assert (one["workers"], two["workers"]) == (1, 2)
    np.testing.assert_array_equal(_weights(tmp_path / "one"), _weights(tmp_path / "two"))
    assert _lines(tmp_path / "one") == _lines(tmp_path / "two")  # losses, accuracies, channel
    walls = read_jsonl(tmp_path / "two" / "metrics.jsonl")[0]["wall_s"]
    assert walls["train_wait"] > 0 and walls["train"] > 0


def test_record_level_dp_in_workers_matches_up_to_the_csprng_noise(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """Per-step noise comes from the OS CSPRNG, so runs differ by it alone: the first step's
    loss (at the common initial weights, on the seeded Poisson batch) is equal device by
    device, and the final models differ from the sequential one by as much as two sequential
    runs differ from each other."""
    sets = [*tiny_overrides, "scheme=dp-pasgd", "privacy.noise=per-step", "local_steps=1",
            "privacy.secure_sampling=false", "privacy.noise_multiplier=0.5",
            "privacy.epsilon=1000", "rounds=3"]
    runs = {}
    for name, workers in (("seq_a", 1), ("seq_b", 1), ("par", 2)):
        summary = run_experiment(load_experiment(None, [*sets, f"workers={workers}"]),
                                 tmp_path / name)
        assert summary["status"] == "completed", summary["reason"]
        runs[name] = _weights(tmp_path / name)
    first = {
        name: [d["train_loss"] for d in read_jsonl(tmp_path / name / "metrics.jsonl")[0]["devices"]]
        for name in runs
    }
    assert first["par"] == first["seq_a"] == first["seq_b"]
    noise_only = np.linalg.norm(runs["seq_a"] - runs["seq_b"])
    assert noise_only > 0  # the noise is there, and not seeded
    ratio = np.linalg.norm(runs["par"] - runs["seq_a"]) / noise_only
    assert 0.6 < ratio < 1.6, ratio


def _make(device: int, record: Any) -> Any:
    return device


def _train_ok(trainer: Any, record: Any, device: int, w: np.ndarray, t: int) -> Trained:
    from edge_device.energy_meter import Measurement

    return Trained(device, t, w.astype(np.float64) * device, float(device), Measurement(), 0.0)


def _train_diverges_on_2(trainer: Any, record: Any, device: int, w: np.ndarray, t: int) -> Trained:
    if device == 2:
        raise TrainingDiverged(f"device {device} round {t}: non-finite loss or update")
    return _train_ok(trainer, record, device, w, t)


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def test_pool_yields_in_order_and_reaps_its_workers() -> None:
    w = np.arange(4, dtype=np.float32)
    with TrainingPool(2, _make, _train_ok) as pool:
        pids = pool.pids
        got = list(pool.train(w, 3, [(i, None) for i in range(5)]))
        assert [g.device for g in got] == list(range(5))
        np.testing.assert_array_equal(got[4].differential, 4 * w)
        got = list(pool.train(w + 1, 4, [(1, None)]))  # the pool serves the next round
        assert got[0].round_index == 4
    assert _alive(pids) == []


def test_a_training_error_is_raised_in_order_and_closes_the_pool() -> None:
    pool = TrainingPool(2, _make, _train_diverges_on_2)
    pids = pool.pids
    seen = []
    with pytest.raises(TrainingDiverged, match="device 2 round 0"):
        for trained in pool.train(np.zeros(3, np.float32), 0, [(i, None) for i in range(5)]):
            seen.append(trained.device)
    assert seen == [0, 1]  # the results before it were delivered, nothing after
    assert _alive(pids) == []
    with pytest.raises(WorkerFailed, match="closed"):
        next(pool.train(np.zeros(3, np.float32), 1, [(0, None)]))


def test_a_dead_worker_is_reported_not_waited_for() -> None:
    with TrainingPool(2, _make, _train_ok) as pool:
        os.kill(pool.pids[0], signal.SIGKILL)
        with pytest.raises(WorkerFailed, match="died|is gone"):
            list(pool.train(np.zeros(3, np.float32), 0, [(i, None) for i in range(4)]))
        pids = pool.pids
    assert _alive(pids) == []


def test_resolve_workers() -> None:
    cores = len(os.sched_getaffinity(0))
    assert resolve_workers("auto", 1, 1000) == cores
    assert resolve_workers("auto", cores, 1000) == 1
    assert resolve_workers(8, 1, 3) == 3  # never more workers than devices per round
    assert resolve_workers(1, 1, 10) == 1


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (["workers=0"], "config key 'workers': got 0; allowed: an integer 1-256"),
        (["workers=many"], "config key 'workers': got 'many'; allowed: an integer 1-256"),
        (["workers=true"], "config key 'workers': got True"),
        (["workers=2.5"], "config key 'workers': got 2.5"),
        (["workers=2", "energy.source=measured"], "workers: got 2 with energy.source 'measured'"),
    ],
)
def test_bad_workers_values_are_refused(sets: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, sets)
    assert fragment in str(info.value)


def _start(run: Path, sets: list[str], air: Path) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "testbed", "run", "--no-progress", "--out", str(run)]
    for s in sets:
        args += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k != "TESTBED_FAULT"}
    env["TESTBED_AIR_LOG"] = str(air)
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_mid_round(proc: subprocess.Popen[str], air: Path, uploads: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(read_jsonl(air)) < uploads:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)


def _no_leftovers(run: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while processes_mentioning(str(run)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(str(run)) == []


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_stop_or_kill_mid_round_leaves_no_worker_and_the_run_resumes(
    tmp_path: Path, tiny_overrides: list[str], how: signal.Signals
) -> None:
    run, air = tmp_path / "run", tmp_path / "air.jsonl"
    sets = merge_sets(tiny_overrides, ["model=mnist-cnn", "local_steps=10", "devices=6",
                                       "rounds=3", "workers=2", "eval_subset=null"])
    proc = _start(run, sets, air)
    _wait_mid_round(proc, air, 8)  # round 1 under way: some uploads sent, some training
    assert len(processes_mentioning(str(run))) == 3  # the run and its two workers
    proc.send_signal(how)
    _, err = proc.communicate(timeout=120)
    if how == signal.SIGINT:
        assert proc.returncode == 130, err
        assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    else:
        assert proc.returncode == -signal.SIGKILL
    _no_leftovers(run)
    done = subprocess.run(
        [sys.executable, "-m", "testbed", "run", "--no-progress", "--resume", str(run)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != "TESTBED_FAULT"},
             "TESTBED_AIR_LOG": str(air)},
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    _no_leftovers(run)


def test_blas_threads_follow_torch_threads() -> None:
    import ctypes

    import numpy  # noqa: F401 - its OpenBLAS is what is limited

    from testbed.core.process.blas_threads import limit_blas_threads, loaded_openblas

    libs = loaded_openblas()
    if not libs:
        pytest.skip("no OpenBLAS mapped in this process (not Linux, or another BLAS)")
    getters = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
               "openblas_get_num_threads")
    lib = ctypes.CDLL(libs[0])
    get = next(getattr(lib, g) for g in getters if hasattr(lib, g))
    before = int(get())
    try:
        assert limit_blas_threads(1) == libs
        assert int(get()) == 1
    finally:
        limit_blas_threads(before)
    with pytest.raises(ValueError, match="allowed: an integer >= 1"):
        limit_blas_threads(0)
