"""The run's summary (``summary.json``): how it ended, accuracy, energy, and every device's
privacy with its unit, accountant, delta and trust; all read back from the run directory's
files, so a resumed run's summary covers every round."""

from __future__ import annotations

from typing import Any

import numpy as np

from aggregator.outcome import exit_code, trust_fields
from aggregator.peer_accounting import peer_report
from aggregator.solver.calibration import uploads_to_target
from aggregator.state import RunState
from testbed.core.calibration_status import calibration_summary
from testbed.core.config.emulated import EMULATED_LABEL
from testbed.core.config.link import link_name
from testbed.core.radio_fallback import radio_kind

#: The summary's ``radios`` of each kind of radio a ``usrp``-link run can use.
RADIOS = {"usrp": "usrp", "virtual": "virtual", "emulated": EMULATED_LABEL}


def radios_of(state: RunState) -> str | None:
    """The summary's ``radios``: ``usrp`` (real USRPs), ``virtual`` (a virtual radio lab)
    or :data:`~testbed.core.config.emulated.EMULATED_LABEL` (the emulation fallback);
    ``None`` off the ``usrp`` link (no radios)."""
    kind = radio_kind(state.cfg, state.hw)
    return RADIOS[kind] if kind else None


def applied_fading(state: RunState) -> dict[str, Any]:
    """The fading the run's channel applied and who imposed it: on virtual or emulated
    radios the virtual air's (``virtual_air.fading``, at its speed); on real USRPs the
    hardware config's (the medium, e.g. a darkroom's channel emulator; ``null``: not
    stated, the real channel's); on a simulated link the hardware config's, else the
    experiment's (:func:`testbed.core.links.link_settings`)."""
    hw, cfg = state.hw, state.cfg
    kind = radio_kind(cfg, hw)
    if kind in ("virtual", "emulated"):
        air = hw.virtual_air
        return {"model": air.fading, "source": "virtual air (virtual_air.fading)",
                "speed_kmh": air.speed_kmh if air.fading != "none" else None}
    if kind == "usrp":
        return {"model": hw.fading, "source": "hardware config (the medium)" if hw.fading
                else "the real channel (not stated)"}
    if hw.fading:
        return {"model": hw.fading, "source": "hardware config"}
    return {"model": cfg.fading, "source": "experiment config"}


def summary(
    state: RunState, status: str, reason: str, wall: float, *, workers: int,
    energy_source: str, startup_s: float | None = None, batch_devices: int = 1,
) -> dict[str, Any]:
    """The run's ``summary.json``: how it ended, accuracy, energy and every listed device's
    privacy (epsilon with its unit, accountant, delta and trust), read from the run
    directory's files (the truth after any restart).

    ``wall``: seconds of this process's rounds (``wall_time_s``). ``startup_s``: seconds
    from this process's start to its first round (imports, config, data, model, link;
    :func:`testbed.core.process.process_clock.process_age_s`), kept as ``startup_s`` when known.
    ``workers``, ``batch_devices``: how the devices trained (worker processes; devices
    trained together, ``compute.batch_devices`` resolved)."""
    metrics = state.rundir.metrics()
    completed = len(metrics)  # the files are the truth (one line per committed round)
    evals = [m for m in metrics if "test_accuracy" in m]
    energy = np.zeros(state.cfg.devices)
    energy_comp = np.zeros(state.cfg.devices)
    lost = np.zeros(state.cfg.devices, dtype=int)
    for m in metrics:
        for dev in m.get("devices", []):
            energy[dev["device"]] += dev.get("energy_comm_j", 0.0)
            energy_comp[dev["device"]] += dev.get("energy_comp_j", 0.0)
            lost[dev["device"]] += int(bool(dev.get("lost")))
    listed = reported_devices(state, metrics)
    devices = []
    for i in listed:
        up = state.uplinks[i]
        entry: dict[str, Any] = {
            "device": i,
            "mechanism": up.mechanism,
            "sigma": up.sigma,
            "noise_variance": up.sigma**2,
            "alpha": up.alpha,
            "l": up.l,
            "levels": up.levels,
            "trusted_channel_noise": up.trusted,
            "expected_power_w": (
                None
                if up.expected_power is None
                else up.expected_power * state.hw.tx_power_ref_w
            ),
        }
        if state.record:
            rs = state.record[i]
            entry |= {
                "noise": rs.noise,
                "noise_multiplier": rs.target_noise_multiplier,
                "sampling_rate": rs.sampling_rate,
                "secure_sampling": rs.amplified,
                "example_clip": rs.example_clip,
                "dataset_size": rs.dataset_size,
                "channel_credited": rs.credit_channel,
            }
        if state.book is not None:
            entry |= state.book.report(i)
            if state.record:
                peer = peer_report(state.cfg, state.record[i], int(entry["uploads"]))
                if peer is not None:
                    entry["epsilon_peer_paper"] = peer
        else:
            entry["epsilon"] = None
        devices.append(entry)
    out: dict[str, Any] = {
        "status": status,
        **({"radios": radios} if (radios := radios_of(state)) else {}),
        **({"radio_calibration": cal} if (cal := calibration_summary(
            state.hw, link_name(state.cfg, state.hw))) else {}),
        "fading": applied_fading(state),
        "reason": reason,
        "exit_code": exit_code(status, completed, state.cfg),
        "scheme": state.cfg.scheme,
        "link": link_name(state.cfg, state.hw),
        "rounds_completed": completed,
        "rounds_planned": state.cfg.rounds,
        "d": state.d,
        "final_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "final_accuracy_round": evals[-1]["round"] if evals else None,
        "best_accuracy": max((m["test_accuracy"] for m in evals), default=None),
        "final_subset_accuracy": next(
            (m["subset_accuracy"] for m in reversed(metrics) if "subset_accuracy" in m), None
        ),
        "evaluation": {
            "test_samples": len(state.data.y_test),
            "subset_samples": None if state.eval_index is None else len(state.eval_index),
            "eval_every": state.cfg.eval_every,
        },
        "workers": workers,
        "batch_devices": batch_devices,
        "final_train_loss": metrics[-1]["train_loss"] if metrics else None,
        "lost_uploads": int(lost.sum()),
        "lost_uploads_per_device": lost.tolist(),
        "loss_targets": loss_target_energy(
            metrics, state.cfg.loss_targets, state.cfg.loss_target_window
        ),
        "energy_comm_j_per_device": energy.tolist(),
        "energy_comp_j_per_device": energy_comp.tolist(),
        "energy_comp_source": energy_source,
        "privacy": {
            "unit": state.unit,
            "epsilon_target": state.cfg.privacy.epsilon if state.book is not None else None,
            "delta": state.cfg.privacy.delta,
            "enforced_accounting": state.cfg.privacy.enforced if state.unit else None,
            **state.delta_bound,
            **trust_fields(state.cfg, state.hw, state.unit, state.uplinks,
                            state.record),
            "devices": devices,
            **(
                {"population": state.cfg.devices, "devices_never_asked":
                 state.cfg.devices - len(listed)}
                if state.cfg.sample_devices is not None
                else {}
            ),
        },
        "wall_time_s": round(wall, 3),
    }
    if startup_s is not None:
        out["startup_s"] = round(startup_s, 3)
    if state.cfg.scheme == "zcdp-secagg":
        out["secagg_rounds_abandoned"] = sum(
            1 for m in metrics if m.get("secagg", {}).get("status") == "abandoned")
    return out


def reported_devices(state: RunState, metrics: list[dict[str, Any]]) -> list[int]:
    """Devices the summary lists: every device, or with ``sample_devices`` those asked
    in a committed round or holding a ledger record (so every upload's epsilon is
    reported, and the summary does not grow with devices never asked)."""
    if state.cfg.sample_devices is None:
        return list(range(state.cfg.devices))
    seen = {dev["device"] for m in metrics for dev in m.get("devices", [])}
    if state.book is not None:
        seen |= {event.device for event in state.book.ledger.events()}
    return sorted(seen)


def loss_target_energy(
    metrics: list[dict[str, Any]], targets: list[float], window: int = 1
) -> list[dict[str, Any]]:
    """For each target training loss: the first round whose training loss, averaged over the
    last ``window`` rounds (:func:`~aggregator.solver.calibration.uploads_to_target`), is at or
    below it, and the energy (J, computing plus radio, summed over devices) spent up to and
    including that round; ``round`` and ``energy_j`` are ``None`` when never reached."""
    losses = [m.get("train_loss", float("nan")) for m in metrics]
    energy = np.cumsum([
        sum(d.get("energy_comm_j", 0.0) + d.get("energy_comp_j", 0.0)
            for d in m.get("devices", []))
        for m in metrics
    ])
    out = []
    for target in targets:
        k = uploads_to_target(losses, target, window)
        out.append({
            "target": target,
            "window": window,
            "round": None if k is None else metrics[k - 1]["round"],
            "energy_j": None if k is None else float(energy[k - 1]),
        })
    return out
