"""The lab split's radio side without a radio: per-device config, the device check, the edge
transmitter's timing and power, and the aggregator's slot capture and decoding.

No test here sends a packet to a device address: device finders are injected, and the
flowgraph streams are stand-ins that record what they are asked to do.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edge_device.radio_check import check_edge_radio
from radio.edge_radio import MIN_LEAD_S, EdgeTransmitter, RadioUnavailable
from radio.flowgraph_process import FLOWGRAPH_DIR, SYSTEM_PYTHON
from radio.framing import device_waveform
from radio.link import LinkError, Reception
from radio.modem import modulate
from radio.slot_receiver import SlotReceiver
from radio.tdma import slot_guard_s, tdma_schedule
from radio.time_sync import OffsetEstimate, exact
from radio.uhd_probe import ProbeResult
from radio.usrp_stream import RxStream, TxStream
from testbed.cli import cmd_radio
from testbed.cli.main import main
from testbed.core.config.errors import ConfigError
from testbed.core.config.hardware import device_radio, receiver_radio, same_usrp
from testbed.core.config.loader import load_hardware
from testbed.core.links import waveform_params
from tests.radio_helpers import require_gnuradio, unit_payload

LAB_ARGS = {0: "addr=192.168.10.11", 1: "addr=192.168.10.12", 2: "addr=192.168.10.13",
            3: "addr=192.168.10.14"}


def _entry(device: int, args: str, **extra: object) -> str:
    fields = {"device": device, "tx_args": f"'{args}'", "tx_gain_db": 10, "max_tx_power_w": 0.1,
              **extra}
    return "{" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"


def _devices(*entries: str) -> list[str]:
    return [f"usrp.devices=[{', '.join(entries)}]"]


# -- per-device hardware config ----------------------------------------------------------


def test_lab_config_gives_each_device_its_own_radio() -> None:
    hw = load_hardware("lab_ota")
    radios = [device_radio(hw, d) for d in range(4)]
    assert [r.tx_args for r in radios] == [LAB_ARGS[d] for d in range(4)]
    assert [r.key for r in radios] == [f"usrp.devices[{d}]" for d in range(4)]
    assert all(r.tx_power_ref_w == hw.tx_power_ref_w for r in radios)  # inherited
    assert not any(same_usrp(r.tx_args, hw.usrp.rx_args) for r in radios)
    assert receiver_radio(hw).rx_args == hw.usrp.rx_args
    assert len(load_hardware("darkroom").usrp.devices) == 4


def test_per_device_power_reference_overrides_the_top_level_one() -> None:
    hw = load_hardware("lab_ota", _devices(_entry(5, "serial=F00D", tx_power_ref_w=0.02)))
    r = device_radio(hw, 5)
    assert r.tx_power_ref_w == 0.02 and r.tx_args == "serial=F00D"


def test_missing_device_entry_names_the_device_and_the_configured_ids() -> None:
    with pytest.raises(ConfigError) as info:
        device_radio(load_hardware("lab_ota"), 6)
    assert "device 6" in str(info.value) and "configured device ids: 0, 1, 2, 3" in str(info.value)
    with pytest.raises(ConfigError, match="device id: got -1"):
        device_radio(load_hardware("lab_ota"), -1)


def test_without_entries_every_device_falls_back_to_the_single_transmitter() -> None:
    hw = load_hardware("sim")
    r = device_radio(hw, 3)
    assert r.from_fallback and r.key == "usrp.tx_args" and r.tx_args == hw.usrp.tx_args


@pytest.mark.parametrize(
    "entries,fragments",
    [
        ((_entry(0, LAB_ARGS[0]), _entry(0, LAB_ARGS[1])),
         ["usrp.devices[1].device: got 0", "already used by usrp.devices[0]"]),
        ((_entry(0, LAB_ARGS[0]), _entry(1, " addr = 192.168.10.11 ,type=usrp2")),
         ["usrp.devices[1].tx_args", "the same USRP as usrp.devices[0]", "own per device"]),
        ((_entry(0, "addr=192.168.10.3"),),
         ["usrp.devices[0].tx_args: got 'addr=192.168.10.3'", "aggregator's receiver"]),
        ((_entry(0, LAB_ARGS[0], tx_gain_db=40),),
         ["usrp.devices[0].tx_gain_db", "got 40", "less than or equal to 31.5"]),
        ((_entry(0, LAB_ARGS[0], max_tx_power_w=0.05),),
         ["tx_power_ref_w (top level, inherited by usrp.devices[0]): got 0.1 W",
          "usrp.devices[0].max_tx_power_w = 0.05 W"]),
        ((_entry(0, LAB_ARGS[0], tx_power_ref_w=0.5),),
         ["usrp.devices[0].tx_power_ref_w: got 0.5 W"]),
        ((_entry(0, "type=usrp2"),), ["usrp.devices[0].tx_args", "must name one USRP"]),
        ((_entry(-2, LAB_ARGS[0]),), ["usrp.devices[0].device", "got -2"]),
        ((_entry(0, LAB_ARGS[0], tx_antenna="''"),), ["usrp.devices[0].tx_antenna"]),
    ],
)
def test_bad_device_entries_name_the_key_path_value_and_what_is_allowed(
    entries: tuple[str, ...], fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_hardware("lab_ota", _devices(*entries))
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_every_problem_is_listed_on_its_own_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_hardware("lab_ota", _devices(_entry(0, "addr=192.168.10.3"),
                                          _entry(0, "addr=192.168.10.3")))
    lines = str(info.value).splitlines()
    assert len(lines) == 4
    assert all(line.startswith("hardware config: usrp.devices[") for line in lines)


# -- the device check --------------------------------------------------------------------


class _Finder:
    """A device finder answering from a table; records what it was asked."""

    def __init__(self, found: dict[str, list[dict[str, str]]], uhd: bool = True) -> None:
        self.found, self.uhd, self.asked = found, uhd, []  # type: ignore[var-annotated]

    def __call__(self, args: str = "", python: str = "", timeout_s: float = 60.0) -> ProbeResult:
        self.asked.append(args)
        if not self.uhd:
            return ProbeResult([], False, "UHD is not usable under /usr/bin/python3: no uhd")
        return ProbeResult(self.found.get(args, []), True)


def test_check_edge_radio_names_the_device_and_the_args_it_tried() -> None:
    hw = load_hardware("lab_ota")
    finder = _Finder({})
    with pytest.raises(RadioUnavailable) as info:
        check_edge_radio(hw, 2, probe=finder)
    msg = str(info.value)
    assert finder.asked == [LAB_ARGS[2]]
    for fragment in ("device 2", "usrp.devices[2].tx_args = 'addr=192.168.10.13'", "cabled",
                     'uhd_find_devices --args "addr=192.168.10.13"'):
        assert fragment in msg, (fragment, msg)
    with pytest.raises(RadioUnavailable, match=r"device 1: cannot look .*install python3-uhd"):
        check_edge_radio(hw, 1, probe=_Finder({}, uhd=False))
    found = _Finder({LAB_ARGS[3]: [{"type": "usrp2", "addr": "192.168.10.14"}]})
    assert check_edge_radio(hw, 3, probe=found).tx_args == LAB_ARGS[3]


def test_check_edge_radio_does_not_probe_on_simulated_links() -> None:
    def never(*args: object, **kwargs: object) -> ProbeResult:
        raise AssertionError("probed on a simulated link")

    assert check_edge_radio(load_hardware("lab_ota"), 1, probe=never, link="gnuradio").device == 1
    assert check_edge_radio(load_hardware("sim"), 7, probe=never).from_fallback


def test_check_edge_radio_refuses_the_single_transmitter_for_a_second_device() -> None:
    hw = load_hardware("lab_ota", ["usrp.devices=[]"])
    finder = _Finder({hw.usrp.tx_args: [{"type": "usrp2"}]})
    assert check_edge_radio(hw, 0, probe=finder).from_fallback
    with pytest.raises(RadioUnavailable, match="device 1: .* lists no usrp.devices"):
        check_edge_radio(hw, 1, probe=finder)


def test_transmitter_and_receiver_refuse_before_starting_anything_without_a_usrp() -> None:
    hw = load_hardware("lab_ota")
    with pytest.raises(RadioUnavailable, match="device 0: no USRP found"):
        EdgeTransmitter(device_radio(hw, 0), probe=_Finder({}))
    with pytest.raises(RadioUnavailable, match=r"aggregator receiver: no USRP .*usrp.rx_args"):
        SlotReceiver(receiver_radio(hw), waveform_params(hw), probe=_Finder({}))


# -- the edge transmitter ----------------------------------------------------------------


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _FakeTx(TxStream):
    """The tx flowgraph's stand-in: a USRP clock at host + ``usrp_minus_host``."""

    def __init__(self, clock: _Clock, usrp_minus_host: float) -> None:  # no flowgraph
        self.clock, self.d = clock, usrp_minus_host
        self.sent: list[tuple[np.ndarray, float]] = []
        self.late = 0  # bursts the (stand-in) USRP reported late
        self.closed = False

    def usrp_time_now(self) -> float:
        self.clock.t += 1e-4  # each control call takes 0.1 ms
        return self.clock.t + self.d

    def late_bursts(self) -> int:
        return self.late

    def check_alive(self) -> None:
        pass

    def send(self, scaled: np.ndarray, tx_time_s: float, where: str, wait_s: float) -> None:
        self.sent.append((scaled, tx_time_s))

    def close(self) -> None:
        self.closed = True


def _burst(hw_name: str = "lab_ota", n: int = 2000, power: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(0)
    samples, _ = modulate(waveform_params(load_hardware(hw_name)), np.sqrt(power) *
                          unit_payload(n, rng))
    return samples


def test_edge_burst_time_goes_through_the_offset_and_the_usrp_clock() -> None:
    radio = device_radio(load_hardware("lab_ota"), 1)
    clock = _Clock(5000.0)
    tx = _FakeTx(clock, usrp_minus_host=-4990.0)  # USRP time 0 at start-up, 10 s ago
    edge = EdgeTransmitter(radio, clock=clock, stream=tx)
    x = _burst()
    with pytest.raises(ValueError, match="set_offset"):
        edge.transmit(x, 6000.0)
    offset = OffsetEstimate(offset_s=1000.0, uncertainty_s=2e-3, rtt_s=4e-3)  # agg - edge
    edge.set_offset(offset)
    report = edge.transmit(x, tx_time_s=6000.25)  # aggregator time
    scaled, t_usrp = tx.sent[-1]
    assert t_usrp == pytest.approx(6000.25 - 1000.0 - 4990.0, abs=1e-3)
    assert np.allclose(scaled, x * radio.tx_amplitude)
    assert report.lead_s == pytest.approx(0.25, abs=1e-3)
    assert report.airtime_s == pytest.approx(x.size / 1e6)
    assert report.timing_uncertainty_s == pytest.approx(2e-3, abs=2e-4)
    # A unit-power payload with unit-power preamble and pilots radiates tx_power_ref_w.
    assert report.tx_power_w == pytest.approx(radio.tx_power_ref_w, rel=0.05)
    half = edge.transmit(_burst(power=0.25), tx_time_s=6000.5)
    assert 0.2 * radio.tx_power_ref_w < half.tx_power_w < 0.5 * radio.tx_power_ref_w
    edge.close()
    assert tx.closed and edge.stream is None


def test_edge_refuses_late_far_loud_and_clipped_bursts_without_sending() -> None:
    hw = load_hardware("lab_ota", _devices(_entry(0, LAB_ARGS[0], max_tx_power_w=0.1,
                                                  tx_power_ref_w=0.05)))
    radio = device_radio(hw, 0)
    clock = _Clock(100.0)
    tx = _FakeTx(clock, usrp_minus_host=0.0)
    edge = EdgeTransmitter(radio, offset=exact(), clock=clock, stream=tx)
    x = _burst()
    with pytest.raises(LinkError, match="slot missed"):
        edge.transmit(x, 100.0 + MIN_LEAD_S / 2)
    with pytest.raises(ValueError, match="time base"):
        edge.transmit(x, 100.0 + 3600.0)
    with pytest.raises(LinkError, match=r"mean power .* exceeds usrp.devices\[0\].max_tx_power_w"):
        edge.transmit(_burst(power=4.0), 101.0)
    spike = _burst(n=20000)
    spike[100] = 1.05 / radio.tx_amplitude  # one sample past full scale, mean power +12%
    with pytest.raises(LinkError, match="DAC range"):
        edge.transmit(spike, 101.0)
    assert tx.sent == []


def test_a_burst_the_usrp_reports_late_is_not_sent() -> None:
    """confirm() waits for the burst's end on the host clock, then reads the USRP's late
    reports (UHD's TIME_ERROR): one more than before the burst means it never left."""
    radio = device_radio(load_hardware("lab_ota"), 0)
    clock = _Clock(100.0)
    tx = _FakeTx(clock, usrp_minus_host=-90.0)
    edge = EdgeTransmitter(radio, offset=exact(), clock=clock, stream=tx)
    x = _burst()
    report = edge.transmit(x, 100.5)
    # The burst ends at host time 100.5 + airtime (the USRP is 90 s behind the host).
    assert report.end_host_s == pytest.approx(100.5 + x.size / 1e6, abs=1e-3)
    clock.t = report.end_host_s + 1.0  # past it: no wait
    edge.confirm(report)  # no late report: sent
    report = edge.transmit(x, clock.t + 0.5)
    tx.late += 1  # the USRP found it past its time
    clock.t = report.end_host_s + 1.0
    with pytest.raises(LinkError, match="reported it late"):
        edge.confirm(report)


def test_shared_reference_passes_slot_times_through_and_checks_the_latch() -> None:
    hw = load_hardware("darkroom")
    radio = device_radio(hw, 2)
    clock = _Clock(1.7e9)
    tx = _FakeTx(clock, usrp_minus_host=0.3)  # latched to the host's second, 0.3 s apart
    edge = EdgeTransmitter(radio, clock=clock, stream=tx)
    report = edge.transmit(_burst("darkroom"), tx_time_s=1.7e9 + 1.0)
    assert tx.sent[-1][1] == 1.7e9 + 1.0 and report.timing_uncertainty_s == 0.0
    # The aggregator's USRP latched the same second: agrees within the offset's uncertainty.
    edge.set_offset(OffsetEstimate(0.002, 1e-3, 2e-3), receiver_usrp_minus_host_s=0.298)
    with pytest.raises(RadioUnavailable, match="different seconds"):
        edge.set_offset(OffsetEstimate(0.002, 1e-3, 2e-3), receiver_usrp_minus_host_s=-0.702)
    with pytest.raises(RadioUnavailable, match="PPS cable"):
        EdgeTransmitter(radio, clock=clock, stream=_FakeTx(clock, usrp_minus_host=-1.7e9))


# -- the aggregator's slot receiver ------------------------------------------------------


class _FakeRx(RxStream):
    """The rx flowgraph's stand-in: a finished capture starting at USRP time ``start``."""

    def __init__(self, capture: np.ndarray, start: float, fs: float, clock: _Clock,
                 usrp_minus_host: float) -> None:  # no flowgraph
        self.capture, self.start_time, self.fs = capture, start, fs
        self.clock, self.d = clock, usrp_minus_host
        self.reads: list[tuple[float, int]] = []

    @property
    def capacity_s(self) -> float:
        return 4.0

    def usrp_time_now(self) -> float:
        return self.clock.t + self.d

    def check_alive(self) -> None:
        pass

    def check_mapping(self, usrp_now_s: float, where: str) -> None:
        pass

    def read_at(self, t_usrp_s: float, n: int, timeout_s: float) -> np.ndarray:
        self.reads.append((t_usrp_s, n))
        i = int(round((t_usrp_s - self.start_time) * self.fs))
        return self.capture[i:i + n].copy()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("hw_name", ["lab_ota", "darkroom"])
def test_slot_receiver_cuts_each_devices_window_and_decodes_its_own_frame(hw_name: str) -> None:
    """Four bursts at their slot times (each off by up to the guard), noise, one capture.

    lab_ota: no shared reference, schedule on the aggregator host's clock, USRP time 0 at
    start-up. darkroom: shared PPS, schedule in USRP time (latched to the host's second).
    """
    hw = load_hardware(hw_name, ["waveform.speed_kmh=0"])
    wf = waveform_params(hw)
    fs = wf.sample_rate_hz
    rng = np.random.default_rng(7)
    devices, n_payload = [2, 0, 3, 1], {0: 900, 1: 1500, 2: 600, 3: 1200}
    payloads = {d: unit_payload(n_payload[d], rng) for d in devices}
    frames = {d: modulate(device_waveform(wf, d), payloads[d])[0] for d in devices}
    shared = receiver_radio(hw).shared_time
    assert shared == (hw_name == "darkroom")
    d_rx = 0.2 if shared else -(1.7e9 - 20.0)  # receiver USRP time minus host time

    def usrp(t_schedule: float) -> float:
        return t_schedule if shared else t_schedule + d_rx

    guard = slot_guard_s(1e-3, hw.usrp.time_source)
    start = 1.7e9 + 0.5
    slots = tdma_schedule(devices, {d: frames[d].size / fs for d in devices}, guard, start)
    t_cap0 = usrp(slots[0].window_start_s) - 0.05  # USRP time of the capture's sample 0
    n = int((slots[-1].window_end_s - slots[0].window_start_s + 0.1) * fs)
    n0 = 10 ** (-25 / 10)
    capture = np.sqrt(n0 / 2) * (rng.standard_normal(n) + 1j * rng.standard_normal(n))
    for s in slots:
        late = rng.uniform(-0.9, 0.9) * guard
        i = int(round((usrp(s.start_s + late) - t_cap0) * fs))
        capture[i:i + frames[s.device].size] += 0.8 * frames[s.device]
    end = slots[-1].window_end_s + 0.2
    clock = _Clock(end - d_rx if shared else end)  # the host clock once the round is over
    rx = _FakeRx(capture.astype(np.complex64), t_cap0, fs, clock, d_rx)
    receiver = SlotReceiver(receiver_radio(hw), wf, clock=clock, stream=rx)
    assert receiver.now_s() == pytest.approx(end, abs=1e-6)
    windows = receiver.receive(slots, round_index=4)
    assert len(rx.reads) == 1  # one capture for the round
    assert rx.reads[0][0] == pytest.approx(usrp(slots[0].window_start_s), abs=1e-3)
    assert set(windows) == set(devices)
    for s in slots:
        assert windows[s.device].size == pytest.approx((s.burst_s + 2 * guard) * fs, abs=1)
        rec = receiver.decode(windows[s.device], n_payload[s.device], device=s.device,
                              round_index=4)
        assert isinstance(rec, Reception) and rec.state.estimated
        x = payloads[s.device]
        nmse = np.mean(np.abs(rec.symbols / rec.state.gain - x) ** 2)
        assert nmse < 10 ** (-15 / 10), (s.device, nmse)  # its own frame, not a neighbour's
    results = receiver.receive_all(slots, n_payload, round_index=4)
    assert all(isinstance(r, Reception) for r in results.values())


def _two_slot_capture(
    bursts: dict[int, tuple[float, float]], n_payload: int = 800, devices: tuple[int, int] = (0, 1),
) -> tuple[SlotReceiver, list, dict[int, np.ndarray]]:
    """Devices ``devices`` in two TDMA slots; ``bursts[d] = (start offset in samples from
    the first slot's start, amplitude)`` places device ``d``'s frame in a noisy capture
    (each with its own carrier offset and phase)."""
    hw = load_hardware("lab_ota")
    wf = waveform_params(hw)
    fs = wf.sample_rate_hz
    rng = np.random.default_rng(3)
    x = {d: modulate(device_waveform(wf, d), unit_payload(n_payload, rng))[0] for d in devices}
    guard = slot_guard_s(1e-3, hw.usrp.time_source)
    slots = tdma_schedule(list(devices), x[devices[0]].size / fs, guard, start_s=90.05)
    n = int((slots[-1].window_end_s - 90.0 + 0.05) * fs)
    capture = 0.03 * (rng.standard_normal(n) + 1j * rng.standard_normal(n))
    i0 = int(round((slots[0].start_s - 90.0) * fs))
    for d, (shift, amplitude) in bursts.items():
        k = np.arange(x[d].size)
        cfo = 900.0 if d == devices[0] else -1300.0
        capture[i0 + shift:i0 + shift + x[d].size] += (
            amplitude * np.exp(1j * (0.7 * d + 2 * np.pi * cfo * k / fs)) * x[d])
    clock = _Clock(100.0)
    rx = _FakeRx(capture.astype(np.complex64), 0.0, fs, clock, -90.0)  # USRP = host - 90
    return SlotReceiver(receiver_radio(hw), wf, clock=clock, stream=rx), slots, x


@pytest.mark.parametrize(("periods", "db"), [(0.0, 0.0), (0.5, 0.0), (1.5, -3.0), (2.5, 0.0),
                                             (20.0, -3.0)])
def test_two_frames_in_one_slot_are_a_collision_not_an_upload(periods: float, db: float) -> None:
    """Device 1 transmits in device 0's slot, starting ``periods`` preamble repetitions after
    it, ``db`` below it. With one preamble for all, device 0's window decoded a mixture with
    a clean-looking SNR (measured through the virtual air: 4.5 dB above its link budget)
    and credited the other's signal as noise. With a preamble root per device the receiver
    finds device 1's frame over device 0's and reports device 0's upload lost (device 1's own
    window holds nothing). Before the search covered every position, a frame starting
    within two repetitions of a stronger one was not a candidate of its own and went unseen
    (1.5 periods at -6 dB, and any weaker frame over the other's payload)."""
    wf = waveform_params(load_hardware("lab_ota"))
    shift = int(periods * wf.zc_length * wf.samples_per_symbol)
    receiver, slots, _ = _two_slot_capture({0: (0, 0.8), 1: (shift, 0.8 * 10 ** (db / 20))})
    out = receiver.receive_all(slots, {0: 800, 1: 800}, round_index=5)
    assert isinstance(out[0], LinkError) and "collision: device 1's frame" in str(out[0])
    assert isinstance(out[1], LinkError) and "lost" in str(out[1])
    # Alone in its slot, the same frame is device 0's upload.
    alone, _, _ = _two_slot_capture({0: (0, 0.8)})
    assert isinstance(alone.receive_all(slots[:1], {0: 800}, round_index=5)[0], Reception)


def test_a_late_frame_over_the_next_devices_is_a_collision_for_both() -> None:
    """Device 0's burst is late by more than the guard: its preamble is in its own window,
    its tail over device 1's frame in the next one. Device 1's window holds no other
    preamble, so a search of each window alone (as before) missed it; device 1's upload is
    a collision, device 0's frame runs out of its window (lost)."""
    receiver, slots, x = _two_slot_capture({0: (0, 0.8), 1: (0, 0.8)})
    fs = receiver.waveform.sample_rate_hz
    gap = int(round((slots[1].start_s - slots[0].start_s) * fs))
    guard = int(round(slots[1].guard_s * fs))
    # Device 0's preamble ends before device 1's window opens; its last 2,500 samples
    # lie over device 1's frame.
    late = gap - x[0].size + 2500
    wf = receiver.waveform
    assert late + (wf.guard_symbols + wf.preamble.size) * wf.samples_per_symbol < gap - guard
    receiver, slots, _ = _two_slot_capture({0: (late, 0.8), 1: (gap, 0.8)})
    out = receiver.receive_all(slots, {0: 800, 1: 800}, round_index=2)
    assert isinstance(out[1], LinkError) and "collision: device 0's frame" in str(out[1])
    assert isinstance(out[0], LinkError)
    on_time, slots, _ = _two_slot_capture({0: (0, 0.8), 1: (gap, 0.8)})
    assert all(isinstance(r, Reception)
               for r in on_time.receive_all(slots, {0: 800, 1: 800}, round_index=2).values())


def test_devices_that_share_a_root_are_not_a_collision() -> None:
    """Devices 0 and 34 share a preamble root (34 roots for length 37). Each on time in its
    own slot: before, device 0's window held 'device 34's frame' (its own) and every device
    of a round of more than 34 was lost."""
    assert device_waveform(waveform_params(load_hardware("lab_ota")), 34).zc_root == \
        device_waveform(waveform_params(load_hardware("lab_ota")), 0).zc_root
    receiver, slots, _ = _two_slot_capture({0: (0, 0.8)}, devices=(0, 34))
    gap = int(round((slots[1].start_s - slots[0].start_s) * receiver.waveform.sample_rate_hz))
    receiver, slots, _ = _two_slot_capture({0: (0, 0.8), 34: (gap, 0.8)}, devices=(0, 34))
    out = receiver.receive_all(slots, {0: 800, 34: 800}, round_index=1)
    assert all(isinstance(r, Reception) for r in out.values()), out


def test_slot_receiver_reports_a_lost_frame_per_device_and_refuses_long_schedules() -> None:
    hw = load_hardware("lab_ota")
    wf = waveform_params(hw)
    clock = _Clock(100.0)
    rx = _FakeRx(np.zeros(400_000, np.complex64), 0.0, wf.sample_rate_hz, clock, -90.0)
    receiver = SlotReceiver(receiver_radio(hw), wf, clock=clock, stream=rx)
    slots = tdma_schedule([0, 1], 0.05, 1e-3, start_s=90.05)
    out = receiver.receive_all(slots, {0: 500, 1: 500}, round_index=2)
    assert isinstance(out[0], LinkError) and "device 0, round 2 lost" in str(out[0])
    with pytest.raises(LinkError, match="before the receiver's stream"):
        receiver.receive(tdma_schedule([0], 0.05, 1e-3, start_s=89.0))
    with pytest.raises(ValueError, match="ring_seconds"):
        receiver.receive(tdma_schedule(list(range(100)), 0.05, 1e-3, 90.0))


# -- testbed radio check ----------------------------------------------------------------


@pytest.fixture
def no_builds(monkeypatch: pytest.MonkeyPatch) -> _Finder:
    """radio check without flowgraph builds, with a device finder that finds nothing."""
    finder = _Finder({})
    monkeypatch.setattr(cmd_radio, "find_usrps", finder)
    monkeypatch.setattr(cmd_radio, "gnuradio_available", lambda python: (True, "3.10 (stub)"))
    monkeypatch.setattr(cmd_radio, "_build_check",
                        lambda name, args, hw, opened: cmd_radio._check(f"build {name}", "ok",
                                                                         " ".join(args)))
    monkeypatch.setattr(cmd_radio, "_grcc", lambda name, outdir: "skipped")
    return finder


def test_radio_check_shows_one_row_per_device_and_the_guard(
    no_builds: _Finder, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["radio", "check", "lab_ota", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {c["check"]: c for c in out["checks"]}
    for d in range(4):
        row = rows[f"edge device {d}"]
        assert row["ok"] is True and LAB_ARGS[d] in row["detail"] and "not opened" in row["detail"]
        assert "gain 30 dB" in row["detail"] and "0.1 W <= max 0.1 W" in row["detail"]
    assert "4 devices (ids 0, 1, 2, 3)" in rows["edge devices"]["detail"]
    assert "1.20 ms" in rows["tdma guard"]["detail"]
    assert no_builds.asked == []  # nothing looked for, no device address touched
    assert main(["radio", "check", "darkroom"]) == 0
    assert "fixed guard 0.50 ms" in capsys.readouterr().out


def test_radio_check_on_a_device_host_looks_for_that_device_only(
    no_builds: _Finder, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["radio", "check", "lab_ota", "--device", "1", "--open-devices"])
    text = capsys.readouterr().out
    assert rc == 1, text
    assert no_builds.asked == [LAB_ARGS[1]]
    assert "[FAIL] edge device 1: no USRP found for 'addr=192.168.10.12'" in text
    assert "device tx" not in text and "device rx" not in text
    assert text.splitlines()[-1] == (
        "no device found: no USRP for device 1 ('addr=192.168.10.12') (see 'testbed radio probe')"
    )
    assert "--device-args addr=192.168.10.12" in text  # tx built with this device's args
    assert main(["radio", "check", "lab_ota", "--device", "9"]) == 2
    assert "configured device ids: 0, 1, 2, 3" in capsys.readouterr().err


def test_radio_check_refuses_duplicate_device_args(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "dup.yaml"
    text = (Path(__file__).resolve().parents[1] / "hw_configs" / "lab_ota.yaml").read_text()
    cfg.write_text(text.replace("192.168.10.12", "192.168.10.11"))
    assert main(["radio", "check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "usrp.devices[1].tx_args: got 'addr=192.168.10.11', the same USRP as " \
           "usrp.devices[0].tx_args" in err


# -- the flowgraphs' PPS latch (GNU Radio's interpreter, a stand-in device) -----------------

LATCH_QA = r"""
import argparse, sys
sys.path.insert(0, sys.argv[1])
from usrp_common import latch_host_time_at_pps, set_usrp_time, time_epoch_problem, usrp_arguments

class Spec:
    def __init__(self, t): self.t = t
    def get_real_secs(self): return self.t

class Dev:
    '''PPS edges at host times k + 0.3; the host clock advances with each sleep.'''
    def __init__(self, clock):
        self.clock, self.pending, self.base, self.calls = clock, None, 0.0, []
    def _edges(self): return int(self.clock[0] - 0.3)
    def get_time_last_pps(self, mboard=0):
        k = self._edges()
        if self.pending is not None and k > self.pending[1]:
            self.base = self.pending[0] - k
            self.pending = None
        return Spec(self.base + k)
    def set_time_next_pps(self, spec):
        self.calls.append(("next_pps", spec.t)); self.pending = (spec.t, self._edges())
    def set_time_now(self, spec): self.calls.append(("now", spec.t))
    def get_time_now(self): return Spec(-1.0)

clock = [1000.95]
def sleep(dt): clock[0] += dt
dev = Dev(clock)
epoch = latch_host_time_at_pps(dev, Spec, clock=lambda: clock[0], sleep=sleep)
assert epoch == 1002.0, epoch                      # edge seen at ~1001.3, next one = 1002
assert abs(dev.get_time_last_pps().get_real_secs() - 1002.0) < 1e-9
assert 1002.3 <= clock[0] < 1002.4, clock[0]      # returned right after the latched edge
class Dead(Dev):
    def get_time_last_pps(self, mboard=0): return Spec(5.0)
try:
    latch_host_time_at_pps(Dead(clock), Spec, clock=lambda: clock[0], sleep=sleep)
    raise SystemExit("no error without PPS")
except RuntimeError as exc:
    assert "no PPS edge" in str(exc) and "PPS cable" in str(exc), exc
p = usrp_arguments(argparse.ArgumentParser())
zero = p.parse_args(["--time-source", "external"])
for pps, call in ((False, ("now", 0.0)), (True, ("next_pps", 0.0))):
    clock[0] = 1000.95
    d = Dev(clock); assert set_usrp_time(d, zero, Spec, zero_at_pps=pps, sleep=sleep) == 0.0
    assert d.calls == [call], d.calls
    if pps:  # returned once the edge passed: the time read now is the new count (0 + ...)
        assert 1001.3 <= clock[0] < 1001.4, clock[0]
        assert d.get_time_last_pps().get_real_secs() == 0.0
mimo = p.parse_args(["--time-source", "mimo", "--time-epoch", "host-pps"])
d = Dev(clock); assert set_usrp_time(d, mimo, Spec, zero_at_pps=False) == -1.0 and d.calls == []
assert time_epoch_problem(p.parse_args(["--time-epoch", "host-pps"]))
print("latch ok")
"""


@pytest.mark.gnuradio
def test_flowgraphs_latch_the_host_second_at_a_pps_edge(tmp_path: Path) -> None:
    require_gnuradio()
    script = tmp_path / "qa_latch.py"
    script.write_text(LATCH_QA)
    out = subprocess.run([SYSTEM_PYTHON, str(script), str(FLOWGRAPH_DIR)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0 and "latch ok" in out.stdout, out.stdout + out.stderr
    for name in ("tx", "rx"):
        built = subprocess.run(
            [SYSTEM_PYTHON, str(FLOWGRAPH_DIR / f"{name}.py"), "--build-only", "--time-epoch",
             "host-pps", "--time-source", "external"],
            capture_output=True, text=True, timeout=120, check=False)
        assert built.returncode == 0 and "uhd imported: no" in built.stdout, built.stderr
        refused = subprocess.run(
            [SYSTEM_PYTHON, str(FLOWGRAPH_DIR / f"{name}.py"), "--build-only", "--time-epoch",
             "host-pps"], capture_output=True, text=True, timeout=120, check=False)
        assert refused.returncode == 2 and "needs a shared PPS" in refused.stderr
