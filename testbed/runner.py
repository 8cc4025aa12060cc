"""``testbed run``: an experiment with every device in this process, into a run directory.

The aggregator's round loop (:mod:`aggregator.round_loop`) asks the devices of
:class:`testbed.local_devices.LocalDevices` directly: each round every asked device trains H
local SGD steps from the global model, encodes its differential (clip, noise, compress,
scale) into analog symbols and sends them over the link; the aggregator inverts the channel,
decodes, averages and updates the global model, then evaluates it (003 Algorithm 1). The lab
runs the same loop with the devices reached over the control plane
(:mod:`aggregator.lab.server`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aggregator.round_loop import RoundLoop
from aggregator.run_rounds import RoundCallback, run_rounds
from aggregator.state import RunState
from testbed.core.compute import ResolvedDevice, check_workers, resolve_device
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.lab_checks import check_not_lab_run
from testbed.core.links import check_link_config
from testbed.core.privacy import LedgerError
from testbed.core.run_setup import prepare_data
from testbed.core.runs.recovery import check_config_pin, directory_is_pristine, resume_point
from testbed.core.runs.run_metadata import write_metadata
from testbed.core.runs.rundir import RunDir, RunDirError
from testbed.local_devices import LocalDevices

__all__ = ["local_loop", "run_experiment", "resume_experiment"]


def local_loop(
    cfg: ExperimentConfig,
    hw: HardwareConfig,
    rundir: RunDir,
    compute: ResolvedDevice | None = None,
) -> RoundLoop:
    """The round loop of a run with every device in this process: the data loaded and
    split, the aggregator's state, the devices (made when first asked).

    ``compute``: where the model trains and is evaluated (``None``: ``cfg.compute.device``
    resolved here, :func:`testbed.core.compute.resolve_device`).
    """
    compute = compute if compute is not None else resolve_device(cfg.compute.device)
    data, parts = prepare_data(cfg)
    state = RunState(cfg, hw, rundir, data, [len(p) for p in parts])
    return RoundLoop(state, LocalDevices(state, data, parts, compute=compute.torch_device))


def run_experiment(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    progress: bool = False,
    hw: HardwareConfig | None = None,
    on_round: RoundCallback | None = None,
    fallback: str | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` into a new run directory ``out_dir``; returns the summary.

    Everything is validated (configs, data, link) before the first round. A run that
    fails or is stopped before anything went on air leaves no directory behind.
    ``fallback``: ``--fallback`` (``None``: the hardware config's ``usrp.fallback``); with
    ``emulate`` and none of the link's USRPs found, the run is on emulated radios
    (:mod:`testbed.core.radio_fallback`) and its saved ``hw_config.yaml`` says so.

    Raises
    ------
    testbed.core.radio_fallback.FallbackRefused
        Some of the link's USRPs found, some not (before the run directory exists).
    testbed.core.config.errors.ConfigError
        ``compute.device`` names a CUDA device torch does not see here, or asks for worker
        processes on a GPU; ``fallback`` emulate off the ``usrp`` link (before the run
        directory exists).
    """
    from testbed.core.config.link import link_name
    from testbed.core.radio_fallback import (
        check_fallback_applies,
        fallback_mode,
        radios_of,
        resolve_radios,
    )

    # where the model computes, checked before anything else is done or created
    compute = resolve_device(cfg.compute.device)
    check_workers(compute.torch_device, cfg.workers)
    hw = hw if hw is not None else load_hardware(cfg.hw_config)
    check_fallback_applies(fallback, link_name(cfg, hw))
    on_usrp = link_name(cfg, hw) == "usrp"
    hw = resolve_radios(hw, fallback_mode(hw, fallback), radios_of(hw, "run") if on_usrp else [],
                        snr_db=cfg.snr_db_per_device(),
                        rician_k_db=cfg.rician_k_db)
    check_link_config(cfg, hw, record=cfg.record)
    out_dir = Path(out_dir)
    rundir = RunDir.create(out_dir)
    try:
        write_metadata(rundir, cfg, hw, compute=compute)
        loop = local_loop(cfg, hw, rundir, compute)
    except BaseException:
        rundir.remove()
        raise
    summary = run_rounds(loop, 0, progress=progress, on_round=on_round)
    if (
        summary["status"] in ("failed", "link_failed", "interrupted")
        and summary["rounds_completed"] == 0
        and directory_is_pristine(out_dir)
    ):
        rundir.remove()
        summary["run_dir_removed"] = True
    return summary


def resume_experiment(
    run_dir: Path, *, progress: bool = False, on_round: RoundCallback | None = None
) -> dict[str, Any]:
    """Continue an interrupted run from its last completed round.

    Raises
    ------
    RunDirError
        When the run's files are missing or disagree (see :mod:`testbed.core.runs.recovery`), or
        ``run_dir`` is a lab run's (before anything is opened; the line names the command
        that continues it, :func:`testbed.core.lab_checks.check_not_lab_run`).
    """
    check_not_lab_run(Path(run_dir))
    rundir = RunDir.open(Path(run_dir))
    try:
        cfg = load_experiment(rundir.path / "config.yaml")
        hw = load_hardware(str(rundir.path / "hw_config.yaml"))
        check_config_pin(rundir, cfg, hw)
        point = resume_point(rundir, private=cfg.scheme != "fedavg")
        compute = resolve_device(cfg.compute.device)  # this host's device, as at the start
        try:
            loop = local_loop(cfg, hw, rundir, compute)
        except LedgerError as exc:
            raise RunDirError(str(exc)) from None
    except BaseException:
        rundir.close()
        raise
    if point.weights is not None:
        loop.state.w = point.weights
    return run_rounds(loop, point.next_round, progress=progress, on_round=on_round)
