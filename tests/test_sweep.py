"""`testbed sweep`: a grid run as Ray tasks, one ordinary run directory per cell; finished
cells skipped and interrupted ones resumed on re-run; one CSV and one PNG; clear errors for
bad sweep files before anything runs; no Ray process or cell process left behind."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.core.config.loader import default_experiment_dict
from testbed.core.config.safe_yaml import dump_yaml_text
from testbed.core.privacy import Ledger
from testbed.sweep import RESULT_COLUMNS, load_sweep, parse_sweep, run_sweep
from testbed.sweep.cells import build_cells, cell_name

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _tiny_set(data_dir: Path, rounds: int = 3) -> dict[str, object]:
    """Fixed overrides of a cell that runs in about a second (after start-up)."""
    return {
        "dataset": "mnist",
        "model": "logreg",
        "data_dir": str(data_dir),
        "devices": 4,
        "rounds": rounds,
        "local_steps": 1,
        "batch_size": 16,
        "lr": 0.05,
        "privacy.noise": "upload",
    }


def _write(path: Path, data: dict[str, object]) -> Path:
    path.write_text(dump_yaml_text(data), encoding="utf-8")
    return path


def _processes() -> dict[int, tuple[int, str]]:
    """``{pid: (session id, command line)}`` of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(entry.name)] = (int(stat[stat.rindex(")") + 2:].split()[3]), cmd)
    return out


def _wait_gone(left: Callable[[], list[str]], wait_s: float = 20.0) -> None:
    deadline = time.monotonic() + wait_s
    while (found := left()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not found, f"left behind: {found}"


def _nothing_in_session(sid: int) -> list[str]:
    """Processes still in session ``sid`` (a command started with its own session: Ray's
    processes and the cells' ``testbed run`` stay in it)."""
    return [f"{pid}: {cmd[:150]}" for pid, (s, cmd) in _processes().items() if s == sid]


def _new_ray_processes(before: set[int]) -> list[str]:
    """Ray-like processes (workers rename themselves ``ray::...``) of this test's session
    that were not there ``before``."""
    me = os.getsid(0)
    return [
        f"{pid}: {cmd[:150]}" for pid, (s, cmd) in _processes().items()
        if s == me and pid not in before and ("ray::" in cmd or "/site-packages/ray/" in cmd)
    ]


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``testbed ARGS`` in its own session; asserts that nothing of that session outlives it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", *args], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    stdout, stderr = proc.communicate(timeout=300)
    _wait_gone(lambda: _nothing_in_session(proc.pid))
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# --- bad sweep files: refused before anything is written or started ----------------------

BAD = [
    ({"grid": {"privacy.epsilonn": [1, 2]}},
     ["sweep key 'grid.privacy.epsilonn': not an experiment config key", "privacy.epsilon"]),
    ({"grid": {"rounds": [2]}, "set": {"privacy": {"epsilon": 1}}},
     ["sweep key 'set'", "'privacy': got a mapping", "privacy.epsilon"]),
    ({"grid": {"privacy": [1]}}, ["'grid.privacy': 'privacy' is a section", "privacy.delta"]),
    ({"grid": {"seed": []}}, ["sweep key 'grid'", "'seed': an empty list"]),
    ({"grid": {"seed": 0}}, ["sweep key 'grid.seed'", "valid list"]),
    ({"set": {"rounds": 2}}, ["sweep file '", "bad.yaml' has no 'grid' section",
                              "e.g. grid: {snr_db: [10, 20]}"]),
    ({"name": "empty"}, ["sweep file '", "bad.yaml' has no 'grid' section (keys given: name)",
                         "allowed: a grid mapping", "e.g. grid: {snr_db: [10, 20]}"]),
    ({"grids": {"seed": [0]}, "grid": {"seed": [0]}}, ["sweep key 'grids': unknown key"]),
    ({"grid": {"seed": [0, 0]}}, ["'seed': value 0 is listed twice"]),
    ({"grid": {"rounds": [1]}, "set": {"rounds": 2}}, ["'rounds' is in both 'set' and 'grid'"]),
    ({"grid": {"rounds": [2, 0]}},
     ["sweep cell 2/2 (rounds=0): config key 'rounds': got 0", "greater than or equal to 1"]),
    ({"grid": {"scheme": ["fedavg", "ldp-fedavgg"]}},
     ["sweep cell 2/2 (scheme=ldp-fedavgg): config key 'scheme'", "'ldp-fedavg'"]),
    ({"grid": {"seed": [0]}, "base": "missing.yaml"},
     ["sweep key 'base': got 'missing.yaml'", "relative base is taken from the sweep file's"]),
    ({"grid": {"seed": [0]}, "cpus_per_cell": 0}, ["sweep key 'cpus_per_cell': got 0"]),
    ({"grid": {"seed": [0]}, "hw_set": {"linkk": "symbol"}},
     ["sweep cell 1/1 (seed=0): hardware config key 'linkk': unknown key"]),
]


@pytest.mark.parametrize(("data", "expected"), BAD)
def test_bad_sweep_file_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, object],
    expected: list[str],
) -> None:
    sweep = _write(tmp_path / "bad.yaml", data)
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
    assert not out.exists()


def test_cpus_beyond_the_local_instance_are_refused(tmp_path: Path, tiny_idx_dir: Path) -> None:
    sweep = _write(tmp_path / "s.yaml", {"set": _tiny_set(tiny_idx_dir), "grid": {"seed": [0]},
                                         "cpus_per_cell": 3})
    out = tmp_path / "out"
    proc = _cli(["sweep", str(sweep), "--out", str(out), "--cpus", "2"])
    assert proc.returncode == 2
    assert "3 CPUs (torch_threads x workers) are more than the local Ray instance has (2)" in (
        proc.stderr)
    assert not out.exists()


def test_an_unreachable_cluster_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:  # a loopback port where nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sweep = _write(tmp_path / "s.yaml", {"grid": {"seed": [0]}})
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--address", f"127.0.0.1:{port}"]) == 2
    assert f"nothing answers at 127.0.0.1:{port}" in capsys.readouterr().err
    assert not out.exists()


def test_cell_names_are_deterministic_safe_and_distinct() -> None:
    a = cell_name((("scheme", "ldp-fedavg"), ("privacy.epsilon", 1.8), ("seed", 0)))
    assert a == "scheme=ldp-fedavg__privacy.epsilon=1.8__seed=0"
    # Unsafe characters are replaced and a hash of the exact values keeps names apart.
    b = cell_name((("data_dir", "/x/y"),))
    c = cell_name((("data_dir", "/x_y"),))
    assert "/" not in b and b != c and b.startswith("data_dir=_x_y-h")
    assert cell_name((("snr_db", [10, 20]),)) == cell_name((("snr_db", [10, 20]),))
    assert len(cell_name((("name", "n" * 400),))) < 200


def test_cells_are_built_as_testbed_run_builds_them(tmp_path: Path) -> None:
    base = _write(tmp_path / "base.yaml", {"rounds": 7, "scheme": "ldp-fedavg"})
    sweep = _write(tmp_path / "s.yaml", {
        "base": "base.yaml",
        "set": {"privacy.delta": 1e-6, "devices": 2, "snr_db": [5, 10]},
        "grid": {"privacy.epsilon": [1.8, 5], "seed": [0, 3]},
        "cpus_per_cell": 2,
    })
    spec = load_sweep(sweep)
    assert spec.base == str(base.resolve()) and spec.name == "s"
    cells = build_cells(spec)
    assert [c.label for c in cells] == [
        "privacy.epsilon=1.8, seed=0", "privacy.epsilon=1.8, seed=3",
        "privacy.epsilon=5, seed=0", "privacy.epsilon=5, seed=3",
    ]
    cfg = cells[3].config
    assert (cfg.rounds, cfg.scheme, cfg.seed, cfg.privacy.epsilon) == (7, "ldp-fedavg", 3, 5)
    assert cfg.privacy.delta == 1e-6 and cfg.snr_db == [5, 10] and cfg.torch_threads == 2
    default = default_experiment_dict()  # the shipped default lies under the base file
    assert (cfg.batch_size, cfg.lr) == (default["batch_size"], default["lr"])
    assert "snr_db=[5, 10]" in cells[0].overrides and "torch_threads=2" in cells[0].overrides


# --- a real 2 x 2 sweep on local Ray ------------------------------------------------------


@pytest.mark.slow  # reason: 26 s of Ray; the failing-cell sweep of this file runs by default
def test_sweep_runs_resumes_then_skips_and_leaves_no_process(
    tmp_path: Path, tiny_idx_dir: Path
) -> None:
    sweep = _write(tmp_path / "tiny.yaml", {
        "set": _tiny_set(tiny_idx_dir),
        "grid": {"scheme": ["ldp-fedavg", "channel-dp"], "privacy.epsilon": [2, 8]},
    })
    out = tmp_path / "out"
    cells = build_cells(load_sweep(sweep))
    # One cell killed (SIGKILL, as by a power cut) after its first round's checkpoint, with
    # exactly the command the sweep would run: the sweep must resume it, not restart it.
    crashed = cells[1]
    crashed_dir = out / "runs" / crashed.name
    args = ["run", "--no-progress", "--out", str(crashed_dir)]
    for item in crashed.overrides:
        args += ["--set", item]
    killed = _cli(args, env={**os.environ, "TESTBED_FAULT": "after_checkpoint:2"})
    assert killed.returncode == -signal.SIGKILL
    assert not (crashed_dir / "summary.json").exists()

    first = _cli(["sweep", str(sweep), "--out", str(out), "--cpus", "2"])  # and nothing left
    assert first.returncode == 0, first.stderr
    assert "4 cells: 3 to run, 1 to resume, 0 finished (skipped)" in first.stderr
    assert f"({crashed.label}): resumed: completed" in first.stderr

    rows = _csv_rows(out / "results.csv")
    assert len(rows) == 4
    assert list(rows[0]) == ["scheme", "privacy.epsilon", *RESULT_COLUMNS]
    for row, cell in zip(rows, cells, strict=True):
        run_dir = out / "runs" / cell.name
        summary = json.loads((run_dir / "summary.json").read_text())
        assert row["run_dir"] == str(run_dir)
        assert (row["scheme"], float(row["privacy.epsilon"])) == (
            cell.config.scheme, cell.config.privacy.epsilon)
        assert row["status"] == summary["status"] == "completed"
        assert int(row["rounds_completed"]) == summary["rounds_completed"] == 3
        assert float(row["final_accuracy"]) == summary["final_accuracy"]
        devices = summary["privacy"]["devices"]
        assert float(row["epsilon_max"]) == max(d["epsilon"] for d in devices)
        assert float(row["epsilon_max"]) <= cell.config.privacy.epsilon
        assert float(row["epsilon_device_max"]) == max(d["epsilon_device_level"] for d in devices)
        assert (row["privacy_unit"], row["accountant"], float(row["delta"])) == (
            "record", "pld", summary["privacy"]["delta"])
        assert row["trust"] == summary["privacy"]["trust"]
        assert float(row["energy_j"]) == pytest.approx(
            sum(summary["energy_comm_j_per_device"]) + sum(summary["energy_comp_j_per_device"]))
        assert row["action"] == ("resumed" if cell is crashed else "ran")
        # An ordinary run directory: `testbed run` wrote it, with the cell's config.
        assert (run_dir / "config.yaml").is_file() and (run_dir / "meta.json").is_file()
    # Resumed, not restarted: every device uploaded once per round, never twice.
    with Ledger.open(crashed_dir / "ledger.jsonl") as ledger:
        entries = ledger.entries()
    assert len(entries) == 3 * 4 and len({e.nonce for e in entries}) == 3 * 4
    png = (out / "results.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 10_000

    mtimes = {c.name: (out / "runs" / c.name / "summary.json").stat().st_mtime_ns for c in cells}
    second = _cli(["sweep", str(sweep), "--out", str(out), "--cpus", "2"])
    assert second.returncode == 0, second.stderr
    assert "0 to run, 0 to resume, 4 finished (skipped)" in second.stderr
    assert second.stderr.count(": skipped, finished earlier: completed") == 4
    assert "Ray" not in second.stderr  # nothing to run: Ray is not even started
    assert mtimes == {
        c.name: (out / "runs" / c.name / "summary.json").stat().st_mtime_ns for c in cells
    }
    again = _csv_rows(out / "results.csv")
    assert [r["action"] for r in again] == ["skipped"] * 4
    assert [r["final_accuracy"] for r in again] == [r["final_accuracy"] for r in rows]

    # The same folder with another fixed value: refused, naming the key, nothing touched.
    changed = _write(tmp_path / "tiny-rounds4.yaml", {
        "set": _tiny_set(tiny_idx_dir, rounds=4),
        "grid": {"scheme": ["ldp-fedavg", "channel-dp"], "privacy.epsilon": [2, 8]},
    })
    refused = _cli(["sweep", str(changed), "--out", str(out)])
    assert refused.returncode == 2
    assert "holds a run of another config (rounds: 3 -> 4)" in refused.stderr

    # A failed cell is final unless --retry-failed, which resumes it.
    summary_path = out / "runs" / cells[0].name / "summary.json"
    summary_path.write_text(json.dumps({**json.loads(summary_path.read_text()),
                                        "status": "failed"}))
    plain = _cli(["sweep", str(sweep), "--out", str(out), "--dry-run"])
    retry = _cli(["sweep", str(sweep), "--out", str(out), "--dry-run", "--retry-failed"])
    assert plain.returncode == retry.returncode == 0
    assert plain.stderr.count("would skip") == 4
    assert retry.stderr.count("would skip") == 3
    assert f"({cells[0].label}): would resume" in retry.stderr


def test_a_failing_cell_is_reported_and_the_others_finish(
    tmp_path: Path, tiny_idx_dir: Path
) -> None:
    fixed = _tiny_set(tiny_idx_dir)
    del fixed["data_dir"]
    spec = parse_sweep(
        {"set": fixed, "grid": {"data_dir": [str(tiny_idx_dir), "/nonexistent"]}}, tmp_path
    )
    out = tmp_path / "out"
    lines: list[str] = []
    before = set(_processes())
    result = run_sweep(spec, out, num_cpus=2, log=lines.append)
    _wait_gone(lambda: _new_ray_processes(before))  # Ray shut down; the process goes on
    good, bad = result.rows
    assert good["status"] == "completed" and good["action"] == "ran"
    assert bad["status"] == "failed" and "/nonexistent" in bad["note"]
    assert result.exit_code == 1
    # one line per cell start and end, each with the running count
    starts = [ln for ln in lines if " started: data_dir=" in ln and ln.endswith(" to go")]
    ends = [ln for ln in lines if "): ran: " in ln and ln.endswith(" to go")]
    assert len(starts) == len(ends) == 2, lines
    counts = [tuple(int(w) for w in ln.split("; ")[-1].split()[:6:2]) for ln in starts + ends]
    assert all(sum(c) == 2 for c in counts), lines  # done + running + to go = the cells
    assert ends[-1].endswith("s; 2 done, 0 running, 0 to go"), lines  # with its wall time
    assert len(_csv_rows(out / "results.csv")) == 2
    assert (out / "logs" / f"{cell_name((('data_dir', '/nonexistent'),))}.log").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_stops_cells_cleanly_and_the_next_sweep_resumes(
    tmp_path: Path, tiny_idx_dir: Path, stop: str
) -> None:
    """Ctrl-C in a terminal (SIGINT to the process group) and SIGTERM to the driver alone
    (a job scheduler; ``ray.init`` replaces the driver's SIGTERM handler) both stop cleanly."""
    sweep = _write(tmp_path / "long.yaml", {
        "set": _tiny_set(tiny_idx_dir, rounds=2000),
        "grid": {"privacy.epsilon": [2, 8]},
    })
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "sweep", str(sweep), "--out", str(out), "--cpus", "2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    metrics = [out / "runs" / n / "metrics.jsonl" for n in (
        cell_name((("privacy.epsilon", 2),)), cell_name((("privacy.epsilon", 8),)))]
    while not all(m.exists() and m.stat().st_size > 0 for m in metrics):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.5)
    if stop == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    else:
        os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    _wait_gone(lambda: _nothing_in_session(proc.pid))
    for m in metrics:
        summary = json.loads((m.parent / "summary.json").read_text())
        assert summary["status"] == "interrupted"
        assert 0 < summary["rounds_completed"] < 2000
    dry = _cli(["sweep", str(sweep), "--out", str(out), "--dry-run"])
    assert dry.returncode == 0 and dry.stderr.count(": would resume ->") == 2
