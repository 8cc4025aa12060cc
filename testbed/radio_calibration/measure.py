"""``testbed radio calibrate``'s measurement: a hardware config's radios, one quantity at a
time, into a :class:`~testbed.core.config.calibration.Calibration`.

On virtual radios a private virtual air carries the bursts (:class:`PrivateAir`, as for
``testbed radio loopback --link usrp``); on USRPs every radio is first looked for and a
config whose radios are not all there is refused in one line naming the missing ones
(:class:`RadiosMissing`). Then, with the receiver streaming throughout:

1. the receiver's noise floor per gain, with nothing on the air
   (:meth:`radio.calibration.bench.Bench.noise`);
2. per transmitter, one after the other: its USRP time against the receiver's (whole
   seconds named, shared reference); a ladder of DAC amplitudes (received power against
   ``a^2``: the transmit power and where it compresses); ``bursts`` timed bursts at the
   configured amplitude (power, carrier offset, timing error against ``tx_time``, drift);
   one burst handed over late on purpose (reported late, and not on the air);
3. the stream watched until ``stream_s`` have passed: overflows and backlog.

Quantities that cannot be measured are ``None`` in the result, and
:attr:`Calibration.unmeasured` says why; faults found are in :attr:`Calibration.problems`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from radio.calibration.bench import Bench, BurstResult, LateCheck, StreamWatch, probe_symbols
from radio.calibration.estimates import (
    LADDER_MAX_SPREAD_DB,
    compression_amplitude,
    exponential_mean_interval,
    fit_drift,
    guard_needed,
    mean_interval,
    noise_floor,
    whole_seconds_off,
)
from radio.edge_radio import usrp_minus_host
from radio.modem import frame_samples, modulate
from radio.uhd_probe import ProbeResult, find_usrps
from radio.units import db_to_ratio, linear_to_db
from radio.usrp_stream import RxStream, TxStream
from radio.virtual_device import VirtualArgs
from testbed.core.config.calibration import (
    Calibration,
    DeviceCalibration,
    NoiseFloor,
    ReceiverCalibration,
)
from testbed.core.config.errors import ConfigError
from testbed.core.config.hardware import HardwareConfig, receiver_radio
from testbed.core.links import waveform_params
from testbed.core.private_air import PrivateAir

Probe = Callable[..., ProbeResult]
#: Amplitudes of the power ladder, as multiples of ``usrp.tx_amplitude``.
LADDER = (0.25, 0.5, 1.0, 2.0, 4.0)
#: Margin (factor) of the deadline over the slowest edge's measured training time.
DEADLINE_MARGIN = 1.2
#: Largest fraction of timed bursts a fading medium may hide (deep fades) before their loss
#: is a problem.
MAX_FADED_FRACTION = 0.2
#: Most a deadline may be (s): the aggregator's ``--train-allowance`` limit.
MAX_DEADLINE_S = 25.0


class RadiosMissing(RuntimeError):
    """Some of the config's USRPs were not found; the message is one line naming them."""


@dataclass(frozen=True)
class CalibrateOptions:
    """What to measure and how long (``testbed radio calibrate``'s flags).

    Attributes
    ----------
    devices
        Device ids to measure (``None``: every ``usrp.devices`` entry, or the single
        transmitter ``usrp.tx_args`` as device 0).
    attenuation_db
        Known path loss (dB) per device id (cable and attenuator; ``None`` key: every
        device): with it the transmit power is measured, without only the received power.
    bursts
        Timed bursts per transmitter at the configured amplitude (>= 3).
    n_symbols
        Payload symbols per burst.
    spacing_s, lead_s
        Seconds between bursts, and before the first.
    ladder
        Amplitudes of the power ladder, multiples of ``usrp.tx_amplitude`` (those whose
        peak would exceed the DAC's full scale are left out).
    noise_s
        Seconds of noise-only capture per receive gain.
    stream_s
        Seconds the receiver must stream in all (the overflow check).
    rx_gains_db
        Receive gains to measure the noise floor at (``None``: ``usrp.rx_gain_db``).
    rx_full_scale_w
        A real receiver's input power (W) that reads full scale at 0 dB gain (a virtual
        one's comes from its device args); ``None``: unknown (no absolute powers).
    train_times_s
        Each edge's measured training time (s) for the configured job, by device id.
    late_burst
        Send one burst late on purpose per transmitter.
    confidence
        Level of the N0 lower bound and of the intervals.
    """

    devices: list[int] | None = None
    attenuation_db: dict[int | None, float] = field(default_factory=dict)
    bursts: int = 20
    n_symbols: int = 2000
    spacing_s: float = 0.1
    lead_s: float = 1.0
    ladder: tuple[float, ...] = LADDER
    noise_s: float = 10.0
    stream_s: float = 60.0
    rx_gains_db: list[float] | None = None
    rx_full_scale_w: float | None = None
    train_times_s: dict[int, float] = field(default_factory=dict)
    late_burst: bool = True
    confidence: float = 0.95

    def check(self) -> None:
        """Refuse values the measurement cannot work with.

        Raises
        ------
        ConfigError
            Naming the option, the value and what is allowed.
        """
        checks: list[tuple[str, object, bool, str]] = [
            ("--bursts", self.bursts, 3 <= self.bursts <= 10_000, "an integer 3 .. 10000"),
            ("--burst-symbols", self.n_symbols, 200 <= self.n_symbols <= 1_000_000,
             "an integer 200 .. 1000000"),
            ("--noise-seconds", self.noise_s, 0.05 <= self.noise_s <= 3600,
             "seconds 0.05 .. 3600"),
            ("--stream-seconds", self.stream_s, 0 <= self.stream_s <= 86_400,
             "seconds 0 .. 86400"),
            ("--spacing", self.spacing_s, 0.01 <= self.spacing_s <= 10, "seconds 0.01 .. 10"),
            ("--confidence", self.confidence, 0.5 <= self.confidence < 1, "0.5 <= c < 1"),
        ]
        for flag, value, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"{flag}: got {value}; allowed: {allowed}")
        for dev, att in self.attenuation_db.items():
            if not (math.isfinite(att) and 0 <= att <= 300):
                where = "" if dev is None else f"{dev}:"
                raise ConfigError(f"--attenuation-db: got {where}{att}; allowed: 0 .. 300 dB")
        for dev, s in self.train_times_s.items():
            if not (math.isfinite(s) and 0 < s <= 3600):
                raise ConfigError(f"--train-time: got {dev}={s}; allowed: seconds in (0, 3600]")
        if self.rx_full_scale_w is not None and not 0 < self.rx_full_scale_w <= 1e3:
            raise ConfigError(f"--rx-full-scale-w: got {self.rx_full_scale_w}; allowed: "
                              "a power in (0, 1000] W")

    def attenuation(self, device: int) -> float | None:
        """The known path loss (dB) of ``device`` (``None``: not given)."""
        return self.attenuation_db.get(device, self.attenuation_db.get(None))


@dataclass(frozen=True)
class Transmitter:
    """One transmitter to measure: its device id, config key and settings."""

    device: int
    key: str
    tx_args: str
    tx_gain_db: float
    tx_antenna: str
    configured_tx_power_ref_w: float


@dataclass
class DeviceRaw:
    """What was measured of one transmitter, before it is summarised (the report's
    figures)."""

    device: int
    ladder: list[BurstResult] = field(default_factory=list)
    bursts: list[BurstResult] = field(default_factory=list)
    late: LateCheck | None = None
    tx_minus_rx_s: float | None = None  # host-read USRP times, tx minus rx (s)


@dataclass
class Measurement:
    """A calibration and the raw values behind it.

    Attributes
    ----------
    calibration
        What goes into ``CAL.yaml``.
    devices
        The raw bursts per transmitter.
    noise_blocks
        Noise power of each capture block (rx units), per receive gain.
    watch
        The stream watched for overflows.
    air_log
        The virtual air's burst log (``None`` on USRPs).
    """

    calibration: Calibration
    devices: list[DeviceRaw]
    noise_blocks: dict[float, list[float]]
    watch: StreamWatch | None
    air_log: Path | None = None


def transmitters(hw: HardwareConfig, devices: list[int] | None) -> list[Transmitter]:
    """The transmitters of ``hw`` to measure (every one when ``devices`` is ``None``).

    Raises
    ------
    ConfigError
        A device id the config has no entry for (names the configured ids).
    """
    u = hw.usrp
    if u.devices:
        all_tx = [Transmitter(e.device, f"usrp.devices[{i}].tx_args", e.tx_args, e.tx_gain_db,
                              e.tx_antenna, e.tx_power_ref_w or hw.tx_power_ref_w)
                  for i, e in enumerate(u.devices)]
    else:
        all_tx = [Transmitter(0, "usrp.tx_args", u.tx_args, u.tx_gain_db, u.tx_antenna,
                              hw.tx_power_ref_w)]
    if devices is None:
        return all_tx
    ids = {t.device for t in all_tx}
    unknown = [d for d in devices if d not in ids]
    if unknown:
        raise ConfigError(f"--devices: got {unknown}; hardware config '{hw.name}' has "
                          f"device ids {sorted(ids)}")
    return [t for t in all_tx if t.device in devices]


def missing_radios(hw: HardwareConfig, txs: list[Transmitter], probe: Probe = find_usrps
                   ) -> list[str]:
    """``KEY = 'ARGS'`` of every real radio to be measured that UHD does not find (the
    receiver first); empty on virtual radios, which are not looked for."""
    if hw.virtual:
        return []
    wanted = [("usrp.rx_args", hw.usrp.rx_args)] + [(t.key, t.tx_args) for t in txs]
    python = hw.gnuradio.python

    def found(args: str) -> bool:
        return bool(probe(args, python=python).devices)

    with ThreadPoolExecutor(max_workers=min(8, len(wanted))) as pool:
        present = list(pool.map(found, [a for _, a in wanted]))
    return [f"{key} = '{args}'" for (key, args), ok in zip(wanted, present, strict=True)
            if not ok]


def _stream_args(hw: HardwareConfig) -> dict[str, object]:
    u = hw.usrp
    shared = receiver_radio(hw).shared_time
    return {"sample_rate_hz": hw.sample_rate_hz, "center_freq_hz": hw.center_freq_hz,
            "clock_source": u.clock_source, "time_source": u.time_source,
            "time_epoch": "host-pps" if shared else "zero", "python": hw.gnuradio.python}


def rx_full_scale(hw: HardwareConfig, given: float | None) -> tuple[float | None, str]:
    """The receiver's full-scale input power at 0 dB gain (W) and where it comes from."""
    if hw.virtual:
        return (VirtualArgs.parse(hw.usrp.rx_args).rx_full_scale_w,
                "the virtual receiver's full_scale_w (device args)")
    if given is not None:
        return given, "--rx-full-scale-w (measured with a signal generator)"
    return None, ""


def calibrate(hw: HardwareConfig, opts: CalibrateOptions, *, log_dir: Path,
              probe: Probe = find_usrps, progress: Callable[[str], None] = lambda _: None,
              clock: Callable[[], float] = time.time) -> Measurement:
    """Measure ``hw``'s radios (module docstring).

    Parameters
    ----------
    hw
        The hardware config (``link`` need not be ``usrp``; its ``usrp`` section is used).
    opts
        What to measure.
    log_dir
        Where the flowgraphs' and the air's logs go.
    probe
        UHD discovery (tests pass a fake).
    progress
        Called with one line per step.
    clock
        This host's clock (s).

    Raises
    ------
    RadiosMissing
        Real radios not found (one line naming each missing ``KEY = 'ARGS'``).
    ConfigError
        Bad options.
    LinkFailed
        A flowgraph or the air failed.
    """
    opts.check()
    burst_s = frame_samples(waveform_params(hw), opts.n_symbols) / hw.sample_rate_hz
    if opts.spacing_s < burst_s + 0.02:
        raise ConfigError(f"--spacing: got {opts.spacing_s:g} s; allowed: at least the burst "
                          f"({burst_s:.3f} s for {opts.n_symbols} symbols) plus 0.02 s")
    txs = transmitters(hw, opts.devices)
    missing = missing_radios(hw, txs, probe)
    if missing:
        raise RadiosMissing(
            f"no USRP found for {', '.join(missing)} (hardware config '{hw.name}'); check "
            "power, cabling and addresses (uhd_find_devices), or calibrate a virtual config")
    log_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        air_log: Path | None = None
        if hw.virtual:
            progress("starting the virtual air")
            air = PrivateAir(hw, log_dir)
            stack.callback(air.close)
            hw = air.hw
            air_log = log_dir / "air" / "air.jsonl"
        progress(f"starting the receiver {hw.usrp.rx_args!r}")
        rradio = receiver_radio(hw)
        rx = RxStream(device_args=hw.usrp.rx_args, gain_db=hw.usrp.rx_gain_db,
                      antenna=hw.usrp.rx_antenna, ring_seconds=rradio.ring_seconds,
                      start_after_s=2.0 if rradio.shared_time else 1.0,
                      air_address=rradio.air_address, log_dir=log_dir / "rx",
                      startup_timeout_s=hw.gnuradio.startup_timeout_s,
                      **_stream_args(hw))  # type: ignore[arg-type]
        stack.callback(rx.close)
        started = clock()
        bench = Bench(rx, waveform_params(hw), shared_time=rradio.shared_time, clock=clock)
        bench.wait_streaming()
        return _measure(hw, opts, txs, bench, log_dir, started, progress, air_log)
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow


def _measure(hw: HardwareConfig, opts: CalibrateOptions, txs: list[Transmitter], bench: Bench,
             log_dir: Path, started: float, progress: Callable[[str], None],
             air_log: Path | None) -> Measurement:
    rx = bench.rx
    proc = rx.proc
    assert proc is not None
    full_scale, fs_source = rx_full_scale(hw, opts.rx_full_scale_w)
    unmeasured: list[str] = []
    problems: list[str] = []
    if full_scale is None:
        unmeasured.append("absolute powers (W): the receiver's full-scale input power is not "
                          "known; give --rx-full-scale-w (a signal generator at a known level)")
    # 1. noise floor per gain, nothing on the air
    floors: list[NoiseFloor] = []
    noise_blocks: dict[float, list[float]] = {}
    configured_gain = float(proc.call_float("get_gain"))
    for g in opts.rx_gains_db or [hw.usrp.rx_gain_db]:
        proc.call("set_gain", float(g))
        applied = float(proc.call_float("get_gain"))
        time.sleep(0.05)
        progress(f"receiver noise floor at {applied:g} dB gain: {opts.noise_s:g} s capture")
        chunks = bench.noise(opts.noise_s)
        est = noise_floor(chunks, opts.confidence)
        fs = bench.fs
        to_w = None if full_scale is None else full_scale / db_to_ratio(applied) / fs
        floors.append(NoiseFloor(
            rx_gain_db=applied, n0_sample=est.power, n0_sample_lower=est.lower,
            n0_w_per_hz=None if to_w is None else est.power * to_w,
            n0_lower_w_per_hz=None if to_w is None else est.lower * to_w,
            samples=est.samples, confidence=est.confidence))
        blocks = [float(np.mean(np.abs(c[i:i + 10_000]) ** 2))
                  for c in chunks for i in range(0, c.size - 9_999, 10_000)]
        noise_blocks[applied] = blocks
    proc.call("set_gain", configured_gain)
    rx_gain = float(proc.call_float("get_gain"))
    rx_to_w = None if full_scale is None else full_scale / db_to_ratio(rx_gain)
    # 2. each transmitter
    raws: list[DeviceRaw] = []
    entries: list[DeviceCalibration] = []
    worst: list[float] = []
    mapping_unc = 0.0
    for t in txs:
        raw, entry = _measure_device(hw, opts, t, bench, log_dir, rx_to_w, progress, problems,
                                     unmeasured)
        raws.append(raw)
        entries.append(entry)
        if entry.timing_error_worst_s is not None:
            worst.append(entry.timing_error_worst_s)
        mapping_unc = max(mapping_unc, bench.mapping_uncertainty_s)
    # 3. the stream, for stream_s in all
    progress(f"receiver: streaming until {opts.stream_s:g} s have passed (overflows)")
    watch = bench.watch(started, opts.stream_s)
    if watch.overflows:
        lost = f", {watch.lost_samples} samples lost" if watch.lost_samples >= 0 else ""
        problems.append(
            f"receiver overflow: usrp.rx_args '{hw.usrp.rx_args}' dropped samples "
            f"{watch.overflows} time(s){lost} in {watch.seconds:.1f} s at "
            f"{hw.sample_rate_hz:g} S/s (each costs the uploads whose windows it hits): check "
            "the host's load, the Ethernet link and its buffers")
    shared = receiver_radio(hw).shared_time
    guard = guard_needed(worst, shared_time=shared, mapping_uncertainty_s=mapping_unc) \
        if worst else None
    if guard is None:
        unmeasured.append("guard: no burst was found")
    elif not shared:
        unmeasured.append("guard without a shared reference: the edges' control-plane "
                          "clock offsets (their hosts' LAN round trip) are measured by each "
                          "run, not here; this guard covers this host's mappings only")
        unmeasured.append(
            "timing error against tx_time without a shared reference: its mean holds this "
            f"host's XML-RPC clock mappings (up to {1e3 * mapping_unc:.2f} ms), not only the "
            "radios'; the spread and the drift are the radios'")
    deadline = _deadline(opts.train_times_s, [t.device for t in txs], unmeasured, problems)
    receiver = ReceiverCalibration(
        rx_args=hw.usrp.rx_args, full_scale_w=full_scale, full_scale_source=fs_source,
        noise=floors, capture_s=watch.seconds, overflows=watch.overflows,
        lost_samples=max(0, watch.lost_samples), realtime_margin_s=watch.margin_s)
    if not opts.late_burst:
        unmeasured.append("late-burst report: not checked (--no-late-burst)")
    cal = Calibration(
        written_utc=datetime.now(timezone.utc), hw_config=hw.name,
        radios="virtual" if hw.virtual else "usrp", sample_rate_hz=hw.sample_rate_hz,
        center_freq_hz=hw.center_freq_hz, devices=entries, receiver=receiver,
        guard_s=guard, deadline_s=deadline, problems=problems, unmeasured=unmeasured)
    return Measurement(cal, raws, noise_blocks, watch, air_log)


def _deadline(train_times: dict[int, float], devices: list[int], unmeasured: list[str],
              problems: list[str]) -> float | None:
    if not train_times:
        unmeasured.append("deadline: no edge training time given (measure each edge's time "
                          "for the job on its host with testbed edge --calibrate CONFIG "
                          "--device-id I, and pass --train-time I=SECONDS)")
        return None
    absent = [d for d in devices if d not in train_times]
    if absent:
        unmeasured.append(f"training time of devices {absent}: not given (--train-time)")
    slowest = max(train_times.values())
    deadline = math.ceil(10 * DEADLINE_MARGIN * slowest) / 10
    if deadline > MAX_DEADLINE_S:
        problems.append(f"deadline: the slowest edge trains {slowest:.1f} s; {deadline:.1f} s "
                        f"is more than the {MAX_DEADLINE_S:g} s allowance allowed: reduce the "
                        "local work per round")
        return MAX_DEADLINE_S
    return deadline


def _measure_device(hw: HardwareConfig, opts: CalibrateOptions, t: Transmitter, bench: Bench,
                    log_dir: Path, rx_to_w: float | None, progress: Callable[[str], None],
                    problems: list[str], unmeasured: list[str]
                    ) -> tuple[DeviceRaw, DeviceCalibration]:
    who = f"device {t.device} ({t.key} '{t.tx_args}')"
    progress(f"{who}: starting its transmitter")
    air = hw.virtual_air.burst_address if hw.virtual else ""
    tx = TxStream(device_args=t.tx_args, gain_db=t.tx_gain_db, antenna=t.tx_antenna,
                  air_address=air, log_dir=log_dir / f"tx{t.device}",
                  startup_timeout_s=hw.gnuradio.startup_timeout_s,
                  **_stream_args(hw))  # type: ignore[arg-type]
    raw = DeviceRaw(t.device)
    try:
        shared = bench.shared_time
        m_tx = usrp_minus_host(tx.usrp_time_now, bench.clock)
        m_rx = bench.rx_mapping()
        raw.tx_minus_rx_s = m_tx.offset_s - m_rx.offset_s
        seconds_off = 0
        if shared:
            seconds_off = whole_seconds_off(m_tx.offset_s, m_rx.offset_s)
            if seconds_off:
                problems.append(
                    f"PPS disagreement: {who}: its USRP latched a PPS second {seconds_off:+d} s "
                    f"from the receiver's (USRP times {raw.tx_minus_rx_s:+.3f} s apart): check "
                    "its PPS cable and NTP on its host (a host clock off by more than half a "
                    "second latches the wrong second); every upload of it would be lost")
        a_cfg = hw.usrp.tx_amplitude
        s, _ = modulate(bench.waveform, probe_symbols(opts.n_symbols))
        a_max = 1.0 / float(np.max(np.abs(s)))
        amps = [f * a_cfg for f in opts.ladder if f * a_cfg <= a_max]
        progress(f"{who}: power ladder at amplitudes {', '.join(f'{a:.4g}' for a in amps)}")
        kw = {"n_symbols": opts.n_symbols, "spacing_s": opts.spacing_s, "lead_s": opts.lead_s,
              "seconds_off": seconds_off}
        raw.ladder = bench.bursts(tx, amps, **kw) if amps else []  # type: ignore[arg-type]
        progress(f"{who}: {opts.bursts} timed bursts")
        raw.bursts = bench.bursts(tx, [a_cfg] * opts.bursts, **kw)  # type: ignore[arg-type]
        if opts.late_burst:
            progress(f"{who}: one burst late on purpose")
            raw.late = bench.late_burst(tx, min(a_cfg, a_max), n_symbols=opts.n_symbols,
                                        seconds_off=seconds_off)
            if not raw.late.reported:
                problems.append(f"late burst not reported: {who}: a burst handed over after "
                                "its time raised no TIME_ERROR (async_msgs); edges cannot "
                                "withdraw late uploads on this radio")
            if raw.late.on_air:
                problems.append(f"late burst on the air: {who}: a burst handed over after its "
                                "time was radiated; it must be dropped, not sent late")
    finally:
        tx.close()
    return raw, _summarise(hw, opts, t, raw, rx_to_w, bench, problems, who, unmeasured)


def medium_fading(hw: HardwareConfig) -> str:
    """The fading the medium imposes: the virtual air's on virtual radios, else the hardware
    config's ``fading`` (a darkroom's emulator; ``none`` when not stated)."""
    if hw.virtual:
        return hw.virtual_air.fading
    return hw.fading or "none"


def _summarise(hw: HardwareConfig, opts: CalibrateOptions, t: Transmitter, raw: DeviceRaw,
               rx_to_w: float | None, bench: Bench, problems: list[str], who: str,
               unmeasured: list[str]) -> DeviceCalibration:
    sps = hw.waveform.samples_per_symbol
    a_cfg = hw.usrp.tx_amplitude
    found = [b for b in raw.bursts if b.found]
    lost = len(raw.bursts) - len(found)
    if lost:
        why = next(b.error for b in raw.bursts if not b.found)
        fading = medium_fading(hw)
        if fading != "none" and lost <= MAX_FADED_FRACTION * len(raw.bursts) \
                and why == "no frame in its window":
            # a deep fade hides a burst now and then: expected, not a fault of the radios
            unmeasured.append(f"{lost} of {len(raw.bursts)} timed bursts of {who} not found "
                              f"(through {fading} fading: deep fades); its statistics rest "
                              f"on {len(found)}")
        else:
            problems.append(f"bursts lost: {who}: {lost} of {len(raw.bursts)} timed bursts "
                            f"not found ({why})")
    att = opts.attenuation(t.device)
    base = DeviceCalibration(
        device=t.device, tx_args=t.tx_args, tx_gain_db=t.tx_gain_db, tx_amplitude=a_cfg,
        attenuation_db=att, configured_tx_power_ref_w=t.configured_tx_power_ref_w,
        bursts=len(found), late_burst=("not_checked" if raw.late is None else
                                       "reported" if raw.late.reported else "not_reported"),
        amplitudes=[b.amplitude for b in raw.ladder if b.found],
        rx_powers=[b.gain_power * b.amplitude**2 / sps for b in raw.ladder if b.found])
    if len(found) < 3:
        return base
    conf = opts.confidence
    unit = [b.gain_power * a_cfg**2 / sps for b in found]  # rx units, unit-power stream
    # Through Rayleigh fading a burst's power is exponential: its mean's interval from that
    # law (a Student-t interval on 20 such values is far too narrow when they happen low)
    p = (exponential_mean_interval(unit, conf) if medium_fading(hw) == "rayleigh"
         else mean_interval(unit, conf))
    upd: dict[str, object] = {}
    if rx_to_w is not None:
        p_w = p.mean * rx_to_w
        upd["rx_power_w"] = p_w
        upd["path_loss_db"] = float(linear_to_db(t.configured_tx_power_ref_w / p_w))
        if att is not None:
            k = db_to_ratio(att) * rx_to_w
            ref = p.mean * k
            upd |= {"tx_power_ref_w": ref, "tx_power_ref_w_lower": max(0.0, p.lower * k),
                    "tx_power_ref_w_upper": p.upper * k,
                    "gain_offset_db": float(linear_to_db(ref / t.configured_tx_power_ref_w))}
    spread_db = float(np.std(10 * np.log10(unit), ddof=1))
    ladder = [(b.amplitude, b.gain_power * b.amplitude**2 / sps, b.snr_db)
              for b in raw.ladder if b.found and b.gain_power > 0]
    if len(ladder) >= 2 and spread_db <= LADDER_MAX_SPREAD_DB:
        upd["compression_amplitude"] = compression_amplitude(
            [a for a, _, _ in ladder], [pw for _, pw, _ in ladder],
            snr_db=[q for _, _, q in ladder])
    elif len(ladder) >= 2:
        unmeasured.append(
            f"compression of device {t.device}: its received power varies {spread_db:.1f} dB "
            f"between bursts (more than {LADDER_MAX_SPREAD_DB:g} dB: fading), so one burst "
            "per amplitude cannot show where it compresses")
    if medium_fading(hw) != "none" and "tx_power_ref_w" in upd:
        unmeasured.append(
            f"tx_power_ref_w of device {t.device} through {medium_fading(hw)} fading: known "
            f"only to its interval [{upd['tx_power_ref_w_lower']:.3g}, "
            f"{upd['tx_power_ref_w_upper']:.3g}] W from {len(found)} bursts; cable the "
            "radio past the emulator, or send more bursts (--bursts), for a tighter value")
    cfo = mean_interval([b.cfo_hz for b in found], conf)
    err = np.array([b.timing_error_s for b in found])
    upd |= {"cfo_hz": cfo.mean, "cfo_std_hz": cfo.std,
            "snr_db": float(np.mean([b.snr_db for b in found])),
            "timing_error_mean_s": float(np.mean(err)),
            "timing_error_std_s": float(np.std(err, ddof=1)),
            "timing_error_worst_s": float(np.max(np.abs(err)))}
    first = found[0]
    tx_rel = [b.tx_time_s - first.tx_time_s for b in found]
    rx_rel = [(b.expected_rx_s - first.expected_rx_s) + b.timing_error_s for b in found]
    drift = fit_drift(tx_rel, rx_rel)
    upd |= {"drift_ppm": drift.drift_ppm, "drift_ppm_uncertainty": drift.uncertainty_ppm,
            "clock_offset_s": (first.tx_time_s - first.expected_rx_s) - first.timing_error_s,
            "clock_offset_uncertainty_s": max(drift.residual_s, bench.mapping_uncertainty_s)}
    if bench.shared_time and raw.tx_minus_rx_s is not None:
        upd["pps_seconds_off"] = whole_seconds_off(raw.tx_minus_rx_s, 0.0)
    return DeviceCalibration.model_validate({**base.model_dump(), **upd})
