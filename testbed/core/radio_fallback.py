"""The channel-emulation fallback: a hardware config whose USRPs UHD cannot find runs on
virtual USRPs with the config's own parameters (``--fallback emulate`` or
``usrp.fallback: emulate``; docs/virtual_lab.md, "Emulation fallback").

The default is ``none``: a lab never measures an emulator by accident. With ``emulate``,
each process asks UHD for the radios *it* would open (``testbed run``: the single-process
link's transmitter and receiver; ``testbed aggregator``: the receiver; ``testbed edge``: its
own transmitter; ``testbed launch``: the receiver and every edge's transmitter):

* all found: the config is used as it is (real radios);
* none found (or UHD not usable): every radio of the config becomes a virtual USRP
  (:func:`emulated_hardware`) and the config records it in ``usrp.emulated``, which every
  output reports as :data:`~testbed.core.config.emulated.EMULATED_LABEL`;
* some found, some not: refused (:class:`FallbackRefused`, naming the missing ones): mixing
  real and virtual radios is not a fallback.

What carries over: the sample and symbol rates, the carrier, the gains, each radio's maximum
output power and reference power (``tx_power_ref_w`` at its gain and ``usrp.tx_amplitude``:
the virtual device's full scale is set so that a unit-power stream radiates exactly that),
the clock and time sources (an external/gpsdo/mimo time source is the virtual devices'
shared PPS; internal clocks run free and drift, :data:`INTERNAL_DRIFT_PPM`), and the
medium's fading (the hardware config's ``fading``, as a channel emulator imposes it, at
``waveform.speed_kmh``; without one the paths are static: the experiment's ``fading`` is for
simulated links, and a bench's room is not known). The link budget: each
transmitter's path loss is set so that its mean ``Es/N0`` at the receiver is the experiment's
``snr_db`` for that device, against the thermal noise of ``virtual_air`` (290 K, 5 dB noise
figure by default). The virtual air draws that noise from the OS CSPRNG, and the channel
credit follows the virtual lab's rules (the receiver's measured N0, credited after reception).
What changes: ``usrp.burst_lead_s`` is at least :data:`VIRTUAL_BURST_LEAD_S`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from radio.link import LinkFailed
from radio.link_budget import noise_psd_w_per_hz
from radio.uhd_probe import ProbeResult, find_usrps
from radio.units import db_to_ratio, ratio_to_db
from testbed.core.config.emulated import EMULATED_LABEL, EmulatedRadios
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig, device_radio
from testbed.core.config.link import link_name
from testbed.core.config.virtual_air import AirPath

FallbackMode = Literal["none", "emulate"]
#: The choices of ``--fallback``.
FALLBACK_CHOICES = ("none", "emulate")
#: Clock drift (ppm) of the emulated transmitters with internal clocks, by device id modulo
#: its length: a spread within an N210 TCXO's +-2.5 ppm.
INTERNAL_DRIFT_PPM = (1.5, -1.0, 0.5, -2.0, 2.0, -0.5)
#: Smallest ``usrp.burst_lead_s`` (s) on emulated radios: a virtual device's Python blocks
#: need more lead than a USRP's FPGA (``hw_configs/virtual_lab.yaml``); a bench's 0.05 s
#: leaves the single-process link's bursts late.
VIRTUAL_BURST_LEAD_S = 0.3
#: Mean ``Es/N0`` (dB) of an emulated path when no experiment says (an edge's own config:
#: its path is the air's business, on the aggregator's side).
DEFAULT_SNR_DB = 20.0

Probe = Callable[..., ProbeResult]


class FallbackRefused(LinkFailed):
    """Some configured USRPs were found and some not: no fallback (names the missing)."""


def fallback_mode(hw: HardwareConfig, cli: str | None) -> FallbackMode:
    """The fallback in force: ``--fallback`` when given, else the config's ``usrp.fallback``.

    Raises
    ------
    ValueError
        ``cli`` not one of :data:`FALLBACK_CHOICES`.
    """
    if cli is None:
        return hw.usrp.fallback
    if cli not in FALLBACK_CHOICES:
        raise ValueError(f"--fallback: got {cli!r}; allowed: {', '.join(FALLBACK_CHOICES)}")
    return cli  # type: ignore[return-value]


def check_fallback_applies(cli: str | None, link: str | None) -> None:
    """Refuse ``--fallback emulate`` where it would do nothing: off the ``usrp`` link.

    The one check of ``testbed run``, ``aggregator``, ``edge`` and ``launch``, made before
    any work (the flag would otherwise be accepted and silently ignored).

    Parameters
    ----------
    cli
        ``--fallback`` as given (``None``: not given).
    link
        The link in use (:func:`testbed.core.config.link.link_name`); ``None``: not known
        in this process (an edge without ``--hw`` takes its radio from the aggregator's run).

    Raises
    ------
    ConfigError
        ``cli`` is ``emulate`` and ``link`` is not ``usrp``.
    """
    if cli != "emulate" or link == "usrp":
        return
    if link is None:
        raise ConfigError(
            "--fallback emulate: given without --hw, so this edge has no radio of its own to "
            "emulate; allowed: only with link=usrp (add --hw naming a usrp hardware config, "
            "or drop --fallback)"
        )
    raise ConfigError(
        f"--fallback emulate: the link in use is {link!r}, which has no USRP to emulate; "
        "allowed: only with link=usrp (drop --fallback, or choose a usrp hardware config)"
    )


def radios_of(
    hw: HardwareConfig,
    role: Literal["run", "aggregator", "edge", "launch"],
    *,
    device: int | None = None,
    devices: int | None = None,
) -> list[tuple[str, str]]:
    """The ``(config key, device args)`` a process of ``role`` opens.

    ``device``: the edge's id (role ``edge``); ``devices``: how many edges ``launch`` starts.
    """
    rx = ("usrp.rx_args", hw.usrp.rx_args)
    if role == "run":
        return [("usrp.tx_args", hw.usrp.tx_args), rx]
    if role == "aggregator":
        return [rx]
    ids = [device] if role == "edge" else list(range(devices or 0))
    out = [] if role == "edge" else [rx]
    for i in ids:
        if i is None:
            raise ValueError("radios_of: role 'edge' needs its device id")
        r = device_radio(hw, i)
        key = r.key if r.key.endswith("tx_args") else f"{r.key}.tx_args"
        if all(args != r.tx_args for _, args in out):
            out.append((key, r.tx_args))
    return out


def resolve_radios(
    hw: HardwareConfig,
    mode: FallbackMode,
    wanted: Sequence[tuple[str, str]],
    *,
    snr_db: Sequence[float] | None = None,
    rician_k_db: float | None = None,
    probe: Probe = find_usrps,
) -> HardwareConfig:
    """``hw`` as this process will use it: unchanged, or on emulated radios.

    Parameters
    ----------
    hw
        The hardware config as loaded.
    mode
        ``none`` (no probing here: a missing USRP fails where it is opened) or ``emulate``.
    wanted
        The radios this process opens (:func:`radios_of`); empty off the ``usrp`` link.
    snr_db
        Mean ``Es/N0`` (dB) per device id (the experiment's ``snr_db``); ``None``:
        :data:`DEFAULT_SNR_DB`.
    rician_k_db
        The experiment's Rician K-factor (dB), for a hardware config with Rician fading.
    probe
        UHD discovery (:func:`radio.uhd_probe.find_usrps`).

    Raises
    ------
    FallbackRefused
        Some of ``wanted`` found, some not.
    """
    if mode == "none" or hw.virtual or not wanted:
        return hw
    results = [(key, args, probe(args, python=hw.gnuradio.python)) for key, args in wanted]
    missing = [f"{key} = '{args}'" for key, args, r in results if not r.devices]
    if not missing:
        return hw
    found = [f"{key} = '{args}'" for key, args, r in results if r.devices]
    if found:
        raise FallbackRefused(
            f"--fallback emulate: UHD found {', '.join(found)} but not {', '.join(missing)}; "
            "a partial find is not a fallback (real and virtual radios do not mix): connect "
            "the missing USRPs, or run where none is attached"
        )
    why = sorted({r.message for _, _, r in results if r.message}) or ["UHD found no device"]
    return emulated_hardware(hw, missing=missing, uhd="; ".join(why), snr_db=snr_db,
                             rician_k_db=rician_k_db)


def emulated_hardware(
    hw: HardwareConfig,
    *,
    missing: Sequence[str],
    uhd: str,
    snr_db: Sequence[float] | None = None,
    rician_k_db: float | None = None,
) -> HardwareConfig:
    """``hw`` with every radio a virtual USRP and the virtual air its link budget
    (module docstring); ``usrp.emulated`` records why."""
    u = hw.usrp
    sps = hw.waveform.samples_per_symbol
    n0 = noise_psd_w_per_hz(hw.virtual_air.temperature_k, hw.virtual_air.noise_figure_db)
    drifting = u.clock_source == "internal"
    snrs = [float(s) for s in snr_db] if snr_db else []

    def snr_of(device: int | None) -> float:
        if not snrs:
            return DEFAULT_SNR_DB
        if device is None:  # the single-process link's one transmitter: the mean in dB
            return sum(snrs) / len(snrs)
        return snrs[min(device, len(snrs) - 1)]

    paths: list[AirPath] = []
    budget: dict[str, float] = {}

    def tx_args(serial: str, device: int | None, gain_db: float, ref_w: float,
                max_w: float) -> str:
        full_scale = ref_w * sps / (u.tx_amplitude**2 * db_to_ratio(gain_db))
        parts = [f"type=virtual,serial={serial}", f"full_scale_w={full_scale:.9g}",
                 f"max_power_w={max_w:.9g}"]
        if drifting and device is not None:
            parts.append(f"drift_ppm={INTERNAL_DRIFT_PPM[device % len(INTERNAL_DRIFT_PPM)]}")
        snr = snr_of(device)
        attenuation = ratio_to_db(ref_w / (n0 * hw.symbol_rate_hz)) - snr
        if not 0 <= attenuation <= 300:
            raise ValueError(
                f"snr_db: {snr} dB for {serial} needs a path loss of {attenuation:.1f} dB from "
                f"its {ref_w} W; allowed: 0..300 dB (lower the snr_db or the reference power)"
            )
        paths.append(AirPath(serial=serial, attenuation_db=round(attenuation, 6)))
        budget[serial] = snr
        return ",".join(parts)

    devices = [
        e.model_copy(update={"tx_args": tx_args(
            f"edge{e.device}", e.device, e.tx_gain_db,
            e.tx_power_ref_w if e.tx_power_ref_w is not None else hw.tx_power_ref_w,
            e.max_tx_power_w)})
        for e in u.devices
    ]
    usrp = u.model_copy(update={
        "tx_args": tx_args("tx0", None, u.tx_gain_db, hw.tx_power_ref_w, u.max_tx_power_w),
        "rx_args": "type=virtual,serial=rx0",
        "devices": devices,
        "burst_lead_s": max(u.burst_lead_s, VIRTUAL_BURST_LEAD_S),
        "emulated": EmulatedRadios(hardware=hw.name, missing=list(missing), uhd=uhd[:2000],
                                   snr_db=budget),
    })
    kind = hw.fading or "none"
    if kind != "none" and not hw.waveform.speed_kmh > 0:
        raise ValueError(
            f"waveform.speed_kmh: got {hw.waveform.speed_kmh} with fading {kind}; allowed: "
            "> 0 to emulate it (the Doppler sets how fast it fades)"
        )
    air = hw.virtual_air.model_copy(update={
        "fading": kind,
        "speed_kmh": hw.waveform.speed_kmh if kind != "none" else 0.0,
        "rician_k_db": rician_k_db if kind == "rician" else None,
        "paths": paths,
    })
    data = hw.model_copy(update={"usrp": usrp, "virtual_air": air}).model_dump(mode="json")
    return HardwareConfig.model_validate(data)  # every cross-check, as if loaded


def radio_kind(cfg: ExperimentConfig, hw: HardwareConfig) -> str:
    """What radios a run uses: ``"usrp"`` (real), ``"virtual"`` (a virtual lab config),
    ``"emulated"`` (the fallback's virtual radios); ``""`` off the ``usrp`` link."""
    if link_name(cfg, hw) != "usrp":
        return ""
    if hw.usrp.emulated is not None:
        return "emulated"
    return "virtual" if hw.virtual else "usrp"


def check_same_radios(aggregator: str, hw: HardwareConfig) -> None:
    """An edge's check of its radios (``hw``, on the ``usrp`` link) against the
    aggregator's (:func:`radio_kind`, sent in ``welcome``).

    Raises
    ------
    ValueError
        One side on real USRPs and the other on virtual ones (no air joins them).
    """
    mine = "emulated" if hw.usrp.emulated is not None else "virtual" if hw.virtual else "usrp"
    if aggregator and (aggregator == "usrp") != (mine == "usrp"):
        raise ValueError(
            f"this edge's radio is {_KIND_WORDS[mine]} but the aggregator's is "
            f"{_KIND_WORDS[aggregator]}: real and virtual radios do not mix (nothing carries "
            "a burst between them); run both with the same hardware config and --fallback"
        )


_KIND_WORDS = {"usrp": "a real USRP", "virtual": "virtual", "emulated": EMULATED_LABEL}


def emulation_facts(hw: HardwareConfig) -> dict[str, object] | None:
    """What ``meta.json`` records of emulated radios (``None``: not emulated): the label,
    the config and devices not found, UHD's answer, the fading kind, speed and Doppler, and
    each path's loss and mean ``Es/N0``."""
    em = hw.usrp.emulated
    if em is None:
        return None
    from radio.fading import doppler_hz

    air = hw.virtual_air
    moving = air.fading != "none" and air.speed_kmh > 0
    return {
        "label": EMULATED_LABEL,
        "hardware": em.hardware,
        "not_found": list(em.missing),
        "uhd": em.uhd,
        "fading": air.fading,
        "speed_kmh": air.speed_kmh,
        "doppler_hz": doppler_hz(air.speed_kmh, hw.center_freq_hz) if moving else 0.0,
        "rician_k_db": air.rician_k_db,
        "noise": {"temperature_k": air.temperature_k, "noise_figure_db": air.noise_figure_db,
                  "source": "virtual air, OS CSPRNG"},
        "paths": [{"serial": p.serial, "attenuation_db": p.attenuation_db,
                   "mean_snr_db": em.snr_db.get(p.serial)} for p in air.paths],
    }
