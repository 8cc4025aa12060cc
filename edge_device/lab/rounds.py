"""The agent's answer to a ``round`` request: check it, train, keep, then upload or refuse.

In order: a replayed or out-of-round request (its nonce already journalled, recorded or
withdrawn here) is ignored; a second upload in a round the ledger holds (a (device, round)
is released and charged at most once, docs/privacy.md section 5.2), a usrp round without a
transmitter, an aggregator privacy event that differs from the device's own
(:func:`~edge_device.lab.ledger_sync.mechanism_differs`), an upload past the device's own
epsilon target, or a diverged training is refused. Otherwise the device trains
(:class:`edge_device.device_worker.DeviceWorker`), keeps its update when asked
(``--keep-updates``), and answers by secure aggregation
(:mod:`edge_device.lab.secagg_phases`), by its own burst (:mod:`edge_device.lab.transmit`),
or with the symbols over the control plane (its intent journalled first). In a round paced
by the edges (``await_slot``, the split ``usrp`` link) the device says ``upload_ready`` once
its upload is prepared, and transmits when the ``slot`` comes (:func:`on_slot`).
"""

from __future__ import annotations

import io
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_device.device_worker import TrainingDiverged
from edge_device.lab.agent_view import Prepared
from edge_device.lab.ledger_sync import mechanism_differs, own_event
from edge_device.lab.replies import refuse, send, upload_fields
from edge_device.lab.secagg_phases import begin_secagg
from edge_device.lab.transmit import burst_samples, prepare_offset, transmit
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.faults import fault_point, ready_delay_s
from testbed.core.runs.rundir import atomic_write_bytes

if TYPE_CHECKING:
    from edge_device.lab.agent_view import AgentView
    from testbed.core.transport.curve_client import CurveClient
    from testbed.core.transport.protocol import Message

log = logging.getLogger("testbed.edge")


def on_round(agent: AgentView, client: CurveClient, msg: Message) -> None:
    """Answer one ``round`` request (see above).

    Parameters
    ----------
    agent
        A set-up agent (its ``worker``, ledger, transmitter).
    client
        The control-plane connection to the aggregator.
    msg
        The ``round`` message: ``round``, ``nonce``, ``d``, ``channel``, ``mechanism``,
        ``tx_time_s`` (``None`` off the usrp link), the model as float64 payload.

    Raises
    ------
    EdgeError
        The transmitter is dead (:func:`edge_device.lab.transmit.transmit`).
    """
    assert agent.worker is not None
    t, nonce, tx_time = msg["round"], msg["nonce"], msg["tx_time_s"]
    known = (agent.book.nonces() if agent.book else set()) | set(agent.pending) | agent.withdrawn
    if agent.secagg is not None:
        known |= agent.secagg.seen
    rounds = {e.round for _, e in agent.book.entries(agent.device)} if agent.book else set()
    if nonce in known or t < max(rounds, default=-1) or msg["d"] != agent.d:
        agent.dropped += 1
        log.warning("device %d: ignored a replayed or out-of-round request (round %d)",
                    agent.device, t)
        return
    if t in rounds:  # e.g. asked again after the aggregator restarted: one per round
        refuse(agent, client, t, nonce, f"this device's ledger already records an upload "
                                        f"in round {t}")
        return
    paced = bool(msg["await_slot"])
    if (tx_time is not None or paced) and agent.air is None:
        refuse(agent, client, t, nonce, (
            f"the aggregator runs the usrp link, but this edge's link is {agent.link} "
            "(no transmitter); start it with --hw naming the lab's usrp config"))
        return
    if msg["aircomp"] is not None and not agent.shared_time:
        refuse(agent, client, t, nonce, (
            "scheme aircomp needs a shared time and frequency reference; this edge's "
            "usrp.time_source is not shared"))
        return
    if tx_time is None and not paced and agent.air is not None and agent.secagg is None:
        log.warning("device %d: round %d without a slot time: the aggregator's link is "
                    "simulated; sending the symbols over the control plane", agent.device, t)
    event = own_event(agent, t, msg["channel"])
    differs = mechanism_differs(agent, event, msg["mechanism"])
    if differs:
        refuse(agent, client, t, nonce, differs)
        return
    if agent.book is not None and not agent.book.allows(event):
        refuse(agent, client, t, nonce, (
            f"this upload would pass the device's own epsilon target "
            f"{agent.target:g} ({agent.book.enforce} accounting)"))
        return
    w = np.frombuffer(msg.payload or b"", dtype="<f8").astype(np.float64)
    try:
        local = agent.worker.update(w, t, StageTimer())
    except TrainingDiverged as exc:
        refuse(agent, client, t, nonce, str(exc))
        return
    keep_update(agent, t, nonce, w, local.differential)
    if agent.secagg is not None:
        begin_secagg(agent, client, t, nonce, local, event)
        return
    if paced:  # the slot comes once the aggregator has every device's upload_ready
        # Everything but the journal and the hand-over is done before saying ready: the
        # burst made, the clock offset measured for a slot at most the deadline away.
        if not prepare_offset(agent, client, t, nonce, float(msg["deadline_s"])):
            return
        agent.prepared = Prepared(t, nonce, event, local, msg["aircomp"],
                                  burst_samples(agent, t, local, msg["aircomp"]))
        delay = ready_delay_s()
        if delay > 0:
            time.sleep(delay)  # a slow device (tests): a straggler past the train allowance
        send(agent, client, "upload_ready", {"round": t, "nonce": nonce,
                                             "n_symbols": int(local.upload.symbols.size)})
        return
    if tx_time is not None:
        transmit(agent, client, t, nonce, event, local, float(tx_time), msg["aircomp"])
        return
    _upload_symbols(agent, client, t, nonce, event, local)


def on_slot(agent: AgentView, client: CurveClient, msg: Message) -> None:
    """``slot``: transmit the prepared upload at ``tx_time_s`` (its intent journalled
    first, :func:`edge_device.lab.transmit.transmit`); ``null``: the round's slots were set
    without this device (not ready in time), so the upload is dropped: it never goes on
    air and nothing is charged. A slot for anything but the prepared upload is ignored.

    Raises
    ------
    EdgeError
        The transmitter is dead.
    """
    prepared = agent.prepared
    if prepared is None or (prepared.round, prepared.nonce) != (msg["round"], msg["nonce"]):
        agent.dropped += 1
        log.warning("device %d: ignored a slot for an upload it has not prepared (round %d)",
                    agent.device, msg["round"])
        return
    agent.prepared = None
    if msg["tx_time_s"] is None:
        agent.withdrawn.add(prepared.nonce)
        log.warning("device %d: round %d: no slot (not ready within the train allowance); "
                    "nothing sent", agent.device, prepared.round)
        return
    transmit(agent, client, prepared.round, prepared.nonce, prepared.event, prepared.local,
             float(msg["tx_time_s"]), prepared.aircomp, samples=prepared.samples,
             offset_measured=True)


def _upload_symbols(agent: AgentView, client: CurveClient, t: int, nonce: str, event: Any,
                    local: Any) -> None:
    """Simulated link: journal the intent, then send the symbols in the ``upload``."""
    fault_point("edge_before_intent")
    if agent.book is not None:
        agent.book.begin(event, nonce)  # before the air
    agent.pending[nonce] = event
    fault_point("edge_after_intent")
    symbols = np.ascontiguousarray(local.upload.symbols, dtype="<c16")
    fields = {**upload_fields(t, nonce, local, int(symbols.size)), "on_air": False,
              "tx_report": None}
    send(agent, client, "upload", fields, symbols.tobytes())
    agent.uploads += 1


def keep_update(agent: AgentView, t: int, nonce: str, w: np.ndarray,
                update: np.ndarray | None) -> None:
    """``--keep-updates``: write round ``t``'s model and noisy differential
    (``updates/round-T-NONCE.npz``, float64 ``w`` and ``update``, shape ``(d,)``).

    Parameters
    ----------
    agent
        The agent (its ``keep_updates`` and ``state_dir``).
    t, nonce
        The ``round`` request trained for.
    w
        The model it trained from.
    update
        Its noisy differential (``None``: nothing is written).
    """
    if not agent.keep_updates or update is None:
        return
    buf = io.BytesIO()
    np.savez(buf, w=np.asarray(w, np.float64), update=np.asarray(update, np.float64),
             round=np.int64(t))
    folder = agent.state_dir / "updates"
    folder.mkdir(exist_ok=True)
    atomic_write_bytes(folder / f"round-{t}-{nonce}.npz", buf.getvalue())
