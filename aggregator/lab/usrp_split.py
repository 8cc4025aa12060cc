"""The aggregator's side of the split ``usrp`` link in a lab run: the round's TDMA schedule
and the link that only receives.

Over USRPs each edge transmits its own burst on its own radio, at the start of its slot;
the aggregator never drives a transmitter. Per round it

1. sizes each scheduled device's burst (the frame :func:`radio.modem.modulate` makes of
   ``n_symbols_for(l)`` symbols) and the guard (:func:`radio.tdma.slot_guard_s` from the
   worst timing uncertainty the edges reported, or the fixed guard of a shared reference);
2. once every asked edge said ``upload_ready`` (trained, noised, burst built) or the
   deadline ``train_allowance_s`` passed, lays the slots of the ready devices out back to
   back, the first window opening :func:`slot_lead_s` after now on the receiver's time
   base (:meth:`radio.slot_receiver.SlotReceiver.now_s`), and sends each its slot start
   (``slot``, ``tx_time_s``); a device not ready is told it has no slot;
3. once the last window has passed, captures the schedule once and decodes each window
   (:meth:`radio.slot_receiver.SlotReceiver.receive_all`).

Times are seconds on the schedule's time base (:mod:`radio.edge_radio`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from radio.framing import WaveformParams
from radio.link import Link, LinkError, LinkFailed, Reception
from radio.modem import frame_samples
from radio.slot_receiver import RoundReception, SlotReceiver
from radio.tdma import Slot, slot_guard_s, tdma_schedule
from testbed.core.config.hardware import HardwareConfig, receiver_radio
from testbed.core.links import waveform_params

#: Timing uncertainty (s) assumed of a device that has not reported one yet (its first
#: round): a LAN round trip of a few ms plus 50 ppm over a 10 s hold, with margin.
INITIAL_TIMING_UNCERTAINTY_S = 5e-3
#: Largest timing uncertainty (s) a guard is sized for; a device reporting more is likely to
#: miss its window (its upload is then lost, charged without channel credit).
MAX_GUARD_UNCERTAINTY_S = 0.05
#: Time (s) after the last window closes before the capture is read (ring delivery).
CAPTURE_MARGIN_S = 0.05
#: Default and largest deadline (s) from sending ``round`` to an edge's ``upload_ready``
#: (the edges train in it; a device not ready by then is a straggler for the round, is told
#: so and is not charged). An edge refuses a burst due more than 30 s ahead
#: (``radio.edge_radio.MAX_LEAD_S``).
DEFAULT_TRAIN_ALLOWANCE_S = 10.0
MAX_TRAIN_ALLOWANCE_S = 25.0
#: Time (s) from sending the ``slot`` messages to the first slot, beyond the hardware
#: config's ``usrp.burst_lead_s``: the message's delivery and an edge's clock exchanges
#: (without a shared reference it measures its offset before every burst).
SLOT_MESSAGE_ALLOWANCE_S = 0.1


def slot_lead_s(hw: HardwareConfig) -> float:
    """Seconds from the ``slot`` messages to the first slot of a paced round:
    ``usrp.burst_lead_s`` (what a transmitter needs to have a burst in hand before it is
    due) plus :data:`SLOT_MESSAGE_ALLOWANCE_S`."""
    return float(hw.usrp.burst_lead_s) + SLOT_MESSAGE_ALLOWANCE_S


class ReceiverFactory(Protocol):
    """Opens the aggregator's slot receiver (tests inject one with a stand-in stream)."""

    def __call__(
        self,
        hw: HardwareConfig,
        *,
        record_dir: Path | None,
        confidence: float,
        log_dir: Path | None,
        clock: Callable[[], float],
    ) -> SlotReceiver: ...


def open_slot_receiver(
    hw: HardwareConfig,
    *,
    record_dir: Path | None,
    confidence: float,
    log_dir: Path | None,
    clock: Callable[[], float],
) -> SlotReceiver:
    """The receiver of ``usrp.rx_args`` (the ``rx`` flowgraph; looks for the USRP first).

    Raises
    ------
    radio.edge_radio.RadioUnavailable
        No USRP at ``usrp.rx_args``, or the flowgraph failed to start.
    """
    return SlotReceiver(
        receiver_radio(hw),
        waveform_params(hw),
        confidence=confidence,
        record_dir=record_dir,
        hw_name=hw.name,
        log_dir=log_dir,
        clock=clock,
    )


class SplitReceiverLink(Link):
    """The ``usrp`` link of a lab aggregator: it owns the slot receiver and sends nothing.

    ``probe`` returns ``None`` (hardware: no channel credit before reception), and nothing
    is carried through :meth:`transmit`: each upload's :class:`~radio.link.Reception` comes
    from :meth:`receive` and is handed to the runner as already captured.

    Parameters
    ----------
    receiver
        The started slot receiver (closed with the link).
    """

    name = "usrp"
    exact_state = False

    @property
    def noise_is_secret(self) -> bool:
        """``True``: the receiver's own thermal noise, drawn by no generator (as
        :attr:`radio.usrp_link.UsrpLink.noise_is_secret`)."""
        return True

    def __init__(self, receiver: SlotReceiver) -> None:
        self.receiver = receiver

    def transmit(
        self, *, device: int, round_index: int, symbols: np.ndarray, rng: np.random.Generator
    ) -> Reception:
        raise LinkFailed(
            f"usrp link (lab): device {device}, round {round_index}: the "
            "aggregator transmits nothing; each edge sends its own burst"
        )

    def receive(
        self, slots: Sequence[Slot], n_payload: Mapping[int, int], *, round_index: int
    ) -> dict[int, Reception | LinkError]:
        """Each slot's reception, or the :class:`~radio.link.LinkError` of its lost frame.

        Raises
        ------
        radio.link.LinkFailed
            The receiver died, stalled or dropped samples.
        """
        return dict(self.receiver.receive_all(slots, n_payload, round_index=round_index))

    def start_round(
        self, slots: Sequence[Slot], n_payload: Mapping[int, int], *, round_index: int,
        on_air: Callable[[int], bool],
    ) -> RoundReception:
        """Read and decode the round's windows as the slots go by
        (:meth:`radio.slot_receiver.SlotReceiver.start_round`); its ``finish`` returns what
        :meth:`receive` does.

        Raises
        ------
        radio.link.LinkFailed
            The receiver died.
        """
        return self.receiver.start_round(slots, n_payload, round_index=round_index,
                                         on_air=on_air)

    def close(self) -> None:
        self.receiver.close()


def burst_seconds(waveform: WaveformParams, n_payload: int) -> float:
    """Air time (s) of the frame that carries ``n_payload`` symbols (preamble, pilots and
    pulse tails included): :func:`radio.modem.modulate`'s length over the sample rate."""
    return frame_samples(waveform, n_payload) / waveform.sample_rate_hz


def round_guard_s(
    reported_s: Mapping[int, float],
    devices: Sequence[int],
    time_source: str,
    *,
    receiver_uncertainty_s: float = 0.0,
    floor_s: float = 0.0,
) -> float:
    """Guard (s) on each side of a burst for the devices of one round.

    Parameters
    ----------
    reported_s
        Each device's last reported timing uncertainty (s; ``tx_report``); a device
        without one counts :data:`INITIAL_TIMING_UNCERTAINTY_S`.
    devices
        The devices scheduled this round.
    time_source
        ``usrp.time_source``: a shared reference gives the fixed guard.
    receiver_uncertainty_s
        The receiver's own schedule-to-USRP mapping uncertainty (s).
    floor_s
        The least guard (s): the one the hardware config's calibration measured the bench's
        timing errors and drift to need (``calibration.guard_s``; 0 without one).

    Returns
    -------
    float
        :func:`radio.tdma.slot_guard_s` of the worst device's uncertainty (capped at
        :data:`MAX_GUARD_UNCERTAINTY_S`) plus the receiver's, at least ``floor_s``.
    """
    worst = max(
        (reported_s.get(i, INITIAL_TIMING_UNCERTAINTY_S) for i in devices),
        default=INITIAL_TIMING_UNCERTAINTY_S,
    )
    worst = min(worst, MAX_GUARD_UNCERTAINTY_S)
    return max(slot_guard_s(worst + receiver_uncertainty_s, time_source), float(floor_s))


def round_slots(
    devices: Sequence[int],
    n_payload: Mapping[int, int],
    waveform: WaveformParams,
    guard_s: float,
    now_s: float,
    train_allowance_s: float,
) -> list[Slot]:
    """The round's TDMA slots, in ``devices`` order, the first window opening
    ``train_allowance_s`` after ``now_s`` (schedule time base, s).

    Each device's burst lasts :func:`burst_seconds` of its ``n_payload`` symbols; the
    windows (burst +- ``guard_s``) abut without overlapping (:func:`radio.tdma.tdma_schedule`).
    """
    bursts = {i: burst_seconds(waveform, n_payload[i]) for i in devices}
    return tdma_schedule(list(devices), bursts, guard_s, now_s + train_allowance_s)
