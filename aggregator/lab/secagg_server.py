"""One round of 002's secure aggregation in the lab (scheme ``zcdp-secagg``).

The aggregator is the protocol's server (:class:`testbed.core.secagg.server.SecAggServer`):
it relays the devices' messages and learns only the sum of the included updates. Each edge
runs its own :class:`~testbed.core.secagg.device.SecAggDevice`
(:mod:`edge_device.lab.secagg_client`) and never sends its key material or its unmasked
update. Everything travels on the authenticated control plane (masked integers cannot cross
an analog channel); the message fields are :mod:`testbed.core.secagg.wire`'s.

Phases (each closes when every device still expected answered, or at its deadline):

0. ``round`` to each asked device (the model, a fresh nonce, its gated privacy event); it
   trains and answers ``sa_keys`` (or ``refuse``) within ``--round-timeout``. ``U1``: the
   keys received; fewer than 3 abandon the round, nothing charged.
1. ``sa_roster`` to ``U1``; ``sa_shares`` back within the phase timeout. ``U2``: the
   devices whose shares for every other member arrived; below the threshold the round is
   abandoned, nothing charged.
2. The privacy event of every member of ``U2`` is committed to the aggregator's ledger, then
   ``sa_inbox`` (``U2`` and its ciphertexts) goes to each: only with it can a device mask,
   so no masked input exists whose upload is not in the ledger. A member that then never
   delivers its masked input stays charged (it may have sent it). ``U3``: the masked inputs
   received; below the threshold the round is abandoned (charged as recorded).
3. ``sa_unmask_req`` to ``U3``; each answers with its shares (``sa_unmask``). A device
   that dropped after its masked input stays in the sum; the pairwise masks of ``U2 \\ U3``
   are removed through Shamir recovery. Fewer than threshold replies, or a residue left by
   unmasking, abandon the round.

An abandoned round leaves the model unchanged and says why in its metrics line
(``secagg.status``); devices told ``sa_abort`` drop their state of the round.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from aggregator.devices import SecAggOutcome
from aggregator.lab.control_plane import ControlPlane
from aggregator.state import RunState
from testbed.core.runs.faults import fault_point
from testbed.core.runs.interrupts import StopSignals
from testbed.core.secagg import ProtocolError as SecAggProtocolError
from testbed.core.secagg import SecAggAbortError
from testbed.core.secagg.aggregation import CARRIER, round_codec
from testbed.core.secagg.server import SecAggServer
from testbed.core.secagg.wire import (
    inbox_fields,
    keys_from,
    masked_from,
    reply_from,
    request_fields,
    roster_fields,
    shares_from,
)
from testbed.core.transport.protocol import Message, ProtocolError
from testbed.core.upload_events import PrivacyEvent


class SecAggHost(Protocol):
    """What a round needs of the lab's devices side: the control plane, the round timeout
    and the aggregator's state (config, model size, ledger, uplinks)."""

    plane: ControlPlane
    round_timeout_s: float
    state: RunState


log = logging.getLogger("testbed.aggregator")

#: Default seconds each phase after the keys waits (the keys phase includes the training
#: and waits ``--round-timeout``).
DEFAULT_PHASE_TIMEOUT_S = 30.0


class LabSecAggRound:
    """The aggregator's side of one round.

    Parameters
    ----------
    exp
        The lab's devices side (control plane, round timeout, the aggregator's state).
    t
        Round index.
    asked
        Device -> its gated privacy event, for the selected devices the budget allows.
    stop
        The run's stop signals (checked while waiting).
    phase_timeout_s
        Seconds each phase after the keys waits.
    """

    def __init__(self, exp: SecAggHost, t: int, asked: dict[int, PrivacyEvent],
                 stop: StopSignals, phase_timeout_s: float) -> None:
        self.exp = exp
        self.plane = exp.plane
        self.t = t
        self.stop = stop
        self.events = asked
        self.phase_timeout_s = phase_timeout_s
        self.nonces = {i: secrets.token_hex(16) for i in asked}
        self.instances = {i: self.plane.peers[i].instance for i in asked}
        r = exp.state.cfg.clients_per_round or exp.state.cfg.devices
        self.server = SecAggServer(round_index=t, dimension=exp.state.d, codec=round_codec(r))
        self.refused: dict[int, str] = {}
        self.gone: set[int] = set()
        self.masked: dict[int, Message] = {}
        self.sets: dict[str, list[int]] = {}
        self.charged: set[int] = set()

    # -- messaging --------------------------------------------------------------------------
    def _send(self, i: int, msg_type: str, fields: dict[str, Any],
              payload: bytes | None = None) -> None:
        self.plane.send(i, msg_type, {"round": self.t, "nonce": self.nonces[i], **fields},
                        payload)

    def _abort(self, devices: set[int], reason: str) -> None:
        for i in sorted(devices - self.gone):
            self._send(i, "sa_abort", {"reason": reason})

    def _left(self, i: int) -> bool:
        """Device ``i`` left or restarted (a new process has none of this round's state)."""
        peer = self.plane.peers.get(i)
        return peer is None or not peer.ready or peer.instance != self.instances[i]

    def _gather(self, kind: str, waiting: set[int], timeout_s: float,
                accept: Callable[[int, Message], None]) -> set[int]:
        """Serve the control plane until every device of ``waiting`` answered ``kind`` (or
        refused, or left) or ``timeout_s`` passed; ``accept`` takes each answer (raising
        :class:`ProtocolError` or the state machine's error for one it refuses: dropped as
        junk). Returns the devices whose answer was accepted."""
        t, deadline, answered, waiting = self.t, time.monotonic() + timeout_s, set(), set(waiting)
        while waiting and (left := deadline - time.monotonic()) > 0:
            self.stop.check()
            gone = {i for i in waiting if self._left(i)}
            self.gone |= gone
            waiting -= gone
            got = self.plane.poll(min(0.2, left))
            if got is None:
                continue
            i, msg = got
            if i not in self.nonces or msg["round"] != t or msg["nonce"] != self.nonces[i]:
                self.plane.reject(i, f"{msg.type} out of round (round {msg['round']})")
                continue
            if msg.type == "refuse":
                self.refused[i] = msg["reason"]
                waiting.discard(i)
                log.warning("round %d: device %d refused: %s", t, i, msg["reason"])
                continue
            if msg.type != kind or i not in waiting:
                log.info("round %d: device %d's %s came after its phase closed; ignored",
                         t, i, msg.type)
                continue
            try:
                accept(i, msg)
            except (ProtocolError, SecAggProtocolError, ValueError) as exc:
                self.plane.reject(i, f"{kind}: {exc}")
                continue
            waiting.discard(i)
            answered.add(i)
        return answered

    # -- the phases -------------------------------------------------------------------------
    def run(self, weights: bytes) -> SecAggOutcome:
        """Run the round; ``weights``: the global model (``(d,)`` little-endian float64)."""
        try:
            total: np.ndarray | None = self._phases(weights)
            report: dict[str, Any] = {"status": "aggregated"}
        except SecAggAbortError as exc:
            total = None
            report = {"status": "abandoned", "reason": str(exc)}
            log.warning("round %d: secure aggregation abandoned: %s (model unchanged)",
                        self.t, exc)
            self._abort(set(self.events) - set(self.refused), f"round abandoned: {exc}")
        try:
            threshold: int | None = self.server.threshold
        except SecAggProtocolError:  # abandoned before the roster
            threshold = None
        report |= {"threshold": threshold, **self.sets}
        losses = [float(self.masked[i]["train_loss"]) for i in sorted(self.masked)
                  if total is not None and i in self.server.included
                  and self.masked[i]["train_loss"] is not None]
        return SecAggOutcome(total, self._entries(total is not None), losses, report)

    def _phases(self, weights: bytes) -> np.ndarray:
        exp, server, t = self.exp, self.server, self.t
        for k, i in enumerate(sorted(self.events)):
            mechanism = self.events[i].to_dict() if exp.state.book is not None else None
            self._send(i, "round", {"d": exp.state.d, "channel": None, "mechanism": mechanism,
                                    "slot": k, "deadline_s": float(exp.round_timeout_s),
                                    "tx_time_s": None, "await_slot": False,
                                    "aircomp": None}, weights)
        asked = set(self.events)
        u1 = self._gather("sa_keys", asked, exp.round_timeout_s,
                          lambda i, m: server.receive_keys(keys_from(m)))
        self.sets["keys"] = sorted(u1)
        self._abort(asked - u1 - set(self.refused), "no keys in time: left out of this round")
        roster = server.roster()  # fewer than 3: SecAggAbortError
        for i in sorted(u1):
            self._send(i, "sa_roster", roster_fields(roster))
        sent = self._gather("sa_shares", u1, self.phase_timeout_s,
                            lambda i, m: server.receive_share_keys(shares_from(m, u1)))
        self._abort(u1 - sent - set(self.refused), "no shares in time: left out of this round")
        u2, inbox = server.forward_shares()  # below the threshold: SecAggAbortError
        self.sets["shares"] = sorted(u2)
        with self.stop.critical():  # every upload of U2 is in the ledger before any inbox
            for i in sorted(u2):
                if exp.state.book is not None:
                    exp.state.book.commit(self.events[i], self.nonces[i])
                self.charged.add(i)
        fault_point("secagg_after_commit")
        for i in sorted(u2):
            self._send(i, "sa_inbox", inbox_fields(t, u2, inbox[i]))

        def take_masked(i: int, m: Message) -> None:
            server.receive_masked(masked_from(m))
            self.masked[i] = m

        self._gather("sa_masked", set(u2), self.phase_timeout_s, take_masked)
        self.sets["masked"] = sorted(self.masked)
        request = server.unmasking_request()  # below the threshold: SecAggAbortError
        for i in sorted(request.received):
            self._send(i, "sa_unmask_req", request_fields(request))
        self._abort(set(request.dropped), "masked input not in time: dropped from the sum, "
                                          "its masks removed")
        replied = self._gather("sa_unmask", set(request.received), self.phase_timeout_s,
                               lambda i, m: server.receive_unmasking(reply_from(m, request)))
        self.sets["unmasking_replies"] = sorted(replied)
        return np.asarray(server.aggregate(), dtype=np.float64)

    def _entries(self, summed: bool) -> dict[int, dict[str, Any]]:
        """Metrics entry of every asked device."""
        exp, out = self.exp, {}
        u1, u3 = set(self.sets.get("keys", [])), set(self.sets.get("masked", []))
        replied = set(self.sets.get("unmasking_replies", []))
        for i in sorted(self.events):
            entry: dict[str, Any] = {"device": i}
            if i not in self.charged:
                entry["transmitted"] = False
                if i not in self.refused:
                    entry["secagg"] = (
                        "left out: no keys in time" if i not in u1
                        else "round abandoned before any masked input (not charged)"
                        if not summed else "left out: no shares in time")
            else:
                # charged: its masked input arrived, or it may have been sent
                entry |= {"transmitted": True if i in self.masked else None,
                          "charged": exp.state.book is not None, "carrier": CARRIER,
                          "energy_comm_j": 0.0, "sigma": exp.state.uplinks[i].sigma}
                if i in self.masked:
                    m = self.masked[i]
                    loss = m["train_loss"]
                    entry |= {"train_loss": float("nan") if loss is None else float(loss),
                              "energy_comp_j": float(m["energy_comp_j"]),
                              "energy_comp_source": str(m["energy_comp_source"])}
                if not summed:
                    entry["secagg"] = "round abandoned"
                elif i in u3:
                    entry["secagg"] = ("in the sum" if i in replied else "in the sum (dropped "
                                       "after its masked input: no unmasking reply)")
                else:
                    entry["secagg"] = ("dropped before its masked input arrived: not in the "
                                       "sum, its pairwise masks removed through Shamir recovery")
                if exp.state.book is not None:
                    for name, result in exp.state.book.epsilon(i).items():
                        entry[f"epsilon_{name}"] = result.epsilon
            if i in self.refused:
                entry["refused"] = self.refused[i]
            if i in self.gone:
                entry["left"] = True
            out[i] = entry
        return out
