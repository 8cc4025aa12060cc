#!/usr/bin/python3
"""USRP transmitter: ZMQ PULL (header-delimited bursts) -> burst tagger -> UHD sink.

Each burst leaves the USRP at its ``tx_time`` (``tx_sob``/``tx_eob``/``tx_time`` tags from
:mod:`burst_tagger`), in USRP time: 0 at start-up, or with ``--time-epoch host-pps`` the
host's UNIX second latched at a PPS edge (shared by every USRP on the same PPS). The
applied rate, frequency and gain are read back and logged. With ``--build-only`` the graph
is constructed with a null sink in place of the UHD sink (UHD is not imported, no device
discovery happens) and its blocks are printed; ``--build-only --open-device`` opens the
USRP for real and fails (exit 1, one line naming the device args) when none is found.

With virtual device args (``--device-args type=virtual,serial=NAME``, ``--air-address``
required) a :class:`virtual_usrp.virtual_sink` stands in for the UHD sink, also with
``--build-only``: it pushes each burst to the virtual air instead of radiating it, and UHD is
never imported. The sink's async events (gr-uhd's ``async_msgs``, real or virtual) are
counted: ``get_late_bursts`` (``TIME_ERROR``: bursts that arrived after their ``tx_time``)
and ``get_async_events`` (the last 64, ``[code, device time]``) over XML-RPC.

When its parent process dies (``--parent-pid``) the flowgraph first passes on what it had
taken (a burst handed over just before still goes out; at most ``DRAIN_S``), then stops.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from burst_tagger import burst_tagger  # noqa: E402
from gnuradio import blocks, gr, zeromq  # noqa: E402
from usrp_common import (  # noqa: E402
    build_report,
    check_loopback_only,
    configure_usrp,
    device_failure,
    device_wanted,
    is_virtual,
    report_applied,
    run_until_stopped,
    serve_xmlrpc,
    set_usrp_time,
    subscribe_async,
    time_epoch_problem,
    usrp_arguments,
    virtual_problem,
)


class tx(gr.top_block):  # noqa: N801 - GRC naming convention
    """ZMQ -> burst tagger -> USRP sink (or a null sink when ``open_device`` is false).

    ``uhd_blocks`` names the UHD blocks constructed (empty without a device); ``virtual``
    describes the virtual device built in place of the UHD sink (empty if none). ``events``
    counts the sink's async events (None for the null sink, which has none).
    """

    def __init__(self, args: argparse.Namespace, open_device: bool = True) -> None:
        gr.top_block.__init__(self, "tx", catch_exceptions=True)
        self.samp_rate = args.samp_rate
        self.center_freq = args.center_freq
        self.gain = args.gain
        self.device_found = open_device
        self.uhd_blocks: list[str] = []
        self.virtual = ""
        self.events = None
        self.source = zeromq.pull_source(gr.sizeof_gr_complex, 1, args.in_address, 100, False, -1)
        self.tagger = burst_tagger()
        if open_device and is_virtual(args.device_args):
            from virtual_usrp import time_spec, virtual_sink  # no UHD: the virtual air

            self.sink = virtual_sink(args.device_args, args.air_address)
            self.virtual = self.sink.device_line()
            configure_usrp(self.sink, args)
            set_usrp_time(self.sink, args, time_spec, zero_at_pps=False)
            report_applied(self.sink, "tx")
        elif open_device:
            check_loopback_only(args.device_args)  # the test suite: discovery stays on the host
            from gnuradio import uhd  # only here: building without a device never loads UHD

            self.sink = uhd.usrp_sink(
                args.device_args,
                uhd.stream_args(cpu_format="fc32", args="", channels=[0]),
                "",
            )
            self.uhd_blocks.append("usrp_sink")
            configure_usrp(self.sink, args)
            set_usrp_time(self.sink, args, uhd.time_spec, zero_at_pps=False)
            report_applied(self.sink, "tx")
        else:
            self.sink = blocks.null_sink(gr.sizeof_gr_complex)
        self.connect((self.source, 0), (self.tagger, 0))
        self.connect((self.tagger, 0), (self.sink, 0))
        if open_device:
            self.events = subscribe_async(self, self.sink)
            if self.events is None:
                print("tx: the sink has no async_msgs port: late bursts are not counted",
                      file=sys.stderr, flush=True)

    def block_list(self) -> list[object]:
        """The blocks of the graph, source to sink (then the async event counter)."""
        extra = [] if self.events is None else [self.events]
        return [self.source, self.tagger, self.sink, *extra]

    def get_gain(self) -> float:
        """The gain applied (dB; as requested without a device)."""
        return float(self.sink.get_gain(0)) if self.device_found else self.gain

    def set_gain(self, gain: float) -> None:
        self.gain = float(gain)
        if self.device_found:
            self.sink.set_gain(self.gain, 0)

    def get_center_freq(self) -> float:
        return self.center_freq

    def set_center_freq(self, freq: float) -> None:
        self.center_freq = float(freq)
        if self.device_found:
            self.sink.set_center_freq(self.center_freq, 0)

    def get_samp_rate(self) -> float:
        return float(self.sink.get_samp_rate()) if self.device_found else self.samp_rate

    def get_time_now(self) -> float:
        """USRP time (s)."""
        return float(self.sink.get_time_now().get_real_secs()) if self.device_found else 0.0

    def get_bursts(self) -> int:
        return int(self.tagger.bursts)

    def get_late_bursts(self) -> int:
        """Bursts the device reported late (``TIME_ERROR``: arrived after their tx_time)."""
        return 0 if self.events is None else int(self.events.late)

    def get_async_events(self) -> list[list[object]]:
        """The sink's last async events, oldest first: ``[UHD event code, device time (s)
        or None]`` (0x1 burst ack, 0x2 underflow, 0x8 time error, ...)."""
        return [] if self.events is None else self.events.events()

    def get_device_counters(self) -> dict[str, int]:
        """A virtual sink's counters (bursts_sent, late_bursts, clipped_bursts, dropped,
        discarded); empty for a UHD sink."""
        return dict(self.sink.counters()) if self.virtual else {}

    def get_samples_in(self) -> float:
        return float(self.source.nitems_written(0))

    def drained(self) -> bool:
        """Whether every item taken in has passed the tagger into the sink (no burst half
        way) and the sink has sent every burst on (a virtual sink: written to the air's
        socket). The sender waits until the flowgraph took each burst (``get_samples_in``),
        so once it is gone nothing more comes in."""
        taken = int(self.source.nitems_written(0))
        flushed = getattr(self.sink, "flushed", None)
        return (int(self.tagger.nitems_read(0)) == taken and self.tagger.remaining == 0
                and int(self.sink.nitems_read(0)) == int(self.tagger.nitems_written(0))
                and (flushed is None or bool(flushed())))

    def ping(self) -> str:
        return "tx"


def main(argv: list[str] | None = None) -> int:
    p = usrp_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--in-address", default="tcp://127.0.0.1:5560", help="ZMQ PUSH to pull from")
    args = p.parse_args(argv)
    if problem := time_epoch_problem(args) or virtual_problem(args, receiver=False):
        p.error(problem)
    try:
        tb = tx(args, open_device=device_wanted(args))
    except (RuntimeError, ValueError) as exc:
        if isinstance(exc, ValueError) and not is_virtual(args.device_args):
            raise
        return device_failure("tx", args, exc)
    if args.build_only:
        print(build_report("tx", tb.block_list(), tb.uhd_blocks, tb.virtual), flush=True)
        return 0
    server = serve_xmlrpc(tb, args.xmlrpc_port)
    # A parent that dies right after handing a burst over: the burst still goes out.
    run_until_stopped(tb, args.parent_pid, "tx", drained=tb.drained)
    if server is not None:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
