#!/usr/bin/env python3
"""Throughput of the numpy waveform emulator next to GNU Radio's channel blocks.

Measured in the same run, on the same number of complex samples (``--samples``; 4 M, with
``--full`` 16 M), the best of ``--repeats`` runs (emulator and GNU Radio alternate). Each
case gives two figures: mega-samples per second of wall clock (``<case>``) and per CPU
second (``<case>_cpu``, GNU Radio's CPU time summed over its threads). On a busy machine
the CPU figure is the steadier one: the scheduler shares the cores per thread, which
favours GNU Radio's many threads over the emulator's one in wall-clock time. Cases:

* ``emulator_awgn``: :func:`radio.waveform_channel.emulate` with a 2 kHz carrier offset
  (random phase) and white Gaussian noise, against ``channels.channel_model`` with noise, a
  frequency offset, ``epsilon = 1`` and one tap, in a headless GNU Radio flowgraph
  (``null_source -> head -> channel_model -> null_sink``) under /usr/bin/python3. The
  channel effects are the same. The work differs in two ways, both against the emulator:
  ``channel_model`` draws its noise from a table of 8192 pre-drawn Gaussian values
  (``fastnoise_source``), the emulator draws a fresh one per sample; ``channel_model``
  always runs its timing resampler and a 2-tap FIR, which are identities here, and the
  emulator skips the identities. GNU Radio runs one thread per block (both cores); the
  emulator runs in one thread here, and in two in the resampled cases below (while the
  first thread interpolates, a worker thread draws the noise, then rotates and adds the
  interpolated segments as they come; the same samples bit for bit).
* ``emulator_timing``: the same plus a random fractional delay (up to 512 samples, as the
  waveform link applies by default), against the same ``channel_model``: now both
  interpolate every sample, the emulator with the band-limited interpolator of
  :func:`radio.pulse.sample_at` (22 taps, linear between 8 phases), GNU Radio with its
  8-tap MMSE interpolator (at ``epsilon = 1`` it runs but changes nothing).
* ``emulator_sro``: the delay plus a 50 ppm sample-rate offset, against ``channel_model``
  with ``epsilon = 1 + 50e-6``. The emulator's interpolator then needs two filters per
  sample and restarts every 2,500 samples (a new phase of its 8-phase grid).
* ``emulator_fading``: the AWGN case plus Clarke/Jakes Rayleigh fading at 20 km/h (16
  sinusoids), against ``channels.fading_model`` (8 sinusoids) followed by
  ``channel_model``.

ratio = emulator / GNU Radio throughput (higher is better); aim (issue 13): >= 2 for every
case. Usage::

    .venv/bin/python benchmarks/bench_radio.py [--samples N] [--repeats 3] [--full] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np

from radio.flowgraph_process import SYSTEM_PYTHON
from radio.waveform_channel import EmulatorParams, emulate
from testbed.bench_figures import figure, format_table

GR_SCRIPT = r"""
import sys, time
from gnuradio import gr, blocks, channels
n, fading = int(sys.argv[1]), sys.argv[2] == "1"
fdts, epsilon = float(sys.argv[3]), float(sys.argv[4])
tb = gr.top_block()
src = blocks.null_source(gr.sizeof_gr_complex)
head = blocks.head(gr.sizeof_gr_complex, n)
chan = channels.channel_model(noise_voltage=0.1, frequency_offset=0.002, epsilon=epsilon,
                              taps=[1.0 + 0j], noise_seed=1, block_tags=False)
sink = blocks.null_sink(gr.sizeof_gr_complex)
if fading:
    fad = channels.fading_model(8, fdts, False, 4.0, 1)
    tb.connect(src, head, fad, chan, sink)
else:
    tb.connect(src, head, chan, sink)
t, c = time.perf_counter(), time.process_time()
tb.run()
print(time.perf_counter() - t, time.process_time() - c)
"""

#: Sample rate (Hz), speed (km/h), carrier (Hz), SRO (ppm) of the benchmark's channel.
FS, SPEED, CARRIER, SRO_PPM = 1e6, 20.0, 915e6, 50.0


def gnuradio_seconds(n: int, fading: bool, fdts: float, epsilon: float) -> tuple[float, float]:
    """Wall and CPU time (s, all threads) of one GNU Radio flowgraph run over ``n`` samples
    (start-up excluded)."""
    out = subprocess.run(
        [SYSTEM_PYTHON, "-c", GR_SCRIPT, str(n), "1" if fading else "0", repr(fdts),
         repr(epsilon)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"GNU Radio benchmark failed: {out.stderr.strip()[-500:]}")
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def emulator_seconds(
    x: np.ndarray, params: EmulatorParams, rng: np.random.Generator
) -> tuple[float, float]:
    """Wall and CPU time (s) of one :func:`emulate` call over ``x``."""
    t, c = time.perf_counter(), time.process_time()
    emulate(x, params, 0.01, FS, rng)
    return time.perf_counter() - t, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=None,
                   help="complex samples per run (default 4000000, with --full 16000000)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each side; the best is kept")
    p.add_argument("--full", action="store_true", help="the large size")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    n = args.samples or (16_000_000 if args.full else 4_000_000)
    if n < 10_000 or args.repeats < 1:
        p.error(f"need --samples >= 10000 and --repeats >= 1, got {n}, {args.repeats}")
    fdts = SPEED / 3.6 * CARRIER / 299_792_458.0 / FS
    awgn = EmulatorParams(cfo_hz=2000.0, delay_max_samples=0.0, tail_samples=0)
    cases = {
        # name: (emulator params, GNU Radio fading, GNU Radio epsilon, baseline name)
        "emulator_awgn": (awgn, False, 1.0, "GNU Radio channels.channel_model"),
        "emulator_timing": (
            replace(awgn, delay_max_samples=512.0), False, 1.0,
            "GNU Radio channels.channel_model",
        ),
        "emulator_sro": (
            replace(awgn, delay_max_samples=512.0, sro_ppm=SRO_PPM), False,
            1.0 + SRO_PPM * 1e-6, "GNU Radio channels.channel_model, epsilon 1 + 50e-6",
        ),
        "emulator_fading": (
            replace(awgn, fading="rayleigh", speed_kmh=SPEED, carrier_hz=CARRIER), True, 1.0,
            "GNU Radio channels.fading_model + channel_model",
        ),
    }
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)) / np.sqrt(2)
    figures, raw = [], {}
    for name, (params, gr_fading, epsilon, baseline_name) in cases.items():
        emu, gr = [np.inf, np.inf], [np.inf, np.inf]
        for _ in range(args.repeats):
            emu = np.minimum(emu, emulator_seconds(x, params, rng)).tolist()
            gr = np.minimum(gr, gnuradio_seconds(n, gr_fading, fdts, epsilon)).tolist()
        print(f"{name}: emulator {emu[0]:.3f} s ({emu[1]:.3f} s CPU), GNU Radio {gr[0]:.3f} s "
              f"({gr[1]:.3f} s CPU)", file=sys.stderr)
        raw[name] = {"emulator_s": emu[0], "gnuradio_s": gr[0], "emulator_cpu_s": emu[1],
                     "gnuradio_cpu_s": gr[1]}
        note = f"{n} samples, best of {args.repeats}"
        figures += [
            figure(name, n / emu[0] / 1e6, n / gr[0] / 1e6, "Msample/s", better="higher",
                   aim=2.0, baseline_name=baseline_name,
                   note=f"{note}, wall clock; emulator one thread (two with a fractional "
                        "delay: the noise and the carrier rotation beside the interpolation), "
                        "GNU Radio a thread per block"),
            figure(f"{name}_cpu", n / emu[1] / 1e6, n / gr[1] / 1e6, "Msample/CPU-s",
                   better="higher", aim=2.0, baseline_name=f"{baseline_name} (all threads)",
                   note=f"{note}, per CPU second (steadier on a shared machine)"),
        ]
    result = {"samples": n, "repeats": args.repeats, "seconds": raw,
              "figures": [f.to_json() for f in figures]}
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("radio", f, "ok") for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
