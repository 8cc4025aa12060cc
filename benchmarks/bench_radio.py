#!/usr/bin/env python3
"""Throughput of the numpy waveform emulator next to GNU Radio's channel blocks.

Measured in the same run, on the same number of complex samples:

* ``emulator_awgn``: :func:`radio.waveform_channel.emulate` with a carrier offset and
  white noise, against ``channels.channel_model`` (noise, frequency offset, epsilon = 1,
  one tap) in a headless GNU Radio flowgraph (``null_source -> head -> channel_model ->
  null_sink``) under /usr/bin/python3;
* ``emulator_fading``: the same plus Clarke/Jakes Rayleigh fading at 20 km/h, against
  ``channels.fading_model`` (8 sinusoids) followed by ``channel_model``.

Each figure is the best of ``--repeats`` runs, in mega-samples per second; the ratios are
emulator / GNU Radio. Usage::

    .venv/bin/python benchmarks/bench_radio.py [--samples 4000000] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from radio.flowgraph_process import SYSTEM_PYTHON
from radio.waveform_channel import EmulatorParams, emulate

GR_SCRIPT = r"""
import sys, time
from gnuradio import gr, blocks, channels
n, repeats = int(sys.argv[1]), int(sys.argv[2])
fading, fdts = sys.argv[3] == "1", float(sys.argv[4])
best = float("inf")
for _ in range(repeats):
    tb = gr.top_block()
    src = blocks.null_source(gr.sizeof_gr_complex)
    head = blocks.head(gr.sizeof_gr_complex, n)
    chan = channels.channel_model(noise_voltage=0.1, frequency_offset=0.002, epsilon=1.0,
                                  taps=[1.0 + 0j], noise_seed=1, block_tags=False)
    sink = blocks.null_sink(gr.sizeof_gr_complex)
    if fading:
        fad = channels.fading_model(8, fdts, False, 4.0, 1)
        tb.connect(src, head, fad, chan, sink)
    else:
        tb.connect(src, head, chan, sink)
    t = time.perf_counter()
    tb.run()
    best = min(best, time.perf_counter() - t)
print(best)
"""


def gnuradio_seconds(n: int, repeats: int, fading: bool, fdts: float) -> float:
    """Best wall time (s) of GNU Radio's channel over ``n`` samples."""
    out = subprocess.run(
        [SYSTEM_PYTHON, "-c", GR_SCRIPT, str(n), str(repeats), "1" if fading else "0", repr(fdts)],
        capture_output=True, text=True, timeout=1800, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"GNU Radio benchmark failed: {out.stderr.strip()[-500:]}")
    return float(out.stdout.strip().splitlines()[-1])


def emulator_seconds(n: int, repeats: int, params: EmulatorParams, fs: float) -> float:
    """Best wall time (s) of the numpy emulator over ``n`` samples."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)) / np.sqrt(2)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        emulate(x, params, 0.01, fs, rng)
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4_000_000, help="complex samples per run")
    p.add_argument("--repeats", type=int, default=3, help="runs; the best is kept")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.samples < 10_000 or args.repeats < 1:
        p.error(f"need --samples >= 10000 and --repeats >= 1, got {args.samples}, {args.repeats}")
    fs = 1e6
    speed, carrier = 20.0, 915e6
    fdts = speed / 3.6 * carrier / 299_792_458.0 / fs
    n, r = args.samples, args.repeats
    awgn = EmulatorParams(cfo_hz=2000.0, delay_max_samples=0, tail_samples=0)
    fading = EmulatorParams(
        fading="rayleigh", speed_kmh=speed, carrier_hz=carrier, cfo_hz=2000.0,
        delay_max_samples=0, tail_samples=0,
    )
    t_emu_awgn = emulator_seconds(n, r, awgn, fs)
    t_gr_awgn = gnuradio_seconds(n, r, False, fdts)
    t_emu_fad = emulator_seconds(n, r, fading, fs)
    t_gr_fad = gnuradio_seconds(n, r, True, fdts)
    msps = lambda t: n / t / 1e6  # noqa: E731
    result = {
        "samples": n,
        "repeats": r,
        "emulator_awgn_msps": msps(t_emu_awgn),
        "gnuradio_channel_model_msps": msps(t_gr_awgn),
        "ratio_awgn": t_gr_awgn / t_emu_awgn,
        "emulator_fading_msps": msps(t_emu_fad),
        "gnuradio_fading_model_msps": msps(t_gr_fad),
        "ratio_fading": t_gr_fad / t_emu_fad,
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for k, v in result.items():
            print(f"{k:32s} {v:.3f}" if isinstance(v, float) else f"{k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
