"""Fault injection and an air log, for crash tests and audits (both off unless asked).

``TESTBED_FAULT=NAME:N`` kills the process with SIGKILL (no clean-up, like a power cut or
``kill -9``) the ``N``-th time the fault point ``NAME`` is reached. The runner's points, in
the order one upload meets them: ``after_intent`` (journalled, not yet on air),
``after_transmit`` (on air, not yet in the ledger), ``after_commit`` (in the ledger, not yet
kept in ``inflight/``), ``after_inflight`` (kept, not yet fsynced), ``before_inflight_sync``
(a batch of kept uploads written, its group fsync not yet made); and per round
``after_checkpoint`` (checkpoint written, metrics line not yet appended). The lab
aggregator's: ``lab_after_request`` (the upload journalled and asked for, nothing received
yet). The edge agent's:
``edge_before_intent`` (trained, not yet journalled) and ``edge_after_intent`` (journalled,
upload not yet sent). On the ``usrp`` link: the edge's ``edge_after_burst`` (the burst handed
to its USRP, its ``upload`` not yet sent) and the aggregator's ``lab_before_capture`` (the
round's bursts on the air, the capture not yet read).

``TESTBED_PAUSE=NAME`` stops the process at the pause point ``NAME`` (it writes ``paused at
NAME`` on stderr, then sleeps), so that a test can signal it at a known place: ``cli_startup``
(the command line parsed, the command not started) and ``run_setup`` (``testbed run`` about to
load its data and set the run up).

``TESTBED_CLOCK_SKEW_S=S`` sets this host's clock, as the lab processes read it
(:func:`host_clock`), ``S`` seconds off the true time: an edge host without NTP, for the
virtual lab's clock-offset tests (the control-plane offset and the slot guard must cover it).

``TESTBED_LATE_BURST=N`` makes an edge hand its ``N``-th burst to its transmitter only after
the burst's time (a stalled host): the USRP finds it late and must report it
(:func:`late_burst`). ``TESTBED_TX_SHIFT_S=S`` moves every burst of an edge (``S:N``: its
``N``-th) ``S`` seconds from its slot after the transmitter's checks (an edge that mistakes
its slot): two edges meet in one slot and collide on the air (:func:`tx_shift_s`).

``TESTBED_READY_DELAY_S=S`` makes an edge wait ``S`` seconds before it says
``upload_ready`` in every paced round (``S:N``: in its ``N``-th only): a slow device, a
straggler once the train allowance has passed (:func:`ready_delay_s`).

``TESTBED_AIR_LOG=PATH`` appends one fsynced JSON line ``{"device", "round", "nonce"}`` just
before each transmission is handed to the link: the device's own record of what it put on
the air, against which the privacy ledger can be audited.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable

#: Seconds a pause point sleeps (the test signals it long before).
PAUSE_S = 3600.0

_counts: dict[str, int] = {}


def _spec() -> tuple[str, int] | None:
    raw = os.environ.get("TESTBED_FAULT", "")
    if not raw:
        return None
    name, _, count = raw.partition(":")
    try:
        n = int(count or "1")
    except ValueError:
        raise ValueError(f"TESTBED_FAULT={raw!r}: expected NAME:N with an integer N") from None
    return name, n


def fault_point(name: str) -> None:
    """Die here (SIGKILL) if ``TESTBED_FAULT`` names this point and its count is reached."""
    spec = _spec()
    if spec is None or spec[0] != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == spec[1]:
        os.kill(os.getpid(), signal.SIGKILL)


def pause_point(name: str) -> None:
    """Sleep here (after saying so on stderr) if ``TESTBED_PAUSE`` names this point."""
    if os.environ.get("TESTBED_PAUSE") != name:
        return
    print(f"paused at {name}", file=sys.stderr, flush=True)
    time.sleep(PAUSE_S)


def host_clock() -> Callable[[], float]:
    """This host's clock (s): :func:`time.time`, or ``TESTBED_CLOCK_SKEW_S`` seconds off it.

    Raises
    ------
    ValueError
        ``TESTBED_CLOCK_SKEW_S`` is not a finite number of seconds within +-1e6.
    """
    raw = os.environ.get("TESTBED_CLOCK_SKEW_S", "")
    if not raw:
        return time.time
    try:
        skew = float(raw)
    except ValueError:
        skew = math.nan
    if not (math.isfinite(skew) and abs(skew) <= 1e6):
        raise ValueError(f"TESTBED_CLOCK_SKEW_S={raw!r}; allowed: a number of seconds within "
                         "+-1e6")
    return lambda: time.time() + skew


def late_burst() -> bool:
    """Whether this burst is to be made late on purpose (``TESTBED_LATE_BURST=N``: the
    ``N``-th call returns ``True``)."""
    raw = os.environ.get("TESTBED_LATE_BURST", "")
    if not raw:
        return False
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"TESTBED_LATE_BURST={raw!r}: expected an integer N >= 1") from None
    _counts["late_burst"] = _counts.get("late_burst", 0) + 1
    return _counts["late_burst"] == n


def tx_shift_s() -> float:
    """Seconds this burst of the edge is moved from its slot: ``TESTBED_TX_SHIFT_S=S``
    moves every burst, ``S:N`` only the ``N``-th."""
    return _seconds_once_or_always("TESTBED_TX_SHIFT_S", "tx_shift", -10.0, 10.0,
                                   "seconds within +-10", "the N-th burst only")


def ready_delay_s() -> float:
    """Seconds this edge waits before its ``upload_ready``: ``TESTBED_READY_DELAY_S=S`` in
    every paced round, ``S:N`` in the ``N``-th only."""
    return _seconds_once_or_always("TESTBED_READY_DELAY_S", "ready_delay", 0.0, 600.0,
                                   "seconds in [0, 600]", "the N-th paced round only")


def _seconds_once_or_always(variable: str, counter: str, low: float, high: float,
                            seconds_allowed: str, nth_allowed: str) -> float:
    """The seconds ``S`` that the environment variable ``variable`` gives as ``S`` (every
    call) or ``S:N`` (the ``N``-th call only, counted under ``counter``; 0 on the others).

    Parameters
    ----------
    variable
        The environment variable; unset or empty: 0.
    counter
        The key under which this process counts the calls, for ``S:N``.
    low, high
        The seconds allowed, inclusive.
    seconds_allowed, nth_allowed
        What the error says is allowed for ``S`` and for ``:N``.

    Raises
    ------
    ValueError
        ``S`` is not a number of seconds in ``[low, high]`` or ``N`` not an integer >= 0.
    """
    raw = os.environ.get(variable, "")
    if not raw:
        return 0.0
    value, _, nth = raw.partition(":")
    try:
        seconds, n = float(value), int(nth or "0")
    except ValueError:
        seconds, n = math.nan, 0
    if not (math.isfinite(seconds) and low <= seconds <= high and n >= 0):
        raise ValueError(f"{variable}={raw!r}; allowed: {seconds_allowed}, "
                         f"optionally :N ({nth_allowed})")
    if n == 0:
        return seconds
    _counts[counter] = _counts.get(counter, 0) + 1
    return seconds if _counts[counter] == n else 0.0


def log_air(device: int, round_index: int, nonce: str | None) -> None:
    """Append one line to ``TESTBED_AIR_LOG`` (if set) before a transmission."""
    path = os.environ.get("TESTBED_AIR_LOG")
    if not path:
        return
    line = json.dumps({"device": device, "round": round_index, "nonce": nonce}) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
