"""An edge that trains on the data it holds (``testbed edge --data-dir``) and an aggregator
host without training data: the same model as the in-process run when the shards are the
run's seeded ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from testbed.core.config.loader import load_experiment
from testbed.core.data.datasets import DatasetNotFoundError, load_test_set, load_train_shard
from testbed.core.data.idx import read_idx, write_idx
from testbed.core.run_setup import prepare_data
from testbed.lab.launch import launch
from testbed.runner import run_experiment
from tests.conftest import make_idx_dataset

TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
TEST = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _weights(run_dir: Path) -> np.ndarray:
    with np.load(run_dir / "checkpoint.npz") as z:
        return z["weights"].copy()


def test_edges_with_their_own_shards_train_the_seeded_runs_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Also what launch shows (the aggregator's joins and round lines relayed, the outcome
    line last) and each edge's own energy reading, labelled with its source."""
    full = make_idx_dataset(tmp_path / "full", n_train=300, n_test=100)
    sets = ["dataset=mnist", "model=logreg", "devices=3", "rounds=3", "local_steps=2",
            "batch_size=16", "lr=0.05", "scheme=fedavg", "energy.source=auto"]
    cfg = load_experiment(None, [*sets, f"data_dir={full}"])
    inproc = run_experiment(cfg, tmp_path / "inproc")
    assert inproc["status"] == "completed"
    # Each device's shard as its own files: the seeded shard's rows, raw.
    _, parts = prepare_data(cfg)
    raw = [read_idx(full / name) for name in TRAIN]
    shards = []
    for i, rows in enumerate(parts):
        d = tmp_path / f"shard-{i}"
        d.mkdir()
        for name, arr in zip(TRAIN, raw, strict=True):
            write_idx(d / name, arr[rows])
        shards.append(d)
    # The aggregator's host holds the test files only.
    agg = tmp_path / "agg-data"
    agg.mkdir()
    for name in TEST:
        shutil.copy(full / name, agg / name)
    out = tmp_path / "lab"
    code = launch(None, 3, out, overrides=[*sets, f"data_dir={agg}"], hw_overrides=[],
                  round_timeout_s=60, join_timeout_s=120,
                  edge_args={i: ["--data-dir", str(shards[i])] for i in range(3)})
    assert code == 0, (out / "logs" / "aggregator.log").read_text()[-2000:]
    shown = capsys.readouterr()
    relayed = shown.err.splitlines()
    assert relayed.count("aggregator: all 3 devices joined") == 1
    assert [ln.split(":")[1] for ln in relayed if ln.startswith("aggregator: round ")] == [
        f" round {k - 1} ({k}/3)" for k in range(1, 4)]
    assert shown.out.splitlines()[-1].startswith("run completed: 3/3 rounds, final test")
    last = json.loads((out / "aggregator" / "metrics.jsonl").read_text().splitlines()[-1])
    for dev in last["devices"]:
        assert dev["energy_comp_j"] > 0
        assert dev["energy_comp_source"].startswith(("modelled", "measured (RAPL"))
    np.testing.assert_allclose(_weights(out / "aggregator"), _weights(tmp_path / "inproc"),
                               rtol=0, atol=1e-6)
    assert not any((agg / name).exists() for name in TRAIN)


def test_split_loaders_read_only_their_files(tmp_path: Path) -> None:
    full = make_idx_dataset(tmp_path / "full", n_train=50, n_test=20)
    only_test = tmp_path / "t"
    only_test.mkdir()
    for name in TEST:
        shutil.copy(full / name, only_test / name)
    test = load_test_set("mnist", only_test)
    assert test.x_test.shape == (20, 1, 28, 28) and test.x_train.shape == (0, 1, 28, 28)
    shard = load_train_shard("mnist", full)
    assert shard.x_train.shape == (50, 1, 28, 28) and len(shard.y_test) == 0
    with pytest.raises(DatasetNotFoundError, match="train-images"):
        load_train_shard("mnist", only_test)
