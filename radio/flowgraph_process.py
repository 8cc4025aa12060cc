"""Start, watch and stop a GNU Radio flowgraph as its own process.

Flowgraphs import GNU Radio, which exists only for Debian's ``/usr/bin/python3``; the
testbed runs in a virtual environment and therefore never imports it. A
:class:`FlowgraphProcess` runs a flowgraph script under the system interpreter, waits until
its XML-RPC control server answers (or reports why it did not come up), lets the caller
check it is still alive, and stops it cleanly (SIGTERM, then SIGKILL after a grace period).
The script gets ``--parent-pid`` and exits on its own if this process disappears, so no
orphan survives a crash of the testbed. Its output goes to ``<log_dir>/<name>.log`` (kept,
e.g. in the run directory) or to an anonymous temporary file (never left behind). Every
failure is a :class:`FlowgraphError`, a :class:`~radio.link.LinkFailed`, whose message names
the flowgraph, its exit code and the last lines of its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
import xmlrpc.client
from pathlib import Path
from typing import BinaryIO

from radio.link import LinkFailed

#: The interpreter that can import GNU Radio and UHD (Debian packages).
SYSTEM_PYTHON = "/usr/bin/python3"

#: The repository's flowgraph folder.
FLOWGRAPH_DIR = Path(__file__).resolve().parents[1] / "flowgraphs"


class FlowgraphError(LinkFailed):
    """A flowgraph process failed to start or build, died, or could not be controlled.

    A :class:`~radio.link.LinkFailed`: a link whose flowgraph is gone carries nothing more.
    """


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
    """SIGTERM, then SIGKILL after ``grace_s``; the process is reaped either way.

    A second interrupt (Ctrl-C) arriving while waiting still ends in SIGKILL.
    """
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=grace_s)


def _cleanup(proc: subprocess.Popen[bytes], log: BinaryIO, grace_s: float) -> None:
    """Finalizer of a :class:`FlowgraphProcess` that was never stopped (no ``self``)."""
    try:
        _terminate(proc, grace_s)
    finally:
        log.close()


def describe_exit(returncode: int) -> str:
    """``"code 1"`` or ``"code -9 (killed by SIGKILL)"`` for a process's return code."""
    if returncode >= 0:
        return f"code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"code {returncode} (killed by {name})"


def _read_tail(log: BinaryIO, n_lines: int, max_bytes: int = 65536) -> str:
    """The last ``n_lines`` of an open log, read without moving its shared file offset."""
    fd = log.fileno()
    size = os.fstat(fd).st_size
    start = max(0, size - max_bytes)
    data = os.pread(fd, size - start, start)
    return "\n".join(data.decode(errors="replace").splitlines()[-n_lines:])


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
    log_dir
        Folder for the flowgraph's output (``<script stem>.log``, appended to, kept after
        the process ends; e.g. a run directory). ``None``: an anonymous temporary file that
        never appears in the file system's namespace after creation and is gone when the
        process is stopped (or this process exits, however it exits).

    Raises
    ------
    FlowgraphError
        (a :class:`~radio.link.LinkFailed`) when the script or the interpreter is missing,
        the process exits during start-up, or it does not answer in time; the message names
        the flowgraph, its exit code and the tail of its log. The process is stopped and a
        temporary log removed before the error propagates (also on ``KeyboardInterrupt``).
    """

    def __init__(
        self,
        script: Path,
        args: list[str],
        *,
        python: str = SYSTEM_PYTHON,
        startup_timeout_s: float = 60.0,
        log_dir: Path | None = None,
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
        cmd = [python, "-u", str(self.script), *args, "--xmlrpc-port", str(self.port),
               "--parent-pid", str(os.getpid())]
        self.log_path: Path | None = None
        self._tail_at_stop = ""
        if log_dir is not None:
            log_dir = Path(log_dir)
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                self.log_path = log_dir / f"{self.script.stem}.log"
                self._log: BinaryIO = open(self.log_path, "a+b")  # noqa: SIM115 - process-long
            except OSError as exc:
                raise FlowgraphError(
                    f"flowgraph {self.script.name}: cannot write its log in '{log_dir}': {exc}"
                ) from exc
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            self._log.write(f"# {stamp} started: {' '.join(cmd)}\n".encode())
            self._log.flush()
        else:
            # Anonymous (already unlinked) file: nothing can be left behind in /tmp, not
            # even when this process is killed with SIGKILL.
            self._log = tempfile.TemporaryFile(prefix=f"{self.script.stem}-", suffix=".log")  # noqa: SIM115
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise FlowgraphError(
                f"flowgraph {self.script.name}: could not run {python}: {exc}"
            ) from exc
        self._finalizer = weakref.finalize(self, _cleanup, self.proc, self._log, 5.0)
        self.control = xmlrpc.client.ServerProxy(f"http://127.0.0.1:{self.port}", allow_none=True)
        # One call at a time: a ServerProxy's connection is not shared between threads (a
        # receiver reads a round's windows from a thread while the caller asks the time).
        self._control_lock = threading.Lock()
        try:
            self._wait_ready(startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def name(self) -> str:
        """The flowgraph's script name (``channel_emulator.py``)."""
        return self.script.name

    def log_tail(self, n_lines: int = 15) -> str:
        """The last lines of the process's output (also after :meth:`stop`)."""
        if self._log.closed:
            return self._tail_at_stop
        try:
            return _read_tail(self._log, n_lines)
        except (OSError, ValueError):
            return ""

    def _log_excerpt(self) -> str:
        where = f" ({self.log_path})" if self.log_path is not None else ""
        tail = self.log_tail()
        if not tail.strip():
            return f"its log{where} is empty"
        return f"last lines of its log{where}:\n{tail}"

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise FlowgraphError(
                    f"flowgraph {self.name} (pid {self.proc.pid}) exited with "
                    f"{describe_exit(self.proc.returncode)} during start-up; "
                    f"{self._log_excerpt()}"
                )
            try:
                self.control.ping()
                return
            except (OSError, xmlrpc.client.Error):
                pass
            if time.monotonic() > deadline:
                raise FlowgraphError(
                    f"flowgraph {self.name} (pid {self.proc.pid}) did not answer on XML-RPC "
                    f"port {self.port} within {timeout_s:.0f} s; {self._log_excerpt()}"
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
                f"flowgraph {self.name} (pid {self.proc.pid}) died with "
                f"{describe_exit(self.proc.returncode)}; {self._log_excerpt()}"
            )

    def call(self, method: str, *args: object) -> object:
        """Call a control method (a get/set pair of the flowgraph) over XML-RPC."""
        self.check_alive()
        try:
            with self._control_lock:
                return getattr(self.control, method)(*args)
        except (OSError, xmlrpc.client.Error) as exc:
            self.check_alive()
            raise FlowgraphError(
                f"flowgraph {self.name} (pid {self.proc.pid}): control call {method} failed: "
                f"{exc}"
            ) from exc

    def call_float(self, method: str, *args: object) -> float:
        """:meth:`call` for a method that returns a number."""
        value = self.call(method, *args)
        if not isinstance(value, int | float):
            raise FlowgraphError(f"flowgraph {self.name}: {method} returned {value!r}")
        return float(value)

    def call_int(self, method: str, *args: object) -> int:
        """:meth:`call` for a method that returns an integer."""
        value = self.call(method, *args)
        if isinstance(value, bool) or not isinstance(value, int):
            raise FlowgraphError(f"flowgraph {self.name}: {method} returned {value!r}")
        return value

    def call_list(self, method: str, *args: object) -> list[object]:
        """:meth:`call` for a method that returns a list (an XML-RPC array)."""
        value = self.call(method, *args)
        if not isinstance(value, list):
            raise FlowgraphError(f"flowgraph {self.name}: {method} returned {value!r}")
        return value

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the flowgraph (SIGTERM, SIGKILL after ``grace_s``) and close its log.

        Idempotent. A temporary log disappears here; a log in ``log_dir`` is kept.
        """
        try:
            _terminate(self.proc, grace_s)
        finally:
            self._finalizer.detach()
            if not self._log.closed:
                self._tail_at_stop = self.log_tail()
                self._log.close()


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
