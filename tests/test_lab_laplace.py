"""004's Laplace variant of fedsgd-dpc in the lab pair: each reply is a
``record-laplace/v1`` event with the device's own l1 clip, Laplace scale and full batch, the
same in both ledgers; an edge refuses a round whose event is not its own (loopback only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from edge_device.lab.agent import EdgeAgent
from testbed.core.config.loader import dump_yaml, load_experiment, load_hardware
from testbed.core.models import n_params
from testbed.core.record_schemes import resolve_record_uplinks
from testbed.core.run_setup import initial_model, prepare_data
from testbed.core.transport.protocol import Message, decode, encode
from testbed.lab.launch import launch
from tests.lab_helpers import (
    RECORD_CONFIG,
    RECORD_SETS,
    assert_ledgers_agree,
    ledger_by_nonce,
    processes_mentioning,
)

#: 004 with Laplace noise: b = 2 of 3 devices per round, round robin, one full-batch step;
#: a set Laplace parameter b = s / (xi_1 / D) (no calibration at start-up).
LAPLACE_SETS = [*RECORD_SETS[:3], "eval_every=100", "scheme=fedsgd-dpc",
                "privacy.noise=per-step", "privacy.noise_distribution=laplace",
                "local_steps=1", "clients_per_round=2", "privacy.noise_multiplier=2.0"]


def test_laplace_lab_run_records_laplace_events_and_ledgers_agree(tmp_path: Path) -> None:
    out = tmp_path / "lab"
    code = launch(RECORD_CONFIG, 3, out, overrides=[*LAPLACE_SETS, "rounds=2"], hw_overrides=[],
                  round_timeout_s=60, join_timeout_s=120)
    assert code == 0
    run = out / "aggregator"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for t, line in enumerate(lines):  # round robin, each reply decoded
        sent = {d["device"] for d in line["devices"] if d.get("transmitted")}
        assert sent == {(2 * t + j) % 3 for j in range(2)} and line["uploads"] == 2
    # The events carry what the in-process run derives for each device: its shard size as
    # the full batch and normalizer, the l1 clip, s_i = b xi_1 / D_i.
    cfg = load_experiment(run / "config.yaml")
    _, parts = prepare_data(cfg)
    sizes = [len(p) for p in parts]
    d = summary["d"]
    settings = [rs for _, rs in resolve_record_uplinks(cfg, load_hardware(cfg.hw_config), d,
                                                        sizes)]
    events = ledger_by_nonce(run / "ledger.jsonl")
    assert sorted((e["round"], e["device"]) for e in events.values()) == [
        (0, 0), (0, 1), (1, 0), (1, 2)]
    for e in events.values():
        rs = settings[e["device"]]
        assert e["type"] == "record-laplace/v1"
        assert e["dataset_size"] == sizes[e["device"]] == rs.dataset_size
        assert e["example_clip"] == cfg.privacy.example_clip == rs.example_clip
        assert e["scale"] == rs.laplace_scale
        assert np.isclose(e["scale"], 2.0 * cfg.privacy.example_clip / sizes[e["device"]],
                          rtol=1e-12)
    for dev in summary["privacy"]["devices"]:
        assert dev["noise_multiplier"] == 2.0 and dev["channel_credited"] is False
    assert_ledgers_agree(run, {i: out / f"edge-{i}" for i in range(3)})
    assert not processes_mentioning(str(tmp_path))


class _Client:
    """The aggregator's end of the control plane, in process: records what the edge sends."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, frames: list[bytes], timeout_s: float = 5.0) -> None:
        self.sent.append(decode(frames))

    def recv(self, timeout_s: float) -> list[bytes] | None:
        return None


def test_edge_refuses_a_round_whose_laplace_event_is_not_its_own(tmp_path: Path) -> None:
    cfg = load_experiment(RECORD_CONFIG, [*LAPLACE_SETS, "devices=3", "rounds=2"])
    agent = EdgeAgent("tcp://127.0.0.1:9", 0, tmp_path, tmp_path / "s")
    (tmp_path / "s").mkdir()
    client: Any = _Client()
    agent.handle(client, encode("welcome", {"device": 0, "run_id": "laplace",
                                            "config_yaml": dump_yaml(cfg),
                                            "mask_secret": "ab" * 16, "next_round": 0,
                                            "radios": ""}))
    assert client.sent[-1].type == "ready"
    mine = agent._event(0, None).to_dict()
    assert mine["type"] == "record-laplace/v1"
    d = n_params(initial_model(cfg, (1, 28, 28)))
    weights = np.zeros(d, "<f8").tobytes()

    def round_msg(nonce: str, mechanism: dict[str, Any]) -> list[bytes]:
        return encode("round", {"device": 0, "round": 0, "nonce": nonce, "d": d,
                                "channel": None, "mechanism": mechanism, "slot": 0,
                                "deadline_s": 30.0, "tx_time_s": None, "await_slot": False,
                                "aircomp": None},
                      weights)

    agent.handle(client, round_msg("n-1", {**mine, "scale": 2 * mine["scale"]}))
    refused = client.sent[-1]
    assert refused.type == "refuse" and "scale" in refused["reason"]
    assert agent.book is not None and not agent.book.nonces()  # nothing recorded
    agent.handle(client, round_msg("n-2", mine))
    assert client.sent[-1].type == "upload" and client.sent[-1]["nonce"] == "n-2"
    agent.book.close()
