"""Typed, validated hardware configuration (``hw_configs/*.yaml``).

A hardware config says which link carries the uploads and how the radio is set up. The
same experiment config runs over any of them; only the link changes.

Sections (all optional, defaults shown in ``hw_configs/sim.yaml``):

``waveform``
    Frame numerology (pulse, preamble, pilots) and the impairments the emulated links
    apply (Doppler speed, frequency / timing / sample-rate offsets). Used by the
    ``waveform``, ``gnuradio`` and ``usrp`` links.
``gnuradio``
    The channel-emulator flowgraph process (seeds, interpreter, start-up limit).
``usrp``
    Device arguments, frequency, gains, power limit, clock and time source of a
    USRP (N210 + WBX in the paper's lab). ``usrp.tx_args`` is the one transmitter of the
    single-process ``usrp`` link; ``usrp.devices`` lists each edge device's own
    transmitter for the lab split (one edge process per Jetson, :func:`device_radio`).

Types are strict as in :mod:`testbed.core.config.experiment`: no booleans or strings for
numbers, no integers for booleans, every number finite. Rates and powers have upper bounds
so later arithmetic cannot overflow: ``symbol_rate_hz <= 1e9``, ``tx_power_ref_w <= 100`` W,
``coherence_symbols <= 1e12``, ``snr_sweep_db`` values in [-50, 100] dB.

Any key can be changed from the command line with ``--hw-set KEY=VALUE`` (dotted for
sections, e.g. ``--hw-set waveform.speed_kmh=20``); see
:func:`testbed.core.config.loader.load_hardware`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from radio.link_budget import budget_snr_db, path_gain
from radio.usrp_settings import DeviceRadio, ReceiverRadio
from radio.virtual_device import VirtualArgs, is_virtual, split_args
from testbed.core.config.calibration import DEFAULT_MAX_AGE_DAYS, Calibration
from testbed.core.config.emulated import EmulatedRadios
from testbed.core.config.errors import ConfigError
from testbed.core.config.link import LinkName
from testbed.core.config.sections import StrictModel
from testbed.core.config.virtual_air import VirtualAirSection

#: Key of the validation context that names the file a hardware config was read from
#: (:func:`testbed.core.config.loader.load_hardware` passes it; messages name the file).
SOURCE_CONTEXT_KEY = "source"
#: Largest device id a hardware config may name.
MAX_DEVICE_ID = 65535
#: UHD device-args keys that identify one USRP (two args sharing one of these values name
#: the same device).
IDENTITY_KEYS = ("addr", "serial", "name", "resource")


class WaveformSection(StrictModel):
    """Baseband numerology and emulated impairments (see ``radio.framing``)."""

    samples_per_symbol: int = Field(5, ge=2, le=64, description="RRC oversampling")
    rolloff: float = Field(0.35, gt=0, le=1, description="RRC excess bandwidth")
    span_symbols: int = Field(16, ge=2, le=128, description="RRC length in symbols (even)")
    zc_length: int = Field(37, ge=3, le=1023, description="Zadoff-Chu length (odd)")
    preamble_repeats: int = Field(4, ge=2, le=16)
    pilot_spacing: int = Field(
        96, ge=1, le=1_000_000, description="payload symbols between pilot blocks"
    )
    pilots_per_block: int = Field(8, ge=2, le=256)
    pilot_smoothing: int = Field(3, ge=1, le=63, description="pilot blocks averaged (odd)")
    guard_symbols: int = Field(12, ge=0, le=4096)
    distortion_floor_db: float = Field(
        -40.0, ge=-80, le=-20, description="receiver distortion not credited as noise (dB)"
    )
    speed_kmh: float = Field(0.0, ge=0, le=1000, description="Doppler: speed (km/h)")
    cfo_hz: float = Field(0.0, ge=-1e5, le=1e5, description="emulated carrier offset (Hz)")
    cfo_spread_hz: float = Field(0.0, ge=0, le=1e5, description="+- uniform extra CFO (Hz)")
    delay_max_samples: float = Field(
        512.0, ge=0, le=1e7, description="emulated leading samples, uniform in [0, max]"
    )
    sro_ppm: float = Field(0.0, ge=-200, le=200, description="emulated sample-rate offset")
    tail_samples: int = Field(256, ge=0, le=10_000_000)
    aircomp_timing_error_samples: float = Field(
        0.05, ge=0, le=1.0, description=(
            "scheme aircomp: bound on each device's burst timing error in the shared slot "
            "(samples; a shared PPS aligns bursts to tens of ns, 0.05 samples at 1 MS/s)"))

    @model_validator(mode="after")
    def _odd_even(self) -> WaveformSection:
        if self.span_symbols % 2:
            raise ValueError(f"waveform.span_symbols: got {self.span_symbols}; must be even")
        if self.zc_length % 2 == 0:
            raise ValueError(f"waveform.zc_length: got {self.zc_length}; must be odd")
        if self.pilot_smoothing % 2 == 0:
            raise ValueError(f"waveform.pilot_smoothing: got {self.pilot_smoothing}; must be odd")
        return self


class GnuradioSection(StrictModel):
    """The GNU Radio channel-emulator process."""

    noise_seed: int = Field(0, ge=0, le=2**31 - 1, description="channel_model noise seed")
    fading_seed: int = Field(0, ge=0, le=2**31 - 1, description="fading_model seed")
    python: str = Field("/usr/bin/python3", description="interpreter with GNU Radio")
    startup_timeout_s: float = Field(60.0, gt=0, le=600)


def parse_device_args(args: str) -> dict[str, str]:
    """UHD device args ``"addr=192.168.10.11, type=usrp2"`` as a mapping
    (:func:`radio.virtual_device.split_args`: keys lower-cased, spaces dropped).

    Raises
    ------
    ValueError
        A comma-separated part that is not ``key=value``.
    """
    return split_args(args)


def same_usrp(a: str, b: str) -> bool:
    """Whether two device args certainly name the same USRP.

    True when they share a value of an identifying key (``addr``, ``serial``, ``name``,
    ``resource``) or are equal once parsed; args that cannot be compared (``addr=`` vs
    ``serial=``) are taken as different.
    """
    try:
        da, db = parse_device_args(a), parse_device_args(b)
    except ValueError:
        return a.strip() == b.strip()
    if da == db:
        return True
    return any(k in da and k in db and da[k] == db[k] for k in IDENTITY_KEYS)


class DeviceRadioEntry(StrictModel):
    """One edge device's own transmitter (an entry of ``usrp.devices``)."""

    device: int = Field(ge=0, le=MAX_DEVICE_ID, description="the edge's --device-id")
    tx_args: str = Field(
        min_length=1, max_length=512, description="UHD args of this device's USRP"
    )
    tx_gain_db: float = Field(ge=0, le=31.5, description="WBX TX gain (dB)")
    tx_antenna: str = Field("TX/RX", min_length=1, max_length=64)
    max_tx_power_w: float = Field(gt=0, le=0.1, description="this radio's maximum output (W)")
    tx_power_ref_w: float | None = Field(
        None, gt=0, le=100,
        description="W radiated by a unit-power stream; null: the top-level tx_power_ref_w",
    )

    @field_validator("tx_args")
    @classmethod
    def _names_one_usrp(cls, v: str) -> str:
        try:
            parsed = parse_device_args(v)
        except ValueError as exc:
            raise ValueError(f"{exc}; allowed: UHD device args such as addr=192.168.10.11") \
                from None
        if not any(k in parsed for k in IDENTITY_KEYS):
            raise ValueError(
                "must name one USRP with one of "
                f"{', '.join(k + '=' for k in IDENTITY_KEYS)} (e.g. addr=192.168.10.11); "
                "args without one let UHD pick any device"
            )
        return v


class UsrpSection(StrictModel):
    """The receiver, the single-process link's transmitter, and each device's transmitter."""

    tx_args: str = Field("addr=192.168.10.2", description="UHD device args of the transmitter")
    rx_args: str = Field("addr=192.168.10.3", description="UHD device args of the receiver")
    tx_gain_db: float = Field(10.0, ge=0, le=31.5, description="WBX TX gain (dB)")
    rx_gain_db: float = Field(15.0, ge=0, le=31.5, description="WBX RX gain (dB)")
    tx_antenna: str = "TX/RX"
    rx_antenna: str = "RX2"
    max_tx_power_w: float = Field(0.1, gt=0, le=0.1, description="WBX maximum output (W)")
    tx_amplitude: float = Field(
        0.25, gt=0, le=1, description="DAC scale of a unit-power stream (peak headroom)"
    )
    clock_source: Literal["internal", "external", "mimo", "gpsdo"] = "internal"
    time_source: Literal["internal", "external", "mimo", "gpsdo", "none"] = "internal"
    burst_lead_s: float = Field(0.05, gt=0, le=10, description="tx_time ahead of now (s)")
    capture_margin_s: float = Field(0.02, ge=0, le=10, description="RX capture margin (s)")
    receiver_down_rounds: int = Field(
        3, ge=1, le=1000,
        description="lab split: rounds in a row whose every window a gap in the receiver's "
                    "stream took before the run ends link_failed (one gap costs the uploads "
                    "it hit, not the run)")
    fallback: Literal["none", "emulate"] = Field(
        "none",
        description="when UHD finds none of the configured USRPs: 'emulate' runs on virtual "
        "USRPs with this config's parameters (docs/virtual_lab.md), 'none' ends link_failed",
    )
    emulated: EmulatedRadios | None = Field(
        None, description="written by the fallback: these radios are emulated (no USRP found)"
    )
    devices: list[DeviceRadioEntry] = Field(
        default_factory=list, max_length=1024,
        description="one transmitter per edge device (lab split); empty: usrp.tx_args",
    )


class HardwareConfig(StrictModel):
    """Link selection and the radio parameters every link shares."""

    name: str = "sim"
    link: LinkName = "symbol"
    symbol_rate_hz: float = Field(
        200e3, gt=0, le=1e9, description="analog symbol rate; t_cm = 1 / symbol_rate_hz (s)"
    )
    tx_power_ref_w: float = Field(
        0.1, gt=0, le=100, description="radiated power (W) of a unit-average-power symbol stream"
    )
    coherence_symbols: int | None = Field(
        None,
        ge=1,
        le=10**12,
        description="block-fading length in symbols; null = one block per upload",
    )
    center_freq_hz: float = Field(915e6, gt=0, le=6e9, description="carrier frequency (Hz)")
    fading: Literal["none", "rayleigh", "rician"] | None = Field(
        None, description="fading the medium imposes (darkroom); null = the experiment's"
    )
    snr_sweep_db: list[float] | None = Field(
        None, description="SNR points (dB) a sweep over this hardware visits"
    )
    waveform: WaveformSection = WaveformSection()
    gnuradio: GnuradioSection = GnuradioSection()
    usrp: UsrpSection = UsrpSection()
    virtual_air: VirtualAirSection = VirtualAirSection()
    calibration: Calibration | None = Field(
        None, description="what testbed radio calibrate measured (in YAML: the path of its "
        "CAL.yaml, relative to this file; the loader embeds it); null: not calibrated")
    calibration_max_age_days: float = Field(
        DEFAULT_MAX_AGE_DAYS, gt=0, le=3650,
        description="a calibration older than this (days) is reported stale by every run")

    @field_validator("snr_sweep_db")
    @classmethod
    def _sweep_range(cls, v: list[float] | None) -> list[float] | None:
        for x in v or []:
            if not (math.isfinite(x) and -50.0 <= x <= 100.0):
                raise ValueError(f"SNR {x} dB outside the allowed range [-50, 100] dB")
        return v

    @model_validator(mode="after")
    def _power(self) -> HardwareConfig:
        if self.link == "usrp" and self.tx_power_ref_w > self.usrp.max_tx_power_w:
            raise ValueError(
                f"tx_power_ref_w: got {self.tx_power_ref_w} W; the USRP allows at most "
                f"usrp.max_tx_power_w = {self.usrp.max_tx_power_w} W"
            )
        return self

    @model_validator(mode="after")
    def _devices(self, info: ValidationInfo) -> HardwareConfig:
        source = (info.context or {}).get(SOURCE_CONTEXT_KEY)
        problems = device_entry_problems(self) + virtual_problems(self, source)
        if problems:
            raise ValueError("\nhardware config: ".join(problems))
        return self

    @property
    def sample_rate_hz(self) -> float:
        """Sample rate of the waveform links (Hz)."""
        return self.symbol_rate_hz * self.waveform.samples_per_symbol

    @property
    def virtual(self) -> bool:
        """Whether the receiver is a virtual USRP (then every radio is: the virtual lab)."""
        return is_virtual(self.usrp.rx_args)


def usrp_args(hw: HardwareConfig) -> list[tuple[str, str]]:
    """Every device args string of ``hw`` with its key: ``usrp.rx_args``, ``usrp.tx_args``
    and each ``usrp.devices[i].tx_args``."""
    return [("usrp.rx_args", hw.usrp.rx_args), ("usrp.tx_args", hw.usrp.tx_args)] + [
        (f"usrp.devices[{i}].tx_args", e.tx_args) for i, e in enumerate(hw.usrp.devices)
    ]


def virtual_problems(hw: HardwareConfig, source: str | None = None) -> list[str]:
    """Cross-checks of virtual devices; one message per problem (empty: all fine).

    A config is all virtual or all real (the receiver decides); each virtual device's args
    parse (:class:`radio.virtual_device.VirtualArgs`); the receiver does not drift (the
    air's timeline is its sample clock); a virtual config has a ``virtual_air`` section and
    each virtual transmitter a ``virtual_air.paths`` entry in it. ``source``: the file the
    config was read from (named when the section is missing).
    """
    problems: list[str] = []
    keyed = usrp_args(hw)
    rx_virtual = is_virtual(hw.usrp.rx_args)
    no_air = rx_virtual and "virtual_air" not in hw.model_fields_set
    if no_air:
        where = f"'{source}'" if source else "the hardware config"
        problems.append(
            f"virtual_air: section missing from {where}, whose radios are virtual "
            f"(usrp.rx_args '{hw.usrp.rx_args}'); allowed: a virtual_air section holding "
            "paths, one entry per virtual transmitter with its serial and attenuation_db or "
            "distance_m, e.g. virtual_air: {paths: [{serial: tx0, attenuation_db: 116.0}]} "
            "(hw_configs/virtual_lab.yaml, docs/virtual_lab.md)"
        )
    for key, args in keyed:
        if is_virtual(args) != rx_virtual:
            what = "virtual" if is_virtual(args) else "a real USRP"
            rx_what = "virtual" if rx_virtual else "a real USRP"
            problems.append(
                f"{key}: got '{args}', {what}, while usrp.rx_args '{hw.usrp.rx_args}' is "
                f"{rx_what}; allowed: every radio of a config virtual (type=virtual,"
                "serial=NAME) or every radio real"
            )
            continue
        if not rx_virtual:
            continue
        try:
            va = VirtualArgs.parse(args)
        except ValueError as exc:
            problems.append(f"{key}: {exc}")
            continue
        if key == "usrp.rx_args":
            if va.drift_ppm != 0:
                problems.append(
                    f"usrp.rx_args: drift_ppm={va.drift_ppm}; allowed: 0 (the virtual air's "
                    "sample timeline is the receiver's clock; let the transmitters drift)"
                )
        elif not no_air and hw.virtual_air.path(va.serial) is None:
            listed = ", ".join(p.serial for p in hw.virtual_air.paths) or "none"
            problems.append(
                f"{key}: serial={va.serial} has no virtual_air.paths entry (listed: {listed}); "
                "add one with its attenuation_db or distance_m"
            )
    return problems


def device_entry_problems(hw: HardwareConfig) -> list[str]:
    """Cross-checks of ``usrp.devices``; one message per problem (empty: all fine).

    Each device id and each USRP appears once, no device transmits with the aggregator's
    receiver, and (on the ``usrp`` link) each device's reference power is within its
    radio's maximum. Messages name the key path, the value and what is allowed.
    """
    problems: list[str] = []
    entries = hw.usrp.devices
    for i, e in enumerate(entries):
        key = f"usrp.devices[{i}]"
        for j, prev in enumerate(entries[:i]):
            if e.device == prev.device:
                problems.append(
                    f"{key}.device: got {e.device}; already used by usrp.devices[{j}]; "
                    "allowed: one entry per device id"
                )
            if same_usrp(e.tx_args, prev.tx_args):
                problems.append(
                    f"{key}.tx_args: got '{e.tx_args}', the same USRP as "
                    f"usrp.devices[{j}].tx_args '{prev.tx_args}' (device {prev.device}); "
                    "allowed: a USRP of its own per device (distinct addr= or serial=)"
                )
        if same_usrp(e.tx_args, hw.usrp.rx_args):
            problems.append(
                f"{key}.tx_args: got '{e.tx_args}', the aggregator's receiver "
                f"(usrp.rx_args '{hw.usrp.rx_args}'); allowed: a USRP other than the receiver"
            )
        ref = e.tx_power_ref_w if e.tx_power_ref_w is not None else hw.tx_power_ref_w
        if hw.link == "usrp" and ref > e.max_tx_power_w:
            where = (f"{key}.tx_power_ref_w" if e.tx_power_ref_w is not None
                     else f"tx_power_ref_w (top level, inherited by {key})")
            problems.append(
                f"{where}: got {ref} W; device {e.device}'s radio allows at most "
                f"{key}.max_tx_power_w = {e.max_tx_power_w} W"
            )
    return problems


def device_radio(hw: HardwareConfig, device: int) -> DeviceRadio:
    """The effective transmitter settings of ``device``.

    With ``usrp.devices`` listed, the device's entry (its ``tx_power_ref_w`` defaults to
    the top-level one); without, every device gets the ``usrp`` section's transmitter. A
    ``tx_power_ref_w`` the config's calibration measured at these settings replaces the
    configured one (:func:`calibrated_tx_power_ref_w`).

    Raises
    ------
    ConfigError
        ``device`` is negative, or ``usrp.devices`` is listed without an entry for it (the
        message names the configured ids).
    """
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ConfigError(f"device id: got {device!r}; allowed: an integer >= 0")
    u = hw.usrp
    shared: dict[str, Any] = {
        "center_freq_hz": hw.center_freq_hz, "sample_rate_hz": hw.sample_rate_hz,
        "symbol_rate_hz": hw.symbol_rate_hz, "tx_amplitude": u.tx_amplitude,
        "clock_source": u.clock_source, "time_source": u.time_source,
        "burst_lead_s": u.burst_lead_s, "python": hw.gnuradio.python,
        "air_address": hw.virtual_air.burst_address if hw.virtual else "",
    }
    if not u.devices:  # one transmitter for all: the calibration's device 0
        ref = calibrated_tx_power_ref_w(hw, 0, u.tx_gain_db, u.tx_args) or hw.tx_power_ref_w
        return DeviceRadio(
            device=device, key="usrp.tx_args", tx_args=u.tx_args, tx_gain_db=u.tx_gain_db,
            tx_antenna=u.tx_antenna, max_tx_power_w=u.max_tx_power_w,
            tx_power_ref_w=ref, **shared,
        )
    for i, e in enumerate(u.devices):
        if e.device == device:
            ref = e.tx_power_ref_w if e.tx_power_ref_w is not None else hw.tx_power_ref_w
            ref = calibrated_tx_power_ref_w(hw, device, e.tx_gain_db, e.tx_args) or ref
            return DeviceRadio(
                device=device, key=f"usrp.devices[{i}]", tx_args=e.tx_args,
                tx_gain_db=e.tx_gain_db, tx_antenna=e.tx_antenna,
                max_tx_power_w=e.max_tx_power_w, tx_power_ref_w=ref, **shared,
            )
    ids = ", ".join(str(e.device) for e in u.devices)
    raise ConfigError(
        f"device {device}: hardware config '{hw.name}' has no usrp.devices entry for it "
        f"(configured device ids: {ids}); add one with its own tx_args"
    )


def calibrated_tx_power_ref_w(hw: HardwareConfig, device: int, tx_gain_db: float,
                              tx_args: str) -> float | None:
    """The ``tx_power_ref_w`` (W) the config's calibration measured for ``device``, when it
    applies: measured on the same USRP (``tx_args``), at the same gain and DAC amplitude
    (``usrp.tx_amplitude``) as now configured. ``None``: no calibration, the device not in
    it, its power not measured (no known attenuation), or measured at other settings."""
    cal = hw.calibration
    entry = None if cal is None else cal.device(device)
    if entry is None or entry.tx_power_ref_w is None:
        return None
    if (abs(entry.tx_gain_db - tx_gain_db) > 1e-6
            or abs(entry.tx_amplitude - hw.usrp.tx_amplitude) > 1e-9
            or not same_usrp(entry.tx_args, tx_args)):
        return None
    return entry.tx_power_ref_w


def virtual_budget_snr_db(hw: HardwareConfig, device: int) -> float | None:
    """The SNR (dB, ``Es/N0`` of unit-power symbols: what a receiver estimates from a
    frame's pilots) device ``device``'s frames arrive with through the virtual air's link
    budget: its ``tx_power_ref_w`` through its path, against the receiver's thermal noise,
    fading at its mean. ``None`` on real radios, or when the virtual air has no path for the
    device's serial (which the config's validation refuses).

    Raises
    ------
    ConfigError
        As :func:`device_radio`.
    """
    if not hw.virtual:
        return None
    radio = device_radio(hw, device)
    path = hw.virtual_air.path(VirtualArgs.parse(radio.tx_args).serial)
    if path is None:
        return None
    gain = path_gain(attenuation_db=path.attenuation_db, distance_m=path.distance_m,
                     center_freq_hz=hw.center_freq_hz)
    air = hw.virtual_air
    return budget_snr_db(radio.tx_power_ref_w * gain, hw.symbol_rate_hz, air.temperature_k,
                         air.noise_figure_db)


def receiver_radio(hw: HardwareConfig) -> ReceiverRadio:
    """The aggregator's receiver settings of a hardware config."""
    u = hw.usrp
    return ReceiverRadio(
        rx_args=u.rx_args, rx_gain_db=u.rx_gain_db, rx_antenna=u.rx_antenna,
        center_freq_hz=hw.center_freq_hz, sample_rate_hz=hw.sample_rate_hz,
        clock_source=u.clock_source, time_source=u.time_source, python=hw.gnuradio.python,
        air_address=hw.virtual_air.stream_address if hw.virtual else "",
    )
