"""``compute.device``: the setting's values, its resolution on this host, the refusal of a
GPU that torch does not see (before any work), what ``meta.json`` records, and that the CPU
path computes what it always did. The tests marked by ``needs_cuda`` run only where torch
sees a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_device.dp_trainer import RecordTrainer
from edge_device.lab.agent import EdgeAgent
from edge_device.lab.errors import EdgeError
from edge_device.per_example import ClippedGradientSum
from edge_device.trainer import LocalTrainer
from testbed.core.compute import check_workers, resolve_device
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import dump_yaml, load_experiment
from testbed.core.models import build_model, get_flat
from testbed.core.runs.rundir import RunDir
from testbed.runner import run_experiment

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch as on a host without a GPU (whatever this host has)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _weights(run: Path) -> np.ndarray:
    rundir = RunDir.open(run)
    try:
        checkpoint = rundir.load_checkpoint()
    finally:
        rundir.close()
    assert checkpoint is not None
    return checkpoint[1]


# -- the setting ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["gpu", "CPU", "cuda:", "cuda:-1", "cuda:x", "cuda:01", "0"])
def test_a_bad_value_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [f"compute.device={value}"])
    text = str(info.value)
    assert "compute.device" in text and "auto" in text and "cuda:N" in text
    assert value in text


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_the_allowed_values_load(value: str) -> None:
    assert load_experiment(None, [f"compute.device={value}"]).compute.device == value


def test_the_default_is_auto() -> None:
    assert load_experiment(None).compute.device == "auto"


# -- resolution ---------------------------------------------------------------------------------
def test_cpu_and_auto_without_cuda_resolve_to_the_cpu(no_cuda: None) -> None:
    cpu = resolve_device("cpu")
    assert cpu.torch_device == torch.device("cpu") and cpu.name == "cpu"
    auto = resolve_device("auto")
    assert auto.torch_device == torch.device("cpu")
    assert auto.reason == (
        "auto: no CUDA device (torch.cuda.is_available() is False), using the CPU")
    meta = auto.metadata()
    assert meta["setting"] == "auto" and meta["device"] == "cpu"
    assert meta["cuda_available"] is False and meta["torch"] == torch.__version__


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_refused_with_what_torch_reports(no_cuda: None, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_device(value)
    text = str(info.value)
    assert f"compute.device': got '{value}'" in text
    assert "torch.cuda.is_available() = False" in text and "0 CUDA devices" in text
    assert "'auto'" in text and "'cpu'" in text


def test_a_gpu_index_past_the_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"no CUDA device 2 \(indices 0..1\).*cuda:N' with N < 2"):
        resolve_device("cuda:2")


def test_worker_processes_are_refused_on_a_gpu_only() -> None:
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    with pytest.raises(ConfigError, match="config key 'workers': got 2.*cannot use CUDA"):
        check_workers(gpu, 2)
    check_workers(gpu, 1)
    check_workers(gpu, "auto")
    check_workers(cpu, 8)


# -- before any work ----------------------------------------------------------------------------
def test_run_with_an_unseen_gpu_fails_before_the_run_directory_exists(
    tmp_path: Path, tiny_overrides: list[str], no_cuda: None
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "rounds=1", "compute.device=cuda"])
    with pytest.raises(ConfigError, match="compute.device': got 'cuda'.*is_available"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_run_with_workers_on_a_gpu_fails_before_the_run_directory_exists(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "a stand-in GPU")
    cfg = load_experiment(None, [*tiny_overrides, "compute.device=cuda:0", "workers=2"])
    with pytest.raises(ConfigError, match="workers"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_edge_refuses_an_unseen_gpu_before_loading_data(
    tmp_path: Path, tiny_overrides: list[str], no_cuda: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import testbed.core.run_setup as run_setup

    def no_data(*args: object) -> None:
        raise AssertionError("the data were loaded before the device was checked")

    monkeypatch.setattr(run_setup, "prepare_data", no_data)
    cfg = load_experiment(None, [*tiny_overrides, "compute.device=cuda:1"])
    agent = EdgeAgent("tcp://127.0.0.1:1", 0, tmp_path / "keys", tmp_path / "state")
    (tmp_path / "state").mkdir()
    msg = {"config_yaml": dump_yaml(cfg), "mask_secret": "00" * 32, "run_id": "r"}
    with pytest.raises(EdgeError, match="device 0: config key 'compute.device': got 'cuda:1'"):
        agent._setup(msg)  # type: ignore[arg-type]
    assert agent.worker is None


# -- runs -----------------------------------------------------------------------------------------
def test_auto_without_cuda_runs_on_the_cpu_as_cpu_does(
    tmp_path: Path, tiny_overrides: list[str], no_cuda: None
) -> None:
    base = [*tiny_overrides, "model=mnist-cnn", "rounds=2", "devices=2", "eval_every=1"]
    for setting in ("auto", "cpu"):
        run_experiment(load_experiment(None, [*base, f"compute.device={setting}"]),
                       tmp_path / setting)
    meta = json.loads((tmp_path / "auto" / "meta.json").read_text())
    assert meta["compute"] == {
        "setting": "auto", "device": "cpu",
        "reason": "auto: no CUDA device (torch.cuda.is_available() is False), using the CPU",
        "torch": torch.__version__, "cuda_available": False,
    }
    assert json.loads((tmp_path / "cpu" / "meta.json").read_text())["compute"]["device"] == "cpu"
    a, b = _weights(tmp_path / "auto"), _weights(tmp_path / "cpu")
    assert a.dtype == b.dtype and np.array_equal(a, b)


def test_an_explicit_cpu_device_changes_nothing_in_the_trainers() -> None:
    """The trainers with ``device=cpu`` give exactly what they give without a device."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 1, 28, 28)).astype(np.float32)
    y = (np.arange(64) % 10).astype(np.int64)
    cpu = torch.device("cpu")
    results = []
    for device in (None, cpu):
        model = build_model("mnist-cnn", (1, 28, 28), 1)
        w = get_flat(model).astype(np.float64)
        plain = LocalTrainer(model, x, y, device=device).train(
            w, steps=2, batch_size=8, lr=0.05, rng=np.random.default_rng(1))
        record = RecordTrainer(model, x, y, backend="layers", device=device).train(
            w, steps=2, expected_batch_size=8, lr=0.05, example_clip=1.0, noise_multiplier=0.0,
            secure_sampling=False, rng=np.random.default_rng(2))
        results.append((plain.differential, record.differential, record.weights))
    for first, second in zip(*results, strict=True):
        assert np.array_equal(first, second)


# -- on a GPU -------------------------------------------------------------------------------------
@needs_cuda
def test_a_run_on_cuda_says_so_and_learns_what_the_cpu_learns(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    base = [*tiny_overrides, "model=mnist-cnn", "rounds=1", "devices=2", "eval_every=1"]
    summary = run_experiment(load_experiment(None, [*base, "compute.device=cuda"]),
                             tmp_path / "cuda")
    assert summary["status"] == "completed"
    meta = json.loads((tmp_path / "cuda" / "meta.json").read_text())["compute"]
    assert meta["setting"] == "cuda" and meta["device"] == "cuda:0"
    assert meta["cuda_available"] is True
    run_experiment(load_experiment(None, [*base, "compute.device=cpu"]), tmp_path / "cpu")
    on_gpu, on_cpu = _weights(tmp_path / "cuda"), _weights(tmp_path / "cpu")
    assert on_gpu.dtype == on_cpu.dtype
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=0, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("backend", ["layers", "vmap"])
def test_clipped_sums_on_cuda_match_the_cpu_and_stay_clipped(backend: str) -> None:
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(size=(16, 1, 28, 28)).astype(np.float32))
    y = torch.from_numpy((np.arange(16) % 10).astype(np.int64))
    model = build_model("mnist-cnn", (1, 28, 28), 4)
    cpu = ClippedGradientSum(model, backend=backend)(x, y, 0.5)  # type: ignore[arg-type]
    gpu_model = build_model("mnist-cnn", (1, 28, 28), 4)
    gpu = ClippedGradientSum(gpu_model, backend=backend,  # type: ignore[arg-type]
                             device=torch.device("cuda"))(x, y, 0.5)
    assert all(t.device.type == "cuda" for t in gpu)
    # cuDNN convolutions may run in TF32 (PyTorch's default on CUDA): about 1e-5 here
    for a, b in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-3, atol=1e-4)
    # each example's own clipped gradient, on the GPU: norm below the clip
    single = ClippedGradientSum(gpu_model, backend=backend,  # type: ignore[arg-type]
                                device=torch.device("cuda"))
    for i in range(4):
        total, _, _ = single(x[i : i + 1], y[i : i + 1], 0.5)
        assert float(torch.linalg.vector_norm(total.double())) < 0.5


@needs_cuda
def test_record_training_on_cuda_returns_cpu_arrays_with_noise() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 1, 28, 28)).astype(np.float32)
    y = (np.arange(64) % 10).astype(np.int64)
    model = build_model("mnist-cnn", (1, 28, 28), 6)
    w = get_flat(model).astype(np.float64)
    trainer = RecordTrainer(model, x, y, device=torch.device("cuda"))
    res = trainer.train(w, steps=2, expected_batch_size=8, lr=0.05, example_clip=1.0,
                        noise_multiplier=1.0)
    assert isinstance(res.differential, np.ndarray) and res.differential.dtype == np.float64
    assert isinstance(res.weights, np.ndarray) and np.all(np.isfinite(res.differential))
    lap = trainer.train_laplace(w, lr=0.05, example_clip=1.0, laplace_scale=0.1, normaliser=64)
    assert lap.differential.dtype == np.float64 and np.all(np.isfinite(lap.differential))
