"""Settle one device's answer to a round: carry its symbols over the link (or take what a
receiver captured), record the upload in the ledger under its journalled intent, decode it,
and build its metrics entry.

What each answer costs in privacy (:mod:`aggregator.devices`):

* an :class:`~aggregator.devices.Upload` counts with the channel state its reception
  reports (credit only where the link's noise is a secret and trusted); a lost frame or a
  dead link counts with no channel credit;
* a :class:`~aggregator.devices.NoAnswer` counts with its gated values (it may have gone on
  air);
* an :class:`~aggregator.devices.Undecodable` counts, with no channel credit;
* a :class:`~aggregator.devices.Refused` withdraws the intent (nothing went on air).

An upload already recorded before a restart is never asked for again
(:mod:`aggregator.resumed_round`), so every answer here is recorded exactly once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aggregator.decoder import decode_differential, project_coordinates
from aggregator.devices import (
    Answer,
    Devices,
    NoAnswer,
    Refused,
    Settled,
    Undecodable,
    Upload,
)
from aggregator.state import RunState
from radio.link import Link, LinkError, LinkFailed, Reception
from radio.units import linear_to_db
from testbed.core.masks import sparsify_mask
from testbed.core.process.stage_timer import StageTimer
from testbed.core.runs.faults import fault_point, log_air
from testbed.core.transport.protocol import UploadHeader
from testbed.core.upload_events import PrivacyEvent

#: Per-frame measurements of a slot receiver kept in the metrics line.
SLOT_INFO = ("slot_start_s", "timing_error_s", "snr_est_db", "cfo_est_hz", "residual_over_noise_db",
             "n0_off_frame")


def reception_metrics(reception: Reception, symbols: np.ndarray) -> dict[str, float]:
    """Per-upload channel numbers for the metrics line."""
    state = reception.state
    gain_power = state.mean_gain_power()
    signal_power = float(np.mean(np.abs(symbols) ** 2)) if symbols.size else 0.0
    snr = (
        float(linear_to_db(gain_power * signal_power / state.noise_var))
        if state.noise_var > 0 and signal_power > 0
        else float("inf")
    )
    h0 = complex(state.gain[0]) if state.gain.size else 0j
    out = {
        "snr_db": snr,
        "h_abs": abs(h0),
        "h_phase_rad": float(np.angle(h0)),
        "gain_power_mean": gain_power,
        "noise_var": state.noise_var,
        "airtime_s": reception.airtime_s,
    }
    if state.estimated:  # the frame's N0 lower bound (the channel credit rests on it)
        out["noise_var_lower"] = state.noise_var_lower
    if "timing_error_s" in reception.info:  # a TDMA slot's capture: what the lab sees
        out.update({k: float(reception.info[k]) for k in SLOT_INFO if k in reception.info})
    return out


def tally(
    info: dict[str, Any],
    vec: np.ndarray | None,
    decoded: list[np.ndarray],
    losses: list[float],
    per_device: list[dict[str, Any]],
) -> None:
    """Add one device's upload of a round (metrics entry ``info``, decoded differential
    ``vec`` or ``None``) to the round's lists."""
    if vec is not None:
        decoded.append(vec)
    loss = info.get("train_loss")
    if isinstance(loss, float) and np.isfinite(loss):
        losses.append(loss)
    per_device.append(info)


def mask_of(state: RunState, header: UploadHeader) -> np.ndarray:
    """The sparsification mask of an upload (from the run secret, never sent)."""
    return sparsify_mask(
        state.run_secret, header.device, header.round_index, header.d, header.n_values
    )


def receive(
    state: RunState, t: int, i: int, nonce: str | None, up: Upload, link: Link,
    rng: np.random.Generator, timer: StageTimer,
) -> tuple[dict[str, Any], np.ndarray | None, PrivacyEvent]:
    """Carry device ``i``'s upload of round ``t`` over the link (or take what a receiver
    captured of it), record it under the intent ``nonce`` (journalled before the air) and
    decode it.

    Returns its metrics entry, its decoded differential (``None`` when lost) and the event
    it counts as. A dead link raises :class:`LinkFailed` after the upload is recorded
    without channel credit.
    """
    log_air(i, t, nonce)
    book = state.book
    received = up.received

    def carry() -> Reception:
        if isinstance(received, LinkError):
            raise received
        if received is not None:
            return received
        return link.transmit(device=i, round_index=t, symbols=up.symbols, rng=rng)

    try:
        reception = timer.timed("link", carry)
    except LinkError as exc:
        # It may have gone on air: it counts for privacy, with no channel credit.
        lost = state.event(i, t, None)
        if book is not None:
            assert nonce is not None
            book.commit(lost, nonce)
        if isinstance(exc, LinkFailed):
            raise
        return {"device": i, "transmitted": True, "lost": True, "error": str(exc)}, None, lost
    fault_point("after_transmit")
    info: dict[str, Any] = dict(reception_metrics(reception, up.symbols))
    info["device"] = i
    info["transmitted"] = True
    committed = state.event(i, t, reception.state)
    if book is not None:
        assert nonce is not None
        book.commit(committed, nonce)
        fault_point("after_commit")
        for name, result in book.epsilon(i).items():
            info[f"epsilon_{name}"] = result.epsilon
    header = up.header
    g_hat = timer.timed(
        "decode", lambda: decode_differential(reception, header, lambda h: mask_of(state, h))
    )
    cfg = state.cfg
    if state.unit != "record" and cfg.project_decoded and cfg.clip.mode == "coordinate":
        g_hat = project_coordinates(
            g_hat, (state.d / state.uplinks[i].l) * cfg.clip.bound / np.sqrt(state.d)
        )
    info["energy_comm_j"] = (
        up.symbol_energy * state.hw.tx_power_ref_w / state.hw.symbol_rate_hz
        if up.energy_comm_j is None
        else up.energy_comm_j
    )
    info["energy_comp_j"] = up.energy_comp_j  # J, this device's local training
    info["energy_comp_source"] = up.energy_comp_source
    info["alpha"] = header.alpha
    info["sigma"] = state.uplinks[i].sigma
    return info, g_hat, committed


def settle(
    state: RunState, devices: Devices, t: int, i: int, nonce: str | None,
    gated: PrivacyEvent, answer: Answer, link: Link, rng: np.random.Generator,
    timer: StageTimer,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Record (or withdraw) device ``i``'s answer to round ``t`` and acknowledge it.

    ``nonce``: the intent it was journalled under; ``gated``: the event the budget was
    checked with. Returns its metrics entry and decoded differential (``None``: nothing to
    add).
    """
    book = state.book
    if isinstance(answer, Settled):
        return answer.entry, answer.vector
    if isinstance(answer, Refused):
        if book is not None and nonce is not None:
            book.cancel(nonce)
        return {"device": i, "transmitted": False, "refused": answer.reason}, None
    if isinstance(answer, NoAnswer):  # it may have transmitted, so it counts (gated values)
        if book is not None:
            assert nonce is not None
            book.commit(gated, nonce)
        devices.acknowledge(t, i, nonce, gated)
        entry: dict[str, Any] = {"device": i, "transmitted": None, "straggler": True,
                                 "charged": book is not None}
        return entry | answer.extra, None
    if isinstance(answer, Undecodable):  # it went on air: it counts, with no channel credit
        lost = state.event(i, t, None)
        if book is not None:
            assert nonce is not None
            book.commit(lost, nonce)
        devices.acknowledge(t, i, nonce, lost)
        return {"device": i, "transmitted": True, "lost": True, "error": answer.error}, None
    info, vec, committed = receive(state, t, i, nonce, answer, link, rng, timer)
    for key, value in answer.extra.items():
        info.setdefault(key, value)
    info["train_loss"] = answer.train_loss
    # Kept after the ledger record is durable; durable itself at the group commit
    # (testbed.core.runs.inflight, invariant 1).
    timer.timed("keep", lambda: state.rundir.keep_upload(t, i, vec, info))
    fault_point("after_inflight")
    devices.acknowledge(t, i, nonce, committed)
    return info, vec
