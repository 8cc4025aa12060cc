"""Clock offsets between hosts and radios, measured NTP-style (pure functions).

One exchange gives three time stamps: ``t_send`` and ``t_recv`` on the *local* clock when a
request left and its answer came back, and ``t_remote`` on the *remote* clock, read by the
peer at some instant in between. Whatever the delays in the two directions (asymmetric
included), the remote clock was read at a local time ``tau`` in ``[t_send, t_recv]``, so

    offset = remote clock - local clock = t_remote - tau
           in [t_remote - t_recv, t_remote - t_send]

whose midpoint ``t_remote - (t_send + t_recv) / 2`` is off by at most ``rtt / 2``. The
exchange with the smallest round trip gives the tightest bound; clock drift since then (and
over the time the estimate will be used, ``hold_s``) widens it by ``drift_ppm``.

The same arithmetic maps a host's clock to its USRP's: the "remote" reading is the USRP
time, read over the flowgraph's XML-RPC control between two host clock reads
(:func:`measure_offset` with the flowgraph's ``get_time_now``).

Time stamps are seconds (floats, e.g. UNIX time from :func:`time.time`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Default relative frequency error allowed between two free-running clocks (parts per
#: million): crystal oscillators are specified to +-20..50 ppm; NTP-disciplined hosts do
#: better, a USRP's TCXO (N210: 2.5 ppm) too.
DEFAULT_DRIFT_PPM = 50.0
#: Default time (s) an offset estimate is used after its last exchange.
DEFAULT_HOLD_S = 10.0

#: One exchange: (t_send, t_remote, t_recv) in seconds; t_send and t_recv on the local clock.
Exchange = tuple[float, float, float]


@dataclass(frozen=True)
class OffsetEstimate:
    """An estimate of ``remote clock - local clock``.

    Attributes
    ----------
    offset_s
        Estimated offset (s): a local time ``t`` reads ``t + offset_s`` on the remote clock.
    uncertainty_s
        Half-width (s) of an interval around ``offset_s`` that contains the true offset
        (the best exchange's ``rtt / 2`` plus the drift allowance).
    rtt_s
        Round-trip time (s) of the exchange the estimate comes from.
    """

    offset_s: float
    uncertainty_s: float
    rtt_s: float

    def __post_init__(self) -> None:
        for name in ("offset_s", "uncertainty_s", "rtt_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"OffsetEstimate.{name}: got {getattr(self, name)}; "
                                 "allowed: a finite number")
        if self.uncertainty_s < 0 or self.rtt_s < 0:
            raise ValueError(
                f"OffsetEstimate: uncertainty_s {self.uncertainty_s} and rtt_s {self.rtt_s} "
                "must be >= 0"
            )

    def to_remote(self, t_local_s: float) -> float:
        """The remote clock's reading (s) at local time ``t_local_s``."""
        return t_local_s + self.offset_s

    def to_local(self, t_remote_s: float) -> float:
        """The local clock's reading (s) at remote time ``t_remote_s``."""
        return t_remote_s - self.offset_s

    def contains(self, true_offset_s: float) -> bool:
        """Whether ``true_offset_s`` lies within ``offset_s +- uncertainty_s``."""
        return abs(true_offset_s - self.offset_s) <= self.uncertainty_s


def exact(offset_s: float = 0.0) -> OffsetEstimate:
    """An offset known exactly (the aggregator against its own clock: 0)."""
    return OffsetEstimate(offset_s=float(offset_s), uncertainty_s=0.0, rtt_s=0.0)


def _check_exchange(i: int, ex: Sequence[float]) -> Exchange:
    if len(ex) != 3:
        raise ValueError(f"exchange {i}: got {len(ex)} values; allowed: (t_send, t_remote, "
                         "t_recv)")
    t_send, t_remote, t_recv = (float(v) for v in ex)
    if not all(math.isfinite(v) for v in (t_send, t_remote, t_recv)):
        raise ValueError(f"exchange {i}: got {tuple(ex)}; allowed: finite time stamps")
    if t_recv < t_send:
        raise ValueError(
            f"exchange {i}: t_recv {t_recv} is before t_send {t_send}; the local clock must "
            "not step backwards during an exchange (use one clock for both stamps)"
        )
    return t_send, t_remote, t_recv


def estimate_offset(
    samples: Sequence[Sequence[float]],
    *,
    drift_ppm: float = DEFAULT_DRIFT_PPM,
    hold_s: float = DEFAULT_HOLD_S,
) -> OffsetEstimate:
    """Offset of the remote clock from the local one, from the minimum-RTT exchange.

    Parameters
    ----------
    samples
        Exchanges ``(t_send, t_remote, t_recv)`` in seconds, in any order.
    drift_ppm
        Largest relative frequency error between the clocks (ppm, >= 0).
    hold_s
        How long after the last exchange the estimate will be used (s, >= 0).

    Returns
    -------
    OffsetEstimate
        ``offset_s = t_remote - (t_send + t_recv) / 2`` of the exchange with the smallest
        round trip; ``uncertainty_s = rtt / 2 + drift_ppm * 1e-6 * (age + hold_s)``, where
        ``age`` is the time from that exchange to the last one.

    Raises
    ------
    ValueError
        No exchanges, a non-finite stamp, ``t_recv < t_send``, or a negative drift or hold.
    """
    if not samples:
        raise ValueError("estimate_offset: got no exchanges; allowed: at least one "
                         "(t_send, t_remote, t_recv)")
    if not (math.isfinite(drift_ppm) and drift_ppm >= 0):
        raise ValueError(f"drift_ppm: got {drift_ppm}; allowed: a finite number >= 0")
    if not (math.isfinite(hold_s) and hold_s >= 0):
        raise ValueError(f"hold_s: got {hold_s}; allowed: a finite number >= 0 (s)")
    checked = [_check_exchange(i, ex) for i, ex in enumerate(samples)]
    t_send, t_remote, t_recv = min(checked, key=lambda ex: ex[2] - ex[0])
    rtt = t_recv - t_send
    last = max(ex[2] for ex in checked)
    age = last - (t_send + t_recv) / 2
    drift = drift_ppm * 1e-6 * (age + hold_s)
    return OffsetEstimate(
        offset_s=t_remote - (t_send + t_recv) / 2, uncertainty_s=rtt / 2 + drift, rtt_s=rtt
    )


def measure_offset(
    read_remote: Callable[[], float],
    *,
    exchanges: int = 8,
    clock: Callable[[], float] = time.time,
    drift_ppm: float = DEFAULT_DRIFT_PPM,
    hold_s: float = DEFAULT_HOLD_S,
) -> OffsetEstimate:
    """Run ``exchanges`` round trips of ``read_remote`` and estimate the offset.

    Parameters
    ----------
    read_remote
        Asks the peer for its clock (a control-plane request, or a flowgraph's
        ``get_time_now``) and returns it (s).
    exchanges
        Number of round trips (>= 1); the fastest one is used.
    clock
        The local clock (s); the same one must later convert times with the estimate.
    drift_ppm, hold_s
        As in :func:`estimate_offset`.
    """
    if exchanges < 1:
        raise ValueError(f"exchanges: got {exchanges}; allowed: >= 1")
    samples: list[Exchange] = []
    for _ in range(exchanges):
        t_send = clock()
        t_remote = float(read_remote())
        samples.append((t_send, t_remote, clock()))
    return estimate_offset(samples, drift_ppm=drift_ppm, hold_s=hold_s)
