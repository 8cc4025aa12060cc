"""The report's tables, built from a :class:`~testbed.report.load.RunData`.

Every number is a :class:`~testbed.report.tables.Cell` that names its file and key (or the
operation over several), so ``report/sources.json`` can be checked against the run
directory. With ``summary.json`` the figures are the summary's; without it (a killed run)
they are read or summed from ``metrics.jsonl``'s committed rounds, and the notes say so.
"""

from __future__ import annotations

from typing import Any

from testbed.core.schemes import SCHEMES
from testbed.report.load import CONFIG, LEDGER, META, METRICS, SUMMARY, RunData, as_float
from testbed.report.tables import Cell, Key, Table, label, op_cell, value_cell


def device_cell(run: RunData, dev: int) -> Cell:
    """Device index ``dev`` read from the run: the summary's privacy entry of that device,
    else its first entry in the metrics."""
    devices = run.privacy.get("devices")
    if isinstance(devices, list) and dev < len(devices) and isinstance(devices[dev], dict) \
            and devices[dev].get("device") == dev:
        return value_cell(run.summary, SUMMARY, ("privacy", "devices", dev, "device"))
    for k, j, i, e in run.device_entries():
        if i == dev and e.get("device") == dev:
            return value_cell(run.rounds, METRICS, (k, "devices", j, "device"))
    return label(f"device {dev}")


# -- outcome ---------------------------------------------------------------------------------


def _summary_row(run: RunData, name: str, *path: Key) -> list[Cell]:
    return [label(name), value_cell(run.summary, SUMMARY, path)]


def _best_accuracy_line(run: RunData) -> int | None:
    """The metrics line of the first evaluation with the best test accuracy."""
    _, acc, lines = run.round_series("test_accuracy")
    if not lines:
        return None
    return lines[int(acc.argmax())]


def outcome_table(run: RunData) -> Table:
    """Status, reason, rounds, accuracy, loss, lost uploads, wall time."""
    t = Table("outcome", ["", "value"])
    best = _best_accuracy_line(run)
    best_round = (
        [label("round of the best test accuracy"),
         value_cell(run.rounds, METRICS, (best, "round"))] if best is not None else None
    )
    if run.summary is not None:
        t.rows = [
            _summary_row(run, "status", "status"),
            _summary_row(run, "reason", "reason"),
            _summary_row(run, "exit code", "exit_code"),
            _summary_row(run, "rounds completed", "rounds_completed"),
            _summary_row(run, "rounds planned", "rounds_planned"),
            _summary_row(run, "final test accuracy", "final_accuracy"),
        ]
        if run.summary.get("final_accuracy_round") is not None:
            t.rows.append(_summary_row(run, "round of the final test accuracy",
                                       "final_accuracy_round"))
        t.rows.append(_summary_row(run, "best test accuracy", "best_accuracy"))
        if best_round:
            t.rows.append(best_round)
        ev = run.summary.get("evaluation")
        if "final_subset_accuracy" in run.summary:
            t.rows.append(_summary_row(run, "final test-subset accuracy",
                                       "final_subset_accuracy"))
        if isinstance(ev, dict):
            t.rows += [_summary_row(run, "test samples (full set)", "evaluation", "test_samples"),
                       _summary_row(run, "test-subset samples (every round)", "evaluation",
                                    "subset_samples")]
        t.rows += [
            _summary_row(run, "final train loss", "final_train_loss"),
            _summary_row(run, "lost uploads (all devices)", "lost_uploads"),
            _summary_row(run, "model parameters d", "d"),
            _summary_row(run, "wall time (s)", "wall_time_s"),
        ]
        if not t.rows[1][1].text or t.rows[1][1].text == "n/a":
            t.rows[1] = [label("reason"), label("(none given)")]
        t.note = f"From `{SUMMARY}` (best-accuracy round: `{METRICS}`)."
        return t
    lines = list(range(len(run.rounds)))
    _, _, acc_lines = run.round_series("test_accuracy")
    t.rows = [
        [label("status"), label(f"unknown: {SUMMARY} missing or unreadable")],
        [label("rounds committed"), op_cell("count", METRICS, [(k,) for k in lines],
                                            run.rounds)],
        [label("rounds planned"), value_cell(run.config, CONFIG, ("rounds",))],
        [label("last test accuracy"),
         value_cell(run.rounds, METRICS, (acc_lines[-1], "test_accuracy")) if acc_lines
         else label("n/a")],
        [label("best test accuracy"),
         op_cell("max", METRICS, [(k, "test_accuracy") for k in acc_lines], run.rounds)],
    ]
    if best_round:
        t.rows.append(best_round)
    t.rows.append([
        label("last train loss"),
        value_cell(run.rounds, METRICS, (lines[-1], "train_loss")) if lines else label("n/a"),
    ])
    t.note = (f"From `{METRICS}`'s committed rounds (no `{SUMMARY}`); rounds planned from "
              f"`{CONFIG}`.")
    return t


# -- settings --------------------------------------------------------------------------------

_SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("experiment name", ("name",)),
    ("scheme", ("scheme",)),
    ("scheme class (a lab's own; its privacy mechanism is the scheme row's)", ("scheme_class",)),
    ("data set", ("dataset",)),
    ("partition", ("partition",)),
    ("dominant fraction (non-IID)", ("dominant_fraction",)),
    ("training samples (cap)", ("train_samples",)),
    ("test samples (cap)", ("eval_samples",)),
    ("evaluate every (rounds)", ("eval_every",)),
    ("test subset evaluated every round (samples)", ("eval_subset",)),
    ("model", ("model",)),
    ("devices", ("devices",)),
    ("devices per round", ("clients_per_round",)),
    ("rounds", ("rounds",)),
    ("local steps H", ("local_steps",)),
    ("batch size", ("batch_size",)),
    ("learning rate", ("lr",)),
    ("clip mode", ("clip", "mode")),
    ("clip bound", ("clip", "bound")),
    ("sparsify", ("compression", "sparsify")),
    ("kept fraction theta_s", ("compression", "theta_s")),
    ("quantize", ("compression", "quantize")),
    ("quantization levels Q", ("compression", "levels")),
    ("link (config; null: the hardware config's)", ("link",)),
    ("SNR (dB)", ("snr_db",)),
    ("fading", ("fading",)),
    ("Rician K (dB)", ("rician_k_db",)),
    ("noiseless channel", ("noiseless",)),
    ("plan", ("plan",)),
    ("computing energy per round e_comp (J)", ("energy", "e_comp_j")),
    ("computing energy source", ("energy", "source")),
    ("seed", ("seed",)),
)
_PRIVACY_SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("privacy unit", ("privacy", "unit")),
    ("target epsilon", ("privacy", "epsilon")),
    ("delta", ("privacy", "delta")),
    ("record accountant (record unit)", ("privacy", "accountant")),
    ("device accounting (device unit)", ("privacy", "accounting")),
    ("noise", ("privacy", "noise")),
    ("noise distribution", ("privacy", "noise_distribution")),
    ("neighbouring relation", ("privacy", "relation")),
    ("example clip (record unit)", ("privacy", "example_clip")),
    ("trusted channel-noise fraction", ("privacy", "trusted_channel_noise")),
    ("secure sampling", ("privacy", "secure_sampling")),
    ("stop on budget", ("privacy", "stop_on_budget")),
)


#: The config's compression rows, replaced by what was applied when the summary says it.
_COMPRESSION_ROWS = {"sparsify": "sparsify", "kept fraction theta_s": "sparsify",
                     "quantize": "quantize", "quantization levels Q": "quantize"}


def _uplink_paths(run: RunData, key: str) -> list[tuple[Key, ...]] | None:
    """Paths of ``key`` (``l``, ``levels``) in every device entry of the summary: the
    uplinks the run resolved (scheme, config or plan), i.e. what it did; ``None`` when the
    summary does not hold them (an older or a killed run)."""
    devices = run.privacy.get("devices")
    if run.summary is None or not isinstance(devices, list) or not devices:
        return None
    if not all(isinstance(e, dict) and key in e for e in devices):
        return None
    return [("privacy", "devices", j, key) for j in range(len(devices))]


def _compression_rows(run: RunData) -> list[list[Cell]] | None:
    """Sparsification and quantization as applied: from the summary's per-device ``l`` and
    ``levels`` (the run's own decision), with the configured settings that were not
    applied named as such; ``None`` when the summary does not say."""
    l_paths, q_paths = _uplink_paths(run, "l"), _uplink_paths(run, "levels")
    d_raw = run.summary.get("d") if run.summary is not None else None
    d = as_float(d_raw)
    if l_paths is None or q_paths is None or d is None:
        return None
    scheme = str(run.scheme)
    spec = SCHEMES.get(scheme)
    src_l = label(f"{SUMMARY}: privacy.devices[*].l, d")
    src_q = label(f"{SUMMARY}: privacy.devices[*].levels")
    rows: list[list[Cell]] = []
    ls = [as_float(run.privacy["devices"][j]["l"]) for j in range(len(l_paths))]
    if any(x is not None and x < d for x in ls):
        rows.append([label("sparsify (applied)"), label("yes"), src_l])
        rows.append(_per_device_row(run, "coordinates sent l", l_paths, ls, "min", src_l))
        rows.append([label("kept fraction theta_s (config)"),
                     value_cell(run.config, CONFIG, ("compression", "theta_s")),
                     label(f"{CONFIG}: compression.theta_s")])
    else:
        rows.append([label("sparsify (applied)"),
                     label("no: every device sent all d coordinates (l = d)"), src_l])
        rows.append(_per_device_row(run, "coordinates sent l", l_paths, ls, "max", src_l))
        if run.setting("compression", "sparsify") is True:
            why = (f"scheme {scheme} does not sparsify" if spec is not None
                   and not spec.sparsify else "the run's uplinks keep l = d")
            rows += _not_applied(run, why, ("sparsify", "sparsify"),
                                 ("kept fraction theta_s", "theta_s"))
    levels = [run.privacy["devices"][j]["levels"] for j in range(len(q_paths))]
    if any(q is not None for q in levels):
        rows.append([label("quantize (applied)"), label("yes"), src_q])
        rows.append(_per_device_row(run, "quantization levels Q", q_paths, levels, "max",
                                    src_q))
    else:
        rows.append([label("quantize (applied)"), label("no: no quantizer on any upload"),
                     src_q])
        if run.setting("compression", "quantize") is True:
            why = (f"scheme {scheme} does not quantize" if spec is not None
                   and not spec.quantize else "the run's uplinks use no quantizer")
            rows += _not_applied(run, why, ("quantize", "quantize"),
                                 ("quantization levels Q", "levels"))
    return rows


def _per_device_row(
    run: RunData, name: str, paths: list[tuple[Key, ...]], values: list[Any], op: str,
    source: Cell,
) -> list[Cell]:
    """One row of a per-device uplink value: device 0's when every device has the same,
    else ``op`` (``min``, ``max``) over the devices."""
    if all(v == values[0] for v in values):
        return [label(f"{name} (every device)"), value_cell(run.summary, SUMMARY, paths[0]),
                source]
    word = "smallest" if op == "min" else "largest"
    return [label(f"{name} ({word} over devices)"), op_cell(op, SUMMARY, paths, run.summary),
            source]


def _not_applied(run: RunData, why: str, *keys: tuple[str, str]) -> list[list[Cell]]:
    """Rows of configured compression settings (``(name, compression key)``) the run did
    not apply, each saying ``why``."""
    return [[label(f"{name} (config, not applied: {why})"),
             value_cell(run.config, CONFIG, ("compression", key)),
             label(f"{CONFIG}: compression.{key}")] for name, key in keys]


def settings_table(run: RunData) -> Table:
    """The run's settings as its ``config.yaml`` holds them (and the link it used); the
    compression as applied, from ``summary.json``, where it says."""
    t = Table("settings", ["setting", "value", "source"])
    rows = list(_SETTINGS) + (list(_PRIVACY_SETTINGS) if run.private else [])
    other_unit = {"record": "(device unit)", "device": "(record unit)"}.get(str(run.unit))
    compression = _compression_rows(run)
    for name, path in rows:
        if other_unit is not None and name.endswith(other_unit):
            continue  # the setting does not apply to this run's unit
        if name in _COMPRESSION_ROWS and compression is not None:
            if name == "sparsify":
                t.rows += compression
            continue
        cell = value_cell(run.config, CONFIG, path)
        if cell.op is None:  # an older config without the key
            continue
        if name == "Rician K (dB)" and run.setting("fading") != "rician":
            continue
        if path == ("fading",) and run.applied("fading", "model") is not None:
            name = "fading (experiment config; the applied one below)"
        if path == ("scheme_class",) and run.setting("scheme_class") is None:
            continue
        if name in _COMPRESSION_ROWS:
            name += " (configured; no summary says what was applied)"
        t.rows.append([label(name), cell, label(f"{CONFIG}: {'.'.join(path)}")])
    if not run.private and run.config is not None:
        t.rows.append([label("privacy"), label("none (fedavg: no noise, no epsilon claimed)"),
                       label(f"{CONFIG}: scheme")])
    used = [(SUMMARY, run.summary), (META, run.meta)]
    for file, doc in used:
        cell = value_cell(doc, file, ("link",))
        if cell.op is not None:
            t.rows.append([label("link used"), cell, label(f"{file}: link")])
            break
    for path, what in (("radios",), "radios"), (("fading", "model"), "fading applied"), \
            (("fading", "source"), "fading imposed by"), \
            (("fading", "speed_kmh"), "speed (km/h)"), \
            (("radio_calibration", "line"), "radio calibration"), \
            (("radio_calibration", "n0_cap"), "credited N0 at most (calibrated lower bound)"), \
            (("radio_calibration", "guard_s"), "calibrated guard (s)"), \
            (("radio_calibration", "deadline_s"), "calibrated deadline (s)"):
        if run.applied(*path) is not None:
            t.rows.append([label(what), value_cell(run.summary, SUMMARY, path),
                           label(f"{SUMMARY}: {'.'.join(path)}")])
    if run.private:  # what was credited, which may be less than the configured fraction
        for key, what in (("credited_fraction", "channel-noise fraction credited"),
                          ("source", "channel noise source"), ("reason", "why none credited")):
            cell = value_cell(run.summary, SUMMARY, ("privacy", "channel_noise", key))
            if cell.op is not None and cell.text not in ("", "''"):
                t.rows.append([label(what), cell,
                               label(f"{SUMMARY}: privacy.channel_noise.{key}")])
    for kind in ("model", "dataset", "scheme"):  # a lab's own, by import string
        for key in ("import", "file", "version", "sha256"):
            cell = value_cell(run.meta, META, ("extensions", kind, key))
            if cell.op is not None:
                t.rows.append([label(f"{kind} extension {key}"), cell,
                               label(f"{META}: extensions.{kind}.{key}")])
    for key, what in (("name", "hardware config"), ("symbol_rate_hz", "symbol rate (Hz)"),
                      ("tx_power_ref_w", "reference transmit power (W)")):
        cell = value_cell(run.hw_config, "hw_config.yaml", (key,))
        if cell.op is not None:
            t.rows.append([label(what), cell, label(f"hw_config.yaml: {key}")])
    t.note = "Each value as written in the run directory's file named on its row."
    if run.config is None:
        t.note = f"No readable `{CONFIG}`: the settings are unknown. " + t.note
    return t


# -- privacy ---------------------------------------------------------------------------------


def _epsilon_label(key: str, enforced: str | None) -> str:
    name = key.removeprefix("epsilon_")
    if name == "no_channel":
        return f"ε {enforced}, no channel credit"
    if name == "device_level":
        return "ε device-level (whole data set as the unit)"
    if name == "paper":
        return "ε paper (003 Thm 1, not a DP bound)" + (" (enforced)" if enforced == name else "")
    return f"ε {name}" + (" (enforced)" if enforced == name else "")


def _epsilon_keys(entries: list[dict[str, Any]], enforced: str | None,
                  *, no_channel_beside: bool = False) -> list[str]:
    """The epsilon columns: the enforced one first, ``epsilon_no_channel`` right beside it
    when ``no_channel_beside`` (devices without noise of their own), else after the other
    accountants; the device-level one last."""
    keys: list[str] = []
    for e in entries:
        for k, v in e.items():
            if k.startswith("epsilon_") and k not in keys and as_float(v) is not None:
                keys.append(k)
    order = {f"epsilon_{enforced}": 0.0, "epsilon_no_channel": 0.5 if no_channel_beside else 2.0,
             "epsilon_device_level": 3.0}
    return sorted(keys, key=lambda k: order.get(k, 1.0))


def devices_without_noise(run: RunData) -> list[int]:
    """The devices of a private run that added no noise of their own (the summary's
    ``privacy.devices_without_noise``, :func:`aggregator.outcome.trust_fields`); ``[]``
    without a summary or with a summary that does not say."""
    silent = run.privacy.get("devices_without_noise")
    if run.privacy.get("unit") is None or not isinstance(silent, list):
        return []
    return [int(i) for i in silent if isinstance(i, int)]


def privacy_settings_table(run: RunData) -> Table:
    """Unit, delta, target, enforced accountant and trust statement of a DP run."""
    t = Table("privacy", ["", "value"])
    src = SUMMARY if run.privacy else None
    if src is not None:
        for name, key in (("unit", "unit"), ("target epsilon per device", "epsilon_target"),
                          ("delta", "delta"), ("enforced accountant", "enforced_accounting"),
                          ("trust assumption", "trust")):
            t.rows.append([label(name), value_cell(run.summary, SUMMARY, ("privacy", key))])
        silent = devices_without_noise(run)
        if silent:  # the guarantee rests on the channel's noise alone for them
            listed = run.privacy.get("devices")
            n = len(listed) if isinstance(listed, list) else 0
            every = [("privacy", "devices", i) for i in range(n)]
            t.rows += [
                [label("devices adding no noise (sigma = 0)"),
                 op_cell("count", SUMMARY,
                         [("privacy", "devices_without_noise", k) for k in range(len(silent))],
                         run.summary)],
                [label("max ε (enforced)"),
                 op_cell("max", SUMMARY, [(*e, "epsilon") for e in every], run.summary)],
                [label("max ε without channel noise (epsilon_no_channel)"),
                 op_cell("max", SUMMARY, [(*e, "epsilon_no_channel") for e in every],
                         run.summary)],
            ]
        t.note = f"From `{SUMMARY}` `privacy`."
    elif run.ledger_header is not None:
        for name, key in (("unit", "unit"), ("target epsilon per device", "epsilon_target"),
                          ("delta", "delta"), ("enforced accountant", "accounting")):
            cell = value_cell([run.ledger_header], LEDGER, (0, key))
            if key == "unit" and cell.op is None and run.unit == "device":
                cell = label("device (a device-unit ledger header names no unit)")
            t.rows.append([label(name), cell])
        t.note = f"No `{SUMMARY}`: from the header line of `{LEDGER}`."
    else:
        acc = "accountant" if run.unit == "record" else "accounting"
        for name, path in (("unit", ("privacy", "unit")),
                           ("target epsilon per device", ("privacy", "epsilon")),
                           ("delta", ("privacy", "delta")),
                           ("enforced accountant", ("privacy", acc))):
            t.rows.append([label(name), value_cell(run.config, CONFIG, path)])
        t.note = f"No `{SUMMARY}` and no ledger header: as configured in `{CONFIG}`."
    return t


def epsilon_table(run: RunData) -> Table:
    """Each device's final epsilon under every accountant, uploads and total delta."""
    enforced = run.enforced
    devices = run.privacy.get("devices")
    if isinstance(devices, list) and devices and any("epsilon" in d for d in devices):
        keys = _epsilon_keys(devices, enforced,
                             no_channel_beside=bool(devices_without_noise(run)))
        peer = any(isinstance(d.get("epsilon_peer_paper"), dict) for d in devices)
        header = ["device", "uploads", *(_epsilon_label(k, enforced) for k in keys), "δ total"]
        if peer:
            header += ["ε paper's own accounting", "δ (paper)"]
        t = Table("epsilon", header)
        for i in range(len(devices)):
            base: tuple[Key, ...] = ("privacy", "devices", i)
            row = [value_cell(run.summary, SUMMARY, (*base, "device")),
                   value_cell(run.summary, SUMMARY, (*base, "uploads"))]
            row += [value_cell(run.summary, SUMMARY, (*base, k)) for k in keys]
            row.append(value_cell(run.summary, SUMMARY, (*base, "delta_total")))
            if peer:
                row += [value_cell(run.summary, SUMMARY, (*base, "epsilon_peer_paper", k))
                        for k in ("epsilon", "delta")]
            t.rows.append(row)
        t.note = f"From `{SUMMARY}` `privacy.devices` (after the last committed round)."
        return t
    # No summary: each device's last epsilon figures in the metrics.
    keys = run.device_keys("epsilon_")
    keys = _epsilon_keys([dict.fromkeys(keys, 0.0)], enforced)
    t = Table("epsilon", ["device", "uploads", *(_epsilon_label(k, enforced) for k in keys)])
    for dev in range(run.n_devices):
        sent = [(k, j) for k, j, i, e in run.device_entries()
                if i == dev and e.get("transmitted") is True]
        row = [device_cell(run, dev),
               op_cell("count", METRICS, [(k, "devices", j, "transmitted") for k, j in sent],
                       run.rounds)]
        for key in keys:
            vals = run.device_values(key).get(dev)
            row.append(value_cell(run.rounds, METRICS, (vals[-1][0], "devices", vals[-1][1],
                                                          key)) if vals else label("no upload"))
        t.rows.append(row)
    t.note = f"From each device's last entry in `{METRICS}` (no `{SUMMARY}`)."
    return t


def epsilon_spread_table(run: RunData) -> Table | None:
    """Epsilon across devices: mean, spread (standard deviation), min and max of each
    accountant's final figure; ``None`` without a summary or with one device."""
    enforced = run.enforced
    devices = run.privacy.get("devices")
    if not (isinstance(devices, list) and len(devices) > 1
            and any("epsilon" in d for d in devices)):
        return None
    keys = _epsilon_keys(devices, enforced, no_channel_beside=bool(devices_without_noise(run)))
    t = Table("epsilon_spread", ["epsilon across devices",
                                 *(_epsilon_label(k, enforced) for k in keys)])
    for op, name in (("mean", "mean"), ("std", "spread (std)"), ("min", "min"), ("max", "max")):
        t.rows.append([label(name), *(
            op_cell(op, SUMMARY, [("privacy", "devices", i, k) for i in range(len(devices))],
                    run.summary) for k in keys)])
    t.note = (f"Over the {len(devices)} devices of `{SUMMARY}` `privacy.devices`; devices "
              "differ by their data, their channel (fading, path loss) and their uploads.")
    return t


def peer_note(run: RunData) -> str:
    """The peer paper's accounting and trust assumption (``epsilon_peer_paper``), if any."""
    for d in run.privacy.get("devices") or []:
        peer = d.get("epsilon_peer_paper") if isinstance(d, dict) else None
        if isinstance(peer, dict):
            parts = [f"**Paper's own accounting** ({peer.get('paper', 'peer system')}; unit "
                     f"{peer.get('unit', 'not recorded')}): "
                     f"{peer.get('accounting', 'not described')}."]
            if peer.get("trust"):
                parts.append(f"Trust assumption of that figure: {peer['trust']}")
            else:
                parts.append("The summary records no trust assumption of its own for that "
                             "figure.")
            return " ".join(parts)
    return ""
