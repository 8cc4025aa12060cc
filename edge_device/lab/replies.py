"""The edge's own messages that every part of its round sends: any message, ``refuse``,
withdrawing a journalled intent, and the fields of an ``upload``.

Functions of the agent (:class:`~edge_device.lab.agent_view.AgentView`), shared by the
round (:mod:`edge_device.lab.rounds`), the burst (:mod:`edge_device.lab.transmit`) and
secure aggregation (:mod:`edge_device.lab.secagg_phases`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from testbed.core.transport.protocol import encode

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from testbed.core.transport.curve_client import CurveClient


def send(agent: AgentView, client: CurveClient, msg_type: str, fields: dict[str, Any],
         payload: bytes | None = None, timeout_s: float = 5.0) -> None:
    """Send ``msg_type`` with ``fields`` (and this device's id) and ``payload``.

    Parameters
    ----------
    agent
        The sending agent (its ``device`` goes into every message).
    client
        The control-plane connection to the aggregator.
    msg_type, fields, payload
        The message (:func:`testbed.core.transport.protocol.encode`).
    timeout_s
        Seconds to wait for room in the send queue.
    """
    client.send(encode(msg_type, {"device": agent.device, **fields}, payload), timeout_s)


def refuse(agent: AgentView, client: CurveClient, t: int, nonce: str, reason: str) -> None:
    """Say ``refuse`` (nothing went on air); a replay of the request is then ignored."""
    agent.refusals += 1
    agent.withdrawn.add(nonce)
    send(agent, client, "refuse", {"round": t, "nonce": nonce, "reason": reason})


def withdraw(agent: AgentView, client: CurveClient, t: int, nonce: str, reason: str) -> None:
    """Withdraw a journalled intent whose burst was not sent, and refuse."""
    if agent.book is not None:
        agent.book.cancel(nonce)
    agent.pending.pop(nonce, None)
    refuse(agent, client, t, nonce, reason)


def upload_fields(t: int, nonce: str, local: Any, n_symbols: int) -> dict[str, Any]:
    """The fields every ``upload`` of round ``t`` carries (besides ``on_air`` and
    ``tx_report``).

    Parameters
    ----------
    t, nonce
        The ``round`` request it answers.
    local
        The device's local result of the round (its ``upload``, ``train_loss``, ``comp``).
    n_symbols
        How many symbols the upload's burst holds.

    Returns
    -------
    dict
        ``round``, ``nonce``, ``header``, ``n_symbols``, ``symbol_energy``, ``train_loss``
        (``None`` when not finite), ``energy_comp_j``, ``energy_comp_source``.
    """
    up = local.upload
    loss = local.train_loss if math.isfinite(local.train_loss) else None
    return {
        "round": t, "nonce": nonce, "header": up.header.to_dict(),
        "n_symbols": n_symbols, "symbol_energy": float(up.symbol_energy),
        "train_loss": loss, "energy_comp_j": float(local.comp.energy_j),
        "energy_comp_source": str(local.comp.source),
    }
