"""A lab's own model and data set by import string (docs/extensions.md): config errors,
import and factory errors, and examples/iq_modulation.yaml in every kind of process
(``testbed run``, ``testbed launch`` with its edges, a sweep's cells)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.core.config.safe_yaml import dump_yaml_text
from testbed.core.extensions import ExtensionError
from testbed.core.run_setup import initial_model, prepare_data, prepare_test_data
from testbed.lab.launch import launch
from testbed.runner import run_experiment
from tests.lab_helpers import RECORD_CONFIG, RECORD_SETS, processes_mentioning

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "iq_modulation.yaml")
LOADER = "examples.iq_modulation:loader"
MODEL = "examples.iq_modulation:model"
SCHEME = "examples.own_schemes:MajorityVote"


# -- factories and loaders the tests name by import string ------------------------------------


def not_a_module(input_shape: tuple[int, ...], n_classes: int) -> str:
    """A factory that returns no ``torch.nn.Module``."""
    return "a model"


def bn_model(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """A model with batch normalisation (record-level privacy refuses it)."""
    return nn.Sequential(nn.Conv1d(input_shape[0], 4, 3), nn.BatchNorm1d(4), nn.Flatten(),
                         nn.LazyLinear(n_classes))


def bad_labels(data_dir: str | None) -> tuple[np.ndarray, ...]:
    """A loader whose labels are floats."""
    x = np.zeros((10, 3), np.float32)
    return x, np.zeros(10), x, np.zeros(10, np.int64)


def tiny(data_dir: str | None) -> tuple[np.ndarray, ...]:
    """Five labels over 2-sample vectors; ``data_dir`` is echoed in the first sample."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 2)).astype(np.float64)
    if data_dir is not None:
        x[0, 0] = len(data_dir)
    return x, np.arange(60) % 4, x[:20], np.arange(20) % 5


def _refused(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, overrides)
    return str(info.value)


# -- a) errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["pkg.mod", "pkg.mod:f-g", ":f", "pkg mod:f", "a.b:c:d", "1x:f"])
@pytest.mark.parametrize("key", ["model", "dataset"])
def test_bad_import_string_syntax_is_refused_naming_key_and_allowed(key: str, value: str) -> None:
    message = _refused([f"{key}={value}"])
    assert f"config key '{key}'" in message and repr(value) in message
    assert "import string 'package.module:" in message


def test_import_failures_and_bad_factories_are_clear() -> None:
    cfg = load_experiment(None, [f"dataset={LOADER}", "model=no_such_pkg.models:net"])
    with pytest.raises(ExtensionError, match=r"model: 'no_such_pkg.models:net': cannot import "
                       r"module 'no_such_pkg.models'.*extensions_path"):
        initial_model(cfg, (2, 64), n_classes=4)
    cfg = load_experiment(None, [f"dataset={LOADER}", "model=examples.iq_modulation:nope"])
    with pytest.raises(ExtensionError, match=r"has no attribute 'nope'"):
        initial_model(cfg, (2, 64), n_classes=4)
    cfg = load_experiment(None, [f"dataset={LOADER}", "model=tests.test_extensions:not_a_module"])
    with pytest.raises(ExtensionError, match=r"returned a str, not a torch.nn.Module"):
        initial_model(cfg, (2, 64), n_classes=4)
    cfg = load_experiment(None, ["dataset=tests.test_extensions:bad_labels", "model=logreg"])
    with pytest.raises(ExtensionError, match=r"dataset: .*bad_labels.*y_train .*float64"):
        prepare_data(cfg)


def test_a_loader_is_partitioned_capped_and_counts_its_labels(tmp_path: Path) -> None:
    cfg = load_experiment(None, ["dataset=tests.test_extensions:tiny", "model=logreg",
                                 "devices=3", "train_samples=30", "eval_samples=7",
                                 "partition=iid", f"data_dir={tmp_path}"])
    data, parts = prepare_data(cfg)
    assert data.n_classes == 5 and data.x_train.dtype == np.float32
    assert data.x_train.shape == (30, 2) and data.x_test.shape == (7, 2)
    assert sorted(np.concatenate(parts).tolist()) == list(range(30))
    test = prepare_test_data(cfg)  # the aggregator: the test split, the same label count
    assert len(test.y_train) == 0 and test.x_test.shape == (7, 2) and test.n_classes == 5
    model = initial_model(cfg, data.x_train.shape[1:], n_classes=data.n_classes)
    assert model(torch.zeros(1, 2)).shape == (1, 5)


def test_extensions_path_is_stored_absolute(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_experiment(None, ["extensions_path=[lib, /opt/x]"])
    assert cfg.extensions_path == [str(tmp_path / "lib"), "/opt/x"]


# -- e) record-level privacy refuses a user model with batch norm ----------------------------


def test_record_level_scheme_refuses_a_batchnorm_model_naming_the_layer(tmp_path: Path) -> None:
    cfg = load_experiment(RECORD_CONFIG, [*RECORD_SETS, f"dataset={LOADER}",
                                          "model=tests.test_extensions:bn_model", "devices=3"])
    with pytest.raises(ValueError, match=r"record-level privacy: module '1' is BatchNorm1d"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the run directory was kept


# -- b) testbed run; c) testbed launch; d) a sweep ------------------------------------------


def _weights(run_dir: Path) -> np.ndarray:
    with np.load(run_dir / "checkpoint.npz") as z:
        return z["weights"].copy()


def test_testbed_run_records_the_import_strings_and_learns(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "run", EXAMPLE, "--out", str(out), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    # chance: 0.25; measured 0.704 (its 5 rounds; 0.372 after 3, 0.462 after 2)
    assert summary["final_accuracy"] > 0.45
    meta = json.loads((out / "meta.json").read_text())
    example = REPO / "examples" / "iq_modulation.py"
    digest = hashlib.sha256(example.read_bytes()).hexdigest()
    for key, spec in (("model", MODEL), ("dataset", LOADER)):
        facts = meta["extensions"][key]
        assert facts["import"] == spec and facts["file"] == str(example)
        assert facts["sha256"] == digest and "version" in facts
    report = (out / "report.md").read_text()
    for spec in (MODEL, LOADER):
        assert f"| {spec} | meta.json: extensions." in report
    assert f"| {digest} | meta.json: extensions.model.sha256 |" in report


def test_launch_imports_them_on_every_edge_and_equals_the_in_process_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the edges import examples.iq_modulation from here
    # ...and a lab's own scheme: each edge runs its prepare, the aggregator its combine
    overrides = ["rounds=2", f"scheme={SCHEME}"]
    code = launch(EXAMPLE, 3, tmp_path / "lab", overrides=overrides, hw_overrides=[],
                  round_timeout_s=60, join_timeout_s=120)
    assert code == 0
    cfg = load_experiment(EXAMPLE, [*overrides, "devices=3"])
    assert run_experiment(cfg, tmp_path / "inproc")["status"] == "completed"
    lab = json.loads((tmp_path / "lab" / "aggregator" / "summary.json").read_text())
    assert lab["status"] == "completed" and lab["rounds_completed"] == 2
    meta = json.loads((tmp_path / "lab" / "aggregator" / "meta.json").read_text())
    assert meta["extensions"]["scheme"]["import"] == SCHEME
    np.testing.assert_allclose(_weights(tmp_path / "lab" / "aggregator"),
                               _weights(tmp_path / "inproc"), rtol=0, atol=1e-6)
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow  # 10 s; by default: the extensions in a run and on every edge, sweeps
def test_a_two_cell_sweep_over_it_completes(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(dump_yaml_text({"base": EXAMPLE, "set": {"rounds": 2, "scheme": SCHEME},
                                     "grid": {"lr": [0.05, 0.1]}}), encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "sweep", str(sweep), "--out", str(out), "--cpus", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300, start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"
        facts = json.loads((run / "meta.json").read_text())["extensions"]
        assert facts["model"]["import"] == MODEL and facts["scheme"]["import"] == SCHEME


def test_an_edge_data_dir_is_passed_to_the_loader_and_its_train_split_is_the_shard(
    tmp_path: Path,
) -> None:
    from testbed.core.run_setup import prepare_own_shard

    cfg = load_experiment(None, ["dataset=tests.test_extensions:tiny", "model=logreg"])
    shard = prepare_own_shard(cfg, tmp_path)
    assert shard.x_train.shape == (60, 2) and len(shard.y_test) == 0 and shard.n_classes == 5
    assert shard.x_train[0, 0] == len(str(tmp_path))
