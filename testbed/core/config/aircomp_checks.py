"""What the ``aircomp`` scheme needs from the rest of an experiment config."""

from __future__ import annotations

from typing import Any

#: Links aircomp runs on in this version (the radio link carries one device per slot so far).
AIRCOMP_LINKS = ("symbol", "waveform", "gnuradio")
#: Of those, the links whose receiver estimates the paths from pilot frames.
AIRCOMP_FRAME_LINKS = ("waveform", "gnuradio")


#: Why the lab processes refuse aircomp in this version (``testbed aggregator``, ``launch``).
LAB_REFUSAL = ("config key 'scheme': got 'aircomp'; over-the-air aggregation runs in one process "
               "in this version (testbed run: the symbol, waveform and gnuradio links): the "
               "lab aggregator and its edges (testbed aggregator, edge, launch) send one "
               "device per slot so far")


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
        if pc.colluding_devices:
            raise ValueError(f"privacy.colluding_devices: got {pc.colluding_devices}; only for "
                             f"scheme aircomp (scheme is {cfg.scheme!r})")
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


def check_aircomp_link(cfg: Any, hw: Any, link: str) -> None:
    """Refuse an aircomp run on a link that cannot carry its slot as accounted, naming the key.

    On the waveform links every device's path is estimated once per round from its pilot
    and must stay as estimated through the slot: a static channel (no fading, no Doppler)
    and, as a shared 10 MHz reference gives, no frequency offset between the devices and
    the receiver (a residual offset would turn each pilot's phase before the slot).

    Raises
    ------
    ValueError
        Naming the key, its value and what is allowed.
    """
    if link not in AIRCOMP_LINKS:
        raise ValueError(
            f"config key 'link': {link!r} (hardware config {hw.name!r}); scheme aircomp runs "
            f"on {', '.join(AIRCOMP_LINKS)} in this version")
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
    (:func:`testbed.core.privacy.aircomp_noise.share_sigma`): 1 on the symbol link (the
    paths are known), else what pilots at the weakest device's SNR are expected to credit
    after the burst timing error (:func:`radio.aircomp_air.alignment_margin`)."""
    from radio.aircomp_air import alignment_margin, noise_gain_lower
    from testbed.core.config.link import link_name

    if link_name(cfg, hw) not in AIRCOMP_FRAME_LINKS:
        return 1.0
    w = hw.waveform
    kappa = noise_gain_lower(w.aircomp_timing_error_samples, w.samples_per_symbol, w.rolloff)
    snr = 10.0 ** (min(cfg.snr_db_per_device()) / 10.0)
    return alignment_margin(snr, cfg.n0_confidence(), kappa)
