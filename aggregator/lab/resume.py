"""The lab aggregator's run directory across restarts: open or create it, the uploads of the
round under way that a restarted aggregator must not ask for again, and a finished run's
answer to edges that join after its end.

**A round interrupted by a crash (kill -9).** What the aggregator had received of the round
is in ``inflight/`` (kept right after each upload is recorded): the resumed round reuses
those uploads, as ``testbed run`` does. A device whose upload of the round is in the ledger
but not in ``inflight/`` (its intent was journalled, so the new
:class:`~testbed.core.privacy.book.PrivacyBook` recorded it with its gated values; or the
crash came between the record and ``inflight/``) is lost for the round: charged once, not
asked again (:mod:`aggregator.resumed_round`, the same rule as in one process). Devices not
recorded are asked as usual, under fresh nonces. Every edge gets ``sync`` when the resumed
aggregator starts (it adopts the records it lacks, its open intent included), so both
ledgers hold the same uploads under the same nonces.

**A finished run** (``summary.json`` says ``completed``, ``budget_exhausted`` or
``diverged``): ``testbed aggregator --resume`` runs no round; it answers every edge that
joins with ``finished`` (the run id, how it ended, and the device's recorded uploads, which
the edge adopts as from ``sync``) until every device was told or ``--join-timeout``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.lab_checks import check_lab_run, mark_lab_run
from testbed.core.runs.interrupts import StopSignals
from testbed.core.runs.rundir import RunDir, atomic_write_bytes
from testbed.core.transport.protocol import ProtocolError, decode, encode

log = logging.getLogger("testbed.aggregator")

#: Outcomes after which a run has nothing left to do (resuming it runs no round).
FINISHED = ("completed", "budget_exhausted", "diverged")


def endpoint_note(path: Path | None, endpoint: str) -> None:
    """Write the bound endpoint (``tcp://127.0.0.1:PORT``) for a launcher to read."""
    if path is not None:
        atomic_write_bytes(path, (endpoint + "\n").encode())


def open_run(
    resume_dir: Path | None, cfg: ExperimentConfig | None, hw: HardwareConfig | None,
    out_dir: Path | None,
) -> tuple[RunDir, ExperimentConfig, HardwareConfig, int, Any, dict[str, Any] | None]:
    """Open the lab run directory ``resume_dir`` (checked) or create ``out_dir`` for ``cfg``.

    Returns the (locked) run directory, its configs, the round to continue with, the
    weights to continue from (``None``: the initial model) and, for a finished run, its
    summary (``None`` otherwise: rounds are to be run).

    Raises
    ------
    RunDirError
        ``resume_dir`` is not a lab run directory, or its files disagree.
    """
    from testbed.core.config.loader import load_experiment, load_hardware
    from testbed.core.links import check_link_config
    from testbed.core.runs.recovery import check_config_pin, resume_point
    from testbed.core.runs.run_metadata import write_metadata

    if resume_dir is not None:
        check_lab_run(resume_dir)
        rundir = RunDir.open(resume_dir)
        try:
            cfg = load_experiment(rundir.path / "config.yaml")
            hw = load_hardware(str(rundir.path / "hw_config.yaml"))
            check_config_pin(rundir, cfg, hw)
            point = resume_point(rundir, private=cfg.scheme != "fedavg")
            summary = None
            if rundir.summary_path.exists():
                summary = json.loads(rundir.summary_path.read_text())
                if summary.get("status") not in FINISHED:
                    summary = None
        except BaseException:
            rundir.close()
            raise
        return rundir, cfg, hw, point.next_round, point.weights, summary
    assert cfg is not None and hw is not None and out_dir is not None
    check_link_config(cfg, hw, record=cfg.record, lab=True)
    rundir = RunDir.create(out_dir)
    try:
        write_metadata(rundir, cfg, hw)
        mark_lab_run(rundir)
    except BaseException:
        rundir.remove()
        raise
    return rundir, cfg, hw, 0, None, None


def device_events(rundir: RunDir, device: int) -> list[dict[str, Any]]:
    """Every upload the run's ledger holds for ``device``, as ``sync`` lists them."""
    from testbed.core.privacy.ledger import Ledger

    if not rundir.ledger_path.exists():
        return []
    with Ledger.open(rundir.ledger_path) as ledger:
        return [{"nonce": e.nonce, "event": e.event.to_dict()} for e in ledger.entries()
                if e.nonce is not None and e.event.device == device]


def serve_finished(
    server: Any, rundir: RunDir, devices: int, summary: dict[str, Any], timeout_s: float,
) -> set[int]:
    """Answer every edge that says anything with ``finished`` until each device was told
    or ``timeout_s`` passed; returns the devices told."""
    reason = f"run ended ({summary.get('status')}): {summary.get('reason') or 'all rounds'}"
    told: set[int] = set()
    deadline = time.monotonic() + timeout_s
    log.info("run %s has ended (%s); telling the edges that join within %g s",
             rundir.path.name, summary.get("status"), timeout_s)
    with StopSignals() as stop:
        while len(told) < devices and time.monotonic() < deadline:
            stop.check()
            got = server.recv(0.2)
            if got is None:
                continue
            identity, device, frames = got
            try:
                msg = decode(frames)
            except ProtocolError:
                continue
            if msg["device"] != device or device >= devices or msg.type == "leave":
                continue
            server.send(identity, encode("finished", {
                "device": device, "run_id": rundir.path.name, "reason": reason,
                "events": device_events(rundir, device)}))
            told.add(device)
            log.info("device %d told that the run has ended", device)
    return told
