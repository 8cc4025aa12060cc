"""Shared helpers of the lab-deployment tests: processes on loopback, ledgers, leftovers,
and a test-process air streaming chunks to a virtual receiver (:class:`ChunkAir`)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from radio.virtual_wire import ChunkHeader, encode_chunk

ROOT = Path(__file__).resolve().parents[1]
RECORD_CONFIG = str(ROOT / "testbed" / "config" / "private-fedsgd.yaml")
#: A small record-level run: 3 devices of 2000 samples, Poisson batches of 256.
RECORD_SETS = [
    "train_samples=6000", "eval_samples=300", "batch_size=256", "scheme=channel-dp",
    "eval_every=100",
]
#: A small run without DP.
PLAIN_SETS = ["scheme=fedavg", "train_samples=2000", "eval_samples=300"]


def sets(values: list[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        out += ["--set", v]
    return out


def tb_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "testbed", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_lab(tmp_path: Path, devices: int) -> tuple[Path, str, Procs]:
    """Keys for ``devices`` edges in ``tmp_path/keys``, a free loopback endpoint, and the
    test's process list (logs in ``tmp_path/logs``)."""
    from testbed.core.transport.curve_keys import generate_keys

    keys = tmp_path / "keys"
    generate_keys(keys, devices)
    return keys, f"tcp://127.0.0.1:{free_port()}", Procs(tmp_path / "logs")


def edge_cmd(keys: Path, endpoint: str, state_root: Path, i: int, *extra: str) -> list[str]:
    """``testbed edge`` of device ``i``, its state in ``state_root/edge-<i>``."""
    return tb_cmd("edge", "--connect", endpoint, "--device-id", str(i), "--keys", str(keys),
                  "--state-dir", str(state_root / f"edge-{i}"), *extra)


def intruder_keys(tmp_path: Path, keys: Path) -> Path:
    """A key folder for device 0 with a key pair the aggregator of ``keys`` does not list
    (it trusts the aggregator's public key): ``tmp_path/intruder``."""
    from testbed.core.transport.curve_keys import generate_keys

    other = tmp_path / "other"
    generate_keys(other, 1)
    intruder = tmp_path / "intruder"
    intruder.mkdir()
    for name in ("device-0.key", "device-0.key_secret"):
        (intruder / name).write_bytes((other / name).read_bytes())
        (intruder / name).chmod(0o600)
    (intruder / "aggregator.key").write_bytes((keys / "aggregator.key").read_bytes())
    return intruder


class Procs:
    """Processes of one test; every one is killed at the end, whatever happened."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        full_env = {k: v for k, v in os.environ.items() if k != "TESTBED_FAULT"}
        full_env.update(env or {})
        with open(self.log_dir / f"{name}.log", "ab") as log:
            p = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=full_env)
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait(10)


#: Per-line fields of a ledger file that belong to the file, not to the event (its hash
#: chain and the writing process): two ledgers of the same uploads differ in them.
FILE_FIELDS = frozenset({"prev", "sha256", "writer"})


def ledger_by_nonce(path: Path) -> dict[str, dict[str, Any]]:
    """Events of a ledger file by nonce (the header line skipped, file fields dropped)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            if "nonce" in data:
                out[data["nonce"]] = {k: v for k, v in data.items() if k not in FILE_FIELDS}
    return out


def assert_ledgers_agree(run_dir: Path, edge_dirs: dict[int, Path]) -> None:
    """The aggregator's ledger and every edge's hold the same uploads, event for event."""
    agg = ledger_by_nonce(run_dir / "ledger.jsonl")
    for device, edge_dir in edge_dirs.items():
        mine = ledger_by_nonce(edge_dir / "ledger.jsonl")
        theirs = {n: e for n, e in agg.items() if e["device"] == device}
        assert mine == theirs, f"device {device}: ledgers differ"
        assert mine, f"device {device}: nothing recorded"


def assert_pilot_snr_is_the_budget_through_the_fade(
    uploads: list[dict[str, Any]], bursts: list[dict[str, Any]], tol_db: float = 1.5
) -> list[float]:
    """Each received upload's pilot SNR (``snr_est_db``) is its link budget plus the fade
    the virtual air applied to its burst (found in the air's log by serial and slot start);
    returns those SNRs (dB). Lost uploads are skipped.

    A frame whose pilot residual held more than the noise measured off the frame, in the
    same capture (``residual_over_noise_db`` above 1.5 dB: seen once in 64 darkroom frames,
    on a host loaded three times over, cause not found), reads its pilot SNR low; the
    receiver credits no more than that off-frame noise, so its SNR against that noise is
    checked instead. At most one such frame per run."""
    snrs = []
    distorted = 0
    for d in uploads:
        if d.get("lost"):
            continue
        mine = [b for b in bursts if b["serial"] == f"edge{d['device']}"
                and abs(b["t_true_s"] - d["slot_start_s"]) < 1e-3]
        assert len(mine) == 1, d
        expected = d["budget_snr_db"] + mine[0]["fading_gain_db"]
        snr = float(d["snr_est_db"])
        if d.get("residual_over_noise_db", 0.0) > 1.5:
            distorted += 1
            snr += float(d["residual_over_noise_db"])  # against the noise off the frame
        assert abs(snr - expected) < tol_db, (d, mine[0])
        snrs.append(snr)
    assert distorted <= 1, uploads
    return snrs


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(entry.name))
    return found


def wait_exit(p: subprocess.Popen[bytes], timeout_s: float) -> int:
    return int(p.wait(timeout_s))


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def wait_until(cond: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``cond`` holds within ``timeout_s`` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


# -- a chunk air for a virtual receiver ----------------------------------------------------

#: The sample rate (Hz) :class:`ChunkAir` streams at (the receiver's in these tests).
FS_RX = 50e3
#: Samples a chunk of :class:`ChunkAir` holds (10 ms).
AIR_CHUNK = 500
#: The receiver's full scale (W) by default (that of :mod:`radio.virtual_device`).
RX_FULL_SCALE_W = 1e-3
#: The amplitude (W^0.5 at the antenna) of the air's samples.
AIR_AMPLITUDE = 1e-4


def air_samples(k0: int, n: int) -> np.ndarray:
    """The air's samples ``k0 .. k0 + n`` (complex64, shape ``(n,)``): each encodes its own
    index (24 bits)."""
    k = np.arange(k0, k0 + n)
    return (AIR_AMPLITUDE * ((k % 4096) + 1j * ((k // 4096) % 4096)) / 4096).astype(
        np.complex64)


def air_index(y: np.ndarray, gain_db: float) -> np.ndarray:
    """Air sample indices (mod 2^24, int64) read back from samples ``y`` received with a
    gain of ``gain_db`` (dB) at the default full scale."""
    scale = math.sqrt(10 ** (gain_db / 10) / RX_FULL_SCALE_W)
    v = y.astype(np.complex128) / (AIR_AMPLITUDE * scale) * 4096
    return np.round(v.imag).astype(np.int64) * 4096 + np.round(v.real).astype(np.int64)


class ChunkAir(threading.Thread):
    """The air of a virtual receiver, played by the test process: a PUSH socket on a free
    loopback port (``port``) streaming consecutive chunks of :func:`air_samples` at about
    real time (20 ms late) from true time ``t0`` (s). ``skip`` set: the next chunk is lost
    (a gap in the indices); ``stop`` set: the thread ends (:meth:`close`)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port: int = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.t0 = time.time()
        self.stop = threading.Event()
        self.skip = threading.Event()

    def run(self) -> None:
        index = 0
        while not self.stop.is_set():
            due = self.t0 + (index + AIR_CHUNK) / FS_RX + 0.02
            wait = due - time.time()
            if wait > 0:
                time.sleep(min(wait, 0.05))
                continue
            if self.skip.is_set():  # a lost chunk: a gap in the indices
                self.skip.clear()
                index += AIR_CHUNK
                continue
            header = ChunkHeader(index=index, t0_true_s=self.t0, sample_rate_hz=FS_RX,
                                 n=AIR_CHUNK)
            try:
                self.sock.send_multipart(encode_chunk(header, air_samples(index, AIR_CHUNK)),
                                         flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # no receiver connected yet
            index += AIR_CHUNK

    def close(self) -> None:
        """Stop streaming, wait for the thread (5 s at most) and close the socket."""
        self.stop.set()
        self.join(timeout=5)
        self.sock.close(0)
