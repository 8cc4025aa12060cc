"""The rounds of a run, from a start round to the end: each round's line committed to the
run directory, the progress bar, the run's outcome and its summary.

The same for ``testbed run`` and the lab aggregator: only the devices differ
(:mod:`aggregator.devices`).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

from aggregator.round_close import reaches_target
from aggregator.round_loop import RoundLoop
from aggregator.solver.calibration import uploads_to_target
from aggregator.summary import summary as build_summary
from radio.link import LinkFailed
from testbed.core.interrupts import StopSignals
from testbed.core.run_errors import TrainingDiverged

#: Called after every round with the round's metrics line.
RoundCallback = Callable[[dict[str, Any]], None]


def run_rounds(
    loop: RoundLoop, start_round: int = 0, *, progress: bool = False,
    on_round: RoundCallback | None = None,
) -> dict[str, Any]:
    """Run rounds ``start_round .. rounds-1`` of ``loop``; returns the summary.

    Never raises for an outcome: the summary's ``status`` (one of
    :data:`aggregator.outcome.OUTCOMES`) and ``reason`` say how the run ended, the devices
    are let go (:meth:`~aggregator.devices.Devices.end_run`) and the run directory's lock
    is released.
    """
    state, devices = loop.state, loop.devices
    cfg, rundir = state.cfg, state.rundir
    t_start = time.perf_counter()
    status, reason = "completed", ""
    record_dir = rundir.recordings_path if cfg.record else None
    bar = _progress_bar(cfg.rounds, start_round, enabled=progress)
    shown = _Shown()
    # stop_at_loss: the training losses committed so far (a resumed run that had already
    # reached the target completes without running another round).
    losses = loop.losses
    if cfg.stop_at_loss is not None and start_round > 0:
        losses += [m.get("train_loss", float("nan")) for m in rundir.metrics()]
        hit = uploads_to_target(losses, cfg.stop_at_loss, cfg.loss_target_window)
        if hit is not None:
            reason = _target_reason(loop, hit - 1)
            start_round = cfg.rounds
    summary: dict[str, Any] = {}
    try:
        # The device side first: a training pool's workers fork before signal handlers,
        # link processes and threads exist, and it is closed (workers reaped) after the link.
        with (
            devices.session(),
            StopSignals() as stop,
            devices.open_link(record_dir) as link,
        ):
            for t in range(start_round, cfg.rounds):
                stop.check()
                line = loop._round(t, link, stop)
                if line is None:
                    status = "budget_exhausted"
                    reason = (
                        f"round {t}: no device can upload without passing its epsilon "
                        f"target {cfg.privacy.epsilon} ({cfg.privacy.enforced} accounting)"
                    )
                    break
                with stop.critical():
                    rundir.commit_round(t, state.w, {"d": state.d}, line)
                if on_round is not None:
                    on_round(line)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(shown.fields(loop, line))
                if cfg.stop_at_loss is not None:
                    # After the commit: the round that reached the target is kept.
                    losses.append(line["train_loss"])
                    if reaches_target(state, losses):
                        reason = _target_reason(loop, t)
                        break
    except KeyboardInterrupt:
        status, reason = "interrupted", "stopped by a signal (SIGINT/SIGTERM)"
    except LinkFailed as exc:
        status, reason = "link_failed", str(exc)
    except TrainingDiverged as exc:
        status, reason = "diverged", str(exc)
    except Exception as exc:  # noqa: BLE001 - every other failure is reported, not lost
        status, reason = "failed", f"{type(exc).__name__}: {exc}"
        (rundir.path / "error.log").write_text(traceback.format_exc())
    finally:
        if bar is not None:
            bar.close()
        try:
            summary = build_summary(state, status, reason, time.perf_counter() - t_start,
                                    workers=devices.workers,
                                    energy_source=devices.energy_source)
            if state.book is not None:
                state.book.close()
            rundir.write_summary(summary)
            rundir.close()
        finally:
            devices.end_run(summary)
    return summary


def _target_reason(loop: RoundLoop, t: int) -> str:
    """The summary's reason of a run ended by ``stop_at_loss`` at round ``t``."""
    cfg = loop.state.cfg
    return (
        f"target loss reached at round {t}: training loss averaged over "
        f"{cfg.loss_target_window} rounds <= stop_at_loss {cfg.stop_at_loss:g}"
    )


class _Shown:
    """What the progress bar shows after each round (the running figures)."""

    def __init__(self) -> None:
        self.accuracy = float("nan")
        self.eps_max = 0.0

    def fields(self, loop: RoundLoop, line: dict[str, Any]) -> dict[str, str]:
        fields = {"loss": f"{line['train_loss']:.3f}"}
        if "test_accuracy" in line:
            self.accuracy = line["test_accuracy"]
        fields["acc"] = f"{self.accuracy:.3f}"
        if "subset_accuracy" in line:
            fields["acc_subset"] = f"{line['subset_accuracy']:.3f}"
        book = loop.state.book
        if book is not None:
            # Epsilon only grows with uploads: the running maximum needs this round's only.
            sent = [d["device"] for d in line["devices"] if d.get("transmitted")]
            self.eps_max = max([self.eps_max, *map(book.enforced_epsilon, sent)])
            fields["eps_max"] = f"{self.eps_max:.3g}"
        return fields


def _progress_bar(total: int, initial: int, *, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="round", desc="rounds", dynamic_ncols=True)
