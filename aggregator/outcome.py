"""How a run ended: the outcome, its exit code, the console line, the trust statement."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig

if TYPE_CHECKING:
    from testbed.core.schemes import DeviceUplink

#: Every way a run can end (``summary.json`` ``status``).
OUTCOMES = ("completed", "budget_exhausted", "diverged", "link_failed", "interrupted", "failed")
_EXIT_CODES = {
    "completed": 0,
    "failed": 1,
    "budget_exhausted": 3,
    "diverged": 4,
    "link_failed": 5,
    "interrupted": 130,
}


def exit_code(status: str, rounds_completed: int, cfg: ExperimentConfig) -> int:
    """The process exit code of an outcome: 0 only for ``completed``, and for
    ``budget_exhausted`` after at least one round when ``privacy.stop_on_budget`` is set."""
    if status == "budget_exhausted" and rounds_completed > 0 and cfg.privacy.stop_on_budget:
        return 0
    return _EXIT_CODES[status]


def outcome_line(summary: dict[str, Any], run_dir: Path | str) -> str:
    """One line for the console: status, rounds, accuracy, lost uploads, reason, where."""
    acc = summary.get("final_accuracy")
    on = f" on {summary['radios']}" if summary.get("radios") else ""
    text = (
        f"run {summary['status']}{on}: "
        f"{summary['rounds_completed']}/{summary['rounds_planned']} "
        f"rounds, final test accuracy {'n/a' if acc is None else f'{acc:.4f}'}"
    )
    if summary.get("lost_uploads"):
        text += f", {summary['lost_uploads']} uploads lost"
    eps = [d.get("epsilon") for d in summary["privacy"]["devices"]]
    eps = [e for e in eps if isinstance(e, int | float)]
    if eps:
        p = summary["privacy"]
        text += f", max epsilon {max(eps):.3g} ({p['unit']}, {p['enforced_accounting']})"
    text += f", {summary['wall_time_s']:.1f} s"
    if summary.get("reason"):
        text += f" ({summary['reason']})"
    if summary.get("run_dir_removed"):
        return text + "; nothing went on air, run directory removed"
    return text + f" -> {run_dir}"


def trust_fields(
    cfg: ExperimentConfig,
    hw: HardwareConfig,
    unit: str | None,
    uplinks: Sequence[DeviceUplink],
) -> dict[str, Any]:
    """The summary's ``privacy.trust`` (:func:`trust_statement`) and, for a private run,
    ``privacy.channel_noise`` (:func:`testbed.core.channel_credit.channel_noise_report`)."""
    if unit is None:
        return {"trust": None}
    from testbed.core.channel_credit import channel_noise_report

    channel = channel_noise_report(cfg, hw, uplinks)
    if cfg.scheme == "aircomp":
        return {"trust": aircomp_trust(channel, cfg.privacy.colluding_devices),
                "channel_noise": channel}
    return {"trust": trust_statement(channel, unit), "channel_noise": channel}


def aircomp_trust(channel: dict[str, Any], colluding: int) -> str:
    """The trust statement of over-the-air aggregation (docs/privacy.md section 12)."""
    credited = float(channel["credited_fraction"])
    receiver = (f"plus {credited:.0%} of the receiver's noise, which is secret "
                f"({channel['source']})" if credited > 0
                else f"and no receiver noise ({channel['reason']})")
    return (
        "Distributed model (over-the-air aggregation): every device adds its share of the "
        "noise and all transmit in one slot, so the aggregator receives only the sum. A "
        "device's enforced epsilon credits the noise of every other device that transmitted "
        f"with it, less the {colluding} largest shares (privacy.colluding_devices: devices "
        f"that collude subtract their own noise), {receiver}. It assumes the other devices "
        "add their noise (honest but curious) and that no one receives the devices' signals "
        "separately; with every other device colluding only the device's own noise and the "
        "receiver's count (epsilon_all_colluding), and without the receiver's noise "
        "(epsilon_no_channel) an eavesdropper with a better channel is covered."
    )


def trust_statement(channel: dict[str, Any], unit: str) -> str:
    """Who the guarantee holds against and under what assumption, in words (once).

    Parameters
    ----------
    channel
        The summary's ``privacy.channel_noise``: ``credited_fraction``, ``source`` and
        ``reason`` (why nothing is credited).
    unit
        ``record`` or ``device`` (only the record unit reports ``epsilon_no_channel``).
    """
    local = "Local model: each device adds its artificial noise before its upload leaves it"
    credited = float(channel["credited_fraction"])
    if credited <= 0:
        return (
            f"{local}, so epsilon holds against the aggregator and anyone who receives the "
            f"uploads, eavesdroppers included. No channel noise is credited: "
            f"{channel['reason']}."
        )
    no_channel = (
        "epsilon_no_channel"
        if unit == "record"
        else "not reported at the device unit; `testbed privacy --trusted 0` computes it"
    )
    return (
        f"{local}. The enforced epsilon also credits {credited:.0%} of the channel noise the "
        f"aggregator's receiver adds, which is secret ({channel['source']}): it holds against "
        "the aggregator, assuming it does not learn that noise. It does not hold against an "
        "eavesdropper with a better channel, nor anyone who knows the channel noise: against "
        f"them only the artificial noise counts ({no_channel})."
    )
