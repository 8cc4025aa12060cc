"""Build the link an experiment asks for (the experiment's ``link`` or the hw config's)."""

from __future__ import annotations

from pathlib import Path

from radio.link import Link
from radio.symbol_link import ChannelParams, SymbolLink
from testbed.config.experiment import ExperimentConfig
from testbed.config.hardware import HardwareConfig


def channel_params(exp: ExperimentConfig, hw: HardwareConfig) -> ChannelParams:
    """The simulated-channel description of an experiment on a hardware config."""
    return ChannelParams(
        snr_db=tuple(exp.snr_db_per_device()),
        fading=exp.fading,
        rician_k_db=exp.rician_k_db,
        coherence_symbols=hw.coherence_symbols,
        symbol_rate_hz=hw.symbol_rate_hz,
        noiseless=exp.noiseless,
    )


def link_name(exp: ExperimentConfig, hw: HardwareConfig) -> str:
    """The link in force: the experiment's ``link`` key, else the hardware config's."""
    return exp.link or hw.link


def make_link(
    exp: ExperimentConfig, hw: HardwareConfig, record_dir: Path | None = None
) -> Link:
    """Construct (and for process-backed links, start) the experiment's link.

    Parameters
    ----------
    record_dir
        When given (``record: true``), links that handle I/Q store each received upload
        there as SigMF.
    """
    name = link_name(exp, hw)
    if name == "symbol":
        return SymbolLink(channel_params(exp, hw))
    raise NotImplementedError(f"link '{name}' is not available yet")
