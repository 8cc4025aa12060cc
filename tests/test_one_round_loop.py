"""The aggregator's round is written once and both ways of running use it.

``testbed run`` (devices in this process) and the lab aggregator (``testbed aggregator``,
``testbed launch``: devices over the control plane) build the same
:class:`aggregator.round_loop.RoundLoop` and differ only in its devices; nothing overrides
the round. ``tests/test_lab_deploy.py::test_launch_equals_in_process_run`` runs one config
both ways and gets the same model.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from aggregator.devices import Devices
from aggregator.lab.control_plane import ControlPlane, Peer
from aggregator.lab.remote_devices import RemoteDevices
from aggregator.lab.server import lab_loop
from aggregator.round_loop import RoundLoop
from aggregator.run_rounds import run_rounds
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.runs.run_metadata import write_metadata
from testbed.core.runs.rundir import RunDir
from testbed.core.transport.protocol import decode
from testbed.local_devices import LocalDevices
from testbed.runner import local_loop

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("aggregator", "edge_device", "testbed")


def _functions_named(name: str) -> list[str]:
    found = []
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                        node.name == name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _subclasses_of(name: str) -> list[str]:
    found = []
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                        getattr(b, "id", getattr(b, "attr", None)) == name for b in node.bases):
                    found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_the_round_is_written_once_and_never_overridden() -> None:
    assert _functions_named("run_one_round") == [
        f"aggregator/round_loop.py:{RoundLoop.run_one_round.__code__.co_firstlineno}"
    ]
    assert _subclasses_of("RoundLoop") == []


def test_both_ways_of_running_build_the_same_loop(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, tiny_overrides)
    hw = load_hardware(cfg.hw_config)
    rundir = RunDir.create(tmp_path / "inproc")
    write_metadata(rundir, cfg, hw)
    local = local_loop(cfg, hw, rundir)
    assert type(local) is RoundLoop and isinstance(local.devices, LocalDevices)
    summary = run_rounds(local)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3

    class _Server:
        def __init__(self) -> None:
            self.sent: list[str] = []

        def send(self, identity: bytes, frames: list[bytes]) -> None:
            self.sent.append(decode(frames).type)

    server = _Server()
    plane = ControlPlane(server, cfg.devices, {}, 0)  # type: ignore[arg-type]
    for i in range(cfg.devices):
        plane.peers[i] = Peer(i, b"id%d" % i, "x", dataset_size=100, ready=True)
    rundir = RunDir.create(tmp_path / "lab")
    write_metadata(rundir, cfg, hw)
    lab = lab_loop(cfg, hw, rundir, plane, round_timeout_s=5.0)
    assert type(lab) is RoundLoop and isinstance(lab.devices, RemoteDevices)
    assert type(lab).__dict__["run_one_round"] is type(local).__dict__["run_one_round"]
    for devices in (local.devices, lab.devices):
        assert isinstance(devices, Devices)
    rundir.close()


@pytest.mark.parametrize("method", sorted(
    name for name in vars(Devices) if not name.startswith("_") and callable(vars(Devices)[name])
))
def test_both_kinds_of_devices_implement_the_whole_interface(method: str) -> None:
    for kind in (LocalDevices, RemoteDevices):
        assert callable(getattr(kind, method, None)), f"{kind.__name__} lacks {method}"
