"""A dead link is not a lost frame: ``LinkFailed`` vs ``LinkError``, logs, no leftovers.

A lost frame (``LinkError``) lets a run go on and count the upload as lost; a dead link
(``LinkFailed``: flowgraph exited, stream stopped, no USRP, start-up failure) must stop
it. Whatever happens, closing the link leaves no flowgraph process and no temporary log
behind; with ``log_dir`` the flowgraph's log is kept there.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from radio.flowgraph_process import FlowgraphError, FlowgraphProcess
from radio.framing import WaveformParams
from radio.gnuradio_link import GnuradioLink
from radio.link import LinkError, LinkFailed
from radio.symbol_link import ChannelParams
from radio.uhd_probe import ProbeResult, find_usrps
from radio.waveform_link import WaveformLink
from radio.zmq_stream import SampleStream, StreamTimeout
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.links import RECORDING_LINKS, make_link
from tests.radio_helpers import require_gnuradio, unit_payload

LOOPBACK_ONLY = "addr=127.0.0.1"


def _temp_logs() -> set[str]:
    """Flowgraph logs in the temporary folder (what a leak would leave)."""
    tmp = Path(tempfile.gettempdir())
    return {p.name for stem in ("channel_emulator", "tx", "rx") for p in tmp.glob(f"{stem}-*")}


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def _flowgraph_children() -> list[int]:
    """Live children of this process that run a flowgraph script."""
    me = str(os.getpid())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().split(") ")[1].split()
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z" and "flowgraphs/" in cmdline:
            found.append(int(proc.name))
    return found


def _gnuradio_link(**kwargs: object) -> GnuradioLink:
    exp = load_experiment(None, ["link=gnuradio", "snr_db=20", "devices=1"])
    link = make_link(exp, load_hardware("sim"), **kwargs)  # type: ignore[arg-type]
    assert isinstance(link, GnuradioLink)
    return link


def _fake_interpreter(tmp_path: Path, body: str) -> Path:
    """An executable standing in for /usr/bin/python3 (the flowgraph never runs)."""
    path = tmp_path / "fake_python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fail if the test leaves a flowgraph child or a temporary flowgraph log."""
    before = _temp_logs()
    yield
    deadline = time.monotonic() + 10
    while _flowgraph_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _flowgraph_children(), "a flowgraph process outlived its link"
    assert _temp_logs() - before == set(), "a temporary flowgraph log was left behind"


def test_failure_types() -> None:
    assert issubclass(LinkFailed, LinkError)
    assert issubclass(FlowgraphError, LinkFailed)


def test_killed_flowgraph_fails_the_link_and_leaves_only_its_log(
    tmp_path: Path, no_leaks: None
) -> None:
    require_gnuradio()
    logs = tmp_path / "run"
    link = _gnuradio_link(log_dir=logs)
    try:
        assert link.process is not None
        pid = link.process.pid
        os.kill(pid, signal.SIGKILL)
        link.process.proc.wait(timeout=10)
        rng = np.random.default_rng(0)
        with pytest.raises(LinkFailed) as info:
            link.transmit(device=0, round_index=3, symbols=unit_payload(500, rng), rng=rng)
        msg = str(info.value)
        assert f"channel_emulator.py (pid {pid}) died with code -9 (killed by SIGKILL)" in msg
        assert "device 0, round 3" in msg
        assert f"last lines of its log ({logs / 'channel_emulator.log'})" in msg
        assert "started:" in msg  # the tail itself, not just its name
        with pytest.raises(LinkFailed):  # dead stays dead
            link.transmit(device=0, round_index=4, symbols=unit_payload(500, rng), rng=rng)
    finally:
        link.close()
    assert not _alive(pid)
    assert (logs / "channel_emulator.log").is_file()  # kept for the run directory
    with pytest.raises(LinkFailed, match="closed"):
        link.transmit(device=0, round_index=5, symbols=unit_payload(10, rng), rng=rng)


def test_without_log_dir_nothing_is_left_behind(no_leaks: None) -> None:
    require_gnuradio()
    link = _gnuradio_link()
    assert link.process is not None
    pid = link.process.pid
    assert link.process.log_path is None
    os.kill(pid, signal.SIGKILL)
    link.process.proc.wait(timeout=10)
    rng = np.random.default_rng(1)
    with pytest.raises(LinkFailed, match="died with code -9"):
        link.transmit(device=0, round_index=0, symbols=unit_payload(500, rng), rng=rng)
    link.close()
    link.close()
    assert not _alive(pid)


def test_keyboard_interrupt_inside_the_link_stops_the_flowgraph(no_leaks: None) -> None:
    require_gnuradio()
    with pytest.raises(KeyboardInterrupt), _gnuradio_link() as link:
        assert isinstance(link, GnuradioLink) and link.process is not None
        pid = link.process.pid
        assert _alive(pid)
        raise KeyboardInterrupt
    assert not _alive(pid)


def test_interrupt_during_start_up_stops_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """Ctrl-C while waiting for the flowgraph: the half-started link cleans up."""
    started: list[int] = []

    def interrupted(self: FlowgraphProcess, timeout_s: float) -> None:
        started.append(self.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(FlowgraphProcess, "_wait_ready", interrupted)
    sleeper = _fake_interpreter(tmp_path, "exec sleep 60\n")
    with pytest.raises(KeyboardInterrupt):
        GnuradioLink(ChannelParams(snr_db=(20.0,)), WaveformParams(), python=str(sleeper))
    assert started and not _alive(started[0])


def test_flowgraph_that_fails_to_start_is_link_failed_with_its_log(
    tmp_path: Path, no_leaks: None
) -> None:
    """No GNU Radio needed: the 'interpreter' prints an error and exits 3."""
    broken = _fake_interpreter(tmp_path, "echo 'ImportError: gnuradio exploded' >&2\nexit 3\n")
    hw = load_hardware("sim", [f"gnuradio.python={broken}"])
    exp = load_experiment(None, ["link=gnuradio", "devices=1"])
    with pytest.raises(LinkFailed) as info:
        make_link(exp, hw, log_dir=tmp_path / "run")
    msg = str(info.value)
    assert msg.startswith("gnuradio link could not start: flowgraph channel_emulator.py")
    assert "exited with code 3 during start-up" in msg
    assert "ImportError: gnuradio exploded" in msg
    assert "gnuradio exploded" in (tmp_path / "run" / "channel_emulator.log").read_text()
    with pytest.raises(LinkFailed, match="exited with code 3"):
        make_link(exp, hw)  # and with a temporary log (checked by no_leaks)


def test_flowgraph_that_never_answers_is_link_failed(tmp_path: Path, no_leaks: None) -> None:
    silent = _fake_interpreter(tmp_path, "echo 'waiting forever'\nexec sleep 60\n")
    with pytest.raises(LinkFailed, match=r"(?s)did not answer .* within 1 s.*waiting forever"):
        GnuradioLink(
            ChannelParams(snr_db=(20.0,)), WaveformParams(), python=str(silent),
            startup_timeout_s=1.0,
        )


#: A "flowgraph" that answers its control calls but whose output stream never produces.
MUTE_FLOWGRAPH = """
import sys
from xmlrpc.server import SimpleXMLRPCServer
port = int(sys.argv[sys.argv.index("--xmlrpc-port") + 1])
class Mute:
    def ping(self): return "mute"
    def set_noise_voltage(self, v): return None
    def set_frequency_offset(self, v): return None
print("mute flowgraph up", flush=True)
server = SimpleXMLRPCServer(("127.0.0.1", port), allow_none=True, logRequests=False)
server.register_instance(Mute())
server.serve_forever()
"""


def test_flowgraph_whose_stream_stopped_is_link_failed(tmp_path: Path, no_leaks: None) -> None:
    """The process lives and answers, but no sample comes out: the link is dead."""
    script = tmp_path / "mute.py"
    script.write_text(MUTE_FLOWGRAPH)
    mute = _fake_interpreter(tmp_path, f'shift; exec /usr/bin/python3 {script} "$@"\n')
    link = GnuradioLink(ChannelParams(snr_db=(20.0,)), WaveformParams(), python=str(mute))
    try:
        link.stream_timeout_s = 0.5
        rng = np.random.default_rng(2)
        with pytest.raises(LinkFailed, match="produced no sample") as info:
            link.transmit(device=0, round_index=1, symbols=unit_payload(200, rng), rng=rng)
        assert "device 0, round 1" in str(info.value) and "is running" in str(info.value)
        assert link.process is not None
        pid = link.process.pid
    finally:
        link.close()
    assert not _alive(pid)


def test_stream_timeout_tells_a_silent_peer_from_a_late_upload() -> None:
    stream = SampleStream("tcp://127.0.0.1:9")  # nobody there: nothing ever comes back
    try:
        with pytest.raises(StreamTimeout) as info:
            stream.exchange(np.zeros(100, np.complex64), timeout_s=0.3)
        assert info.value.produced == 0 and info.value.received == 0
        assert info.value.expected == 100
    finally:
        stream.close()


def test_usrp_link_without_a_usrp_fails_at_start() -> None:
    """Discovery only on the loopback address: no packet leaves the host."""
    if find_usrps(LOOPBACK_ONLY).devices:
        pytest.skip("a device answered on the loopback address")
    hw = load_hardware("lab_ota", [f"usrp.tx_args={LOOPBACK_ONLY}",
                                   f"usrp.rx_args={LOOPBACK_ONLY}"])
    exp = load_experiment(None, ["link=usrp", "devices=1"])
    expected = r"no USRP found for the transmitter \('addr=127\.0\.0\.1'\)"
    with pytest.raises(LinkFailed, match=expected):
        make_link(exp, hw)


def test_usrp_link_names_the_missing_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message path for the receiver, with a finder that answers without UHD."""
    import radio.usrp_link as usrp_link

    def finder(args: str, python: str = "") -> ProbeResult:
        found = [{"type": "usrp2", "addr": "127.0.0.1"}] if args == "tx-here" else []
        return ProbeResult(found, True)

    monkeypatch.setattr(usrp_link, "find_usrps", finder)
    hw = load_hardware("lab_ota", ["usrp.tx_args=tx-here", "usrp.rx_args=rx-missing"])
    exp = load_experiment(None, ["link=usrp", "devices=1"])
    with pytest.raises(LinkFailed, match=r"no USRP found for the receiver \('rx-missing'\)"):
        make_link(exp, hw)


def test_lost_frame_is_a_link_error_naming_device_and_round() -> None:
    """A frame that cannot be found is lost, not a dead link."""
    link = WaveformLink(ChannelParams(snr_db=(-40.0,)), WaveformParams())
    rng = np.random.default_rng(0)
    with pytest.raises(LinkError) as info:
        link.transmit(device=0, round_index=7, symbols=unit_payload(300, rng), rng=rng)
    assert not isinstance(info.value, LinkFailed)
    assert str(info.value).startswith("waveform link: upload of device 0, round 7 lost: ")
    assert "no frame found" in str(info.value)


@pytest.mark.parametrize("record_dir", [True, False])
def test_record_on_the_symbol_link_is_refused(tmp_path: Path, record_dir: bool) -> None:
    exp = load_experiment(None, ["link=symbol"] + ([] if record_dir else ["record=true"]))
    with pytest.raises(ConfigError) as info:
        make_link(exp, load_hardware("sim"), tmp_path if record_dir else None)
    msg = str(info.value)
    assert "'record'" in msg and "'symbol'" in msg
    assert all(f"'{name}'" in msg for name in RECORDING_LINKS)
