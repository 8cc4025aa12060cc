"""Gaps in the receiver's stream (overflows): re-anchoring at ``rx_time``, lost windows only.

The ``usrp`` link's receiver maps stream sample index to USRP time through the stream's
``rx_time`` tags (:class:`radio.usrp_stream.SampleTimeline`): a window across a gap raises
:class:`radio.link.ReceiverGap` (one upload lost), the windows before and after it read the
right samples, and the run goes on. Unit tests on synthetic anchors and a ring fed over
ZeroMQ; then the virtual source's injected gaps (``gaps=...`` in its device args) through a
real ``rx.py`` flowgraph.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import zmq

from radio.framing import device_waveform
from radio.link import LinkError, LinkFailed, ReceiverGap, Reception
from radio.modem import modulate
from radio.slot_receiver import SlotReceiver
from radio.tdma import slot_guard_s, tdma_schedule
from radio.usrp_stream import Anchor, RxRing, RxStream, SampleTimeline, anchor_at
from radio.virtual_device import VirtualArgs
from testbed.core.config.hardware import receiver_radio
from testbed.core.config.loader import load_hardware
from testbed.core.links import waveform_params
from tests.lab_helpers import FS_RX, ChunkAir, air_index, wait_until
from tests.radio_helpers import require_gnuradio, unit_payload

FS = 1e6
T0 = 1_700_000_000.25  # a host-pps epoch: sub-sample resolution needs secs and frac apart


def _timeline_with_gap() -> SampleTimeline:
    """Samples 0..4999 from T0; 2000 samples lost; samples 5000.. from T0 + 7 ms."""
    tl = SampleTimeline(FS)
    tl.add(anchor_at(0, T0))
    tl.add(anchor_at(5000, T0 + 0.007))
    tl.covered(20_000)
    return tl


# -- the timeline: windows before, across and after a gap ---------------------------------


def test_window_before_the_gap_maps_through_the_first_anchor() -> None:
    tl = _timeline_with_gap()
    assert tl.gaps == 1
    assert tl.locate(T0 + 0.001, 1000) == 1000
    assert tl.locate(T0 + 0.004, 1000) == 4000  # ends on the last sample before the gap


@pytest.mark.parametrize(("t", "n", "how"), [
    (T0 + 0.0045, 1000, "runs into"),   # 500 samples before the gap, 500 in it
    (T0 + 0.0055, 100, "begins in"),    # wholly in the gap
    (T0 + 0.0060, 2000, "begins in"),   # from the gap into the next segment
    (T0 + 0.0010, 10_000, "runs into"),  # across the whole gap
])
def test_window_across_the_gap_raises_receiver_gap(t: float, n: int, how: str) -> None:
    tl = _timeline_with_gap()
    with pytest.raises(ReceiverGap, match=how) as err:
        tl.locate(t, n)
    gap = err.value
    assert isinstance(gap, LinkError) and not isinstance(gap, LinkFailed)
    assert gap.gap_start_s == pytest.approx(T0 + 0.005, abs=1e-7)
    assert gap.gap_end_s == pytest.approx(T0 + 0.007, abs=1e-7)
    assert gap.window_start_s == t and gap.window_end_s == pytest.approx(t + n / FS)
    assert "0.002000 s (2000 samples) lost" in str(gap)
    clone = pickle.loads(pickle.dumps(gap))  # crosses processes with its attributes
    assert isinstance(clone, ReceiverGap) and clone.gap_end_s == gap.gap_end_s


def test_window_after_the_gap_maps_through_the_new_anchor() -> None:
    tl = _timeline_with_gap()
    assert tl.locate(T0 + 0.007, 500) == 5000
    assert tl.locate(T0 + 0.010, 500) == 8000
    # Less than one sample before a segment's first sample: that sample.
    assert tl.locate(T0 + 0.007 - 0.6 / FS, 10) == 5000


def test_window_before_the_stream_or_not_yet_covered() -> None:
    tl = _timeline_with_gap()
    with pytest.raises(LinkError, match="begins before the receiver's stream") as err:
        tl.locate(T0 - 0.001, 10)
    assert not isinstance(err.value, ReceiverGap)
    # Past the samples the anchors are known for: not decided yet (a tag may still come).
    assert tl.locate(T0 + 0.007 + 15_000 / FS, 1000) is None
    tl.covered(30_000)
    assert tl.locate(T0 + 0.007 + 15_000 / FS, 1000) == 20_000
    assert SampleTimeline(FS).locate(T0, 10) is None  # no anchor yet


def test_a_tag_that_continues_the_time_is_no_gap() -> None:
    tl = SampleTimeline(FS)
    tl.add(anchor_at(0, T0))
    tl.add(anchor_at(3000, T0 + 0.003 + 0.2 / FS))  # a retag (retune): same timeline
    tl.add(anchor_at(3000, T0 + 5.0))  # a repeat of an index: ignored
    tl.covered(10_000)
    assert tl.gaps == 0 and len(tl.anchors) == 1
    assert tl.locate(T0 + 0.002, 2000) == 2000  # across the retag


def test_a_clock_jumping_back_is_a_gap_too() -> None:
    tl = SampleTimeline(FS)
    tl.add(anchor_at(0, T0))
    tl.add(anchor_at(5000, T0 + 0.001))  # time set back under the stream
    tl.covered(20_000)
    with pytest.raises(ReceiverGap, match="jumps back"):
        tl.locate(T0, 5000 + 10)
    assert tl.locate(T0 + 0.002, 10) == 6000  # the newer segment holds this time


def test_anchor_memory_is_bounded() -> None:
    tl = SampleTimeline(FS, max_anchors=8)
    for k in range(100):  # a gap every 1000 samples
        tl.add(Anchor(k * 1000, 100 + k, 0.0))
    assert len(tl.anchors) == 8 and tl.anchors[-1].index == 99_000
    tl.covered(100_000)
    assert tl.locate(199.0005, 100) == 99_500
    with pytest.raises(LinkError, match="still maps"):
        tl.locate(150.0, 10)
    tl.forget_before(98_500)  # the ring no longer holds what is before
    assert [a.index for a in tl.anchors] == [98_000, 99_000]


# -- the ring and RxStream.read_at, over ZeroMQ, with synthetic anchors ------------------


class _Anchors:
    """Stands in for the rx flowgraph's control (``get_rx_anchors``): anchors set by hand."""

    def __init__(self) -> None:
        self.tags: list[list[object]] = []
        self.through = 0.0
        self.alive = True
        self.usrp_now = 0.0

    def call_list(self, method: str, *args: object) -> list[object]:
        assert method == "get_rx_anchors"
        since = int(args[0])  # type: ignore[call-overload]
        return [self.through, len(self.tags), 0,
                [t for t in self.tags if int(t[0]) >= since]]  # type: ignore[call-overload]

    def call_float(self, method: str, *args: object) -> float:
        assert method == "get_time_now"
        return self.usrp_now

    def check_alive(self) -> None:
        if not self.alive:
            raise LinkFailed("flowgraph rx.py died")

    def add(self, index: int, t: float) -> None:
        secs = math.floor(t)
        self.tags.append([len(self.tags), float(index), float(secs), t - secs])


@pytest.fixture()
def ring_stream() -> Iterator[tuple[RxStream, _Anchors, Callable[[np.ndarray], None]]]:
    """An RxStream without a flowgraph: a ring on a PUSH socket, anchors set by the test."""
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    control = _Anchors()
    stream = RxStream.__new__(RxStream)  # the flowgraph's part replaced by ``control``
    stream.fs = FS
    stream.timeline = SampleTimeline(FS)
    stream._next_seq = 0
    stream.start_time = T0
    stream.ring = RxRing(f"tcp://127.0.0.1:{port}", capacity=50_000)
    stream.proc = control  # type: ignore[assignment]

    def send(samples: np.ndarray) -> None:
        push.send(samples.astype(np.complex64).tobytes())

    try:
        yield stream, control, send
    finally:
        stream.ring.close()
        push.close(0)


def _numbered(first: int, n: int) -> np.ndarray:
    """Samples whose real part is their sample number on the air (exact in float32)."""
    return np.arange(first, first + n, dtype=np.float32).astype(np.complex64)


def test_ring_reads_windows_through_the_anchor_that_covers_them(
    ring_stream: tuple[RxStream, _Anchors, Callable[[np.ndarray], None]],
) -> None:
    stream, control, send = ring_stream
    # Air samples 0..4999 from T0, then 2000 lost (an overflow), then 7000..11999.
    control.add(0, T0)
    send(_numbered(0, 3000))
    send(_numbered(3000, 2000))
    control.add(5000, T0 + 0.007)
    send(_numbered(7000, 5000))
    control.through = 10_000.0
    before = stream.read_at(T0 + 0.001, 1000, timeout_s=10.0)
    np.testing.assert_array_equal(before.real, np.arange(1000, 2000))
    after = stream.read_at(T0 + 0.008, 1000, timeout_s=10.0)
    np.testing.assert_array_equal(after.real, np.arange(8000, 9000))  # air time, not count
    with pytest.raises(ReceiverGap, match="runs into a gap"):
        stream.read_at(T0 + 0.0045, 1000, timeout_s=10.0)
    with pytest.raises(ReceiverGap, match="begins in a gap"):
        stream.read_at(T0 + 0.006, 100, timeout_s=10.0)
    # The gap ends nothing: a sample deficit against the USRP's time is no failure.
    stream.check_mapping(T0 + 0.012, "test")


def test_a_window_whose_gap_is_tagged_late_is_placed_after_it(
    ring_stream: tuple[RxStream, _Anchors, Callable[[np.ndarray], None]],
) -> None:
    """The window is asked for before its samples (and the gap's tag) have come."""
    stream, control, send = ring_stream
    control.add(0, T0)
    send(_numbered(0, 4000))
    control.through = 4000.0
    got: dict[str, object] = {}

    def read() -> None:
        try:
            got["y"] = stream.read_at(T0 + 0.010, 500, timeout_s=20.0)
        except LinkError as exc:
            got["y"] = exc

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)
    control.add(4000, T0 + 0.006)  # 2000 samples lost after sample 3999
    send(_numbered(6000, 8000))
    control.through = 12_000.0
    reader.join(timeout=30)
    y = got["y"]
    assert isinstance(y, np.ndarray), y
    np.testing.assert_array_equal(y.real, np.arange(10_000, 10_500))


def test_a_stalled_or_dead_receiver_is_still_a_link_failure(
    ring_stream: tuple[RxStream, _Anchors, Callable[[np.ndarray], None]],
) -> None:
    stream, control, send = ring_stream
    control.add(0, T0)
    send(_numbered(0, 1000))
    control.through = 1000.0
    with pytest.raises(LinkFailed, match="stalled"):
        stream.read_at(T0 + 0.0005, 1000, timeout_s=0.5)
    stream.STALL_S = 0.5  # type: ignore[misc]
    time.sleep(0.6)
    with pytest.raises(LinkFailed, match="stalled"):
        stream.check_mapping(T0 + 5.0, "test")
    control.alive = False
    with pytest.raises(LinkFailed, match="died"):
        stream.read_at(T0 + 0.0005, 1000, timeout_s=0.5)


def test_ring_memory_is_bounded(
    ring_stream: tuple[RxStream, _Anchors, Callable[[np.ndarray], None]],
) -> None:
    stream, control, send = ring_stream
    assert stream.ring is not None
    for k in range(40):  # 200 000 samples through a 50 000-sample ring, a gap every 5000
        control.add(5000 * k, T0 + 0.006 * k)
        send(_numbered(6000 * k, 5000))
    control.through = 200_000.0
    y = stream.read_at(T0 + 0.006 * 39 + 0.001, 100, timeout_s=10.0)
    np.testing.assert_array_equal(y.real, np.arange(6000 * 39 + 1000, 6000 * 39 + 1100))
    assert stream.ring.buf.size == 50_000
    assert len(stream.timeline.anchors) <= 11  # only the segments the ring still holds
    with pytest.raises(LinkError, match="still maps"):
        stream.read_at(T0 + 0.001, 100, timeout_s=1.0)


def test_slot_receiver_loses_only_the_window_over_a_gap(
    ring_stream: tuple[RxStream, _Anchors, Callable[[np.ndarray], None]],
) -> None:
    """Two devices' frames in their TDMA slots; 500 samples lost in device 1's window: its
    upload is a ReceiverGap, device 0's frame decodes, the receiver goes on."""
    stream, control, send = ring_stream
    hw = load_hardware("lab_ota")
    wf = waveform_params(hw)
    fs = wf.sample_rate_hz
    assert fs == FS
    rng = np.random.default_rng(5)
    x = {d: modulate(device_waveform(wf, d), unit_payload(600, rng))[0] for d in (0, 1)}
    guard = slot_guard_s(1e-3, hw.usrp.time_source)
    slots = tdma_schedule([0, 1], x[0].size / fs, guard, start_s=90.005)  # host time
    n = int((slots[-1].window_end_s - 90.0 + 0.005) * fs)  # USRP = host - 90: from 0.0
    capture = 0.03 * (rng.standard_normal(n) + 1j * rng.standard_normal(n))
    for s in slots:
        i = int(round((s.start_s - 90.0) * fs))
        capture[i:i + x[s.device].size] += x[s.device]
    g = int(round((slots[1].start_s - 90.0) * fs)) + 1000  # inside device 1's frame
    stream.start_time = 0.0
    control.add(0, 0.0)
    send(capture[:g])
    control.add(g, (g + 500) / fs)  # the overflow: samples g .. g + 499 never came
    send(capture[g + 500:])
    control.through = float(n - 500)
    control.usrp_now = 10.0
    receiver = SlotReceiver(receiver_radio(hw), wf, clock=lambda: 100.0, stream=stream)
    out = receiver.receive_all(slots, {0: 600, 1: 600}, round_index=3)
    assert isinstance(out[0], Reception), out[0]
    assert isinstance(out[1], ReceiverGap), out[1]
    assert "device 1, round 3: frame lost" in str(out[1])
    assert out[1].gap_start_s == pytest.approx(g / fs) and out[1].gap_end_s == pytest.approx(
        (g + 500) / fs)
    with pytest.raises(ReceiverGap, match="device 1"):
        receiver.receive(slots, round_index=3)
    only_0 = receiver.receive([slots[0]], round_index=3)  # a schedule clear of the gap
    assert set(only_0) == {0}


# -- the device args ----------------------------------------------------------------------


def test_gap_settings_are_parsed_and_checked() -> None:
    a = VirtualArgs.parse("type=virtual,serial=rx0,gaps=20,gap_samples=5000,gap_every_s=0.5,"
                          "gap_timing=random,gap_seed=7")
    assert (a.gaps, a.gap_samples, a.gap_every_s, a.gap_timing, a.gap_seed) == (
        20, 5000, 0.5, "random", 7)
    assert a.gap_problem(1e6, receiver=True) == ""
    plain = VirtualArgs.parse("type=virtual,serial=rx0")
    assert (plain.gaps, plain.gap_samples, plain.gap_timing) == (0, 1000, "regular")
    for bad, says in [("gaps=-1", "gaps=-1; allowed: an integer >= 0"),
                      ("gaps=2.5", "gaps=2.5; allowed: an integer"),
                      ("gap_samples=0", "gap_samples=0; allowed: an integer >= 1"),
                      ("gap_every_s=0", "gap_every_s=0; allowed: a number > 0"),
                      ("gap_timing=often", "gap_timing=often; allowed: regular, random"),
                      ("gap_seed=x", "gap_seed=x; allowed: an integer >= 0")]:
        with pytest.raises(ValueError, match=says.replace("+", r"\+")):
            VirtualArgs.parse(f"type=virtual,serial=rx0,{bad}")
    tx = VirtualArgs.parse("type=virtual,serial=edge0,gaps=3")
    assert "gaps on a transmitter" in tx.gap_problem(1e6, receiver=False)
    short = VirtualArgs.parse("type=virtual,serial=rx0,gaps=3,gap_samples=5000,gap_every_s=0.004")
    assert "allowed: more than gap_samples=5000" in short.gap_problem(1e6, receiver=True)


# -- injected gaps through a real rx flowgraph ---------------------------------------------

@pytest.mark.gnuradio
def test_virtual_source_injects_tagged_gaps_through_the_rx_flowgraph(tmp_path) -> None:
    """``gaps=3,gap_samples=1000,gap_every_s=0.4``: three overflows, each tagged after; the
    receiver re-anchors at each, windows across them raise ReceiverGap, the others read the
    air's samples of their time."""
    require_gnuradio()
    gain = 20.0
    air = ChunkAir()
    air.start()
    stream = None
    try:
        stream = RxStream(
            device_args="type=virtual,serial=g0,gaps=3,gap_samples=1000,gap_every_s=0.4",
            gain_db=gain, antenna="", sample_rate_hz=FS_RX, center_freq_hz=915e6,
            clock_source="internal", time_source="internal", ring_seconds=10.0,
            start_after_s=1.0, air_address=f"tcp://127.0.0.1:{air.port}", log_dir=tmp_path,
            startup_timeout_s=120,
        )
        assert wait_until(lambda: stream.overflows() == 3, 120.0), stream._proc().log_tail()
        counters = stream._proc().call("get_device_counters")
        assert counters["injected_gaps"] == 3 and counters["lost_samples"] == 3000, counters
        # The last gap's tag comes with the first sample after it, 0.2 s of samples on.
        assert wait_until(lambda: len(stream.refresh_anchors().anchors) == 4
                     and stream.timeline.known_through > 3 * 0.4 * FS_RX + 0.2 * FS_RX,
                     60.0), stream.timeline.anchors
        anchors = stream.timeline.anchors
        assert len(anchors) == 4 and stream.timeline.gaps == 3, anchors
        period = round(0.4 * FS_RX)
        assert [a.index for a in anchors] == [0, period, 2 * period, 3 * period]
        for a, b in zip(anchors, anchors[1:], strict=False):  # each gap: 1000 samples of time
            # (device times near 1.8e9 s: float64 resolves 0.24 us, 0.01 samples here)
            assert b.time_s - a.time_s == pytest.approx((period + 1000) / FS_RX, abs=1e-6)
        first = stream.read_at(anchors[0].time_s, 1, timeout_s=30.0)
        k_first = int(air_index(first, gain)[0])

        def air_index_at(t: float) -> int:  # the air's timeline is the receiver's clock
            return k_first + round((t - anchors[0].time_s) * FS_RX)

        for i, a in enumerate(anchors):
            # A window inside each segment: the air's samples of exactly that time.
            t = a.time_s + 0.1
            y = stream.read_at(t, 200, timeout_s=30.0)
            np.testing.assert_array_equal(air_index(y, gain),
                                          np.arange(air_index_at(t), air_index_at(t) + 200))
            if i == 0:
                continue
            # A window across the gap before it: lost, and only it.
            with pytest.raises(ReceiverGap) as err:
                stream.read_at(a.time_s - 0.01, 1000, timeout_s=30.0)
            assert err.value.gap_end_s == pytest.approx(a.time_s, abs=1e-6)
            assert err.value.gap_end_s - err.value.gap_start_s == pytest.approx(1000 / FS_RX,
                                                                                abs=1e-6)
        stream.check_mapping(stream.usrp_time_now(), "virtual rx")  # the run goes on
        log = (tmp_path / "rx.log").read_text()
        assert "injected gap 3 of 3: 1000 samples dropped" in log
    finally:
        if stream is not None:
            stream.close()
        air.close()
