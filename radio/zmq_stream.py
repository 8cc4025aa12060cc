"""Sample exchange with a flowgraph over ZeroMQ PUSH/PULL, with exact sample accounting.

The controlling process binds a PUSH socket that the flowgraph's ``zeromq.pull_source``
connects to, and connects a PULL socket to the flowgraph's ``zeromq.push_sink``. PUSH/PULL
never drops (a full queue blocks the sender), unlike PUB/SUB. Samples are raw
``complex64`` (GNU Radio's ``gr_complex``), no tags.

Blocks with history (the channel model's resampler) hold back a few samples until more
input arrives, so each exchange is followed by ``flush`` zero samples that belong to no
upload: they push the upload's last samples out, and whatever of them comes back is
discarded at the start of the next exchange. Both sides are counted; an exchange returns
only when every sample of the upload is back, and raises otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import zmq

#: Samples per ZMQ message sent.
CHUNK = 16384


class StreamError(RuntimeError):
    """Samples went missing, arrived in excess, or the peer stopped answering."""


class StreamTimeout(StreamError):
    """An upload was not fully back in time.

    Attributes
    ----------
    expected
        Samples of the upload.
    received
        How many of them came back before the deadline.
    produced
        Samples of any kind (pre-roll, earlier flush, this upload) that arrived during the
        exchange: 0 means the peer produced nothing at all while it was waited for.
    """

    def __init__(self, message: str, *, expected: int, received: int, produced: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.received = received
        self.produced = produced


class StreamBroken(StreamError):
    """The stream's sample accounting no longer holds; later uploads cannot be aligned."""


class SampleStream:
    """A PUSH/PULL pair to one flowgraph, with running sample counters.

    Parameters
    ----------
    out_address
        The flowgraph's ``push_sink`` address (it binds; we connect).
    flush
        Zero samples sent after each upload to drain the flowgraph's history.
    """

    def __init__(self, out_address: str | None = None, flush: int = 512) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.push: zmq.Socket[bytes] = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        port = self.push.bind_to_random_port("tcp://127.0.0.1")
        self.in_address = f"tcp://127.0.0.1:{port}"
        self.pull: zmq.Socket[bytes] | None = None
        self.flush = flush
        self.sent_total = 0
        self.received_total = 0
        if out_address is not None:
            self.connect(out_address)

    def connect(self, out_address: str) -> None:
        """Connect the PULL side to the flowgraph's sink."""
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.pull.connect(out_address)

    def exchange(
        self,
        samples: np.ndarray,
        *,
        timeout_s: float,
        preroll: int = 0,
        alive: Callable[[], None] = lambda: None,
    ) -> np.ndarray:
        """Send ``samples`` and return the same number of samples from the flowgraph.

        Parameters
        ----------
        samples
            Complex baseband, shape ``(n,)``; sent as ``complex64``.
        timeout_s
            Give up (:class:`StreamError`) if the upload is not fully back by then.
        preroll
            Zero samples sent first whose output is discarded: GNU Radio source blocks
            inside the channel (noise, frequency offset) run ahead of the signal by up to
            a buffer, so after a parameter change the first samples still carry the old
            setting.
        alive
            Called every ~0.2 s; raises if the flowgraph process died.

        Returns
        -------
        numpy.ndarray
            ``complex64``, shape ``(n,)``: output sample ``i`` of this upload.
        """
        if self.pull is None:
            raise StreamBroken("stream is not connected to a flowgraph output")
        tx = np.concatenate(
            [
                np.zeros(preroll, np.complex64),
                np.asarray(samples, dtype=np.complex64),
                np.zeros(self.flush, np.complex64),
            ]
        )
        start = self.sent_total + preroll
        end = start + samples.size
        out = np.empty(samples.size, dtype=np.complex64)
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.push, zmq.POLLOUT)
        offset = 0
        received_before = self.received_total
        deadline = time.monotonic() + timeout_s
        next_check = 0.0
        while self.received_total < end:
            now = time.monotonic()
            if now > next_check:
                alive()
                next_check = now + 0.2
            if now > deadline:
                back = min(max(self.received_total - start, 0), samples.size)
                raise StreamTimeout(
                    f"samples missing: upload of {samples.size} samples, "
                    f"{back} came back within {timeout_s:.1f} s "
                    f"(sent in total {self.sent_total}, received {self.received_total})",
                    expected=int(samples.size),
                    received=int(back),
                    produced=int(self.received_total - received_before),
                )
            events = dict(poller.poll(50))
            if offset < tx.size and events.get(self.push, 0) & zmq.POLLOUT:
                chunk = tx[offset : offset + CHUNK]
                self.push.send(chunk.tobytes(), zmq.NOBLOCK, copy=True)
                offset += chunk.size
                self.sent_total += chunk.size
                if offset >= tx.size:
                    poller.unregister(self.push)
            if events.get(self.pull, 0) & zmq.POLLIN:
                self._take(self.pull.recv(copy=True), start, end, out)
        while offset < tx.size:
            chunk = tx[offset : offset + CHUNK]
            self.push.send(chunk.tobytes(), copy=True)
            offset += chunk.size
            self.sent_total += chunk.size
        return out

    def _take(self, msg: bytes, start: int, end: int, out: np.ndarray) -> None:
        if len(msg) % 8:
            raise StreamBroken(
                f"message of {len(msg)} bytes is not a whole number of samples"
            )
        data = np.frombuffer(msg, dtype=np.complex64)
        first = self.received_total
        self.received_total += data.size
        if self.received_total > self.sent_total:
            raise StreamBroken(
                f"received {self.received_total} samples but sent only {self.sent_total}"
            )
        lo, hi = max(first, start), min(self.received_total, end)
        if hi > lo:
            out[lo - start : hi - start] = data[lo - first : hi - first]

    def close(self) -> None:
        """Close both sockets. Idempotent."""
        self.push.close(0)
        if self.pull is not None:
            self.pull.close(0)
