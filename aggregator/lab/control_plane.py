"""The lab aggregator's side of the control plane: edges join (``hello``, ``welcome``,
``ready``), messages are received and validated, clock requests answered at once.

The log says who joins as they join (a device has joined once it reported ``ready``),
``all N devices joined`` once, and every device that leaves or drops out (a new process of
the same device replacing a ready one) and every one that rejoins.

Only allow-listed device keys get through the CurveZMQ server; a message whose ``device`` is
not its sender's, or that is malformed or out of place, is dropped and counted, never acted
on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.core.runs.interrupts import StopSignals
from testbed.core.transport.curve_server import CurveServer
from testbed.core.transport.protocol import Message, ProtocolError, decode, encode

log = logging.getLogger("testbed.aggregator")

#: The secure aggregation's edge messages (002), handed to the round like uploads.
EDGE_MESSAGES = ("sa_keys", "sa_shares", "sa_masked", "sa_unmask")


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
    clock
        The aggregator's clock (s) that ``clock_req`` is answered with: the schedule's time
        base without a shared reference (:mod:`radio.edge_radio`).
    """

    def __init__(
        self, server: CurveServer, devices: int, welcome: dict[str, str], next_round: int,
        *, clock: Callable[[], float] = time.time,
    ) -> None:
        self.server = server
        self.clock = clock
        self.devices = devices
        self.welcome = welcome
        self.next_round = next_round
        self.peers: dict[int, Peer] = {}
        self.rejected = 0
        #: Called with the device id when an edge (re)reports ``ready``.
        self.on_ready: Any = None
        #: Whether every device has been ready at once (``all N devices joined`` logged).
        self.all_joined = False

    def ready(self, device: int) -> bool:
        peer = self.peers.get(device)
        return peer is not None and peer.ready

    def all_ready(self) -> bool:
        return all(self.ready(i) for i in range(self.devices))

    def ready_count(self) -> int:
        """How many devices are ready (joined and not gone since)."""
        return sum(1 for p in self.peers.values() if p.ready)

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
        """Receive one message; joins and clock requests are handled here, uploads and
        refusals are returned.

        Malformed messages, messages whose ``device`` is not the sender's key's device, and
        messages of unknown peers are dropped and logged (``rejected`` counts them). The
        secure aggregation's edge messages (``sa_*``) are returned too.
        """
        got = self.server.recv(timeout_s)
        if got is None:
            return None
        identity, device, frames = got
        try:
            msg = decode(frames)
        except ProtocolError as exc:
            self.reject(device, f"malformed: {exc}")
            return None
        if msg["device"] != device:
            self.reject(device, f"claims device {msg['device']}")
            return None
        if device >= self.devices:
            self.reject(device, f"device {device} is not in this run ({self.devices} devices)")
            return None
        if msg.type == "hello":
            known = self.peers.get(device)
            if known is None or (known.identity, known.instance) != (identity, msg["instance"]):
                # a new edge process (first join or a restart): it must report ready again
                self.peers[device] = Peer(device, identity, msg["instance"])
                if known is not None and known.ready:
                    log.info("device %d dropped out: a new process (instance %s) replaces "
                             "instance %s; %s", device, msg["instance"], known.instance,
                             self._count_note())
                log.info("device %d connected (instance %s)", device, msg["instance"])
            self.send(device, "welcome", {**self.welcome, "next_round": self.next_round})
            return None
        peer = self.peers.get(device)
        if peer is None or peer.identity != identity:
            self.reject(device, f"{msg.type} before hello")
            return None
        if msg.type == "ready":
            if msg["instance"] != peer.instance:
                self.reject(device, "ready of another instance")
                return None
            peer.dataset_size = msg["dataset_size"]
            peer.nonces = set(msg["nonces"])
            rejoined = not peer.ready  # else the same process saying it is still there
            peer.ready = True
            if rejoined:
                log.info("device %d %s (%s samples); %s", device,
                         "rejoined" if self.all_joined else "joined", peer.dataset_size,
                         self._count_note())
            if self.on_ready is not None and rejoined:
                self.on_ready(device)
            return None
        if msg.type == "leave":
            was_ready = peer.ready
            peer.ready = False
            log.info("device %d left: %s%s", device, msg["reason"],
                     f"; {self._count_note()}" if was_ready else "")
            return None
        if msg.type == "clock_req":  # answered at once, whatever else is under way
            self.send(device, "clock", {"t_send": msg["t_send"], "t_remote": self.clock()})
            return None
        if msg.type not in ("upload", "upload_ready", "refuse", *EDGE_MESSAGES):
            self.reject(device, f"unexpected {msg.type}")
            return None
        return device, msg

    def _count_note(self) -> str:
        """``3/4 devices joined`` (before all have joined), ``3/4 devices ready`` after."""
        return (f"{self.ready_count()}/{self.devices} devices "
                f"{'ready' if self.all_joined else 'joined'}")

    def reject(self, device: int, why: str) -> None:
        """Drop a message that does not belong (logged, counted in ``rejected``)."""
        self.rejected += 1
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("dropped a message from device %d: %s (%d dropped)", device, why,
                        self.rejected)

    def wait_all_ready(self, timeout_s: float, stop: StopSignals) -> None:
        """Serve joins until every device is ready; logs ``all N devices joined`` (once per
        control plane) and, every 10 s until then, who is still awaited.

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
                connected = [i for i in missing if i in self.peers]
                log.info("waiting for devices %s to join (%s)%s", missing, self._count_note(),
                         f"; {connected} connected, not ready yet" if connected else "")
                last_note = now
            self.poll(0.2)
        if not self.all_joined:
            self.all_joined = True
            log.info("all %d devices joined", self.devices)
