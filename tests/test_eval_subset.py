"""Evaluation: a fixed, seeded test subset every round, the full test set on a schedule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aggregator.evaluate import evaluate, intra_op_threads, sample_scores, subset_indices
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.core.models import build_model, get_flat
from testbed.core.run_setup import initial_model, prepare_test_data
from testbed.core.runs.rundir import RunDir, read_jsonl
from testbed.core.seeding import Stream, experiment_generator
from testbed.runner import resume_experiment, run_experiment


def _subset(seed: int, n: int = 200, k: int = 50) -> np.ndarray:
    return subset_indices(n, k, experiment_generator(seed, Stream.EVAL))


def test_subset_is_fixed_by_the_seed() -> None:
    a = _subset(0)
    assert a.dtype == np.int64 and a.shape == (50,)
    assert np.all(np.diff(a) > 0) and 0 <= a[0] and a[-1] < 200  # sorted, distinct, in range
    np.testing.assert_array_equal(a, _subset(0))
    assert not np.array_equal(a, _subset(1))
    np.testing.assert_array_equal(subset_indices(30, 50, np.random.default_rng()), np.arange(30))


def test_per_sample_scores_agree_with_the_batched_summary() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 37).astype(np.int64)
    model = build_model("logreg", (1, 28, 28), 0)
    w = get_flat(model)
    scores = sample_scores(model, w, x, y, batch_size=8)
    whole = evaluate(model, w, x, y, batch_size=100)
    assert scores.summary().accuracy == whole.accuracy
    assert scores.summary().loss == pytest.approx(whole.loss, rel=1e-6)
    idx = np.array([1, 5, 30])
    part = evaluate(model, w, x[idx], y[idx])
    assert scores.summary(idx).accuracy == part.accuracy
    assert scores.summary(idx).loss == pytest.approx(part.loss, rel=1e-6)


@pytest.mark.parametrize(("model", "shape"), [
    ("mnist-cnn", (1, 28, 28)), ("cifar-cnn", (3, 32, 32)), ("logreg", (1, 28, 28)),
])
def test_evaluation_with_more_threads_gives_the_same_scores_bit_for_bit(
    model: str, shape: tuple[int, ...]
) -> None:
    """A run that trains in worker processes evaluates with their cores too
    (``RunState.eval_threads``): its metrics must not depend on that. The threads take
    whole batches, each on one intra-op thread (splitting a convolution over two intra-op
    threads changed the CIFAR CNN's losses in the last bit on a 2-core host)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1200, *shape)).astype(np.float32)
    x[:, :, :8] = -0.8  # constant regions: ties in the max-pooling windows
    y = rng.integers(0, 10, 1200).astype(np.int64)
    net = build_model(model, shape, 5)
    w = get_flat(net)
    before = torch.get_num_threads()
    with intra_op_threads(1):
        one = sample_scores(net, w, x, y, batch_size=100)
    for threads in (2, 5):
        many = sample_scores(net, w, x, y, batch_size=100, threads=threads)
        assert torch.get_num_threads() == before
        np.testing.assert_array_equal(one.loss, many.loss)
        np.testing.assert_array_equal(one.correct, many.correct)
    with pytest.raises(ValueError, match="threads: got 0"):
        sample_scores(net, w, x, y, threads=0)
    with pytest.raises(ValueError, match="threads: got 0"):
        with intra_op_threads(0):
            pass


def test_run_reports_both_evaluations_on_their_schedule(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "rounds=5", "eval_every=2", "eval_subset=60"])
    summary = run_experiment(cfg, tmp_path / "run")
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all({"subset_accuracy", "subset_loss"} <= set(m) for m in lines)
    assert [m["round"] for m in lines if "test_accuracy" in m] == [1, 3, 4]  # every 2 + last
    assert [("eval" in m["wall_s"], "eval_subset" in m["wall_s"]) for m in lines] == [
        (False, True), (True, False), (False, True), (True, False), (True, False)
    ]
    assert summary["final_accuracy"] == lines[-1]["test_accuracy"]
    assert summary["final_accuracy_round"] == 4
    assert summary["final_subset_accuracy"] == lines[-1]["subset_accuracy"]
    assert summary["evaluation"] == {"test_samples": 200, "subset_samples": 60, "eval_every": 2}
    # The subset figures are those of the seeded subset of the full (capped) test set.
    test = prepare_test_data(cfg)
    idx = subset_indices(len(test.y_test), 60, experiment_generator(cfg.seed, Stream.EVAL))
    ckpt = RunDir(tmp_path / "run").load_checkpoint()
    assert ckpt is not None
    model = initial_model(cfg, test.x_test.shape[1:])
    full = evaluate(model, ckpt[1], test.x_test, test.y_test)
    sub = evaluate(model, ckpt[1], test.x_test[idx], test.y_test[idx])
    assert lines[-1]["test_accuracy"] == full.accuracy
    assert lines[-1]["subset_accuracy"] == sub.accuracy
    assert lines[-1]["subset_loss"] == pytest.approx(sub.loss, rel=1e-6)
    assert sub.n_samples == 60 < full.n_samples


def test_no_subset_and_a_resumed_run_keeps_the_same_subset(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "eval_subset=null", "eval_every=100"])
    run_experiment(cfg, tmp_path / "none")
    lines = read_jsonl(tmp_path / "none" / "metrics.jsonl")
    assert not any("subset_accuracy" in m for m in lines)
    assert [m["round"] for m in lines if "test_accuracy" in m] == [2]

    cfg = load_experiment(None, [*tiny_overrides, "rounds=4", "eval_subset=40"])
    run_experiment(cfg, tmp_path / "full")

    def stop_after_round_1(line: dict) -> None:
        if line["round"] == 1:
            raise KeyboardInterrupt

    run_experiment(cfg, tmp_path / "cut", on_round=stop_after_round_1)
    resume_experiment(tmp_path / "cut")
    keys = ("round", "subset_accuracy", "subset_loss", "test_accuracy")
    a, b = (
        [{k: m.get(k) for k in keys} for m in read_jsonl(tmp_path / r / "metrics.jsonl")]
        for r in ("full", "cut")
    )
    assert a == b


def test_the_round_that_reaches_stop_at_loss_is_evaluated_on_the_full_set(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "rounds=50", "eval_every=1000",
                                 "stop_at_loss=50", "loss_target_window=1"])
    summary = run_experiment(cfg, tmp_path / "run")
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(lines) == 1 and "test_accuracy" in lines[0]
    assert summary["final_accuracy"] == lines[0]["test_accuracy"]


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("eval_subset=0", "config key 'eval_subset': got 0"),
        ("eval_subset=many", "config key 'eval_subset': got 'many'"),
        ("eval_subset=2.5", "config key 'eval_subset': got 2.5"),
        ("eval_every=0", "config key 'eval_every': got 0"),
    ],
)
def test_bad_evaluation_values_are_refused(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [override])
    assert fragment in str(info.value)
