"""The USRP flowgraph processes as streams: timed bursts out, a time-indexed capture in.

:class:`TxStream` runs ``flowgraphs/tx.py`` and pushes header-delimited bursts to it over
ZeroMQ; each leaves the USRP at its ``tx_time`` (USRP time). :class:`RxStream` runs
``flowgraphs/rx.py``, which streams continuously from a known USRP time; a reader thread
keeps the last seconds in a ring buffer indexed by sample count (:class:`RxRing`), and
the stream's ``rx_time`` tags map sample count to USRP time (:class:`SampleTimeline`,
re-anchored after every overflow), so a window can be cut at any USRP time still held; one
that overlaps a gap in the stream is :class:`~radio.link.ReceiverGap`. The ``usrp`` link
(:mod:`radio.usrp_link`, both ends in one process) and the lab split
(:mod:`radio.edge_radio`, a transmitter per edge and the aggregator's receiver) use them.

Start-up failures are :class:`~radio.flowgraph_process.FlowgraphError`; the callers say
which link or device they concern.

One job at over 600 lines: the flowgraph processes as streams of samples with USRP times.
The transmit stream, the receive ring and the sample-to-time map share the burst format and
the anchor arithmetic that places a window; split, each half would reach into the other.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from radio.flowgraph_process import (
    FLOWGRAPH_DIR,
    SYSTEM_PYTHON,
    FlowgraphError,
    FlowgraphProcess,
    free_tcp_port,
)
from radio.link import LinkError, LinkFailed, ReceiverGap

#: Header layout shared with ``flowgraphs/burst_tagger.py``.
BURST_MAGIC = complex(1234.5, -5432.25)
_SPLIT = 1 << 20


def burst_header(n_samples: int, tx_time_s: float) -> np.ndarray:
    """The 4-item header announcing a burst of ``n_samples`` at USRP time ``tx_time_s``."""
    if not 0 < n_samples < _SPLIT * _SPLIT or tx_time_s < 0:
        raise ValueError(f"bad burst: n={n_samples}, tx_time={tx_time_s}")
    secs = int(np.floor(tx_time_s))
    frac = tx_time_s - secs
    return np.array(
        [
            BURST_MAGIC,
            complex(n_samples // _SPLIT, n_samples % _SPLIT),
            complex(secs // _SPLIT, secs % _SPLIT),
            complex(frac, 0.0),
        ],
        dtype=np.complex64,
    )


def scale_for_dac(samples: np.ndarray, amplitude: float, what: str) -> np.ndarray:
    """``samples * amplitude``, refused when a peak exceeds the DAC's full scale.

    Raises
    ------
    LinkError
        Peak above 1.0; ``what`` (``"usrp link: upload of device 2, round 5"``) opens the
        message. Nothing is sent.
    """
    scaled = np.asarray(samples) * amplitude
    peak = float(np.max(np.abs(scaled))) if scaled.size else 0.0
    if peak > 1.0:
        raise LinkError(
            f"{what} not sent: peak amplitude {peak:.2f} exceeds the DAC range (1.0); lower "
            "usrp.tx_amplitude or the power scaling"
        )
    return scaled


def _reply_int(value: object) -> int:
    """An integer of an XML-RPC reply (a string where it passes 32 bits)."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"not an integer: {value!r}")
    return int(value)


def flowgraph_args(
    sample_rate_hz: float, center_freq_hz: float, clock_source: str, time_source: str,
    time_epoch: str = "zero", air_address: str = "",
) -> list[str]:
    """Command-line arguments common to ``tx.py`` and ``rx.py``."""
    args = [
        "--samp-rate", repr(sample_rate_hz), "--center-freq", repr(center_freq_hz),
        "--clock-source", clock_source, "--time-source", time_source,
    ]
    args += ["--time-epoch", time_epoch] if time_epoch != "zero" else []
    return args + (["--air-address", air_address] if air_address else [])


@dataclass(frozen=True, slots=True)
class Anchor:
    """One ``rx_time`` tag: stream sample ``index`` (absolute count) was taken at USRP time
    ``secs + frac`` (s; whole seconds and fraction kept apart, as UHD does, so that times
    near 1.7e9 s keep sub-sample resolution)."""

    index: int
    secs: int
    frac: float

    @property
    def time_s(self) -> float:
        """The USRP time (s)."""
        return self.secs + self.frac

    def offset_s(self, t_usrp_s: float) -> float:
        """``t_usrp_s`` minus this anchor's time (s), without losing the fraction."""
        return (t_usrp_s - self.secs) - self.frac


def anchor_at(index: int, t_usrp_s: float) -> Anchor:
    """An :class:`Anchor` of sample ``index`` at USRP time ``t_usrp_s`` (s)."""
    secs = math.floor(t_usrp_s)
    return Anchor(int(index), int(secs), float(t_usrp_s - secs))


class SampleTimeline:
    """Stream sample index <-> USRP time, re-anchored at every ``rx_time`` tag.

    Sample ``i`` of a segment that starts at anchor ``a`` (and ends where the next anchor
    starts) was taken at USRP time ``a.time_s + (i - a.index) / fs``. An anchor whose time
    continues its predecessor's segment (within half a sample: gr-uhd retags after a retune)
    starts no new segment; any other is a gap (samples lost: an overflow) or a jump of the
    clock. A window is read through the one segment that holds all of it; one that overlaps
    a gap raises :class:`~radio.link.ReceiverGap`.

    Parameters
    ----------
    sample_rate_hz
        Samples per second of the stream.
    max_anchors
        Anchors kept at most (the oldest are forgotten: their samples are no longer held).
    """

    def __init__(self, sample_rate_hz: float, max_anchors: int = 4096) -> None:
        self.fs = float(sample_rate_hz)
        self.max_anchors = int(max_anchors)
        #: The segments' anchors, oldest first (indices increasing).
        self.anchors: list[Anchor] = []
        #: Samples ``0 .. known_through`` are covered by the anchors known: no tag on them
        #: is missing from :attr:`anchors`.
        self.known_through = 0
        #: Samples before this index cannot be mapped (their anchors were forgotten).
        self.horizon = 0
        #: Discontinuities seen (gaps and jumps).
        self.gaps = 0
        self._next_index = 0  # anchors before this index were seen already

    def add(self, anchor: Anchor) -> None:
        """Take one ``rx_time`` tag (anchors come in stream order; a repeat is ignored)."""
        if anchor.index < self._next_index:
            return
        self._next_index = anchor.index + 1
        if self.anchors:
            last = self.anchors[-1]
            expected = (anchor.index - last.index) / self.fs
            delta = (anchor.secs - last.secs) + (anchor.frac - last.frac)
            if abs(delta - expected) <= 0.5 / self.fs:
                return  # continues the segment: no gap
            self.gaps += 1
        self.anchors.append(anchor)
        if len(self.anchors) > self.max_anchors:
            self.forget_before(self.anchors[-self.max_anchors].index)

    def covered(self, through: int) -> None:
        """The anchors known are complete up to sample ``through`` (exclusive)."""
        self.known_through = max(self.known_through, int(through))

    def forget_before(self, index: int) -> None:
        """Drop the segments that end at or before sample ``index`` (no longer held); the
        segment holding ``index`` stays."""
        keep = 0
        while keep + 1 < len(self.anchors) and self.anchors[keep + 1].index <= index:
            keep += 1
        if keep:
            self.horizon = max(self.horizon, self.anchors[keep].index)
            del self.anchors[:keep]

    def lose_before(self, index: int) -> None:
        """Anchors before sample ``index`` were lost (not delivered): no window before it is
        mapped."""
        self.horizon = max(self.horizon, int(index))
        self.anchors = [a for a in self.anchors if a.index >= index]

    def segment_end(self, i: int) -> int | None:
        """End index (exclusive) of segment ``i``; None for the last (still open)."""
        return self.anchors[i + 1].index if i + 1 < len(self.anchors) else None

    def _gap(self, i: int, t0: float, n: int, how: str) -> ReceiverGap:
        """The gap after segment ``i`` as a :class:`ReceiverGap` for window ``t0``, ``n``."""
        a, b = self.anchors[i], self.anchors[i + 1]
        start = a.time_s + (b.index - a.index) / self.fs
        lost = b.offset_s(start) * -1.0
        t1 = t0 + n / self.fs
        what = (f"{lost:.6f} s ({round(lost * self.fs)} samples) lost" if lost > 0
                else f"the stream's time jumps back {-lost:.6f} s")
        return ReceiverGap(
            f"usrp receiver: capture window {t0:.6f}..{t1:.6f} s (USRP time) {how} a gap in "
            f"the stream from {start:.6f} to {b.time_s:.6f} s ({what}: an overflow; the "
            f"stream is re-anchored at sample {b.index})",
            gap_start_s=start, gap_end_s=b.time_s, window_start_s=t0, window_end_s=t1,
        )

    def locate(self, t_usrp_s: float, n: int) -> int | None:
        """First sample index of the ``n`` samples from USRP time ``t_usrp_s`` (s).

        A window starting less than one sample before a segment's first sample starts at
        that sample. Returns None while the window reaches past the samples the anchors are
        known for (:attr:`known_through`) with no anchor after it: ask again once more
        samples and anchors have come.

        Raises
        ------
        ReceiverGap
            The window begins in a gap or runs into one.
        LinkError
            No anchor yet, the window begins before the stream's first sample, or before
            :attr:`horizon` (its anchors forgotten).
        """
        if not self.anchors:
            return None
        for i in range(len(self.anchors) - 1, -1, -1):
            a = self.anchors[i]
            x = a.offset_s(t_usrp_s) * self.fs
            if x < -1.0:
                continue  # the window begins before this segment
            start = max(a.index, a.index + round(x))
            end = self.segment_end(i)
            if end is not None and start >= end:
                raise self._gap(i, t_usrp_s, n, "begins in")
            if end is not None and start + n > end:
                raise self._gap(i, t_usrp_s, n, "runs into")
            if start < self.horizon:
                break
            if end is None and start + n > self.known_through:
                return None
            return start
        first = self.anchors[0]
        if self.horizon > 0 and first.index >= self.horizon:
            raise LinkError(
                f"usrp receiver: capture window at USRP time {t_usrp_s:.6f} s lies before the "
                f"samples the receiver still maps (from {first.time_s:.6f} s)"
            )
        raise LinkError(
            f"usrp receiver: capture window at USRP time {t_usrp_s:.6f} s begins before the "
            f"receiver's stream ({first.time_s:.6f} s)"
        )

    def index_guess(self, t_usrp_s: float) -> int:
        """Sample index of USRP time ``t_usrp_s`` by the last anchor (the stream as it goes
        on, if no gap comes); 0 without anchors."""
        if not self.anchors:
            return 0
        a = self.anchors[-1]
        return a.index + round(a.offset_s(t_usrp_s) * self.fs)


class RxRing:
    """Reader thread: receiver samples into a ring buffer indexed by absolute count.

    Memory is the ring's ``capacity`` samples (complex64); the ZeroMQ socket queues what the
    thread has not read yet (a backlog while this process is busy drains afterwards).
    """

    def __init__(self, address: str, capacity: int) -> None:
        self.buf = np.zeros(capacity, dtype=np.complex64)
        self.total = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        #: ``time.monotonic()`` of the last samples received (of the start before any).
        self.last_progress = time.monotonic()
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(address)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            while True:  # drain what is queued (one wake-up, many messages)
                try:
                    msg = self.sock.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._store(np.frombuffer(msg.buffer, dtype=np.complex64))

    def _store(self, data: np.ndarray) -> None:
        size = self.buf.size
        skipped = max(0, data.size - size)  # more than the ring holds: keep the newest
        data = data[skipped:]
        with self.lock:
            at = (self.total + skipped) % size
            first = min(data.size, size - at)
            self.buf[at:at + first] = data[:first]
            self.buf[:data.size - first] = data[first:]
            self.total += skipped + data.size
            self.last_progress = time.monotonic()

    def wait_for(self, end: int, timeout_s: float, backlog_s: float = 30.0) -> None:
        """Wait until sample ``end - 1`` has been received.

        Past ``timeout_s`` it goes on waiting while samples still arrive (a backlog
        draining: nothing received for 1 s is a stall), at most ``backlog_s`` longer.

        Raises
        ------
        LinkFailed
            The stream stalled.
        """
        start = time.monotonic()
        while self.total < end:
            now = time.monotonic()
            if now > start + timeout_s and now - self.last_progress > 1.0:
                raise LinkFailed(
                    f"usrp link: receiver stream stalled at {self.total} samples (waited "
                    f"{now - start:.1f} s for sample {end - 1})"
                )
            if now > start + timeout_s + backlog_s:
                # Samples still arrive, but the chain does not catch up: it delivers slower
                # than the sample rate (a host too loaded for its radios, real or virtual).
                raise LinkFailed(
                    f"usrp link: receiver stream fell behind: still {end - self.total} "
                    f"samples short of sample {end - 1} after {now - start:.1f} s, though "
                    f"samples still arrive (the receive chain runs slower than the sample "
                    f"rate: is the host overloaded?)"
                )
            time.sleep(0.01)

    def read(self, start: int, n: int, timeout_s: float) -> np.ndarray:
        """Samples ``start .. start + n`` (absolute count), waiting for them as
        :meth:`wait_for` does.

        Raises
        ------
        LinkFailed
            The stream stalled.
        LinkError
            The samples were already overwritten.
        """
        self.wait_for(start + n, timeout_s)
        with self.lock:
            if start < self.total - self.buf.size:
                raise LinkError(
                    f"usrp link: capture window at sample {start} already overwritten "
                    f"(ring holds {self.total - self.buf.size}..{self.total})"
                )
            return self.buf[(start + np.arange(n)) % self.buf.size].copy()

    def close(self) -> None:
        """Stop the reader thread, close the socket."""
        self.stop.set()
        self.thread.join(timeout=2)
        self.sock.close(0)


class TxStream:
    """``flowgraphs/tx.py`` on one USRP, fed timed bursts over a ZMQ PUSH socket.

    Parameters
    ----------
    device_args, gain_db, antenna
        UHD device args, TX gain (dB), antenna port.
    sample_rate_hz, center_freq_hz, clock_source, time_source
        As in the hardware config's ``usrp`` section.
    time_epoch
        ``zero`` (USRP time 0 at start-up) or ``host-pps`` (the host's UNIX second latched
        at a PPS edge: every USRP on the same PPS keeps the same time).
    air_address
        The virtual air's burst address (``tcp://HOST:PORT``) for a virtual device
        (``device_args`` ``type=virtual,serial=NAME``; :mod:`radio.virtual_device`); empty
        for a USRP.
    python, log_dir, startup_timeout_s
        Passed to :class:`~radio.flowgraph_process.FlowgraphProcess`.

    Raises
    ------
    FlowgraphError
        The flowgraph failed to start (the socket is closed again).
    """

    def __init__(
        self, *, device_args: str, gain_db: float, antenna: str, sample_rate_hz: float,
        center_freq_hz: float, clock_source: str, time_source: str, time_epoch: str = "zero",
        air_address: str = "", python: str = SYSTEM_PYTHON, log_dir: Path | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        #: Items (headers included) pushed to the flowgraph so far.
        self.items_sent = 0
        address = f"tcp://127.0.0.1:{self.push.bind_to_random_port('tcp://127.0.0.1')}"
        try:
            self.proc: FlowgraphProcess | None = FlowgraphProcess(
                FLOWGRAPH_DIR / "tx.py",
                [*flowgraph_args(sample_rate_hz, center_freq_hz, clock_source, time_source,
                                 time_epoch, air_address),
                 "--device-args", device_args, "--gain", repr(gain_db), "--antenna", antenna,
                 "--in-address", address],
                python=python, log_dir=log_dir, startup_timeout_s=startup_timeout_s,
            )
        except BaseException:
            self.push.close(0)
            raise

    def _proc(self) -> FlowgraphProcess:
        if self.proc is None:
            raise LinkFailed("usrp transmitter is closed")
        return self.proc

    def usrp_time_now(self) -> float:
        """The USRP's current time (s)."""
        return self._proc().call_float("get_time_now")

    def late_bursts(self) -> int:
        """Bursts the USRP reported late so far (``TIME_ERROR``: they arrived after their
        ``tx_time`` and were not sent)."""
        return self._proc().call_int("get_late_bursts")

    def async_events(self) -> list[tuple[int, float | None]]:
        """The USRP's last async events (up to 64), oldest first: (UHD event code, USRP
        time (s) or None); codes 0x1 burst ack, 0x2 underflow, 0x8 time error (late)."""
        out: list[tuple[int, float | None]] = []
        for event in self._proc().call_list("get_async_events"):
            code, t = event if isinstance(event, list | tuple) else (0, None)
            out.append((int(code), None if t is None else float(t)))
        return out

    def check_alive(self) -> None:
        """Raise :class:`~radio.flowgraph_process.FlowgraphError` if the flowgraph died."""
        self._proc().check_alive()

    def send(self, scaled: np.ndarray, tx_time_s: float, where: str, wait_s: float) -> None:
        """Hand one burst (DAC-scaled samples) to the flowgraph, due at USRP ``tx_time_s``.

        Returns once the flowgraph has taken the whole burst (its ``get_samples_in``; at
        most ``wait_s`` more), so that the burst goes out even if this process dies right
        after (the flowgraph passes on what it took before it stops): ZeroMQ's send only
        queues a message, and a process killed before its I/O thread wrote it loses the
        burst. Past ``wait_s`` it returns all the same: the burst may still go out, so it is
        never reported as not sent once queued.

        Raises
        ------
        LinkFailed
            The flowgraph took no samples within ``wait_s`` (nothing was queued).
        """
        proc = self._proc()
        burst = np.concatenate(
            [burst_header(scaled.size, tx_time_s), np.asarray(scaled, dtype=np.complex64)]
        )
        if not self.push.poll(int(1000 * wait_s), zmq.POLLOUT):
            raise LinkFailed(f"{where}: the tx flowgraph (pid {proc.pid}) takes no samples")
        self.push.send(burst.tobytes())
        self.items_sent += burst.size
        end = time.monotonic() + wait_s
        try:
            while (proc.call_float("get_samples_in") < self.items_sent
                   and time.monotonic() < end):
                time.sleep(0.002)
        except FlowgraphError:
            pass  # queued; a dead flowgraph is the caller's next check (confirm)

    def close(self) -> None:
        """Stop the flowgraph and close the socket. Idempotent."""
        try:
            if self.proc is not None:
                self.proc.stop()
        finally:
            self.proc = None
            self.push.close(0)


class RxStream:
    """``flowgraphs/rx.py`` on one USRP, streaming into a ring buffer indexed by USRP time.

    Sample index maps to USRP time through the stream's ``rx_time`` tags (the flowgraph
    records each tag's item index and time; :class:`SampleTimeline`): gr-uhd's source tags
    the first sample and the first after every overflow, so a gap costs only the windows
    that overlap it (:class:`~radio.link.ReceiverGap`), never the stream.

    Parameters
    ----------
    device_args, gain_db, antenna, sample_rate_hz, center_freq_hz, clock_source, time_source
        As in the hardware config's ``usrp`` section.
    ring_seconds
        Samples kept (s).
    start_after_s
        Streaming starts this long after the time epoch (USRP time ``start_time``).
    air_address
        The virtual air's stream address (``tcp://HOST:PORT``) for a virtual device; empty
        for a USRP.
    time_epoch, python, log_dir, startup_timeout_s
        As in :class:`TxStream`.

    Raises
    ------
    FlowgraphError
        The flowgraph failed to start (nothing is left running).
    """

    #: Seconds without a sample, while the USRP's time says samples are due, that make the
    #: stream stalled (:meth:`check_mapping`).
    STALL_S = 10.0

    def __init__(
        self, *, device_args: str, gain_db: float, antenna: str, sample_rate_hz: float,
        center_freq_hz: float, clock_source: str, time_source: str, time_epoch: str = "zero",
        ring_seconds: float = 4.0, start_after_s: float = 1.0, air_address: str = "",
        python: str = SYSTEM_PYTHON, log_dir: Path | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.fs = sample_rate_hz
        self.ring: RxRing | None = None
        #: The stream's anchors (``rx_time`` tags), refreshed from the flowgraph.
        self.timeline = SampleTimeline(sample_rate_hz)
        self._next_seq = 0  # the next tag's sequence number asked for
        address = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.proc: FlowgraphProcess | None = FlowgraphProcess(
            FLOWGRAPH_DIR / "rx.py",
            [*flowgraph_args(sample_rate_hz, center_freq_hz, clock_source, time_source,
                             time_epoch, air_address),
             "--device-args", device_args, "--gain", repr(gain_db), "--antenna", antenna,
             "--out-address", address, "--start-time", repr(start_after_s)],
            python=python, log_dir=log_dir, startup_timeout_s=startup_timeout_s,
        )
        try:
            self.ring = RxRing(address, int(ring_seconds * sample_rate_hz))
            #: USRP time (s) streaming was asked to start at (the first anchor says when
            #: the first sample was taken).
            self.start_time = self.proc.call_float("get_start_time")
        except BaseException:
            self.close()
            raise

    def _proc(self) -> FlowgraphProcess:
        if self.proc is None or self.ring is None:
            raise LinkFailed("usrp receiver is closed")
        return self.proc

    @property
    def capacity_s(self) -> float:
        """Seconds of samples the ring holds."""
        return 0.0 if self.ring is None else self.ring.buf.size / self.fs

    def usrp_time_now(self) -> float:
        """The USRP's current time (s)."""
        return self._proc().call_float("get_time_now")

    def check_alive(self) -> None:
        """Raise :class:`~radio.flowgraph_process.FlowgraphError` if the flowgraph died."""
        self._proc().check_alive()

    def overflows(self) -> int:
        """Gaps (samples lost) in the stream so far: a virtual receiver's count, or the
        discontinuities between a USRP's ``rx_time`` tags."""
        return self._proc().call_int("get_overflows")

    def refresh_anchors(self) -> SampleTimeline:
        """Fetch the ``rx_time`` tags recorded since the last call (XML-RPC
        ``get_rx_anchors``) into :attr:`timeline`; forget the segments the ring no longer
        holds. Returns the timeline.

        Raises
        ------
        FlowgraphError
            The flowgraph died or answers nonsense.
        """
        proc = self._proc()
        assert self.ring is not None
        reply = proc.call_list("get_rx_anchors", self._next_seq)
        try:
            raw_through, raw_next, raw_oldest, tags = reply
            if not isinstance(tags, list):
                raise TypeError("the tags are not a list")
            anchors = [(int(q), Anchor(int(float(i)), int(float(sec)), float(f)))
                       for q, i, sec, f in tags]
            through, next_seq, oldest_seq = map(_reply_int, (raw_through, raw_next, raw_oldest))
        except (TypeError, ValueError) as exc:
            raise FlowgraphError(f"flowgraph rx.py: get_rx_anchors returned {reply!r}") from exc
        if oldest_seq > self._next_seq and anchors:
            # Tags recorded and forgotten before this process asked (more than the
            # flowgraph keeps): nothing before the oldest one known maps to time.
            self.timeline.lose_before(anchors[0][1].index)
        for _, anchor in anchors:
            self.timeline.add(anchor)
        self._next_seq = max(self._next_seq, next_seq)
        self.timeline.covered(through)
        self.timeline.forget_before(self.ring.total - self.ring.buf.size)
        return self.timeline

    def check_mapping(self, usrp_now_s: float, where: str) -> None:
        """Refuse to go on with a dead or stalled receiver.

        Samples behind the USRP's time are a backlog (this process or the chain was busy:
        the reads wait for them) or a gap (its windows raise
        :class:`~radio.link.ReceiverGap`, the stream is re-anchored after it); neither ends
        the stream. A stream that delivered nothing for :attr:`STALL_S` while its samples
        were due does.

        Raises
        ------
        LinkFailed
            The flowgraph died, or the stream stalled.
        """
        self._proc()
        assert self.ring is not None
        try:
            timeline = self.refresh_anchors()
        except FlowgraphError as exc:
            raise LinkFailed(f"{where}: {exc}") from exc
        if timeline.anchors:
            due = timeline.index_guess(usrp_now_s)
        else:
            due = int((usrp_now_s - self.start_time) * self.fs)
        idle = time.monotonic() - self.ring.last_progress
        if self.ring.total < due - int(0.5 * self.fs) and idle > self.STALL_S:
            raise LinkFailed(
                f"{where}: receiver stream stalled: no sample for {idle:.1f} s (have "
                f"{self.ring.total}, ~{due} due by USRP time {usrp_now_s:.3f} s)"
            )

    def read_at(self, t_usrp_s: float, n: int, timeout_s: float) -> np.ndarray:
        """``n`` samples from USRP time ``t_usrp_s``, waiting up to ``timeout_s`` for them
        (longer while a backlog still drains: :meth:`RxRing.wait_for`).

        The window is placed through the anchor of the segment that holds it: the samples
        returned were taken at ``t_usrp_s + k / fs``, ``k = 0 .. n - 1`` (to within one
        sample at a segment's start).

        Raises
        ------
        LinkFailed
            The stream stalled (a dead flowgraph says so, with its log).
        ReceiverGap
            The window overlaps a gap in the stream (an overflow): only this window is lost.
        LinkError
            The window is no longer in the ring, or begins before the stream.
        """
        proc = self._proc()
        assert self.ring is not None
        if t_usrp_s < self.start_time - 1.0 / self.fs:
            raise LinkError(
                f"usrp link: capture window at USRP time {t_usrp_s:.6f} s begins before the "
                f"receiver's stream ({self.start_time:.6f} s)"
            )
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                timeline = self.refresh_anchors()
                start = timeline.locate(t_usrp_s, n)
                if start is not None:
                    out = self.ring.read(start, n, max(0.0, deadline - time.monotonic()))
                    timeline.forget_before(self.ring.total - self.ring.buf.size)
                    return out
                # Not mapped yet: wait for the samples the window needs as the stream goes
                # on, then ask for the anchors again (a tag on them moves the window).
                if timeline.anchors:
                    need = max(timeline.index_guess(t_usrp_s) + n, timeline.known_through + 1)
                else:
                    need = int(round((t_usrp_s - self.start_time) * self.fs)) + n
                if self.ring.total < need:
                    self.ring.wait_for(need, max(0.0, deadline - time.monotonic()))
                elif time.monotonic() > deadline + 30.0:
                    raise LinkFailed(
                        f"usrp link: the receiver's rx_time anchors stop at sample "
                        f"{timeline.known_through} (have {self.ring.total} samples)"
                    )
                else:
                    time.sleep(0.01)  # the samples are here, the tag recorder a step behind
                if time.monotonic() > deadline + 60.0:
                    raise LinkFailed(
                        f"usrp link: capture window at USRP time {t_usrp_s:.6f} s still not "
                        f"received {timeout_s + 60.0:.0f} s on (have {self.ring.total} samples)"
                    )
        except FlowgraphError:
            raise
        except LinkFailed:
            proc.check_alive()  # a dead receiver says so, with its log
            raise

    def close(self) -> None:
        """Stop the reader thread and the flowgraph. Idempotent."""
        try:
            if self.ring is not None:
                self.ring.close()
        finally:
            self.ring = None
            if self.proc is not None:
                self.proc.stop()
            self.proc = None
