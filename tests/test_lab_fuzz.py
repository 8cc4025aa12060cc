"""10,000 malformed, random, oversized and replayed messages to the aggregator and to an
edge leave both serving; an edge without its USRP names the device args (loopback only)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from testbed.core.config.loader import dump_yaml, load_experiment
from testbed.core.transport.curve_client import CurveClient
from testbed.core.transport.curve_keys import generate_keys
from testbed.core.transport.curve_server import CurveServer
from testbed.core.transport.protocol import MAX_MESSAGE_BYTES, PROTOCOL_VERSION, decode, encode
from tests.lab_helpers import (
    PLAIN_SETS,
    ROOT,
    Procs,
    free_port,
    processes_mentioning,
    sets,
    tb_cmd,
    wait_for,
)

N_MESSAGES = 10_000


def _junk(rng: random.Random, device: int) -> list[bytes]:
    """One bad message: random bytes, broken JSON, wrong kinds, unknown types, wrong sizes,
    other devices, replays of well-formed messages of past rounds (over the control plane or
    on air), unsolicited clock messages, oversized frames."""
    kind = rng.randrange(10)
    if kind == 0:
        return [rng.randbytes(rng.randrange(1, 300))]
    if kind == 1:
        return [b'{"v": 1, "type": "upload", "device": ' + str(device).encode()]
    if kind == 2:
        return [json.dumps({"v": PROTOCOL_VERSION, "type": rng.choice(["hello", "round",
                "upload", "ack", "nope"]), "device": "x"}).encode()]
    if kind == 3:
        return [json.dumps({"v": 99, "type": "hello", "device": device,
                            "instance": "a"}).encode()]
    if kind == 4:  # a well-formed upload / ack of a round long gone (replay)
        n = rng.randrange(0, 4)
        header = {"device": device, "round_index": 900, "d": 10, "n_values": 10,
                  "alpha": 1.0}
        on_air = rng.random() < 0.5
        report = {"airtime_s": 0.01, "tx_power_w": 0.1, "tx_time_usrp_s": 5.0,
                  "timing_uncertainty_s": 1e-3, "slack_s": 0.1} if on_air else None
        return encode("upload", {"device": device, "round": 900, "nonce": "replayed",
                                 "header": header, "n_symbols": n, "symbol_energy": 1.0,
                                 "train_loss": 0.5, "energy_comp_j": 0.1,
                                 "energy_comp_source": "x", "on_air": on_air,
                                 "tx_report": report}, b"" if on_air else bytes(16 * n))
    if kind == 5:  # payload of the wrong size
        frames = encode("ack", {"device": device, "round": 3, "nonce": "n", "channel": None})
        return [frames[0], rng.randbytes(17)]
    if kind == 6:  # too many frames
        return [b"{}", b"", b""]
    if kind == 7:  # another device's message
        return encode("leave", {"device": device + 1000, "reason": "not me"})
    if kind == 8:  # clock messages nobody asked for (or asked before joining)
        if rng.random() < 0.5:
            return encode("clock_req", {"device": device, "t_send": rng.random()})
        return encode("clock", {"device": device, "t_send": rng.random(), "t_remote": 1.0})
    return [json.dumps({"v": PROTOCOL_VERSION, "type": "sync", "device": device,
                        "events": [1, 2, {"nonce": 3}]}).encode()]


def test_aggregator_keeps_serving_through_junk(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys, 2)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    procs = Procs(tmp_path / "logs")
    rng = random.Random(7)
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", "--bind", endpoint, "--keys", str(keys), "--out", str(tmp_path / "a"),
            "--round-timeout", "60", "--join-timeout", "120", "--no-progress",
            "--endpoint-file", str(tmp_path / "endpoint"),
            *sets([*PLAIN_SETS, "devices=2", "rounds=2"])))
        # bound before the fuzzer fills its send queue (a slow start must not time it out)
        wait_for(lambda: (tmp_path / "endpoint").exists(), 120, "the aggregator to bind")
        procs.start("edge-0", tb_cmd("edge", "--connect", endpoint, "--device-id", "0",
                                     "--keys", str(keys), "--state-dir", str(tmp_path / "e0")))
        ctx = zmq.Context()
        t0 = time.monotonic()
        with CurveClient(ctx, endpoint, keys_dir=keys, device=1,
                         max_message_bytes=2 * MAX_MESSAGE_BYTES) as fuzzer:
            for k in range(N_MESSAGES):
                fuzzer.send(_junk(rng, 1))
                if k % 5000 == 0:  # a header over the protocol's 4 MiB bound
                    fuzzer.send([b"{" * (5 * 1024 * 1024)])
            fuzzer.send([b"x" * (MAX_MESSAGE_BYTES + 1)])  # over libzmq's limit: dropped
            time.sleep(1.0)
        ctx.term()
        assert time.monotonic() - t0 < 120
        assert agg.poll() is None, procs.log("agg")  # still serving
        procs.start("edge-1", tb_cmd("edge", "--connect", endpoint, "--device-id", "1",
                                     "--keys", str(keys), "--state-dir", str(tmp_path / "e1")))
        assert agg.wait(180) == 0, procs.log("agg")
        summary = json.loads((tmp_path / "a" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds_completed"] == 2
        assert "dropped a message from device 1" in procs.log("agg")
    finally:
        procs.close()
    assert not processes_mentioning(str(tmp_path))


def _recv(server: CurveServer, want: str, timeout_s: float) -> tuple[bytes, object]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = server.recv(0.5)
        if got is None:
            continue
        identity, _, frames = got
        msg = decode(frames)
        if msg.type == want:
            return identity, msg
    raise AssertionError(f"no {want} within {timeout_s} s")


def test_edge_keeps_serving_through_junk(tmp_path: Path) -> None:
    from testbed.core.models import build_model, n_params

    keys = tmp_path / "keys"
    generate_keys(keys, 1)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = load_experiment(None, [*PLAIN_SETS, "devices=1", "train_samples=500"])
    model = build_model(cfg.model, (1, 28, 28), 0)  # type: ignore[arg-type]
    d = n_params(model)
    rng = random.Random(11)
    procs = Procs(tmp_path / "logs")
    ctx = zmq.Context()
    server = CurveServer(ctx, endpoint, keys_dir=keys, allowed_dir=keys / "allowed")
    try:
        edge = procs.start("edge", tb_cmd("edge", "--connect", endpoint, "--device-id", "0",
                                          "--keys", str(keys), "--state-dir",
                                          str(tmp_path / "e0")))
        identity, _ = _recv(server, "hello", 60)
        for _ in range(N_MESSAGES // 2):  # before it is set up
            server.send(identity, _junk(rng, 0))
        server.send(identity, encode("welcome", {
            "device": 0, "run_id": "fuzz", "config_yaml": dump_yaml(cfg),
            "mask_secret": "ab" * 16, "next_round": 0, "radios": ""}))
        _recv(server, "ready", 60)
        for _ in range(N_MESSAGES // 2):  # set up: junk, replays, other devices
            server.send(identity, _junk(rng, 0))
        weights = np.zeros(d, dtype="<f8").tobytes()
        plan = {"device": 0, "round": 0, "nonce": "n-1", "d": d, "channel": None, "slot": 0,
                "deadline_s": 30.0, "tx_time_s": None, "await_slot": False, "mechanism": None,
                "aircomp": None}
        server.send(identity, encode("round", plan, weights))
        _, upload = _recv(server, "upload", 60)
        assert upload["nonce"] == "n-1" and upload["round"] == 0  # type: ignore[index]
        server.send(identity, encode("round", plan, weights))  # the same request, replayed
        server.send(identity, encode("round", {**plan, "nonce": "n-2", "d": d + 1},
                                     np.zeros(d + 1, dtype="<f8").tobytes()))  # wrong d
        assert server.recv(3.0) is None  # both ignored
        server.send(identity, encode("round", {**plan, "round": 1, "nonce": "n-3"}, weights))
        _, second = _recv(server, "upload", 60)
        assert second["nonce"] == "n-3"  # type: ignore[index]
        server.send(identity, encode("leave", {"device": 0, "reason": "done"}))
        assert edge.wait(30) == 0
        assert "dropped a message" in procs.log("edge")
    finally:
        server.close()
        ctx.term()
        procs.close()


def test_edge_without_its_usrp_names_the_device_args(tmp_path: Path) -> None:
    # USB-only device args: UHD looks on the USB bus and never sends to a network address
    text = (ROOT / "hw_configs" / "lab_ota.yaml").read_text()
    hw = tmp_path / "lab.yaml"
    hw.write_text(text.replace("addr=192.168.10.11", "type=b200,serial=NOTHERE0"))
    generate_keys(tmp_path / "keys", 1)
    out = subprocess.run(
        [sys.executable, "-m", "testbed", "edge", "--hw", str(hw), "--connect",
         "tcp://127.0.0.1:9", "--device-id", "0", "--keys", str(tmp_path / "keys"),
         "--state-dir", str(tmp_path / "s")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 5, out.stderr  # link failed: launch tells it from bad input
    assert "link failed" in out.stderr
    assert "type=b200,serial=NOTHERE0" in out.stderr and "usrp.devices[0]" in out.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was set up
