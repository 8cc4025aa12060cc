"""The lab aggregator process (``testbed aggregator``): the rounds of a run directory, with
every device a remote edge agent.

The round is the aggregator's one round loop (:class:`aggregator.round_loop.RoundLoop`),
the same as ``testbed run``'s; only the devices differ: here they are edge agents reached
over the authenticated CurveZMQ control plane (:class:`aggregator.lab.remote_devices.
RemoteDevices`), on the ``usrp`` link each transmitting its own burst in its TDMA slot
(:mod:`aggregator.lab.usrp_capture`), under 002's secure aggregation summing masked
updates (:mod:`aggregator.lab.secagg_server`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aggregator.lab.control_plane import ControlPlane
from aggregator.lab.remote_devices import RemoteDevices
from aggregator.lab.secagg_server import DEFAULT_PHASE_TIMEOUT_S
from aggregator.lab.usrp_split import DEFAULT_TRAIN_ALLOWANCE_S, ReceiverFactory
from aggregator.round_loop import RoundLoop
from aggregator.run_rounds import run_rounds
from aggregator.state import RunState
from testbed.core.calibration_status import train_allowance
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.private_air import PrivateAir
from testbed.core.radio_fallback import radio_kind
from testbed.core.run_setup import prepare_test_data
from testbed.core.runs.interrupts import StopSignals
from testbed.core.runs.rundir import RunDir
from testbed.core.transport.curve_server import CurveServer
from testbed.core.transport.protocol import MAX_MESSAGE_BYTES

log = logging.getLogger("testbed.aggregator")


def lab_loop(
    cfg: ExperimentConfig, hw: HardwareConfig, rundir: RunDir, plane: ControlPlane, *,
    round_timeout_s: float, **options: Any,
) -> RoundLoop:
    """The round loop of a lab run: the aggregator's state (the test set only; the shards
    stay on the edges, which reported their sizes) and the edges on ``plane`` (every device
    ready). ``options``: :class:`~aggregator.lab.remote_devices.RemoteDevices`'s."""
    sizes = [int(plane.peers[i].dataset_size or 0) for i in range(cfg.devices)]
    state = RunState(cfg, hw, rundir, prepare_test_data(cfg), sizes)
    remote = RemoteDevices(state, plane, round_timeout_s=round_timeout_s, **options)
    return RoundLoop(state, remote)


def serve(
    *,
    bind: str,
    keys_dir: Path,
    cfg: ExperimentConfig | None = None,
    hw: HardwareConfig | None = None,
    out_dir: Path | None = None,
    resume_dir: Path | None = None,
    round_timeout_s: float = 60.0,
    join_timeout_s: float = 600.0,
    rejoin_wait_s: float = 0.0,
    train_allowance_s: float | None = None,
    phase_timeout_s: float = DEFAULT_PHASE_TIMEOUT_S,
    endpoint_file: Path | None = None,
    progress: bool = False,
    receiver_factory: ReceiverFactory | None = None,
    clock: Callable[[], float] = time.time,
    own_air: bool = False,
) -> dict[str, Any]:
    """Run (``cfg`` into ``out_dir``) or continue (``resume_dir``) a lab run as aggregator.

    Binds the CurveZMQ server, waits for every device to join, then runs the rounds.
    Returns the run's summary (``status`` says how it ended). ``train_allowance_s``
    (``None``: the hardware config's calibrated deadline, else
    :data:`~aggregator.lab.usrp_split.DEFAULT_TRAIN_ALLOWANCE_S`), ``receiver_factory``: the
    usrp link's, ``phase_timeout_s``: the secure aggregation's
    (:class:`~aggregator.lab.remote_devices.RemoteDevices`); ``clock``: the clock
    ``clock_req`` is answered with and the receiver maps the schedule with (s).
    ``own_air``: start the virtual air of ``hw`` on its configured addresses, logging into
    the run directory (``air.log``, ``air/air.jsonl``), and stop it at the end: this
    aggregator fell back to emulated radios (:mod:`testbed.core.radio_fallback`), so no one
    else runs the air its edges send to. A resumed run whose directory holds ``air/`` (its
    air was the aggregator's) starts it again.

    Raises
    ------
    RunDirError, TimeoutError, ConfigError
        Before any round: a bad run directory, devices that never joined, bad configs.
    """
    import zmq

    from aggregator.lab.resume import endpoint_note, open_run, serve_finished
    from testbed.core.lab_checks import check_allow_list
    from testbed.core.runs.rundir import RunDirError

    if resume_dir is None and cfg is not None:
        check_allow_list(keys_dir, cfg.devices)  # before anything is written
    rundir, cfg, hw, start, weights, finished = open_run(resume_dir, cfg, hw, out_dir)
    allowance_s = train_allowance(hw, train_allowance_s, DEFAULT_TRAIN_ALLOWANCE_S)
    try:
        check_allow_list(keys_dir, cfg.devices)
    except BaseException:
        rundir.close()
        raise
    welcome = {
        "run_id": rundir.path.name,
        "config_yaml": (rundir.path / "config.yaml").read_text(),
        "mask_secret": (rundir.path / "run_secret").read_text().strip(),
        "radios": radio_kind(cfg, hw),
    }
    ctx = zmq.Context()
    server: CurveServer | None = None
    air: PrivateAir | None = None
    try:
        if hw.virtual and (own_air or (resume_dir is not None
                                       and (rundir.path / "air").is_dir())):
            air = PrivateAir(hw, rundir.path, own_ports=False)
        server = CurveServer(ctx, bind, keys_dir=keys_dir, allowed_dir=keys_dir / "allowed",
                             max_message_bytes=MAX_MESSAGE_BYTES)
        endpoint_note(endpoint_file, server.last_endpoint)
        if finished is not None:
            serve_finished(server, rundir, cfg.devices, finished, join_timeout_s)
            rundir.close()
            return finished
        log.info("aggregator bound to %s; waiting for %d devices", server.last_endpoint,
                 cfg.devices)
        plane = ControlPlane(server, cfg.devices, welcome, start, clock=clock)
        with StopSignals() as stop:
            plane.wait_all_ready(join_timeout_s, stop)
        try:
            loop = lab_loop(cfg, hw, rundir, plane, round_timeout_s=round_timeout_s,
                            rejoin_wait_s=rejoin_wait_s, train_allowance_s=allowance_s,
                            phase_timeout_s=phase_timeout_s, receiver_factory=receiver_factory)
        except Exception as exc:
            from testbed.core.privacy import LedgerError

            if isinstance(exc, LedgerError):
                raise RunDirError(str(exc)) from None
            raise
        if weights is not None:
            loop.state.w = weights
        remote = loop.devices
        assert isinstance(remote, RemoteDevices)
        for i in range(cfg.devices):
            remote.sync(i)
        # off a terminal the per-round lines are this process's log lines
        return run_rounds(loop, start, progress=progress, emit=log.info)
    except BaseException:
        rundir.close()
        if resume_dir is None and start == 0 and not rundir.metrics_path.exists():
            from testbed.core.runs.recovery import directory_is_pristine

            if directory_is_pristine(rundir.path):
                rundir.remove()
        raise
    finally:
        if server is not None:
            server.close()
        ctx.term()
        if air is not None:
            air.close()
