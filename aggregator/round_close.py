"""The end of a round: average what was decoded, update the global model, evaluate it, and
build the round's metrics line."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from aggregator.aggregate import global_update
from aggregator.evaluate import Evaluation, evaluate, sample_scores
from aggregator.solver.calibration import smoothed_losses
from aggregator.state import RunState
from testbed.core.process.stage_timer import StageTimer
from testbed.core.scheme_api import checked, scheme_of


def reaches_target(state: RunState, losses: list[float]) -> bool:
    """Whether the training losses ``losses`` (one per round, the last one the newest)
    reach ``stop_at_loss`` (trailing mean over ``loss_target_window`` rounds)."""
    cfg = state.cfg
    if cfg.stop_at_loss is None or not losses:
        return False
    window = cfg.loss_target_window
    return bool(smoothed_losses(losses[-window:], window)[-1] <= cfg.stop_at_loss)


def close_round(
    state: RunState,
    t: int,
    decoded: list[np.ndarray],
    losses: list[float],
    per_device: list[dict[str, Any]],
    timer: StageTimer,
    t0: float,
    committed_losses: list[float],
    *,
    n_avg: int | None = None,
) -> dict[str, Any]:
    """Combine round ``t``'s decoded differentials (the scheme's ``combine``: the mean for
    every built-in) into ``state.w``, evaluate, and build its metrics line.

    ``per_device``: one entry per device listed, in device order; ``committed_losses``: the
    training losses of the rounds committed before (``stop_at_loss``); ``t0``: the round's
    start (``time.perf_counter``). ``n_avg``: the number the sum is divided by (default
    every device, 003 eq. 14, or the ``sample_devices`` asked; the devices asked, for the
    schemes that sample devices).
    """
    cfg = state.cfg
    default = cfg.sample_devices if cfg.sample_devices is not None else cfg.devices
    over = default if n_avg is None else max(1, n_avg)
    if decoded:  # nothing received (every upload lost): the model stays as it is
        scheme = scheme_of(cfg)

        def step() -> np.ndarray:
            direction = scheme.combine(decoded, n_devices=over, round_index=t)
            return global_update(state.w, checked(direction, state.w.size,
                                                  f"{scheme.name}.combine"), cfg.lr)

        state.w = timer.timed("aggregate", step)
    lost = [d["device"] for d in per_device if d.get("lost")]
    train_loss = float(np.mean(losses)) if losses else float("nan")
    line: dict[str, Any] = {
        "round": t,
        "train_loss": train_loss,
        "uploads": len(decoded),
        "lost_uploads": len(lost),
    }
    line |= evaluations(state, t, train_loss, timer, committed_losses)
    line["devices"] = per_device
    line["wall_s"] = {k: round(v, 6) for k, v in timer.totals.items()}
    line["wall_s"]["round"] = round(time.perf_counter() - t0, 6)
    return line


def evaluations(
    state: RunState, t: int, train_loss: float, timer: StageTimer,
    committed_losses: list[float],
) -> dict[str, float]:
    """Round ``t``'s evaluations of the new global model: ``subset_accuracy`` and
    ``subset_loss`` on the fixed subset every round (``eval_subset``), and
    ``test_accuracy`` and ``test_loss`` on the full (capped) test set every
    ``eval_every`` rounds, in the last round and in the round that reaches
    ``stop_at_loss`` (so a run's final accuracy is always a full-set one). A round with
    both takes the subset's figures from the full pass."""
    cfg = state.cfg
    full = (
        (t + 1) % cfg.eval_every == 0
        or t + 1 == cfg.rounds
        or reaches_target(state, [*committed_losses, train_loss])
    )
    out: dict[str, float] = {}
    sub: Evaluation | None = None
    threads = state.eval_threads
    if full:
        data = state.data
        scores = timer.timed("eval", lambda: sample_scores(
            state.model, state.w, data.x_test, data.y_test, threads=threads))
        ev = scores.summary()
        out["test_accuracy"], out["test_loss"] = ev.accuracy, ev.loss
        if state.eval_index is not None:
            sub = scores.summary(state.eval_index)
    elif state.eval_index is not None:
        sub = timer.timed("eval_subset", lambda: evaluate(
            state.model, state.w, state.x_sub, state.y_sub, threads=threads))
    if sub is not None:
        out["subset_accuracy"], out["subset_loss"] = sub.accuracy, sub.loss
    return out
