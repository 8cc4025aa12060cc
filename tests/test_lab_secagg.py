"""002's secure aggregation in the lab pair (``zcdp-secagg``): the wire format drives the
protocol's state machines to the exact sum; a lab run sums exactly what the edges trained,
both ledgers agree, and devices dropping before or after their masked input, or too few of
them, do not break the run (loopback only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.aggregate import global_update
from testbed.core.config.loader import load_experiment
from testbed.core.scheme_api import federation_mean
from testbed.core.secagg.aggregation import round_codec
from testbed.core.secagg.device import SecAggDevice
from testbed.core.secagg.server import SecAggServer
from testbed.core.secagg.wire import (
    inbox_fields,
    inbox_from,
    keys_fields,
    keys_from,
    masked_from,
    masked_payload,
    reply_fields,
    reply_from,
    request_fields,
    request_from,
    roster_fields,
    roster_from,
    shares_fields,
    shares_from,
)
from testbed.core.transport.curve_keys import generate_keys
from testbed.core.transport.protocol import Message, ProtocolError, decode, encode
from tests.lab_helpers import (
    RECORD_CONFIG,
    RECORD_SETS,
    Procs,
    assert_ledgers_agree,
    free_port,
    ledger_by_nonce,
    processes_mentioning,
    sets,
    tb_cmd,
)

#: A small zcdp-secagg run: tau = 1 noisy step per round, a set noise multiplier (no
#: calibration at start-up; two rounds stay within the epsilon target).
SECAGG_SETS = [*RECORD_SETS[:3], "eval_every=100", "scheme=zcdp-secagg",
               "privacy.noise=per-step", "local_steps=1", "privacy.noise_multiplier=1.0"]
CARRIER = "control plane (secure aggregation: masked integers, not the radio)"


def _wire(msg_type: str, device: int, fields: dict[str, Any],
          payload: bytes | None = None) -> Message:
    """``fields`` as they arrive: encoded, then decoded and validated."""
    return decode(encode(msg_type, {"device": device, "nonce": "n", **fields}, payload))


def _exact_sum(updates: list[np.ndarray], summands: int) -> np.ndarray:
    """What the server decodes: the sum of the fixed-point encodings, ``(d,)`` float64."""
    codec = round_codec(summands)
    total = np.sum([codec.to_signed(codec.encode(u)) for u in updates], axis=0)
    return np.asarray(total, dtype=np.int64).astype(np.float64) / codec.scale


def test_the_wire_messages_drive_the_protocol_to_the_exact_sum() -> None:
    rng = np.random.default_rng(3)
    d, t, ids = 50, 7, [0, 2, 3, 5, 6]
    codec = round_codec(len(ids))
    updates = {i: rng.normal(0, 0.01, d) for i in ids}
    server = SecAggServer(round_index=t, dimension=d, codec=codec)
    parties = {i: SecAggDevice(i, round_index=t, dimension=d, codec=codec) for i in ids}
    for i in ids:
        advertised = _wire("sa_keys", i, keys_fields(parties[i].advertise_keys()))
        server.receive_keys(keys_from(advertised))
    roster = server.roster()
    members = set(roster.keys)
    for i in ids:
        got = roster_from(_wire("sa_roster", i, roster_fields(roster)))
        sent = _wire("sa_shares", i, shares_fields(parties[i].share_keys(got)))
        server.receive_share_keys(shares_from(sent, members))
    u2, inbox = server.forward_shares()
    for i in ids:
        shares, participants = inbox_from(_wire("sa_inbox", i, inbox_fields(t, u2, inbox[i])))
        parties[i].receive_shares(shares, participants)
    before, after = 3, 5  # 3's masked input never arrives; 5 never answers the unmasking
    for i in set(ids) - {before}:
        m = parties[i].masked_update(updates[i])
        server.receive_masked(masked_from(_wire("sa_masked", i, {
            "round": t, "d": d, "train_loss": 0.1, "energy_comp_j": 0.5,
            "energy_comp_source": "x"}, masked_payload(m))))
    request = server.unmasking_request()
    for i in sorted(request.received - {after}):
        req = request_from(_wire("sa_unmask_req", i, request_fields(request)))
        reply = _wire("sa_unmask", i, reply_fields(parties[i].reveal_shares(req)))
        server.receive_unmasking(reply_from(reply, request))
    total = server.aggregate()
    summed = [updates[i] for i in ids if i != before]
    assert np.array_equal(total, _exact_sum(summed, len(ids)))
    np.testing.assert_allclose(total, np.sum(summed, axis=0), rtol=0, atol=1e-12)


def _keys() -> dict[str, Any]:
    return {"round": 1, "mask_public": "ab" * 32, "channel_public": "cd" * 32}


@pytest.mark.parametrize(("msg_type", "fields"), [
    ("sa_keys", {**_keys(), "mask_public": "ab" * 31}),  # 31-byte key
    ("sa_keys", {**_keys(), "mask_public": "AB" * 32}),  # not lower-case hex
    ("sa_roster", {"round": 1, "threshold": 2, "keys": [  # does not list its recipient
        {"device": j, "mask_public": "ab" * 32, "channel_public": "cd" * 32} for j in (1, 2, 3)]}),
    ("sa_roster", {"round": 1, "threshold": 3, "keys": [  # threshold = |U1|
        {"device": j, "mask_public": "ab" * 32, "channel_public": "cd" * 32} for j in (0, 1, 2)]}),
    ("sa_shares", {"round": 1, "shares": [  # two shares for one recipient
        {"recipient": 1, "nonce": "00" * 12, "ciphertext": "00" * 148}] * 2}),
    ("sa_shares", {"round": 1, "shares": [  # a share for itself
        {"recipient": 0, "nonce": "00" * 12, "ciphertext": "00" * 148}]}),
    ("sa_shares", {"round": 1, "shares": [  # a short ciphertext
        {"recipient": 1, "nonce": "00" * 12, "ciphertext": "00" * 147}]}),
    ("sa_inbox", {"round": 1, "participants": [0, 1], "shares": [  # a sender outside U2
        {"sender": 2, "nonce": "00" * 12, "ciphertext": "00" * 148}]}),
    ("sa_unmask_req", {"round": 1, "received": [0, 1], "dropped": [1]}),  # not disjoint
    ("sa_unmask_req", {"round": 1, "received": [1, 2], "dropped": []}),  # recipient missing
    ("sa_unmask", {"round": 1, "self_mask_shares": [[1, 1, "00" * 66]],  # seed and key of 1
                   "mask_key_shares": [[1, 1, "00" * 66]]}),
    ("sa_unmask", {"round": 1, "self_mask_shares": [[1, 1, "00" * 65]],
                   "mask_key_shares": []}),
])
def test_malformed_secagg_messages_are_refused(msg_type: str, fields: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        encode(msg_type, {"device": 0, "nonce": "n", **fields})


def test_masked_input_of_the_wrong_size_is_refused() -> None:
    fields = {"device": 0, "nonce": "n", "round": 1, "d": 4, "train_loss": None,
              "energy_comp_j": 0.5, "energy_comp_source": "x"}
    decode(encode("sa_masked", fields, bytes(32)))
    for payload in (bytes(31), None):
        with pytest.raises(ProtocolError):
            encode("sa_masked", fields, payload)


def test_a_share_at_another_point_or_for_an_owner_not_asked_is_refused() -> None:
    from testbed.core.secagg.messages import UnmaskingRequest

    request = UnmaskingRequest(1, frozenset({0, 1, 2}), frozenset({3}))
    ok = {"round": 1, "self_mask_shares": [[1, 1, "00" * 66]], "mask_key_shares": []}
    reply_from(_wire("sa_unmask", 0, ok), request)
    for bad in ({**ok, "self_mask_shares": [[1, 2, "00" * 66]]},  # device 0's point is 1
                {**ok, "self_mask_shares": [[3, 1, "00" * 66]]},  # 3 dropped: no seed share
                {**ok, "mask_key_shares": [[2, 1, "00" * 66]], "self_mask_shares": []},
                {**ok, "self_mask_shares": [[1, 1, "ff" * 66]]}):  # beyond 2^521 - 1
        with pytest.raises(ProtocolError):
            reply_from(_wire("sa_unmask", 0, bad), request)


# -- lab runs ---------------------------------------------------------------------------------


def _lines(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _kept(edge_dir: Path, t: int) -> dict[str, np.ndarray]:
    files = sorted((edge_dir / "updates").glob(f"round-{t}-*.npz"))
    assert len(files) == 1, files
    with np.load(files[0]) as z:
        return {"w": z["w"].copy(), "update": z["update"].copy()}


def _check_sums(run: Path, edges: dict[int, Path], r: int) -> list[np.ndarray]:
    """Every round's model is the previous one stepped by the exact sum of the kept updates
    of the devices in the sum (bit for bit); an abandoned round leaves it unchanged.
    Returns the model each round started from, and the final one."""
    lr = load_experiment(run / "config.yaml").lr
    lines = _lines(run)
    models = []
    for t in range(len(lines)):
        trained = [i for i in edges if list((edges[i] / "updates").glob(f"round-{t}-*.npz"))]
        models.append(_kept(edges[trained[0]], t)["w"])
        for i in trained:  # every device trained from the same global model
            assert np.array_equal(_kept(edges[i], t)["w"], models[t])
    with np.load(run / "checkpoint.npz") as z:
        models.append(z["weights"].astype(np.float64))
    for t, line in enumerate(lines):
        if line["secagg"]["status"] == "abandoned":
            assert np.array_equal(models[t + 1], models[t])
            continue
        summed = [_kept(edges[i], t)["update"] for i in line["secagg"]["masked"]]
        step = federation_mean([_exact_sum(summed, r)], r)
        assert np.array_equal(global_update(models[t], step, lr), models[t + 1]), t
    return models


def _lab_run(tmp_path: Path, devices: int, cfg_sets: list[str], faults: dict[int, str]
             ) -> tuple[Path, dict[int, Path], dict[int, int]]:
    """An aggregator and ``devices`` edges (``--keep-updates``) over loopback; ``faults``:
    device -> its ``TESTBED_FAULT``. Returns the run directory, the edges' state directories
    and their exit codes."""
    keys = tmp_path / "keys"
    generate_keys(keys, devices)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    procs = Procs(tmp_path / "logs")
    run = tmp_path / "agg"
    edges = {i: tmp_path / f"edge-{i}" for i in range(devices)}
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", RECORD_CONFIG, "--bind", endpoint, "--keys", str(keys), "--out",
            str(run), "--round-timeout", "60", "--phase-timeout", "5", "--join-timeout",
            "120", "--no-progress", *sets([*SECAGG_SETS, f"devices={devices}", *cfg_sets])))
        edge_procs = {i: procs.start(f"edge-{i}", tb_cmd(
            "edge", "--connect", endpoint, "--device-id", str(i), "--keys", str(keys),
            "--state-dir", str(edges[i]), "--keep-updates"),
            env={"TESTBED_FAULT": faults[i]} if i in faults else None) for i in edges}
        assert agg.wait(240) == 0, procs.log("agg")
        codes = {i: p.wait(30) for i, p in edge_procs.items()}
    finally:
        procs.close()
    assert not processes_mentioning(str(tmp_path))
    return run, edges, codes


def test_secagg_lab_run_sums_exactly_then_abandons_a_round_of_too_few(tmp_path: Path) -> None:
    # r = 3 of 4 per round. Every edge dies at its second masked input, after recording it:
    # round 0 is whole; in round 1 at least two of its three devices (those also drawn in
    # round 0) die before masking, fewer than the threshold 2 remain: abandoned.
    run, edges, codes = _lab_run(tmp_path, 4, ["clients_per_round=3", "rounds=2"],
                                 {i: "edge_before_masked:2" for i in range(4)})
    lines = _lines(run)
    first, second = lines[0]["secagg"], lines[1]["secagg"]
    assert first["status"] == "aggregated" and first["threshold"] == 2
    assert len(first["masked"]) == 3 and first["unmasking_replies"] == first["masked"]
    for dev in lines[0]["devices"]:
        if dev["device"] in first["masked"]:
            assert dev["carrier"] == CARRIER and dev["energy_comm_j"] == 0.0
            assert dev["transmitted"] is True and dev["secagg"] == "in the sum"
        else:
            assert dev == {"device": dev["device"], "transmitted": False,
                           "skipped": "not selected"}
    assert second["status"] == "abandoned" and "threshold" in second["reason"]
    assert len(second["shares"]) == 3 and len(second["masked"]) <= 1
    assert lines[1]["uploads"] == 0
    died = set(first["masked"]) & set(second["shares"])
    assert len(died) >= 2 and {i for i, c in codes.items() if c == -9} == died
    for i in second["shares"]:  # charged: each could have masked once it had the inbox
        dev = lines[1]["devices"][i]
        assert dev["charged"] is True and dev["secagg"] == "round abandoned"
    models = _check_sums(run, edges, 3)
    assert not np.array_equal(models[1], models[0]) and np.array_equal(models[2], models[1])
    agg = ledger_by_nonce(run / "ledger.jsonl")
    assert sorted((e["round"], e["device"]) for e in agg.values()) == sorted(
        [(0, i) for i in first["masked"]] + [(1, i) for i in second["shares"]])
    assert {e["type"] for e in agg.values()} == {"record-sgm/v1"}
    assert_ledgers_agree(run, {i: p for i, p in edges.items()
                               if any(e["device"] == i for e in agg.values())})
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["secagg_rounds_abandoned"] == 1
    assert summary["energy_comm_j_per_device"] == [0.0] * 4


@pytest.mark.slow  # 42 s; test_peer_secagg covers dropouts fast
def test_secagg_lab_round_survives_dropouts_before_and_after_masking(tmp_path: Path) -> None:
    # r = 5 of 5, threshold 3: device 1 dies once its masked input arrived (before it
    # answers the unmasking), device 2 after recording its upload, before masking
    run, edges, codes = _lab_run(tmp_path, 5, ["clients_per_round=5", "rounds=1"], {
        1: "edge_before_unmasking:1", 2: "edge_before_masked:1"})
    assert codes == {0: 0, 1: -9, 2: -9, 3: 0, 4: 0}
    (line,) = _lines(run)
    sa = line["secagg"]
    assert sa["status"] == "aggregated" and sa["threshold"] == 3
    assert sa["shares"] == [0, 1, 2, 3, 4]
    assert sa["masked"] == [0, 1, 3, 4] and sa["unmasking_replies"] == [0, 3, 4]
    assert "no unmasking reply" in line["devices"][1]["secagg"]
    dev2 = line["devices"][2]
    assert dev2["transmitted"] is None and dev2["charged"] is True
    assert "Shamir recovery" in dev2["secagg"]
    _check_sums(run, edges, 5)  # device 1 in the sum, device 2 not
    agg = ledger_by_nonce(run / "ledger.jsonl")
    assert sorted(e["device"] for e in agg.values()) == [0, 1, 2, 3, 4]
    assert_ledgers_agree(run, edges)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["secagg_rounds_abandoned"] == 0


@pytest.mark.slow
def test_aggregator_killed_mid_secagg_round_resumes_and_ledgers_agree(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys, 3)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    procs = Procs(tmp_path / "logs")
    run = tmp_path / "agg"
    edges = {i: tmp_path / f"edge-{i}" for i in range(3)}
    try:
        # killed in round 1 once U2's uploads are in its ledger, before any inbox went out
        agg = procs.start("agg", tb_cmd(
            "aggregator", RECORD_CONFIG, "--bind", endpoint, "--keys", str(keys), "--out",
            str(run), "--round-timeout", "60", "--phase-timeout", "10", "--join-timeout",
            "120", "--no-progress",
            *sets([*SECAGG_SETS, "devices=3", "clients_per_round=3", "rounds=2"])),
            env={"TESTBED_FAULT": "secagg_after_commit:2"})
        edge_procs = [procs.start(f"edge-{i}", tb_cmd(
            "edge", "--connect", endpoint, "--device-id", str(i), "--keys", str(keys),
            "--state-dir", str(edges[i]), "--rejoin-after", "2")) for i in range(3)]
        assert agg.wait(240) == -9
        again = procs.start("agg-resume", tb_cmd(
            "aggregator", "--bind", endpoint, "--keys", str(keys), "--resume", str(run),
            "--round-timeout", "60", "--phase-timeout", "10", "--join-timeout", "120",
            "--no-progress"))
        assert again.wait(240) == 0, procs.log("agg-resume")
        for p in edge_procs:
            assert p.wait(30) == 0
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds_completed"] == 2
        # round 1 ran twice: the killed attempt's uploads stay charged, on both sides
        rounds = sorted(e["round"] for e in ledger_by_nonce(run / "ledger.jsonl").values())
        assert rounds == [0, 0, 0, 1, 1, 1, 1, 1, 1]
        assert_ledgers_agree(run, edges)
    finally:
        procs.close()
    assert not processes_mentioning(str(tmp_path))
