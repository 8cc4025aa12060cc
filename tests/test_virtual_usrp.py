"""Virtual USRPs in the tx/rx flowgraphs (``flowgraphs/virtual_usrp.py``), this test
process playing the virtual air: a PULL socket taking the transmitter's bursts, a PUSH
socket streaming chunks to the receiver (:mod:`radio.virtual_wire`)."""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from radio.flowgraph_process import FLOWGRAPH_DIR, SYSTEM_PYTHON
from radio.usrp_stream import RxStream, TxStream
from radio.virtual_wire import BurstHeader, decode_burst
from tests.lab_helpers import (
    FS_RX,
    RX_FULL_SCALE_W,
    ChunkAir,
    air_index,
    air_samples,
    wait_until,
)
from tests.radio_helpers import require_gnuradio

pytestmark = pytest.mark.gnuradio

#: A virtual transmitter's stream, the air's socket taking its bursts, its log folder.
VirtualTx = tuple[TxStream, "zmq.Socket[bytes]", Path]

FS_TX = 200e3
TX_ARGS = "type=virtual,serial=t0,clock_offset_s=3.5,drift_ppm=20"
TX_FULL_SCALE_W = 1.25  # the transmitter default of radio.virtual_device
MAX_POWER_W = 0.1  # its default max_power_w


def _device_minus_host(now: Callable[[], float], tries: int = 7) -> tuple[float, float]:
    """(device time - host time (s), half the round trip of the best reading (s))."""
    best = (0.0, math.inf)
    for _ in range(tries):
        h0 = time.time()
        d = now()
        h1 = time.time()
        if (h1 - h0) / 2 < best[1]:
            best = (d - (h0 + h1) / 2, (h1 - h0) / 2)
    return best


def _recv_burst(sock: zmq.Socket[bytes], timeout_s: float) -> tuple[BurstHeader, np.ndarray] | None:
    if not sock.poll(int(1000 * timeout_s)):
        return None
    return decode_burst(sock.recv_multipart())


def _unit_phase(n: int, amplitude: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (amplitude * np.exp(2j * np.pi * rng.random(n))).astype(np.complex64)


@pytest.fixture(scope="module")
def virtual_tx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualTx]:
    """A virtual transmitter (gain 10.3 dB asked) and the air's PULL socket."""
    require_gnuradio()
    log_dir = tmp_path_factory.mktemp("virtual_tx")
    air: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
    air.setsockopt(zmq.LINGER, 0)
    port = air.bind_to_random_port("tcp://127.0.0.1")
    stream = None
    try:
        stream = TxStream(
            device_args=TX_ARGS, gain_db=10.3, antenna="", sample_rate_hz=FS_TX,
            center_freq_hz=915e6, clock_source="internal", time_source="internal",
            air_address=f"tcp://127.0.0.1:{port}", log_dir=log_dir, startup_timeout_s=120,
        )
        yield stream, air, log_dir
    finally:
        if stream is not None:
            stream.close()
        air.close(0)


def _send_on_time(stream: TxStream, samples: np.ndarray, lead_s: float = 0.3
                  ) -> tuple[float, float, float]:
    """Send a burst ``lead_s`` ahead on the device clock; (tx_time, device - host, error)."""
    offset, err = _device_minus_host(stream.usrp_time_now)
    tx_time = time.time() + offset + lead_s
    stream.send(samples, tx_time, "test burst", wait_s=10.0)
    return tx_time, offset, err


def test_tx_time_and_gain_read_back(virtual_tx: VirtualTx) -> None:
    stream, _, log_dir = virtual_tx
    t1 = stream.usrp_time_now()
    time.sleep(0.05)
    t2 = stream.usrp_time_now()
    # tx.py sets the device time to 0 at start-up (the clock_offset_s of 3.5 s is replaced).
    assert 0 < t1 < t2 < 120, (t1, t2)
    assert stream._proc().call_float("get_gain") == 10.5  # 10.3 dB rounded to the 0.5 dB step
    assert "gain 10.5 dB" in (log_dir / "tx.log").read_text()


def test_tx_burst_reaches_the_air_at_its_true_time(
    virtual_tx: VirtualTx,
) -> None:
    stream, air, _ = virtual_tx
    s = _unit_phase(1000, 0.05, seed=1)
    tx_time, offset, err = _send_on_time(stream, s)
    got = _recv_burst(air, 15.0)
    assert got is not None, stream._proc().log_tail()
    header, x = got
    # Device clock: host + offset at the reading, then 1 + 20 ppm device s per host s, so
    # it reads tx_time (0.3 s after the reading) 6 us before host tx_time - offset.
    expected_true = (tx_time - offset) - 0.3 * 20e-6 / (1 + 20e-6)
    assert abs(header.t_true_s - expected_true) < err + 0.005, (header, expected_true, err)
    assert header.serial == "t0" and header.n == s.size and header.gain_db == 10.5
    assert header.sample_rate_hz == FS_TX and header.center_freq_hz == 915e6
    scale = math.sqrt(TX_FULL_SCALE_W * 10 ** (10.5 / 10))
    np.testing.assert_allclose(x, s * scale, rtol=1e-5, atol=1e-7)
    assert header.power_w == pytest.approx(float(np.mean(np.abs(s * scale) ** 2)), rel=1e-5)
    # The burst is acknowledged once its last sample has left (0x1, at its end time).
    end = tx_time + s.size / FS_TX
    assert wait_until(lambda: any(code == 0x1 and t is not None and abs(t - end) < 1e-6
                                  for code, t in stream.async_events()), 10.0), \
        stream.async_events()


def test_tx_late_burst_is_dropped_and_counted(
    virtual_tx: VirtualTx,
) -> None:
    stream, air, _ = virtual_tx
    assert wait_until(lambda: stream.usrp_time_now() > 0.5, 10.0)
    late_before = stream.late_bursts()
    stream.send(_unit_phase(300, 0.05, seed=2), stream.usrp_time_now() - 0.1, "late burst",
                wait_s=10.0)
    assert wait_until(lambda: stream.late_bursts() == late_before + 1, 15.0), \
        stream._proc().log_tail()
    assert any(code & 0x8 for code, _ in stream.async_events())
    # Nothing of it reached the air: the next message is the next (on-time) burst.
    s = _unit_phase(700, 0.05, seed=3)
    _send_on_time(stream, s)
    got = _recv_burst(air, 15.0)
    assert got is not None and got[0].n == 700, got


def test_tx_burst_above_max_power_is_scaled_down(
    virtual_tx: VirtualTx,
) -> None:
    stream, air, _ = virtual_tx
    s = _unit_phase(500, 0.5, seed=4)  # 0.25 * 1.25 W * 10^1.05 = 3.5 W > 0.1 W
    _send_on_time(stream, s)
    got = _recv_burst(air, 15.0)
    assert got is not None
    header, x = got
    assert header.power_w == pytest.approx(MAX_POWER_W, rel=1e-6)
    assert float(np.mean(np.abs(x.astype(np.complex128)) ** 2)) == pytest.approx(MAX_POWER_W,
                                                                                 rel=1e-4)
    ratio = x / s
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)  # scaled, not clipped sample-wise
    assert stream._proc().call("get_device_counters")["clipped_bursts"] >= 1  # type: ignore[index]


def test_tx_without_an_air_drops_and_counts(tmp_path: Path) -> None:
    require_gnuradio()
    from radio.flowgraph_process import free_tcp_port

    stream = TxStream(
        device_args="type=virtual,serial=t1", gain_db=0.0, antenna="", sample_rate_hz=FS_TX,
        center_freq_hz=915e6, clock_source="internal", time_source="internal",
        air_address=f"tcp://127.0.0.1:{free_tcp_port()}", log_dir=tmp_path,
        startup_timeout_s=120,
    )
    try:
        _send_on_time(stream, _unit_phase(100, 0.1, seed=5))
        assert wait_until(lambda: stream._proc().call("get_device_counters")["dropped"] == 1,  # type: ignore[index]
                          15.0), stream._proc().log_tail()
        assert stream.late_bursts() == 0
        assert "no air takes bursts" in (tmp_path / "tx.log").read_text()
    finally:
        stream.close()


# -- receiver ----------------------------------------------------------------------------

RX_GAIN_DB = 20.0


def test_rx_streams_the_air_from_its_start_time(tmp_path: Path) -> None:
    require_gnuradio()
    air = ChunkAir()
    air.start()
    stream = None
    try:
        stream = RxStream(
            device_args="type=virtual,serial=r0,clock_offset_s=-7", gain_db=RX_GAIN_DB,
            antenna="", sample_rate_hz=FS_RX, center_freq_hz=915e6, clock_source="internal",
            time_source="internal", ring_seconds=4.0, start_after_s=1.0,
            air_address=f"tcp://127.0.0.1:{air.port}", log_dir=tmp_path,
            startup_timeout_s=120,
        )
        assert stream.start_time == 1.0  # rx.py sets time 0, streams from 1 s after it
        assert stream._proc().call_float("get_gain") == RX_GAIN_DB
        offset, err = _device_minus_host(stream.usrp_time_now)
        # The first sample streamed is the first air sample at or after the start time.
        first = stream.read_at(stream.start_time, 1, timeout_s=15.0)
        k_first = int(air_index(first, RX_GAIN_DB)[0])
        t_first = air.t0 + k_first / FS_RX + offset  # its device time, as measured
        assert -err - 0.005 < t_first - stream.start_time < 1 / FS_RX + err + 0.005, (
            t_first, stream.start_time, err)
        # A window at a known true time, cut by device time: exactly those air samples,
        # scaled by the receive gain.
        # The first sample's rx_time tag: its exact device time (the first air sample at or
        # after the start time, less than a sample after it).
        first_anchor = stream.refresh_anchors().anchors[0]
        assert first_anchor.index == 0
        assert 0 <= first_anchor.time_s - stream.start_time < 1 / FS_RX + 1e-9
        k_mark = math.ceil((time.time() + 0.3 - air.t0) * FS_RX)
        t_mark = first_anchor.time_s + (k_mark - k_first) / FS_RX
        assert abs(t_mark - (air.t0 + k_mark / FS_RX + offset)) < err + 0.005
        y = stream.read_at(t_mark, 64, timeout_s=15.0)
        np.testing.assert_array_equal(air_index(y, RX_GAIN_DB), np.arange(k_mark, k_mark + 64))
        scale = math.sqrt(10 ** (RX_GAIN_DB / 10) / RX_FULL_SCALE_W)
        np.testing.assert_allclose(y, air_samples(k_mark, 64) * scale, rtol=1e-5, atol=1e-9)
        stream.check_mapping(stream.usrp_time_now(), "virtual rx")
        assert stream.overflows() == 0
        # A lost chunk is an overflow.
        air.skip.set()
        assert wait_until(lambda: stream.overflows() == 1, 10.0), stream._proc().log_tail()
    finally:
        if stream is not None:
            stream.close()
        air.close()


# -- the blocks themselves, on a frozen true clock (every mapping exact) ------------------

BLOCKS_QA = r'''
import math, sys, time
import numpy as np
import pmt, zmq
from gnuradio import blocks, gr
sys.path.insert(0, sys.argv[1])
from usrp_common import async_events, decode_async, subscribe_async
from virtual_usrp import async_message, time_spec, virtual_sink, virtual_source
from radio.virtual_wire import ChunkHeader, decode_burst, encode_chunk

ctx = zmq.Context.instance()
HOST = 1000.0
host = lambda: HOST  # a frozen true clock: every mapping is exact

# -- source: start time, rx_time tags, a gap --------------------------------------------
air = ctx.socket(zmq.PUSH); air.setsockopt(zmq.LINGER, 0)
port = air.bind_to_random_port("tcp://127.0.0.1")
src = virtual_source("type=virtual,serial=q0,clock_offset_s=-3", f"tcp://127.0.0.1:{port}", host)
fs = 1e4
src.set_samp_rate(fs)
src.set_gain(20.0, 0)
src.set_time_now(time_spec(100.0))  # device time = 100 + (true - 1000)
src.set_start_time(time_spec(100.5))  # true 1000.5
assert src.get_time_now().get_real_secs() == 100.0
t0 = 999.0 + 0.25e-4  # air sample k at 999.000025 + k / fs: the start falls between samples
N = 8000
tb = gr.top_block()
head = blocks.head(gr.sizeof_gr_complex, N)
sink = blocks.vector_sink_c()
tb.connect(src, head, sink)
tb.start()
deadline = time.time() + 20
chunk = 1000
k = 0
while time.time() < deadline and sink.nitems_read(0) < N:
    if k < 40000:
        if k == 20000:
            k += chunk  # a lost chunk: air indices 20000..20999 never come
        x = (np.arange(k, k + chunk) * 1e-7).astype(np.complex64)
        try:
            air.send_multipart(encode_chunk(ChunkHeader(k, t0, fs, chunk), x), zmq.NOBLOCK)
            k += chunk
        except zmq.Again:
            time.sleep(0.01)
    else:
        time.sleep(0.01)
tb.stop(); tb.wait()
y = np.array(sink.data())
assert y.size == N, y.size
scale = math.sqrt(100 / 1e-3)
idx = np.round(y.real / 1e-7 / scale).astype(int)
# First sample at device time >= 100.5: true >= 1000.5: k >= (1000.5 - t0) fs = 14999.75
assert idx[0] == 15000, idx[:3]
gap_at = 20000 - 15000
assert (idx[:gap_at] == np.arange(15000, 20000)).all()
# The 1000 samples the air never sent are missing, as after a USRP's overflow: the stream
# goes on with air sample 21000, which carries a new rx_time tag of its own time.
assert idx[gap_at] == 21000 and (np.diff(idx[gap_at:]) == 1).all()
np.testing.assert_allclose(y[:10], np.arange(15000, 15010) * 1e-7 * scale, rtol=1e-6)
tags = [(t.offset, pmt.symbol_to_string(t.key), pmt.to_python(t.value)) for t in sink.tags()]
rx = [(o, v[0] + v[1]) for o, key, v in tags if key == "rx_time"]
assert len(rx) == 2, tags  # the first sample and the first after the gap
assert rx[0][0] == 0 and abs(rx[0][1] - (100.0 + t0 + 15000 / fs - 1000.0)) < 1e-9, rx
assert 100.5 <= rx[0][1] < 100.5 + 1 / fs
assert rx[1][0] == gap_at and abs(rx[1][1] - (100.0 + t0 + 21000 / fs - 1000.0)) < 1e-9, rx
assert src.overflows == 1 and src.lost_samples == 1000, src.counters()
air.close(0)

# -- sink: a late burst, two on time, samples outside bursts, async events ---------------
pull = ctx.socket(zmq.PULL); pull.setsockopt(zmq.LINGER, 0)
port = pull.bind_to_random_port("tcp://127.0.0.1")
tx = virtual_sink("type=virtual,serial=q1,drift_ppm=100", f"tcp://127.0.0.1:{port}", host)
tx.set_samp_rate(1e5)
tx.set_center_freq(915e6, 0)
tx.set_gain(3.2, 0)  # applied 3.0
tx.set_time_now(time_spec(10.0))  # device time 10 at true 1000, 1 + 100 ppm per true s
assert tx.get_gain(0) == 3.0 and tx.get_time_last_pps(0).get_real_secs() == 10.0

def tag(offset, key, value):
    return (offset, pmt.intern(key), value)

def tt(t):
    return pmt.make_tuple(pmt.from_uint64(int(t)), pmt.from_double(t - int(t)))

s = (0.01 * np.exp(1j * np.arange(300))).astype(np.complex64)
data = np.concatenate([np.ones(7, np.complex64),  # before any burst: discarded
                       s[:100], s, 3 * s[:50]])
tags = []
for first, last, t in ((7, 106, 9.5), (107, 406, 10.0), (407, 456, 10.01)):
    tags += [tag(first, "tx_sob", pmt.PMT_T), tag(first, "tx_time", tt(t)),
             tag(last, "tx_eob", pmt.PMT_T)]


class feed(gr.sync_block):
    """The samples and tags once, then nothing (but not done: the device stays up)."""

    def __init__(self):
        gr.sync_block.__init__(self, "feed", in_sig=None, out_sig=[np.complex64])
        self.sent = False

    def work(self, input_items, output_items):
        if self.sent:
            time.sleep(0.01)
            return 0
        out = output_items[0]
        assert len(out) >= data.size
        out[:data.size] = data
        for offset, key, value in tags:
            self.add_item_tag(0, offset, key, value)
        self.sent = True
        return data.size


tb = gr.top_block()
fd = feed()  # kept: a Python block must outlive its flowgraph
tb.connect(fd, tx)
events = subscribe_async(tb, tx)
assert isinstance(events, async_events)
tb.start()
got = []
while len(got) < 2 and pull.poll(10000):
    got.append(decode_burst(pull.recv_multipart()))
deadline = time.time() + 10  # the acks: 3 and 10.5 ms (true) after true time 1000
while len(events.events()) < 3 and time.time() < deadline:
    time.sleep(0.01)
tb.stop(); tb.wait()
assert len(got) == 2, got
(h1, x1), (h2, x2) = got
a = math.sqrt(1.25 * 10 ** 0.3)
assert h1.serial == "q1" and h1.n == 300 and h1.gain_db == 3.0 and h1.center_freq_hz == 915e6
assert abs(h1.t_true_s - 1000.0) < 1e-9 and abs(h2.t_true_s - (1000 + 0.01 / 1.0001)) < 1e-9
np.testing.assert_allclose(x1, s * a, rtol=1e-5)
assert h1.power_w < 0.1 and h2.n == 50
assert tx.counters() == {"bursts_sent": 2, "late_bursts": 1, "clipped_bursts": 0,
                         "dropped": 0, "discarded": 7}, tx.counters()
assert events.late == 1, events.events()
assert [c for c, _ in events.events()] == [0x8, 0x1, 0x1], events.events()
times = [t for _, t in events.events()]
np.testing.assert_allclose(times, [10.0, 10.003, 10.0105], rtol=0, atol=1e-12)
msg = async_message(0x1 | 0x8, 12.25)
assert decode_async(msg) == (0x9, 12.25)
assert pmt.is_pair(pmt.dict_ref(pmt.cdr(msg), pmt.intern("time_spec"), pmt.PMT_NIL))
print("qa ok")
'''


def test_virtual_blocks_tag_time_and_report_async_events(tmp_path: Path) -> None:
    """virtual_source: start sample, rx_time tags (also after a gap), gain; virtual_sink:
    late/on-time bursts, drifting clock, samples outside bursts, gr-uhd's async events."""
    require_gnuradio()
    script = tmp_path / "qa_virtual.py"
    script.write_text(BLOCKS_QA)
    out = subprocess.run([SYSTEM_PYTHON, str(script), str(FLOWGRAPH_DIR)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0 and "qa ok" in out.stdout, out.stdout + out.stderr
    assert "overflow, 1000 samples missing" in out.stderr and "retagged" in out.stderr
    assert "late burst" in out.stderr


# -- building ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "block"), [("tx", "virtual_sink"), ("rx", "virtual_source")])
def test_build_only_builds_the_virtual_block_without_uhd(name: str, block: str) -> None:
    require_gnuradio()
    script = str(FLOWGRAPH_DIR / f"{name}.py")
    args = ["--build-only", "--device-args", "type=virtual,serial=v1"]
    built = subprocess.run([SYSTEM_PYTHON, script, *args, "--air-address",
                            "tcp://127.0.0.1:5999"], capture_output=True, text=True,
                           timeout=120, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    line = built.stdout.strip().splitlines()[-1]
    assert f"{name}: built" in line and block in line, line
    assert "uhd imported: no" in line and "UHD blocks: none" in line, line
    assert "virtual device: serial v1" in line, line
    refused = subprocess.run([SYSTEM_PYTHON, script, *args], capture_output=True, text=True,
                             timeout=120, check=False)
    assert refused.returncode == 2 and "--air-address" in refused.stderr.splitlines()[-1], (
        refused.stderr)
