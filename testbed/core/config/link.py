"""The links a run can use (:data:`LINKS`) and which one it uses: the experiment's choice
over its hardware config's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:  # only named in annotations: the config modules import this one
    from testbed.core.config.experiment import ExperimentConfig
    from testbed.core.config.hardware import HardwareConfig

#: A link's name: the config key ``link`` of an experiment and of a hardware config takes
#: one of these. A new link adds its name here and a branch in
#: :func:`testbed.core.links.make_link`.
LinkName = Literal["symbol", "waveform", "gnuradio", "usrp"]
#: Every link's name, in the order messages list them.
LINKS: tuple[LinkName, ...] = get_args(LinkName)


def link_name(exp: ExperimentConfig, hw: HardwareConfig) -> str:
    """The link in force: the experiment's ``link`` key, else the hardware config's."""
    return exp.link or hw.link
