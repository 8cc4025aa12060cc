"""``testbed launch``: an aggregator and N edge processes on this machine, over loopback.

For CI and demos. Fresh CurveZMQ keys are written under the output directory (the secrets
0600); the aggregator binds an ephemeral loopback port and writes it to a file the edges'
command lines are built from. Ctrl-C (or SIGTERM) stops the aggregator first (it records an
interrupted run that ``testbed aggregator --resume`` continues), then the edges; every child
also dies with the launcher (``PR_SET_PDEATHSIG``), so no process is left behind.

Layout of ``--out DIR``: ``DIR/aggregator`` (the run directory), ``DIR/edge-I`` (each edge's
own ledger), ``DIR/keys``, ``DIR/logs/*.log``.

With a hardware config (``--hw``) every process reads the same resolved copy, ``DIR/hw.yaml``
(``--hw-set`` applied). When its radios are virtual (docs/virtual_lab.md) the launcher first
starts the virtual air (``testbed air``, on two free loopback ports written into that copy,
its burst log in ``DIR/air``); each edge then opens its own ``tx`` flowgraph on its virtual
USRP and the aggregator its ``rx`` flowgraph: the processes of docs/lab.md, with only the
device args changed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.core.child_process import die_with_parent

if TYPE_CHECKING:
    from testbed.core.config.experiment import ExperimentConfig

#: Seconds a child gets to exit after SIGTERM before SIGKILL.
GRACE_S = 15.0


def testbed_command() -> list[str]:
    """The command line that runs this ``testbed`` (the current interpreter)."""
    return [sys.executable, "-m", "testbed"]


class Children:
    """Child processes of a launch; stopped in order on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent, start_new_session=True, env=env,
        )
        log.close()

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def stop(self, names: list[str], sig: int = signal.SIGTERM) -> None:
        """Signal ``names``, wait up to :data:`GRACE_S`, then SIGKILL what is left."""
        for n in names:
            if self.procs[n].poll() is None:
                self.procs[n].send_signal(sig)
        deadline = time.monotonic() + GRACE_S
        for n in names:
            try:
                self.procs[n].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.procs[n].kill()
                self.procs[n].wait()

    def stop_all(self) -> None:
        names = list(self.procs)
        self.stop([n for n in names if n == "aggregator"], signal.SIGINT)
        self.stop([n for n in names if n not in ("aggregator", "air")])
        self.stop([n for n in names if n == "air"])


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
    path = out_dir / "hw.yaml"
    path.write_text(dump_yaml_text(hw.model_dump(mode="json")))
    load_hardware(str(path))  # what every process will read: it must load
    return path, hw.virtual


def _wait_for_air(children: Children, timeout_s: float = 120.0) -> None:
    """Wait until the air says it runs (its first log line), or raise."""
    log = children.log_dir / "air.log"
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and b"\n" in log.read_bytes()):
        if children.procs["air"].poll() is not None:
            raise RuntimeError(f"the virtual air exited (code {children.procs['air'].returncode})"
                               f"; see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the virtual air did not start within {timeout_s:g} s")
        time.sleep(0.05)


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
    """

    def __init__(self, path: Path, prefix: str, *, enabled: bool = True) -> None:
        self.path = path
        self.prefix = prefix
        self.enabled = enabled
        self.offset = 0

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
    aggregator; stop the rest.

    While the run goes, the aggregator's progress lines (one per round, or every
    ``progress_every``) and its devices' joins and departures are relayed to stderr
    (:class:`LogRelay`); at the end the run's outcome line is printed to stdout
    (:func:`outcome_note`). Returns the aggregator's exit code (130 when stopped by a signal).
    ``hw_config``: a hardware config every process reads (module docstring; ``None``: the
    experiment's ``hw_config`` with ``hw_overrides`` on the aggregator only);
    ``train_allowance_s``, ``phase_timeout_s``: the aggregator's ``--train-allowance`` and
    ``--phase-timeout`` (``None``: its defaults); ``edge_args``: extra arguments per edge;
    ``edge_env``: extra environment variables per edge (fault injection); ``fallback``:
    ``--fallback`` (emulated radios when no USRP is found; without ``hw_config`` it applies
    to the experiment's own ``hw_config``); ``progress``: ``False`` passes ``--no-progress``
    to the aggregator and relays nothing (the outcome line is still printed).

    Raises
    ------
    testbed.core.radio_fallback.FallbackRefused
        ``fallback`` emulate and only some of the USRPs found (before any process starts).
    testbed.core.config.errors.ConfigError
        A bad config, or ``fallback`` emulate off the ``usrp`` link (before anything is
        created).
    """
    from testbed.core.config.loader import load_experiment
    from testbed.core.curve_keys import generate_keys

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
    keys = out_dir / "keys"
    generate_keys(keys, devices)
    endpoint_file = out_dir / "endpoint"
    children = Children(out_dir / "logs")
    stopped = {"signal": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stopped["signal"] = signum

    tb = testbed_command()
    if hw_config is None and fallback is not None:
        hw_config = cfg.hw_config  # every process must read the resolved radios
    hw_path, virtual = (None, False) if hw_config is None else \
        _resolved_hw(out_dir, hw_config, hw_overrides, fallback=fallback, cfg=cfg,
                     devices=devices)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if virtual:
            assert hw_path is not None
            children.start("air", [*tb, "air", "--hw", str(hw_path), "--log-dir",
                                   str(out_dir / "air"), "--parent-pid", str(os.getpid())])
            _wait_for_air(children)
        agg = [*tb, "aggregator", *([config] if config else []), "--bind", "tcp://127.0.0.1:*",
               "--keys", str(keys), "--out", str(out_dir / "aggregator"),
               "--endpoint-file", str(endpoint_file), "--set", f"devices={devices}",
               "--round-timeout", str(round_timeout_s), "--join-timeout", str(join_timeout_s),
               *([] if progress else ["--no-progress"])]
        if train_allowance_s is not None:
            agg += ["--train-allowance", repr(float(train_allowance_s))]
        if phase_timeout_s is not None:
            agg += ["--phase-timeout", repr(float(phase_timeout_s))]
        for o in overrides:
            agg += ["--set", o]
        if hw_path is not None:
            agg += ["--set", f"hw_config={hw_path}"]
        else:
            for o in hw_overrides:
                agg += ["--hw-set", o]
        children.start("aggregator", agg)
        deadline = time.monotonic() + 120
        while not endpoint_file.exists():
            if children.procs["aggregator"].poll() is not None or stopped["signal"]:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the aggregator did not bind within 120 s")
            time.sleep(0.05)
        if endpoint_file.exists():
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
        agg_proc = children.procs["aggregator"]
        relay = LogRelay(children.log_dir / "aggregator.log", "aggregator: ",
                         enabled=progress)
        while agg_proc.poll() is None and not stopped["signal"]:
            relay.poll()
            time.sleep(0.1)
        if stopped["signal"]:
            children.stop_all()
            code = 130
        else:
            # The aggregator said leave; give the edges a moment, then make sure (the air
            # last).
            code = int(agg_proc.returncode)
            edges = [n for n in children.procs if n not in ("aggregator", "air")]
            end = time.monotonic() + 10
            while (any(children.procs[n].poll() is None for n in edges)
                   and time.monotonic() < end):
                time.sleep(0.1)
            children.stop(edges)
            children.stop([n for n in children.procs if n == "air"])
        relay.poll()
    finally:
        children.stop_all()
        for s, h in old.items():
            signal.signal(s, h)
        os.sync()
    print(outcome_note(out_dir / "aggregator", code), flush=True)
    return code
