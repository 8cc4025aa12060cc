#!/usr/bin/python3
"""USRP receiver: UHD source -> ZMQ PUSH, streaming continuously from a known start time.

The USRP's time is set to 0 at start-up (or at the next PPS with an external time source;
with ``--time-epoch host-pps`` to the host's UNIX second at a PPS edge) and streaming starts
``--start-time`` seconds after that epoch, at USRP time ``get_start_time()``, so received
sample ``i`` was taken at ``get_start_time() + i / samp_rate`` until an overflow: every ``rx_time``
tag of the stream (gr-uhd's source tags the first sample and the first after each overflow)
is recorded by :class:`rx_time_anchors`, a sink beside the ZMQ sink, and served over
XML-RPC (``get_rx_anchors``), so the controlling process re-anchors its sample-to-time
mapping at each (:class:`radio.usrp_stream.SampleTimeline`). With
``--build-only`` the graph is constructed with a null source in place of the UHD source
(UHD is not imported, no device discovery happens) and its blocks are printed;
``--build-only --open-device`` opens the USRP for real and fails (exit 1, one line naming
the device args) when none is found.

With virtual device args (``--device-args type=virtual,serial=NAME``, ``--air-address``
required) a :class:`virtual_usrp.virtual_source` stands in for the UHD source, also with
``--build-only``: it streams the virtual air's samples from the same start time, and UHD is
never imported. ``get_overflows`` (XML-RPC) counts the gaps: a virtual source's count, or
the discontinuities between a UHD source's ``rx_time`` tags (UHD also logs each as ``O``).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import pmt  # noqa: E402
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
    split_time,
    time_epoch_problem,
    usrp_arguments,
    virtual_problem,
)

_RX_TIME = pmt.intern("rx_time")


class rx_time_anchors(gr.sync_block):  # noqa: N801 - GNU Radio block naming
    """Records every ``rx_time`` tag of the stream: (absolute item index, USRP time).

    A sink beside the ZMQ sink on the source's output (no copy of the samples; one look at
    the tags per ``work`` call). Keeps the last ``keep`` tags, each numbered from 0 in
    stream order, and how far the stream has been seen (:meth:`anchors`).

    Parameters
    ----------
    samp_rate
        The stream's rate (S/s): a tag whose time does not continue the previous tag's
        (within half a sample) is a gap, counted in :attr:`gaps`.
    keep
        Tags kept (the oldest are forgotten).
    """

    def __init__(self, samp_rate: float, keep: int = 4096) -> None:
        gr.sync_block.__init__(self, name="rx_time_anchors", in_sig=[np.complex64],
                               out_sig=None)
        self.samp_rate = float(samp_rate)
        self._lock = threading.Lock()
        self._tags: collections.deque[tuple[int, int, int, float]] = collections.deque(
            maxlen=keep)
        self._count = 0  # tags seen
        self._through = 0  # items seen
        #: Tags whose time does not continue the previous tag's: gaps (overflows).
        self.gaps = 0

    def work(self, input_items: list[np.ndarray], output_items: list[np.ndarray]) -> int:
        n = len(input_items[0])
        tags = self.get_tags_in_window(0, 0, n, _RX_TIME)
        with self._lock:
            for tag in sorted(tags, key=lambda t: t.offset):
                parts = split_time(tag.value)
                if parts is None:
                    continue
                index, (secs, frac) = int(tag.offset), parts
                if self._tags:
                    _, i0, s0, f0 = self._tags[-1]
                    drift = (secs - s0) + (frac - f0) - (index - i0) / self.samp_rate
                    if abs(drift) * self.samp_rate > 0.5:
                        self.gaps += 1
                self._tags.append((self._count, index, secs, frac))
                self._count += 1
            self._through = self.nitems_read(0) + n
        return n

    def anchors(self, since: int = 0) -> list[object]:
        """``[through, next, oldest, tags]``: items seen so far (every tag on them is
        recorded), the number the next tag will get, the oldest kept, and the tags numbered
        ``since`` or later as ``[number, item index, whole seconds, fraction]`` (index and
        seconds as floats: XML-RPC integers stop at 2^31)."""
        with self._lock:
            oldest = self._tags[0][0] if self._tags else self._count
            tags = [[q, float(i), float(sec), frac] for q, i, sec, frac in self._tags
                    if q >= since]
            return [float(self._through), self._count, oldest, tags]


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

                make_time: Callable[[float], object] = time_spec
                self.usrp = virtual_source(args.device_args, args.air_address)
                self.virtual = self.usrp.device_line()
            else:
                check_loopback_only(args.device_args)  # the test suite: no discovery off host
                from gnuradio import uhd  # only here: building without a device never loads UHD

                make_time = uhd.time_spec
                self.usrp = uhd.usrp_source(
                    args.device_args,
                    uhd.stream_args(cpu_format="fc32", args="", channels=[0]),
                    True,
                )
                self.uhd_blocks.append("usrp_source")
            configure_usrp(self.usrp, args)
            epoch = set_usrp_time(
                self.usrp, args, make_time,
                zero_at_pps=args.time_source in ("external", "gpsdo"),
            )
            # --start-time counts from the epoch set: absolute USRP time epoch + start_time.
            self.start_time = epoch + args.start_time
            self.usrp.set_start_time(make_time(self.start_time))
            report_applied(self.usrp, "rx")
        else:
            self.usrp = blocks.null_source(gr.sizeof_gr_complex)
        self.sink = zeromq.push_sink(gr.sizeof_gr_complex, 1, args.out_address, 100, False, -1)
        self.connect((self.usrp, 0), (self.sink, 0))
        self.anchor_sink = rx_time_anchors(args.samp_rate)
        self.connect((self.usrp, 0), (self.anchor_sink, 0))

    def block_list(self) -> list[object]:
        """The blocks of the graph, source to sinks."""
        return [self.usrp, self.sink, self.anchor_sink]

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
        """Gaps in the stream so far (samples lost): a virtual source's count; for a UHD
        source the ``rx_time`` tags that do not continue the previous one's time (UHD also
        logs each as ``O``)."""
        return int(self.usrp.overflows) if self.virtual else int(self.anchor_sink.gaps)

    def get_rx_anchors(self, since: int = 0) -> list[object]:
        """The stream's ``rx_time`` tags numbered ``since`` or later, and how far the
        stream has been seen: :meth:`rx_time_anchors.anchors`."""
        return self.anchor_sink.anchors(int(since))

    def get_device_counters(self) -> dict[str, int]:
        """A virtual source's counters (overflows, lost_samples, injected_gaps,
        queue_drops, bad_chunks); empty for a UHD source."""
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
