"""Lab deployment over loopback: launch equals the in-process run, edges and the aggregator
survive kill -9, both ledgers agree, the edge enforces its own target (loopback only)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.core.config.loader import load_experiment
from testbed.lab.launch import launch
from testbed.runner import run_experiment
from tests.lab_helpers import (
    PLAIN_SETS,
    RECORD_CONFIG,
    RECORD_SETS,
    assert_ledgers_agree,
    edge_cmd,
    intruder_keys,
    new_lab,
    processes_mentioning,
    sets,
    tb_cmd,
)


def _weights(run_dir: Path) -> np.ndarray:
    with np.load(run_dir / "checkpoint.npz") as z:
        return z["weights"].copy()


@pytest.mark.slow  # test_edge_own_data and test_extensions check the same (launch = in-process
# weights, relayed lines, outcome line last, each edge's energy) on smaller data
def test_launch_equals_in_process_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [*PLAIN_SETS, "rounds=5", "energy.source=auto"]
    code = launch(None, 4, tmp_path / "lab", overrides=overrides, hw_overrides=[],
                  round_timeout_s=60, join_timeout_s=120)
    assert code == 0
    # the aggregator's joins and per-round lines relayed as they came; the outcome line last
    out = capsys.readouterr()
    relayed = out.err.splitlines()
    assert relayed.count("aggregator: all 4 devices joined") == 1
    assert [ln.split(":")[1] for ln in relayed if ln.startswith("aggregator: round ")] == [
        f" round {k}/5" for k in range(1, 6)]
    assert out.out.splitlines()[-1].startswith("run completed: 5/5 rounds, final test accuracy")
    cfg = load_experiment(None, [*overrides, "devices=4"])
    summary = run_experiment(cfg, tmp_path / "inproc")
    assert summary["status"] == "completed"
    lab = json.loads((tmp_path / "lab" / "aggregator" / "summary.json").read_text())
    assert lab["status"] == "completed" and lab["rounds_completed"] == 5
    np.testing.assert_allclose(_weights(tmp_path / "lab" / "aggregator"),
                               _weights(tmp_path / "inproc"), rtol=0, atol=1e-6)
    # every edge computed its own energy, labelled with its source
    line = json.loads((tmp_path / "lab" / "aggregator" / "metrics.jsonl").read_text()
                      .splitlines()[-1])
    for dev in line["devices"]:
        assert dev["energy_comp_j"] > 0
        assert dev["energy_comp_source"].startswith(("modelled", "measured (RAPL"))
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.gnuradio
@pytest.mark.slow  # 16 s; the lab's flowgraphs run in test_virtual_lab
def test_launch_over_the_gnuradio_channel_emulator(tmp_path: Path) -> None:
    code = launch(None, 4, tmp_path / "lab", overrides=[*PLAIN_SETS, "rounds=5",
                                                        "link=gnuradio"],
                  hw_overrides=[], round_timeout_s=60, join_timeout_s=120)
    assert code == 0
    lab = json.loads((tmp_path / "lab" / "aggregator" / "summary.json").read_text())
    assert lab["status"] == "completed" and lab["link"] == "gnuradio"
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow  # default: test_lab_resume's edge kill; test_virtual_lab_faults (slow) too
def test_edge_killed_mid_round_rejoins_and_ledgers_agree(tmp_path: Path) -> None:
    keys, endpoint, procs = new_lab(tmp_path, 3)
    run = tmp_path / "agg"
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", RECORD_CONFIG, "--bind", endpoint, "--keys", str(keys), "--out",
            str(run), "--round-timeout", "8", "--join-timeout", "120", "--no-progress",
            "--rejoin-wait", "120", *sets([*RECORD_SETS, "devices=3", "rounds=6"])))
        procs.start("edge-0", edge_cmd(keys, endpoint, tmp_path, 0))
        procs.start("edge-2", edge_cmd(keys, endpoint, tmp_path, 2))
        # device 1 dies (SIGKILL) in round 2, journalled but before its upload left
        victim = procs.start("edge-1", edge_cmd(keys, endpoint, tmp_path, 1),
                             env={"TESTBED_FAULT": "edge_after_intent:3"})
        assert victim.wait(180) == -9
        procs.start("edge-1b", edge_cmd(keys, endpoint, tmp_path, 1))
        assert agg.wait(240) == 0, procs.log("agg")
        for p in procs.procs[1:]:
            if p is not victim:
                assert p.wait(30) == 0
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert len(lines) == 6
        dev1 = lines[2]["devices"][1]
        assert dev1.get("straggler") or dev1.get("rejoined"), dev1
        assert any(line["devices"][1].get("transmitted") is True for line in lines[3:])
        assert_ledgers_agree(run, {i: tmp_path / f"edge-{i}" for i in range(3)})
    finally:
        procs.close()
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow  # default: test_lab_resume's aggregator kills after a commit (2 schemes)
def test_aggregator_killed_resumes_and_ledgers_agree(tmp_path: Path) -> None:
    keys, endpoint, procs = new_lab(tmp_path, 3)
    run = tmp_path / "agg"
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", RECORD_CONFIG, "--bind", endpoint, "--keys", str(keys), "--out",
            str(run), "--round-timeout", "30", "--join-timeout", "120", "--no-progress",
            *sets([*RECORD_SETS, "devices=3", "rounds=5"])),
            env={"TESTBED_FAULT": "after_commit:8"})  # round 2, second upload
        edges = [procs.start(f"edge-{i}", edge_cmd(keys, endpoint, tmp_path, i,
                                                "--rejoin-after", "2")) for i in range(3)]
        assert agg.wait(180) == -9
        again = procs.start("agg-resume", tb_cmd(
            "aggregator", "--bind", endpoint, "--keys", str(keys), "--resume", str(run),
            "--round-timeout", "30", "--join-timeout", "120", "--no-progress"))
        assert again.wait(240) == 0, procs.log("agg-resume")
        for p in edges:
            assert p.wait(30) == 0
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds_completed"] == 5
        assert_ledgers_agree(run, {i: tmp_path / f"edge-{i}" for i in range(3)})
    finally:
        procs.close()
    assert not processes_mentioning(str(tmp_path))


def test_edge_refuses_past_its_own_target(tmp_path: Path) -> None:
    keys, endpoint, procs = new_lab(tmp_path, 2)
    run = tmp_path / "agg"
    cap = 3.5
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", RECORD_CONFIG, "--bind", endpoint, "--keys", str(keys), "--out",
            str(run), "--round-timeout", "60", "--join-timeout", "120", "--no-progress",
            *sets(["train_samples=4000", "eval_samples=300", "batch_size=256",
                   "scheme=ldp-fedavg", "eval_every=100", "devices=2", "rounds=6"])))
        procs.start("edge-0", edge_cmd(keys, endpoint, tmp_path, 0))
        procs.start("edge-1", edge_cmd(keys, endpoint, tmp_path, 1, "--max-epsilon", str(cap)))
        assert agg.wait(240) == 0, procs.log("agg")
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        refused = [line["round"] for line in lines if line["devices"][1].get("refused")]
        assert refused, "the capped edge never refused"
        assert "own epsilon target" in lines[refused[0]]["devices"][1]["refused"]
        summary = json.loads((run / "summary.json").read_text())
        dev1 = summary["privacy"]["devices"][1]
        assert dev1["epsilon"] <= cap < summary["privacy"]["epsilon_target"]
        assert 0 < dev1["uploads"] < 6 == summary["privacy"]["devices"][0]["uploads"]
        assert_ledgers_agree(run, {i: tmp_path / f"edge-{i}" for i in range(2)})
    finally:
        procs.close()


def test_edge_whose_key_is_not_allowed_is_refused(tmp_path: Path) -> None:
    keys, endpoint, procs = new_lab(tmp_path, 1)
    intruder = intruder_keys(tmp_path, keys)
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", "--bind", endpoint, "--keys", str(keys), "--out", str(tmp_path / "a"),
            "--join-timeout", "6", "--no-progress", *sets([*PLAIN_SETS, "devices=1"])))
        procs.start("edge", edge_cmd(intruder, endpoint, tmp_path, 0))
        assert agg.wait(120) == 2
        assert "devices [0] did not join" in procs.log("agg")
        assert not (tmp_path / "a").exists()  # nothing ran, nothing left
    finally:
        procs.close()


@pytest.mark.slow  # the selection is RoundLoop's, as in-process (test_peer_sampled_runs)
def test_fedsgd_dpc_round_robin_in_thenew_lab(tmp_path: Path) -> None:
    out = tmp_path / "lab"
    code = launch(RECORD_CONFIG, 4, out, overrides=[
        *RECORD_SETS[:3], "scheme=fedsgd-dpc", "privacy.noise=per-step", "local_steps=1",
        "clients_per_round=2", "rounds=3", "eval_every=100", "train_samples=8000",
    ], hw_overrides=[], round_timeout_s=60, join_timeout_s=120)
    assert code == 0
    run = out / "aggregator"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for t, line in enumerate(lines):
        sent = {d["device"] for d in line["devices"] if d.get("transmitted")}
        assert sent == {(2 * t + j) % 4 for j in range(2)}
    assert_ledgers_agree(run, {i: out / f"edge-{i}" for i in range(4)})
    assert not processes_mentioning(str(tmp_path))
