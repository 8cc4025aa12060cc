"""SIGINT / SIGTERM while ``testbed`` starts up (issue 21, item 11).

Before the run installs its own handling (imports, parsing, config, data loading), SIGINT
gave a ``KeyboardInterrupt`` traceback and exit -2, SIGTERM a silent death (-15). Both now
end with one line on stderr and exit 130, as an interrupted run does. The process is held
at a known place with ``TESTBED_PAUSE`` (testbed/core/runs/faults.py) before it is signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _interrupt_at(point: str, sig: int, args: list[str]) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", *args], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "TESTBED_PAUSE": point},
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # blocks until the pause point says so (or the pipe ends)
            seen.append(line)
            if line.strip() == f"paused at {point}":
                break
        else:
            raise AssertionError(f"never paused at {point}: {''.join(seen)}")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_cli_startup_is_one_line_and_130(sig: int, tmp_path: Path) -> None:
    rc, err = _interrupt_at("cli_startup", sig, ["run", "--out", str(tmp_path / "run")])
    assert rc == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines() == ["testbed: interrupted (SIGINT/SIGTERM); stopped"], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_before_the_run_is_set_up_is_one_line_and_130(
    sig: int, tmp_path: Path, tiny_overrides: list[str]
) -> None:
    args = ["run", "--no-progress", "--out", str(tmp_path / "run")]
    for o in tiny_overrides:
        args += ["--set", o]
    rc, err = _interrupt_at("run_setup", sig, args)
    assert rc == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == [
        "interrupted before the first round; nothing went on air"
    ], err
    assert not (tmp_path / "run").exists()
