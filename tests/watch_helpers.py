"""Helpers of the TensorBoard tests: read a run's event files back and scan them for what
must not be there; start ``testbed watch`` and read what a real headless Chromium (Debian's
``chromium``) sees of TensorBoard's page.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages ending in NUL on file descriptors 3 and 4), so nothing beyond the standard
library is needed. The page is TensorBoard's own: the test waits until its web app has
rendered, reads the text it shows, and asks TensorBoard's data API from inside the page (the
same requests its dashboards make) for the runs, the scalar series and their points, and
the HParams session groups.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Every tag a run's event files may hold (anything else fails :func:`scan_events`).
ALLOWED_TAGS = re.compile(
    r"^(accuracy/(test|subset)|loss/(train|test|subset)"
    r"|epsilon/(device_\d+|max|target)"
    r"|snr_db/(device_\d+(_budget)?|min|mean)|n0(_off_frame|_lower)?/device_\d+"
    r"|uploads/(received|lost|late|refused)|uploads_cause/(lost|late|refused)_[a-z_]+"
    r"|energy_j/(device_\d+|round|total)|round_time_s/[a-z_]+"
    r"|air/budget_snr_db/[\w.-]+|air/burst_timeline|radio/received_constellation"
    r"|final/(accuracy|epsilon_max|energy_j|rounds)|tensorboard/(writing_s|run_wall_s)"
    r"|settings|trust|outcome|custom_scalars__config__"
    r"|hparams/(accuracy|epsilon_max|energy_j)|_hparams_/(session_start_info|experiment))$"
)
#: Tags that may hold a string tensor (markdown texts, the layout, HParams' own data).
STRING_TAGS = frozenset({"settings", "trust", "outcome", "custom_scalars__config__",
                         "_hparams_/session_start_info", "_hparams_/experiment"})
#: Tags that may hold an image.
IMAGE_TAGS = frozenset({"air/burst_timeline", "radio/received_constellation"})
#: Seconds TensorBoard may take to print its address (imports on a loaded 2-core machine).
WATCH_START_S = 120.0
#: Seconds one DevTools command may take.
CDP_TIMEOUT_S = 120.0


def read_events(folder: Path) -> list[Any]:
    """Every event under ``folder`` as written (no conversion by TensorBoard's loader)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    out: list[Any] = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        out.extend(event_pb2.Event.FromString(raw)
                   for raw in RawEventFileLoader(str(path)).Load())
    return out


def scan_events(folder: Path, secrets: list[str]) -> tuple[list[float], dict[str, int]]:
    """Check every value of every event under ``folder``: its tag is one of
    :data:`ALLOWED_TAGS`; a number is a single float, an image a PNG under an image tag, a
    tensor only strings under a text tag, and no string holds any of ``secrets``. Returns
    the numbers and the images counted by tag."""
    numbers: list[float] = []
    images: dict[str, int] = {}
    for event in read_events(folder):
        for value in event.summary.value:
            assert ALLOWED_TAGS.match(value.tag), f"unexpected tag {value.tag!r}"
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                numbers.append(value.simple_value)
            elif kind == "image":
                assert value.tag in IMAGE_TAGS, value.tag
                assert value.image.encoded_image_string.startswith(b"\x89PNG")
                images[value.tag] = images.get(value.tag, 0) + 1
            else:
                assert kind == "tensor" and value.tag in STRING_TAGS, (value.tag, kind)
                tensor = value.tensor
                assert not (tensor.float_val or tensor.double_val or tensor.tensor_content
                            or tensor.int_val or tensor.int64_val), value.tag
                for raw in tensor.string_val:
                    text = raw.decode(errors="replace")
                    for secret in secrets:
                        assert secret not in text, f"a secret in {value.tag!r}"
    return numbers, images


def chromium_path() -> str | None:
    """Debian's ``chromium`` (or ``chromium-browser``), ``None`` when absent."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Watch:
    """``testbed watch DIR --port P`` as a child process (stopped with SIGINT on exit)."""

    def __init__(self, folder: Path, port: int | None = None, *extra: str) -> None:
        self.port = port or free_port()
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "testbed", "watch", str(folder), "--port", str(self.port),
             *extra],
            cwd=REPO, stdout=self.out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
        self.url = self._wait_address()

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def _wait_address(self) -> str:
        deadline = time.monotonic() + WATCH_START_S
        while time.monotonic() < deadline:
            m = re.search(r" at (http://\S+) \(Ctrl-C", self.output())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"testbed watch exited {self.proc.returncode}: "
                                     f"{self.output()}")
            time.sleep(0.3)
        self.close()
        raise AssertionError(f"testbed watch printed no address: {self.output()}")

    def close(self) -> int | None:
        """Stop it with SIGINT (Ctrl-C); its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        return self.proc.returncode

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Chromium:
    """A headless Chromium driven over the DevTools pipe; :meth:`open` one page."""

    def __init__(self) -> None:
        path = chromium_path()
        assert path is not None
        self.profile = tempfile.TemporaryDirectory(prefix="watch-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # the protocol's descriptors: 3 read by Chromium, 4 written
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [path, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(3, 4),
            preexec_fn=fds, start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        """One DevTools command; its result (events in between are skipped)."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + CDP_TIMEOUT_S
        while True:
            while b"\0" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                    raise AssertionError(f"chromium: no answer to {method}")
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise AssertionError(f"chromium exited during {method}")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise AssertionError(f"chromium: {method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def open(self, url: str) -> None:
        """Open ``url`` in a new tab and wait for TensorBoard's web app to render."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=self.session)
        self.send("Page.navigate", {"url": url}, session=self.session)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.eval("document.readyState === 'complete' && "
                         "!!document.querySelector('tb-webapp')"):
                return
            time.sleep(0.3)
        raise AssertionError(f"TensorBoard's page did not load at {url}")

    def eval(self, expression: str) -> Any:
        """``expression`` evaluated in the page (promises awaited), by value."""
        result = self.send("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True,
        }, session=self.session)
        if "exceptionDetails" in result:
            raise AssertionError(f"page: {result['exceptionDetails']}")
        return result["result"].get("value")

    def page_text(self, needles: list[str], wait_s: float = 120.0) -> str:
        """The text the page shows (shadow roots included), once it holds every one of
        ``needles`` or after ``wait_s``."""
        script = """(() => {
          const parts = [];
          const walk = (node) => {
            if (node.shadowRoot) walk(node.shadowRoot);
            for (const child of node.childNodes) {
              if (child.nodeType === 3) parts.push(child.textContent);
              else if (!['STYLE', 'SCRIPT', 'NOSCRIPT'].includes(child.nodeName)) walk(child);
            }
          };
          walk(document.body);
          return parts.join(' ');
        })()"""
        deadline = time.monotonic() + wait_s
        text = ""
        while time.monotonic() < deadline:
            text = str(self.eval(script))
            if all(n in text for n in needles):
                break
            time.sleep(0.5)
        return text

    def scalar_points(self, prefixes: list[str]) -> dict[str, int]:
        """``{"run|tag": points}`` of every scalar series whose tag starts with one of
        ``prefixes``, from TensorBoard's data API inside the page."""
        script = """(async (prefixes) => {
          const tags = await (await fetch('data/plugin/scalars/tags')).json();
          const out = {};
          for (const [run, byTag] of Object.entries(tags)) {
            for (const tag of Object.keys(byTag)) {
              if (!prefixes.some((p) => tag.startsWith(p))) continue;
              const q = 'run=' + encodeURIComponent(run) + '&tag=' + encodeURIComponent(tag);
              const points = await (await fetch('data/plugin/scalars/scalars?' + q)).json();
              out[run + '|' + tag] = points.length;
            }
          }
          return out;
        })(PREFIXES)""".replace("PREFIXES", json.dumps(prefixes))
        return dict(self.eval(script))

    def hparams_groups(self) -> list[dict[str, Any]]:
        """The HParams view's session groups (name, hparams, metric values)."""
        script = """(async () => {
          const post = async (path, body) => (await fetch(path, {method: 'POST',
            headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)})).json();
          const experiment = await post('data/plugin/hparams/experiment',
                                        {experimentName: ''});
          const groups = await post('data/plugin/hparams/session_groups', {
            experimentName: '', allowedStatuses: ['STATUS_UNKNOWN', 'STATUS_SUCCESS',
              'STATUS_FAILURE', 'STATUS_RUNNING'],
            colParams: [], startIndex: 0, sliceSize: 100});
          return {experiment, groups: groups.sessionGroups || []};
        })()"""
        return list(self.eval(script)["groups"])

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except AssertionError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self.profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
