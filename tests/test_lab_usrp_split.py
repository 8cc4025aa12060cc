"""The lab's split ``usrp`` link without a radio: the protocol's new fields, the round's TDMA
schedule, the edge's clock exchange and over-the-air round, the aggregator's settling of a
captured reception, and a whole run (aggregator + two edges, in process, over loopback
CurveZMQ) whose bursts go through stand-in streams sharing one simulated medium.

No test here touches a device address: the transmitters' and the receiver's flowgraph
streams are stand-ins (as in ``tests/test_edge_radio.py``), and the control plane is
loopback or in process.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.lab.control_plane import ControlPlane, Peer
from aggregator.lab.remote_devices import RemoteDevices
from aggregator.lab.server import lab_loop, serve
from aggregator.lab.usrp_split import (
    INITIAL_TIMING_UNCERTAINTY_S,
    MAX_GUARD_UNCERTAINTY_S,
    burst_seconds,
    round_guard_s,
    round_slots,
    slot_lead_s,
)
from aggregator.settle import settle
from edge_device.lab.agent import EdgeAgent, EdgeError
from radio.analog import n_symbols_for, reals_to_symbols
from radio.edge_radio import MIN_LEAD_S, EdgeTransmitter
from radio.flowgraph_process import FlowgraphError
from radio.framing import device_waveform
from radio.link import LinkError, Reception
from radio.modem import modulate
from radio.slot_receiver import SlotReceiver
from radio.tdma import BURST_START_JITTER_S, SHARED_REFERENCE_GUARD_S
from radio.time_sync import OffsetEstimate
from radio.usrp_stream import RxStream, TxStream
from testbed.core.config.hardware import HardwareConfig, device_radio, receiver_radio
from testbed.core.config.loader import dump_yaml, load_experiment, load_hardware
from testbed.core.links import waveform_params
from testbed.core.privacy.ledger import intents_path
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.run_metadata import write_metadata
from testbed.core.runs.rundir import RunDir
from testbed.core.transport.curve_keys import generate_keys
from testbed.core.transport.protocol import (
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    UploadHeader,
    decode,
    encode,
)
from tests.lab_helpers import (
    RECORD_CONFIG,
    RECORD_SETS,
    assert_ledgers_agree,
    free_port,
    ledger_by_nonce,
)

#: Two devices of a record-level channel-dp run (the channel noise is credited).
SETS = [*RECORD_SETS, "devices=2", "train_samples=4000", "hw_config=lab_ota"]
#: The lab's radios with DAC headroom for a record-level upload's peaks (at the shipped
#: tx_amplitude 0.25 they reach ~0.96 of the DAC range, a fedavg upload's ~4x).
HW_SETS = ["usrp.tx_amplitude=0.1"]
#: Complex gain of the simulated medium and its noise (per sample, DAC units).
GAIN = 0.5 * np.exp(0.3j)
NOISE_VAR = 1e-4


# -- stand-ins: one medium, the transmitters' and the receiver's streams ---------------------


class _Clock:
    """A host clock: ``true`` time plus ``ahead_s``; fake (set by hand) or real."""

    def __init__(
        self, t: float | None = None, ahead_s: float = 0.0, base: _Clock | None = None
    ) -> None:
        self.t, self.ahead_s, self.base = t, ahead_s, base

    def true(self) -> float:
        if self.base is not None:
            return self.base.true()
        return time.time() if self.t is None else self.t

    def advance(self, dt: float) -> None:
        if self.base is not None:
            self.base.advance(dt)
        elif self.t is not None:
            self.t += dt

    def __call__(self) -> float:
        return self.true() + self.ahead_s


class _Air:
    """The medium: bursts at true times; a capture is their sum times GAIN plus noise."""

    def __init__(self, fs: float, seed: int = 0) -> None:
        self.fs = fs
        self.bursts: list[tuple[float, np.ndarray]] = []
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()

    def add(self, t_true: float, samples: np.ndarray) -> None:
        with self.lock:
            self.bursts.append((t_true, np.asarray(samples, np.complex128)))

    def capture(self, t_true: float, n: int) -> np.ndarray:
        with self.lock:
            out = np.sqrt(NOISE_VAR / 2) * (
                self.rng.standard_normal(n) + 1j * self.rng.standard_normal(n)
            )
            for t0, x in self.bursts:
                k = int(round((t0 - t_true) * self.fs))
                lo, hi = max(k, 0), min(k + x.size, n)
                if lo < hi:
                    out[lo:hi] += GAIN * x[lo - k : hi - k]
        return out.astype(np.complex64)


class _AirTx(TxStream):
    """A device's tx flowgraph: its USRP time is its host clock plus ``usrp_minus_host``."""

    def __init__(
        self,
        air: _Air,
        clock: _Clock,
        usrp_minus_host: float,
        on_send: Callable[[], None] | None = None,
    ) -> None:  # no flowgraph
        self.air, self.clock, self.d, self.on_send = air, clock, usrp_minus_host, on_send
        self.sent: list[tuple[np.ndarray, float]] = []
        self.dead = False
        self.late = 0  # bursts the (stand-in) USRP reported late
        self.closed = False

    def usrp_time_now(self) -> float:
        self.clock.advance(1e-4)  # each control call takes 0.1 ms
        return self.clock() + self.d

    def late_bursts(self) -> int:
        return self.late

    def check_alive(self) -> None:
        if self.dead:
            raise FlowgraphError("tx flowgraph (stand-in) exited with code 1")

    def send(self, scaled: np.ndarray, tx_time_s: float, where: str, wait_s: float) -> None:
        if self.on_send is not None:
            self.on_send()
        self.sent.append((scaled, tx_time_s))
        host = tx_time_s - self.d
        self.air.add(host - self.clock.ahead_s, scaled)  # true time of the burst

    def close(self) -> None:
        self.closed = True


class _AirRx(RxStream):
    """The receiver's rx flowgraph: a ring over the medium, from USRP time ``start_time``."""

    def __init__(self, air: _Air, clock: _Clock, usrp_minus_host: float) -> None:
        self.air, self.clock, self.d = air, clock, usrp_minus_host
        self.fs = air.fs
        self.start_time = clock() + usrp_minus_host
        self.reads: list[tuple[float, int]] = []

    @property
    def capacity_s(self) -> float:
        return 4.0

    def usrp_time_now(self) -> float:
        return self.clock() + self.d

    def check_alive(self) -> None:
        pass

    def check_mapping(self, usrp_now_s: float, where: str) -> None:
        pass

    def read_at(self, t_usrp_s: float, n: int, timeout_s: float) -> np.ndarray:
        self.reads.append((t_usrp_s, n))
        t_true = t_usrp_s - self.d - self.clock.ahead_s
        end = time.monotonic() + timeout_s
        while self.clock.true() < t_true + n / self.fs:  # real time: wait for the samples
            if time.monotonic() > end:
                raise LinkError("stand-in receiver: samples not there in time")
            time.sleep(0.01)
        return self.air.capture(t_true, n)

    def close(self) -> None:
        pass


def _receiver_factory(air: _Air, clock: _Clock, usrp_minus_host: float = -1.7e9 + 20.0) -> Any:
    def factory(
        hw: HardwareConfig,
        *,
        record_dir: Path | None,
        confidence: float,
        log_dir: Path | None,
        clock: Callable[[], float],
    ) -> SlotReceiver:
        stream = _AirRx(air, rx_clock, usrp_minus_host)
        streams.append(stream)
        return SlotReceiver(
            receiver_radio(hw),
            waveform_params(hw),
            confidence=confidence,
            record_dir=record_dir,
            clock=clock,
            stream=stream,
        )

    rx_clock = clock
    streams: list[_AirRx] = []
    factory.streams = streams  # type: ignore[attr-defined]
    return factory


# -- protocol ---------------------------------------------------------------------------------

REPORT = {
    "airtime_s": 0.06,
    "tx_power_w": 0.0997,
    "tx_time_usrp_s": 12.5,
    "timing_uncertainty_s": 1.1e-3, "slack_s": 0.2,
}


def _upload_fields(**over: Any) -> dict[str, Any]:
    header = {"device": 0, "round_index": 3, "d": 10, "n_values": 10, "alpha": 1.0}
    return {
        "device": 0,
        "round": 3,
        "nonce": "n",
        "header": header,
        "n_symbols": 5,
        "symbol_energy": 5.0,
        "train_loss": 0.5,
        "energy_comp_j": 0.1,
        "energy_comp_source": "model",
        "on_air": True,
        "tx_report": dict(REPORT),
        **over,
    }


def test_protocol_carries_slot_times_on_air_uploads_and_clock_exchanges() -> None:
    plan = {
        "device": 1,
        "round": 2,
        "nonce": "x",
        "d": 4,
        "channel": None,
        "slot": 0,
        "deadline_s": 5.0,
        "await_slot": False,
        "mechanism": None,
        "aircomp": None,
    }
    weights = bytes(32)
    assert (
        decode(encode("round", {**plan, "tx_time_s": 1.7e9 + 0.25}, weights))["tx_time_s"]
        == 1.7e9 + 0.25
    )
    assert decode(encode("round", {**plan, "tx_time_s": None}, weights))["tx_time_s"] is None
    for bad in ({**plan}, {**plan, "tx_time_s": -1.0}, {**plan, "tx_time_s": "now"}):
        with pytest.raises(ProtocolError):
            encode("round", bad, weights)
    on_air = decode(encode("upload", _upload_fields(), b""))
    assert on_air["on_air"] is True and on_air.payload == b""
    assert on_air["tx_report"] == REPORT
    symbols = bytes(16 * 5)
    assert decode(encode("upload", _upload_fields(on_air=False, tx_report=None), symbols))
    clock = decode(encode("clock", {"device": 2, "t_send": 10.5, "t_remote": 3.25}))
    assert (clock["t_send"], clock["t_remote"]) == (10.5, 3.25)
    assert decode(encode("clock_req", {"device": 2, "t_send": 10.5})).type == "clock_req"


@pytest.mark.parametrize(
    "fields,payload,why",
    [
        (_upload_fields(), bytes(16 * 5), "payload must be 0 bytes"),  # on air: no symbols
        (_upload_fields(), None, "payload must be 0 bytes, got none"),
        (_upload_fields(on_air=False, tx_report=None), b"", "payload must be 80 bytes"),
        (_upload_fields(on_air=False), bytes(80), "tx_report must be null"),
        (_upload_fields(tx_report=None), b"", "tx_report is null"),
        (_upload_fields(on_air=1), b"", "field 'on_air' is not a valid bool"),
        (_upload_fields(tx_report={**REPORT, "extra": 1.0}), b"", "unknown ['extra']"),
        (
            _upload_fields(tx_report={k: v for k, v in REPORT.items() if k != "tx_power_w"}),
            b"",
            "missing ['tx_power_w']",
        ),
        (_upload_fields(tx_report={**REPORT, "airtime_s": 0.0}), b"", "airtime_s must be > 0"),
        (_upload_fields(tx_report={**REPORT, "tx_power_w": -0.1}), b"", "tx_power_w -0.1"),
        (
            _upload_fields(tx_report={**REPORT, "timing_uncertainty_s": 2.0}),
            b"",
            "timing_uncertainty_s 2.0",
        ),
        (
            _upload_fields(tx_report={**REPORT, "tx_time_usrp_s": "soon"}),
            b"",
            "tx_time_usrp_s is not a valid float",
        ),
    ],
)
def test_protocol_refuses_inconsistent_on_air_uploads(
    fields: dict[str, Any], payload: bytes | None, why: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        encode("upload", fields, payload)
    assert why in str(info.value)


def test_protocol_refuses_malformed_clock_messages() -> None:
    for fields in (
        {"device": 0},
        {"device": 0, "t_send": "x"},
        {"device": 0, "t_send": 1.0, "t_remote": 2.0},
    ):
        with pytest.raises(ProtocolError):
            encode("clock_req", fields)
    with pytest.raises(ProtocolError, match="missing fields"):
        encode("clock", {"device": 0, "t_send": 1.0})
    nan = json.dumps(
        {"v": PROTOCOL_VERSION, "type": "clock", "device": 0, "t_send": 1.0,
         "t_remote": float("nan")}
    ).encode()
    with pytest.raises(ProtocolError):
        decode([nan])


# -- the round's schedule ---------------------------------------------------------------------


def test_round_slots_fit_each_burst_and_never_overlap() -> None:
    hw = load_hardware("lab_ota", HW_SETS)
    wf = waveform_params(hw)
    n_payload = {3: 10_920, 0: 900, 1: 4_000}
    rng = np.random.default_rng(1)
    for n in n_payload.values():  # the burst is exactly the frame modulate makes
        samples, _ = modulate(wf, rng.standard_normal(n) + 0j)
        assert burst_seconds(wf, n) == samples.size / wf.sample_rate_hz
    reported = {0: 0.4e-3, 3: 1.3e-3, 1: 0.9e-3}
    guard = round_guard_s(reported, [3, 0, 1], hw.usrp.time_source, receiver_uncertainty_s=0.1e-3)
    assert guard == pytest.approx(2 * (1.3e-3 + 0.1e-3) + BURST_START_JITTER_S)
    now, allowance = 1.7e9 + 0.123, 10.0
    slots = round_slots([3, 0, 1], n_payload, wf, guard, now, allowance)
    assert [s.device for s in slots] == [3, 0, 1]
    assert slots[0].window_start_s == pytest.approx(now + allowance)
    for s in slots:
        assert s.burst_s == burst_seconds(wf, n_payload[s.device])
        assert s.guard_s == guard
    for a, b in zip(slots, slots[1:], strict=False):
        # windows abut, never overlap (to float rounding at UNIX-time magnitudes)
        assert a.window_end_s <= b.window_start_s + 1e-6
        # a burst that starts as far off as the worst reported uncertainty stays inside
        # its own window and clear of the neighbour's burst
        worst = max(reported.values()) + 0.1e-3
        assert a.end_s + worst < b.start_s - worst
        assert a.start_s - worst > a.window_start_s and a.end_s + worst < a.window_end_s


def test_round_guard_starts_conservative_caps_and_is_fixed_with_a_shared_reference() -> None:
    jitter = BURST_START_JITTER_S
    assert round_guard_s({}, [0, 1], "internal") == pytest.approx(
        2 * INITIAL_TIMING_UNCERTAINTY_S + jitter
    )  # nobody has reported yet
    assert round_guard_s({0: 1e-4}, [0, 1], "internal") == pytest.approx(
        2 * INITIAL_TIMING_UNCERTAINTY_S + jitter
    )  # device 1 has not
    assert round_guard_s({0: 1e-5, 1: 5e-5}, [0, 1], "internal") == pytest.approx(
        SHARED_REFERENCE_GUARD_S
    )  # never below the fixed guard
    assert round_guard_s({0: 0.9}, [0], "internal") == pytest.approx(
        2 * MAX_GUARD_UNCERTAINTY_S + jitter
    )
    assert round_guard_s({0: 0.02}, [0], "external") == SHARED_REFERENCE_GUARD_S
    # a calibration's measured guard is the least any round gets, never a cap
    assert round_guard_s({0: 0.02}, [0], "external", floor_s=4e-3) == 4e-3
    assert round_guard_s({0: 0.9}, [0], "internal", floor_s=4e-3) == pytest.approx(
        2 * MAX_GUARD_UNCERTAINTY_S + jitter)


# -- the edge: clock exchange and the over-the-air round ---------------------------------------


class _Plane:
    """The aggregator's end of one edge's control plane, in process: records what the edge
    sends; answers ``clock_req`` after one-way delays ``up_s``/``down_s`` on the true clock
    (reading the aggregator's clock in between), slipping ``interleave`` messages before
    each answer."""

    def __init__(
        self,
        device: int,
        agg: _Clock,
        *,
        up_s: float = 3e-4,
        down_s: float = 7e-4,
        answer: bool = True,
        interleave: Callable[[], list[bytes]] | None = None,
    ) -> None:
        self.device, self.agg, self.up_s, self.down_s = device, agg, up_s, down_s
        self.answer, self.interleave = answer, interleave
        self.sent: list[Message] = []
        self.inbox: deque[list[bytes]] = deque()

    def send(self, frames: list[bytes], timeout_s: float = 5.0) -> None:
        msg = decode(frames)
        self.sent.append(msg)
        if msg.type != "clock_req":
            return
        if self.interleave is not None:
            self.inbox.append(self.interleave())
        if self.answer:
            self.agg.advance(self.up_s)
            self.inbox.append(
                encode(
                    "clock",
                    {"device": self.device, "t_send": msg["t_send"], "t_remote": self.agg()},
                )
            )
            self.agg.advance(self.down_s)

    def recv(self, timeout_s: float) -> list[bytes] | None:
        return self.inbox.popleft() if self.inbox else None

    def of(self, msg_type: str) -> list[Message]:
        return [m for m in self.sent if m.type == msg_type]


def test_clock_exchange_measures_the_offset_within_its_uncertainty_and_queues_the_rest(
    tmp_path: Path,
) -> None:
    agg = _Clock(1000.0)
    edge = _Clock(ahead_s=7.25, base=agg)  # this host's clock runs 7.25 s ahead
    air = _Air(1e6)
    hw = load_hardware("lab_ota", HW_SETS)
    agent = EdgeAgent("tcp://127.0.0.1:9", 0, tmp_path, tmp_path / "s", clock=edge)
    agent.air = EdgeTransmitter(
        device_radio(hw, 0), clock=edge, stream=_AirTx(air, edge, usrp_minus_host=-1007.0)
    )
    syncs = iter(range(100))
    plane = _Plane(
        0,
        agg,
        interleave=lambda: encode(
            "ack", {"device": 0, "round": next(syncs), "nonce": "q", "channel": None}
        ),
    )
    offset = agent._measure_offset(plane, hold_s=0.0)  # type: ignore[arg-type]
    assert offset.contains(-7.25)  # aggregator minus edge
    assert offset.offset_s == pytest.approx(-7.25 + (3e-4 - 7e-4) / 2, abs=1e-9)
    assert offset.uncertainty_s >= offset.rtt_s / 2 >= 5e-4
    assert agent.air.offset is offset
    exchanges = plane.of("clock_req")
    assert len(exchanges) == 8
    queued = [decode(f) for f in agent.inbox]  # what came meanwhile, in arrival order
    assert [m.type for m in queued] == ["ack"] * 8
    assert [m["round"] for m in queued] == list(range(8))
    # no answer: a clear timeout; what arrived is still queued
    agent.clock_timeout_s = 0.05
    silent = _Plane(
        0, agg, answer=False, interleave=lambda: encode("leave", {"device": 0, "reason": "x"})
    )
    with pytest.raises(TimeoutError, match="no clock reply"):
        agent._measure_offset(silent, hold_s=0.0)  # type: ignore[arg-type]
    assert decode(agent.inbox[-1]).type == "leave"


def _welcome(cfg_sets: list[str]) -> list[bytes]:
    cfg = load_experiment(RECORD_CONFIG, cfg_sets)
    return encode(
        "welcome",
        {
            "device": 0,
            "run_id": "split",
            "config_yaml": dump_yaml(cfg),
            "mask_secret": "ab" * 16,
            "next_round": 0,
            "radios": "usrp",
        },
    )


def _initial_weights(cfg: Any) -> bytes:
    """The global model of round 0 (what the aggregator sends), float64 bytes."""
    from testbed.core.models import build_model, get_flat
    from testbed.core.seeding import Stream, experiment_generator

    seed = int(experiment_generator(cfg.seed, Stream.MODEL_INIT).integers(2**31))
    model = build_model(cfg.model, (1, 28, 28), seed)
    return np.ascontiguousarray(get_flat(model), dtype="<f8").tobytes()


def test_edge_journals_before_the_air_withdraws_missed_slots_and_stops_on_a_dead_radio(
    tmp_path: Path,
) -> None:
    hw = load_hardware("lab_ota", HW_SETS)
    agg = _Clock(1.7e9)
    edge = _Clock(ahead_s=-3.5, base=agg)
    air = _Air(hw.sample_rate_hz)
    state = tmp_path / "edge-0"
    state.mkdir()
    journal = intents_path(state / "ledger.jsonl")
    seen_at_send: list[str] = []

    def on_send() -> None:  # what the journal holds when the burst is handed over
        seen_at_send.append(journal.read_text() if journal.exists() else "")

    streams: list[_AirTx] = []

    def air_factory(radio: Any, log_dir: Path) -> EdgeTransmitter:
        assert log_dir == state and radio.tx_args == "addr=192.168.10.11"
        streams.append(_AirTx(air, edge, usrp_minus_host=-1.7e9 + 50.0, on_send=on_send))
        return EdgeTransmitter(radio, clock=edge, stream=streams[-1])

    agent = EdgeAgent(
        "tcp://127.0.0.1:9", 0, tmp_path, state, hw=hw, air_factory=air_factory, clock=edge
    )
    plane = _Plane(0, agg)
    client: Any = plane
    agent.handle(client, _welcome(SETS))
    assert [m.type for m in plane.sent].count("clock_req") == 8  # measured at set-up
    assert plane.sent[-1].type == "ready" and agent.offset is not None
    d = agent.d
    weights = _initial_weights(load_experiment(RECORD_CONFIG, SETS))

    def round_msg(t: int, nonce: str, tx_time_s: float) -> list[bytes]:
        return encode(
            "round",
            {
                "device": 0,
                "round": t,
                "nonce": nonce,
                "d": d,
                "channel": None,
                "slot": 0,
                "deadline_s": 30.0,
                "tx_time_s": tx_time_s,
                "await_slot": False,
                "mechanism": None,
                "aircomp": None,
            },
            weights,
        )

    # 1. a burst due 1 s ahead: offset measured again, intent journalled, then on air
    before = len(plane.of("clock_req"))
    tx_time = agg() + 1.0
    agent.handle(client, round_msg(0, "n-0", tx_time))
    assert len(plane.of("clock_req")) == before + 8
    assert len(seen_at_send) == 1
    journalled = [json.loads(x) for x in seen_at_send[0].splitlines() if x.strip()]
    assert [x["nonce"] for x in journalled if "event" in x] == ["n-0"]
    upload = plane.sent[-1]
    assert upload.type == "upload" and upload["on_air"] is True and upload.payload == b""
    report = upload["tx_report"]
    n = n_symbols_for(agent.uplink.l)
    assert upload["n_symbols"] == n
    assert report["airtime_s"] == pytest.approx(burst_seconds(agent.waveform, n))
    assert 0 < report["tx_power_w"] <= device_radio(hw, 0).max_tx_power_w
    assert 0 < report["timing_uncertainty_s"] < 5e-3
    scaled, t_usrp = streams[0].sent[-1]
    # the slot time mapped to this host (3.5 s behind) and to its USRP
    assert t_usrp == pytest.approx(tx_time - 3.5 - 1.7e9 + 50.0, abs=report["timing_uncertainty_s"])
    agent.handle(client, encode("ack", {"device": 0, "round": 0, "nonce": "n-0", "channel": None}))
    assert agent.book is not None and "n-0" in agent.book.nonces() and not agent.pending
    # 2. a slot already (nearly) gone: nothing sent, the intent withdrawn, refused
    agent.handle(client, round_msg(1, "n-1", agg() + MIN_LEAD_S / 2))
    refuse = plane.sent[-1]
    assert refuse.type == "refuse" and "slot missed" in refuse["reason"]
    assert len(streams[0].sent) == 1 and "n-1" not in agent.pending
    lines = [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]
    assert {"nonce": "n-1", "cancelled": True} in lines
    assert any(x.get("nonce") == "n-1" and "event" in x for x in lines)  # begun first
    agent.handle(client, round_msg(1, "n-1", agg() + 1.0))  # the same request again
    assert plane.sent[-1] is refuse and agent.dropped == 1  # ignored
    # 3. the flowgraph died: intent withdrawn, refused, and the edge stops
    streams[0].dead = True
    with pytest.raises(EdgeError, match="transmitter failed"):
        agent.handle(client, round_msg(2, "n-2", agg() + 1.0))
    assert plane.sent[-1].type == "refuse" and "transmitter failed" in plane.sent[-1]["reason"]
    assert {"nonce": "n-2", "cancelled": True} in [
        json.loads(x) for x in journal.read_text().splitlines() if x.strip()
    ]
    assert agent.book.nonces() == {"n-0"}
    agent.book.close()


def test_edge_without_a_transmitter_refuses_a_slot(tmp_path: Path) -> None:
    agent = EdgeAgent("tcp://127.0.0.1:9", 0, tmp_path, tmp_path / "s")
    (tmp_path / "s").mkdir()
    plane = _Plane(0, _Clock(5.0))
    client: Any = plane
    agent.handle(client, _welcome([*SETS, "link=waveform"]))
    assert agent.air is None and plane.of("clock_req") == []
    plan = {"device": 0, "round": 0, "nonce": "n", "d": agent.d, "channel": None, "slot": 0,
            "mechanism": None, "aircomp": None, "await_slot": False}
    weights = np.zeros(agent.d, "<f8").tobytes()
    agent.handle(client, encode("round", {**plan, "deadline_s": 5.0, "tx_time_s": 100.0}, weights))
    assert plane.sent[-1].type == "refuse" and "usrp link" in plane.sent[-1]["reason"]
    assert agent.book is not None
    agent.book.close()


# -- the aggregator: schedule and settling of captured receptions -----------------------------


class _Server:
    """The CurveZMQ server's stand-in: records what the aggregator sends."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        self.sent.append(decode(frames))


def test_aggregator_settles_on_air_uploads_with_the_captured_reception(tmp_path: Path) -> None:
    cfg = load_experiment(RECORD_CONFIG, SETS)
    hw = load_hardware("lab_ota", HW_SETS)
    wf = waveform_params(hw)
    agg = _Clock(1.7e9)
    air = _Air(wf.sample_rate_hz, seed=3)
    rundir = RunDir.create(tmp_path / "run")
    write_metadata(rundir, cfg, hw)
    server = _Server()
    plane = ControlPlane(server, 2, {}, 0, clock=agg)  # type: ignore[arg-type]
    for i in range(2):
        plane.peers[i] = Peer(i, b"id%d" % i, "x", dataset_size=2000, ready=True)
    loop = lab_loop(
        cfg,
        hw,
        rundir,
        plane,
        round_timeout_s=5.0,
        train_allowance_s=2.0,
        receiver_factory=_receiver_factory(air, agg),
    )
    state, remote = loop.state, loop.devices
    assert isinstance(remote, RemoteDevices)
    link = remote.open_link(None)
    assert remote.capture is not None
    capture = remote.capture
    assert (
        capture.link is link
        and link.probe(device=0, round_index=0, n_symbols=5, rng=np.random.default_rng()) is None
    )
    slots = capture.schedule(0, [0, 1])
    guard = 2 * INITIAL_TIMING_UNCERTAINTY_S + BURST_START_JITTER_S
    assert slots[0].guard_s == pytest.approx(guard)
    assert slots[0].start_s == pytest.approx(agg() + 2.0 + guard)
    gated, rngs = loop.gate_devices(0, link, [0, 1])
    assert all(g is not None and g.n0 == 0.0 for g in gated.values())  # no credit yet
    book = state.book
    assert book is not None
    nonces = [book.begin(gated[i]) for i in range(2)]

    def settle_answer(t: int, i: int, msg: Message | None, received: Any) -> Any:
        answer = remote.check_answer(t, i, msg, received)
        return settle(state, remote, t, i, nonces[i], gated[i], answer, link, rngs[i],
                      StageTimer())

    # each edge: its own clock (2 s and 5 s behind), its offset known to 1 ms
    rng = np.random.default_rng(0)
    sent: dict[int, tuple[np.ndarray, UploadHeader, Any]] = {}
    energy: dict[int, float] = {}
    for i, behind in ((0, 2.0), (1, 5.0)):
        clock = _Clock(ahead_s=-behind, base=agg)
        tx = EdgeTransmitter(
            device_radio(hw, i),
            clock=clock,
            offset=OffsetEstimate(behind, 1e-3, 2e-3),
            stream=_AirTx(air, clock, usrp_minus_host=-1.7e9 + 10.0 * i),
        )
        alpha = float(state.uplinks[i].alpha or 1.0)
        values = rng.normal(0.0, 0.9 / (alpha * np.sqrt(2)), state.d)  # 0.81 symbol power
        symbols = alpha * reals_to_symbols(values)
        header = UploadHeader(device=i, round_index=0, d=state.d, n_values=state.d, alpha=alpha)
        report = tx.transmit(modulate(device_waveform(wf, i), symbols)[0], slots[i].start_s)
        sent[i] = (values, header, report)
        energy[i] = float(np.sum(np.abs(symbols) ** 2))
    agg.advance(3.0)  # the schedule is over
    n_payload = {i: n_symbols_for(state.uplinks[i].l) for i in range(2)}
    got = capture.link.receive(list(slots.values()), n_payload, round_index=0)
    assert all(isinstance(r, Reception) for r in got.values())

    def upload(i: int, t: int, **over: Any) -> Message:
        values, header, report = sent[i]
        fields = {
            "device": i,
            "round": t,
            "nonce": nonces[i],
            "header": {**header.to_dict(), "round_index": t},
            "n_symbols": n_payload[i],
            "symbol_energy": energy[i],
            "train_loss": 0.5,
            "energy_comp_j": 1.0,
            "energy_comp_source": "model",
            "on_air": True,
            "tx_report": {
                "airtime_s": report.airtime_s,
                "tx_power_w": report.tx_power_w,
                "tx_time_usrp_s": report.tx_time_usrp_s,
                "timing_uncertainty_s": report.timing_uncertainty_s,
                "slack_s": report.slack_s,
            },
            **over,
        }
        return decode(
            encode("upload", fields, b"" if fields["on_air"] else bytes(16 * n_payload[i]))
        )

    # device 0 uploaded and its frame was found: credited with the estimated N0
    info, vec = settle_answer(0, 0, upload(0, 0), got[0])
    rec0 = got[0]
    assert isinstance(rec0, Reception) and vec is not None
    assert info["transmitted"] is True and not info.get("lost")
    assert np.corrcoef(vec, sent[0][0])[0, 1] > 0.95
    report0 = sent[0][2]
    assert info["energy_comm_j"] == pytest.approx(report0.tx_power_w * report0.airtime_s)
    assert capture.timing_uncertainty_s[0] == report0.timing_uncertainty_s
    ledger = ledger_by_nonce(rundir.ledger_path)
    assert ledger[nonces[0]]["n0"] == pytest.approx(rec0.state.noise_var_lower / 2)
    assert ledger[nonces[0]]["n0"] > 0
    ack = server.sent[-1]
    assert ack.type == "ack" and ack["channel"]["n0"] == ledger[nonces[0]]["n0"]
    # device 1's frame arrived without its upload message: it counts, no credit
    info, vec = settle_answer(0, 1, None, got[1])
    assert vec is None and info["straggler"] and info["frame_found"] is True
    assert ledger_by_nonce(rundir.ledger_path)[nonces[1]]["n0"] == 0.0
    # round 1: an upload whose frame was not found, and one sent over the control plane
    gated, rngs = loop.gate_devices(1, link, [0, 1])
    nonces = [book.begin(gated[i]) for i in range(2)]
    info, vec = settle_answer(1, 0, upload(0, 1), LinkError("usrp link: device 0, round 1 lost"))
    assert vec is None and info["lost"] and info["energy_comm_j"] > 0
    info, vec = settle_answer(1, 1, upload(1, 1, on_air=False, tx_report=None), None)
    assert vec is None and info["lost"] and "control plane" in info["error"]
    ledger = ledger_by_nonce(rundir.ledger_path)
    assert ledger[nonces[0]]["n0"] == 0.0 and ledger[nonces[1]]["n0"] == 0.0
    link.close()
    book.close()
    rundir.close()


# -- a whole run: aggregator and two edges over loopback, bursts through the medium ------------


def test_lab_run_over_the_split_usrp_link_with_stand_in_radios(tmp_path: Path) -> None:
    """Two rounds; each edge's host clock is off the aggregator's by seconds, its USRP's
    time is its own; the aggregator decodes each burst in its slot's window."""
    keys = tmp_path / "keys"
    generate_keys(keys, 2)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    # Over hardware the budget is gated with no channel credit (known only once received):
    # a fixed noise multiplier and a loose target let both rounds through.
    cfg = load_experiment(
        RECORD_CONFIG, [*SETS, "rounds=2", "privacy.noise_multiplier=1.7", "privacy.epsilon=50"]
    )
    hw = load_hardware("lab_ota", HW_SETS)
    agg = _Clock()  # real time
    air = _Air(hw.sample_rate_hz, seed=5)
    agents = []
    for i, ahead in ((0, 2.5), (1, -4.0)):
        clock = _Clock(ahead_s=ahead)

        def air_factory(radio: Any, log_dir: Path, clock: _Clock = clock) -> EdgeTransmitter:
            stream = _AirTx(air, clock, usrp_minus_host=-clock() + 30.0)
            return EdgeTransmitter(radio, clock=clock, stream=stream)

        agents.append(
            EdgeAgent(
                endpoint,
                i,
                keys,
                tmp_path / f"edge-{i}",
                hw=hw,
                air_factory=air_factory,
                clock=clock,
            )
        )
    codes: dict[int, Any] = {}

    def run_edge(i: int) -> None:
        try:
            codes[i] = agents[i].run()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            codes[i] = exc

    threads = [threading.Thread(target=run_edge, args=(i,), daemon=True) for i in range(2)]
    for th in threads:
        th.start()
    summary = serve(
        bind=endpoint,
        keys_dir=keys,
        cfg=cfg,
        hw=hw,
        out_dir=tmp_path / "run",
        round_timeout_s=20.0,
        join_timeout_s=120.0,
        train_allowance_s=4.0,
        receiver_factory=(receivers := _receiver_factory(air, agg)),
        clock=agg,
    )
    for th in threads:
        th.join(30)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2, summary
    # each round's collision search was fed the capture's start while the slots went by
    # (reads of the capture's first samples, shorter than the whole), then the whole
    starts: dict[float, set[int]] = {}
    for t, n in receivers.streams[0].reads:
        starts.setdefault(round(t, 9), set()).add(n)
    assert sum(len(ns) >= 2 for ns in starts.values()) == 2, starts
    assert summary["link"] == "usrp" and summary["lost_uploads"] == 0
    assert codes == {0: 0, 1: 0}
    for agent, ahead in zip(agents, (2.5, -4.0), strict=True):
        assert agent.offset is not None and agent.offset.contains(-ahead)
        assert agent.uploads == 2 and agent.refusals == 0
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        for dev in line["devices"]:
            assert dev["transmitted"] is True and np.isfinite(dev["snr_db"])
            assert 0 < dev["timing_uncertainty_s"] < 5e-3
            airtime = burst_seconds(waveform_params(hw), n_symbols_for(21840))
            assert 0 < dev["energy_comm_j"] <= hw.usrp.max_tx_power_w * airtime
    # the configured slot lead until rounds have reported (aggregator/lab/slot_lead.py)
    assert [line["slot_lead_s"] for line in lines] == [slot_lead_s(hw)] * 2
    # round 0's guard is the conservative start; round 1's is sized from the reports
    assert lines[0]["tdma_guard_s"] == pytest.approx(
        2 * INITIAL_TIMING_UNCERTAINTY_S + BURST_START_JITTER_S
    )
    reported = max(dev["timing_uncertainty_s"] for dev in lines[0]["devices"])
    assert (
        2 * reported + BURST_START_JITTER_S <= lines[1]["tdma_guard_s"] < lines[0]["tdma_guard_s"]
    )
    ledger = ledger_by_nonce(tmp_path / "run" / "ledger.jsonl")
    assert len(ledger) == 4 and all(e["n0"] > 0 for e in ledger.values())  # credited
    assert_ledgers_agree(tmp_path / "run", {i: tmp_path / f"edge-{i}" for i in range(2)})


def test_train_allowance_flag_is_bounded_and_offered_by_aggregator_and_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from testbed.cli.cmd_aggregator import train_allowance
    from testbed.cli.main import main

    assert train_allowance("10") == 10.0 and train_allowance("0.5") == 0.5
    for bad in ("0", "-1", "26", "nan", "soon"):
        with pytest.raises(argparse.ArgumentTypeError, match="--train-allowance"):
            train_allowance(bad)
    for command in ("aggregator", "launch"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--train-allowance SECONDS" in capsys.readouterr().out
