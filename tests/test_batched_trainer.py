"""Devices trained together (``compute.batch_devices``): the same training as one device at a
time, to float32 rounding (bit for bit for logistic regression on one CPU thread), and
refused
where the devices could not be trained together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch import nn

from aggregator.run_rounds import run_rounds
from edge_device.batched_trainer import BatchedTrainer, BatchingUnsupported, check_batchable
from edge_device.trainer import LocalTrainer
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.models import build_model, get_flat
from testbed.core.runs.run_metadata import write_metadata
from testbed.core.runs.rundir import RunDir, read_jsonl
from testbed.runner import local_loop


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n)


def _parts() -> list[np.ndarray]:
    """Nine devices of 30 rows (some shared), one of 5 (smaller than the batch), one of 1."""
    return [np.arange(25 * k, 25 * k + 30) for k in range(9)] + [np.arange(290, 295),
                                                                   np.array([7])]


def _both(name: str, steps: int = 4, batch: int = 8) -> tuple[list[Any], list[Any]]:
    x, y = _data(300, seed=1)
    model = build_model(name, (1, 28, 28), seed=0)
    w0 = get_flat(model) + np.float32(0.01)  # not the model's own weights
    parts = _parts()
    together = BatchedTrainer(model, x, y).train(
        w0, parts, steps=steps, batch_size=batch, lr=0.1,
        rngs=[np.random.default_rng([5, k]) for k in range(len(parts))])
    alone = [LocalTrainer(model, x, y, index=rows).train(
        w0, steps=steps, batch_size=batch, lr=0.1, rng=np.random.default_rng([5, k]))
        for k, rows in enumerate(parts)]
    return together, alone


# One thread, as runs train: with more, the sequential products split their sums across
# threads differently from the batched ones.
@pytest.mark.usefixtures("one_torch_thread")
def test_logreg_devices_trained_together_equal_each_alone_bit_for_bit() -> None:
    together, alone = _both("logreg")
    assert len(together) == len(alone) == 11
    for a, b in zip(together, alone, strict=True):
        assert a.weights.dtype == np.float32 and a.differential.dtype == np.float64
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.differential, b.differential)
        # the reported loss: vmap's batched cross-entropy sums a minibatch's terms in its own
        # order (a float32 ulp or so per step)
        assert a.mean_loss == pytest.approx(b.mean_loss, rel=1e-6)
    # the devices trained on their own draws: no two alike
    assert len({a.differential.tobytes() for a in together}) == 11


def test_cnn_devices_trained_together_equal_each_alone_to_float32_rounding() -> None:
    together, alone = _both("mnist-cnn", steps=2)
    for a, b in zip(together, alone, strict=True):
        scale = np.abs(b.differential).max()
        assert np.abs(a.differential - b.differential).max() <= 1e-5 * scale
        assert abs(a.mean_loss - b.mean_loss) <= 1e-5 * abs(b.mean_loss)


def test_models_whose_devices_cannot_be_batched_are_refused() -> None:
    check_batchable(build_model("logreg", (1, 28, 28), seed=0))
    with pytest.raises(BatchingUnsupported, match="buffers"):
        check_batchable(nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.BatchNorm1d(10)))
    with pytest.raises(BatchingUnsupported, match="Dropout"):
        check_batchable(nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(784, 10)))
    check_batchable(nn.Sequential(nn.Flatten(), nn.Dropout(0.0), nn.Linear(784, 10)))
    frozen = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    frozen[1].bias.requires_grad_(False)
    with pytest.raises(BatchingUnsupported, match="frozen parameters \\(1.bias\\)"):
        check_batchable(frozen)
    x, y = _data(20, seed=2)
    trainer = BatchedTrainer(build_model("logreg", (1, 28, 28), seed=0), x, y)
    w0 = np.zeros(trainer.d, dtype=np.float32)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="generators"):
        trainer.train(w0, [np.arange(5)], steps=1, batch_size=2, lr=0.1, rngs=[])
    with pytest.raises(ValueError, match="no samples"):
        trainer.train(w0, [np.arange(0)], steps=1, batch_size=2, lr=0.1, rngs=[rng])
    with pytest.raises(ValueError, match="w_global"):
        trainer.train(w0[:3], [np.arange(5)], steps=1, batch_size=2, lr=0.1, rngs=[rng])
    with pytest.raises(ValueError, match="steps"):
        trainer.train(w0, [np.arange(5)], steps=0, batch_size=2, lr=0.1, rngs=[rng])


def _run(sets: list[str], path: Path) -> dict[str, Any]:
    cfg = load_experiment(None, sets)
    hw = load_hardware(cfg.hw_config)
    rundir = RunDir.create(path)
    write_metadata(rundir, cfg, hw)
    return run_rounds(local_loop(cfg, hw, rundir))


def test_a_run_with_devices_trained_together_equals_the_sequential_run(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """logreg, 30 devices (20 rows each), 12 of them sampled per round, trained 5 at a time:
    the same model bit for bit, the same losses to float32 rounding, the same energy."""
    sets = [*tiny_overrides, "devices=30", "sample_devices=12", "batch_size=8", "rounds=3"]
    one = _run(sets, tmp_path / "one")
    five = _run([*sets, "compute.batch_devices=5"], tmp_path / "five")
    assert one["status"] == five["status"] == "completed", (one["reason"], five["reason"])
    a, b = (RunDir(tmp_path / r).load_checkpoint() for r in ("one", "five"))
    assert a is not None and b is not None
    np.testing.assert_array_equal(a[1], b[1])
    for la, lb in zip(*(read_jsonl(tmp_path / r / "metrics.jsonl") for r in ("one", "five")),
                      strict=True):
        assert [d["train_loss"] for d in lb["devices"]] == pytest.approx(
            [d["train_loss"] for d in la["devices"]], rel=1e-6)
        assert lb["wall_s"]["train"] > 0
        assert [d["energy_comp_j"] for d in la["devices"]] == [
            d["energy_comp_j"] for d in lb["devices"]]


@pytest.mark.parametrize(("sets", "fragment"), [
    (["compute.batch_devices=0"], "batch_devices"),
    (["compute.batch_devices=many"], "batch_devices"),
    (["compute.batch_devices=4", "workers=2"], "'workers': got 2 with compute.batch_devices 4"),
    (["compute.batch_devices=4", "scheme=dp-pasgd", "privacy.noise=per-step"],
     "'compute.batch_devices': got 4 at privacy.unit record"),
])
def test_settings_that_cannot_batch_devices_are_refused_before_any_work(
    tmp_path: Path, tiny_overrides: list[str], sets: list[str], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _run([*tiny_overrides, *sets], tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_workers_auto_with_batched_devices_trains_in_the_run_process(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    summary = _run([*tiny_overrides, "compute.batch_devices=4", "workers=auto"],
                   tmp_path / "run")
    assert summary["status"] == "completed", summary["reason"]
    assert summary["workers"] == 1


def test_a_device_that_diverged_stops_the_run_where_it_would_one_at_a_time(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device 2 of a batch of 4 diverges: devices 0 and 1 are encoded (and go on air), then
    the run ends as diverged, as when the devices train one after another."""
    from edge_device.device_worker import DeviceWorker
    from edge_device.trainer import LocalResult

    real_group = BatchedTrainer._train_group

    def third_explodes(self: BatchedTrainer, *args: Any) -> list[LocalResult]:
        out = real_group(self, *args)
        bad = out[2]
        out[2] = LocalResult(bad.weights, bad.differential * np.nan, float("nan"))
        return out

    encoded: list[int] = []
    real_encode = DeviceWorker.encode

    def spy(self: DeviceWorker, trained: Any, timer: Any) -> Any:
        encoded.append(self.device)
        return real_encode(self, trained, timer)

    monkeypatch.setattr(BatchedTrainer, "_train_group", third_explodes)
    monkeypatch.setattr(DeviceWorker, "encode", spy)
    summary = _run([*tiny_overrides, "compute.batch_devices=4"], tmp_path / "run")
    assert summary["status"] == "diverged" and "device 2 round 0" in summary["reason"]
    assert encoded == [0, 1]


def test_auto_trains_logreg_devices_together_from_its_threshold_with_the_same_model(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compute.batch_devices: auto`` (the default): 12 devices a round for 3 rounds are 36
    device trainings; from a threshold of 36 they train together (12 at a time, at most a
    round's), below it one after another, and the model is the same bit for bit."""
    import testbed.local_devices as local

    sets = [*tiny_overrides, "devices=30", "sample_devices=12", "batch_size=8", "rounds=3"]
    monkeypatch.setattr(local, "AUTO_MIN_TRAININGS", 36)
    auto = _run(sets, tmp_path / "auto")
    monkeypatch.setattr(local, "AUTO_MIN_TRAININGS", 37)
    below = _run(sets, tmp_path / "below")
    one = _run([*sets, "compute.batch_devices=1"], tmp_path / "one")
    assert (auto["batch_devices"], below["batch_devices"], one["batch_devices"]) == (12, 1, 1)
    a, b, c = (RunDir(tmp_path / r).load_checkpoint() for r in ("auto", "below", "one"))
    assert a is not None and b is not None and c is not None
    np.testing.assert_array_equal(a[1], c[1])
    np.testing.assert_array_equal(b[1], c[1])


@pytest.mark.parametrize("sets", [
    ["model=mnist-cnn"],  # not bit for bit batched: float32 rounding only
    ["torch_threads=2"],  # the products' sums split across threads differently
    ["workers=2"],  # worker processes train the devices
    ["scheme=dp-pasgd", "privacy.noise=per-step"],  # record unit: each device on its own
])
def test_auto_keeps_one_device_at_a_time_where_batching_is_not_exact_or_not_allowed(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch,
    sets: list[str],
) -> None:
    import testbed.local_devices as local

    monkeypatch.setattr(local, "AUTO_MIN_TRAININGS", 1)
    summary = _run([*tiny_overrides, "rounds=1", *sets], tmp_path / "run")
    assert summary["status"] == "completed", summary["reason"]
    assert summary["batch_devices"] == 1


def test_batch_devices_allows_an_integer_or_auto(tiny_overrides: list[str]) -> None:
    assert load_experiment(None, tiny_overrides).compute.batch_devices == "auto"
    assert load_experiment(None, [*tiny_overrides, "compute.batch_devices=7"]
                           ).compute.batch_devices == 7
    for bad in ("0", "4097", "true", "many"):
        with pytest.raises(ConfigError, match=r"batch_devices.*1-4096 \(devices trained "
                           r"together\) or 'auto'"):
            load_experiment(None, [*tiny_overrides, f"compute.batch_devices={bad}"])
