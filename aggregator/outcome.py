"""How a run ended: the outcome, its exit code, the console line, the trust statement."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.core.config.emulated import radios_words
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig

if TYPE_CHECKING:
    from testbed.core.record_schemes import RecordSettings
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
    """The console's outcome: status, rounds, accuracy, lost uploads, reason, where.

    One line; when a device added no noise of its own (``privacy.devices_without_noise``,
    :func:`trust_fields`), its epsilon clause also gives ``epsilon_no_channel`` (the largest
    over the devices) and a ``note:`` line before it says what the guarantee rests on
    (:func:`channel_only_sentence`), so the outcome is still the last line.

    Parameters
    ----------
    summary
        The run's ``summary.json``.
    run_dir
        Where the run directory is.

    Returns
    -------
    str
        The line (the note's line, then the outcome's, when a device added no noise).
    """
    acc = summary.get("final_accuracy")
    on = f" on {radios_words(summary['radios'])}" if summary.get("radios") else ""
    text = (
        f"run {summary['status']}{on}: "
        f"{summary['rounds_completed']}/{summary['rounds_planned']} "
        f"rounds, final test accuracy {'n/a' if acc is None else f'{acc:.4f}'}"
    )
    if summary.get("lost_uploads"):
        text += f", {summary['lost_uploads']} uploads lost"
    p = summary["privacy"]
    listed = p["devices"]
    silent = [int(i) for i in p.get("devices_without_noise") or []]
    eps = [d.get("epsilon") for d in listed]
    eps = [e for e in eps if isinstance(e, int | float)]
    if eps:
        text += f", max epsilon {max(eps):.3g} ({p['unit']}, {p['enforced_accounting']}"
        if silent:
            text += f"; without channel noise: {no_channel_figure(listed)}"
        text += ")"
    text += f", {summary['wall_time_s']:.1f} s"
    if summary.get("reason"):
        text += f" ({summary['reason']})"
    short = (summary.get("radio_calibration") or {}).get("short")
    if short:
        text += f"; {short}"
    if summary.get("run_dir_removed"):
        text += "; nothing went on air, run directory removed"
    else:
        text += f" -> {run_dir}"
    if silent and eps:  # the note first: the outcome stays the last line printed
        credited = float((p.get("channel_noise") or {}).get("credited_fraction", 0.0))
        total = int(p.get("population", len(listed)))
        note = channel_only_sentence(silent, total, credited=credited, unit=p["unit"])
        text = f"note: {note}\n{text}"
    return text


def as_number(value: Any) -> float | None:
    """A number of ``summary.json`` as a float: ``"inf"``/``"Infinity"`` (how infinite
    epsilons are written) included; ``None`` for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def no_channel_figure(devices: Sequence[dict[str, Any]]) -> str:
    """The largest ``epsilon_no_channel`` of the summary's devices, as the outcome line
    shows it (``inf`` when a device has nothing but the channel's noise), or ``not
    reported`` (device unit: ``testbed privacy --trusted 0`` computes it)."""
    numbers = [as_number(d.get("epsilon_no_channel")) for d in devices]
    values = [v for v in numbers if v is not None]
    if not values:
        return "not reported"
    return f"{max(values):.3g}"


def trust_fields(
    cfg: ExperimentConfig,
    hw: HardwareConfig,
    unit: str | None,
    uplinks: Sequence[DeviceUplink],
    records: Sequence[RecordSettings | None] = (),
) -> dict[str, Any]:
    """The summary's ``privacy.trust`` (:func:`trust_statement`, :func:`aircomp_trust`),
    generated from what the run did, and for a private run ``privacy.channel_noise``
    (:func:`testbed.core.channel_credit.channel_noise_report`) and
    ``privacy.devices_without_noise`` (:func:`noiseless_devices`: the devices that add no
    noise of their own).

    Parameters
    ----------
    cfg, hw
        The run's configs.
    unit
        ``record``, ``device``, or ``None`` (no privacy: ``{"trust": None}``).
    uplinks
        Every device's uplink, in device order.
    records
        Every device's record-level settings (record unit), in device order.
    """
    if unit is None:
        return {"trust": None}
    from testbed.core.channel_credit import channel_noise_report
    from testbed.core.config.aircomp_checks import aircomp_colluding

    channel = channel_noise_report(cfg, hw, uplinks)
    silent = noiseless_devices([up.sigma for up in uplinks], records)
    if cfg.scheme == "aircomp":
        trust = aircomp_trust(channel, aircomp_colluding(cfg), cfg.privacy.colluding_devices,
                              silent=silent, devices=len(uplinks))
    else:
        trust = trust_statement(channel, unit, silent=silent, devices=len(uplinks))
    return {"trust": trust, "channel_noise": channel, "devices_without_noise": silent}


def noiseless_devices(
    sigmas: Sequence[float], records: Sequence[RecordSettings | None] = ()
) -> list[int]:
    """The devices that add no noise of their own: ``sigma`` 0 on the upload and, at the
    record unit, no noise at every local step nor Laplace noise either.

    Parameters
    ----------
    sigmas
        Every device's artificial upload noise (``DeviceUplink.sigma`` or a plan's
        ``sigma``), in device order.
    records
        Every device's record-level settings in the same order (``RecordSettings``:
        ``step_noise_multiplier`` for ``privacy.noise: per-step``, whose uploads carry
        ``sigma`` 0, and ``laplace_scale``); empty or ``None`` entries: upload noise only.

    Returns
    -------
    list of int
        Their ids (positions in ``sigmas``), ascending.
    """
    out = []
    for i, sigma in enumerate(sigmas):
        rs = records[i] if i < len(records) else None
        other = 0.0 if rs is None else max(rs.step_noise_multiplier, rs.laplace_scale)
        if float(sigma) == 0.0 and other == 0.0:
            out.append(i)
    return out


def device_set(ids: Sequence[int], total: int) -> str:
    """Some of ``total`` devices in words, as the subject of a sentence: ``All 4 devices``,
    ``The one device``, ``Device 2 (1 of 4)``, ``Devices 0, 2 and 3 (3 of 4)``; more than
    eight named as the first six and how many more."""
    n = len(ids)
    if n == total:
        return "The one device" if n == 1 else f"All {n} devices"
    if n == 1:
        return f"Device {ids[0]} (1 of {total})"
    names = [str(i) for i in ids]
    if n > 8:
        names = [*names[:6], f"{n - 6} more"]
    return f"Devices {', '.join(names[:-1])} and {names[-1]} ({n} of {total})"


def channel_only_sentence(
    silent: Sequence[int], total: int, *, credited: float, unit: str | None
) -> str:
    """The one sentence every output gives when devices add no noise of their own
    (``sigma`` 0): their guarantee rests on the channel's noise alone, and what that trusts.

    The summary's ``privacy.trust``, the outcome line, ``report.md``, the warning a run
    prints on stderr when it starts (``ChannelOnlyNoiseWarning``) and a plan's note
    (:func:`noiseless_plan_note`) all say it in these words.

    Parameters
    ----------
    silent
        The devices whose ``sigma`` is 0 (:func:`noiseless_devices`), not empty.
    total
        How many devices the run (or plan) has.
    credited
        The fraction of the receiver's noise credited (``privacy.channel_noise``
        ``credited_fraction``); 0: those devices have no guarantee at all.
    unit
        ``record`` (``epsilon_no_channel`` is reported) or ``device``.

    Returns
    -------
    str
        One sentence, ending with a full stop.
    """
    who = device_set(silent, total)
    one = len(silent) == 1
    verb, own = ("adds", "its") if one else ("add", "their")
    if credited <= 0:
        return (f"{who} {verb} no noise of {own} own (sigma = 0) and no channel noise is "
                f"credited: nothing protects {own} uploads (epsilon is infinite).")
    return (
        f"{who} {verb} no noise of {own} own (sigma = 0), so {own} guarantee rests on the "
        "channel's noise alone, the noise of the aggregator's own receiver: it trusts that "
        "the aggregator does not learn its receiver's noise, and gives no protection against "
        "an eavesdropper with a better channel, nor against the aggregator itself if it "
        f"knows that noise (against them: {no_channel_name(unit)})."
    )


def no_channel_name(unit: str | None) -> str:
    """Where the epsilon without the channel noise is reported, for the unit."""
    if unit == "record":
        return "epsilon_no_channel"
    return "not reported at the device unit; `testbed privacy --trusted 0` computes it"


def noiseless_plan_note(silent: Sequence[int], total: int, *, credited: float,
                        unit: str | None) -> str:
    """A plan's note (printed by ``testbed plan`` and kept in the plan file's ``notes``)
    when it sets ``sigma = 0`` for some devices: ``Under this plan,`` and
    :func:`channel_only_sentence`."""
    sentence = channel_only_sentence(silent, total, credited=credited, unit=unit)
    return f"Under this plan, {sentence[0].lower()}{sentence[1:]}"


def aircomp_trust(
    channel: dict[str, Any],
    withheld: int,
    colluding: int | None = None,
    *,
    silent: Sequence[int] = (),
    devices: int = 0,
) -> str:
    """The trust statement of over-the-air aggregation (docs/privacy.md section 12).

    Parameters
    ----------
    channel
        The summary's ``privacy.channel_noise``.
    withheld
        The shares a device's event does not credit, as the accounting counts them
        (:func:`testbed.core.config.aircomp_checks.aircomp_colluding`:
        ``privacy.colluding_devices`` plus ``privacy.dropout_margin``).
    colluding
        Of those, ``privacy.colluding_devices`` (default: all of them).
    silent
        The devices whose ``sigma`` is 0 (:func:`noiseless_devices`).
    devices
        How many devices the run has (with ``silent``).

    Returns
    -------
    str
        The statement.
    """
    credited = float(channel["credited_fraction"])
    head = "Distributed model (over-the-air aggregation): "
    if silent and len(silent) == devices:
        return (
            f"{head}{channel_only_sentence(silent, devices, credited=credited, unit='record')}"
            " All transmit in one slot, so the aggregator receives only the sum; that assumes "
            "no one receives the devices' signals separately."
        )
    colluding = withheld if colluding is None else colluding
    margin = withheld - colluding
    if margin > 0:
        why = (f"{colluding} for privacy.colluding_devices, devices that collude and subtract "
               f"their own noise, and {margin} for privacy.dropout_margin, devices that may "
               "not transmit after the gate")
    else:
        why = "privacy.colluding_devices: devices that collude subtract their own noise"
    receiver = (f"plus {credited:.0%} of the receiver's noise, which is secret "
                f"({channel['source']})" if credited > 0
                else f"and no receiver noise ({channel['reason']})")
    lead = "every device adds its share of the noise"
    if silent:
        head += channel_only_sentence(silent, devices, credited=credited, unit="record") + " "
        lead = f"The other {devices - len(silent)} devices add their shares of the noise"
    return (
        f"{head}{lead} and all transmit in one slot, so the aggregator receives only the sum. "
        "A device's enforced epsilon credits the noise of every other device that transmitted "
        f"with it, less the {withheld} largest shares ({why}), {receiver}. It assumes the "
        "other devices add their noise (honest but curious) and that no one receives the "
        "devices' signals separately; with every other device colluding only the device's own "
        "noise and the receiver's count (epsilon_all_colluding), and without the receiver's "
        "noise (epsilon_no_channel) an eavesdropper with a better channel is covered."
    )
def trust_statement(
    channel: dict[str, Any], unit: str, *, silent: Sequence[int] = (), devices: int = 0
) -> str:
    """Who the guarantee holds against and under what assumption, in words (once).

    Parameters
    ----------
    channel
        The summary's ``privacy.channel_noise``: ``credited_fraction``, ``source`` and
        ``reason`` (why nothing is credited).
    unit
        ``record`` or ``device`` (only the record unit reports ``epsilon_no_channel``).
    silent
        The devices that add no noise of their own (``sigma`` 0, :func:`noiseless_devices`):
        the statement opens with :func:`channel_only_sentence` for them, and the local model
        is stated for the others only.
    devices
        How many devices the run has (with ``silent``).

    Returns
    -------
    str
        The statement.
    """
    credited = float(channel["credited_fraction"])
    lead = ""
    local = "Local model: each device adds its artificial noise before its upload leaves it"
    if silent:
        lead = channel_only_sentence(silent, devices, credited=credited, unit=unit) + " "
        if len(silent) == devices:
            if credited <= 0:
                return f"{lead}No channel noise is credited: {channel['reason']}."
            return (f"{lead}The enforced epsilon credits {credited:.0%} of the channel noise "
                    f"the aggregator's receiver adds, which is secret ({channel['source']}).")
        local = (f"Local model for the other {devices - len(silent)} devices: each adds its "
                 "artificial noise before its upload leaves it")
    if credited <= 0:
        return (
            f"{lead}{local}, so epsilon holds against the aggregator and anyone who receives "
            f"the uploads, eavesdroppers included. No channel noise is credited: "
            f"{channel['reason']}."
        )
    return (
        f"{lead}{local}. The enforced epsilon also credits {credited:.0%} of the channel noise "
        f"the aggregator's receiver adds, which is secret ({channel['source']}): it holds "
        "against the aggregator, assuming it does not learn that noise. It does not hold "
        "against an eavesdropper with a better channel, nor anyone who knows the channel "
        f"noise: against them only the artificial noise counts ({no_channel_name(unit)})."
    )
