"""fedsgd-dpc (004) and zcdp-secagg (002) as schemes of `testbed run`: device sampling per
round, secure aggregation of the participants' updates, the papers' epsilon beside ours."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.core.secagg.aggregation import secure_sum
from testbed.runner import run_experiment

BASE = ["privacy.noise=per-step", "rounds=4", "train_samples=6000", "eval_samples=200",
        "batch_size=128", "devices=6", "clients_per_round=3", "eval_every=100"]


@pytest.mark.parametrize("sets, key", [
    (["scheme=ldp-fedavg", "clients_per_round=2"], "clients_per_round"),
    (["scheme=zcdp-secagg", "clients_per_round=2"], "clients_per_round"),
    (["scheme=fedsgd-dpc", "local_steps=2"], "local_steps"),
    (["scheme=fedsgd-dpc", "clients_per_round=20", "local_steps=1"], "clients_per_round"),
])
def test_bad_peer_settings_name_the_key(sets: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_experiment(None, sets)


def test_secure_sum_is_the_sum() -> None:
    rng = np.random.default_rng(0)
    ups = {i: rng.normal(size=50) for i in range(4)}
    np.testing.assert_allclose(secure_sum(ups, 0), sum(ups.values()), atol=1e-8)


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_fedsgd_dpc_round_robin(tmp_path: Path) -> None:
    cfg = load_experiment(None, ["scheme=fedsgd-dpc", "local_steps=1", *BASE])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    for t, line in enumerate(_lines(tmp_path / "run")):
        up = {d["device"] for d in line["devices"] if d.get("transmitted")}
        assert up == {(3 * t + j) % 6 for j in range(3)}
        assert line["uploads"] == 3
    for dev in summary["privacy"]["devices"]:
        assert dev["uploads"] == 2  # 4 rounds x 3 of 6
        assert dev["epsilon_peer_paper"]["replies"] == 2
        assert dev["epsilon"] <= cfg.privacy.epsilon


def test_zcdp_secagg_sums_securely_off_the_radio(tmp_path: Path) -> None:
    cfg = load_experiment(None, ["scheme=zcdp-secagg", "local_steps=2", *BASE])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    for line in _lines(tmp_path / "run"):
        sent = [d for d in line["devices"] if d.get("transmitted")]
        assert len(sent) == 3 and line["uploads"] == 1  # one (secure) sum
        assert all("control plane" in d["carrier"] and d["energy_comm_j"] == 0 for d in sent)
    total = sum(d["uploads"] for d in summary["privacy"]["devices"])
    assert total == 4 * 3
    dev = summary["privacy"]["devices"][0]
    peer = dev["epsilon_peer_paper"]
    assert "non" in peer["trust"] or "honest" in peer["trust"]
    if dev["uploads"]:
        assert peer["epsilon"] is not None and peer["epsilon"] > 0
