#!/usr/bin/python3
"""GNU Radio channel emulator: ZMQ PULL in -> flat fading -> channel_model -> ZMQ PUSH out.

Runs headless under the system interpreter (``/usr/bin/python3``, Debian's GNU Radio 3.10)
as its own process; the testbed starts and stops it (``radio.flowgraph_process``).

Stream path::

    zeromq.pull_source --+--> channels.fading_model --> x fading_on ------+
                         |                                               +--> add -->
                         +------------------------------> x (1 - fading_on) +
    --> channels.channel_model (frequency_offset, epsilon; noise_voltage, noise_seed)
    --> [csprng_noise_adder (noise_voltage)] --> zeromq.push_sink

``noise_source``: ``fast`` adds ``channel_model``'s own noise (GNU Radio's fast noise
source: a table pre-drawn from ``noise_seed`` and replayed; reproducible, never credited as
privacy noise); ``csprng`` sets ``channel_model``'s noise to 0 and adds
:class:`csprng_noise.csprng_noise_adder` after it, every sample drawn fresh from the OS
CSPRNG (what a run that credits channel noise uses).

Every parameter has a get/set pair; the XML-RPC server exposes them (and the sample counters
``get_samples_in`` / ``get_samples_out``) to the controlling process, as GRC's XMLRPC Server
block does. The same graph as a GRC file: ``channel_emulator.grc`` (the ``fast`` noise path;
the ``csprng`` source is this directory's Python block).

``noise_voltage`` is the standard deviation of the complex noise per sample
(``E|n|^2 = noise_voltage**2``); ``frequency_offset`` is normalised to the sample rate.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from xmlrpc.server import SimpleXMLRPCServer

from csprng_noise import csprng_noise_adder
from gnuradio import blocks, channels, gr, zeromq

NOISE_SOURCES = ("fast", "csprng")


class channel_emulator(gr.top_block):  # noqa: N801 - GRC naming convention
    """The emulator flowgraph; constructor arguments mirror the GRC parameters."""

    def __init__(
        self,
        in_address: str = "tcp://127.0.0.1:5555",
        out_address: str = "tcp://127.0.0.1:5556",
        xmlrpc_port: int = 0,
        samp_rate: float = 1e6,
        noise_voltage: float = 0.0,
        frequency_offset: float = 0.0,
        epsilon: float = 1.0,
        noise_seed: int = 0,
        fading_on: int = 0,
        fdts: float = 0.0,
        los: int = 0,
        k_factor: float = 4.0,
        fading_seed: int = 0,
        hwm: int = -1,
        noise_source: str = "fast",
    ) -> None:
        gr.top_block.__init__(self, "channel_emulator", catch_exceptions=True)
        if noise_source not in NOISE_SOURCES:
            raise ValueError(f"noise_source: got {noise_source!r}; allowed: fast, csprng")
        self.noise_source = noise_source
        self.in_address = in_address
        self.out_address = out_address
        self.samp_rate = samp_rate
        self.noise_voltage = noise_voltage
        self.frequency_offset = frequency_offset
        self.epsilon = epsilon
        self.noise_seed = noise_seed
        self.fading_on = fading_on
        self.fdts = fdts
        self.los = los
        self.k_factor = k_factor
        self.fading_seed = fading_seed

        item = gr.sizeof_gr_complex
        self.source = zeromq.pull_source(item, 1, in_address, 100, False, hwm)
        self.fading = channels.fading_model(8, fdts, bool(los), k_factor, fading_seed)
        self.faded_weight = blocks.multiply_const_cc(float(fading_on))
        self.direct_weight = blocks.multiply_const_cc(1.0 - float(fading_on))
        self.adder = blocks.add_vcc(1)
        self.csprng = csprng_noise_adder(noise_voltage) if noise_source == "csprng" else None
        self.channel = channels.channel_model(
            noise_voltage=noise_voltage if self.csprng is None else 0.0,
            frequency_offset=frequency_offset,
            epsilon=epsilon,
            taps=[1.0 + 0.0j],
            noise_seed=noise_seed,
            block_tags=False,
        )
        self.sink = zeromq.push_sink(item, 1, out_address, 100, False, hwm)

        self.connect((self.source, 0), (self.fading, 0))
        self.connect((self.fading, 0), (self.faded_weight, 0))
        self.connect((self.source, 0), (self.direct_weight, 0))
        self.connect((self.faded_weight, 0), (self.adder, 0))
        self.connect((self.direct_weight, 0), (self.adder, 1))
        self.connect((self.adder, 0), (self.channel, 0))
        if self.csprng is None:
            self.connect((self.channel, 0), (self.sink, 0))
        else:
            self.connect((self.channel, 0), (self.csprng, 0))
            self.connect((self.csprng, 0), (self.sink, 0))

        self.xmlrpc_server = None
        if xmlrpc_port:
            self.xmlrpc_server = SimpleXMLRPCServer(
                ("127.0.0.1", xmlrpc_port), allow_none=True, logRequests=False
            )
            self.xmlrpc_server.register_instance(self)
            self.xmlrpc_thread = threading.Thread(
                target=self.xmlrpc_server.serve_forever, daemon=True
            )
            self.xmlrpc_thread.start()

    # -- get/set pairs -------------------------------------------------------------------
    def get_samp_rate(self) -> float:
        return self.samp_rate

    def set_samp_rate(self, samp_rate: float) -> None:
        self.samp_rate = samp_rate

    def get_noise_voltage(self) -> float:
        return self.noise_voltage

    def set_noise_voltage(self, noise_voltage: float) -> None:
        self.noise_voltage = float(noise_voltage)
        if self.csprng is None:
            self.channel.set_noise_voltage(self.noise_voltage)
        else:
            self.csprng.set_noise_voltage(self.noise_voltage)

    def get_frequency_offset(self) -> float:
        return self.frequency_offset

    def set_frequency_offset(self, frequency_offset: float) -> None:
        self.frequency_offset = float(frequency_offset)
        self.channel.set_frequency_offset(self.frequency_offset)

    def get_epsilon(self) -> float:
        return self.epsilon

    def set_epsilon(self, epsilon: float) -> None:
        self.epsilon = float(epsilon)
        self.channel.set_timing_offset(self.epsilon)

    def get_noise_seed(self) -> int:
        return self.noise_seed

    def get_fading_on(self) -> int:
        return self.fading_on

    def set_fading_on(self, fading_on: int) -> None:
        self.fading_on = int(fading_on)
        self.faded_weight.set_k(float(self.fading_on))
        self.direct_weight.set_k(1.0 - float(self.fading_on))

    def get_fdts(self) -> float:
        return self.fdts

    def set_fdts(self, fdts: float) -> None:
        self.fdts = float(fdts)
        self.fading.set_fDTs(self.fdts)

    def get_k_factor(self) -> float:
        return self.k_factor

    def set_k_factor(self, k_factor: float) -> None:
        self.k_factor = float(k_factor)
        self.fading.set_K(self.k_factor)

    def get_los(self) -> int:
        return self.los

    # -- counters (float: XML-RPC integers are 32-bit) -----------------------------------
    def get_samples_in(self) -> float:
        """Samples the ZMQ source has produced so far."""
        return float(self.source.nitems_written(0))

    def get_samples_out(self) -> float:
        """Samples the ZMQ sink has consumed so far."""
        return float(self.sink.nitems_read(0))

    def get_noise_source(self) -> str:
        """``fast`` or ``csprng`` (fixed when the flowgraph is built)."""
        return self.noise_source

    def ping(self) -> str:
        return "channel_emulator"


def argument_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--in-address", default="tcp://127.0.0.1:5555", help="ZMQ PUSH to pull from")
    p.add_argument("--out-address", default="tcp://127.0.0.1:5556", help="ZMQ PUSH bind address")
    p.add_argument("--xmlrpc-port", type=int, default=0, help="XML-RPC control port (0: none)")
    p.add_argument("--samp-rate", type=float, default=1e6, help="sample rate (Hz)")
    p.add_argument("--noise-voltage", type=float, default=0.0, help="complex noise std/sample")
    p.add_argument("--frequency-offset", type=float, default=0.0, help="CFO / sample rate")
    p.add_argument("--epsilon", type=float, default=1.0, help="sample timing ratio (1 = none)")
    p.add_argument("--noise-seed", type=int, default=0, help="AWGN seed")
    p.add_argument("--fading-on", type=int, default=0, choices=(0, 1), help="apply fading")
    p.add_argument("--fdts", type=float, default=0.0, help="max Doppler x sample period")
    p.add_argument("--los", type=int, default=0, choices=(0, 1), help="Rician (1) or Rayleigh")
    p.add_argument("--k-factor", type=float, default=4.0, help="Rician K (linear)")
    p.add_argument("--fading-seed", type=int, default=0, help="fading seed")
    p.add_argument("--hwm", type=int, default=-1, help="ZMQ high-water mark (-1: default)")
    p.add_argument("--noise-source", default="fast", choices=NOISE_SOURCES,
                   help="fast: channel_model's seeded table; csprng: fresh from the OS CSPRNG")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    p.add_argument("--build-only", action="store_true", help="construct, then exit 0")
    return p


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    tb = channel_emulator(
        in_address=args.in_address,
        out_address=args.out_address,
        xmlrpc_port=0 if args.build_only else args.xmlrpc_port,
        samp_rate=args.samp_rate,
        noise_voltage=args.noise_voltage,
        frequency_offset=args.frequency_offset,
        epsilon=args.epsilon,
        noise_seed=args.noise_seed,
        fading_on=args.fading_on,
        fdts=args.fdts,
        los=args.los,
        k_factor=args.k_factor,
        fading_seed=args.fading_seed,
        hwm=args.hwm,
        noise_source=args.noise_source,
    )
    if args.build_only:
        print("channel_emulator: built", flush=True)
        return 0
    done = threading.Event()

    def stop(sig: int | None = None, frame: object = None) -> None:
        done.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    tb.start()
    print("channel_emulator: running", flush=True)
    while not done.wait(0.5):
        if args.parent_pid and os.getppid() != args.parent_pid:
            break
    tb.stop()
    tb.wait()
    if tb.xmlrpc_server is not None:
        tb.xmlrpc_server.shutdown()
    time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
