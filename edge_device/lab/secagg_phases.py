"""The agent's secure-aggregation phases (002, scheme ``zcdp-secagg``): its ``sa_*`` messages.

A trained ``round`` is answered with ``sa_keys`` (:func:`begin_secagg`); then, per aggregator
message (:func:`on_secagg`): ``sa_roster`` -> ``sa_shares``; ``sa_inbox`` -> the upload is
recorded in the device's ledger (the aggregator recorded it before relaying the inbox),
then the masked update goes out as ``sa_masked``; ``sa_unmask_req`` -> ``sa_unmask``;
``sa_abort`` ends the session. A step the session will not take refuses the round. The
cryptographic state machine is :class:`edge_device.lab.secagg_client.EdgeSecAgg`.

Fault points (:mod:`testbed.core.runs.faults`): ``edge_before_masked`` (recorded, not yet
masked) and ``edge_before_unmasking`` (masked input sent, unmasking request not answered).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from edge_device.lab.replies import refuse, send
from edge_device.lab.secagg_client import SESSION_ERRORS
from testbed.core.runs.faults import fault_point

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from edge_device.lab.secagg_client import Session
    from testbed.core.transport.curve_client import CurveClient
    from testbed.core.transport.protocol import Message

log = logging.getLogger("testbed.edge")

#: The aggregator's secure-aggregation messages (:func:`on_secagg`).
SECAGG_MESSAGES = ("sa_roster", "sa_inbox", "sa_unmask_req", "sa_abort")


def begin_secagg(agent: AgentView, client: CurveClient, t: int, nonce: str, local: Any,
          event: Any) -> None:
    """Trained: start the round's session and advertise its keys (``sa_keys``).

    Parameters
    ----------
    agent
        The agent (its ``secagg`` sessions).
    client
        The control-plane connection to the aggregator.
    t, nonce
        The ``round`` request it answers.
    local
        The device's local result of the round (its noisy ``differential``).
    event
        The device's privacy event of the upload.
    """
    assert agent.secagg is not None and local.differential is not None
    loss = local.train_loss if math.isfinite(local.train_loss) else None
    meta = {"train_loss": loss, "energy_comp_j": float(local.comp.energy_j),
            "energy_comp_source": str(local.comp.source)}
    fields = agent.secagg.begin(t, nonce, local.differential, event, meta)
    send(agent, client, "sa_keys", {**fields, "nonce": nonce})


def _refuse_round(agent: AgentView, client: CurveClient, msg: Message, reason: str) -> None:
    """End the session and refuse its round."""
    assert agent.secagg is not None
    agent.secagg.end()
    log.warning("device %d: round %d: %s", agent.device, msg["round"], reason)
    refuse(agent, client, msg["round"], msg["nonce"], reason)


def on_secagg(agent: AgentView, client: CurveClient, msg: Message) -> None:
    """A secure-aggregation message of the aggregator (``sa_*``); one not for the current
    session (another round's, a replay, or no session) is dropped."""
    s = agent.secagg.current(msg) if agent.secagg is not None else None
    if s is None:
        agent.dropped += 1  # another round's, a replay, or no session
        return
    assert agent.secagg is not None
    t, nonce = s.round, s.nonce
    if msg.type == "sa_abort":
        log.info("device %d: round %d: %s", agent.device, t, msg["reason"])
        agent.secagg.end()
        return
    try:
        if msg.type == "sa_roster":
            send(agent, client, "sa_shares", {**agent.secagg.share(s, msg), "nonce": nonce})
        elif msg.type == "sa_inbox":
            _send_masked(agent, client, s, msg)
        elif msg.type == "sa_unmask_req":
            fault_point("edge_before_unmasking")
            send(agent, client, "sa_unmask", {**agent.secagg.reveal(s, msg), "nonce": nonce})
    except SESSION_ERRORS as exc:
        _refuse_round(agent, client, msg, f"secure aggregation: {type(exc).__name__}: {exc}")


def _send_masked(agent: AgentView, client: CurveClient, s: Session, msg: Message) -> None:
    """``sa_inbox``: record the upload (the aggregator recorded it before relaying the
    inbox), then mask the update and send it.

    Raises
    ------
    ValueError
        The upload would pass the device's own epsilon target (the round is refused).
    """
    if agent.book is not None and s.nonce not in agent.book.nonces():
        if not agent.book.allows(s.event):
            raise ValueError(f"this upload would pass the device's own epsilon target "
                             f"{agent.target:g} ({agent.book.enforce} accounting)")
        agent.book.commit(s.event, s.nonce)
    fault_point("edge_before_masked")
    assert agent.secagg is not None
    payload = agent.secagg.mask(s, msg)
    send(agent, client, "sa_masked", {"round": s.round, "nonce": s.nonce, "d": agent.d,
                                      **s.meta}, payload)
    agent.uploads += 1
