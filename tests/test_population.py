"""Large populations: a seeded sample of devices per round, device state made on first
selection, settings resolved once per kind of device, nothing copied per device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aggregator.round_loop import RoundLoop
from aggregator.run_rounds import run_rounds
from aggregator.sampling import round_devices
from edge_device.dp_trainer import RecordTrainer
from edge_device.trainer import LocalTrainer
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.data.coded import CodedImages
from testbed.core.models import build_model, get_flat
from testbed.core.privacy import Ledger
from testbed.core.record_schemes import resolve_record_uplinks
from testbed.core.run_setup import device_settings, prepare_data
from testbed.core.runs.run_metadata import write_metadata
from testbed.core.runs.rundir import RunDir, read_jsonl
from testbed.core.schemes import resolve_uplinks
from testbed.local_devices import LocalDevices
from testbed.runner import local_loop


def _run(cfg: ExperimentConfig, path: Path) -> tuple[RoundLoop, dict[str, Any]]:
    hw = load_hardware(cfg.hw_config)
    rundir = RunDir.create(path)
    write_metadata(rundir, cfg, hw)
    loop = local_loop(cfg, hw, rundir)
    return loop, run_rounds(loop)


def _workers(loop: RoundLoop) -> dict[int, Any]:
    assert isinstance(loop.devices, LocalDevices)
    return loop.devices.device_workers


def _population(tiny: list[str], *extra: str) -> ExperimentConfig:
    # 600 training samples over 60 devices: 10 each; 6 asked per round.
    return load_experiment(None, [*tiny, "devices=60", "sample_devices=6", "batch_size=5",
                                  "rounds=4", *extra])


def test_sampled_rounds_make_state_only_for_the_devices_asked(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    exp, summary = _run(_population(tiny_overrides), tmp_path / "run")
    assert summary["status"] == "completed", summary["reason"]
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    asked = [sorted(exp.selected_devices(t)) for t in range(4)]
    for t, line in enumerate(lines):
        assert [d["device"] for d in line["devices"]] == asked[t]  # no "not selected" rows
        assert line["selected"] == 6 and line["population"] == 60
        assert line["uploads"] == 6 and all(d["transmitted"] for d in line["devices"])
    ever = set().union(*map(set, asked))
    assert 6 < len(ever) < 60
    assert set(_workers(exp)) == ever  # state for the devices asked, and only them
    assert all(w._trainer is not None for w in _workers(exp).values())
    listed = [d["device"] for d in summary["privacy"]["devices"]]
    assert listed == sorted(ever)
    assert summary["privacy"]["devices_never_asked"] == 60 - len(ever)
    # Reproducible from the seed (the same rounds after a resume), another seed another draw.
    assert asked == [sorted(exp.selected_devices(t)) for t in range(4)]
    other = _population(tiny_overrides, "seed=1")
    assert [sorted(round_devices(other, t)) for t in range(4)] != asked


def test_sampled_private_run_charges_only_the_devices_asked(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = _population(tiny_overrides, "scheme=channel-dp", "privacy.epsilon=40",
                      "privacy.noise_multiplier=2", "snr_db=10", "workers=2")
    exp, summary = _run(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary["reason"]
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        charged = {(e.device, e.round) for e in ledger.events()}
    assert charged == {(i, t) for t in range(4) for i in exp.selected_devices(t)}
    for dev in summary["privacy"]["devices"]:
        uploads = sum(dev["device"] in exp.selected_devices(t) for t in range(4))
        assert dev["uploads"] == uploads and 0 < dev["epsilon"] <= 40


def test_sampled_run_in_workers_equals_the_sequential_one(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    _, one = _run(_population(tiny_overrides, "workers=1"), tmp_path / "one")
    _, two = _run(_population(tiny_overrides, "workers=2"), tmp_path / "two")
    assert one["workers"] == 1 and two["workers"] == 2
    a, b = (RunDir(tmp_path / r).load_checkpoint() for r in ("one", "two"))
    assert a is not None and b is not None
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize(
    "sets",
    [
        ["snr_db=[10, 20, 10, 20, 10, 15]", "scheme=ldp-fedavg", "privacy.unit=device"],
        ["snr_db=[10, 20, 10, 20, 10, 15]", "scheme=channel-dp", "privacy.noise=upload",
         "local_steps=1"],
        ["scheme=dp-pasgd", "privacy.noise=per-step", "partition=noniid"],
    ],
)
def test_settings_resolved_once_per_kind_equal_the_full_resolution(
    tiny_overrides: list[str], sets: list[str]
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "devices=6", "batch_size=16", *sets])
    hw = load_hardware(cfg.hw_config)
    sizes = [len(p) for p in prepare_data(cfg)[1]]
    d = 7850
    uplinks, record = device_settings(cfg, hw, d, sizes)
    if cfg.privacy.unit == "record":
        full = resolve_record_uplinks(cfg, hw, d, sizes)
        assert uplinks == [u for u, _ in full] and record == [r for _, r in full]
    else:
        assert uplinks == resolve_uplinks(cfg, hw, d) and record == [None] * 6
    assert len({id(u) for u in uplinks}) < 6  # shared between devices of a kind


def test_trainers_read_index_rows_without_copying(tiny_overrides: list[str]) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "devices=5"])
    data, parts = prepare_data(cfg)
    x, y, p = data.x_train, data.y_train, parts[2]
    model = build_model("logreg", (1, 28, 28), 0)
    w = get_flat(model)
    shared = LocalTrainer(model, x, y, p)
    assert isinstance(x, CodedImages)  # the shipped sets: kept as 8-bit codes
    assert shared.data.x.data_ptr() == torch.from_numpy(x.codes).data_ptr()  # not a copy
    kw: dict[str, Any] = {"steps": 3, "batch_size": 16, "lr": 0.1}
    a = shared.train(w, rng=np.random.default_rng(5), **kw)
    b = LocalTrainer(model, x[p], y[p]).train(w, rng=np.random.default_rng(5), **kw)
    np.testing.assert_array_equal(a.differential, b.differential)
    dp: dict[str, Any] = {"steps": 2, "expected_batch_size": 16, "lr": 0.1, "example_clip": 1.0,
                          "noise_multiplier": 0.0, "secure_sampling": False}
    c = RecordTrainer(model, x, y, index=p).train(w, rng=np.random.default_rng(6), **dp)
    e = RecordTrainer(model, x[p], y[p]).train(w, rng=np.random.default_rng(6), **dp)
    np.testing.assert_array_equal(c.differential, e.differential)
    with pytest.raises(ValueError, match="index outside"):
        LocalTrainer(model, x, y, np.array([0, len(y)]))


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (["sample_devices=0"], "config key 'sample_devices': got 0"),
        (["sample_devices=11"], "sample_devices: got 11; at most devices (10)"),
        (["sample_devices=few"], "config key 'sample_devices': got 'few'"),
        (["scheme=zcdp-secagg", "privacy.noise=per-step", "sample_devices=4"],
         "scheme 'zcdp-secagg' picks its devices per round itself"),
        (["scheme=fedsgd-dpc", "privacy.noise=per-step", "local_steps=1", "sample_devices=4"],
         "use clients_per_round"),
        (["sample_devices=4", "clients_per_round=4"], "clients_per_round: got 4; only for"),
    ],
)
def test_bad_sampling_values_are_refused(sets: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, sets)
    assert fragment in str(info.value)
