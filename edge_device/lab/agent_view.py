"""What the parts of the edge agent see of it: the :class:`AgentView` protocol.

The message handlers in :mod:`edge_device.lab.clock`, :mod:`edge_device.lab.ledger_sync`,
:mod:`edge_device.lab.rounds`, :mod:`edge_device.lab.secagg_phases`,
:mod:`edge_device.lab.transmit`, :mod:`edge_device.lab.replies` and
:mod:`edge_device.lab.edge_end` are functions that take the agent; they type it with this
protocol rather than with :class:`~edge_device.lab.agent.EdgeAgent`, so none of them imports
the agent (which imports them all).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from edge_device.device_worker import DeviceWorker
    from edge_device.lab.secagg_client import EdgeSecAgg
    from radio.edge_radio import EdgeTransmitter
    from radio.time_sync import OffsetEstimate
    from radio.usrp_settings import DeviceRadio
    from testbed.core.config.experiment import ExperimentConfig
    from testbed.core.privacy.book import PrivacyBook


@dataclass(frozen=True)
class Prepared:
    """An upload trained, noised and encoded for a round paced by the edges, waiting for
    its ``slot`` (nothing journalled, nothing sent; :func:`edge_device.lab.rounds.on_slot`).
    """

    round: int
    nonce: str
    event: Any
    local: Any
    aircomp: dict[str, Any] | None
    #: The burst's samples, complex ``(n,)`` (made before ``upload_ready``).
    samples: Any


class AgentView(Protocol):
    """The state of one device's agent that its message handlers read and write.

    :class:`~edge_device.lab.agent.EdgeAgent` documents each attribute; the run's attributes
    (``cfg`` to ``waveform``) exist once the ``welcome`` has set the agent up.
    """

    # -- who and where ------------------------------------------------------------------
    endpoint: str
    device: int
    state_dir: Path
    max_epsilon: float | None
    join_timeout_s: float
    run_id: str | None
    config_yaml: str | None
    keep_updates: bool

    # -- the run (set up by ``welcome``) --------------------------------------------------
    cfg: ExperimentConfig
    d: int
    uplink: Any
    record: Any
    target: float
    link: str
    waveform: Any
    worker: DeviceWorker | None
    book: PrivacyBook | None
    secagg: EdgeSecAgg | None

    # -- uploads and counts ---------------------------------------------------------------
    pending: dict[str, Any]
    withdrawn: set[str]
    prepared: Prepared | None
    dropped: int
    uploads: int
    refusals: int

    # -- the transmitter and the clock offset (usrp link) ---------------------------------
    air_factory: Callable[[DeviceRadio, Path], EdgeTransmitter]
    air: EdgeTransmitter | None
    shared_time: bool
    clock: Callable[[], float]
    clock_timeout_s: float
    offset: OffsetEstimate | None
    inbox: deque[list[bytes]]
