"""Build the link an experiment asks for (the experiment's ``link`` or the hw config's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from radio.framing import WaveformParams
from radio.link import Link
from radio.symbol_link import ChannelParams, SymbolLink
from radio.waveform_channel import EmulatorParams
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.link import LINKS, link_name

#: Links that carry I/Q samples and can therefore record them (``record: true``).
RECORDING_LINKS: tuple[str, ...] = ("waveform", "gnuradio", "usrp")


def channel_params(exp: ExperimentConfig, hw: HardwareConfig) -> ChannelParams:
    """The simulated-channel description of an experiment on a hardware config.

    The hardware config's ``fading`` (a medium that imposes fading, e.g. the darkroom's
    emulator) takes precedence over the experiment's.
    """
    return ChannelParams(
        snr_db=tuple(exp.snr_db_per_device()),
        fading=hw.fading or exp.fading,
        rician_k_db=exp.rician_k_db,
        coherence_symbols=hw.coherence_symbols,
        symbol_rate_hz=hw.symbol_rate_hz,
        noiseless=exp.noiseless,
    )


def _section_fields(section: BaseModel, target: type[Any]) -> dict[str, Any]:
    """The keys of hardware-config ``section`` that dataclass ``target`` has a field of the
    same name for, with their values: what the radio settings take from the config as is."""
    return section.model_dump(include={f.name for f in dataclasses.fields(target)})


def waveform_params(hw: HardwareConfig) -> WaveformParams:
    """Frame numerology of a hardware config (``zc_root``, ``postamble_root`` and
    ``pilot_seed`` are not config keys: :class:`~radio.framing.WaveformParams`' own)."""
    return WaveformParams(symbol_rate_hz=hw.symbol_rate_hz,
                          **_section_fields(hw.waveform, WaveformParams))


def emulator_params(hw: HardwareConfig) -> EmulatorParams:
    """Impairments the emulated links apply (fading kind comes from the channel params)."""
    return EmulatorParams(carrier_hz=hw.center_freq_hz,
                          **_section_fields(hw.waveform, EmulatorParams))


def check_link_config(exp: ExperimentConfig, hw: HardwareConfig, *, record: bool,
                      lab: bool = False) -> None:
    """Refuse link settings that cannot work, before anything is started.

    Raises
    ------
    ConfigError
        ``record`` asked of a link that carries no I/Q samples (``symbol``); scheme
        ``aircomp`` on a link or channel it cannot run on (``lab``: in the lab processes).
    """
    name = link_name(exp, hw)
    if exp.scheme == "aircomp":
        from testbed.core.config.aircomp_checks import check_aircomp_link

        try:
            check_aircomp_link(exp, hw, name, lab=lab)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if record and name not in RECORDING_LINKS:
        raise ConfigError(
            f"config key 'record': got true, but link '{name}' carries symbols, not I/Q "
            "samples, so there is nothing to record; allowed only with links "
            f"{', '.join(repr(n) for n in RECORDING_LINKS)} (e.g. --set link=waveform)"
        )


def make_link(
    exp: ExperimentConfig,
    hw: HardwareConfig,
    record_dir: Path | None = None,
    *,
    log_dir: Path | None = None,
) -> Link:
    """Construct (and for process-backed links, start) the experiment's link.

    Parameters
    ----------
    record_dir
        When given (``record: true``), links that handle I/Q store each received upload
        there as SigMF and log per-frame estimates to ``frames.jsonl``.
    log_dir
        Folder for the logs of the link's flowgraph processes (``channel_emulator.log``,
        ``tx.log``, ``rx.log``; kept, e.g. the run directory). ``None``: anonymous
        temporary files that are gone once the link is closed. Ignored by in-process links.

    The simulated links (``symbol``, ``waveform``) draw their additive noise from the OS
    CSPRNG when the run credits channel noise, else from the seeded channel generator
    (:func:`testbed.core.channel_credit.noise_source`); the link's ``noise_is_secret`` is checked
    against :func:`testbed.core.channel_credit.link_noise`, which the credit rule reads.

    Raises
    ------
    ConfigError
        ``record`` asked of a link that carries no I/Q (``symbol``).
    radio.link.LinkFailed
        The link could not be started (flowgraph start-up failed, no USRP found); the
        message says why. Nothing the attempt started is left running.
    """
    from testbed.core.channel_credit import link_noise

    link = _build_link(exp, hw, record_dir, log_dir)
    expected = link_noise(exp, hw).secret
    if link.noise_is_secret != expected:
        link.close()
        raise RuntimeError(
            f"link '{link.name}': noise_is_secret is {link.noise_is_secret}, the credit rule "
            f"assumed {expected} (testbed.core.channel_credit.link_noise)"
        )
    return link


def _build_link(
    exp: ExperimentConfig, hw: HardwareConfig, record_dir: Path | None, log_dir: Path | None
) -> Link:
    """The link of :func:`make_link`, before its noise is checked."""
    from testbed.core.channel_credit import noise_source

    name = link_name(exp, hw)
    check_link_config(exp, hw, record=record_dir is not None or exp.record)
    if name == "symbol":
        return SymbolLink(channel_params(exp, hw), noise_source(exp))
    confidence = exp.n0_confidence()
    if name == "waveform":
        from radio.waveform_link import WaveformLink

        return WaveformLink(
            channel_params(exp, hw), waveform_params(hw), emulator_params(hw),
            confidence=confidence, record_dir=record_dir, center_freq_hz=hw.center_freq_hz,
            hw_name=hw.name, noise=noise_source(exp),
        )
    if name == "gnuradio":
        from radio.gnuradio_link import GnuradioLink
        from testbed.core.channel_credit import wants_channel_credit

        g = hw.gnuradio
        return GnuradioLink(
            channel_params(exp, hw),
            waveform_params(hw),
            emulator_params(hw),
            # Credited noise: drawn fresh from the OS CSPRNG in the flowgraph; otherwise the
            # fast (seeded, replayed) table, reproducible from noise_seed.
            noise="csprng" if wants_channel_credit(exp) else "fast",
            noise_seed=g.noise_seed,
            fading_seed=g.fading_seed,
            python=g.python,
            startup_timeout_s=g.startup_timeout_s,
            log_dir=log_dir,
            confidence=confidence, record_dir=record_dir, center_freq_hz=hw.center_freq_hz,
            hw_name=hw.name,
        )
    if name == "usrp":
        from radio.usrp_link import UsrpLink, UsrpSettings

        air = None
        if hw.virtual:  # its own air between its virtual transmitter and receiver
            from radio.link import LinkFailed
            from testbed.core.private_air import PrivateAir

            try:
                air = PrivateAir(hw, log_dir)
            except RuntimeError as exc:
                raise LinkFailed(f"usrp link (virtual radios): {exc}") from exc
            hw = air.hw
        settings = UsrpSettings(
            center_freq_hz=hw.center_freq_hz,
            sample_rate_hz=hw.sample_rate_hz,
            python=hw.gnuradio.python,
            tx_air_address=hw.virtual_air.burst_address if hw.virtual else "",
            rx_air_address=hw.virtual_air.stream_address if hw.virtual else "",
            **_section_fields(hw.usrp, UsrpSettings),
        )
        try:
            return UsrpLink(
                waveform_params(hw), settings, log_dir=log_dir, confidence=confidence,
                record_dir=record_dir, center_freq_hz=hw.center_freq_hz, hw_name=hw.name,
                on_close=None if air is None else air.close,
            )
        except BaseException:
            if air is not None:
                air.close()
            raise
    raise ValueError(f"link: got {name!r}; allowed: {', '.join(repr(n) for n in LINKS)}")
