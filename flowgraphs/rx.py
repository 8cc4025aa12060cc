#!/usr/bin/python3
"""USRP receiver: UHD source -> ZMQ PUSH, streaming continuously from a known start time.

The USRP's time is set to 0 at start-up (or at the next PPS with an external time source;
with ``--time-epoch host-pps`` to the host's UNIX second at a PPS edge) and streaming starts
``--start-time`` seconds after that epoch, at USRP time ``get_start_time()``, so received
sample ``i`` was taken at ``get_start_time() + i / samp_rate`` (as long as no overflow
occurred; the controlling process checks the sample count against elapsed time). With
``--build-only`` the graph is constructed with a null source in place of the UHD source
(UHD is not imported, no device discovery happens) and its blocks are printed;
``--build-only --open-device`` opens the USRP for real and fails (exit 1, one line naming
the device args) when none is found.

With virtual device args (``--device-args type=virtual,serial=NAME``, ``--air-address``
required) a :class:`virtual_usrp.virtual_source` stands in for the UHD source, also with
``--build-only``: it streams the virtual air's samples from the same start time, and UHD is
never imported. ``get_overflows`` (XML-RPC) counts the gaps in a virtual stream (-1 for a
UHD source: UHD reports its overflows as ``O`` in the log).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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
    time_epoch_problem,
    usrp_arguments,
    virtual_problem,
)


class rx(gr.top_block):  # noqa: N801 - GRC naming convention
    """USRP source (or a null source when ``open_device`` is false) -> ZMQ push sink.

    ``uhd_blocks`` names the UHD blocks constructed (empty without a device); ``virtual``
    describes the virtual device built in place of the UHD source (empty if none).
    """

    def __init__(self, args: argparse.Namespace, open_device: bool = True) -> None:
        gr.top_block.__init__(self, "rx", catch_exceptions=True)
        self.samp_rate = args.samp_rate
        self.center_freq = args.center_freq
        self.gain = args.gain
        self.start_time = args.start_time
        self.device_found = open_device
        self.uhd_blocks: list[str] = []
        self.virtual = ""
        if open_device:
            if is_virtual(args.device_args):
                from virtual_usrp import time_spec, virtual_source  # no UHD: the virtual air

                self.usrp = virtual_source(args.device_args, args.air_address)
                self.virtual = self.usrp.device_line()
            else:
                check_loopback_only(args.device_args)  # the test suite: no discovery off host
                from gnuradio import uhd  # only here: building without a device never loads UHD

                time_spec = uhd.time_spec
                self.usrp = uhd.usrp_source(
                    args.device_args,
                    uhd.stream_args(cpu_format="fc32", args="", channels=[0]),
                    True,
                )
                self.uhd_blocks.append("usrp_source")
            configure_usrp(self.usrp, args)
            epoch = set_usrp_time(
                self.usrp, args, time_spec,
                zero_at_pps=args.time_source in ("external", "gpsdo"),
            )
            # --start-time counts from the epoch set: absolute USRP time epoch + start_time.
            self.start_time = epoch + args.start_time
            self.usrp.set_start_time(time_spec(self.start_time))
            report_applied(self.usrp, "rx")
        else:
            self.usrp = blocks.null_source(gr.sizeof_gr_complex)
        self.sink = zeromq.push_sink(gr.sizeof_gr_complex, 1, args.out_address, 100, False, -1)
        self.connect((self.usrp, 0), (self.sink, 0))

    def block_list(self) -> list[object]:
        """The blocks of the graph, source to sink."""
        return [self.usrp, self.sink]

    def get_gain(self) -> float:
        """The gain applied (dB; as requested without a device)."""
        return float(self.usrp.get_gain(0)) if self.device_found else self.gain

    def set_gain(self, gain: float) -> None:
        self.gain = float(gain)
        if self.device_found:
            self.usrp.set_gain(self.gain, 0)

    def get_samp_rate(self) -> float:
        return float(self.usrp.get_samp_rate()) if self.device_found else self.samp_rate

    def get_start_time(self) -> float:
        """USRP time (s) of the first streamed sample."""
        return self.start_time

    def get_time_now(self) -> float:
        """USRP time (s)."""
        return float(self.usrp.get_time_now().get_real_secs()) if self.device_found else 0.0

    def get_samples_out(self) -> float:
        return float(self.sink.nitems_read(0))

    def get_overflows(self) -> int:
        """Gaps in the stream so far (samples lost): counted for a virtual source; -1 for a
        UHD source (UHD logs each as ``O``)."""
        return int(self.usrp.overflows) if self.virtual else -1

    def get_device_counters(self) -> dict[str, int]:
        """A virtual source's counters (overflows, lost_samples, queue_drops, bad_chunks);
        empty for a UHD source."""
        return dict(self.usrp.counters()) if self.virtual else {}

    def ping(self) -> str:
        return "rx"


def main(argv: list[str] | None = None) -> int:
    p = usrp_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--out-address", default="tcp://127.0.0.1:5561", help="ZMQ PUSH bind address")
    p.add_argument("--start-time", type=float, default=1.0,
                   help="start streaming this long (s) after the time epoch set")
    args = p.parse_args(argv)
    if problem := time_epoch_problem(args) or virtual_problem(args, receiver=True):
        p.error(problem)
    try:
        tb = rx(args, open_device=device_wanted(args))
    except (RuntimeError, ValueError) as exc:
        if isinstance(exc, ValueError) and not is_virtual(args.device_args):
            raise
        return device_failure("rx", args, exc)
    if args.build_only:
        print(build_report("rx", tb.block_list(), tb.uhd_blocks, tb.virtual), flush=True)
        return 0
    server = serve_xmlrpc(tb, args.xmlrpc_port)
    run_until_stopped(tb, args.parent_pid, "rx")
    if server is not None:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
