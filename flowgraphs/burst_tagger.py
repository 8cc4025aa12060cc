"""Burst framing for the USRP transmitter: a header-delimited stream to timed UHD bursts.

The controlling process sends, over ZMQ, records of ``HEADER_ITEMS`` complex64 header
items followed by ``n`` samples. :class:`burst_tagger` strips the headers and tags the
first sample of each burst with ``tx_sob`` and ``tx_time`` and the last with ``tx_eob``,
which ``uhd.usrp_sink`` turns into a timed burst. Header items (float32 pairs, exact for
integers below 2**24)::

    0: MAGIC
    1: (n // 2**20, n % 2**20)                 burst length in samples
    2: (secs // 2**20, secs % 2**20)           tx_time, whole seconds
    3: (fractional seconds, 0)

The venv side writes the same layout with numpy (``radio.usrp_link.burst_header``); this
file is imported only by flowgraphs under /usr/bin/python3.
"""

from __future__ import annotations

import numpy as np
import pmt
from gnuradio import gr

MAGIC = complex(1234.5, -5432.25)
HEADER_ITEMS = 4
_SPLIT = float(1 << 20)


class burst_tagger(gr.basic_block):  # noqa: N801 - GNU Radio block naming
    """Header-delimited complex stream in, tagged bursts out."""

    def __init__(self) -> None:
        gr.basic_block.__init__(
            self, name="burst_tagger", in_sig=[np.complex64], out_sig=[np.complex64]
        )
        self.set_tag_propagation_policy(gr.TPP_DONT)
        self.remaining = 0
        self.pending_start: tuple[int, float] | None = None
        self.bursts = 0
        self.bad_headers = 0

    def forecast(self, noutput_items: int, ninputs: int) -> list[int]:  # noqa: D102
        need = HEADER_ITEMS if self.remaining == 0 else 1
        return [need] * ninputs

    def general_work(self, input_items, output_items):  # type: ignore[no-untyped-def]  # noqa: D102
        inp, out = input_items[0], output_items[0]
        if self.remaining == 0:
            if len(inp) < HEADER_ITEMS:
                return 0
            if inp[0] != np.complex64(MAGIC):
                self.bad_headers += 1
                self.consume(0, 1)
                return 0
            n = int(inp[1].real) * (1 << 20) + int(inp[1].imag)
            secs = int(inp[2].real) * (1 << 20) + int(inp[2].imag)
            frac = float(inp[3].real)
            self.consume(0, HEADER_ITEMS)
            if n <= 0:
                return 0
            self.remaining = n
            self.pending_start = (secs, frac)
            return 0
        k = min(len(inp), len(out), self.remaining)
        if k == 0:
            return 0
        out[:k] = inp[:k]
        base = self.nitems_written(0)
        if self.pending_start is not None:
            secs, frac = self.pending_start
            self.add_item_tag(0, base, pmt.intern("tx_sob"), pmt.PMT_T)
            self.add_item_tag(
                0, base, pmt.intern("tx_time"),
                pmt.make_tuple(pmt.from_uint64(secs), pmt.from_double(frac)),
            )
            self.pending_start = None
        self.remaining -= k
        if self.remaining == 0:
            self.add_item_tag(0, base + k - 1, pmt.intern("tx_eob"), pmt.PMT_T)
            self.bursts += 1
        self.consume(0, k)
        return k
