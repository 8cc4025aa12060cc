"""The device's own transmitter on the ``usrp`` link: opening it and sending a round's burst.

On the ``usrp`` link the edge transmits its own burst on its own USRP
(:class:`radio.edge_radio.EdgeTransmitter`), due at the ``round``'s ``tx_time_s`` (its TDMA
slot's start, in the schedule's time base). Its intent is journalled in its ledger before the
air; its ``upload`` then carries the header and the transmitter's report instead of the
symbols (``on_air``), sent once the burst is over and the USRP has not reported it late (a
late burst never leaves the device, so its intent is withdrawn: nothing is charged). Without
a shared time reference the clock offset to the aggregator is measured again before every
burst (:mod:`edge_device.lab.clock`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_device.lab.clock import measure_offset
from edge_device.lab.errors import EdgeError
from edge_device.lab.replies import refuse, send, upload_fields, withdraw
from radio.link import LinkError, LinkFailed
from radio.usrp_settings import DeviceRadio
from testbed.core.runs.faults import fault_point, late_burst, tx_shift_s

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from radio.edge_radio import EdgeTransmitter
    from testbed.core.config.hardware import HardwareConfig
    from testbed.core.transport.curve_client import CurveClient

log = logging.getLogger("testbed.edge")

#: Opens the device's transmitter: (its radio settings, the folder for ``tx.log``).
AirFactory = Callable[[DeviceRadio, Path], "EdgeTransmitter"]
#: Seconds added to a burst's lead when sizing the offset's drift allowance (``hold_s``).
HOLD_MARGIN_S = 1.0


def open_transmitter(radio: DeviceRadio, log_dir: Path) -> EdgeTransmitter:
    """The device's ``tx`` flowgraph on its own USRP (looked for first)."""
    from radio.edge_radio import EdgeTransmitter
    from testbed.core.runs.faults import host_clock

    # The clock the agent measures its offset to the aggregator with (the same host clock).
    return EdgeTransmitter(radio, log_dir=log_dir, clock=host_clock())


def open_air(agent: AgentView, hw: HardwareConfig) -> None:
    """Open this device's transmitter (usrp link) with the agent's ``air_factory``; set the
    agent's ``shared_time`` and ``air``.

    Raises
    ------
    EdgeError
        No radio to open (:class:`radio.edge_radio.RadioUnavailable`).
    """
    from radio.edge_radio import RadioUnavailable
    from radio.tdma import shared_reference
    from testbed.core.config.hardware import device_radio

    agent.shared_time = shared_reference(hw.usrp.time_source)
    try:
        agent.air = agent.air_factory(device_radio(hw, agent.device), agent.state_dir)
    except RadioUnavailable as exc:
        raise EdgeError(str(exc)) from None


def burst_samples(agent: AgentView, t: int, local: Any, aircomp: dict[str, Any] | None
                  ) -> np.ndarray:
    """The samples of this device's burst in round ``t``: its own frame (its preamble root
    and pilots, so that the receiver tells its frame from another's) or, for ``aircomp``,
    its pre-equalized frame in the shared slot
    (:func:`edge_device.lab.aircomp_edge.slot_samples`)."""
    from radio.framing import device_waveform
    from radio.modem import modulate

    up = local.upload
    if aircomp is not None:
        from edge_device.lab.aircomp_edge import slot_samples

        return slot_samples(agent, t, up.symbols, aircomp)
    samples, _ = modulate(device_waveform(agent.waveform, agent.device),
                          np.asarray(up.symbols, dtype=np.complex128))
    return samples


def prepare_offset(agent: AgentView, client: CurveClient, t: int, nonce: str,
                   hold_s: float) -> bool:
    """Without a shared time reference, measure the clock offset to the aggregator for a
    burst at most ``hold_s`` away (a paced round: before ``upload_ready``, so that the
    ``slot``'s lead needs no clock exchange); refuse the round when no answer comes.
    Returns whether the device can transmit."""
    if agent.shared_time:
        return True
    try:
        measure_offset(agent, client, hold_s=hold_s + HOLD_MARGIN_S)
    except TimeoutError as exc:
        refuse(agent, client, t, nonce, f"not sent: {exc}; the slot time cannot be mapped "
                                        "to this host's clock")
        return False
    return True


def transmit(
    agent: AgentView, client: CurveClient, t: int, nonce: str, event: Any, local: Any,
    tx_time_s: float, aircomp: dict[str, Any] | None = None, *,
    samples: np.ndarray | None = None, offset_measured: bool = False,
) -> None:
    """Usrp link: send this round's burst at ``tx_time_s`` (the slot's start, schedule
    time base), the intent journalled before the air; then ``upload`` its report.

    Parameters
    ----------
    agent
        The transmitting agent (its transmitter ``air`` is open).
    client
        The control-plane connection to the aggregator.
    t, nonce
        The ``round`` request it answers.
    event
        The device's privacy event of the upload.
    local
        The device's local result of the round (its encoded ``upload``).
    tx_time_s
        When the burst is due (the aggregator's clock).
    aircomp
        Scheme ``aircomp``: the round's ``aircomp`` part (the burst is this device's frame
        in the shared slot, :func:`edge_device.lab.aircomp_edge.slot_samples`); ``None``:
        its own frame in its TDMA slot.
    samples
        The burst, made already (:func:`burst_samples`); ``None``: made here.
    offset_measured
        The clock offset was measured for this burst already (:func:`prepare_offset`).

    Raises
    ------
    EdgeError
        The transmitter is dead (the intent is withdrawn and the round refused first).
    """
    assert agent.air is not None
    if not agent.shared_time and not offset_measured:
        # Re-measured before every burst; its drift allowance covers the time to the slot.
        lead = tx_time_s - (agent.offset.to_remote(agent.clock()) if agent.offset else
                            tx_time_s)
        try:
            measure_offset(agent, client, hold_s=max(0.0, lead) + HOLD_MARGIN_S)
        except TimeoutError as exc:
            refuse(agent, client, t, nonce, f"not sent: {exc}; the slot time cannot be "
                                            "mapped to this host's clock")
            return
    fault_point("edge_before_intent")
    if agent.book is not None:
        agent.book.begin(event, nonce)  # before the air
    agent.pending[nonce] = event
    fault_point("edge_after_intent")
    up = local.upload
    if samples is None:
        samples = burst_samples(agent, t, local, aircomp)
    try:
        report = agent.air.transmit(samples, tx_time_s, hand_over_late=late_burst(),
                                    shift_s=tx_shift_s())
    except LinkFailed as exc:
        withdraw(agent, client, t, nonce, f"transmitter failed: {exc}")
        raise EdgeError(f"device {agent.device}: the transmitter failed: {exc}") from exc
    except (LinkError, ValueError) as exc:  # not sent: slot missed, power, time base
        withdraw(agent, client, t, nonce, f"not sent: {exc}")
        log.warning("device %d: round %d: burst not sent: %s", agent.device, t, exc)
        return
    fault_point("edge_after_burst")  # the burst is with the USRP, no upload sent yet
    try:
        agent.air.confirm(report)  # the USRP's late report: the burst never left
    except LinkFailed as exc:
        withdraw(agent, client, t, nonce, f"transmitter failed: {exc}")
        raise EdgeError(f"device {agent.device}: the transmitter failed: {exc}") from exc
    except LinkError as exc:
        withdraw(agent, client, t, nonce, f"not sent: {exc}")
        log.warning("device %d: round %d: burst not sent: %s", agent.device, t, exc)
        return
    send(agent, client, "upload", {
        **upload_fields(t, nonce, local, int(up.symbols.size)),
        "on_air": True,
        "tx_report": {
            "airtime_s": float(report.airtime_s), "tx_power_w": float(report.tx_power_w),
            "tx_time_usrp_s": float(report.tx_time_usrp_s),
            "timing_uncertainty_s": float(report.timing_uncertainty_s),
            "slack_s": float(report.slack_s),
        },
    }, b"")
    agent.uploads += 1
