"""Scheme ``aircomp`` end to end on the symbol link: one slot per round, every device's share
of the noise, the distributed-DP ledger, the budget kept, a misestimated channel charged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aggregator import aircomp_round
from aggregator.aircomp_round import usable_kept
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.runner import run_experiment
from tests.conftest import make_idx_dataset

N = 10
SETS = ["scheme=aircomp", "dataset=mnist", "model=logreg", f"devices={N}", "rounds=4",
        "local_steps=1", "batch_size=32", "lr=0.5", "partition=iid", "privacy.noise=upload",
        "privacy.epsilon=2", "link=symbol", "eval_every=4"]


def _run(tmp_path: Path, extra: list[str], name: str = "run") -> tuple[dict, Path]:
    data = make_idx_dataset(tmp_path / "data", n_train=2000, n_test=200)
    cfg = load_experiment(None, [*SETS, f"data_dir={data}", *extra])
    out = tmp_path / name
    return run_experiment(cfg, out), out


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_every_round_is_one_slot_and_every_device_stays_within_target(tmp_path: Path) -> None:
    summary, out = _run(tmp_path, [])
    assert summary["status"] == "completed"
    events = [e for e in _lines(out / "ledger.jsonl") if e.get("type") == "record-aircomp/v1"]
    assert len(events) == 4 * N
    assert all(len(e["others_noise_std"]) == N - 1 for e in events)
    for line in _lines(out / "metrics.jsonl"):
        air = line["aircomp"]
        assert air["participants"] == line["uploads"] == N and air["slots"] == 1
        # the slot also carries the 256-symbol probe (each TDMA upload would not)
        assert air["tdma_airtime_s"] == pytest.approx(N * (air["airtime_s"] - 256 / 200e3))
        assert abs(air["probe_nmse_db"] - air["nmse_db"]) < 3.0
        assert 0 < air["nmse"] < 0.1  # measured about 3e-3 (-25 dB) at the 20 dB default
    privacy = summary["privacy"]
    assert privacy["trust"].startswith("Distributed model (over-the-air aggregation)")
    for dev in privacy["devices"]:
        assert dev["epsilon"] <= 2.0
        # own noise only: a tenth of the variance, far more epsilon
        assert dev["epsilon_all_colluding"] > 3 * dev["epsilon"]
        assert dev["colluding_devices"] == 0


def test_all_others_colluding_is_local_dp_again(tmp_path: Path) -> None:
    """With t = N - 1 every device carries the whole noise: the enforced epsilon is the
    all-colluding one, within the target."""
    summary, _ = _run(tmp_path, [f"privacy.colluding_devices={N - 1}"])
    assert summary["status"] == "completed"
    for dev in summary["privacy"]["devices"]:
        assert dev["epsilon"] == pytest.approx(dev["epsilon_all_colluding"], rel=1e-9)
        assert dev["epsilon"] <= 2.0


def test_a_misestimated_channel_is_charged_and_the_budget_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device 3's channel estimate is 20 % low every round: it pre-equalizes 1.25x too
    strongly, its events carry rho_upper = 1.25 and it spends more per round than the
    others; the gate keeps it within its target (it sits out once the next slot would
    pass it)."""
    real_init = aircomp_round.AirCompRound.__init__

    def misestimate(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        real_init(self, *args, **kwargs)
        if 3 in self.h_hat:
            self.h_hat[3] *= 0.8

    monkeypatch.setattr(aircomp_round.AirCompRound, "__init__", misestimate)
    summary, out = _run(tmp_path, ["privacy.epsilon=8"])
    events = [e for e in _lines(out / "ledger.jsonl") if e.get("type") == "record-aircomp/v1"]
    rho = {(e["device"], e["round"]): e["gain_ratio_upper"] for e in events}
    assert rho[(3, 0)] == pytest.approx(1.25) and rho[(0, 0)] == pytest.approx(1.0)
    devs = {d["device"]: d for d in summary["privacy"]["devices"]}
    assert all(d["epsilon"] <= 8.0 for d in devs.values())
    per_round = {i: devs[i]["epsilon"] / devs[i]["uploads"] for i in (0, 3)}
    assert per_round[3] > per_round[0]
    assert devs[3]["uploads"] < 4 or devs[3]["epsilon"] > devs[0]["epsilon"]


@pytest.mark.parametrize(("extra", "words"), [
    (["privacy.noise=per-step"], "privacy.noise: got 'per-step'; scheme aircomp needs 'upload'"),
    (["privacy.unit=device"], "privacy.unit: got 'device'; scheme aircomp needs 'record'"),
    ([f"privacy.dropout_margin={N - 1}", "privacy.colluding_devices=1"],
     "privacy.dropout_margin: got 9; colluding_devices + dropout_margin may be at most"),
    ([f"privacy.colluding_devices={N}"], "privacy.colluding_devices: got 10; at most"),
])
def test_configs_aircomp_cannot_run_are_refused(extra: list[str], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [*SETS, *extra])
    assert words in str(info.value)


def test_colluding_devices_belongs_to_aircomp() -> None:
    with pytest.raises(ConfigError, match="only for scheme aircomp"):
        load_experiment(None, ["scheme=ldp-fedavg", "privacy.colluding_devices=2"])


def test_a_partly_kept_slot_drops_its_sum() -> None:
    total = np.ones(3)
    slot = {"aircomp_participants": [0, 1, 2]}
    whole = {0: (total, slot), 1: (None, slot), 2: (None, slot)}
    assert usable_kept(whole) is whole
    part = usable_kept({0: (total, slot), 1: (None, slot)})
    assert all(vec is None for vec, _ in part.values()) and set(part) == {0, 1}


def test_the_lab_processes_refuse_it_on_a_simulated_link_before_starting_anything(
        tmp_path: Path) -> None:
    """Over a simulated link each edge would send its values to the aggregator."""
    from testbed.lab.launch import launch

    with pytest.raises(ConfigError, match="the lab processes runs on radios"):
        launch(None, 3, tmp_path / "lab", overrides=["scheme=aircomp", "privacy.noise=upload",
                                                    "local_steps=1"],
               hw_overrides=[], round_timeout_s=10, join_timeout_s=10)
    assert not (tmp_path / "lab").exists()


def test_the_shipped_config_runs(tmp_path: Path) -> None:
    """``testbed/config/aircomp-fedsgd.yaml`` on Fashion-MNIST, two rounds (its 900 are
    measured in docs/aircomp.md)."""
    root = Path(__file__).resolve().parents[1]
    cfg = load_experiment(root / "testbed" / "config" / "aircomp-fedsgd.yaml",
                          ["rounds=2", "eval_samples=500", "eval_every=2"])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    assert all(d["epsilon"] <= 5.0 for d in summary["privacy"]["devices"])
