#!/usr/bin/python3
"""Channel noise from the OS CSPRNG, as a GNU Radio block that adds it to a stream.

GNU Radio's ``channels.channel_model`` draws its noise from ``analog.fastnoise_source``: a
table of pre-drawn samples, seeded by ``noise_seed`` and replayed. That is a fine channel for
a bit-error rate, but the noise repeats and anyone holding the seed regenerates it, so it
cannot count as privacy noise. This block draws every sample fresh from ``os.urandom``
through the testbed's own sampler (:func:`testbed.core.noise.gaussian`, the one the devices'
privacy noise comes from: 53-bit uniforms through Box-Muller, no seed accepted): circular
complex Gaussian noise, real and imaginary parts independent ``N(0, noise_voltage^2 / 2)``,
``E|n|^2 = noise_voltage^2``.

The noise is drawn in the same ``work`` call that adds it to the signal passing through (a
sync block with one input, like ``channel_model``), so a change of ``noise_voltage`` while the
flowgraph runs (:meth:`set_noise_voltage`) reaches the stream at once: only samples already
in the downstream buffers keep the old level. (A free-running noise *source* summed in would
run ahead of the signal by a whole buffer of noise drawn at the old level: a frame sent right
after the level went up would carry less noise than asked.)

Run as a program it writes ``--samples`` complex64 samples to ``--out`` through a flowgraph
(``null_source -> csprng_noise_adder -> head -> file_sink``), the noise alone; the tests check
those samples (``tests/test_flowgraph_noise.py``).
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import numpy as np

# The testbed's sampler, from the repository this flowgraph belongs to (it imports numpy
# and the standard library only).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gnuradio import gr  # noqa: E402

from testbed.core.noise import gaussian  # noqa: E402


def complex_gaussian(n: int, noise_voltage: float) -> np.ndarray:
    """``n`` complex samples of circular Gaussian noise, ``E|n|^2 = noise_voltage^2``,
    from the OS CSPRNG; ``complex64``, shape ``(n,)``."""
    z = gaussian((int(n), 2), float(noise_voltage) / np.sqrt(2.0))
    return (z[:, 0] + 1j * z[:, 1]).astype(np.complex64)


class csprng_noise_adder(gr.sync_block):  # noqa: N801 - GNU Radio naming convention
    """Adds complex Gaussian noise of standard deviation ``noise_voltage`` per complex
    sample to its input, every sample drawn from the OS CSPRNG (no seed)."""

    def __init__(self, noise_voltage: float = 0.0) -> None:
        gr.sync_block.__init__(self, name="csprng_noise_adder", in_sig=[np.complex64],
                               out_sig=[np.complex64])
        self._lock = threading.Lock()
        self._voltage = 0.0
        self.set_noise_voltage(noise_voltage)

    def noise_voltage(self) -> float:
        with self._lock:
            return self._voltage

    def set_noise_voltage(self, noise_voltage: float) -> None:
        v = float(noise_voltage)
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"noise_voltage: got {noise_voltage!r}; allowed: finite, >= 0")
        with self._lock:
            self._voltage = v

    def work(self, input_items: list[np.ndarray], output_items: list[np.ndarray]) -> int:
        signal, out = input_items[0], output_items[0]
        n = len(out)
        voltage = self.noise_voltage()
        if voltage == 0.0:
            out[:] = signal[:n]
        else:
            out[:] = signal[:n] + complex_gaussian(n, voltage)
        return n


def main(argv: list[str] | None = None) -> int:
    from gnuradio import blocks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, required=True, help="complex samples to write")
    p.add_argument("--noise-voltage", type=float, default=1.0, help="std per complex sample")
    p.add_argument("--out", type=Path, required=True, help="complex64 file to write")
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error(f"--samples: got {args.samples}; allowed: >= 1")
    tb = gr.top_block("csprng_noise")
    src = blocks.null_source(gr.sizeof_gr_complex)
    noise = csprng_noise_adder(args.noise_voltage)
    head = blocks.head(gr.sizeof_gr_complex, args.samples)
    sink = blocks.file_sink(gr.sizeof_gr_complex, str(args.out), False)
    tb.connect(src, noise, head, sink)
    tb.run()
    sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
