"""How an edge agent ends: the run ended (``leave``, ``finished``), or no aggregator answers.

* ``leave`` with ``run ended (...)``: the edge writes ``finished.json`` (run id, how it
  ended) to its state directory and exits 0.
* ``finished`` (the aggregator of a run that has ended, answering a join): the edge adopts
  the uploads recorded for it (as from ``sync``), writes ``finished.json`` and exits 0.
* No message from the aggregator for ``--join-timeout`` seconds (:func:`give_up`): an edge
  whose state directory holds a run (its ``config.yaml``) records its open intents with their
  gated values (its ledger's recovery: the aggregator recorded every upload this edge
  journalled, with the same values on links whose reception is the probed state) and exits
  0 saying so; a fresh state directory means it never got in: an error that names the
  address and the allow-list.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_device.lab.errors import EdgeError
from edge_device.lab.ledger_sync import on_sync
from testbed.core.runs.rundir import atomic_write_bytes

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from testbed.core.config.experiment import ExperimentConfig
    from testbed.core.privacy.book import PrivacyBook

log = logging.getLogger("testbed.edge")

#: The state directory's record that the device's run has ended.
FINISHED_MARKER = "finished.json"


def open_edge_book(
    cfg: ExperimentConfig, state_dir: Path, device: int, max_epsilon: float | None,
) -> tuple[PrivacyBook | None, float | None]:
    """The device's own ledger for ``cfg`` (``None`` without DP) and its target.

    Opening it records any intent journalled before a crash with its gated values.
    """
    from testbed.core.privacy.book import PrivacyBook

    if cfg.scheme == "fedavg":
        return None, None
    target = cfg.privacy.epsilon
    if max_epsilon is not None:
        target = min(target, max_epsilon)
    book = PrivacyBook(
        state_dir / "ledger.jsonl", delta=cfg.privacy.delta, enforce=cfg.privacy.enforced,
        target=target, unit=cfg.privacy.unit, relation=cfg.privacy.relation,
        header={"device": device},
    )
    return book, target


def book_from_state(state_dir: Path, device: int, max_epsilon: float | None
                    ) -> PrivacyBook | None:
    """The ledger of the run the state directory last took part in (``None``: none, or no
    DP), its open intents recorded."""
    from testbed.core.config.loader import load_experiment

    cfg_path = state_dir / "config.yaml"
    if not cfg_path.is_file():
        return None
    return open_edge_book(load_experiment(cfg_path), state_dir, device, max_epsilon)[0]


def record_end(state_dir: Path, run_id: str | None, reason: str) -> None:
    """Write ``finished.json``: the run ``run_id`` has ended (``reason``)."""
    atomic_write_bytes(state_dir / FINISHED_MARKER,
                       (json.dumps({"run_id": run_id, "reason": reason}) + "\n").encode())


def recorded_end(state_dir: Path) -> dict[str, Any] | None:
    """What ``finished.json`` says (``None``: no such record, or unreadable)."""
    try:
        data = json.loads((state_dir / FINISHED_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def adopt(book: PrivacyBook, device: int, events: list[dict[str, Any]]) -> int:
    """Record every upload of ``device`` in ``events`` (``sync`` items) that ``book`` lacks;
    returns how many."""
    from testbed.core.privacy.ledger import EVENT_TYPES

    have = book.nonces()
    added = 0
    for item in events:
        data = item["event"]
        if item["nonce"] in have or data.get("device") != device:
            continue
        cls = EVENT_TYPES.get(data.get("type"))
        if cls is None:
            continue
        book.commit(cls.from_dict(data), item["nonce"])
        added += 1
    return added


def on_finished(agent: AgentView, msg: Any) -> None:
    """The aggregator says the run has ended: adopt its records, note the end."""
    run_id, reason = msg["run_id"], msg["reason"]
    if agent.config_yaml is not None:
        on_sync(agent, msg)  # a set-up edge builds each event from its own config
    else:
        book = book_from_state(agent.state_dir, agent.device, agent.max_epsilon)
        if book is not None:
            try:
                added = adopt(book, agent.device, msg["events"])
            finally:
                book.close()
            if added:
                log.info("device %d: recorded %d uploads as the aggregator did", agent.device,
                         added)
    record_end(agent.state_dir, run_id, reason)
    print(f"device {agent.device}: run {run_id} has ended ({reason}); both ledgers hold its "
          "uploads; exiting", flush=True)


def give_up(agent: AgentView) -> int:
    """No answer from the aggregator for ``join_timeout_s``: end this edge (see above).

    Raises
    ------
    EdgeError
        This state directory never took part in a run: the edge never got in.
    """
    silent = (f"no answer from the aggregator at {agent.endpoint} within "
              f"{agent.join_timeout_s:g} s (--join-timeout)")
    if agent.book is not None:
        agent.book.close()
        agent.book = None
    end = recorded_end(agent.state_dir)
    if end is not None and agent.config_yaml is None:
        print(f"device {agent.device}: run {end.get('run_id')} has ended ({end.get('reason')}; "
              f"{agent.state_dir / FINISHED_MARKER}); {silent}; nothing to do", flush=True)
        return 0
    book = book_from_state(agent.state_dir, agent.device, agent.max_epsilon)
    if book is None and not (agent.state_dir / "config.yaml").is_file():
        raise EdgeError(f"device {agent.device}: {silent}: is the aggregator running there, "
                        "and is this device's public key in the aggregator's allowed/ folder?")
    recovered = 0
    if book is not None:
        recovered = len(getattr(book, "recovered", []))
        book.close()
    print(f"device {agent.device}: {silent}; giving up: its run has ended or its aggregator "
          f"is gone (restart this edge if the run is resumed); {recovered} open uploads "
          "recorded with their gated values", flush=True)
    return 0
