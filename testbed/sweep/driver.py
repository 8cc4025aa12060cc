"""Run a sweep: validate every cell, skip the finished ones, run the rest as Ray tasks.

Output folder layout::

    OUT/sweep.yaml        the sweep as run (base made absolute)
    OUT/sweep.log         what each invocation did with each cell (appended)
    OUT/runs/<cell>/      one ordinary run directory per cell (as `testbed run` writes)
    OUT/logs/<cell>.log   the output of the cell's `testbed run` (appended per attempt)
    OUT/results.csv       one row per cell (testbed.sweep.results.RESULT_COLUMNS)
    OUT/results.png       accuracy against the first numeric grid key
    OUT/tensorboard/      the HParams view's experiment (each cell's in its run directory)
    OUT/.lock             held while a sweep uses the folder

While it runs, one line per cell start and per cell end, each with a running count
(:class:`CellCount`): ``cell 3/8 started: lr=0.1, seed=1 (run); 2 done, 1 running, 5 to
go`` and ``cell 3/8 (lr=0.1, seed=1): ran: completed, accuracy 0.8100, 12.3 s; 3 done, 0
running, 5 to go``. A cell has started when its worker writes the command line to its log.

Ray is started locally (``ray.init(address="local")``, no dashboard, a bounded number of
CPUs) unless ``address`` names a running cluster; it is shut down when the sweep ends,
also after Ctrl-C. With a cluster, every node must see OUT, the base config and any data
path at the same place (a shared file system) and have the testbed installed.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.core.config.errors import ConfigError
from testbed.core.config.safe_yaml import dump_yaml_text
from testbed.core.runs.interrupts import raise_interrupt, sigterm_as_interrupt
from testbed.core.runs.rundir import RunDirError, atomic_write_bytes, lock_directory
from testbed.sweep.board import write_sweep_hparams
from testbed.sweep.cells import Cell, build_cells, cell_action, read_summary
from testbed.sweep.progress import CellCount, cell_end_line, cell_start_line, outcome_text
from testbed.sweep.results import plot_results, result_row, write_csv
from testbed.sweep.spec import SweepSpec, load_sweep
from testbed.sweep.task import STOP_GRACE_S, run_cell

#: Statuses of a cell that count as a result (exit code 0 when every cell has one).
OK_STATUSES = ("completed", "budget_exhausted", "diverged")
#: Ray object store of a local instance (bytes); cells exchange only small dicts.
OBJECT_STORE_BYTES = 100 * 1024 * 1024

Log = Callable[[str], None]


@dataclass
class SweepResult:
    """What :func:`run_sweep` did.

    Attributes
    ----------
    rows
        One row per cell, in grid order (:func:`testbed.sweep.results.result_row`).
    out_dir
        The sweep's output folder.
    table, plot
        ``results.csv`` and ``results.png`` (not written by a dry run).
    interrupted
        The sweep was stopped (Ctrl-C) before every cell ended.
    dry_run
        Nothing was run (``rows`` say what is there; ``action`` is ``not_run``).
    """

    rows: list[dict[str, Any]]
    out_dir: Path
    table: Path
    plot: Path
    interrupted: bool = False
    dry_run: bool = False
    grid_keys: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """130 interrupted, 0 when every cell ended in :data:`OK_STATUSES` (or a dry run),
        else 1."""
        if self.dry_run:
            return 0
        if self.interrupted:
            return 130
        return 0 if all(r["status"] in OK_STATUSES for r in self.rows) else 1


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) address where nothing listens.

    Ray itself retries an unreachable address for minutes; this answers in seconds.
    Other address forms (``auto``) are left to Ray.
    """
    m = re.fullmatch(r"(?:ray://)?\[?([^\[\]/]+?)\]?:(\d{1,5})", address.strip())
    if m is None:
        return
    host, port = m.group(1), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(
            f"--address {address!r}: nothing answers at {host}:{port} "
            f"({exc.strerror or exc}); start the cluster first (ray start --head) or leave "
            "out --address for a local Ray instance"
        ) from None


def _log_tail(path: Path) -> str:
    """The last meaningful line of a cell's log ('' when none)."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - 4096))
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("$ testbed")]
    return lines[-1][:300] if lines else ""


def _job(cell: Cell, spec: SweepSpec, run_dir: Path, log: Path, action: str) -> dict[str, Any]:
    if action == "resume":
        args = ["run", "--resume", str(run_dir), "--no-progress"]
    else:
        args = ["run", *([spec.base] if spec.base else [])]
        for item in cell.overrides:
            args += ["--set", item]
        for item in cell.hw_overrides:
            args += ["--hw-set", item]
        args += ["--out", str(run_dir), "--no-progress"]
    return {"args": args, "cwd": str(Path.cwd()), "log": str(log), "threads": cell.cpus}


def _log_size(path: Path) -> int:
    """Bytes in a cell's log (0: none yet)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def run_sweep(
    spec: SweepSpec | str | Path,
    out_dir: str | Path | None = None,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    retry_failed: bool = False,
    dry_run: bool = False,
    log: Log | None = None,
) -> SweepResult:
    """Run every cell of a sweep that has not finished; write the table and the plot.

    Parameters
    ----------
    spec
        A :class:`SweepSpec` (from :func:`testbed.sweep.spec.parse_sweep`) or a sweep
        file's path.
    out_dir
        Output folder (default ``sweeps/<name>``, relative to the working directory).
    address
        A running Ray cluster (``ray://host:10001`` or ``host:6379``); ``None`` starts a
        local instance for the duration of the sweep.
    num_cpus
        CPUs of the local instance (default: every CPU this process may use).
    retry_failed
        Resume cells whose summary says ``failed`` or ``link_failed`` (otherwise final).
    dry_run
        Validate and report what would be done; write nothing, start nothing.
    log
        Receives one line per event (default: standard error). Lines are also appended
        to ``OUT/sweep.log``.

    Returns
    -------
    SweepResult
        Rows in grid order; ``exit_code`` summarises them.

    Raises
    ------
    ConfigError
        Before any work: a bad sweep file, a cell whose config is refused (naming the cell
        and the key), a cell needing more CPUs than there are, a run directory holding
        another config, or an output folder in use by another sweep.
    """
    spec = spec if isinstance(spec, SweepSpec) else load_sweep(spec)
    if address is not None and num_cpus is not None:
        raise ConfigError("--cpus: only for a local Ray instance; a cluster has its own CPUs")
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError(f"--cpus: got {num_cpus}; allowed: 1 or more")
    cells = build_cells(spec)
    if address is not None and not dry_run:
        check_reachable(address)
    cpus = num_cpus if num_cpus is not None else available_cpus()
    widest = max(cells, key=lambda c: c.cpus)
    if address is None and widest.cpus > cpus:
        raise ConfigError(
            f"sweep cell ({widest.label}): {widest.cpus} CPUs (torch_threads x workers) are "
            f"more than the local Ray instance has ({cpus}); lower cpus_per_cell, "
            "torch_threads or workers, or raise --cpus"
        )
    out = Path(out_dir) if out_dir is not None else Path("sweeps") / spec.name
    grid_keys = list(spec.grid)
    result = SweepResult([], out, out / "results.csv", out / "results.png", grid_keys=grid_keys)
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))

    if dry_run:
        result.dry_run = True
        for n, cell in enumerate(cells, 1):
            run_dir = out / "runs" / cell.name
            action = cell_action(cell, run_dir, retry_failed=retry_failed)
            say(f"cell {n}/{len(cells)} ({cell.label}): would {action} -> {run_dir}")
            summary = read_summary(run_dir) if action != "run" else None
            result.rows.append(result_row(cell.values, run_dir, summary, action="not_run"))
        return result

    for cell in cells:  # refuse foreign run directories before creating anything
        cell_action(cell, out / "runs" / cell.name, retry_failed=retry_failed)
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock_fd = lock_directory(out)
    except (OSError, RunDirError) as exc:
        raise ConfigError(f"--out '{out}': {exc}") from None
    try:
        return _run_locked(spec, cells, result, address, cpus, retry_failed, say)
    finally:
        os.close(lock_fd)


def _run_locked(
    spec: SweepSpec,
    cells: list[Cell],
    result: SweepResult,
    address: str | None,
    cpus: int,
    retry_failed: bool,
    say: Log,
) -> SweepResult:
    out = result.out_dir
    sweep_log = out / "sweep.log"

    def note(line: str) -> None:
        say(line)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with sweep_log.open("a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {line}\n")

    # Again under the folder's lock (another sweep may have changed it meanwhile).
    actions = {c.name: cell_action(c, out / "runs" / c.name, retry_failed=retry_failed)
               for c in cells}
    atomic_write_bytes(
        out / "sweep.yaml", dump_yaml_text(spec.model_dump(mode="json", by_alias=True)).encode()
    )
    counts = {a: sum(1 for v in actions.values() if v == a) for a in ("run", "resume", "skip")}
    note(
        f"sweep {spec.name}: {len(cells)} cells: {counts['run']} to run, {counts['resume']} "
        f"to resume, {counts['skip']} finished (skipped) -> {out}"
    )
    rows: dict[str, dict[str, Any]] = {}
    index = {c.name: n for n, c in enumerate(cells, 1)}
    for cell in cells:
        run_dir = out / "runs" / cell.name
        if actions[cell.name] == "skip":
            row = result_row(cell.values, run_dir, read_summary(run_dir), action="skipped")
            note(f"cell {index[cell.name]}/{len(cells)} ({cell.label}): skipped, finished "
                 f"earlier: {outcome_text(row)}")
        else:
            summary = read_summary(run_dir) if actions[cell.name] == "resume" else None
            row = result_row(cell.values, run_dir, summary, action="not_run")
            if summary is None:
                row["status"] = "not_run"
        rows[cell.name] = row

    def save() -> None:
        result.rows = [rows[c.name] for c in cells]
        write_csv(result.rows, result.grid_keys, result.table)

    save()
    todo = [c for c in cells if actions[c.name] != "skip"]
    if todo:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        count = CellCount(len(cells), done=len(cells) - len(todo))
        with sigterm_as_interrupt():  # reinstalled after ray.init (see _start_ray)
            result.interrupted = _execute_cells(spec, todo, actions, rows, out, address, cpus,
                                                note, index, save, count)
    save()
    plot_results(result.rows, result.grid_keys, result.plot, spec.name)
    write_sweep_hparams(result.rows, result.grid_keys, out, note)  # TensorBoard's HParams
    note(f"results: {result.table}, {result.plot}")
    return result


def _start_ray(ray: Any, address: str | None, cpus: int) -> None:
    """A local Ray instance with ``cpus`` CPUs, or a connection to the cluster at ``address``.

    ``ray.init`` replaces the driver's SIGTERM handler with one that exits at once (no
    cell is told to stop, and no row is written); in the main thread ours is put back.

    Raises
    ------
    ConfigError
        When the cluster refuses the connection.
    """
    if address is None:
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 object_store_memory=OBJECT_STORE_BYTES, logging_level=logging.WARNING)
    else:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"--address {address!r}: cannot connect to a Ray cluster ({first}); a cluster "
                "with token authentication also needs RAY_AUTH_MODE=token and its token "
                "(docs/sweep.md)"
            ) from None
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_interrupt)


def _execute_cells(
    spec: SweepSpec,
    todo: list[Cell],
    actions: dict[str, str],
    rows: dict[str, dict[str, Any]],
    out: Path,
    address: str | None,
    cpus: int,
    note: Log,
    index: dict[str, int],
    save: Callable[[], None],
    count: CellCount,
) -> bool:
    """Run ``todo`` as Ray tasks; returns whether the sweep was interrupted. Notes one line
    per cell start and end with the running ``count``."""
    import ray
    from ray.exceptions import RayError, TaskCancelledError

    interrupted = False
    try:
        try:
            _start_ray(ray, address, cpus)
        except KeyboardInterrupt:
            note("interrupted while Ray was starting; no cell was started")
            return True
        if address is not None:
            node_cpus = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]),
                            default=0)
            widest = max(todo, key=lambda c: c.cpus)
            if widest.cpus > node_cpus:
                raise ConfigError(
                    f"sweep cell ({widest.label}): {widest.cpus} CPUs (torch_threads x "
                    f"workers) are more than any node of the cluster at {address} has "
                    f"({node_cpus:g})"
                )
        task = ray.remote(run_cell)
        refs: dict[Any, Cell] = {}
        mtimes: dict[str, int | None] = {}
        #: Each waiting cell's log size at submission: it has started once the log grew.
        waiting: dict[str, int] = {}
        for cell in todo:
            run_dir = out / "runs" / cell.name
            summary_path = run_dir / "summary.json"
            mtimes[cell.name] = (
                summary_path.stat().st_mtime_ns if summary_path.exists() else None
            )
            waiting[cell.name] = _log_size(out / "logs" / f"{cell.name}.log")
            job = _job(cell, spec, run_dir.resolve(), (out / "logs" / f"{cell.name}.log").resolve(),
                       actions[cell.name])
            ref = task.options(num_cpus=cell.cpus, max_retries=0).remote(job)
            refs[ref] = cell

        def started(cell: Cell) -> None:
            waiting.pop(cell.name, None)
            count.running.add(cell.name)
            note(cell_start_line(index[cell.name], count, cell.label, actions[cell.name]))

        def watch_starts() -> None:
            for cell in refs.values():
                size = waiting.get(cell.name)
                if size is not None and _log_size(out / "logs" / f"{cell.name}.log") > size:
                    started(cell)

        def finish(ref: Any, timeout: float | None = None) -> None:
            cell = refs[ref]
            run_dir = out / "runs" / cell.name
            log_path = out / "logs" / f"{cell.name}.log"
            try:
                res: dict[str, Any] | None = ray.get(ref, timeout=timeout)
            except TaskCancelledError:
                res = None
            except RayError as exc:  # the worker died (killed, out of memory)
                res = {"returncode": None, "wall_s": None, "error": str(exc).splitlines()[0]}
            summary = read_summary(run_dir)
            path = run_dir / "summary.json"
            fresh = summary is not None and path.stat().st_mtime_ns != mtimes[cell.name]
            action = "resumed" if actions[cell.name] == "resume" else "ran"
            text = ""
            if res is None:
                action, text = "not_run", "the sweep was stopped before the cell started"
            elif not fresh:
                text = res.get("error") or _log_tail(log_path) or (
                    f"testbed run exited with code {res['returncode']}"
                )
            row = result_row(cell.values, run_dir, summary, action=action, note=text,
                             cell_wall_s=None if res is None else res.get("wall_s"))
            if summary is None and res is not None and (
                res.get("stopped") or res.get("returncode") == 130
                or (run_dir / "config.yaml").is_file()
            ):
                # Stopped, or killed before writing its summary: the next sweep resumes it
                # (or, when the runner removed a run that never went on air, starts it).
                row["status"] = "interrupted"
            rows[cell.name] = row
            save()
            if res is not None and cell.name in waiting:  # it ran between two looks
                started(cell)
            waiting.pop(cell.name, None)
            count.running.discard(cell.name)
            count.done += 1
            note(cell_end_line(index[cell.name], count, cell.label, action, row,
                               None if res is None else res.get("wall_s")))

        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                watch_starts()
                for ref in done:
                    finish(ref)
        except KeyboardInterrupt:
            interrupted = True
            note("interrupted: running cells stop before their next transmission and keep a "
                 "resumable run directory (Ctrl-C again to kill them; the run directories "
                 "are crash-safe either way)")
            for ref in pending:
                ray.cancel(ref)
            try:
                deadline = time.monotonic() + STOP_GRACE_S + 15.0
                while pending and time.monotonic() < deadline:
                    done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                    for ref in done:
                        finish(ref)
            except KeyboardInterrupt:
                pass
            for ref in pending:
                ray.cancel(ref, force=True)
            for ref in pending:
                try:
                    finish(ref, timeout=30.0)
                except Exception:  # noqa: BLE001 - the row keeps what its files say
                    pass
    finally:
        ray.shutdown()
    return interrupted
