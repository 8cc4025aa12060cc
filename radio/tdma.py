"""TDMA slots of one round: each device's burst gets its own time, with guards around it.

A round's uploads share one receiver, so the devices transmit one after another. Device
``i``'s burst is due at ``Slot.start_s`` and lasts ``burst_s``; the receiver cuts its window
``[start_s - guard_s, end_s + guard_s]``. Consecutive bursts are ``2 guard_s`` apart, so the
windows abut without overlapping, and a burst that starts up to ``guard_s`` early or late
still lies whole inside its own window and clear of its neighbours'.

The guard covers what the transmitters and the receiver do not agree on about time:

* a shared reference (10 MHz + PPS from an OctoClock, the MIMO cable, GPSDO): every USRP
  keeps the same time, and the guard is a fixed :data:`SHARED_REFERENCE_GUARD_S`;
* otherwise the time offset is measured over the control plane
  (:mod:`radio.time_sync`), and the guard is at least twice its uncertainty plus the
  burst-start jitter :data:`BURST_START_JITTER_S`, never less than the shared-reference
  guard.

Times are seconds on the schedule's time base (see :mod:`radio.edge_radio`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Time sources that give every USRP the same time (same list as the hardware config's).
SHARED_REFERENCES = ("external", "mimo", "gpsdo")
#: Time sources without a shared reference: the control-plane offset sets the guard.
UNSHARED_REFERENCES = ("internal", "none")
#: Guard (s) with a shared reference: USRP times agree to well under a microsecond, so this
#: covers the radios' fixed TX/RX pipeline latencies and the capture's sample rounding.
SHARED_REFERENCE_GUARD_S = 0.5e-3
#: Spread (s) of a timed burst's actual start besides the clock offset: the host-to-USRP
#: time mapping read over XML-RPC on each side and the DAC/ADC pipelines.
BURST_START_JITTER_S = 0.2e-3


@dataclass(frozen=True)
class Slot:
    """One device's slot.

    Attributes
    ----------
    device
        Device id.
    start_s
        When the burst is due (s, schedule time base): the transmitter's ``tx_time``.
    burst_s
        Burst duration (s).
    guard_s
        Guard on each side of the burst (s).
    """

    device: int
    start_s: float
    burst_s: float
    guard_s: float

    @property
    def end_s(self) -> float:
        """When the burst ends (s)."""
        return self.start_s + self.burst_s

    @property
    def window_start_s(self) -> float:
        """Start of the receiver's window for this device (s)."""
        return self.start_s - self.guard_s

    @property
    def window_end_s(self) -> float:
        """End of the receiver's window for this device (s)."""
        return self.end_s + self.guard_s


def _finite(name: str, value: float, minimum: float | None = None, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: got {value!r}; allowed: a finite number")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        sign = ">" if strict else ">="
        raise ValueError(f"{name}: got {value}; allowed: a finite number {sign} {minimum:g}")
    return float(value)


def tdma_schedule(
    devices: Sequence[int],
    burst_s: Mapping[int, float] | float,
    guard_s: float,
    start_s: float,
) -> list[Slot]:
    """Slots for ``devices`` in the given order, the first window opening at ``start_s``.

    Parameters
    ----------
    devices
        Device ids (distinct integers >= 0), in transmission order.
    burst_s
        Burst duration (s, > 0): one for all, or one per device (a mapping with every id).
    guard_s
        Guard on each side of a burst (s, >= 0), e.g. from :func:`slot_guard_s`.
    start_s
        Start of the first window (s, schedule time base); the first burst is due at
        ``start_s + guard_s``.

    Returns
    -------
    list[Slot]
        One slot per device; slot ``k + 1`` starts ``2 guard_s`` after slot ``k`` ends.

    Raises
    ------
    ValueError
        No devices, a repeated or negative id, a burst length missing or not > 0, a
        negative guard, or a non-finite time.
    """
    if len(devices) == 0:
        raise ValueError("devices: got none; allowed: at least one device id")
    seen: set[int] = set()
    for d in devices:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"devices: got {d!r}; allowed: integers >= 0")
        if d in seen:
            raise ValueError(f"devices: device {d} listed twice; allowed: one slot per device")
        seen.add(d)
    guard = _finite("guard_s", guard_s, 0.0)
    t = _finite("start_s", start_s) + guard
    slots: list[Slot] = []
    for d in devices:
        if isinstance(burst_s, Mapping):
            if d not in burst_s:
                raise ValueError(
                    f"burst_s: no duration for device {d}; given for {sorted(burst_s)}"
                )
            length = _finite(f"burst_s[{d}]", burst_s[d], 0.0, strict=True)
        else:
            length = _finite("burst_s", burst_s, 0.0, strict=True)
        slots.append(Slot(device=d, start_s=t, burst_s=length, guard_s=guard))
        t += length + 2 * guard
    return slots


def schedule_window(slots: Sequence[Slot]) -> tuple[float, float]:
    """``(start, end)`` (s) of the capture covering every slot's window."""
    if not slots:
        raise ValueError("slots: got none; allowed: at least one slot")
    return min(s.window_start_s for s in slots), max(s.window_end_s for s in slots)


def shared_reference(reference: str) -> bool:
    """Whether a time source (``usrp.time_source``) aligns every USRP's time.

    Raises
    ------
    ValueError
        An unknown time source.
    """
    if reference in SHARED_REFERENCES:
        return True
    if reference in UNSHARED_REFERENCES:
        return False
    allowed = ", ".join(SHARED_REFERENCES + UNSHARED_REFERENCES)
    raise ValueError(f"reference: got {reference!r}; allowed: {allowed}")


def slot_guard_s(
    uncertainty_s: float,
    reference: str,
    *,
    burst_jitter_s: float = BURST_START_JITTER_S,
    shared_guard_s: float = SHARED_REFERENCE_GUARD_S,
) -> float:
    """Guard (s) on each side of a burst.

    Parameters
    ----------
    uncertainty_s
        Largest uncertainty (s, >= 0) of any device's time offset from the receiver's
        (:attr:`radio.time_sync.OffsetEstimate.uncertainty_s` plus the host-to-USRP
        mappings). Ignored with a shared reference.
    reference
        ``usrp.time_source``: ``external``, ``mimo``, ``gpsdo`` (shared) or ``internal``,
        ``none`` (control-plane offset).
    burst_jitter_s
        Burst-start spread (s, >= 0) besides the offset.
    shared_guard_s
        The fixed guard (s, >= 0) with a shared reference, and the least guard otherwise.

    Returns
    -------
    float
        ``shared_guard_s`` with a shared reference, else
        ``max(2 uncertainty_s + burst_jitter_s, shared_guard_s)``.
    """
    u = _finite("uncertainty_s", uncertainty_s, 0.0)
    jitter = _finite("burst_jitter_s", burst_jitter_s, 0.0)
    fixed = _finite("shared_guard_s", shared_guard_s, 0.0)
    if shared_reference(reference):
        return fixed
    return max(2.0 * u + jitter, fixed)
