"""The ``testbed`` process ends without the interpreter's teardown only when the command
allowed it and nothing else runs (testbed/cli/quick_exit.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import quick_exit

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = """
import atexit, sys, threading, time
from testbed.cli import quick_exit

class Teardown:  # prints when the interpreter tears its modules down
    def __del__(self):
        sys.stdout.write("teardown\\n"); sys.stdout.flush()

KEEP = Teardown()
atexit.register(lambda: print("atexit ran", flush=True))
print("buffered line", end="")  # no newline, no flush: finish must flush it
if "allow" in sys.argv:
    quick_exit.allow()
if "thread" in sys.argv:
    threading.Thread(target=time.sleep, args=(0.5,)).start()
quick_exit.finish(3)
"""


def _run(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _SCRIPT, *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def test_an_allowed_command_skips_only_the_teardown() -> None:
    out = _run("allow")
    assert out.returncode == 3
    assert "buffered line" in out.stdout and "atexit ran" in out.stdout
    assert "teardown" not in out.stdout


@pytest.mark.parametrize("flags", [(), ("allow", "thread")])
def test_otherwise_the_process_ends_the_ordinary_way(flags: tuple[str, ...]) -> None:
    out = _run(*flags)
    assert out.returncode == 3
    assert "buffered line" in out.stdout and "atexit ran" in out.stdout
    assert "teardown" in out.stdout


def test_without_allow_finish_is_sys_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    # (a run called in-process, main([...]), may have allowed it: main never calls finish)
    monkeypatch.setattr(quick_exit, "_allowed", False)
    assert not quick_exit.allowed()
    with pytest.raises(SystemExit) as exc:
        quick_exit.finish(4)
    assert exc.value.code == 4
