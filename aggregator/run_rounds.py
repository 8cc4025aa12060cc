"""The rounds of a run, from a start round to the end: each round's line committed to the
run directory, the progress shown (a bar on a terminal, else one plain line per round or
every ``progress_every`` rounds, :func:`progress_line`), the run's outcome and its summary.

The same for ``testbed run`` and the lab aggregator: only the devices differ
(:mod:`aggregator.devices`).
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from aggregator.round_close import reaches_target
from aggregator.round_loop import RoundLoop
from aggregator.run_board import open_run_board
from aggregator.solver.calibration import uploads_to_target
from aggregator.summary import summary as build_summary
from radio.link import LinkFailed
from testbed.core.process import startup_gc
from testbed.core.process.process_clock import process_age_s
from testbed.core.runs.interrupts import StopSignals
from testbed.core.runs.run_errors import TrainingDiverged

#: Called after every round with the round's metrics line.
RoundCallback = Callable[[dict[str, Any]], None]
#: Where the plain progress lines go (one call per line, without a newline).
LineSink = Callable[[str], None]


def run_rounds(
    loop: RoundLoop, start_round: int = 0, *, progress: bool = False,
    on_round: RoundCallback | None = None, emit: LineSink | None = None,
) -> dict[str, Any]:
    """Run rounds ``start_round .. rounds-1`` of ``loop``; returns the summary.

    Never raises for an outcome: the summary's ``status`` (one of
    :data:`aggregator.outcome.OUTCOMES`) and ``reason`` say how the run ended, the devices
    are let go (:meth:`~aggregator.devices.Devices.end_run`) and the run directory's lock
    is released.

    Parameters
    ----------
    loop
        The run's round loop (state and devices).
    start_round
        The first round to run (0-based; a resumed run's next round).
    progress
        Show the run's progress: a tqdm bar when stderr is a terminal, else one
        :func:`progress_line` every ``progress_every`` rounds (and after the last round
        run) through ``emit``. ``False``: nothing.
    on_round
        Called after every committed round with its metrics line.
    emit
        Where the plain lines go; default: printed to stderr (flushed).
    """
    state, devices = loop.state, loop.devices
    cfg, rundir = state.cfg, state.rundir
    t_start = time.perf_counter()
    status, reason = "completed", ""
    record_dir = rundir.recordings_path if cfg.record else None
    shown = _Progress(loop, start_round, enabled=progress, emit=emit)
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
    startup_s: float | None = None  # this process's age when its first round began
    board = None  # the run's TensorBoard event files (aggregator.run_board)
    try:
        # The device side first: a training pool's workers fork before signal handlers,
        # link processes and threads exist, and it is closed (workers reaped) after the link.
        with (
            devices.session(),
            StopSignals() as stop,
            devices.open_link(record_dir) as link,
        ):
            shown.start()
            # the workers idle while the global model is evaluated: it may use their cores
            state.eval_threads = cfg.torch_threads * max(1, devices.workers)
            startup_s = process_age_s()
            startup_gc.resume()
            board = open_run_board(loop, start_round, emit or _print_to_stderr)
            for t in range(start_round, cfg.rounds):
                stop.check()
                line = loop.run_one_round(t, link, stop)
                if line is None:
                    status = "budget_exhausted"
                    reason = (
                        f"round {t}: no device can upload without passing its epsilon "
                        f"target {cfg.privacy.epsilon} ({cfg.privacy.enforced} accounting)"
                    )
                    break
                with stop.critical():
                    rundir.commit_round(t, state.w, {"d": state.d}, line)
                if board is not None:
                    board.round(line)
                if on_round is not None:
                    on_round(line)
                if cfg.stop_at_loss is not None:
                    # After the commit: the round that reached the target is kept.
                    losses.append(line["train_loss"])
                    if reaches_target(state, losses):
                        reason = _target_reason(loop, t)
                        shown.round_done(t, line, last=True)
                        break
                shown.round_done(t, line, last=t + 1 == cfg.rounds)
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
        shown.close()
        try:
            summary = build_summary(state, status, reason, time.perf_counter() - t_start,
                                    workers=devices.workers,
                                    batch_devices=devices.batch_devices,
                                    energy_source=devices.energy_source, startup_s=startup_s)
            if state.book is not None:
                state.book.close()
            rundir.write_summary(summary)
            if board is not None:
                board.close(summary)
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


def format_duration(seconds: float) -> str:
    """A duration for a person: ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def progress_line(
    round_no: int,
    rounds: int,
    train_loss: float,
    *,
    elapsed_s: float,
    remaining_s: float | None = None,
    test_accuracy: float | None = None,
    subset_accuracy: float | None = None,
    epsilon_max: float | None = None,
    epsilon_unit: str = "",
    accountant: str = "",
) -> str:
    """One plain progress line of a run (what a run prints per round off a terminal).

    Parameters
    ----------
    round_no
        Rounds done, counted from 1: the line of round ``t`` (0-based, as in the metrics,
        the logs and the report) has ``t + 1``, and shows both.
    rounds
        Rounds planned.
    train_loss
        The round's training loss.
    elapsed_s
        Seconds since this process started the rounds.
    remaining_s
        Estimated seconds to the last planned round (``None``: not known; left out).
    test_accuracy
        The full test set's accuracy when it was evaluated this round (else ``None``).
    subset_accuracy
        The evaluation subset's accuracy this round (``None``: not evaluated); shown only
        without ``test_accuracy``.
    epsilon_max
        The largest enforced epsilon of any device so far (``None``: no privacy accounting).
    epsilon_unit, accountant
        The privacy unit (``record`` or ``device``) and the enforcing accounting, shown
        with ``epsilon_max``.

    Returns
    -------
    str
        E.g. ``round 2 (3/40): train loss 0.512, test accuracy 0.8123, max epsilon 1.23
        (record, rdp), 12.3 s elapsed, about 2 min 40 s to go``.
    """
    parts = [f"round {round_no - 1} ({round_no}/{rounds}): train loss {train_loss:.4g}"]
    if test_accuracy is not None:
        parts.append(f"test accuracy {test_accuracy:.4f}")
    if subset_accuracy is not None and test_accuracy is None:
        parts.append(f"subset accuracy {subset_accuracy:.4f}")
    if epsilon_max is not None:
        parts.append(f"max epsilon {epsilon_max:.3g} ({epsilon_unit}, {accountant})")
    parts.append(f"{format_duration(elapsed_s)} elapsed")
    if remaining_s is not None:
        parts.append(f"about {format_duration(remaining_s)} to go")
    return ", ".join(parts)


def _print_to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())


class _Progress:
    """What a run shows of its progress: a tqdm bar on a terminal, else plain lines.

    Keeps the running figures both show: the last full-test accuracy and the largest
    enforced epsilon so far (a resumed run starts from the epsilons its metrics recorded).
    """

    def __init__(self, loop: RoundLoop, start_round: int, *, enabled: bool,
                 emit: LineSink | None) -> None:
        cfg = loop.state.cfg
        self.loop = loop
        self.rounds = cfg.rounds
        self.every = cfg.progress_every
        self.start_round = start_round
        self.accuracy = float("nan")
        self.eps_max = 0.0
        self.t0 = time.perf_counter()
        terminal = enabled and _stderr_is_terminal()
        self.bar: Any = _progress_bar(cfg.rounds, start_round, enabled=terminal)
        self.emit: LineSink | None = (emit or _print_to_stderr) if enabled and not terminal \
            else None
        book = loop.state.book
        if (self.bar is not None or self.emit is not None) and book is not None \
                and start_round > 0:
            key = f"epsilon_{book.enforce}"
            for m in loop.state.rundir.metrics():
                for d in m.get("devices", []):
                    value = d.get(key)
                    if isinstance(value, int | float) and value > self.eps_max:
                        self.eps_max = float(value)

    def start(self) -> None:
        """The rounds begin (elapsed and remaining time count from here)."""
        self.t0 = time.perf_counter()

    def round_done(self, t: int, line: dict[str, Any], *, last: bool) -> None:
        """Round ``t`` (0-based) was committed with metrics ``line``; ``last``: no round
        follows in this process (a plain line is printed whatever ``progress_every``)."""
        if self.bar is None and self.emit is None:
            return
        evaluated = "test_accuracy" in line
        if evaluated:
            self.accuracy = line["test_accuracy"]
        book = self.loop.state.book
        if book is not None:
            # Epsilon only grows with what a device is charged: the running maximum needs
            # this round's devices only (uploads, losses and stragglers alike). An upload's
            # entry carries its epsilons; the book is asked for the others.
            key = f"epsilon_{book.enforce}"
            for d in line["devices"]:
                if d.get("transmitted") is False and not d.get("charged"):
                    continue
                value = d.get(key)
                eps = float(value) if isinstance(value, int | float) else \
                    book.enforced_epsilon(d["device"])
                self.eps_max = max(self.eps_max, eps)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(self._fields(line))
            return
        assert self.emit is not None
        if not (last or (t + 1) % self.every == 0):
            return
        elapsed = time.perf_counter() - self.t0
        done = t + 1 - self.start_round
        remaining = elapsed / done * (self.rounds - t - 1) if done > 0 else None
        self.emit(progress_line(
            t + 1, self.rounds, float(line.get("train_loss", float("nan"))),
            elapsed_s=elapsed, remaining_s=None if last else remaining,
            test_accuracy=line["test_accuracy"] if evaluated else None,
            subset_accuracy=line.get("subset_accuracy"),
            epsilon_max=self.eps_max if book is not None else None,
            epsilon_unit=book.unit if book is not None else "",
            accountant=book.enforce if book is not None else "",
        ))

    def _fields(self, line: dict[str, Any]) -> dict[str, str]:
        """The bar's postfix."""
        fields = {"loss": f"{line['train_loss']:.3f}", "acc": f"{self.accuracy:.3f}"}
        if "subset_accuracy" in line:
            fields["acc_subset"] = f"{line['subset_accuracy']:.3f}"
        if self.loop.state.book is not None:
            fields["eps_max"] = f"{self.eps_max:.3g}"
        return fields

    def close(self) -> None:
        """Close the bar (if any)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _progress_bar(total: int, initial: int, *, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="round", desc="rounds", dynamic_ncols=True)
