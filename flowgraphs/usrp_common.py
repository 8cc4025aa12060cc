"""Shared parts of the tx and rx flowgraphs: argument parsing, the XML-RPC server, the
parent watchdog, the signal handling and the sink's async events (imported only under
/usr/bin/python3).

``gnuradio.uhd`` is not imported here: the flowgraphs import it only when they construct a
UHD block, so ``--build-only`` (without ``--open-device``) never loads UHD and never sends
a discovery packet. Virtual devices (``type=virtual``, :mod:`virtual_usrp`) never load it.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from xmlrpc.server import SimpleXMLRPCServer

import pmt
from gnuradio import gr

# radio.virtual_device from the repository these flowgraphs belong to (standard library).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from radio.uhd_guard import check_loopback_only  # noqa: E402, F401 - for tx.py and rx.py
from radio.virtual_device import VirtualArgs, is_virtual  # noqa: E402

_AIR_ADDRESS = re.compile(r"^tcp://[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")


def usrp_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the USRP parameters common to tx and rx."""
    p.add_argument("--device-args", default="", help="UHD device args, e.g. addr=192.168.10.2")
    p.add_argument("--samp-rate", type=float, default=1e6, help="sample rate (Hz)")
    p.add_argument("--center-freq", type=float, default=915e6, help="centre frequency (Hz)")
    p.add_argument("--gain", type=float, default=10.0, help="gain (dB)")
    p.add_argument("--antenna", default="", help="antenna port")
    p.add_argument("--clock-source", default="internal", help="internal|external|mimo|gpsdo")
    p.add_argument("--time-source", default="internal", help="internal|external|mimo|gpsdo|none")
    p.add_argument(
        "--time-epoch", choices=("zero", "host-pps"), default="zero",
        help="zero: USRP time 0 at start-up (rx: at the next PPS with an external time "
        "source); host-pps: at a PPS edge, the host's UNIX second (every USRP on the same "
        "PPS then keeps the same time; needs --time-source external, gpsdo or mimo)",
    )
    p.add_argument("--xmlrpc-port", type=int, default=0, help="XML-RPC control port (0: none)")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    p.add_argument(
        "--build-only", action="store_true",
        help="construct, print the blocks, then exit 0; a null sink/source stands in for "
        "the UHD block (UHD is not even imported) unless --open-device is given",
    )
    p.add_argument(
        "--open-device", action="store_true",
        help="with --build-only: open the USRP for real (UHD discovery and set-up); "
        "without --build-only the device is always opened",
    )
    p.add_argument(
        "--air-address", default="",
        help="virtual devices only (--device-args type=virtual,serial=NAME): the virtual "
        "air's address, tcp://HOST:PORT (tx: where the air takes bursts; rx: where it "
        "streams); required with virtual device args",
    )
    return p


def virtual_problem(args: argparse.Namespace, *, receiver: bool) -> str:
    """Why ``--device-args`` / ``--air-address`` do not go together (empty: they do).

    Virtual device args need an air address of the form ``tcp://HOST:PORT``; a real device
    takes none; a virtual receiver's clock may not drift; only a virtual receiver injects
    gaps (``gaps=...``), each shorter than the stream between two.
    """
    virtual = is_virtual(args.device_args)
    if virtual and not args.air_address:
        return ("--air-address is required with virtual device args (--device-args "
                f"'{args.device_args}'): the virtual air's address, tcp://HOST:PORT")
    if args.air_address and not virtual:
        return (f"--air-address {args.air_address}: only for virtual devices (type=virtual in "
                f"--device-args), got --device-args '{args.device_args}'")
    if args.air_address and not _AIR_ADDRESS.match(args.air_address):
        return f"--air-address: got '{args.air_address}'; allowed: tcp://HOST:PORT"
    if virtual:
        try:
            vargs = VirtualArgs.parse(args.device_args)
        except ValueError as exc:
            return f"--device-args: {exc}"
        if receiver and vargs.drift_ppm != 0:
            return (f"--device-args: drift_ppm={vargs.drift_ppm:g} on a virtual receiver; "
                    "allowed: 0 (the air's sample timeline is the receiver's sample clock)")
        if problem := vargs.gap_problem(args.samp_rate, receiver=receiver):
            return f"--device-args: {problem}"
    return ""


def device_wanted(args: argparse.Namespace) -> bool:
    """Whether to construct the device block: always when running, on request when building
    (a virtual device is always built: opening it loads no UHD and sends nothing)."""
    return not args.build_only or bool(args.open_device) or is_virtual(args.device_args)


def device_failure(name: str, args: argparse.Namespace, exc: BaseException) -> int:
    """Report a USRP that could not be opened in one clear line; returns exit code 1."""
    text = " ".join(str(exc).split())
    if is_virtual(args.device_args):
        print(f"{name}: could not open the virtual device for device args "
              f"'{args.device_args}': {text}", file=sys.stderr, flush=True)
        return 1
    if "No devices found" in text or "LookupError" in text:
        what = f"no USRP found for device args '{args.device_args}'"
    else:
        what = f"could not open the USRP for device args '{args.device_args}'"
    print(f"{name}: {what} (UHD: {text})", file=sys.stderr, flush=True)
    return 1


def build_report(name: str, blocks: list[object], uhd_blocks: list[str],
                 virtual: str = "") -> str:
    """One line saying what was built: the blocks, and whether UHD was touched at all.

    ``gnuradio.uhd`` is imported only when a UHD block is constructed, so ``uhd imported:
    no`` is a check independent of the flowgraph's own bookkeeping. ``virtual``: the
    virtual device's description (``virtual device: serial NAME, air ADDRESS``), if one was
    built.
    """
    names = ", ".join(b.name() for b in blocks)  # type: ignore[attr-defined]
    if uhd_blocks:
        uhd = ", ".join(uhd_blocks)
    else:
        uhd = f"none ({virtual})" if virtual else "none (device not opened)"
    imported = "yes" if "gnuradio.uhd" in sys.modules else "no"
    return f"{name}: built; blocks: {names}; UHD blocks: {uhd}; uhd imported: {imported}"


def configure_usrp(dev: object, args: argparse.Namespace) -> None:
    """Apply clock and time source, rate, frequency, gain and antenna to a USRP block.

    Works for ``uhd.usrp_source`` and ``uhd.usrp_sink`` alike (channel 0).
    """
    dev.set_clock_source(args.clock_source, 0)  # type: ignore[attr-defined]
    if args.time_source != "none":
        dev.set_time_source(args.time_source, 0)  # type: ignore[attr-defined]
    dev.set_samp_rate(args.samp_rate)  # type: ignore[attr-defined]
    dev.set_center_freq(args.center_freq, 0)  # type: ignore[attr-defined]
    dev.set_gain(args.gain, 0)  # type: ignore[attr-defined]
    if args.antenna:
        dev.set_antenna(args.antenna, 0)  # type: ignore[attr-defined]


#: Time sources that can latch a PPS edge (mimo: the device follows its MIMO master's time).
PPS_TIME_SOURCES = ("external", "gpsdo")


def time_epoch_problem(args: argparse.Namespace) -> str:
    """Why ``--time-epoch`` cannot work with ``--time-source`` (empty: it can)."""
    if args.time_epoch == "host-pps" and args.time_source not in (*PPS_TIME_SOURCES, "mimo"):
        return (f"--time-epoch host-pps needs a shared PPS (--time-source external, gpsdo or "
                f"mimo), got --time-source {args.time_source}")
    return ""


def _last_pps(dev: object) -> float:
    """The device time (s) of the last PPS edge."""
    return float(dev.get_time_last_pps(0).get_real_secs())  # type: ignore[attr-defined]


def _wait_pps_edge(dev: object, previous: float, what: str, timeout_s: float,
                   sleep: Callable[[float], None]) -> float:
    """Wait until the last PPS edge's time differs from ``previous``; returns it.

    Raises
    ------
    RuntimeError
        No edge within ``timeout_s`` (names the PPS cable and the time source).
    """
    waited = 0.0
    while (now := _last_pps(dev)) == previous:
        if waited > timeout_s:
            raise RuntimeError(
                f"no PPS edge {what} within {timeout_s:g} s: check the PPS cable (OctoClock "
                "PPS out -> the N210's PPS in) and the time source"
            )
        sleep(0.002)
        waited += 0.002
    return now


def latch_host_time_at_pps(
    dev: object,
    time_spec: Callable[[float], object],
    *,
    timeout_s: float = 2.5,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Set the USRP's time at a PPS edge to the host's UNIX second of that edge.

    Waits for one PPS edge (so the host knows where in its second the edges fall), sets the
    next edge to ``round(host time just after this edge) + 1`` and waits until it has
    passed. Every USRP fed the same PPS whose host clock is within a few ms of the others'
    (NTP) then keeps the same time, unless the edges fall within those ms of a host
    half-second (the controlling process checks the agreement). Returns the time set (s).

    Raises
    ------
    RuntimeError
        No PPS edge within ``timeout_s`` (PPS cable, ``--time-source``).
    """

    def wait_edge(previous: float, what: str) -> float:
        return _wait_pps_edge(dev, previous, what, timeout_s, sleep)

    wait_edge(_last_pps(dev), "seen")
    epoch = float(round(clock()) + 1)
    dev.set_time_next_pps(time_spec(epoch))  # type: ignore[attr-defined]
    latched = wait_edge(_last_pps(dev), "after setting the time")
    if abs(latched - epoch) > 1e-6:
        raise RuntimeError(f"USRP time at the PPS edge is {latched}, not the {epoch} set")
    return epoch


def set_usrp_time(
    dev: object,
    args: argparse.Namespace,
    time_spec: Callable[[float], object],
    *,
    zero_at_pps: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Set the USRP's time per ``--time-epoch``; returns the epoch (USRP time set, s).

    ``zero``: time 0 now, or at the next PPS edge when ``zero_at_pps`` (the receiver with an
    external time source; returns once that edge has passed, so the time read next is the
    new one). ``host-pps``: :func:`latch_host_time_at_pps`; a MIMO slave
    follows its master's time and is left alone (its current time is returned).
    """
    if args.time_epoch == "host-pps":
        if args.time_source in PPS_TIME_SOURCES:
            # A virtual device says what its host's clock reads (host_clock_error_s).
            clock = getattr(dev, "host_time", None)
            return latch_host_time_at_pps(dev, time_spec,
                                          clock=clock if callable(clock) else time.time)
        return float(dev.get_time_now().get_real_secs())  # type: ignore[attr-defined]
    if zero_at_pps:
        # The time is 0 only once the edge has passed; read before, it is the old count
        # (a clock offset measured then is off by it), so wait for the edge.
        before = _last_pps(dev)
        dev.set_time_next_pps(time_spec(0.0))  # type: ignore[attr-defined]
        _wait_pps_edge(dev, before, "after setting the time", 2.5, sleep)
    else:
        dev.set_time_now(time_spec(0.0))  # type: ignore[attr-defined]
    return 0.0


def report_applied(dev: object, name: str) -> None:
    """Log the rate, frequency and gain the hardware actually applied (read back)."""
    print(
        f"{name}: rate {dev.get_samp_rate():.1f} S/s, "  # type: ignore[attr-defined]
        f"freq {dev.get_center_freq(0):.1f} Hz, "  # type: ignore[attr-defined]
        f"gain {dev.get_gain(0):.1f} dB",  # type: ignore[attr-defined]
        flush=True,
    )


#: UHD's async event codes and gr-uhd's names for them (``event_code`` symbols).
EVENT_CODES = {
    "burst_ack": 0x1, "underflow": 0x2, "seq_error": 0x4, "time_error": 0x8,
    "underflow_in_packet": 0x10, "seq_error_in_burst": 0x20, "user_payload": 0x40,
}
TIME_ERROR = EVENT_CODES["time_error"]


def _event_code(value: pmt.pmt_t) -> int:
    """An ``event_code`` as UHD's bit mask: gr-uhd's list of symbols, one symbol, or an
    integer."""
    if pmt.is_integer(value) or pmt.is_uint64(value):
        return int(pmt.to_python(value))
    if pmt.is_symbol(value):
        return EVENT_CODES.get(pmt.symbol_to_string(value), 0)
    code = 0
    while pmt.is_pair(value):
        code |= _event_code(pmt.car(value))
        value = pmt.cdr(value)
    return code


def split_time(value: pmt.pmt_t) -> tuple[int, float] | None:
    """A time value (``rx_time`` tag: tuple of uint64 whole seconds and double fraction; a
    ``time_spec`` pair) as (whole seconds, fraction); None if it is neither."""
    try:
        if pmt.is_tuple(value) and pmt.length(value) == 2:
            parts = pmt.tuple_ref(value, 0), pmt.tuple_ref(value, 1)
        elif pmt.is_pair(value):
            parts = pmt.car(value), pmt.cdr(value)
        else:
            return None
        whole, frac = float(pmt.to_python(parts[0])), float(pmt.to_python(parts[1]))
    except (TypeError, ValueError):
        return None
    f = (whole - math.floor(whole)) + frac  # a fraction outside [0, 1) is carried
    return int(math.floor(whole)) + math.floor(f), f - math.floor(f)


def _time_s(value: pmt.pmt_t) -> float | None:
    """A ``time_spec`` (pair or tuple of whole and fractional seconds) in s; None if none."""
    parts = split_time(value)
    return None if parts is None else parts[0] + parts[1]


def decode_async(msg: pmt.pmt_t) -> tuple[int, float | None]:
    """A usrp sink's async message as (UHD event code bits, device time (s) or None).

    gr-uhd publishes ``cons('uhd_async_msg', dict)`` with ``event_code`` (a list of
    symbols), ``time_spec`` (pair of long, double) and ``channel``; a bare dict, an integer
    code and a tuple time are taken too.
    """
    value = pmt.cdr(msg) if pmt.is_pair(msg) and not pmt.is_dict(msg) else msg
    if not pmt.is_dict(value):
        return 0, None
    code = _event_code(pmt.dict_ref(value, pmt.intern("event_code"), pmt.PMT_NIL))
    return code, _time_s(pmt.dict_ref(value, pmt.intern("time_spec"), pmt.PMT_NIL))


class async_events(gr.basic_block):  # noqa: N801 - GNU Radio block naming
    """Message sink for a usrp sink's ``async_msgs``: counts late bursts (``TIME_ERROR``),
    keeps the last ``keep`` events.

    Parameters
    ----------
    keep
        Events kept (the oldest are forgotten).
    """

    PORT = pmt.intern("async")

    def __init__(self, keep: int = 64) -> None:
        gr.basic_block.__init__(self, name="async_events", in_sig=None, out_sig=None)
        self.message_port_register_in(self.PORT)
        self.set_msg_handler(self.PORT, self.handle)
        self._lock = threading.Lock()
        self._events: collections.deque[tuple[int, float | None]] = collections.deque(
            maxlen=keep)
        #: TIME_ERROR events (bursts that arrived after their tx_time).
        self.late = 0
        #: Events received.
        self.total = 0

    def handle(self, msg: pmt.pmt_t) -> None:
        code, t = decode_async(msg)
        with self._lock:
            self.total += 1
            if code & TIME_ERROR:
                self.late += 1
            self._events.append((code, t))

    def events(self) -> list[list[object]]:
        """The last events, oldest first: ``[code, device time (s) or None]``."""
        with self._lock:
            return [[code, t] for code, t in self._events]


def subscribe_async(tb: gr.top_block, sink: object) -> async_events | None:
    """Connect ``sink``'s ``async_msgs`` port (gr-uhd's usrp sink, :class:`virtual_usrp.
    virtual_sink`) to a new :class:`async_events`; None when ``sink`` has no such port."""
    port = pmt.intern("async_msgs")
    try:
        ports = pmt.to_python(sink.message_ports_out())  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError, TypeError, ValueError):
        ports = []
    if "async_msgs" not in (ports or []):
        return None
    counter = async_events()
    tb.msg_connect((sink, port), (counter, async_events.PORT))
    return counter


def serve_xmlrpc(tb: object, port: int) -> SimpleXMLRPCServer | None:
    """Expose ``tb``'s methods (get/set pairs) on 127.0.0.1:``port``."""
    if not port:
        return None
    server = SimpleXMLRPCServer(("127.0.0.1", port), allow_none=True, logRequests=False)
    server.register_instance(tb)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


#: Seconds at most a flowgraph whose parent died keeps running to pass on what it took.
DRAIN_S = 5.0


def run_until_stopped(tb: gr.top_block, parent_pid: int, name: str,
                      drained: Callable[[], bool] | None = None) -> None:
    """Start ``tb``; stop on SIGINT/SIGTERM or when the parent process disappears.

    ``drained``: when the parent is gone, the flowgraph first runs until it returns true
    (polled every 50 ms, at most :data:`DRAIN_S`): what the parent handed over before it
    died is passed on (tx: a burst the USRP took goes out), not cut off mid-graph.
    """
    done = threading.Event()

    def stop(sig: int | None = None, frame: object = None) -> None:
        done.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    tb.start()
    print(f"{name}: running", flush=True)
    while not done.wait(0.5):
        if parent_pid and os.getppid() != parent_pid:
            print(f"{name}: parent process {parent_pid} is gone; stopping", flush=True)
            end = time.monotonic() + DRAIN_S
            while drained is not None and not drained() and time.monotonic() < end:
                time.sleep(0.05)
            break
    tb.stop()
    tb.wait()
