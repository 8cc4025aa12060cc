"""Output a person can follow: the per-round progress lines of a run (off a terminal), the
lab aggregator's join and leave log lines, the launcher's relay and outcome line, and the
sweep's per-cell lines."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aggregator.lab.control_plane import ControlPlane
from aggregator.run_rounds import format_duration, progress_line
from testbed.cli.main import main
from testbed.core.transport.protocol import encode
from testbed.lab.launch import LogRelay, outcome_note
from testbed.sweep.progress import CellCount, cell_end_line, cell_start_line

REPO = Path(__file__).resolve().parents[1]


# --- the formatter -------------------------------------------------------------------------


def test_progress_line_with_accuracy_and_epsilon() -> None:
    line = progress_line(3, 40, 0.51234, elapsed_s=12.34, remaining_s=160.0,
                         test_accuracy=0.81234, subset_accuracy=0.8,
                         epsilon_max=1.23456, epsilon_unit="record", accountant="pld")
    assert line == ("round 2 (3/40): train loss 0.5123, test accuracy 0.8123, max epsilon 1.23 "
                    "(record, pld), 12.3 s elapsed, about 2 min 40 s to go")


def test_progress_line_without_accuracy_or_privacy() -> None:
    line = progress_line(1, 40, 2.0, elapsed_s=0.5, remaining_s=3725.0)
    assert line == "round 0 (1/40): train loss 2, 0.5 s elapsed, about 1 h 02 min to go"
    # the evaluation subset stands in when the full test set was not evaluated
    line = progress_line(40, 40, 0.3, elapsed_s=61.0, subset_accuracy=0.75)
    assert line == "round 39 (40/40): train loss 0.3, subset accuracy 0.7500, 1 min 01 s elapsed"


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.04, 59.94, 60, 3599.4, 3600, float("nan"))] == [
        "0.0 s", "59.9 s", "1 min 00 s", "59 min 59 s", "1 h 00 min", "?"]


# --- testbed run: one line per round off a terminal, none with --no-progress --------------


def _round_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("round ")]


def test_run_off_a_terminal_prints_one_line_per_round(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    args = [sys.executable, "-m", "testbed", "run", "--no-report", "--out", str(tmp_path / "r")]
    for o in [*tiny_overrides, "scheme=ldp-fedavg", "privacy.epsilon=8", "eval_every=2"]:
        args += ["--set", o]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = _round_lines(done.stderr)
    assert [ln.split(":")[0] for ln in lines] == ["round 0 (1/3)", "round 1 (2/3)", "round 2 (3/3)"]
    assert "test accuracy" not in lines[0] and "test accuracy" in lines[1]
    assert all("max epsilon" in ln and "(record, pld)" in ln and "elapsed" in ln
               for ln in lines)
    assert "to go" in lines[0] and "to go" not in lines[2]
    # the last line's epsilon is the outcome line's
    eps = lines[2].split("max epsilon ")[1].split(" ")[0]
    assert f"max epsilon {eps} (record, pld)" in done.stdout
    assert not _round_lines(done.stdout)


def test_no_progress_prints_no_line_and_progress_every_thins_them(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [a for o in [*tiny_overrides, "scheme=fedavg"] for a in ("--set", o)]
    assert main(["run", "--no-report", "--no-progress", "--out", str(tmp_path / "a"),
                 *sets]) == 0
    out = capsys.readouterr()
    assert not _round_lines(out.err + out.out)
    assert main(["run", "--no-report", "--out", str(tmp_path / "b"), *sets,
                 "--set", "progress_every=2"]) == 0
    lines = _round_lines(capsys.readouterr().err)
    # every 2nd round, and the last whatever the count; no epsilon without privacy
    assert [ln.split(":")[0] for ln in lines] == ["round 1 (2/3)", "round 2 (3/3)"]
    assert "epsilon" not in lines[0]
    # output only: not in the run's config.yaml (nor its pin), so a resume is not refused
    assert "progress_every" not in (tmp_path / "b" / "config.yaml").read_text()


# --- the lab aggregator: who joined, all joined once, who left ----------------------------


class _FakeServer:
    """Stands in for the CurveZMQ ROUTER: hands out queued messages, keeps what is sent."""

    def __init__(self) -> None:
        self.inbox: list[tuple[bytes, int, list[bytes]]] = []
        self.sent: list[tuple[bytes, list[bytes]]] = []

    def recv(self, timeout_s: float) -> tuple[bytes, int, list[bytes]] | None:
        return self.inbox.pop(0) if self.inbox else None

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        self.sent.append((identity, frames))


def _join(server: _FakeServer, device: int, instance: str) -> None:
    ident = f"edge-{device}".encode()
    server.inbox.append((ident, device, encode("hello", {"device": device,
                                                         "instance": instance})))
    server.inbox.append((ident, device, encode("ready", {
        "device": device, "instance": instance, "dataset_size": 100 + device, "nonces": []})))


def test_control_plane_logs_joins_all_joined_once_and_departures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from testbed.core.runs.interrupts import StopSignals

    server = _FakeServer()
    welcome = {"run_id": "r", "config_yaml": "", "mask_secret": "s", "radios": ""}
    plane = ControlPlane(server, 2, welcome, 0)  # type: ignore[arg-type]
    for i in (1, 0):
        _join(server, i, f"i{i}")
    caplog.set_level(logging.INFO, logger="testbed.aggregator")
    with StopSignals() as stop:
        plane.wait_all_ready(5.0, stop)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [
        "device 1 connected (instance i1)",
        "device 1 joined (101 samples); 1/2 devices joined",
        "device 0 connected (instance i0)",
        "device 0 joined (100 samples); 2/2 devices joined",
        "all 2 devices joined",
    ]
    caplog.clear()
    ident = b"edge-0"
    server.inbox.append((ident, 0, encode("leave", {"device": 0, "reason": "budget spent"})))
    plane.poll(0)
    _join(server, 0, "i0b")  # a new process of device 0 comes back
    plane.poll(0)
    plane.poll(0)
    _join(server, 1, "i1b")  # device 1 restarted without saying goodbye: it dropped out
    plane.poll(0)
    with StopSignals() as stop:
        plane.wait_all_ready(5.0, stop)  # all joined already: not said again
    assert [r.getMessage() for r in caplog.records] == [
        "device 0 left: budget spent; 1/2 devices ready",
        "device 0 connected (instance i0b)",
        "device 0 rejoined (100 samples); 2/2 devices ready",
        "device 1 dropped out: a new process (instance i1b) replaces instance i1; "
        "1/2 devices ready",
        "device 1 connected (instance i1b)",
        "device 1 rejoined (101 samples); 2/2 devices ready",
    ]


# --- testbed launch: relayed lines and the outcome line ----------------------------------


def test_launch_relays_progress_and_join_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "aggregator.log"
    relay = LogRelay(log, "aggregator: ")
    relay.poll()  # no log yet
    log.write_text("2026-01-01 10:00:00,000 testbed.aggregator: device 2 joined (5 samples); "
                   "1/2 devices joined\n2026-01-01 10:00:01,000 testbed.aggregator: round 0 (1/")
    relay.poll()
    with log.open("a") as fh:
        fh.write("3): train loss 1, 0.1 s elapsed\nsomething else\n"
                 "2026-01-01 10:00:02,000 testbed.aggregator: all 2 devices joined\n")
    relay.poll()
    relay.poll()
    assert capsys.readouterr().err.splitlines() == [
        "aggregator: device 2 joined (5 samples); 1/2 devices joined",
        "aggregator: round 0 (1/3): train loss 1, 0.1 s elapsed",
        "aggregator: all 2 devices joined",
    ]


def test_launch_outcome_note_reads_the_summary_or_says_it_is_missing(tmp_path: Path) -> None:
    missing = outcome_note(tmp_path, 2)
    assert missing == (f"no run outcome: {tmp_path / 'summary.json'} is missing (the "
                       "aggregator exited with code 2 before writing it)")
    summary: dict[str, Any] = {
        "status": "completed", "rounds_completed": 2, "rounds_planned": 2,
        "final_accuracy": 0.5, "privacy": {"devices": []}, "wall_time_s": 1.0, "reason": "",
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert outcome_note(tmp_path, 0) == (
        f"run completed: 2/2 rounds, final test accuracy 0.5000, 1.0 s -> {tmp_path}")


# --- sweep: one line per cell start and end, with the running count ----------------------


def test_sweep_cell_lines_count_done_running_and_to_go() -> None:
    count = CellCount(8, done=2)
    count.running |= {"a", "b"}
    assert cell_start_line(3, count, "lr=0.1, seed=1", "run") == (
        "cell 3/8 started: lr=0.1, seed=1 (run); 2 done, 2 running, 4 to go")
    count.running.discard("a")
    count.done += 1
    row = {"status": "completed", "final_accuracy": 0.81, "epsilon_max": None, "note": ""}
    assert cell_end_line(3, count, "lr=0.1, seed=1", "ran", row, 12.34) == (
        "cell 3/8 (lr=0.1, seed=1): ran: completed, accuracy 0.8100, 12.3 s; "
        "3 done, 1 running, 4 to go")
