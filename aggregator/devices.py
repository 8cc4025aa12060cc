"""How the round loop talks to the devices: one small interface, two implementations.

The aggregator's round (:class:`aggregator.round_loop.RoundLoop`) is written once. It asks
the devices of a round for their uploads and settles what comes back, without knowing where
the devices are:

* :class:`testbed.local_devices.LocalDevices` calls them in this process (``testbed run``:
  each device's local training, in a pool of worker processes when ``workers`` > 1, then
  its encoding, one upload at a time, in device order);
* :class:`aggregator.lab.remote_devices.RemoteDevices` reaches edge agents over the
  authenticated control plane (``testbed aggregator``; ``testbed launch``): the ``round``
  messages go out together, the answers are collected until the round's deadline (and on
  the ``usrp`` link, the TDMA slots are captured), then settled in device order.

Every answer is one of the small records below; the loop settles each into the ledger and
the round's metrics (:mod:`aggregator.settle`). The ledger is the loop's alone, except that
a remote device's intent is journalled by :meth:`Devices.ask` through the ``journal``
callback *before* the device may transmit, and a device that rejoins mid-round is settled by
the remote side from what the edge reports (:class:`Settled`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from radio.link import Link, LinkError, Reception
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.interrupts import StopSignals
from testbed.core.transport.protocol import UploadHeader
from testbed.core.upload_events import PrivacyEvent

#: Journals the intent of one device's upload (before it may go on air) under the nonce
#: given (``None``: a fresh random one); returns the nonce (``None`` when the run keeps no
#: ledger).
Journal = Callable[[int, PrivacyEvent, str | None], str | None]


@dataclass
class Upload:
    """A device's upload: its symbols and what the aggregator needs to decode them.

    Attributes
    ----------
    header
        The upload's header (device, round, ``d``, values sent, scale ``alpha``).
    symbols
        The analog symbols, ``(n,)`` complex; on the split ``usrp`` link (the edge sent its
        own burst) a stand-in of the burst's mean power, the capture is in ``received``.
    symbol_energy
        Sum of ``|symbols|^2`` as sent (unit-power symbols carry 1 each).
    energy_comp_j, energy_comp_source
        The device's local-training energy (J) and how it was found.
    train_loss
        The device's mean local-training loss (``nan``: none).
    received
        What a receiver captured of it (the split ``usrp`` link), or the capture's error;
        ``None``: the aggregator carries ``symbols`` over the run's link.
    energy_comm_j
        The radio energy the edge reported (J); ``None``: computed from ``symbol_energy``.
    extra
        Fields added to the device's metrics entry.
    """

    header: UploadHeader
    symbols: np.ndarray
    symbol_energy: float
    energy_comp_j: float
    energy_comp_source: str
    train_loss: float
    received: Reception | LinkError | None = None
    energy_comm_j: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Refused:
    """The device refused the upload before anything went on air (its own budget check,
    a mechanism it does not agree with): the intent is withdrawn."""

    reason: str


@dataclass
class NoAnswer:
    """No answer by the round's deadline: the device may have transmitted, so the upload
    counts with its gated values, and the round closes without it."""

    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Undecodable:
    """An upload that may have gone on air but cannot be decoded (a bad header, the wrong
    carrier, the wrong size): it counts, with no channel credit."""

    error: str


@dataclass
class Settled:
    """A device the remote side settled itself (it rejoined mid-round and reported its
    ledger): its metrics
    entry and decoded differential (``None``: nothing to add)."""

    entry: dict[str, Any]
    vector: np.ndarray | None = None


Answer = Upload | Refused | NoAnswer | Undecodable | Settled


@dataclass
class Answered:
    """One device's answer to a round, with the nonce its intent was journalled under.

    ``journalled=False``: the device has not transmitted yet (in process: its upload goes
    on air when the loop carries it over the link), and the loop journals the intent right
    before that."""

    device: int
    nonce: str | None
    answer: Answer
    journalled: bool = True


@dataclass
class SecAggOutcome:
    """What a round of 002's secure aggregation gives the loop.

    Attributes
    ----------
    total
        Sum of the included devices' updates, ``(d,)``; ``None`` when the round was
        abandoned (the model stays as it is).
    devices
        Metrics entry of every device asked.
    losses
        Training losses of the devices in the sum.
    report
        The round's ``secagg`` metrics (``status``, the sets of each phase); ``None`` in
        process (one process holds every device: nothing can go missing).
    """

    total: np.ndarray | None
    devices: dict[int, dict[str, Any]]
    losses: list[float]
    report: dict[str, Any] | None = None


@runtime_checkable
class Devices(Protocol):
    """The devices of a run, as the round loop sees them."""

    #: ``True``: a round's metrics list every device of the run (the lab: who was absent,
    #: not selected, over budget); ``False``: the devices selected for the round only (in
    #: process: the line does not grow with the population).
    lists_every_device: bool

    #: Processes training a round's devices (the summary's ``workers``).
    workers: int

    #: Devices trained together in one batched pass (the summary's ``batch_devices``; 1:
    #: one after another).
    batch_devices: int

    #: Where the devices' computing energy comes from (the summary's
    #: ``energy_comp_source``).
    energy_source: str

    def session(self) -> AbstractContextManager[Any]:
        """The run's resources on the device side (the training pool), open while rounds
        run; entered before the stop signals and the link."""

    def open_link(self, record_dir: Path | None) -> Link:
        """The run's link, started (closed when the run ends)."""

    def begin_round(self, t: int, stop: StopSignals) -> None:
        """Before round ``t`` is gated (the lab waits for edges that dropped out)."""

    def absent(self, devices: set[int]) -> set[int]:
        """Those of ``devices`` that cannot be asked now (not connected)."""

    def ask(
        self, t: int, w: np.ndarray, asked: dict[int, PrivacyEvent], journal: Journal,
        stop: StopSignals, timer: StageTimer,
    ) -> Iterator[Answered]:
        """Ask ``asked`` (device -> gated event) for their uploads of round ``t`` from the
        global model ``w`` (``(d,)``); yield one answer per device of ``asked``, in device
        order. A device already recorded for the round is never among them
        (:mod:`aggregator.resumed_round`)."""

    def acknowledge(self, t: int, i: int, nonce: str | None, event: PrivacyEvent) -> None:
        """Tell device ``i`` its upload of round ``t`` is settled, as recorded (``event``)."""

    def end_round(self, t: int) -> dict[str, Any]:
        """After round ``t``'s uploads are settled and before the round is closed: the
        device side's fields for the metrics line (the TDMA guard); raises a failure held
        back until every upload was settled (a dead receiver)."""

    def secure_round(
        self, t: int, w: np.ndarray, asked: dict[int, PrivacyEvent], stop: StopSignals,
        timer: StageTimer,
    ) -> SecAggOutcome:
        """Round ``t`` of 002's secure aggregation among ``asked`` (device -> gated event):
        their updates summed, each recorded in the ledger before the sum is revealed. The
        outcome has an entry for each of ``asked``."""

    def end_run(self, summary: dict[str, Any]) -> None:
        """The run ended (``summary``): let the devices go."""
