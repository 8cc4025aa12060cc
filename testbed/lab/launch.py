"""``testbed launch``: an aggregator and N edge processes on this machine, over loopback.

For CI and demos. Fresh CurveZMQ keys are written under the output directory (the secrets
0600); the aggregator binds an ephemeral loopback port and writes it to a file the edges'
command lines are built from. Ctrl-C (or SIGTERM) stops the aggregator first (it records an
interrupted run that ``testbed launch --resume OUT`` continues), then the edges; every
child also dies with the launcher (``PR_SET_PDEATHSIG``), so no process is left behind.

Fail fast: a process that ends before the run does (an edge exiting with an error, the air,
the aggregator without an outcome) stops every other one within :data:`FAIL_STOP_S`; the
launch prints that process's last error line and its log, and exits with its outcome's code
(:func:`supervise`).

Layout of ``--out DIR`` (:mod:`testbed.core.lab_checks`, ``LAUNCH_*``): ``DIR/aggregator``
(the run directory), ``DIR/edge-I`` (each edge's own ledger), ``DIR/keys``,
``DIR/logs/*.log``. ``testbed launch --resume DIR`` (:func:`resume_launch`) restarts the
processes on it: the aggregator with ``--resume``, the edges with their keys and state
directories.

With a hardware config (``--hw``) every process reads the same resolved copy, ``DIR/hw.yaml``
(``--hw-set`` applied). When its radios are virtual (docs/virtual_lab.md) the launcher first
starts the virtual air (``testbed air``, on two free loopback ports written into that copy,
its burst log in ``DIR/air``); each edge then opens its own ``tx`` flowgraph on its virtual
USRP and the aggregator its ``rx`` flowgraph: the processes of docs/lab.md, with only the
device args changed.

One job at over 600 lines: the processes of one launched run, started, supervised (fail
fast) and resumed; the three share the layout, the command lines and the clean-up.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.core.process.child_process import die_with_parent

if TYPE_CHECKING:
    from testbed.core.config.experiment import ExperimentConfig

#: Seconds a child gets to exit after SIGTERM before SIGKILL.
GRACE_S = 15.0
#: Seconds within which a launch stops every other process once one ended early (fail fast).
FAIL_STOP_S = 5.0


def testbed_command() -> list[str]:
    """The command line that runs this ``testbed`` (the current interpreter)."""
    return [sys.executable, "-m", "testbed"]


class Children:
    """Child processes of a launch; stopped in order on exit.

    Each child's output goes to ``log_dir/NAME.log`` (appended: a resumed launch adds to
    the same logs); :attr:`log_start` keeps where this launch's part of each log begins.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.log_start: dict[str, int] = {}

    def log_path(self, name: str) -> Path:
        """The log file of child ``name``."""
        return self.log_dir / f"{name}.log"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        path = self.log_path(name)
        log = open(path, "ab")  # noqa: SIM115 - owned by the child
        if log.tell():  # an earlier launch's lines above (launch --resume)
            log.write(f"--- testbed launch: {name} started again at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
            log.flush()
        self.log_start[name] = log.tell()
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent, start_new_session=True, env=env,
        )
        log.close()

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def stop(self, names: list[str], sig: int = signal.SIGTERM,
             grace_s: float = GRACE_S) -> None:
        """Signal ``names``, wait up to ``grace_s``, then SIGKILL what is left."""
        for n in names:
            if self.procs[n].poll() is None:
                self.procs[n].send_signal(sig)
        deadline = time.monotonic() + grace_s
        for n in names:
            try:
                self.procs[n].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.procs[n].kill()
                self.procs[n].wait()

    def stop_all(self) -> None:
        """Stop the aggregator (SIGINT: it records an interrupted run), then the edges,
        then the air, each within :data:`GRACE_S`."""
        names = list(self.procs)
        self.stop([n for n in names if n == "aggregator"], signal.SIGINT)
        self.stop([n for n in names if n not in ("aggregator", "air")])
        self.stop([n for n in names if n == "air"])

    def stop_now(self, within_s: float = FAIL_STOP_S) -> None:
        """Stop every child within ``within_s`` (fail fast): SIGINT the aggregator (twice:
        the second stops it at once outside a commit) and SIGTERM the edges together, then
        the air; SIGKILL what is left at each step's end (a lab run survives ``kill -9`` of
        either side, docs/lab.md)."""
        t0 = time.monotonic()
        main = [n for n in self.procs if n != "air"]
        for n in main:
            if self.procs[n].poll() is None:
                self.procs[n].send_signal(signal.SIGINT if n == "aggregator" else
                                          signal.SIGTERM)
        self.wait_for(main, t0 + 0.6 * within_s)  # a waiting aggregator needs about 2 s
        agg = self.procs.get("aggregator")
        if agg is not None and agg.poll() is None:
            agg.send_signal(signal.SIGINT)
        self.wait_for(main, t0 + 0.8 * within_s)
        self.stop([n for n in main if self.procs[n].poll() is None], signal.SIGKILL, 0.0)
        air = [n for n in self.procs if n == "air"]
        left = max(0.0, t0 + 0.95 * within_s - time.monotonic())
        self.stop(air, signal.SIGTERM, left)

    def wait_for(self, names: list[str], until: float) -> None:
        """Wait until every one of ``names`` has exited, or the monotonic time ``until``."""
        while any(self.procs[n].poll() is None for n in names) and time.monotonic() < until:
            time.sleep(0.05)

    def early_exit(self) -> EarlyExit | None:
        """The first child (not the aggregator) that ended while the run goes on: an edge
        that exited with an error (an edge exits 0 only when the run told it so), or the
        air, which never ends by itself."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if name == "aggregator" or code is None or (code == 0 and name != "air"):
                continue
            return EarlyExit(name, code, self.log_path(name),
                             last_error_line(self.log_path(name), self.log_start.get(name, 0)))
        return None

    def aggregator_exit(self) -> EarlyExit:
        """The aggregator's exit (it has exited) as an :class:`EarlyExit`."""
        code = int(self.procs["aggregator"].returncode)
        path = self.log_path("aggregator")
        return EarlyExit("aggregator", code, path,
                         last_error_line(path, self.log_start.get("aggregator", 0)))


#: A log line that says what went wrong (``testbed edge: error: ...``, the last line of a
#: traceback, ``... link failed ...``).
ERROR_LINE = re.compile(r"error|exception|failed|refused|traceback|denied|killed", re.IGNORECASE)


def last_error_line(log: Path, start: int = 0, tail_bytes: int = 65536) -> str:
    """The last line of ``log`` (from byte ``start``: this launch's part of it) that says
    what went wrong (:data:`ERROR_LINE`), else its last line; ``""`` when it is empty."""
    try:
        with log.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(start, size - tail_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    for line in reversed(lines):
        if ERROR_LINE.search(line):
            return line
    return lines[-1] if lines else ""


def outcome_code(returncode: int) -> int:
    """A process's exit code as one of the documented outcomes (README, "Outcomes"):
    0 completed, 2 bad input, 3 budget exhausted, 4 diverged, 5 link failed and 130
    interrupted pass as they are; any other code, and a death by a signal, is 1 (failed)."""
    return returncode if returncode in (0, 2, 3, 4, 5, 130) else 1


@dataclass(frozen=True)
class EarlyExit:
    """A launched process that ended before the run did.

    Attributes
    ----------
    name
        ``aggregator``, ``edge-I`` or ``air``.
    returncode
        Its exit code (negative: killed by that signal).
    log
        Its log file.
    line
        The last line of its log saying what went wrong (:func:`last_error_line`).
    """

    name: str
    returncode: int
    log: Path
    line: str

    @property
    def code(self) -> int:
        """The launch's exit code for it (:func:`outcome_code`); the air is the radios'
        medium: its end is a link failure (5) unless it refused its input (2)."""
        if self.name == "air":
            return 2 if self.returncode == 2 else 5
        return outcome_code(self.returncode)

    def message(self) -> str:
        """One line: who ended, how, its last error line and its log."""
        how = (f"was killed by {signal.Signals(-self.returncode).name}"
               if self.returncode < 0 else f"exited with code {self.returncode}")
        said = f": {self.line}" if self.line else " (its log is empty)"
        return (f"testbed launch: {self.name} {how} before the run ended{said} "
                f"(log: {self.log})")


def _resolved_hw(out_dir: Path, hw_config: str, hw_overrides: list[str], *,
                 fallback: str | None = None, cfg: ExperimentConfig | None = None,
                 devices: int = 0) -> tuple[Path, bool]:
    """Write ``hw_config`` with ``hw_overrides`` (and, for a virtual lab, two free loopback
    ports for the air) to ``out_dir/hw.yaml``; returns its path and whether it is virtual.

    ``fallback`` (``--fallback``; ``None``: the config's ``usrp.fallback``) ``emulate``
    with none of the receiver's and the ``devices`` edges' USRPs found: the written config
    is on emulated radios (:mod:`testbed.core.radio_fallback`; ``cfg``'s ``snr_db`` and
    fading), so the launcher runs their air and every process reads them as such.

    Raises
    ------
    testbed.core.radio_fallback.FallbackRefused
        Some of those USRPs found, some not.
    """
    from testbed.core.config.link import link_name
    from testbed.core.config.loader import load_hardware
    from testbed.core.config.safe_yaml import dump_yaml_text
    from testbed.core.lab_checks import LAUNCH_HW
    from testbed.core.private_air import with_loopback_air
    from testbed.core.radio_fallback import fallback_mode, radios_of, resolve_radios

    hw = load_hardware(hw_config, hw_overrides)
    if cfg is not None and link_name(cfg, hw) == "usrp":
        hw = resolve_radios(hw, fallback_mode(hw, fallback),
                            radios_of(hw, "launch", devices=devices),
                            snr_db=cfg.snr_db_per_device(),
                            rician_k_db=cfg.rician_k_db)
    if hw.virtual:
        hw = with_loopback_air(hw)
    path = out_dir / LAUNCH_HW
    path.write_text(dump_yaml_text(hw.model_dump(mode="json")))
    load_hardware(str(path))  # what every process will read: it must load
    return path, hw.virtual


#: The aggregator's log lines a launch relays to its own stderr as they come: the rounds'
#: progress lines and the devices joining, leaving and dropping out.
RELAYED = re.compile(
    r"testbed\.aggregator: (round \d+ \(\d+/\d+\): |all \d+ devices joined"
    r"|device \d+ (joined|rejoined|left|dropped out))"
)


class LogRelay:
    """Print the :data:`RELAYED` lines a child adds to its log file (complete lines only).

    Parameters
    ----------
    path
        The child's log file (it may not exist yet).
    prefix
        Put before every relayed line (``aggregator: ``).
    enabled
        ``False``: relay nothing.
    offset
        Where in the file to start (a resumed launch: the end of the earlier launch's lines).
    """

    def __init__(self, path: Path, prefix: str, *, enabled: bool = True,
                 offset: int = 0) -> None:
        self.path = path
        self.prefix = prefix
        self.enabled = enabled
        self.offset = offset

    def poll(self) -> None:
        """Relay the lines completed since the last call."""
        if not self.enabled:
            return
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for raw in chunk[:end].splitlines():
            line = raw.decode("utf-8", "replace")
            found = RELAYED.search(line)
            if found:  # the message, without the log line's time and logger name
                print(self.prefix + line[found.start(1):], file=sys.stderr, flush=True)


def outcome_note(run_dir: Path, exit_code: int) -> str:
    """The outcome line of the run in ``run_dir`` (:func:`aggregator.outcome.outcome_line`
    of its ``summary.json``, as ``testbed run`` prints it), or why there is none.

    Parameters
    ----------
    run_dir
        The aggregator's run directory (``OUT/aggregator``).
    exit_code
        The aggregator's exit code (named when there is no summary).
    """
    import json

    from aggregator.outcome import outcome_line

    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        return outcome_line(summary, run_dir)
    except FileNotFoundError:
        return (f"no run outcome: {path} is missing (the aggregator exited with code "
                f"{exit_code} before writing it)")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no run outcome: {path} is unreadable ({type(exc).__name__}: {exc})"



def report_note(run_dir: Path) -> str | None:
    """Where the run's report is (``report: PATH``; the aggregator writes ``report.md`` in
    its run directory at the end), or why there is none; ``None`` without a run outcome."""
    if not (run_dir / "summary.json").is_file():
        return None
    report = run_dir / "report.md"
    if report.is_file():
        return f"report: {report}"
    return f"report: none written (testbed report {run_dir} writes it)"


def run_status(run_dir: Path) -> str | None:
    """``summary.json``'s ``status`` of the run in ``run_dir`` (``None``: none readable)."""
    import json

    try:
        return str(json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def aggregator_options(round_timeout_s: float, join_timeout_s: float,
                       train_allowance_s: float | None, phase_timeout_s: float | None,
                       progress: bool) -> list[str]:
    """The aggregator's timing and progress options of a launch (``None``: its default)."""
    out = ["--round-timeout", str(round_timeout_s), "--join-timeout", str(join_timeout_s),
           *([] if progress else ["--no-progress"])]
    if train_allowance_s is not None:
        out += ["--train-allowance", repr(float(train_allowance_s))]
    if phase_timeout_s is not None:
        out += ["--phase-timeout", repr(float(phase_timeout_s))]
    return out


def launch(
    config: str | None,
    devices: int,
    out_dir: Path,
    *,
    overrides: list[str],
    hw_overrides: list[str],
    hw_config: str | None = None,
    round_timeout_s: float,
    join_timeout_s: float,
    train_allowance_s: float | None = None,
    phase_timeout_s: float | None = None,
    edge_args: dict[int, list[str]] | None = None,
    edge_env: dict[int, dict[str, str]] | None = None,
    on_started: Any = None,
    fallback: str | None = None,
    progress: bool = True,
) -> int:
    """Start the aggregator and ``devices`` edges (and a virtual lab's air); wait for the
    aggregator; stop the rest (:func:`supervise`).

    Returns the launch's exit code (:func:`supervise`). ``hw_config``: a hardware config
    every process reads (module docstring; ``None``: the experiment's ``hw_config`` with
    ``hw_overrides`` on the aggregator only); ``train_allowance_s``, ``phase_timeout_s``:
    the aggregator's ``--train-allowance`` and ``--phase-timeout`` (``None``: its
    defaults); ``edge_args``: extra arguments per edge; ``edge_env``: extra environment
    variables per edge (fault injection); ``fallback``: ``--fallback`` (emulated radios when
    no USRP is found; without ``hw_config`` it applies to the experiment's own
    ``hw_config``); ``progress``: ``False`` passes ``--no-progress`` to the aggregator and
    relays nothing (the outcome line is still printed).

    Raises
    ------
    testbed.core.radio_fallback.FallbackRefused
        ``fallback`` emulate and only some of the USRPs found (before any process starts).
    testbed.core.config.errors.ConfigError
        A bad config, or ``fallback`` emulate off the ``usrp`` link (before anything is
        created).
    FileExistsError
        ``out_dir`` exists and is not empty.
    """
    from testbed.core.config.loader import load_experiment
    from testbed.core.lab_checks import LAUNCH_KEYS, LAUNCH_RUN
    from testbed.core.transport.curve_keys import generate_keys

    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"--out '{out_dir}' exists and is not empty; choose another")
    cfg = load_experiment(config, [*overrides, f"devices={devices}",
                                   *([f"hw_config={hw_config}"] if hw_config else [])])
    if fallback is not None:
        from testbed.core.config.link import link_name
        from testbed.core.config.loader import load_hardware
        from testbed.core.radio_fallback import check_fallback_applies

        check_fallback_applies(fallback, link_name(cfg, load_hardware(cfg.hw_config,
                                                                      hw_overrides)))
    if cfg.scheme == "aircomp":
        from testbed.core.config.aircomp_checks import check_lab_aircomp
        from testbed.core.config.loader import load_hardware

        check_lab_aircomp(cfg, load_hardware(hw_config or cfg.hw_config, hw_overrides))
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    generate_keys(out_dir / LAUNCH_KEYS, devices)
    if hw_config is None and fallback is not None:
        hw_config = cfg.hw_config  # every process must read the resolved radios
    hw_path, virtual = (None, False) if hw_config is None else \
        _resolved_hw(out_dir, hw_config, hw_overrides, fallback=fallback, cfg=cfg,
                     devices=devices)
    agg = [*([config] if config else []), "--out", str(out_dir / LAUNCH_RUN),
           "--set", f"devices={devices}",
           *aggregator_options(round_timeout_s, join_timeout_s, train_allowance_s,
                               phase_timeout_s, progress)]
    for o in overrides:
        agg += ["--set", o]
    if hw_path is not None:
        agg += ["--set", f"hw_config={hw_path}"]
    else:
        for o in hw_overrides:
            agg += ["--hw-set", o]
    return supervise(out_dir, devices, agg, hw_path=hw_path, virtual=virtual,
                     edge_args=edge_args, edge_env=edge_env, on_started=on_started,
                     progress=progress)


def resume_launch(
    out_dir: Path,
    *,
    round_timeout_s: float,
    join_timeout_s: float,
    train_allowance_s: float | None = None,
    phase_timeout_s: float | None = None,
    progress: bool = True,
) -> int:
    """Continue the launch in ``out_dir`` (``testbed launch --resume OUT``): a fresh virtual
    air when its radios are virtual (on the ports written in ``OUT/hw.yaml``, which the
    run's pinned hardware config names), ``testbed aggregator --resume OUT/aggregator``,
    and each edge with its same keys and state directory (``OUT/edge-I``: it rejoins and is
    synced with the aggregator's ledger). Logs are appended to ``OUT/logs``. The timing
    options are this call's (the aggregator's own defaults where ``None``).

    Returns the launch's exit code (:func:`supervise`).

    Raises
    ------
    testbed.core.runs.rundir.RunDirError
        ``out_dir`` is not a launch directory, or its aggregator never started its run
        (:func:`testbed.core.lab_checks.check_launch_dir`; before anything starts).
    """
    from testbed.core.config.loader import load_experiment, load_hardware
    from testbed.core.lab_checks import LAUNCH_HW, LAUNCH_RUN, check_launch_dir

    check_launch_dir(out_dir)
    run_dir = out_dir / LAUNCH_RUN
    devices = load_experiment(run_dir / "config.yaml").devices
    hw_path = out_dir / LAUNCH_HW if (out_dir / LAUNCH_HW).is_file() else None
    virtual = hw_path is not None and load_hardware(str(hw_path)).virtual
    (out_dir / "logs").mkdir(exist_ok=True)
    agg = ["--resume", str(run_dir),
           *aggregator_options(round_timeout_s, join_timeout_s, train_allowance_s,
                               phase_timeout_s, progress)]
    return supervise(out_dir, devices, agg, hw_path=hw_path, virtual=virtual, progress=progress)


def supervise(
    out_dir: Path,
    devices: int,
    aggregator_args: list[str],
    *,
    hw_path: Path | None,
    virtual: bool,
    edge_args: dict[int, list[str]] | None = None,
    edge_env: dict[int, dict[str, str]] | None = None,
    on_started: Any = None,
    progress: bool = True,
) -> int:
    """Run a launch's processes in ``out_dir`` until the run ends; stop them all.

    Starts the virtual air (``virtual``), ``testbed aggregator`` with ``aggregator_args``
    (on a free loopback port, keys ``OUT/keys``) and, once it is bound, ``devices`` edges
    (state in ``OUT/edge-I``, ``--hw hw_path`` when given). While the run goes, the
    aggregator's progress lines and its devices' joins and departures are relayed to stderr
    (:class:`LogRelay`, unless ``progress`` is ``False``).

    **Fail fast**: when a process ends before the run does (an edge exiting with an error,
    the air ending, the aggregator exiting without an outcome), every other one is stopped
    within :data:`FAIL_STOP_S` and that process's last error line and log path are printed
    to stderr (:meth:`EarlyExit.message`). At the end the run's outcome line goes to stdout
    (:func:`outcome_note`), then where its report is (:func:`report_note`, stderr), and, for
    an interrupted run, the command that continues it.

    Returns
    -------
    int
        By the outcomes of README ("Outcomes"): the aggregator's exit code when the run
        ended (:func:`outcome_code`), 130 when stopped by SIGINT/SIGTERM, else the code of
        the process that ended early (:attr:`EarlyExit.code`: an edge that found no USRP
        exits 5, link failed; a refused input 2).

    Raises
    ------
    TimeoutError
        The virtual air did not start, or the aggregator did not bind, within 120 s.
    """
    from testbed.core.lab_checks import LAUNCH_KEYS, LAUNCH_RUN

    keys = out_dir / LAUNCH_KEYS
    run_dir = out_dir / LAUNCH_RUN
    endpoint_file = out_dir / "endpoint"
    endpoint_file.unlink(missing_ok=True)  # a resumed launch waits for the new one
    children = Children(out_dir / "logs")
    stopped = {"signal": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stopped["signal"] = signum

    def wait(ready: Any, what: str, timeout_s: float = 120.0) -> EarlyExit | None:
        """Wait for ``ready()``; the first early exit (``None``: ready, or a signal)."""
        deadline = time.monotonic() + timeout_s
        while not ready() and not stopped["signal"]:
            failed = children.early_exit()
            if failed is not None:
                return failed
            if "aggregator" in children.procs and children.procs["aggregator"].poll() \
                    is not None:
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout_s:g} s")
            time.sleep(0.05)
        return None

    def air_runs() -> bool:  # its first log line of this launch
        log = children.log_path("air")
        return log.exists() and b"\n" in log.read_bytes()[children.log_start["air"]:]

    tb = testbed_command()
    failure: EarlyExit | None = None
    relay: LogRelay | None = None
    code = 0
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if virtual:
            assert hw_path is not None
            children.start("air", [*tb, "air", "--hw", str(hw_path), "--log-dir",
                                   str(out_dir / "air"), "--parent-pid", str(os.getpid())])
            failure = wait(air_runs, "the virtual air did not start")
        if failure is None and not stopped["signal"]:
            children.start("aggregator", [
                *tb, "aggregator", *aggregator_args, "--bind", "tcp://127.0.0.1:*",
                "--keys", str(keys), "--endpoint-file", str(endpoint_file)])
            relay = LogRelay(children.log_path("aggregator"), "aggregator: ",
                             enabled=progress, offset=children.log_start["aggregator"])
            failure = wait(endpoint_file.exists, "the aggregator did not bind")
        if failure is None and not stopped["signal"] and endpoint_file.exists():
            endpoint = endpoint_file.read_text().strip()
            for i in range(devices):
                edge = [*tb, "edge", "--connect", endpoint, "--device-id", str(i),
                        "--keys", str(keys), "--state-dir", str(out_dir / f"edge-{i}"),
                        *(["--hw", str(hw_path)] if hw_path is not None else []),
                        *((edge_args or {}).get(i, []))]
                env = {**os.environ, **edge_env[i]} if edge_env and i in edge_env else None
                children.start(f"edge-{i}", edge, env)
            if on_started is not None:
                on_started(children)
        agg_proc = children.procs.get("aggregator")
        while (failure is None and not stopped["signal"] and agg_proc is not None
               and agg_proc.poll() is None):
            if relay is not None:
                relay.poll()
            failure = children.early_exit()
            if failure is None:
                time.sleep(0.1)
        if stopped["signal"]:
            children.stop_all()
            code = 130
        elif failure is not None:
            children.stop_now()
            code = failure.code
        elif agg_proc is not None:
            if not (run_dir / "summary.json").is_file() and agg_proc.returncode != 0:
                # no outcome: it failed (or was killed); the edges would wait for it
                failure = children.aggregator_exit()
                children.stop_now()
                code = failure.code
            else:
                # The aggregator said leave; give the edges a moment, then make sure (the
                # air last).
                code = outcome_code(int(agg_proc.returncode))
                edges = [n for n in children.procs if n not in ("aggregator", "air")]
                children.wait_for(edges, time.monotonic() + 10)
                children.stop(edges)
                children.stop([n for n in children.procs if n == "air"])
        if relay is not None:
            relay.poll()
    finally:
        children.stop_all()
        for s, h in old.items():
            signal.signal(s, h)
        os.sync()
    if failure is not None:
        print(failure.message(), file=sys.stderr, flush=True)
    stopped_early = failure is not None and failure.name != "aggregator"
    if "aggregator" in children.procs and not (stopped_early and run_status(run_dir) is None):
        print(outcome_note(run_dir, int(children.procs["aggregator"].returncode)), flush=True)
        note = report_note(run_dir)
        if note is not None:
            print(note, file=sys.stderr, flush=True)
        if run_status(run_dir) == "interrupted":
            print(f"continue with:  testbed launch --resume {out_dir}", file=sys.stderr,
                  flush=True)
    return code
