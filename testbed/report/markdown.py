"""Assemble ``report.md`` from the tables of :mod:`testbed.report.sections` and the figures."""

from __future__ import annotations

import time

from testbed import __version__
from testbed.core.config.emulated import radios_words
from testbed.report import channel_sections, sections
from testbed.report.load import METRICS, SUMMARY, RunData
from testbed.report.plots import Plot, comp_source
from testbed.report.tables import Table

#: Folder (in the run directory) of the figures and ``sources.json``.
REPORT_DIR = "report"


def _figure(plots: dict[str, Plot], name: str, title: str) -> str:
    p = plots.get(name)
    if p is None:
        return ""
    return f"![{title}]({REPORT_DIR}/{name})\n\n*{p.caption}.*\n"


def render(run: RunData, plots: list[Plot]) -> tuple[str, list[Table]]:
    """The Markdown text of the report and the tables in it (for ``sources.json``)."""
    by_name = {p.name: p for p in plots}
    tables: list[Table] = []
    out: list[str] = []

    def add(table: Table | None) -> None:
        if table is not None:
            tables.append(table)
            out.append(table.markdown() + "\n")

    name = run.setting("name") or run.path.name
    read = ", ".join(f"`{f}`" for f in run.read) or "nothing"
    radios = (run.summary or {}).get("radios") or ((run.meta or {}).get("radios") or {}).get(
        "label")
    out.append(f"# Run report: {name}" + (f", on {radios_words(radios)}" if radios else "")
               + "\n")
    out.append(
        f"Run directory `{run.path.resolve()}`; report written by testbed {__version__} at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}. Read: {read}. Every "
        f"number in the tables below is read from the run directory file its note names; "
        f"`{REPORT_DIR}/sources.json` gives the file and key of each one. Rounds are "
        f"0-based.\n"
    )
    if run.summary is None or run.problems:
        out.append("**Partial report.** What was missing or unreadable:\n")
        out.append("".join(f"- {p}\n" for p in run.problems))

    out.append("## Outcome\n")
    add(sections.outcome_table(run))

    out.append("## Settings\n")
    add(sections.settings_table(run))

    out.append("## Accuracy and loss\n")
    if run.rounds:
        out.append(_figure(by_name, "accuracy_loss.png", "Accuracy and loss per round"))
    else:
        out.append(f"No committed round in `{METRICS}`: nothing to plot.\n")

    out.append("## Privacy\n")
    if not run.private and run.scheme is None:
        out.append("No privacy figures: the scheme is unknown (no readable config or "
                   "summary), and there is no ledger and no epsilon in the metrics.\n")
    elif not run.private:
        out.append(f"No differential privacy: scheme {run.scheme} adds no noise and no "
                   f"epsilon is claimed.\n")
    else:
        add(sections.privacy_settings_table(run))
        out.append("### Epsilon per device\n")
        add(sections.epsilon_table(run))
        add(sections.epsilon_spread_table(run))
        notes = []
        if run.unit == "record":
            notes.append(
                "Record unit: one training example of a device is the protected unit. "
                "'no channel credit' is the enforced accountant with none of the channel's "
                "noise credited (what an eavesdropper with a better channel faces); "
                "'device-level' treats a device's whole data set as the unit."
            )
        elif run.unit == "device":
            notes.append(
                "Device unit: a device's whole data set is the protected unit. 'paper' is "
                "003's Theorem 1 accounting, which is not a DP bound; 'strict' is the "
                "testbed's sound bound for the same uploads."
            )
        peer = sections.peer_note(run)
        if peer:
            notes.append(peer)
        out.extend(n + "\n" for n in notes)
        out.append(_figure(by_name, "epsilon.png", "Epsilon per device per round"))

    out.append("## Energy\n")
    out.append(f"Computing energy: {comp_source(run)}.\n")
    add(channel_sections.energy_table(run))
    out.append(_figure(by_name, "energy.png", "Energy per device"))

    out.append("## Loss targets\n")
    lt = channel_sections.loss_target_table(run)
    if lt is None and run.summary is None:
        out.append(f"No `{SUMMARY}`: the round and energy at each loss target are computed "
                   f"when the run ends.\n")
    elif lt is None:
        out.append(f"No loss targets in `{SUMMARY}` (`loss_targets` in the config).\n")
    add(lt)

    out.append("## Channel\n")
    st = channel_sections.snr_table(run)
    if st is None:
        carriers = {str(e["carrier"]) for _, _, _, e in run.device_entries() if "carrier" in e}
        why = f" (uploads went over: {'; '.join(sorted(carriers))})" if carriers else ""
        out.append(f"No upload in `{METRICS}` carries a received SNR{why}.\n")
    add(st)
    out.append(_figure(by_name, "snr.png", "Receive SNR per device"))
    return "\n".join(out).rstrip() + "\n", tables
