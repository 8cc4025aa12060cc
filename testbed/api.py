"""The testbed's Python API: load a config, run or resume an experiment, read the result.

Everything a script needs is here; the rest of the code base is internal and may change.
``testbed run`` is this module behind a command line.

Example
-------
>>> from testbed import api
>>> cfg = api.load_config(overrides=["rounds=2", "devices=2"])  # the shipped default job
>>> result = api.run(cfg, "runs/example")                       # doctest: +SKIP
>>> result.status, result.accuracy                               # doctest: +SKIP
('completed', 0.61)
>>> for dev in result.devices:                                   # doctest: +SKIP
...     print(dev.device, dev.epsilon, dev.unit, dev.accountant, dev.delta)

A run stopped by Ctrl-C (``status == "interrupted"``) continues with :func:`resume`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_experiment, load_hardware

__all__ = [
    "ConfigError",
    "DeviceResult",
    "Experiment",
    "RunResult",
    "load_config",
    "plan_overrides",
    "resume",
    "run",
]


@dataclass(frozen=True)
class Experiment:
    """A validated experiment: its config and the hardware config it runs on."""

    config: ExperimentConfig
    hardware: HardwareConfig


@dataclass(frozen=True)
class DeviceResult:
    """One device's privacy and energy at the end of a run.

    Attributes
    ----------
    device
        Device id.
    epsilon
        The epsilon spent, under the enforced accountant (``None`` without DP).
    unit
        ``"record"`` (one training example) or ``"device"`` (a device's whole data).
    accountant
        The accountant the budget is enforced with (``pld``, ``rdp``, ...).
    delta
        The delta of ``epsilon`` (all failure probabilities included).
    uploads
        Uploads charged to the device.
    energy_comm_j, energy_comp_j
        Radio and computing energy spent (J).
    """

    device: int
    epsilon: float | None
    unit: str | None
    accountant: str | None
    delta: float | None
    uploads: int | None
    energy_comm_j: float
    energy_comp_j: float


@dataclass(frozen=True)
class RunResult:
    """How a run ended, and where to read more.

    Attributes
    ----------
    status
        ``completed``, ``budget_exhausted``, ``diverged``, ``link_failed``, ``failed`` or
        ``interrupted``; ``reason`` says why; ``exit_code`` is ``testbed run``'s.
    accuracy
        The final test accuracy (full test set), ``None`` if no round was evaluated.
    devices
        Every listed device's privacy and energy.
    trust
        Whom each epsilon holds against (the trust model, channel noise credited or not).
    run_dir
        The run directory (``None``: a run refused before its first round left none).
    report_path
        The run's ``report.md`` (``None`` when not written).
    report_note
        Where the report is, or why it is missing (``None``: not asked for, or no run
        directory).
    summary
        The whole ``summary.json``.
    """

    status: str
    reason: str
    exit_code: int
    accuracy: float | None
    rounds_completed: int
    devices: list[DeviceResult]
    trust: str | None
    run_dir: Path | None
    report_path: Path | None
    report_note: str | None
    summary: dict[str, Any]

    @property
    def max_epsilon(self) -> float | None:
        """The largest epsilon over the devices (``None`` without DP)."""
        values = [d.epsilon for d in self.devices if d.epsilon is not None]
        return max(values) if values else None


def load_config(
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    hw_overrides: Sequence[str] = (),
    plan: str | Path | None = None,
) -> Experiment:
    """Load and validate an experiment (the shipped default when ``config`` is ``None``).

    Parameters
    ----------
    config
        Experiment YAML.
    overrides
        ``"key=value"`` overrides, dotted for sections (``"privacy.epsilon=1.8"``).
    hw_overrides
        Overrides of the hardware config the experiment names (``hw_config``).
    plan
        A ``testbed plan --out`` file to follow (applied before ``overrides``).

    Raises
    ------
    ConfigError
        Naming the key, the value and what is allowed; before any work.
    """
    sets = list(overrides)
    if plan is not None:
        sets = [*plan_overrides(Path(plan)), *sets]
    cfg = load_experiment(None if config is None else str(config), sets)
    return Experiment(cfg, load_hardware(cfg.hw_config, list(hw_overrides)))


def run(
    experiment: Experiment,
    out_dir: str | Path,
    *,
    progress: bool = False,
    report: bool = True,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    fallback: str | None = None,
) -> RunResult:
    """Run ``experiment`` into the new run directory ``out_dir``, every device in this
    process (``testbed run``).

    ``fallback``: ``"emulate"`` runs a ``usrp`` hardware config on emulated radios when UHD
    finds none of its USRPs (``None``: the config's ``usrp.fallback``; docs/virtual_lab.md).

    ``on_round`` is called with each round's metrics line once it is committed; ``report``
    writes ``report.md`` and its figures at the end. Never raises for an outcome (a budget
    exhausted, a dead link, Ctrl-C): the result's ``status`` says how it ended.

    Raises
    ------
    ConfigError, RunDirError, FileNotFoundError
        Before the first round: a bad config, an existing ``out_dir``, missing data.
    testbed.core.radio_fallback.FallbackRefused
        ``fallback`` emulate and only some of the USRPs found (before the first round).
    """
    from testbed.runner import run_experiment

    out = Path(out_dir)
    summary = run_experiment(experiment.config, out, progress=progress,
                             hw=experiment.hardware, on_round=on_round, fallback=fallback)
    return _result(summary, out, report)


def resume(
    run_dir: str | Path, *, progress: bool = False, report: bool = True,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Continue the interrupted run in ``run_dir`` from its last completed round, under
    its own configs (an edited config is refused).

    Raises
    ------
    RunDirError
        The run's files are missing, disagree, or another process holds the run.
    """
    from testbed.runner import resume_experiment

    out = Path(run_dir)
    return _result(resume_experiment(out, progress=progress, on_round=on_round), out, report)


def _result(summary: dict[str, Any], out: Path, report: bool) -> RunResult:
    """The result object of a run's summary (and its report, written here)."""
    run_dir = None if summary.get("run_dir_removed") else out
    report_path, note = None, None
    if report and run_dir is not None:
        from testbed.report import report_after_run

        note = report_after_run(run_dir, summary)
        if note is not None and note.startswith("report: "):
            report_path = Path(note.removeprefix("report: "))
    privacy = summary.get("privacy", {})
    comm = summary.get("energy_comm_j_per_device", [])
    comp = summary.get("energy_comp_j_per_device", [])
    devices = [
        DeviceResult(
            device=int(d["device"]),
            epsilon=d.get("epsilon"),
            unit=d.get("unit", privacy.get("unit")),
            accountant=d.get("accountant", privacy.get("enforced_accounting")),
            delta=d.get("delta", privacy.get("delta") if privacy.get("unit") else None),
            uploads=d.get("uploads"),
            energy_comm_j=float(comm[d["device"]]) if d["device"] < len(comm) else 0.0,
            energy_comp_j=float(comp[d["device"]]) if d["device"] < len(comp) else 0.0,
        )
        for d in privacy.get("devices", [])
    ]
    return RunResult(
        status=summary["status"],
        reason=summary.get("reason", ""),
        exit_code=int(summary["exit_code"]),
        accuracy=summary.get("final_accuracy"),
        rounds_completed=int(summary.get("rounds_completed", 0)),
        devices=devices,
        trust=privacy.get("trust"),
        run_dir=run_dir,
        report_path=report_path,
        report_note=note,
        summary=summary,
    )


def plan_overrides(path: Path) -> list[str]:
    """Config overrides that make a run follow the plan at ``path``.

    ``plan``, ``scheme``, ``rounds`` (K), ``privacy.unit``, the compression that gives the
    plan's ``l`` and ``Q``, and ``loss_targets`` = the plan's target loss (so the summary
    reports the round and energy at which the run reached it); everything else the plan
    assumed is checked by the run (:func:`testbed.core.schemes.load_checked_plan`).
    """
    from aggregator.peers.plan_config import peer_plan_overrides
    from testbed.core.config.plan_file import load_plan

    peer = peer_plan_overrides(path)
    if peer is not None:  # a peer system's plan (testbed plan --scheme dp-pasgd)
        return peer
    from testbed.core.config.aircomp_plan_file import aircomp_plan_overrides

    air = aircomp_plan_overrides(path)
    if air is not None:  # testbed plan --scheme aircomp
        return air
    plan = load_plan(path)
    out = [f"plan={path}", f"scheme={plan.scheme}", f"rounds={plan.K}",
           f"privacy.unit={plan.unit}"]
    if plan.unit == "device":
        out.append(f"local_steps={plan.H}")
    out.append(f"compression.sparsify={'true' if plan.l < plan.d else 'false'}")
    if plan.l < plan.d:
        out.append(f"compression.theta_s={plan.l / plan.d!r}")
    out.append(f"compression.quantize={'true' if plan.Q is not None else 'false'}")
    if plan.target_loss is not None:
        out.append(f"loss_targets=[{plan.target_loss!r}]")
    if plan.Q is not None:
        out.append(f"compression.levels={plan.Q}")
    return out
