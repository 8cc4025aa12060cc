"""A virtual air of its own for a single-process ``usrp`` link on virtual radios.

``testbed run --hw hw_configs/virtual_lab.yaml`` and ``testbed radio loopback --hw ...`` run
the ``usrp`` link's transmitter (``usrp.tx_args``) and receiver (``usrp.rx_args``) in one
process; on virtual devices something must carry the bursts between them. :class:`PrivateAir`
starts ``testbed air`` on two free loopback ports for that link alone (the config's own
addresses are left to lab runs, whose air ``testbed launch`` or the lab starts) and stops it
with the link. It dies with the process that started it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.safe_yaml import dump_yaml_text
from testbed.core.process.child_process import die_with_parent

#: Seconds the air may take to print its start line (imports on a loaded machine).
START_TIMEOUT_S = 120.0


def with_loopback_air(hw: HardwareConfig) -> HardwareConfig:
    """``hw`` with its virtual air on two free loopback ports (burst and stream)."""
    from radio.flowgraph_process import free_tcp_port

    burst, stream = free_tcp_port(), free_tcp_port()
    while stream == burst:
        stream = free_tcp_port()
    air = hw.virtual_air.model_copy(update={
        "burst_address": f"tcp://127.0.0.1:{burst}",
        "stream_address": f"tcp://127.0.0.1:{stream}",
    })
    return hw.model_copy(update={"virtual_air": air})


class PrivateAir:
    """``testbed air`` for one single-process link.

    Parameters
    ----------
    hw
        A virtual hardware config (:attr:`~testbed.core.config.hardware.HardwareConfig.virtual`).
    log_dir
        Where ``air.log`` and the burst log ``air/air.jsonl`` go (``None``: a temporary
        folder, removed on :meth:`close`).
    own_ports
        Put the air on two free loopback ports (a single-process link); ``False``: on the
        config's ``virtual_air`` addresses, where separately started edges find it (the
        emulation fallback's ``testbed aggregator``).

    Attributes
    ----------
    hw
        ``hw`` with the air's two loopback addresses.

    Raises
    ------
    RuntimeError
        The air exited or printed nothing within :data:`START_TIMEOUT_S`; its log is quoted.
    """

    def __init__(self, hw: HardwareConfig, log_dir: Path | None = None, *,
                 own_ports: bool = True) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="testbed-air-")
        folder = Path(self._tmp.name) if log_dir is None else Path(log_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.hw = with_loopback_air(hw) if own_ports else hw
        config = Path(self._tmp.name) / "hw.yaml"
        config.write_text(dump_yaml_text(self.hw.model_dump(mode="json")))
        self.log_path = folder / "air.log"
        with open(self.log_path, "ab") as log:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "testbed", "air", "--hw", str(config), "--log-dir",
                 str(folder / "air"), "--parent-pid", str(os.getpid())],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        try:
            self._wait_started()
        except BaseException:
            self.close()
            raise

    def _wait_started(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"air: bursts at" not in self.log_path.read_bytes():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the virtual air exited (code {self.proc.returncode}): "
                                   f"{self.log_path.read_text(errors='replace')[-600:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the virtual air did not start within "
                                   f"{START_TIMEOUT_S:g} s (log {self.log_path})")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the air (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._tmp.cleanup()
