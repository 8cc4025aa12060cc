"""Shared parts of the tx and rx flowgraphs: argument parsing, the XML-RPC server, the
parent watchdog and the signal handling (imported only under /usr/bin/python3)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from xmlrpc.server import SimpleXMLRPCServer

from gnuradio import gr


def usrp_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the USRP parameters common to tx and rx."""
    p.add_argument("--device-args", default="", help="UHD device args, e.g. addr=192.168.10.2")
    p.add_argument("--samp-rate", type=float, default=1e6, help="sample rate (Hz)")
    p.add_argument("--center-freq", type=float, default=915e6, help="centre frequency (Hz)")
    p.add_argument("--gain", type=float, default=10.0, help="gain (dB)")
    p.add_argument("--antenna", default="", help="antenna port")
    p.add_argument("--clock-source", default="internal", help="internal|external|mimo|gpsdo")
    p.add_argument("--time-source", default="internal", help="internal|external|mimo|gpsdo|none")
    p.add_argument("--xmlrpc-port", type=int, default=0, help="XML-RPC control port (0: none)")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    p.add_argument("--build-only", action="store_true", help="construct, then exit 0")
    return p


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


def report_applied(dev: object, name: str) -> None:
    """Log the rate, frequency and gain the hardware actually applied (read back)."""
    print(
        f"{name}: rate {dev.get_samp_rate():.1f} S/s, "  # type: ignore[attr-defined]
        f"freq {dev.get_center_freq(0):.1f} Hz, "  # type: ignore[attr-defined]
        f"gain {dev.get_gain(0):.1f} dB",  # type: ignore[attr-defined]
        flush=True,
    )


def serve_xmlrpc(tb: object, port: int) -> SimpleXMLRPCServer | None:
    """Expose ``tb``'s methods (get/set pairs) on 127.0.0.1:``port``."""
    if not port:
        return None
    server = SimpleXMLRPCServer(("127.0.0.1", port), allow_none=True, logRequests=False)
    server.register_instance(tb)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_until_stopped(tb: gr.top_block, parent_pid: int, name: str) -> None:
    """Start ``tb``; stop on SIGINT/SIGTERM or when the parent process disappears."""
    done = threading.Event()

    def stop(sig: int | None = None, frame: object = None) -> None:
        done.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    tb.start()
    print(f"{name}: running", flush=True)
    while not done.wait(0.5):
        if parent_pid and os.getppid() != parent_pid:
            break
    tb.stop()
    tb.wait()
