"""The control-plane clock offset to the aggregator (usrp link without a shared reference).

Without a shared time reference (``usrp.time_source`` ``internal`` or ``none``) an edge
maps the aggregator's burst times to its own clock with an NTP-style offset measured over
the control plane: ``clock_req`` (this host's send time) -> ``clock`` (the aggregator's
time), several exchanges (:func:`radio.time_sync.measure_offset`). It is measured at set-up
and again before every burst (:mod:`edge_device.lab.transmit`), and handed to the
transmitter. Other messages that arrive during an exchange are queued on the agent's ``inbox`` and
handled afterwards by its main loop, in the order they came.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from edge_device.lab.replies import send
from testbed.core.transport.protocol import ProtocolError, decode

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from radio.time_sync import OffsetEstimate
    from testbed.core.transport.curve_client import CurveClient

log = logging.getLogger("testbed.edge")

#: Seconds an edge waits for the aggregator's answer to one ``clock_req``.
CLOCK_REPLY_TIMEOUT_S = 2.0
#: Messages kept while waiting for a ``clock`` reply; beyond, the oldest are dropped.
MAX_QUEUED = 10_000


def queue_message(agent: AgentView, frames: list[bytes]) -> None:
    """Keep a message that came during a clock exchange for the main loop (the oldest is
    dropped, and counted, past :data:`MAX_QUEUED`)."""
    if len(agent.inbox) >= MAX_QUEUED:
        agent.inbox.popleft()
        agent.dropped += 1
    agent.inbox.append(frames)


def read_aggregator_clock(agent: AgentView, client: CurveClient) -> float:
    """One exchange: ask for the aggregator's clock and wait for the matching answer;
    every other message meanwhile is queued.

    Parameters
    ----------
    agent
        The asking agent (its ``clock``, ``clock_timeout_s`` and ``inbox``).
    client
        The control-plane connection to the aggregator.

    Returns
    -------
    float
        The aggregator's clock (s) when it answered.

    Raises
    ------
    TimeoutError
        No answer within ``clock_timeout_s``.
    """
    t_send = float(agent.clock())
    send(agent, client, "clock_req", {"t_send": t_send})
    end = time.monotonic() + agent.clock_timeout_s
    while (left := end - time.monotonic()) > 0:
        frames = client.recv(left)
        if frames is None:
            break
        try:
            msg = decode(frames)
        except ProtocolError:
            queue_message(agent, frames)  # the main loop drops and logs it
            continue
        if msg.type == "clock" and msg["device"] == agent.device and msg["t_send"] == t_send:
            return float(msg["t_remote"])
        queue_message(agent, frames)
    raise TimeoutError(f"device {agent.device}: no clock reply from the aggregator within "
                       f"{agent.clock_timeout_s:g} s")


def measure_offset(agent: AgentView, client: CurveClient, *, hold_s: float) -> OffsetEstimate:
    """Measure the offset to the aggregator's clock and hand it to the transmitter.

    Parameters
    ----------
    agent
        The measuring agent; its transmitter (``air``) must be open. Its ``offset`` is set.
    client
        The control-plane connection to the aggregator.
    hold_s
        How long (s) after the exchanges the estimate will be used (its drift allowance;
        at least the library's default).

    Returns
    -------
    OffsetEstimate
        The aggregator's clock minus this host's.

    Raises
    ------
    TimeoutError
        An exchange got no answer.
    """
    from radio.time_sync import DEFAULT_HOLD_S
    from radio.time_sync import measure_offset as measure

    assert agent.air is not None
    offset = measure(lambda: read_aggregator_clock(agent, client), clock=agent.clock,
                     hold_s=max(DEFAULT_HOLD_S, hold_s))
    agent.air.set_offset(offset)
    agent.offset = offset
    log.info("device %d: clock offset to the aggregator %+.6f s +- %.3f ms (rtt %.3f ms)",
             agent.device, offset.offset_s, 1e3 * offset.uncertainty_s, 1e3 * offset.rtt_s)
    return offset
