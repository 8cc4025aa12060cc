"""What the ``aircomp`` scheme needs from the rest of an experiment config."""

from __future__ import annotations

from typing import Any

from radio.units import db_to_ratio
from testbed.core.config.link import LINKS

#: Links aircomp runs on in this version: every link (``usrp``: real or virtual radios, lab
#: processes).
AIRCOMP_LINKS: tuple[str, ...] = LINKS
#: Of those, the links whose receiver estimates the paths from pilot frames.
AIRCOMP_FRAME_LINKS = ("waveform", "gnuradio")


def check_aircomp(cfg: Any) -> None:
    """Refuse an aircomp config that the scheme cannot run as asked, naming the key.

    Over-the-air aggregation here is FedSGD at the record unit with the noise on the upload:
    every device's share of the noise must be on the one value that goes on air, where the
    others' shares and the receiver's noise add to it (docs/privacy.md section 12).

    Raises
    ------
    ValueError
        Naming the key, its value and what is allowed.
    """
    pc = cfg.privacy
    if cfg.scheme != "aircomp":
        for key in ("colluding_devices", "dropout_margin"):
            if getattr(pc, key):
                raise ValueError(f"privacy.{key}: got {getattr(pc, key)}; only for scheme "
                                 f"aircomp (scheme is {cfg.scheme!r})")
        if cfg.aircomp_plan is not None:
            raise ValueError(f"aircomp_plan: got {cfg.aircomp_plan!r}; only for scheme aircomp "
                             f"(scheme is {cfg.scheme!r})")
        return
    wants = [("privacy.unit", pc.unit, "record"), ("privacy.noise", pc.noise, "upload"),
             ("privacy.noise_distribution", pc.noise_distribution, "gaussian"),
             ("local_steps", cfg.local_steps, 1)]
    for key, value, allowed in wants:
        if value != allowed:
            raise ValueError(
                f"{key}: got {value!r}; scheme aircomp needs {allowed!r} (FedSGD at the record "
                "unit with each device's share of the noise on the one value that goes on air)")
    if cfg.link is not None and cfg.link not in AIRCOMP_LINKS:
        raise ValueError(f"link: got {cfg.link!r}; scheme aircomp runs on {AIRCOMP_LINKS} in "
                         "this version")
    if pc.colluding_devices > cfg.devices - 1:
        raise ValueError(f"privacy.colluding_devices: got {pc.colluding_devices}; at most "
                         f"devices - 1 = {cfg.devices - 1}")
    if pc.colluding_devices + pc.dropout_margin > cfg.devices - 1:
        raise ValueError(f"privacy.dropout_margin: got {pc.dropout_margin}; colluding_devices "
                         f"+ dropout_margin may be at most devices - 1 = {cfg.devices - 1}")


def check_aircomp_link(cfg: Any, hw: Any, link: str, *, lab: bool = False) -> None:
    """Refuse an aircomp run on a link that cannot carry its slot as accounted, naming the key.

    On the waveform links every device's path is estimated once per round from its pilot
    and must stay as estimated through the slot: a static channel (no fading, no Doppler)
    and, as a shared 10 MHz reference gives, no frequency offset between the devices and
    the receiver (a residual offset would turn each pilot's phase before the slot). On
    radios (``usrp``, lab processes only: each edge transmits its own frame) the same, with
    a shared time and frequency reference (``usrp.time_source``, ``usrp.clock_source``); on
    virtual radios the air's paths must agree (no carrier offset, no clock drift, delays
    within ``waveform.aircomp_timing_error_samples``).

    Parameters
    ----------
    lab
        ``True`` for the lab processes (``testbed aggregator``, ``launch``): the usrp link
        only (on a simulated link the aggregator would receive every device's values).

    Raises
    ------
    ValueError
        Naming the key, its value and what is allowed.
    """
    if link not in AIRCOMP_LINKS:
        raise ValueError(
            f"config key 'link': {link!r} (hardware config {hw.name!r}); scheme aircomp runs "
            f"on {', '.join(AIRCOMP_LINKS)} in this version")
    if lab and link != "usrp":
        raise ValueError(
            f"config key 'link': {link!r} (hardware config {hw.name!r}); scheme aircomp in "
            "the lab processes runs on radios (link usrp, real or virtual): over a simulated "
            "link each edge would send its values to the aggregator, which must see only the "
            "sum. Simulated links: testbed run")
    if link == "usrp":
        if not lab:
            raise ValueError(
                "config key 'link': 'usrp' runs scheme aircomp in the lab processes only "
                "(testbed launch, or testbed aggregator with one testbed edge per radio): "
                "each device transmits its own frame into the shared slot")
        _check_radios(cfg, hw)
        return
    if link not in AIRCOMP_FRAME_LINKS:
        return
    fading = hw.fading or cfg.fading
    w = hw.waveform
    wants = [("fading", fading, "none"), ("waveform.speed_kmh", w.speed_kmh, 0.0),
             ("waveform.cfo_hz", w.cfo_hz, 0.0), ("waveform.cfo_spread_hz", w.cfo_spread_hz, 0.0),
             ("waveform.sro_ppm", w.sro_ppm, 0.0)]
    for key, value, allowed in wants:
        if value != allowed:
            raise ValueError(
                f"{key}: got {value!r}; scheme aircomp on the {link} link needs {allowed!r} "
                "(each path is estimated once per round from its pilot: a static channel and a "
                "shared frequency reference)")
    if getattr(cfg, "record", False):
        raise ValueError("record: got True; scheme aircomp does not record its superposed "
                         "slots in this version")


def aircomp_margin(cfg: Any, hw: Any) -> float:
    """The ``others_margin`` the noise shares are calibrated with
    (:func:`testbed.core.privacy.analysis.aircomp_noise.share_sigma`): 1 on the symbol link (the
    paths are known), else what the pilots are expected to credit the device whose gain is
    least certain, after the burst timing error (:func:`radio.aircomp_air.binding_margin`,
    at :func:`expected_snrs_db`). A margin above what the pilots credit spends the budget
    before the planned rounds end; one below leaves some of it unspent."""
    from radio.aircomp_air import binding_margin, noise_gain_lower
    from testbed.core.config.link import link_name

    name = link_name(cfg, hw)
    if name not in (*AIRCOMP_FRAME_LINKS, "usrp"):
        return 1.0
    w = hw.waveform
    kappa = noise_gain_lower(w.aircomp_timing_error_samples, w.samples_per_symbol, w.rolloff)
    snrs = [db_to_ratio(x) for x in expected_snrs_db(cfg, hw, name)]
    others = cfg.devices - 1 - aircomp_colluding(cfg)
    return binding_margin(snrs, cfg.n0_confidence(), kappa, others)


def expected_snrs_db(cfg: Any, hw: Any, link: str) -> list[float]:
    """Each device's expected pilot SNR (dB, ``Es/N0`` of unit-power symbols, shape
    ``(devices,)``) the noise shares are calibrated for: on the ``usrp`` link over virtual
    radios, the virtual air's link budget of its path
    (:func:`testbed.core.config.hardware.virtual_budget_snr_db`); else the configured
    ``snr_db`` (on real radios: set it to the bench's)."""
    from testbed.core.config.hardware import virtual_budget_snr_db

    configured = cfg.snr_db_per_device()
    if link == "usrp" and hw.virtual:
        budgets = [virtual_budget_snr_db(hw, i) for i in range(cfg.devices)]
        return [c if b is None else b for b, c in zip(budgets, configured, strict=True)]
    return list(configured)


def aircomp_colluding(cfg: Any) -> int:
    """The others whose noise an aircomp event does not credit: ``t`` colluding devices
    plus ``privacy.dropout_margin`` that may fail to transmit after the gate."""
    return int(cfg.privacy.colluding_devices + cfg.privacy.dropout_margin)


def _check_radios(cfg: Any, hw: Any) -> None:
    """aircomp on radios: a shared reference; on virtual radios, paths that agree."""
    from radio.virtual_device import VirtualArgs
    from testbed.core.config.hardware import device_radio

    u = hw.usrp
    shared = ("external", "gpsdo", "mimo")
    for key, value in (("usrp.time_source", u.time_source),
                       ("usrp.clock_source", u.clock_source)):
        if value not in shared:
            raise ValueError(
                f"{key}: got {value!r}; scheme aircomp needs a shared time and frequency "
                f"reference ({', '.join(shared)}: a PPS and 10 MHz distributed to every radio) "
                "so that every burst lands in the one slot on one carrier")
    if not hw.virtual:
        return
    air = hw.virtual_air
    if air.fading != "none":
        raise ValueError(f"virtual_air.fading: got {air.fading!r}; scheme aircomp needs "
                         "'none' (each path is estimated once per round from its pilot)")
    e = hw.waveform.aircomp_timing_error_samples
    delays: dict[str, float] = {}
    for i in range(cfg.devices):
        radio = device_radio(hw, i)
        va = VirtualArgs.parse(radio.tx_args)
        if va.drift_ppm != 0:
            raise ValueError(
                f"device {i}'s tx_args: drift_ppm={va.drift_ppm:g}; scheme aircomp needs 0 (a "
                "shared 10 MHz reference: the radios' clocks do not drift apart)")
        path = air.path(va.serial)
        if path is None:
            continue  # refused by the hardware config's own validation
        if path.cfo_hz != 0:
            raise ValueError(
                f"virtual_air.paths (serial {va.serial}): cfo_hz={path.cfo_hz:g}; scheme aircomp "
                "needs 0 (a shared 10 MHz reference: one carrier)")
        delays[va.serial] = path.delay_samples
    if delays and max(delays.values()) - min(delays.values()) > 2 * e + 1e-12:
        raise ValueError(
            f"virtual_air.paths: the devices' delay_samples span "
            f"{min(delays.values()):g} to {max(delays.values()):g}, more than 2 x "
            f"waveform.aircomp_timing_error_samples = {2 * e:g}, the timing error the "
            "accountant bounds")


def check_lab_aircomp(cfg: Any, hw: Any) -> None:
    """The lab processes' check (``testbed aggregator``, ``launch``): see
    :func:`check_aircomp_link` with ``lab=True``; nothing for another scheme.

    Raises
    ------
    testbed.core.config.errors.ConfigError
        Naming the key, its value and what is allowed.
    """
    from testbed.core.config.errors import ConfigError
    from testbed.core.config.link import link_name

    if cfg.scheme != "aircomp":
        return
    try:
        check_aircomp_link(cfg, hw, link_name(cfg, hw), lab=True)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
