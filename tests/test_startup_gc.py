"""The garbage collector paused from a ``testbed run`` process's start to its first round:
off while it starts, on (start-up objects frozen) from the first round, in training workers
forked meanwhile, and after a command that runs no rounds has parsed its command line."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aggregator.run_rounds as run_rounds
from edge_device.device_worker import Trained
from testbed.cli.main import main
from testbed.core.process import startup_gc
from testbed.parallel_training import TrainingPool


@pytest.fixture
def collector() -> Iterator[None]:
    """Restore the collector as it was (and thaw what a test froze)."""
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    yield
    startup_gc.resume()
    if frozen == 0:
        gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_pause_and_resume(collector: None) -> None:
    gc.enable()
    startup_gc.resume()  # not paused: nothing
    assert gc.isenabled()
    startup_gc.pause()
    assert not gc.isenabled()
    before = gc.get_freeze_count()
    held = [[] for _ in range(1000)]  # made while paused: frozen by resume
    startup_gc.resume()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + len(held)
    gc.disable()
    startup_gc.pause()  # already off: resume leaves it off
    startup_gc.resume()
    assert not gc.isenabled()


def test_run_collects_from_its_first_round(collector: None, tmp_path: Path,
                                           tiny_overrides: list[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    age = run_rounds.process_age_s

    def first_round() -> float | None:
        seen.append(gc.isenabled())
        return age()

    monkeypatch.setattr(run_rounds, "process_age_s", first_round)
    gc.enable()
    startup_gc.pause()
    sets = [a for s in tiny_overrides for a in ("--set", s)]
    assert main(["run", *sets, "--out", str(tmp_path / "run"),
                 "--no-report", "--no-progress"]) == 0
    assert seen == [False]  # paused up to the first round
    assert gc.isenabled()


def test_other_commands_collect_once_parsed(collector: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.cli.cmd_bench as cmd_bench

    seen: list[bool] = []
    monkeypatch.setattr(cmd_bench, "_bench", lambda args: seen.append(gc.isenabled()) or 0)
    gc.enable()
    startup_gc.pause()
    assert main(["bench"]) == 0
    assert seen == [True]  # on while the command runs, not only after it


def _train_reports_collector(trainer: Any, record: Any, device: int, w: np.ndarray,
                             t: int) -> Trained:
    from edge_device.energy_meter import Measurement

    return Trained(device, t, w.astype(np.float64), float(gc.isenabled()), Measurement(), 0.0)


def test_workers_forked_while_paused_collect(collector: None) -> None:
    gc.enable()
    startup_gc.pause()
    with TrainingPool(2, lambda device, record: device, _train_reports_collector) as pool:
        got = list(pool.train(np.zeros(3, dtype=np.float32), 0, [(0, None), (1, None)]))
    assert [g.train_loss for g in got] == [1.0, 1.0]
