"""The lab aggregator: the rounds of a run directory, with every device a remote edge agent.

The round logic is :class:`testbed.runner.Experiment`'s (gate, link, decode, aggregate,
evaluate, commit); this module only replaces "train and encode device i here" by "ask edge
i over the authenticated control plane and wait for its upload".

Per round and device the aggregator

1. gates the upload against the device's budget and journals the intent under a fresh nonce
   (before the edge may transmit, so an upload that went on air is never missing from its
   ledger);
2. sends the ``round`` message (global model, nonce, the channel fields the gated event
   credits, TDMA slot, deadline);
3. waits until every asked device answered (``upload`` or ``refuse``) or ``round_timeout_s``;
4. in device order: carries each upload over the link, records it (ledger commit), decodes
   it and acks it with the credited channel fields; a refusal withdraws the intent (nothing
   went on air); a device that did not answer in time is recorded with its gated event (it
   may have transmitted) and the round closes without it.

An edge that rejoins (``hello`` then ``ready``) reports the nonces its own ledger holds; the
aggregator settles an open intent of that device with it and sends ``sync``, every upload it
recorded for the device, which the edge adopts: after every round both ledgers hold the same
uploads under the same nonces.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from radio.link import Link, LinkFailed
from testbed.config.experiment import ExperimentConfig
from testbed.config.hardware import HardwareConfig
from testbed.faults import fault_point
from testbed.interrupts import StopSignals
from testbed.lab.secure_socket import CurveServer
from testbed.protocol import Message, ProtocolError, UploadHeader, decode, encode
from testbed.rundir import RunDir
from testbed.runner import Experiment, RoundCallback, tally
from testbed.stage_timer import StageTimer
from testbed.upload_events import CHANNEL_KEYS

log = logging.getLogger("testbed.aggregator")

#: Largest control-plane message either side accepts (bytes); libzmq drops larger ones
#: before they are read. An upload of d parameters is 8 d bytes (d/2 complex symbols), a
#: model 8 d bytes: models up to about 8 million parameters.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass
class Peer:
    """A joined edge agent."""

    device: int
    identity: bytes
    instance: str
    dataset_size: int | None = None
    nonces: set[str] = field(default_factory=set)
    ready: bool = False


class ControlPlane:
    """The aggregator's side of the control plane: joins, welcomes and validated receipt.

    Parameters
    ----------
    server
        The CurveZMQ ROUTER (only allow-listed device keys get through).
    devices
        Number of devices of the run.
    welcome
        ``run_id``, ``config_yaml`` and ``mask_secret`` sent in every ``welcome``.
    next_round
        The round the run continues with (sent in ``welcome``).
    """

    def __init__(
        self, server: CurveServer, devices: int, welcome: dict[str, str], next_round: int
    ) -> None:
        self.server = server
        self.devices = devices
        self.welcome = welcome
        self.next_round = next_round
        self.peers: dict[int, Peer] = {}
        self.rejected = 0
        #: Called with the device id when an edge (re)reports ``ready``.
        self.on_ready: Any = None

    def ready(self, device: int) -> bool:
        peer = self.peers.get(device)
        return peer is not None and peer.ready

    def all_ready(self) -> bool:
        return all(self.ready(i) for i in range(self.devices))

    def send(self, device: int, msg_type: str, fields: dict[str, Any],
             payload: bytes | None = None) -> None:
        peer = self.peers.get(device)
        if peer is None:
            return
        try:
            self.server.send(peer.identity, encode(msg_type, {"device": device, **fields},
                                                   payload))
        except Exception as exc:  # noqa: BLE001 - a peer gone away is a straggler, not a crash
            log.warning("send %s to device %d failed: %s", msg_type, device, exc)

    def poll(self, timeout_s: float) -> tuple[int, Message] | None:
        """Receive one message; joins are handled here, everything else is returned.

        Malformed messages, messages whose ``device`` is not the sender's key's device, and
        messages of unknown peers are dropped and logged (``rejected`` counts them).
        """
        got = self.server.recv(timeout_s)
        if got is None:
            return None
        identity, device, frames = got
        try:
            msg = decode(frames)
        except ProtocolError as exc:
            self._reject(device, f"malformed: {exc}")
            return None
        if msg["device"] != device:
            self._reject(device, f"claims device {msg['device']}")
            return None
        if device >= self.devices:
            self._reject(device, f"device {device} is not in this run ({self.devices} devices)")
            return None
        if msg.type == "hello":
            known = self.peers.get(device)
            if known is None or (known.identity, known.instance) != (identity, msg["instance"]):
                # a new edge process (first join or a restart): it must report ready again
                self.peers[device] = Peer(device, identity, msg["instance"])
                log.info("device %d joined (instance %s)", device, msg["instance"])
            self.send(device, "welcome", {**self.welcome, "next_round": self.next_round})
            return None
        peer = self.peers.get(device)
        if peer is None or peer.identity != identity:
            self._reject(device, f"{msg.type} before hello")
            return None
        if msg.type == "ready":
            if msg["instance"] != peer.instance:
                self._reject(device, "ready of another instance")
                return None
            peer.dataset_size = msg["dataset_size"]
            peer.nonces = set(msg["nonces"])
            rejoined = not peer.ready  # else the same process saying it is still there
            peer.ready = True
            if self.on_ready is not None and rejoined:
                self.on_ready(device)
            return None
        if msg.type == "leave":
            log.info("device %d left: %s", device, msg["reason"])
            peer.ready = False
            return None
        if msg.type not in ("upload", "refuse"):
            self._reject(device, f"unexpected {msg.type}")
            return None
        return device, msg

    def _reject(self, device: int, why: str) -> None:
        self.rejected += 1
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("dropped a message from device %d: %s (%d dropped)", device, why,
                        self.rejected)

    def wait_all_ready(self, timeout_s: float, stop: StopSignals) -> None:
        """Serve joins until every device is ready.

        Raises
        ------
        TimeoutError
            Naming the devices that did not join within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        last_note = time.monotonic()
        while not self.all_ready():
            stop.check()
            now = time.monotonic()
            if now > deadline:
                missing = [i for i in range(self.devices) if not self.ready(i)]
                raise TimeoutError(
                    f"devices {missing} did not join within {timeout_s:g} s "
                    "(--join-timeout); check their `testbed edge` processes and keys"
                )
            if now - last_note > 10:
                missing = [i for i in range(self.devices) if not self.ready(i)]
                log.info("waiting for devices %s to join", missing)
                last_note = now
            self.poll(0.2)


class LabAggregator(Experiment):
    """An :class:`~testbed.runner.Experiment` whose devices are remote edge agents.

    Parameters
    ----------
    cfg, hw, rundir
        As for :class:`~testbed.runner.Experiment`.
    plane
        The control plane with every device ready (their shard sizes reported).
    round_timeout_s
        How long a round waits for uploads before it closes without the missing devices.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        hw: HardwareConfig,
        rundir: RunDir,
        plane: ControlPlane,
        *,
        round_timeout_s: float,
        progress: bool = False,
        on_round: RoundCallback | None = None,
    ) -> None:
        sizes = [plane.peers[i].dataset_size for i in range(cfg.devices)]
        super().__init__(cfg, hw, rundir, progress=progress, on_round=on_round,
                         dataset_sizes=[int(s or 0) for s in sizes])
        self.plane = plane
        self.round_timeout_s = round_timeout_s
        #: Open authorizations of the round under way: device -> (nonce, gated event).
        self._pending: dict[int, tuple[str, Any]] = {}
        self._settled: dict[int, dict[str, Any]] = {}
        plane.on_ready = self._on_ready

    def sync(self, device: int) -> None:
        """Send ``device`` every upload recorded for it (its ledger adopts what it lacks)."""
        events = []
        if self.book is not None:
            events = [{"nonce": n, "event": e.to_dict()} for n, e in self.book.entries(device)
                      if n is not None]
        self.plane.send(device, "sync", {"events": events})

    def _on_ready(self, device: int) -> None:
        """An edge (re)joined: settle its open intent of this round, then sync it."""
        pending = self._pending.pop(device, None)
        if pending is not None:
            nonce, gated = pending
            peer = self.plane.peers[device]
            if self.book is not None:
                if nonce in peer.nonces:  # the edge journalled it: it may have gone on air
                    self.book.commit(gated, nonce)
                else:  # the edge never began it: nothing went on air
                    self.book.cancel(nonce)
            self._settled[device] = {
                "device": device, "transmitted": nonce in peer.nonces, "rejoined": True,
                "charged": self.book is not None and nonce in peer.nonces,
            }
            log.info("device %d rejoined during round; open upload %s", device,
                     "recorded (may have gone on air)" if nonce in peer.nonces else "withdrawn")
        self.sync(device)

    def run(self, start_round: int = 0) -> dict[str, Any]:
        try:
            return super().run(start_round)
        finally:
            for i in range(self.cfg.devices):
                self.plane.send(i, "leave", {"reason": "run ended"})

    def _channel(self, event: Any) -> dict[str, Any] | None:
        if self.book is None:
            return None
        data = event.to_dict()
        return {k: data[k] for k in CHANNEL_KEYS}

    def _round(self, t: int, link: Link, stop: StopSignals) -> dict[str, Any] | None:
        cfg = self.cfg
        timer = StageTimer()
        t0 = time.perf_counter()
        kept = self.rundir.load_inflight(t)
        wait_until = time.monotonic() + self.round_timeout_s
        while not any(self.plane.ready(i) for i in range(cfg.devices)):
            # every edge is gone: wait (one round timeout) for one to rejoin
            stop.check()
            if time.monotonic() > wait_until:
                raise LinkFailed(f"round {t}: no edge device connected for "
                                 f"{self.round_timeout_s:g} s (--round-timeout)")
            self.plane.poll(0.2)
        absent = {i for i in range(cfg.devices) if not self.plane.ready(i)}
        gated, ch_rngs = timer.timed("gate", lambda: self._gate(t, link, set(kept) | absent))
        if not kept and not absent and all(g is None for g in gated):
            return None
        self._pending, self._settled = {}, {}
        weights = np.ascontiguousarray(self.w, dtype="<f8").tobytes()
        slot = 0
        for i, event in enumerate(gated):
            if event is None or i in absent:
                continue
            nonce = self.book.begin(event) if self.book is not None else secrets.token_hex(16)
            self._pending[i] = (nonce, event)
            self.plane.send(i, "round", {
                "round": t, "nonce": nonce, "d": self.d, "channel": self._channel(event),
                "slot": slot, "deadline_s": float(self.round_timeout_s),
            }, weights)
            slot += 1
        answers: dict[int, Message] = {}
        deadline = time.monotonic() + self.round_timeout_s
        while any(i not in answers for i in self._pending) and time.monotonic() < deadline:
            stop.check()
            got = self.plane.poll(min(0.2, max(0.0, deadline - time.monotonic())))
            if got is None:
                continue
            device, msg = got
            want = self._pending.get(device)
            if want is None or msg["round"] != t or msg["nonce"] != want[0] or device in answers:
                self.plane._reject(device, f"{msg.type} out of round (round {msg['round']})")
                continue
            answers[device] = msg
        decoded: list[np.ndarray] = []
        losses: list[float] = []
        per_device: list[dict[str, Any]] = []
        for i in range(cfg.devices):
            if i in kept:
                vec, info = kept[i]
                tally({**info, "resumed": True}, vec, decoded, losses, per_device)
            elif i in self._settled:
                per_device.append(self._settled[i])
            elif i not in self._pending:
                reason = "absent" if i in absent else "budget"
                per_device.append({"device": i, "transmitted": False, "skipped": reason})
            else:
                nonce, event = self._pending[i]
                with stop.critical():
                    entry, vec = self._settle(t, i, nonce, event, answers.get(i), link,
                                              ch_rngs[i], timer)
                tally(entry, vec, decoded, losses, per_device)
        self._pending = {}
        return self._close_round(t, decoded, losses, per_device, timer, t0)

    def _settle(
        self, t: int, i: int, nonce: str, gated: Any, msg: Message | None, link: Link,
        rng: np.random.Generator, timer: StageTimer,
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """Record (or withdraw) device ``i``'s authorized upload of round ``t``."""
        if msg is None:  # straggler: it may have transmitted, so it counts (gated values)
            if self.book is not None:
                self.book.commit(gated, nonce)
            self.plane.send(i, "ack", {"round": t, "nonce": nonce,
                                       "channel": self._channel(gated)})
            log.warning("round %d: device %d did not answer within %g s; round closes without "
                        "it", t, i, self.round_timeout_s)
            return {"device": i, "transmitted": None, "straggler": True,
                    "charged": self.book is not None}, None
        if msg.type == "refuse":
            if self.book is not None:
                self.book.cancel(nonce)
            log.warning("round %d: device %d refused: %s", t, i, msg["reason"])
            return {"device": i, "transmitted": False, "refused": msg["reason"]}, None
        try:
            header = UploadHeader.from_dict(msg["header"])
            if (header.device, header.round_index, header.d) != (i, t, self.d):
                raise ValueError("header names another device, round or model size")
            assert msg.payload is not None
            symbols = np.frombuffer(msg.payload, dtype="<c16").astype(np.complex128)
        except (TypeError, ValueError) as exc:
            # It went on air but cannot be decoded: it counts, with no channel credit.
            if self.book is not None:
                self.book.commit(self._event(i, t, None), nonce)
            self.plane.send(i, "ack", {"round": t, "nonce": nonce,
                                       "channel": self._channel(self._event(i, t, None))})
            return {"device": i, "transmitted": True, "lost": True,
                    "error": f"bad upload header: {exc}"}, None
        loss = msg["train_loss"]
        info, vec = self._receive(
            t, i, nonce, header, symbols, float(msg["symbol_energy"]),
            float(msg["energy_comp_j"]), str(msg["energy_comp_source"]), link, rng, timer,
        )
        info["train_loss"] = float("nan") if loss is None else float(loss)
        self.rundir.save_inflight(t, i, vec, info)
        fault_point("after_inflight")
        self.plane.send(i, "ack", {"round": t, "nonce": nonce,
                                   "channel": self._channel(self.last_committed)})
        return info, vec


def endpoint_note(path: Path | None, endpoint: str) -> None:
    """Write the bound endpoint (``tcp://127.0.0.1:PORT``) for a launcher to read."""
    if path is not None:
        from testbed.rundir import atomic_write_bytes

        atomic_write_bytes(path, (endpoint + "\n").encode())


def serve(
    *,
    bind: str,
    keys_dir: Path,
    cfg: ExperimentConfig | None = None,
    hw: HardwareConfig | None = None,
    out_dir: Path | None = None,
    resume_dir: Path | None = None,
    round_timeout_s: float = 60.0,
    join_timeout_s: float = 600.0,
    endpoint_file: Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run (``cfg`` into ``out_dir``) or continue (``resume_dir``) a lab run as aggregator.

    Binds the CurveZMQ server, waits for every device to join, then runs the rounds.
    Returns the run's summary (``status`` says how it ended).

    Raises
    ------
    RunDirError, TimeoutError, ConfigError
        Before any round: a bad run directory, devices that never joined, bad configs.
    """
    import zmq

    from testbed.config.loader import load_experiment, load_hardware
    from testbed.links import check_link_config
    from testbed.recovery import resume_point
    from testbed.rundir import RunDirError
    from testbed.runner import _write_metadata

    weights = None
    if resume_dir is not None:
        rundir = RunDir.open(resume_dir)
        try:
            cfg = load_experiment(rundir.path / "config.yaml")
            hw = load_hardware(str(rundir.path / "hw_config.yaml"))
            point = resume_point(rundir, private=cfg.scheme != "fedavg")
        except BaseException:
            rundir.close()
            raise
        start, weights = point.next_round, point.weights
    else:
        assert cfg is not None and hw is not None and out_dir is not None
        check_link_config(cfg, hw, record=cfg.record)
        rundir = RunDir.create(out_dir)
        try:
            _write_metadata(rundir, cfg, hw)
        except BaseException:
            rundir.remove()
            raise
        start = 0
    assert cfg is not None and hw is not None
    welcome = {
        "run_id": rundir.path.name,
        "config_yaml": (rundir.path / "config.yaml").read_text(),
        "mask_secret": (rundir.path / "run_secret").read_text().strip(),
    }
    ctx = zmq.Context()
    server: CurveServer | None = None
    try:
        server = CurveServer(ctx, bind, keys_dir=keys_dir, allowed_dir=keys_dir / "allowed",
                             max_message_bytes=MAX_MESSAGE_BYTES)
        endpoint_note(endpoint_file, server.last_endpoint)
        log.info("aggregator bound to %s; waiting for %d devices", server.last_endpoint,
                 cfg.devices)
        plane = ControlPlane(server, cfg.devices, welcome, start)
        with StopSignals() as stop:
            plane.wait_all_ready(join_timeout_s, stop)
        try:
            exp = LabAggregator(cfg, hw, rundir, plane, round_timeout_s=round_timeout_s,
                                progress=progress)
        except Exception as exc:
            from aggregator.privacy import LedgerError

            if isinstance(exc, LedgerError):
                raise RunDirError(str(exc)) from None
            raise
        if weights is not None:
            exp.w = weights
        for i in range(cfg.devices):
            exp.sync(i)
        return exp.run(start)
    except BaseException:
        rundir.close()
        if resume_dir is None and start == 0 and not rundir.metrics_path.exists():
            from testbed.recovery import directory_is_pristine

            if directory_is_pristine(rundir.path):
                rundir.remove()
        raise
    finally:
        if server is not None:
            server.close()
        ctx.term()
