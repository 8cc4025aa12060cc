"""How a run ended: the outcome, its exit code, the console line, the trust statement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.config.experiment import ExperimentConfig

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
    text = (
        f"run {summary['status']}: {summary['rounds_completed']}/{summary['rounds_planned']} "
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


def trust_statement(cfg: ExperimentConfig, unit: str | None) -> str | None:
    """Who the guarantee holds against, in words (for the summary)."""
    if unit is None:
        return None
    from testbed.schemes import SCHEMES

    # A scheme that credits no channel noise (ldp-fedavg, s-dp-fl, the peers, and every
    # upload on the control plane) says so, whatever privacy.trusted_channel_noise holds.
    credit = cfg.privacy.trusted_channel_noise if SCHEMES[cfg.scheme].credit_channel else 0.0
    who = (
        "against the aggregator and anyone receiving the uploads; noise is added on each "
        "device (local model), "
    )
    if credit > 0:
        who += (
            f"{credit:g} of the channel noise at the aggregator's receiver is credited where "
            "it adds linearly, which does not protect against an eavesdropper with a better "
            "channel (see epsilon_no_channel)"
        )
    else:
        who += "no channel noise credited"
    return who
