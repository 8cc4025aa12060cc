"""Local training of a round's devices in worker processes.

:class:`TrainingPool` forks ``n`` workers once per run, after the training set and the
partition exist: the children see the parent's arrays through copy-on-write pages, so the
data set is never copied or sent (each device's shard is an index array into it). A round
sends each worker the global weights once and then tasks ``(device, round, record
settings)``; a worker trains with :func:`edge_device.device_worker.train_device` on its own copy
of the model and answers with the :class:`~edge_device.device_worker.Trained` differential.
:meth:`TrainingPool.train` yields the results in the order asked for (device order), so
the run encodes, transmits and records them exactly as in the sequential path, while later
devices still train.

Same results as training in the run's process: every device's minibatch stream is spawned
from the experiment seed per device and round, and the weights are loaded in full before
each training; privacy noise and secret Poisson batches come from the OS CSPRNG wherever
they are drawn.

Nothing is left behind: workers ignore SIGINT (the run's own handler decides how to stop),
die with the run's process (``PR_SET_PDEATHSIG``, so even ``kill -9`` of the run takes them
along), and :meth:`TrainingPool.close` (in a ``finally``/``with``) asks them to exit, then
kills what is still alive after a grace period, and reaps them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from edge_device.device_worker import Trained
from testbed.core.process import startup_gc
from testbed.core.process.blas_threads import limit_blas_threads
from testbed.core.process.child_process import die_with_parent

#: Makes (in a worker) the trainer of a device; ``(device, record settings) -> trainer``.
TrainerFactory = Callable[[int, Any], Any]
#: Trains (in a worker) ``(trainer, record settings, device, weights, round) -> Trained``.
TrainFunction = Callable[[Any, Any, int, np.ndarray, int], Trained]

#: Seconds a worker is given to exit after being asked, before it is killed.
EXIT_GRACE_S = 2.0
#: Longest wait (s) for a worker's answer before ``on_wait`` is called again.
POLL_S = 0.2
#: Tasks queued per worker (2: the next one is there when the current one ends).
DEPTH = 2


class WorkerFailed(RuntimeError):
    """A worker process died or could not report (not an error of the training itself)."""


class WorkerTraceback(Exception):
    """The traceback of an error raised in a training worker (its text), attached as the
    cause of the re-raised error where exceptions have no notes (Python 3.10)."""


def _worker_main(
    conn: Connection,
    parent_pid: int,
    threads: int,
    close_fds: tuple[int, ...],
    make: TrainerFactory,
    train: TrainFunction,
) -> None:
    """A worker: answer tasks on ``conn`` until told to stop or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent_pid)
    for fd in close_fds:  # e.g. the run directory's lock: only the run may hold it
        try:
            os.close(fd)
        except OSError:
            pass
    startup_gc.resume()  # forked before the run's first round: collect in the worker
    torch.set_num_threads(threads)
    limit_blas_threads(threads)
    trainers: dict[int, Any] = {}
    w: np.ndarray | None = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        if msg[0] == "weights":
            w = msg[1]
            continue
        _, task, device, round_index, record = msg
        try:
            if w is None:
                raise WorkerFailed("no weights before a task")
            if device not in trainers:
                trainers[device] = make(device, record)
            out: Any = ("ok", task, train(trainers[device], record, device, w, round_index))
        except Exception as exc:  # noqa: BLE001 - reported to the run, which raises it
            out = ("error", task, exc, traceback.format_exc())
        try:
            conn.send(out)
        except Exception as exc:  # noqa: BLE001 - e.g. an exception that does not pickle
            conn.send(("error", task, WorkerFailed(f"{type(exc).__name__}: {exc}"), ""))


class TrainingPool:
    """Worker processes training devices for one run (a context manager).

    Parameters
    ----------
    n_workers
        Processes (``>= 2``; one worker would only add overhead).
    make_trainer
        ``(device, record settings) -> trainer``, called in a worker on a device's first
        task there (it sees the parent's data as it was at the fork).
    train
        ``(trainer, record settings, device, w, round) -> Trained``, called in a worker.
    threads
        ``torch.set_num_threads`` of each worker.
    close_fds
        Descriptors a worker closes at once (the run directory's lock).
    """

    def __init__(
        self,
        n_workers: int,
        make_trainer: TrainerFactory,
        train: TrainFunction,
        *,
        threads: int = 1,
        close_fds: Sequence[int] = (),
    ) -> None:
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 2:
            raise ValueError(f"n_workers: got {n_workers!r}; allowed: an integer >= 2")
        ctx = multiprocessing.get_context("fork")
        for stream in (sys.stdout, sys.stderr):  # a child must not write the parent's buffer
            stream.flush()
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._closed = False
        self._busy = False  # tasks handed out whose results were not all taken
        try:
            for _ in range(n_workers):
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    args=(child_end, os.getpid(), threads, tuple(close_fds), make_trainer,
                          train),
                    daemon=True,
                    name="testbed-train",
                )
                proc.start()
                child_end.close()
                self._conns.append(parent_end)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        """Number of worker processes."""
        return len(self._procs)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers."""
        return [int(p.pid) for p in self._procs]

    def train(
        self,
        w: np.ndarray,
        round_index: int,
        tasks: Sequence[tuple[int, Any]],
        on_wait: Callable[[], None] = lambda: None,
    ) -> Iterator[Trained]:
        """Train ``tasks`` (``(device, record settings)``) from weights ``w`` ``(d,)`` in
        round ``round_index``; yields each :class:`Trained` in the order of ``tasks``.

        ``on_wait`` is called about every :data:`POLL_S` seconds while waiting (the run
        checks for a stop request there). A training error is raised when its result is
        due; a dead worker raises :class:`WorkerFailed`. Leaving the iteration early (an
        exception, a stop) closes the pool, since workers may still be busy.
        """
        if self._closed:
            raise WorkerFailed("the training pool is closed")
        weights = np.ascontiguousarray(w, dtype=np.float32)
        pending = list(enumerate(tasks))
        pending.reverse()  # pop() takes the first task
        queued: dict[int, list[int]] = {k: [] for k in range(self.size)}  # worker -> tasks
        done: dict[int, Any] = {}
        finished = False
        self._busy = True
        try:
            for k in range(self.size):
                self._send(k, ("weights", weights))

            def fill() -> None:
                for k in range(self.size):
                    while pending and len(queued[k]) < DEPTH:
                        task, (device, record) = pending.pop()
                        self._send(k, ("train", task, device, round_index, record))
                        queued[k].append(task)

            fill()
            for want in range(len(tasks)):
                while want not in done:
                    on_wait()
                    busy = [self._conns[k] for k in queued if queued[k]]
                    for ready in wait(busy, timeout=POLL_S):
                        k = self._conns.index(ready)  # type: ignore[arg-type]
                        try:
                            msg = self._conns[k].recv()
                        except (EOFError, OSError):
                            on_wait()  # a stop that killed the worker too is a stop
                            raise WorkerFailed(
                                f"training worker {self._procs[k].pid} died "
                                f"(exit code {self._exit_code(k)})"
                            ) from None
                        queued[k].remove(msg[1])
                        done[msg[1]] = msg
                    fill()
                msg = done.pop(want)
                if msg[0] == "error":
                    exc = msg[2]
                    if msg[3] and isinstance(exc, BaseException):
                        if hasattr(exc, "add_note"):  # Python >= 3.11
                            exc.add_note(f"in training worker:\n{msg[3]}")
                        else:  # 3.10 (a Jetson's): the worker's traceback as the cause
                            raise exc from WorkerTraceback(msg[3])
                    raise exc
                if want == len(tasks) - 1:  # every result is taken: nothing left running
                    self._busy, finished = False, True
                yield msg[2]
            self._busy, finished = False, True
        finally:
            if not finished:
                self.close()

    def _send(self, k: int, msg: Any) -> None:
        try:
            self._conns[k].send(msg)
        except OSError as exc:  # the worker is gone (killed, out of memory)
            raise WorkerFailed(
                f"training worker {self._procs[k].pid} is gone ({exc}; exit code "
                f"{self._exit_code(k)})"
            ) from None

    def _exit_code(self, k: int) -> Any:
        proc = self._procs[k]
        proc.join(0.5)
        return proc.exitcode

    def close(self) -> None:
        """Stop every worker: ask, wait up to :data:`EXIT_GRACE_S`, kill the rest, reap.
        Workers still busy with tasks nobody will take (a stop, an error) are killed at
        once. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        end = time.monotonic() + (0.0 if self._busy else EXIT_GRACE_S)
        for proc in self._procs:
            proc.join(max(0.0, end - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(5.0)
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> TrainingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_workers(requested: int | str, torch_threads: int, max_tasks: int) -> int:
    """Worker processes for a run: ``requested`` (an integer, or ``"auto"``: the cores this
    process may run on divided by ``torch_threads``), at most ``max_tasks`` (the most
    devices a round trains), at least 1."""
    if requested == "auto":
        cores = len(os.sched_getaffinity(0))
        n = max(1, cores // max(1, torch_threads))
    else:
        n = int(requested)
    return max(1, min(n, max_tasks))
