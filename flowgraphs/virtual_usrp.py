#!/usr/bin/python3
"""Virtual USRPs: GNU Radio blocks standing in for ``uhd.usrp_sink`` / ``uhd.usrp_source``.

Device args ``type=virtual,serial=NAME[,...]`` (:mod:`radio.virtual_device`) make ``tx.py``
and ``rx.py`` build these blocks instead of the UHD ones. They offer the methods those
flowgraphs (and :mod:`usrp_common`) call on a UHD block, behave as the flowgraphs rely on
UHD behaving, and talk only to the virtual air, over ZeroMQ (:mod:`radio.virtual_wire`):

* :class:`virtual_sink` takes the timed bursts of :mod:`burst_tagger` (``tx_sob`` +
  ``tx_time`` ... ``tx_eob``), scales each to radiated amplitude and pushes it to the air
  with the true (host) time at which its device clock reads ``tx_time``. A burst due in the
  past on the device clock is dropped and reported late, like UHD's ``TIME_ERROR``; an
  on-time one is acknowledged (``BURST_ACK``) once its last sample has left. Both arrive on
  the message port ``async_msgs`` in gr-uhd's shape.
* :class:`virtual_source` pulls the air's sample stream (receiver-antenna amplitude, one
  timeline of air sample indices), scales it by the receive gain and streams from the first
  sample at or after ``set_start_time``, tagging it with ``rx_time``, as a USRP does; a gap
  in the air's indices is an overflow: the samples are missing from the stream and the
  first after them carries a new ``rx_time`` tag, as gr-uhd's source does. Device args
  ``gaps=N,gap_samples=K,gap_every_s=S`` inject such gaps (tests).

Nothing here imports UHD; nothing leaves the host except the ZMQ sockets to the air, opened
when the flowgraph starts (building one, ``--build-only``, opens none). Imported only by
flowgraphs under ``/usr/bin/python3``.

One job at over 600 lines: the virtual device, both of its directions. The sink and the
source share the device clock (offset, drift), the wire to the air and gr-uhd's message
shapes; the flowgraphs import them by bare name from this one file.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pmt
import zmq
from gnuradio import gr

# radio.virtual_device / radio.virtual_wire from the repository this flowgraph belongs to
# (standard library and numpy only).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from radio.virtual_device import VirtualArgs, VirtualClock  # noqa: E402
from radio.virtual_wire import BurstHeader, decode_chunk, encode_burst  # noqa: E402

#: UHD's async event codes (``uhd::async_metadata_t::event_code_t``).
EVENT_BURST_ACK = 0x1
EVENT_UNDERFLOW = 0x2
EVENT_SEQ_ERROR = 0x4
EVENT_TIME_ERROR = 0x8
EVENT_UNDERFLOW_IN_PACKET = 0x10
EVENT_SEQ_ERROR_IN_BURST = 0x20
#: gr-uhd's names of the event codes (the symbols in its ``event_code`` list).
EVENT_NAMES = {
    EVENT_BURST_ACK: "burst_ack",
    EVENT_UNDERFLOW: "underflow",
    EVENT_UNDERFLOW_IN_PACKET: "underflow_in_packet",
    EVENT_SEQ_ERROR: "seq_error",
    EVENT_SEQ_ERROR_IN_BURST: "seq_error_in_burst",
    EVENT_TIME_ERROR: "time_error",
}
#: Clock and time sources a virtual device accepts (those of an N210 with a GPSDO).
SOURCES = ("internal", "external", "mimo", "gpsdo")
#: Seconds the source's ``work`` waits for a chunk before returning no samples.
POLL_S = 0.05
#: Bursts the sink's socket queues for a connected air that is slow (more: dropped). With
#: no air connected nothing is queued: a burst radiated into no air is lost (and counted).
SEND_HWM = 1_000
#: Seconds after the start during which a burst waits for the connection to the air (so
#: that the first bursts are not lost to it); later a burst finding no air is dropped.
CONNECT_WAIT_S = 2.0
#: Chunks the source's reader queues ahead of ``work`` (more: dropped, an overflow).
QUEUE_CHUNKS = 2_000

_SOB = pmt.intern("tx_sob")
_EOB = pmt.intern("tx_eob")
_TIME = pmt.intern("tx_time")
_RX_TIME = pmt.intern("rx_time")
ASYNC_PORT = pmt.intern("async_msgs")


class time_spec:  # noqa: N801 - mirrors uhd.time_spec
    """A device time (s), with the accessors of ``uhd.time_spec`` that this code uses.

    Parameters
    ----------
    secs
        The time (s).
    """

    def __init__(self, secs: float = 0.0) -> None:
        self.secs = float(secs)

    def get_real_secs(self) -> float:
        """The time (s)."""
        return self.secs

    def get_full_secs(self) -> int:
        """Whole seconds (floor)."""
        return int(math.floor(self.secs))

    def get_frac_secs(self) -> float:
        """The fraction of a second, in [0, 1)."""
        return self.secs - math.floor(self.secs)

    def __repr__(self) -> str:
        return f"time_spec({self.secs!r})"


def _secs(t: object) -> float:
    """Seconds from a ``time_spec``-like object (``get_real_secs``) or a number."""
    getter = getattr(t, "get_real_secs", None)
    return float(getter() if callable(getter) else t)  # type: ignore[arg-type]


def time_pmt(t: float) -> pmt.pmt_t:
    """A time (s) as the ``rx_time``/``tx_time`` tag value: tuple (uint64 secs, double frac)."""
    secs = math.floor(t)
    return pmt.make_tuple(pmt.from_uint64(int(secs)), pmt.from_double(t - secs))


def pmt_time(value: pmt.pmt_t) -> float:
    """Seconds from a time tag or a gr-uhd ``time_spec``: a tuple or a pair (secs, frac).

    Raises
    ------
    ValueError
        Neither a tuple nor a pair of two numbers.
    """
    if pmt.is_tuple(value) and pmt.length(value) == 2:
        whole, frac = pmt.tuple_ref(value, 0), pmt.tuple_ref(value, 1)
    elif pmt.is_pair(value):
        whole, frac = pmt.car(value), pmt.cdr(value)
    else:
        raise ValueError(f"time value {value}; allowed: (secs, frac) as a tuple or a pair")
    return float(pmt.to_python(whole)) + float(pmt.to_python(frac))


def async_message(code: int, t_device: float, channel: int = 0) -> pmt.pmt_t:
    """An async event as gr-uhd's ``usrp_sink`` publishes it on ``async_msgs``.

    ``cons('uhd_async_msg', dict)``; the dict holds ``event_code`` (a list of the symbols of
    the bits set, e.g. ``(time_error)``), ``time_spec`` (pair of long whole seconds and
    double fraction) and ``channel`` (uint64).
    """
    events = pmt.PMT_NIL
    for bit, name in EVENT_NAMES.items():
        if code & bit:
            events = pmt.list_add(events, pmt.intern(name))
    secs = math.floor(t_device)
    value = pmt.dict_add(pmt.make_dict(), pmt.intern("event_code"), events)
    value = pmt.dict_add(value, pmt.intern("time_spec"),
                         pmt.cons(pmt.from_long(int(secs)), pmt.from_double(t_device - secs)))
    value = pmt.dict_add(value, pmt.intern("channel"), pmt.from_uint64(int(channel)))
    return pmt.cons(pmt.intern("uhd_async_msg"), value)


class _VirtualDevice:
    """The settings, clock and counters shared by :class:`virtual_sink` and
    :class:`virtual_source` (a mixin; ``_init_device`` is its constructor)."""

    def _init_device(self, device_args: str, air_address: str, role: str,
                     host: Callable[[], float] = time.time) -> None:
        self.vargs = VirtualArgs.parse(device_args)
        if not air_address:
            raise ValueError(f"virtual {role} '{self.vargs.serial}': no air address; allowed: "
                             "tcp://HOST:PORT")
        self.role = role
        self.air_address = air_address
        self.clock = VirtualClock(self.vargs.clock_offset_s, self.vargs.drift_ppm, host)
        self.host = host
        self._samp_rate = 1e6
        self._freq = 0.0
        self._gain = self.vargs.applied_gain(0.0)
        self._antenna = "TX/RX" if role == "tx" else "RX2"
        self._clock_source = "internal"
        self._time_source = "internal"

    @property
    def serial(self) -> str:
        """The device's ``serial``."""
        return self.vargs.serial

    def host_time(self) -> float:
        """The clock of the host this device hangs on (s): true time plus the device args'
        ``host_clock_error_s`` (what :func:`usrp_common.latch_host_time_at_pps` reads)."""
        return float(self.host()) + self.vargs.host_clock_error_s

    @staticmethod
    def _check_source(what: str, source: str) -> str:
        if source not in SOURCES:
            raise RuntimeError(f"{what}: got {source!r}; allowed: {', '.join(SOURCES)}")
        return source

    def set_clock_source(self, source: str, mboard: int = 0) -> None:
        """The reference clock: ``internal``, ``external``, ``mimo`` or ``gpsdo``."""
        self._clock_source = self._check_source("clock source", source)

    def get_clock_source(self, mboard: int = 0) -> str:
        return self._clock_source

    def set_time_source(self, source: str, mboard: int = 0) -> None:
        """The PPS: ``internal``, or ``external``/``gpsdo``/``mimo`` (edges on whole true
        seconds, the shared PPS of every virtual device)."""
        self._time_source = self._check_source("time source", source)

    def get_time_source(self, mboard: int = 0) -> str:
        return self._time_source

    def set_samp_rate(self, rate: float) -> None:
        """Sample rate (S/s), applied as asked."""
        rate = float(rate)
        if not (math.isfinite(rate) and rate > 0):
            raise RuntimeError(f"sample rate: got {rate!r}; allowed: a number > 0 (S/s)")
        self._samp_rate = rate

    def get_samp_rate(self) -> float:
        return self._samp_rate

    def set_center_freq(self, freq: object, chan: int = 0) -> None:
        """Carrier (Hz); a tune request's ``target_freq`` is taken too."""
        target = getattr(freq, "target_freq", freq)
        value = float(target)  # type: ignore[arg-type]
        if not (math.isfinite(value) and value >= 0):
            raise RuntimeError(f"center frequency: got {value!r}; allowed: a number >= 0 (Hz)")
        self._freq = value

    def get_center_freq(self, chan: int = 0) -> float:
        return self._freq

    def set_gain(self, gain: float, *rest: object) -> None:
        """Gain (dB): clipped to the device's range and rounded to its step
        (:meth:`radio.virtual_device.VirtualArgs.applied_gain`); ``set_gain(g, chan)`` and
        ``set_gain(g, name, chan)`` alike."""
        value = float(gain)
        if not math.isfinite(value):
            raise RuntimeError(f"gain: got {gain!r}; allowed: a finite number (dB)")
        self._gain = self.vargs.applied_gain(value)

    def get_gain(self, *chan: object) -> float:
        """The gain applied (dB)."""
        return self._gain

    def set_antenna(self, antenna: str, chan: int = 0) -> None:
        self._antenna = str(antenna)

    def get_antenna(self, chan: int = 0) -> str:
        return self._antenna

    def set_time_now(self, t: object, mboard: int = 0) -> None:
        """Device time ``t`` (``time_spec`` or s) from now."""
        self.clock.set_time_now(_secs(t))

    def set_time_next_pps(self, t: object) -> None:
        """Device time ``t`` (``time_spec`` or s) at the next PPS edge (whole true second)."""
        self.clock.set_time_next_pps(_secs(t))

    def get_time_now(self, mboard: int = 0) -> time_spec:
        """The device time now."""
        return time_spec(self.clock.now())

    def get_time_last_pps(self, mboard: int = 0) -> time_spec:
        """The device time at the last PPS edge (the last whole true second)."""
        return time_spec(self.clock.time_last_pps())

    def device_line(self) -> str:
        """``virtual device: serial NAME, air ADDRESS`` for the build report."""
        return f"virtual device: serial {self.serial}, air {self.air_address}"


class virtual_sink(_VirtualDevice, gr.sync_block):  # noqa: N801 - GNU Radio block naming
    """Stands in for ``uhd.usrp_sink``: tagged bursts in, bursts to the virtual air out.

    Input: one complex64 stream, DAC samples (full scale ``|s| = 1``) tagged ``tx_sob`` +
    ``tx_time`` (tuple uint64 secs, double frac; device time) on a burst's first sample and
    ``tx_eob`` on its last (:mod:`burst_tagger`). A burst is radiated as
    ``x = s sqrt(tx_full_scale_w 10^(gain/10))`` (W^0.5), scaled down to ``max_power_w`` when
    its mean power ``mean |x|^2`` is above it, and pushed to the air as one
    :class:`radio.virtual_wire.BurstHeader` message stamped with the true time at which the
    device clock reads ``tx_time``. Message output ``async_msgs``: gr-uhd's async events,
    ``TIME_ERROR`` for a burst whose ``tx_time`` had passed when it arrived (its samples are
    dropped) and ``BURST_ACK`` when an on-time burst's last sample has left.

    Parameters
    ----------
    device_args
        ``type=virtual,serial=NAME[,...]``.
    air_address
        The air's burst address (``tcp://HOST:PORT``; the air binds, this block connects).
    host
        The true clock (s), :func:`time.time`.

    Raises
    ------
    ValueError
        Bad device args, or no air address.
    """

    def __init__(self, device_args: str, air_address: str,
                 host: Callable[[], float] = time.time) -> None:
        gr.sync_block.__init__(self, name="virtual_sink", in_sig=[np.complex64], out_sig=None)
        self._init_device(device_args, air_address, "tx", host)
        self.message_port_register_out(ASYNC_PORT)
        self._lock = threading.Lock()
        self._burst: list[np.ndarray] | None = None  # samples of the burst being collected
        self._burst_time = 0.0  # its tx_time (device s)
        self._dropping = False  # inside a late burst: its samples are discarded
        self._sock: zmq.Socket | None = None
        self._connect_deadline = 0.0
        self._timers: list[threading.Timer] = []
        self._last_push: zmq.MessageTracker | None = None  # the last burst's, until written
        #: Bursts pushed to the air.
        self.bursts_sent = 0
        #: Bursts whose tx_time had passed on arrival (dropped, TIME_ERROR).
        self.late_bursts = 0
        #: Bursts scaled down to ``max_power_w``.
        self.clipped_bursts = 0
        #: Bursts not pushed: no air connected, or its queue full.
        self.dropped = 0
        #: Samples outside any burst (no ``tx_sob`` before them), discarded.
        self.discarded = 0

    # -- GNU Radio hooks -------------------------------------------------------------
    def start(self) -> bool:  # noqa: D102 - the socket to the air opens with the flowgraph
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only to an air that is there
        sock.copy_threshold = 0  # every burst tracked until written (flushed)
        sock.connect(self.air_address)
        self._sock = sock
        self._connect_deadline = time.monotonic() + CONNECT_WAIT_S
        return True

    def stop(self) -> bool:  # noqa: D102
        with self._lock:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        return True

    def work(self, input_items: list[np.ndarray], output_items: list[np.ndarray]) -> int:
        inp = input_items[0]
        n = len(inp)
        base = self.nitems_read(0)
        sob: set[int] = set()
        eob: set[int] = set()
        times: dict[int, float] = {}
        for tag in self.get_tags_in_window(0, 0, n):
            rel = int(tag.offset - base)
            if pmt.eq(tag.key, _SOB) and pmt.to_bool(tag.value):
                sob.add(rel)
            elif pmt.eq(tag.key, _EOB) and pmt.to_bool(tag.value):
                eob.add(rel)
            elif pmt.eq(tag.key, _TIME):
                times[rel] = pmt_time(tag.value)
        if not (sob or eob) and self._burst is None and not self._dropping:
            self.discarded += n
            return n
        # Segments between burst boundaries: a sob opens one at its sample, an eob closes
        # one after its sample.
        cuts = sorted({0, n, *sob, *(e + 1 for e in eob if e + 1 < n)})
        for a, b in zip(cuts[:-1], cuts[1:], strict=False):
            if a in sob:
                self._open(times.get(a))
            if self._dropping:
                pass
            elif self._burst is not None:
                self._burst.append(np.array(inp[a:b], dtype=np.complex64))
            else:
                self.discarded += b - a
            if b - 1 in eob:
                self._close()
        return n

    # -- bursts ----------------------------------------------------------------------
    def _open(self, tx_time: float | None) -> None:
        """A ``tx_sob``: start collecting, or dropping when ``tx_time`` has passed."""
        if self._burst is not None:
            # A burst never closed (no tx_eob): UHD would splice it into the next one; the
            # air cannot, so it is discarded.
            self.discarded += sum(c.size for c in self._burst)
            self._burst = None
        now = self.clock.now()
        t = now if tx_time is None else tx_time
        if t < now:
            self.late_bursts += 1
            self._dropping = True
            self._burst = None
            print(f"tx: virtual device {self.serial}: late burst (tx_time {t:.6f} s, device "
                  f"time {now:.6f} s): dropped", file=sys.stderr, flush=True)
            self.message_port_pub(ASYNC_PORT, async_message(EVENT_TIME_ERROR, now))
            return
        self._dropping = False
        self._burst = []
        self._burst_time = t

    def _close(self) -> None:
        """A ``tx_eob``: radiate the burst collected (nothing when it was late)."""
        if self._dropping:
            self._dropping = False
            return
        if self._burst is None:
            return
        s = np.concatenate(self._burst) if self._burst else np.zeros(0, np.complex64)
        self._burst = None
        if s.size == 0:
            return
        gain = self._gain
        x = s.astype(np.complex128) * math.sqrt(self.vargs.tx_full_scale_w * 10 ** (gain / 10))
        power = float(np.mean(np.abs(x) ** 2))
        if power > self.vargs.max_power_w:
            x *= math.sqrt(self.vargs.max_power_w / power)
            power = self.vargs.max_power_w
            self.clipped_bursts += 1
        fs = self._samp_rate
        header = BurstHeader(
            serial=self.serial, t_true_s=self.clock.to_true(self._burst_time),
            sample_rate_hz=fs, center_freq_hz=self._freq, gain_db=gain, n=int(s.size),
            power_w=power,
        )
        if not self._push(encode_burst(header, x.astype(np.complex64))):
            return
        self.bursts_sent += 1
        end = self._burst_time + s.size / fs
        self._ack_at(end)

    def _push(self, frames: list[bytes]) -> bool:
        """Send one message to the air without blocking; False (counted) if it took none."""
        if self._sock is None:
            self.dropped += 1
            return False
        # Just after the start, wait for the connection (bounded: CONNECT_WAIT_S in all).
        wait_ms = int(1000 * (self._connect_deadline - time.monotonic()))
        if wait_ms > 0:
            self._sock.poll(wait_ms, zmq.POLLOUT)
        try:
            self._last_push = self._sock.send_multipart(frames, flags=zmq.NOBLOCK,
                                                        copy=False, track=True)
        except zmq.Again:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                print(f"tx: virtual device {self.serial}: no air takes bursts at "
                      f"{self.air_address} ({self.dropped} dropped)", file=sys.stderr,
                      flush=True)
            return False
        return True

    def flushed(self) -> bool:
        """Whether every burst pushed has been written to the air's socket (ZeroMQ's send
        only queues it: a flowgraph stopped before its I/O thread wrote it loses it). A
        burst under ZeroMQ's 8 KB batch counts once copied into the I/O thread's batch,
        which that thread writes in the same step."""
        tracker = self._last_push
        return tracker is None or tracker.done

    def _ack_at(self, end_device_s: float) -> None:
        """Post ``BURST_ACK`` once the device clock has passed ``end_device_s``."""

        def ack() -> None:
            self.message_port_pub(ASYNC_PORT, async_message(EVENT_BURST_ACK, end_device_s))

        delay = max(0.0, self.clock.to_true(end_device_s) - self.host())
        timer = threading.Timer(delay, ack)
        timer.daemon = True
        with self._lock:
            self._timers = [t for t in self._timers if t.is_alive()]
            self._timers.append(timer)
        timer.start()

    def counters(self) -> dict[str, int]:
        """``bursts_sent``, ``late_bursts``, ``clipped_bursts``, ``dropped``, ``discarded``."""
        return {"bursts_sent": self.bursts_sent, "late_bursts": self.late_bursts,
                "clipped_bursts": self.clipped_bursts, "dropped": self.dropped,
                "discarded": self.discarded}


class virtual_source(_VirtualDevice, gr.sync_block):  # noqa: N801 - GNU Radio block naming
    """Stands in for ``uhd.usrp_source``: the virtual air's stream in, one complex64 out.

    A reader thread pulls the air's chunks (:class:`radio.virtual_wire.ChunkHeader`: air
    sample ``k`` is at true time ``t0 + k / fs``). Output ``y = x sqrt(10^(gain/10) /
    rx_full_scale_w)``: full scale ``|y| = 1`` at ``rx_full_scale_w`` input at 0 dB. With
    :meth:`set_start_time` streaming starts at the first sample whose device time is at or
    after the start time (otherwise at the first sample received after the flowgraph
    started); that sample carries an ``rx_time`` tag (tuple uint64 secs, double frac) of
    its device time. A jump in the air's indices (samples lost: the air's or this block's
    queue; the air's stream beginning after the start time) is an overflow, as on a USRP:
    the samples are missing from the output, it is counted (:attr:`overflows`,
    :attr:`lost_samples`) and the first sample after it carries a new ``rx_time`` tag.

    Device args ``gaps=N`` (with ``gap_samples``, ``gap_every_s``, ``gap_timing``,
    ``gap_seed``: :mod:`radio.virtual_device`) make N such gaps on purpose: after every
    ``gap_every_s`` seconds of output (regular, or exponential intervals of that mean) the
    next ``gap_samples`` air samples are dropped, counted as an overflow (and in
    :attr:`injected_gaps`) and tagged after, for tests of the receiver's re-anchoring.

    Parameters
    ----------
    device_args
        ``type=virtual,serial=NAME[,...]``; ``drift_ppm`` must be 0 (the air's sample
        timeline is the receiver's sample clock).
    air_address
        The air's stream address (``tcp://HOST:PORT``; the air binds, this block connects).
    host
        The true clock (s), :func:`time.time`.

    Raises
    ------
    ValueError
        Bad device args, a drifting clock, or no air address.
    """

    def __init__(self, device_args: str, air_address: str,
                 host: Callable[[], float] = time.time) -> None:
        gr.sync_block.__init__(self, name="virtual_source", in_sig=None,
                               out_sig=[np.complex64])
        self._init_device(device_args, air_address, "rx", host)
        if self.vargs.drift_ppm != 0:
            raise ValueError(f"device args '{device_args}': drift_ppm={self.vargs.drift_ppm:g} "
                             "on a receiver; allowed: 0 (the air's sample timeline is the "
                             "receiver's sample clock)")
        self._start_time: float | None = None
        self._queue: queue.Queue[tuple[object, np.ndarray]] = queue.Queue(QUEUE_CHUNKS)
        self._stopping = threading.Event()
        self._reader: threading.Thread | None = None
        self._streaming = False
        self._chunk: np.ndarray | None = None  # current chunk's samples (air amplitude)
        self._pos = 0  # next sample of it to output
        self._chunk_index = 0  # air index of its sample 0
        self._t0 = 0.0  # air sample 0's true time (s)
        self._fs = 0.0  # the air's rate
        self._next_index = 0  # air index expected next
        self._tag_pending = False
        self._gap_rng = np.random.default_rng(self.vargs.gap_seed)
        self._gaps_left = self.vargs.gaps
        self._gap_at: int | None = None  # output item at which the next injected gap falls
        self._skip = 0  # air samples still to drop for the gap being injected
        #: Gaps in the stream (samples lost), like UHD's overflows ('O').
        self.overflows = 0
        #: Samples lost in those gaps.
        self.lost_samples = 0
        #: Gaps made on purpose (device args ``gaps``), included in :attr:`overflows`.
        self.injected_gaps = 0
        #: Chunks the reader could not queue (``work`` too slow): lost, an overflow.
        self.queue_drops = 0
        #: Chunks refused (not decodable, or at another sample rate than the device's).
        self.bad_chunks = 0
        #: Device time (s) of the first sample streamed (None before).
        self.first_sample_time: float | None = None

    def set_start_time(self, t: object) -> None:
        """Stream from the first sample at or after device time ``t`` (``time_spec`` or s)."""
        self._start_time = _secs(t)

    # -- GNU Radio hooks -------------------------------------------------------------
    def start(self) -> bool:  # noqa: D102 - the socket to the air opens with the flowgraph
        self._stopping.clear()
        self._reader = threading.Thread(target=self._read, name="virtual_source reader",
                                        daemon=True)
        self._reader.start()
        return True

    def stop(self) -> bool:  # noqa: D102
        self._stopping.set()
        if self._reader is not None:
            self._reader.join(timeout=2.0)
            self._reader = None
        return True

    def _read(self) -> None:
        """Reader thread: the air's chunks into the queue."""
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, QUEUE_CHUNKS)
        sock.connect(self.air_address)
        try:
            while not self._stopping.is_set():
                if not sock.poll(100):
                    continue
                frames = sock.recv_multipart()
                try:
                    chunk = decode_chunk(frames)
                except ValueError as exc:
                    self._refuse(f"undecodable chunk ({exc})")
                    continue
                try:
                    self._queue.put_nowait(chunk)
                except queue.Full:
                    self.queue_drops += 1
        finally:
            sock.close(0)

    def _refuse(self, why: str) -> None:
        self.bad_chunks += 1
        if self.bad_chunks == 1 or self.bad_chunks % 100 == 0:
            print(f"rx: virtual device {self.serial}: {why}; chunk dropped "
                  f"({self.bad_chunks} so far)", file=sys.stderr, flush=True)

    def _next_gap(self, after: int) -> None:
        """Place the next injected gap ``gap_every_s`` (or a random interval of that mean)
        of output after output item ``after``; none when every gap has been made."""
        if self._gaps_left <= 0:
            self._gap_at = None
            return
        mean = self.vargs.gap_every_s * self._samp_rate
        step = mean if self.vargs.gap_timing == "regular" else self._gap_rng.exponential(mean)
        self._gap_at = after + max(1, round(step))

    def _inject_gap(self) -> None:
        """Start dropping ``gap_samples`` air samples: an overflow made on purpose."""
        self._gaps_left -= 1
        self._skip = self.vargs.gap_samples
        self.overflows += 1
        self.injected_gaps += 1
        self.lost_samples += self._skip
        print(f"rx: virtual device {self.serial}: injected gap {self.injected_gaps} of "
              f"{self.vargs.gaps}: {self._skip} samples dropped at device time "
              f"{self._device_time(self._chunk_index + self._pos):.6f} s", file=sys.stderr,
              flush=True)

    def work(self, input_items: list[np.ndarray], output_items: list[np.ndarray]) -> int:
        out = output_items[0]
        produced = 0
        written = self.nitems_written(0)
        while produced < len(out) and not self._stopping.is_set():
            if self._chunk is None or self._pos >= self._chunk.size:
                self._chunk = None
                try:
                    header, x = (self._queue.get(timeout=POLL_S) if produced == 0
                                 else self._queue.get_nowait())
                except queue.Empty:
                    break
                self._accept(header, x)
                continue
            if self._skip:  # an injected gap: drop the air's samples, tag the next one
                k = min(self._skip, self._chunk.size - self._pos)
                self._pos += k
                self._next_index = max(self._next_index, self._chunk_index + self._pos)
                self._skip -= k
                if not self._skip:
                    self._tag_pending = True
                continue
            if self._gap_at is not None and written + produced >= self._gap_at:
                self._inject_gap()
                self._next_gap(self._gap_at)
                continue
            k = min(len(out) - produced, self._chunk.size - self._pos)
            if self._gap_at is not None:
                k = min(k, self._gap_at - written - produced)
            if self._tag_pending:
                t_dev = self._device_time(self._chunk_index + self._pos)
                if self.first_sample_time is None:
                    self.first_sample_time = t_dev
                    self._next_gap(written + produced)
                    if self._gap_at is not None:
                        k = min(k, self._gap_at - written - produced)
                self.add_item_tag(0, written + produced, _RX_TIME, time_pmt(t_dev))
                self._tag_pending = False
            scale = math.sqrt(10 ** (self._gain / 10) / self.vargs.rx_full_scale_w)
            out[produced:produced + k] = self._chunk[self._pos:self._pos + k] * scale
            self._pos += k
            produced += k
        return produced

    def _device_time(self, index: int) -> float:
        """Device time (s) of air sample ``index``."""
        return self.clock.at(self._t0 + index / self._fs)

    def _accept(self, header: object, x: np.ndarray) -> None:
        """Take one chunk: find the start, or follow on from the last (gaps: overflows)."""
        index, t0 = int(header.index), float(header.t0_true_s)  # type: ignore[attr-defined]
        fs = float(header.sample_rate_hz)  # type: ignore[attr-defined]
        if abs(fs - self._samp_rate) > 1e-9 * self._samp_rate:
            self._refuse(f"the air streams {fs:g} S/s, the device is set to "
                         f"{self._samp_rate:g} S/s")
            return
        if x.size == 0:
            return
        if not self._streaming:
            self._t0, self._fs = t0, fs
            first = 0
            if self._start_time is not None:
                # First air index whose device time is at or after the start time.
                t_start = self.clock.to_true(self._start_time)
                k0 = math.ceil((t_start - t0) * fs - 1e-6)
                if index + x.size <= k0:
                    return  # all before the start
                if k0 < index:
                    # The air was not there yet: a gap at the start (the first sample's
                    # rx_time tag says when the stream begins).
                    self.overflows += 1
                    self.lost_samples += index - k0
                    print(f"rx: virtual device {self.serial}: the air's stream begins "
                          f"{(index - k0) / fs:.6f} s after the start time "
                          f"{self._start_time:.6f} s; the stream starts there (rx_time)",
                          file=sys.stderr, flush=True)
                first = max(k0 - index, 0)
            self._streaming = True
            self._set_chunk(index, x, first)
            return
        if t0 != self._t0:
            # The air restarted: place the new timeline on the old one (true times).
            index = round((t0 + index / fs - self._t0) * fs)
            print(f"rx: virtual device {self.serial}: the air's timeline restarted",
                  file=sys.stderr, flush=True)
        if index + x.size <= self._next_index:
            return  # a repeat of samples already streamed (or dropped in a gap)
        if index > self._next_index:
            lost = index - self._next_index
            self.overflows += 1
            self.lost_samples += lost
            print(f"rx: virtual device {self.serial}: overflow, {lost} samples missing at "
                  f"device time {self._device_time(self._next_index):.6f} s; the stream is "
                  "retagged (rx_time)", file=sys.stderr, flush=True)
            self._set_chunk(index, x, 0)
            return
        self._set_chunk(index, x, self._next_index - index, retag=False)

    def _set_chunk(self, index: int, x: np.ndarray, first: int, retag: bool = True) -> None:
        self._chunk, self._chunk_index, self._pos = x, index, first
        self._next_index = index + x.size
        if retag:
            self._tag_pending = True

    def counters(self) -> dict[str, int]:
        """``overflows``, ``lost_samples``, ``injected_gaps``, ``queue_drops``,
        ``bad_chunks``."""
        return {"overflows": self.overflows, "lost_samples": self.lost_samples,
                "injected_gaps": self.injected_gaps, "queue_drops": self.queue_drops,
                "bad_chunks": self.bad_chunks}
