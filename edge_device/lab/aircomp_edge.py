"""Scheme ``aircomp`` on the ``usrp`` link, the edge's side: its pilot and its frame in the
shared slot.

Each round the aggregator first asks every device for its **pilot** (``pilot``: the public
pilot frame, alone, at ``tx_time_s``); the receiver estimates the device's path from it.
The ``round`` request then carries ``aircomp``: the device's pre-equalization
``alpha = c / h_hat``, the common amplitude ``c`` and the bound on ``E|x|^2`` its frame is
normalised with; every participant sends its frame (:func:`radio.aircomp_air.slot_frame`,
values and public probe) scaled by ``alpha sqrt(E|x|^2)`` at the same ``tx_time_s``, and
the frames superpose on the air. The device's event of the round
(``record-aircomp/v1``) is built from its own settings and the round's part the
aggregator sends (:data:`testbed.core.upload_events.AIRCOMP_CHANNEL_KEYS`); the aggregator
never sees the device's values, only the sum.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_device.lab.errors import EdgeError
from radio.aircomp_air import frame_scale, pilot_sequence, slot_frame
from radio.link import LinkError, LinkFailed

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from testbed.core.transport.protocol import Message

log = logging.getLogger("testbed.edge")


def on_pilot(agent: AgentView, msg: Message) -> None:
    """``pilot``: send the public pilot frame alone at ``tx_time_s``. Nothing private goes
    on air, so nothing is journalled; a pilot not sent only leaves this device out of the
    round (the aggregator finds no frame).

    Raises
    ------
    EdgeError
        The transmitter is dead.
    """
    from radio.modem import modulate

    t = msg["round"]
    if agent.air is None or not agent.shared_time:
        log.warning("device %d: round %d: pilot asked, but this edge has %s; it sits the "
                    "round out", agent.device, t,
                    "no transmitter" if agent.air is None else "no shared time reference")
        return
    pilot = pilot_sequence(int(msg["n_symbols"]))
    frame, _ = modulate(agent.waveform, pilot)
    try:
        agent.air.transmit(frame, float(msg["tx_time_s"]))
    except LinkFailed as exc:
        raise EdgeError(f"device {agent.device}: the transmitter failed: {exc}") from exc
    except (LinkError, ValueError) as exc:
        log.warning("device %d: round %d: pilot not sent: %s", agent.device, t, exc)


def slot_samples(agent: AgentView, t: int, symbols: np.ndarray, part: dict[str, Any]
                 ) -> np.ndarray:
    """This device's samples for round ``t``'s shared slot: its values ``symbols`` and its
    probe, pre-equalized as the round's ``aircomp`` part says."""
    alpha = complex(float(part["alpha_re"]), float(part["alpha_im"]))
    power = float(part["signal_power"])
    frame = slot_frame(agent.waveform, np.asarray(symbols, dtype=np.complex128), t,
                       agent.device, power)
    return frame * frame_scale(alpha, power)
