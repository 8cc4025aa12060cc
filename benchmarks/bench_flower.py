#!/usr/bin/env python3
"""The testbed side by side with Flower: the default job and the private job, same machine.

Each job is run by the testbed (``python -m testbed run``, the shipped config with ``rounds``
overridden, ``--no-report``) and by Flower 1.42's simulation engine
(``flwr.simulation.run_simulation``, Ray backend; ``benchmarks/flower_job.py``), every run in
**its own child process** started from here, the two sides alternating (testbed, Flower,
testbed, Flower, ...; the order reversed in every other repeat) so that a busy machine slows
both alike. What is the same on both sides (``flower_job.py`` has the details), taken from
the testbed's own functions: the config, the data and its seeded non-IID split over 10
devices, the model (the MNIST CNN) and its seeded initial weights, SGD with the config's
learning rate, batch size and local steps (the same minibatches), every device in every
round, the uniform mean of the devices' models, and the evaluation (the fixed 500-sample
test subset every round, the full test set every ``eval_every`` rounds and in the last).

* **Default job** (``testbed/config/default.yaml``): Flower's clients train with
  ``torch.optim.SGD``. The testbed's devices also clip, sparsify (10 %) and quantize (16
  levels) every upload and send it over the in-process symbol link at 20 dB SNR, as the
  default job does; Flower sends the full-precision model without a channel. So the
  testbed does more work, and its accuracy differs slightly (both are reported).
* **Private job** (``testbed/config/private-fedsgd.yaml``, record-level DP-SGD): Flower's
  clients run one Opacus DP-SGD step per round with the testbed's Poisson rate
  ``q = B / D_i``, clip ``C`` and noise multiplier ``z`` (calibrated by the testbed's
  accountant for the rounds run, in the Flower process at its start, as ``testbed run``
  does), the noisy clipped sum divided by ``B``. The testbed's devices also sparsify (10 %)
  every upload and send it over the symbol link, as the private job does; they draw the
  private batches and the noise from the OS CSPRNG, Opacus from torch's generator.

Each side's **best setting** is measured and compared: the testbed with ``workers=auto``
(one training process per core) and ``workers=1``; Flower with 1 and with 2 clients training
at once (Ray actors of ``cores / parallel`` CPUs each, torch threads to match). A side's
best is its setting with the least median wall time; its CPU time and memory are that
setting's. At the default sizes only the parallel settings run (``workers=auto``, 2 Flower
clients); ``--full`` and ``--settings all`` run all four for the default job.

Measured for every run, from here: **wall** (start of the child to its exit); **CPU** (user
+ system time of every process of the side, the larger of two lower bounds: the resource
usage of the processes reaped here, this process being the subreaper of the side's orphans,
and the sum of every process's CPU time as last sampled from ``/proc``; Ray's raylet reaps
its workers without passing their time on, a sample misses a process's last interval; both
are in the output); **memory** (the peak over time of the summed proportional set size, PSS,
of the child's whole process tree, sampled every ``--sample`` s: pages shared between
processes are split between them, so neither Ray's processes nor the testbed's forked
workers are counted twice; the summed RSS, the largest process's ``ru_maxrss`` and the PSS
by process name at the peak are in the output too) and the final full-test-set accuracy.

Figures (value: the testbed's best setting; baseline: Flower's best, in the same run):

* ``default_job_wall`` (aim <= 0.25), ``default_job_cpu`` (aim <= 1), ``default_job_memory``
  (aim <= 0.1), ``default_job_accuracy`` (no aim; equal accuracy is part of the claim);
* ``private_job_wall``, ``private_job_cpu``, ``private_job_memory`` and
  ``private_job_accuracy`` against Flower + Opacus (no aims);
* ``memory_floor``: the peak PSS of a fresh interpreter that only imports numpy and torch
  (then waits a second, so that the sampler sees it), measured the same way, against
  Flower's best setting of the default job (no aim). Every process that trains with torch
  pays it, so no torch trainer gets below this ratio; where it exceeds ``default_job_memory``'s
  aim, that aim cannot be met while the testbed trains with torch.

Sizes: default 3 rounds of the default job and 1 of the private job, one repeat (about a
minute and a half on the shared 2-core machine, mostly the start of Ray and of the jobs);
``--full`` the full default job (40 rounds), 20 rounds of the private job (its first full
evaluation; its 160 rounds would take 10 to 20 minutes per pair of runs here) and two
repeats (figures: medians), about 16 minutes in all.

Flower is an optional dependency (``pip install -e '.[bench]'``, ``flwr==1.42.0``). Its
pins (protobuf < 7, packaging < 26, and ``ray==2.55.1`` with its ``simulation`` extra)
disagree with this environment's, so it may live in a directory of its own that is put in
front of the environment's packages for the Flower side only: ``--flower-path`` (default
``$BENCH_FLOWER_PATH``, else ``build/flower`` when it exists; ``benchmarks/README.md`` shows
how to fill it). Without Flower the script says so on stderr and exits 0 with
``"skipped"`` (the reason) and an empty ``figures`` list in its JSON: nothing was measured,
which is not a failure of the testbed (``testbed bench`` lists it without figures); without
Opacus the private job is left out, saying so. Usage::

    .venv/bin/python benchmarks/bench_flower.py [--rounds 3] [--private-rounds 1]
        [--repeats 1] [--settings parallel|all|all-jobs] [--flower-path DIR] [--full] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.bench_figures import Figure, figure, format_table

REPO_ROOT = Path(__file__).resolve().parents[1]
FLOWER_JOB = Path(__file__).resolve().with_name("flower_job.py")
PRIVATE_CONFIG = REPO_ROOT / "testbed" / "config" / "private-fedsgd.yaml"
DEFAULT_FLOWER_PATH = REPO_ROOT / "build" / "flower"
#: Aims of the figures (None: no aim), by job and measure.
AIMS: dict[tuple[str, str], float | None] = {
    ("default", "wall"): 0.25, ("default", "cpu"): 1.0, ("default", "memory"): 0.1,
}
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Setting:
    """One way of running a job: ``side`` ``testbed`` (``par``: its ``workers``) or
    ``flower`` (``par``: clients training at once)."""

    side: str
    job: str
    par: str

    @property
    def label(self) -> str:
        """E.g. ``testbed workers=auto`` or ``flower parallel=2``."""
        return f"{self.side} {'workers' if self.side == 'testbed' else 'parallel'}={self.par}"


@dataclass
class Measured:
    """One run of a setting, measured from this process."""

    wall_s: float
    cpu_s: float
    cpu_reaped_s: float
    cpu_sampled_s: float
    peak_pss_mib: float
    peak_rss_mib: float
    max_process_rss_mib: float
    processes: int
    pss_at_peak_mib: dict[str, float]
    accuracy: float
    subset_accuracy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# -- measuring a child process and everything it starts --------------------------------------
def _proc_table() -> dict[int, tuple[int, float]]:
    """Every process's parent and CPU time so far (its own user + system, s), from
    ``/proc``."""
    table: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    return table


def descendants(root: int, table: dict[int, tuple[int, float]] | None = None) -> list[int]:
    """The processes below ``root`` (children, their children, ...)."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in (_proc_table() if table is None else table).items():
        kids.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for c in kids.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def _memory(pid: int) -> tuple[int, int]:
    """RSS and PSS of ``pid`` in bytes (0, 0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
        pss = 0
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
        return rss, pss
    except (OSError, ValueError, IndexError):
        return 0, 0


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class TreeSampler(threading.Thread):
    """Samples the summed RSS and PSS of every process below this one until stopped; keeps
    the PSS of each process (by name) at the PSS peak, and each process's last CPU time."""

    def __init__(self, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.peak_rss = self.peak_pss = 0
        self.at_peak: dict[str, float] = {}
        self.cpu: dict[int, float] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        while True:
            table = _proc_table()
            procs = descendants(me, table)
            self.cpu.update((p, table[p][1]) for p in procs)
            mem = [_memory(p) for p in procs]
            self.peak_rss = max(self.peak_rss, sum(m[0] for m in mem))
            pss = sum(m[1] for m in mem)
            if pss > self.peak_pss:
                self.peak_pss = pss
                names: dict[str, float] = {}
                for pid, m in zip(procs, mem, strict=True):
                    name = _name(pid)
                    names[name] = names.get(name, 0.0) + m[1] / 2**20
                self.at_peak = {k: round(v, 1) for k, v in sorted(names.items())}
            if self._stop_event.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux), so that their CPU
    time reaches ``RUSAGE_CHILDREN`` here; whether that worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _stop_descendants(sig: int) -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap_all(linger_s: float) -> int:
    """Reap every child left (orphans re-parented here); stop them after ``linger_s``.
    Returns the largest ``ru_maxrss`` (KiB) among them."""
    maxrss, deadline, signalled = 0, time.monotonic() + linger_s, 0
    while True:
        try:
            pid, _, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return maxrss
        if pid:
            maxrss = max(maxrss, ru.ru_maxrss)
            continue
        if time.monotonic() > deadline:
            if signalled == 2:  # what is left is not ours to wait for
                return maxrss
            _stop_descendants(signal.SIGTERM if signalled == 0 else signal.SIGKILL)
            signalled += 1
            deadline = time.monotonic() + 5.0
        time.sleep(0.05)


def run_measured(cmd: list[str], env: dict[str, str], logs: Path, sample_s: float
                 ) -> tuple[dict[str, Any], str]:
    """Run ``cmd`` as a child; its measurements and its stdout.

    Raises
    ------
    RuntimeError
        The child exits with a non-zero status (its stderr's tail in the message).
    """
    out_path, err_path = logs / "stdout.txt", logs / "stderr.txt"
    cpu0 = _cpu_children()
    sampler = TreeSampler(sample_s)
    t0 = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=REPO_ROOT)
    sampler.start()
    try:
        _, status, ru = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        _stop_descendants(signal.SIGKILL)
        raise
    finally:
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    maxrss = max(ru.ru_maxrss, _reap_all(linger_s=20.0))
    sampler.stop()
    reaped = _cpu_children() - cpu0
    sampled = sum(sampler.cpu.values())
    stdout = out_path.read_text()
    if proc.returncode != 0:
        tail = err_path.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(cmd)}: exit status {proc.returncode}\n{tail}")
    return {
        "wall_s": wall, "cpu_s": max(reaped, sampled), "cpu_reaped_s": reaped,
        "cpu_sampled_s": sampled,
        "peak_pss_mib": sampler.peak_pss / 2**20, "peak_rss_mib": sampler.peak_rss / 2**20,
        "max_process_rss_mib": maxrss / 1024, "processes": len(sampler.cpu) or 1,
        "pss_at_peak_mib": sampler.at_peak,
    }, stdout


# -- the two sides ---------------------------------------------------------------------------
def _pythonpath(*first: str | Path) -> str:
    return os.pathsep.join(str(p) for p in (*first, os.environ.get("PYTHONPATH", "")) if p)


def flower_env(flower_path: Path | None) -> dict[str, str]:
    """The environment of the Flower side: ``flower_path`` (if any) in front of this
    environment's packages; Flower's telemetry and Ray's usage statistics off (this machine
    has no network)."""
    extra = [flower_path] if flower_path is not None else []
    return {**os.environ, "PYTHONPATH": _pythonpath(*extra, REPO_ROOT),
            "FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def flower_missing(flower_path: Path | None, need_opacus: bool) -> str | None:
    """Why the Flower side cannot run (``None``: it can)."""
    mods = "flwr, flwr.simulation" + (", opacus" if need_opacus else "")
    probe = subprocess.run(
        [sys.executable, "-c", f"import {mods}; print(flwr.__version__)"],
        capture_output=True, text=True, env=flower_env(flower_path), check=False,
    )
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["?"])[-1]
    where = f" (also looked in {flower_path})" if flower_path is not None else ""
    return f"Flower is not importable{where}: {last}"


def command(s: Setting, rounds: int, out_dir: Path, flower_path: Path | None
            ) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one run of ``s``."""
    if s.side == "flower":
        return ([sys.executable, str(FLOWER_JOB), "--job", s.job, "--rounds", str(rounds),
                 "--parallel", s.par], flower_env(flower_path))
    config = [str(PRIVATE_CONFIG)] if s.job == "private" else []
    return ([sys.executable, "-m", "testbed", "run", *config, "--set", f"rounds={rounds}",
             "--set", f"workers={s.par}", "--out", str(out_dir), "--no-progress",
             "--no-report", "--json"],
            {**os.environ, "PYTHONPATH": _pythonpath(REPO_ROOT)})


def measure(s: Setting, rounds: int, flower_path: Path | None, sample_s: float) -> Measured:
    """One run of ``s``, in a child process."""
    with tempfile.TemporaryDirectory(prefix="bench_flower_") as tmp:
        cmd, env = command(s, rounds, Path(tmp) / "run", flower_path)
        m, stdout = run_measured(cmd, env, Path(tmp), sample_s)
    res = json.loads(stdout.strip().splitlines()[-1])
    if s.side == "testbed" and res.get("status") != "completed":
        raise RuntimeError(f"{s.label}: {res.get('status')}: {res.get('reason')}")
    acc = res.get("final_accuracy")
    if acc is None:
        raise RuntimeError(f"{s.label}: no final accuracy in its output")
    extra = {"flower_wall_s": res["wall_s"], "dp": res.get("dp")} if s.side == "flower" else {
        "testbed_wall_s": res.get("wall_time_s"), "workers": res.get("workers")}
    return Measured(**m, accuracy=float(acc), subset_accuracy=res.get("final_subset_accuracy"),
                    extra=extra)


#: The floor of a torch trainer's memory: an interpreter that imports numpy and torch, then
#: stays a second for the sampler.
FLOOR_CODE = "import numpy, torch, time; time.sleep(1.0)"


def measure_floor(sample_s: float) -> float:
    """Peak PSS (MiB) of a fresh interpreter that only imports numpy and torch."""
    with tempfile.TemporaryDirectory(prefix="bench_flower_") as tmp:
        m, _ = run_measured([sys.executable, "-c", FLOOR_CODE],
                            {**os.environ, "PYTHONPATH": _pythonpath(REPO_ROOT)}, Path(tmp),
                            sample_s)
    return float(m["peak_pss_mib"])


# -- figures ---------------------------------------------------------------------------------
def medians(runs: list[Measured]) -> dict[str, float]:
    """The median of each measure over a setting's runs."""
    keys = ("wall_s", "cpu_s", "peak_pss_mib", "peak_rss_mib", "max_process_rss_mib",
            "accuracy")
    return {k: float(statistics.median(getattr(r, k) for r in runs)) for k in keys}


def best(results: dict[Setting, list[Measured]], side: str, job: str
         ) -> tuple[Setting, dict[str, float]]:
    """``side``'s setting of ``job`` with the least median wall time, and its medians."""
    mine = {s: medians(r) for s, r in results.items() if s.side == side and s.job == job}
    if not mine:
        raise ValueError(f"no {side} run of the {job} job")
    s = min(mine, key=lambda k: mine[k]["wall_s"])
    return s, mine[s]


def job_figures(results: dict[Setting, list[Measured]], job: str, note: str) -> list[Figure]:
    """The wall, CPU, memory and accuracy figures of ``job``: the testbed's best setting
    against Flower's best."""
    ts, tm = best(results, "testbed", job)
    fs, fm = best(results, "flower", job)
    flower = "Flower" + (" + Opacus" if job == "private" else "")
    base = f"{flower}, {fs.label.split(' ', 1)[1]}"
    n = len(results[ts])
    head = f"testbed {ts.label.split(' ', 1)[1]} vs {base}"
    rows = [
        ("wall", tm["wall_s"], fm["wall_s"], "s", "lower", "wall time of the whole job"),
        ("cpu", tm["cpu_s"], fm["cpu_s"], "s", "lower",
         "CPU time (user + system) of every process of the side"),
        ("memory", tm["peak_pss_mib"], fm["peak_pss_mib"], "MiB", "lower",
         "peak summed PSS of the side's processes (summed RSS: testbed "
         f"{tm['peak_rss_mib']:.0f}, {flower} {fm['peak_rss_mib']:.0f} MiB)"),
    ]
    figs = [
        figure(f"{job}_job_{what}", v, b, unit, better=better, aim=AIMS.get((job, what)),
               baseline_name=base, note=f"{head}; {text}; median of {n}; {note}")
        for what, v, b, unit, better, text in rows
    ]
    figs.append(figure(
        f"{job}_job_accuracy", tm["accuracy"], fm["accuracy"], "fraction", better="higher",
        baseline_name=base, note=f"{head}; final full-test-set accuracy; median of {n}; {note}",
    ))
    return figs


def floor_figure(results: dict[Setting, list[Measured]], floors: list[float], note: str
                 ) -> Figure:
    """``memory_floor``: the median of ``floors`` (MiB, :func:`measure_floor`) against the
    peak PSS of Flower's best setting of the default job (no aim)."""
    fs, fm = best(results, "flower", "default")
    return figure(
        "memory_floor", float(statistics.median(floors)), fm["peak_pss_mib"], "MiB",
        better="lower", baseline_name=f"Flower, {fs.label.split(' ', 1)[1]}",
        note=f"peak PSS of an interpreter that only imports numpy and torch (median of "
             f"{len(floors)}), against Flower's default job: no process that trains with "
             f"torch is below it; {note}")


def plan(jobs: list[str], settings: str, repeats: int) -> list[Setting]:
    """The runs in order: per job and repeat the sides alternate (testbed, Flower, ...), the
    order reversed in every other repeat."""
    order: list[Setting] = []
    for job in jobs:
        every = (settings == "all" and job == "default") or settings == "all-jobs"
        tb = ["auto", "1"] if every else ["auto"]
        fl = ["1", "2"] if every else ["2"]
        pairs = [(Setting("testbed", job, t), Setting("flower", job, f))
                 for t, f in zip(tb, fl, strict=True)]
        one = [s for pair in pairs for s in pair]
        for rep in range(repeats):
            order.extend(one if rep % 2 == 0 else one[::-1])
    return order


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of the default job (default 3, with --full 40)")
    p.add_argument("--private-rounds", type=int, default=None,
                   help="rounds of the private job (default 1, with --full 20; 0: skip it)")
    p.add_argument("--repeats", type=int, default=None,
                   help="runs of every setting (default 1, with --full 2)")
    p.add_argument("--settings", choices=("parallel", "all", "all-jobs"), default=None,
                   help="parallel: testbed workers=auto and 2 Flower clients at once; all: "
                   "also workers=1 and 1 Flower client, for the default job; all-jobs: for "
                   "both jobs (default parallel, with --full all)")
    p.add_argument("--flower-path", type=Path, default=None,
                   help="directory put in front of this environment's packages for the "
                   "Flower side (default $BENCH_FLOWER_PATH, else build/flower if it exists)")
    p.add_argument("--sample", type=float, default=0.2,
                   help="seconds between memory samples of a side's processes")
    p.add_argument("--full", action="store_true", help="the large sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    rounds = args.rounds or (40 if args.full else 3)
    private_rounds = (args.private_rounds if args.private_rounds is not None
                      else (20 if args.full else 1))
    repeats = args.repeats or (2 if args.full else 1)
    settings = args.settings or ("all" if args.full else "parallel")
    if rounds < 1 or private_rounds < 0 or repeats < 1 or args.sample <= 0:
        p.error("need --rounds >= 1, --private-rounds >= 0, --repeats >= 1, --sample > 0")
    flower_path = args.flower_path
    if flower_path is None:
        env_path = os.environ.get("BENCH_FLOWER_PATH")
        if env_path:
            flower_path = Path(env_path)
        elif DEFAULT_FLOWER_PATH.is_dir():
            flower_path = DEFAULT_FLOWER_PATH
    jobs = ["default", *(["private"] if private_rounds > 0 else [])]
    missing = flower_missing(flower_path, need_opacus=False)
    if missing is None and "private" in jobs:
        no_opacus = flower_missing(flower_path, need_opacus=True)
        if no_opacus is not None:
            print(f"bench_flower: the private job is left out: {no_opacus}", file=sys.stderr)
            jobs = ["default"]
    if missing is not None:
        reason = (f"{missing}; nothing measured (pip install -e '.[bench]', or see "
                  "benchmarks/README.md for a separate --flower-path)")
        print(f"bench_flower: skipped: {reason}", file=sys.stderr)
        print(json.dumps({"skipped": reason, "figures": []}) if args.json
              else f"skipped: {reason}")
        return 0
    subreaper = become_subreaper()
    load_before = os.getloadavg()
    results: dict[Setting, list[Measured]] = {}
    floors: list[float] = []
    order = plan(jobs, settings, repeats)
    for k, s in enumerate(order, 1):
        if (s.side, s.job) == ("testbed", "default"):  # beside each testbed run of it
            floors.append(measure_floor(args.sample))
            print(f"    floor (import numpy, torch): peak PSS {floors[-1]:.0f} MiB",
                  file=sys.stderr, flush=True)
        r = rounds if s.job == "default" else private_rounds
        print(f"[{k}/{len(order)}] {s.job} job, {r} round{'s' if r != 1 else ''}: {s.label} "
              "...", file=sys.stderr, flush=True)
        m = measure(s, r, flower_path, args.sample)
        print(f"    wall {m.wall_s:.1f} s, CPU {m.cpu_s:.1f} s, peak PSS "
              f"{m.peak_pss_mib:.0f} MiB ({m.processes} processes), accuracy "
              f"{m.accuracy:.4f}", file=sys.stderr, flush=True)
        results.setdefault(s, []).append(m)
    load_after = os.getloadavg()
    cores = len(os.sched_getaffinity(0))
    load = (f"load average {load_before[0]:.1f} -> {load_after[0]:.1f} on {cores} cores "
            "(shared machine)")
    figures: list[Figure] = []
    for job in jobs:
        r = rounds if job == "default" else private_rounds
        figures += job_figures(results, job, f"{r} round{'s' if r != 1 else ''}; {load}")
    figures.append(floor_figure(results, floors, load))
    flwr_version = subprocess.run(
        [sys.executable, "-c", "import flwr; print(flwr.__version__)"], capture_output=True,
        text=True, env=flower_env(flower_path), check=False).stdout.strip()
    result: dict[str, Any] = {
        "rounds": rounds, "private_rounds": private_rounds, "repeats": repeats,
        "settings": settings, "flwr": flwr_version, "memory_floor_mib": floors,
        "flower_path": None if flower_path is None else str(flower_path),
        "subreaper": subreaper, "cores": cores, "loadavg_before": load_before,
        "loadavg_after": load_after, "sample_s": args.sample,
        "best": {job: {side: best(results, side, job)[0].label
                       for side in ("testbed", "flower")} for job in jobs},
        "accuracy": {job: {side: best(results, side, job)[1]["accuracy"]
                           for side in ("testbed", "flower")} for job in jobs},
        "runs": {f"{s.job}: {s.label}": [asdict(m) for m in ms] for s, ms in results.items()},
        "medians": {f"{s.job}: {s.label}": medians(ms) for s, ms in results.items()},
        "figures": [f.to_json() for f in figures],
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([("flower", f, "ok") for f in figures]))
        for label, med in result["medians"].items():
            print(f"{label:32s} wall {med['wall_s']:6.1f} s  CPU {med['cpu_s']:6.1f} s  PSS "
                  f"{med['peak_pss_mib']:5.0f} MiB  RSS {med['peak_rss_mib']:5.0f} MiB  "
                  f"accuracy {med['accuracy']:.4f}")
        print(load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
