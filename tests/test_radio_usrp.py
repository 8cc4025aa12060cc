"""The ``usrp`` link's parts that run without a radio: refusal, ring buffer, burst layout."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zmq

from radio.framing import WaveformParams
from radio.link import LinkError, LinkFailed
from radio.uhd_probe import find_usrps
from radio.usrp_link import UsrpLink, UsrpSettings, burst_header
from radio.usrp_stream import RxRing


def test_usrp_link_refuses_clearly_without_a_device() -> None:
    args = "addr=127.0.0.1"  # loopback: discovery traffic never leaves the host
    if find_usrps(args).devices:
        pytest.skip("a device answered on the loopback address")
    settings = UsrpSettings(
        tx_args=args,
        rx_args=args,
        center_freq_hz=915e6,
        sample_rate_hz=1e6,
        tx_gain_db=0.0,
        rx_gain_db=0.0,
    )
    expected = r"no USRP found for the transmitter \('addr=127\.0\.0\.1'\)"
    with pytest.raises(LinkError, match=expected):
        UsrpLink(WaveformParams(), settings)


def test_usrp_link_checks_the_sample_rate_first() -> None:
    settings = UsrpSettings(
        tx_args="",
        rx_args="",
        center_freq_hz=915e6,
        sample_rate_hz=2e6,
        tx_gain_db=0.0,
        rx_gain_db=0.0,
    )
    with pytest.raises(ValueError, match="sample rate"):
        UsrpLink(WaveformParams(), settings)


def test_rx_ring_keeps_absolute_sample_indices() -> None:
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    ring = RxRing(f"tcp://127.0.0.1:{port}", capacity=1000)
    try:
        data = np.arange(2500, dtype=np.float32).astype(np.complex64)
        for chunk in np.array_split(data, 7):
            push.send(chunk.tobytes())
        got = ring.read(2000, 300, timeout_s=5.0)
        assert np.array_equal(got, data[2000:2300])
        with pytest.raises(LinkError, match="overwritten"):
            ring.read(100, 10, timeout_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(LinkError, match="stalled"):
            ring.read(2400, 500, timeout_s=0.3)
        assert time.monotonic() - t0 < 3
    finally:
        ring.close()
        push.close(0)


def test_rx_ring_says_when_the_stream_falls_behind_rather_than_stalls() -> None:
    """Samples that keep arriving, but slower than needed, are a chain running behind the
    sample rate (an overloaded host), not a stall: the error says which."""
    import threading

    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    ring = RxRing(f"tcp://127.0.0.1:{port}", capacity=100_000)
    done = threading.Event()

    def trickle() -> None:  # 100 samples every 50 ms: progress, never enough
        while not done.wait(0.05):
            push.send(np.zeros(100, dtype=np.complex64).tobytes())

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        with pytest.raises(LinkFailed, match="fell behind.*samples still arrive"):
            ring.wait_for(50_000, timeout_s=0.2, backlog_s=1.0)
    finally:
        done.set()
        feeder.join()
        ring.close()
        push.close(0)


def test_burst_header_refuses_bad_bursts() -> None:
    with pytest.raises(ValueError):
        burst_header(0, 1.0)
    with pytest.raises(ValueError):
        burst_header(10, -1.0)
    assert burst_header(5, 1.5).dtype == np.complex64


def test_configure_usrp_applies_every_setting_and_reads_back() -> None:
    """The tx/rx device set-up, exercised with a recording stand-in for the UHD block."""
    import subprocess
    from pathlib import Path

    from tests.radio_helpers import require_gnuradio

    require_gnuradio()
    script = """
import argparse, sys
sys.path.insert(0, "flowgraphs")
from usrp_common import configure_usrp, report_applied, usrp_arguments
calls = []
class Dev:
    def __getattr__(self, name):
        return lambda *a: calls.append((name, a)) or 1.0
args = usrp_arguments(argparse.ArgumentParser()).parse_args(
    ["--samp-rate", "2e5", "--center-freq", "9.15e8", "--gain", "7", "--antenna", "TX/RX",
     "--time-source", "none"])
configure_usrp(Dev(), args)
report_applied(Dev(), "tx")
print(calls)
"""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        ["/usr/bin/python3", "-c", script], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    for expected in (
        "('set_clock_source', ('internal', 0))",
        "('set_samp_rate', (200000.0,))",
        "('set_center_freq', (915000000.0, 0))",
        "('set_gain', (7.0, 0))",
        "('set_antenna', ('TX/RX', 0))",
        "('get_samp_rate', ())",
    ):
        assert expected in out, out
    assert "set_time_source" not in out  # --time-source none leaves it alone
    assert "tx: rate 1.0 S/s" in out


def test_discovery_off_the_host_is_refused_in_the_test_suite() -> None:
    """The suite sets TESTBED_UHD_LOOPBACK_ONLY=1: lab addresses and a broadcast (empty
    args) are refused before UHD is asked; the loopback address is allowed."""
    from radio.uhd_probe import LOOPBACK_ONLY_ENV, check_loopback_only

    assert os.environ.get(LOOPBACK_ONLY_ENV) == "1"
    for args in ("addr=192.168.10.11", "", "type=usrp2", " addr = 10.0.0.2 ,type=b200"):
        with pytest.raises(RuntimeError, match="discovery would leave the host"):
            find_usrps(args)
    check_loopback_only("addr=127.0.0.1")
    check_loopback_only(" addr = 127.0.0.1 , type=usrp2")
    check_loopback_only("type=b200,serial=NOTHERE0")  # the USB bus only


@pytest.mark.parametrize("flowgraph", ["tx", "rx"])
def test_the_flowgraphs_refuse_a_lab_address_before_loading_uhd(flowgraph: str) -> None:
    """The tx and rx flowgraphs the suite starts inherit TESTBED_UHD_LOOPBACK_ONLY=1: asked
    to open a lab address they refuse before constructing a UHD block (no discovery)."""
    import subprocess
    from pathlib import Path

    from radio.flowgraph_process import SYSTEM_PYTHON
    from tests.radio_helpers import require_gnuradio

    require_gnuradio()

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [SYSTEM_PYTHON, str(root / "flowgraphs" / f"{flowgraph}.py"), "--build-only",
         "--open-device", "--device-args", "addr=192.168.10.11"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 1, out.stderr
    assert "discovery would leave the host" in out.stderr
