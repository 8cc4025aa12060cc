"""The report's energy, loss-target and channel (SNR) tables, built from a
:class:`~testbed.report.load.RunData`; every number a traced
:class:`~testbed.report.tables.Cell`, as in :mod:`testbed.report.sections`."""

from __future__ import annotations

from testbed.report.load import METRICS, SUMMARY, RunData
from testbed.report.sections import device_cell
from testbed.report.tables import Table, label, op_cell, value_cell

# -- energy, loss targets, channel -----------------------------------------------------------


def energy_table(run: RunData) -> Table:
    """Computing and communication energy per device (J, summed over the run)."""
    t = Table("energy", ["device", "computing (J)", "communication (J)", "total (J)",
                         "lost uploads"])
    s = run.summary or {}
    comp, comm = s.get("energy_comp_j_per_device"), s.get("energy_comm_j_per_device")
    if isinstance(comp, list) and isinstance(comm, list):
        n = len(comp)
        c = ("energy_comp_j_per_device",)
        r = ("energy_comm_j_per_device",)
        for i in range(n):
            t.rows.append([
                device_cell(run, i),
                value_cell(s, SUMMARY, (*c, i)),
                value_cell(s, SUMMARY, (*r, i)),
                op_cell("sum", SUMMARY, [(*c, i), (*r, i)], s),
                value_cell(s, SUMMARY, ("lost_uploads_per_device", i)),
            ])
        t.rows.append([
            label("all"),
            op_cell("sum", SUMMARY, [(*c, i) for i in range(n)], s),
            op_cell("sum", SUMMARY, [(*r, i) for i in range(n)], s),
            op_cell("sum", SUMMARY, [(*c, i) for i in range(n)] + [(*r, i) for i in range(n)],
                    s),
            value_cell(s, SUMMARY, ("lost_uploads",)),
        ])
        t.note = (f"From `{SUMMARY}` (`energy_comp_j_per_device`, `energy_comm_j_per_device`, "
                  f"lost uploads); totals are sums of those.")
        return t
    entries = run.device_entries()
    for dev in range(run.n_devices):
        mine = [(k, j, e) for k, j, i, e in entries if i == dev]
        comp_p = [(k, "devices", j, "energy_comp_j") for k, j, e in mine
                  if "energy_comp_j" in e]
        comm_p = [(k, "devices", j, "energy_comm_j") for k, j, e in mine
                  if "energy_comm_j" in e]
        lost_p = [(k, "devices", j, "lost") for k, j, e in mine if e.get("lost") is True]
        t.rows.append([
            device_cell(run, dev),
            op_cell("sum", METRICS, comp_p, run.rounds),
            op_cell("sum", METRICS, comm_p, run.rounds),
            op_cell("sum", METRICS, comp_p + comm_p, run.rounds),
            op_cell("count", METRICS, lost_p, run.rounds),
        ])
    t.note = f"Summed over `{METRICS}`'s committed rounds (no `{SUMMARY}`)."
    return t


def loss_target_table(run: RunData) -> Table | None:
    """Round and energy at which each configured training-loss target was reached."""
    targets = (run.summary or {}).get("loss_targets")
    if not isinstance(targets, list) or not targets:
        return None
    t = Table("loss_targets", ["target train loss", "window (rounds)", "reached at round",
                               "energy to reach it (J, all devices)"])
    for i in range(len(targets)):
        t.rows.append([value_cell(run.summary, SUMMARY, ("loss_targets", i, k))
                       for k in ("target", "window", "round", "energy_j")])
    t.note = (f"From `{SUMMARY}` `loss_targets`: the first round (0-based) whose training "
              f"loss averaged over the window is at or below the target, and the computing "
              f"plus radio energy of all devices up to and including it; n/a: never reached.")
    return t


def snr_table(run: RunData) -> Table | None:
    """Per device: uploads with an SNR, and its mean, minimum and maximum (dB)."""
    by_dev = run.device_values("snr_db")
    if not by_dev:
        return None
    budget = run.device_values("budget_snr_db")
    header = ["device", "uploads with SNR", "mean SNR (dB)", "min SNR (dB)", "max SNR (dB)"]
    pilot = run.device_values("snr_est_db")
    if budget:
        header += ["mean pilot SNR (dB)", "link budget SNR (dB)"]
    t = Table("snr", header)
    for dev in sorted(by_dev):
        paths = [(k, "devices", j, "snr_db") for k, j, _ in by_dev[dev]]
        row = [device_cell(run, dev), op_cell("count", METRICS, paths, run.rounds),
               *(op_cell(op, METRICS, paths, run.rounds) for op in ("mean", "min", "max"))]
        if budget:
            row += [op_cell("mean", METRICS, [(k, "devices", j, key)
                                              for k, j, _ in values.get(dev, [])], run.rounds)
                    for key, values in (("snr_est_db", pilot), ("budget_snr_db", budget))]
        t.rows.append(row)
    t.note = (f"From every upload's `snr_db` in `{METRICS}` (received SNR at the aggregator; "
              f"the mean is of the dB values)." + (
                  " Pilot SNR: the Es/N0 of unit-power symbols the receiver estimates from the "
                  "frame's pilots (`snr_est_db`). Link budget: that Es/N0 as the virtual air's "
                  "path loss and thermal noise give it for `tx_power_ref_w` "
                  "(`budget_snr_db`), fading at its mean."
                  if budget else ""))
    return t
