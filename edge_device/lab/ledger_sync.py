"""The device's own ledger against the aggregator's: its own privacy event of an upload,
``sync`` (adopt what the aggregator recorded), ``ack`` (record a credited upload), and the
comparison of the aggregator's event with the device's own.

Both ledgers must record the same event of every upload: the edge builds each event from
the run's config and its own shard (:func:`own_event`), taking only the credited channel
fields from the aggregator's messages.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from testbed.core.upload_events import channel_fields, channel_keys, upload_event

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from testbed.core.transport.protocol import Message

log = logging.getLogger("testbed.edge")


def own_event(agent: AgentView, round_index: int, channel: dict[str, Any] | None) -> Any:
    """The device's own privacy event of its upload in round ``round_index``.

    Parameters
    ----------
    agent
        A set-up agent (its ``cfg``, ``uplink``, ``record``, ``d``).
    round_index
        The round of the upload.
    channel
        The aggregator's credited channel fields (only
        :func:`~testbed.core.upload_events.channel_keys` of the run's scheme are taken;
        ``None``: none).
    """
    fields = channel_fields(None, agent.uplink, agent.d)
    if channel is not None:
        fields |= {k: channel[k] for k in channel_keys(agent.cfg.scheme) if k in channel}
    return upload_event(agent.cfg, agent.uplink, agent.record, agent.device, round_index,
                        fields)


def mechanism_differs(agent: AgentView, event: Any, theirs: dict[str, Any] | None
                      ) -> str | None:
    """Why the aggregator's event of this upload is not this device's own (``None``:
    they agree, or either side keeps no ledger)."""
    if agent.book is None or theirs is None:
        return None
    mine = event.to_dict()
    if mine == theirs:
        return None
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    diff = ", ".join(f"{k}: aggregator {theirs.get(k)!r}, this device {mine.get(k)!r}"
                     for k in keys)
    return (f"the aggregator's privacy event of this upload differs from this device's "
            f"own ({diff}); do both run the same config and data?")


def on_sync(agent: AgentView, msg: Message) -> None:
    """``sync`` (or ``finished``): record every upload of this device that the aggregator
    recorded and this ledger lacks, each event built here (never asked for again: a
    (device, round) is released and charged at most once); warn of differences."""
    if agent.book is None:
        return
    recorded = agent.book.nonces()
    theirs = set()
    for item in msg["events"]:
        nonce, data = item["nonce"], item["event"]
        theirs.add(nonce)
        if not isinstance(data.get("round"), int) or data.get("device") != agent.device:
            agent.dropped += 1
            continue
        mine = own_event(agent, data["round"], data)
        if nonce in recorded:
            if mine.to_dict() != agent.book.entries_by_nonce().get(nonce, mine).to_dict():
                log.warning("device %d: ledgers differ on upload %s", agent.device, nonce)
            continue
        agent.pending.pop(nonce, None)
        agent.book.commit(mine, nonce)
        log.info("device %d: recorded upload %s of round %d as the aggregator did",
                 agent.device, nonce, data["round"])
    missing = recorded - theirs
    if missing:
        log.warning("device %d: the aggregator holds no record of %d uploads of this "
                    "device's ledger", agent.device, len(missing))


def on_ack(agent: AgentView, msg: Message) -> None:
    """``ack``: commit the acknowledged upload's intent with the credited channel fields
    (an unknown nonce is dropped)."""
    nonce = msg["nonce"]
    event = agent.pending.pop(nonce, None)
    if event is None:
        agent.dropped += 1
        return
    if agent.book is not None:
        agent.book.commit(own_event(agent, event.round, msg["channel"]), nonce)
