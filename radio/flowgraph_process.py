"""Start, watch and stop a GNU Radio flowgraph as its own process.

Flowgraphs import GNU Radio, which exists only for Debian's ``/usr/bin/python3``; the
testbed runs in a virtual environment and therefore never imports it. A
:class:`FlowgraphProcess` runs a flowgraph script under the system interpreter, waits until
its XML-RPC control server answers (or reports why it did not come up), lets the caller
check it is still alive, and stops it cleanly (SIGTERM, then SIGKILL after a grace period).
The script gets ``--parent-pid`` and exits on its own if this process disappears, so no
orphan survives a crash of the testbed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
import xmlrpc.client
from pathlib import Path

#: The interpreter that can import GNU Radio and UHD (Debian packages).
SYSTEM_PYTHON = "/usr/bin/python3"

#: The repository's flowgraph folder.
FLOWGRAPH_DIR = Path(__file__).resolve().parents[1] / "flowgraphs"


class FlowgraphError(RuntimeError):
    """A flowgraph process failed to start, died, or could not be controlled."""


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gnuradio_available(python: str = SYSTEM_PYTHON) -> tuple[bool, str]:
    """Whether ``python`` can import GNU Radio; returns (ok, version or reason)."""
    if not Path(python).exists():
        return False, f"{python} does not exist"
    try:
        out = subprocess.run(
            [python, "-c", "from gnuradio import gr, channels, zeromq; print(gr.version())"],
            capture_output=True, text=True, timeout=60, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{python} could not run: {exc}"
    if out.returncode != 0:
        return False, f"{python} cannot import gnuradio: {out.stderr.strip().splitlines()[-1:]}"
    return True, out.stdout.strip()


def _terminate(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


class FlowgraphProcess:
    """One flowgraph script running under the system interpreter.

    Parameters
    ----------
    script
        Path of the flowgraph's Python file.
    args
        Command-line arguments of the script (``--xmlrpc-port`` is added).
    python
        Interpreter that can import GNU Radio.
    startup_timeout_s
        How long to wait for the XML-RPC server to answer.
    """

    def __init__(
        self,
        script: Path,
        args: list[str],
        *,
        python: str = SYSTEM_PYTHON,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.script = Path(script)
        if not self.script.is_file():
            raise FlowgraphError(f"flowgraph script '{self.script}' does not exist")
        if not Path(python).exists():
            raise FlowgraphError(
                f"interpreter '{python}' does not exist; GNU Radio flowgraphs need Debian's "
                "python3 with the gnuradio package"
            )
        self.port = free_tcp_port()
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the process
            prefix=f"{self.script.stem}-", suffix=".log", delete=False
        )
        cmd = [python, "-u", str(self.script), *args, "--xmlrpc-port", str(self.port),
               "--parent-pid", str(os.getpid())]
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._finalizer = weakref.finalize(self, _terminate, self.proc, 5.0)
        self.control = xmlrpc.client.ServerProxy(f"http://127.0.0.1:{self.port}", allow_none=True)
        self._wait_ready(startup_timeout_s)

    def log_tail(self, n_lines: int = 15) -> str:
        """The last lines of the process's output."""
        try:
            lines = Path(self._log.name).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n_lines:])

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise FlowgraphError(
                    f"flowgraph {self.script.name} exited with code {self.proc.returncode} "
                    f"during start-up:\n{self.log_tail()}"
                )
            try:
                self.control.ping()
                return
            except (OSError, xmlrpc.client.Error):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise FlowgraphError(
                    f"flowgraph {self.script.name} did not answer on XML-RPC port {self.port} "
                    f"within {timeout_s:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        """Process id of the flowgraph."""
        return int(self.proc.pid)

    def check_alive(self) -> None:
        """Raise :class:`FlowgraphError` if the process has exited."""
        if self.proc.poll() is not None:
            raise FlowgraphError(
                f"flowgraph {self.script.name} (pid {self.proc.pid}) died with code "
                f"{self.proc.returncode}:\n{self.log_tail()}"
            )

    def call(self, method: str, *args: object) -> object:
        """Call a control method (a get/set pair of the flowgraph) over XML-RPC."""
        self.check_alive()
        try:
            return getattr(self.control, method)(*args)
        except (OSError, xmlrpc.client.Error) as exc:
            self.check_alive()
            raise FlowgraphError(f"flowgraph {self.script.name}: {method} failed: {exc}") from exc

    def call_float(self, method: str, *args: object) -> float:
        """:meth:`call` for a method that returns a number."""
        value = self.call(method, *args)
        if not isinstance(value, int | float):
            raise FlowgraphError(f"flowgraph {self.script.name}: {method} returned {value!r}")
        return float(value)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the flowgraph (SIGTERM, SIGKILL after ``grace_s``). Idempotent."""
        _terminate(self.proc, grace_s)
        self._finalizer.detach()
        try:
            Path(self._log.name).unlink(missing_ok=True)
            self._log.close()
        except OSError:
            pass


def build_flowgraph(script: Path, args: list[str], python: str = SYSTEM_PYTHON) -> str:
    """Construct a flowgraph without starting it (``--build-only``); returns its output.

    Raises
    ------
    FlowgraphError
        If construction fails (the message carries the flowgraph's error output).
    """
    try:
        out = subprocess.run(
            [python, str(script), *args, "--build-only"],
            capture_output=True, text=True, timeout=120, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FlowgraphError(f"could not run {script.name}: {exc}") from exc
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-15:])
        raise FlowgraphError(f"flowgraph {script.name} failed to build:\n{tail}")
    return out.stdout.strip()
