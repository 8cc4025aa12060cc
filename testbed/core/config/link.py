"""Which link a run uses: the experiment's choice over its hardware config's."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only named in annotations: the config modules import this one
    from testbed.core.config.experiment import ExperimentConfig
    from testbed.core.config.hardware import HardwareConfig


def link_name(exp: ExperimentConfig, hw: HardwareConfig) -> str:
    """The link in force: the experiment's ``link`` key, else the hardware config's."""
    return exp.link or hw.link
