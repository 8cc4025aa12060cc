"""The report's figures, drawn from a :class:`~testbed.report.load.RunData` as PNG bytes.

Matplotlib's object API with the Agg canvas only (no ``pyplot``: no global figure state,
no display needed). Each function returns a :class:`Plot`, or ``None`` with nothing to
draw; the caller writes the bytes atomically.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from testbed.report.load import RunData

#: Devices drawn one line each; with more, the spread (min, median, max) is drawn instead.
MAX_DEVICE_LINES = 10
#: Rounds up to which each point gets a marker and per-device SNR is drawn as lines (more:
#: a device-by-round colour map).
MAX_MARKED_ROUNDS = 40
#: Devices up to which each gets its own bar (energy) and box (SNR); with more, one filled
#: outline (energy) and quartile bands (SNR) over the devices: the same values, drawn as a
#: few artists instead of thousands (1,000 devices' bars and boxes took 5 s to draw).
MAX_DEVICE_MARKS = 60
DPI = 110


@dataclass(frozen=True)
class Plot:
    """One figure: its file ``name`` (in ``report/``), a one-line ``caption`` saying what it
    shows, and its ``png`` bytes."""

    name: str
    caption: str
    png: bytes


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _figure(ncols: int, title: str) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(6.0 * ncols, 5.0), layout="constrained")
    axes = [fig.add_subplot(1, ncols, k + 1) for k in range(ncols)]
    fig.suptitle(title, fontsize=11)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, axes


def _axis_of_rounds(ax: Axes, run: RunData) -> None:
    """Label the x axis as rounds, integer ticks, spanning every committed round."""
    ax.set_xlabel("round (0-based)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    r = run.round_numbers
    if r.size:
        pad = max(0.5, 0.02 * (r.max() - r.min()))
        ax.set_xlim(r.min() - pad, r.max() + pad)


def _device_legend(fig: Figure, ax: Axes) -> None:
    """One legend for the figure, right of the panels (device lines would hide under it)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)


def _legend_below(ax: Axes) -> None:
    """The panel's legend under its x axis, where it hides no curve."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)


def _run_name(run: RunData) -> str:
    name = run.setting("name")
    return f"{name or run.path.name} ({run.scheme or 'scheme unknown'})"


def metric_label(run: RunData, key: str) -> str:
    """A legend label for a per-round metric key (``test_accuracy``, ``subset_loss``...)."""
    ev = (run.summary or {}).get("evaluation")
    ev = ev if isinstance(ev, dict) else {}
    every = ev.get("eval_every", run.setting("eval_every"))
    n_test = ev.get("test_samples", run.setting("eval_samples"))
    n_sub = ev.get("subset_samples", run.setting("eval_subset"))
    what = "loss" if key.endswith("_loss") else "accuracy"
    if key == "train_loss":
        return "train loss (mean of the devices' local training)"
    if key.startswith("test_"):
        cadence = (f" (every {every} rounds and the last)" if isinstance(every, int) and every > 1
                   else " (every round)" if every == 1 else "")
        size = "" if n_test is None else f", {n_test} samples"
        return f"test {what}, full test set{size}{cadence}"
    if key.startswith("subset_"):
        size = "" if n_sub is None else f", {n_sub} samples"
        same = " = the full test set" if n_sub is not None and n_sub == n_test else ""
        return f"test {what}, fixed test subset{size}{same} (every round)"
    return key.replace("_", " ")


def _metric_style(key: str, n_points: int) -> dict[str, Any]:
    """Line style of a per-round metric: the full-set evaluation as open squares over a
    dashed line, so it stays visible where the per-round subset curve coincides with it."""
    if key.startswith("test_"):
        return {"ls": "--", "marker": "s", "ms": 7, "mfc": "none", "mew": 1.5, "lw": 1.0}
    return {"ls": "-", "marker": "." if n_points <= MAX_MARKED_ROUNDS else None, "ms": 5,
            "lw": 1.4}


def accuracy_loss_plot(run: RunData) -> Plot | None:
    """Loss (train and any evaluated) and accuracy per round; ``None`` without rounds."""
    loss_keys = [k for k in run.round_keys("_loss")]
    acc_keys = run.round_keys("_accuracy")
    if not loss_keys and not acc_keys:
        return None
    fig, (ax_l, ax_a) = _figure(2, f"Learning curves: {_run_name(run)}")
    positive = []
    for key in loss_keys:
        r, v, _ = run.round_series(key)
        ax_l.plot(r, v, label=metric_label(run, key), **_metric_style(key, len(r)))
        positive += [x for x in v if np.isfinite(x)]
    targets = (run.summary or {}).get("loss_targets") or []
    for t in targets:
        if isinstance(t, dict) and isinstance(t.get("target"), int | float):
            ax_l.axhline(t["target"], color="grey", ls=":", lw=1)
            ax_l.annotate(f"loss target {t['target']:g} (train loss, window {t.get('window')})",
                          (0.01, t["target"]), xycoords=("axes fraction", "data"),
                          fontsize=7, color="grey", va="bottom")
    if positive and min(positive) > 0 and max(positive) / min(positive) > 30:
        ax_l.set_yscale("log")
    _axis_of_rounds(ax_l, run)
    ax_l.set_ylabel("loss (mean cross-entropy, nats)")
    ax_l.set_title("Loss per round")
    if loss_keys:
        _legend_below(ax_l)
    for key in acc_keys:
        r, v, _ = run.round_series(key)
        ax_a.plot(r, v, label=metric_label(run, key), **_metric_style(key, len(r)))
    ax_a.set_ylim(0, 1)
    _axis_of_rounds(ax_a, run)
    ax_a.set_ylabel("accuracy (fraction of test samples correct)")
    ax_a.set_title("Test accuracy")
    if acc_keys:
        _legend_below(ax_a)
    else:
        ax_a.text(0.5, 0.5, "no evaluation recorded", ha="center", transform=ax_a.transAxes)
    caption = "Loss and accuracy per round: " + ", ".join(
        metric_label(run, k) for k in [*loss_keys, *acc_keys]
    )
    return Plot("accuracy_loss.png", caption, _png(fig))


def _device_lines(ax: Axes, rounds: np.ndarray, matrix: np.ndarray, *, step: bool) -> None:
    """One line per device (few devices) or the min-median-max spread (many)."""
    n = matrix.shape[0]
    draw = "steps-post" if step else "default"
    if n <= MAX_DEVICE_LINES:
        for i in range(n):
            ok = np.isfinite(matrix[i])
            ax.plot(rounds[ok], matrix[i][ok], drawstyle=draw, lw=1.2, label=f"device {i}",
                    marker="." if matrix.shape[1] <= MAX_MARKED_ROUNDS else None, ms=4)
        return
    with np.errstate(all="ignore"):
        cols = [c for c in range(matrix.shape[1]) if np.isfinite(matrix[:, c]).any()]
        sub = matrix[:, cols]
        r = rounds[cols]
        ax.fill_between(r, np.nanmin(sub, axis=0), np.nanmax(sub, axis=0), alpha=0.25,
                        step="post" if step else None, label=f"min to max over {n} devices")
        ax.plot(r, np.nanmedian(sub, axis=0), drawstyle=draw, lw=1.5, label="median device")


def epsilon_plot(run: RunData) -> Plot | None:
    """Each device's cumulative epsilon per round under every accountant in the metrics,
    with the target; ``None`` without DP or without epsilon figures."""
    keys = run.device_keys("epsilon_")
    if not run.private or not keys:
        return None
    enforced = run.enforced
    keys.sort(key=lambda k: k != f"epsilon_{enforced}")  # the enforced accountant first
    keys = keys[:3]
    unit, delta, target = run.unit, run.delta, run.target
    setting = f"unit {unit}" + ("" if delta is None else f", delta {delta:g}")
    fig, axes = _figure(len(keys), f"Per-device privacy loss: {_run_name(run)}\n{setting}, "
                        f"budget enforced with the {enforced} accountant")
    rounds = run.round_numbers
    for ax, key in zip(axes, keys, strict=True):
        name = key.removeprefix("epsilon_")
        matrix = run.device_matrix(key, carry=True)
        _device_lines(ax, rounds, matrix, step=False)
        if matrix.shape[0] > 1 and np.allclose(matrix, matrix[0], rtol=1e-9, atol=0):
            ax.text(0.98, 0.03, f"all {matrix.shape[0]} devices have the same epsilon "
                    "(their lines coincide)", transform=ax.transAxes, fontsize=8, ha="right",
                    va="bottom")
        if target is not None:
            ax.axhline(target, color="red", ls="--", lw=1.2, label=f"target epsilon {target:g}")
        role = "enforced" if name == enforced else "reported only"
        if name == "paper":
            role += "; 003 Thm 1, not a DP bound"
        ax.set_title(f"epsilon, {name} accountant ({role})", fontsize=10)
        _axis_of_rounds(ax, run)
        ax.set_ylabel(f"cumulative epsilon ({unit}-level, delta {delta:g})"
                      if delta is not None else f"cumulative epsilon ({unit}-level)")
        ax.set_ylim(bottom=0)
    _device_legend(fig, axes[0])
    names = ", ".join(k.removeprefix("epsilon_") for k in keys)
    caption = (f"Cumulative epsilon of each device after each round ({unit} unit, "
               f"accountants {names}; enforced {enforced}) with the target line")
    return Plot("epsilon.png", caption, _png(fig))


def energy_per_device(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """Computing and radio energy per device (J, summed over the run), shape
    ``(n_devices,)`` each: the summary's totals, else summed from the metrics."""
    s = run.summary or {}
    comp, comm = s.get("energy_comp_j_per_device"), s.get("energy_comm_j_per_device")
    if isinstance(comp, list) and isinstance(comm, list) and len(comp) == len(comm):
        return np.asarray(comp, dtype=float), np.asarray(comm, dtype=float)
    n = run.n_devices
    comp_m, comm_m = np.zeros(n), np.zeros(n)
    for key, out in (("energy_comp_j", comp_m), ("energy_comm_j", comm_m)):
        for dev, vals in run.device_values(key).items():
            if 0 <= dev < n:
                out[dev] = sum(v for _, _, v in vals)
    return comp_m, comm_m


def comp_source(run: RunData) -> str:
    """Whether computing energy was measured or modelled, in the run's own words."""
    src = (run.summary or {}).get("energy_comp_source")
    if isinstance(src, str):
        return src
    found = {d.get("energy_comp_source") for _, _, _, d in run.device_entries()}
    found.discard(None)
    return ", ".join(sorted(str(x) for x in found)) or "not recorded"


def _bars(ax: Axes, height: np.ndarray, bottom: np.ndarray, *, color: str,
          label: str) -> None:
    """One bar per device from ``bottom`` (shapes ``(n,)``); above :data:`MAX_DEVICE_MARKS`
    devices one filled outline of the same bars (a missing value draws nothing)."""
    n = height.size
    if n <= MAX_DEVICE_MARKS:
        ax.bar(np.arange(n), height, bottom=bottom, color=color, label=label)
        return
    base = np.nan_to_num(bottom, nan=0.0)
    top = base + np.nan_to_num(height, nan=0.0)
    ax.stairs(top, np.arange(n + 1) - 0.5, baseline=base, fill=True, color=color,
              label=label)


def _device_ticks(ax: Axes, devices: list[int]) -> None:
    """Every device's index up to 20 devices, else integer ticks the axis has room for."""
    if len(devices) <= 20:
        ax.set_xticks(devices)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))


def _quartile_bands(ax: Axes, data: list[np.ndarray], keep: list[int]) -> None:
    """Each kept device's minimum, quartiles and maximum (``data[i]``: its values), drawn
    over the devices as bands and lines instead of one box each."""
    x = np.asarray(keep, dtype=float)
    q = np.array([np.percentile(data[i], [0, 25, 50, 75, 100]) for i in keep])
    ax.fill_between(x, q[:, 0], q[:, 4], step="mid", color="tab:blue", alpha=0.15,
                    label="min to max")
    ax.fill_between(x, q[:, 1], q[:, 3], step="mid", color="tab:blue", alpha=0.4,
                    label="quartiles")
    ax.step(x, q[:, 2], where="mid", color="tab:blue", lw=1.0, label="median")
    ax.legend(fontsize=8, loc="best")


def energy_plot(run: RunData) -> Plot | None:
    """Stacked computing + radio energy per device, and the radio energy alone (it is
    often orders of magnitude smaller); ``None`` with no energy recorded."""
    comp, comm = energy_per_device(run)
    if comp.size == 0 or not np.any(np.isfinite(comp + comm)):
        return None
    n = comp.size
    fig, (ax_t, ax_c) = _figure(2, f"Energy per device over the run: {_run_name(run)}")
    src = comp_source(run)
    _bars(ax_t, comp, np.zeros(n), color="tab:blue", label=f"computing ({src})")
    _bars(ax_t, comm, comp, color="tab:orange", label="communication (radio)")
    ax_t.set_title("Computing + communication energy (stacked)", fontsize=10)
    _bars(ax_c, comm, np.zeros(n), color="tab:orange", label="communication (radio)")
    total = float(np.nansum(comp + comm))
    share = f"{100 * float(np.nansum(comm)) / total:.3g}% of the total" if total > 0 else ""
    ax_c.set_title(f"Communication (radio) energy alone ({share})" if share else
                   "Communication (radio) energy alone", fontsize=10)
    if not np.any(comm > 0):
        ax_c.set_ylim(0, 1)
        ax_c.text(0.5, 0.5, "no radio energy recorded\n(no upload went over the radio)",
                  ha="center", va="center", transform=ax_c.transAxes)
    for ax, top in ((ax_t, np.nanmax(comp + comm)), (ax_c, np.nanmax(comm))):
        ax.set_xlabel("device")
        ax.set_ylabel("energy (J), summed over all rounds")
        _device_ticks(ax, list(range(n)))
        if np.isfinite(top) and top > 0:
            ax.set_ylim(0, 1.25 * top)  # room for the legend above the bars
        ax.legend(fontsize=8, loc="upper center", ncol=2)
    caption = (f"Energy per device summed over the run: computing ({src}) stacked with "
               f"communication, and communication alone")
    return Plot("energy.png", caption, _png(fig))


def snr_plot(run: RunData) -> Plot | None:
    """Per-device receive SNR per round and its distribution; ``None`` when no upload
    carries an SNR (fedavg over a control plane, secure aggregation)."""
    matrix = run.device_matrix("snr_db")
    finite = np.isfinite(matrix)
    if not finite.any():
        return None
    n = matrix.shape[0]
    fig, (ax_r, ax_b) = _figure(2, f"Receive SNR per upload: {_run_name(run)}")
    shown = np.where(finite, matrix, np.nan)
    rounds = run.round_numbers
    if n <= MAX_DEVICE_LINES and matrix.shape[1] <= MAX_MARKED_ROUNDS:
        _device_lines(ax_r, rounds, shown, step=False)
        _axis_of_rounds(ax_r, run)
        ax_r.set_ylabel("SNR at the aggregator (dB)")
        _device_legend(fig, ax_r)
    else:
        image = ax_r.imshow(
            np.ma.masked_invalid(shown), aspect="auto", interpolation="nearest",
            origin="lower", cmap="viridis",
            extent=(rounds.min() - 0.5, rounds.max() + 0.5, -0.5, n - 0.5),
        )
        fig.colorbar(image, ax=ax_r, label="SNR at the aggregator (dB)")
        _axis_of_rounds(ax_r, run)
        ax_r.set_ylabel("device")
        ax_r.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax_r.grid(False)
    ax_r.set_title("SNR of each device's upload per round (blank: no upload)", fontsize=10)
    data = [matrix[i][finite[i]] for i in range(n)]
    keep = [i for i in range(n) if data[i].size]
    if n <= MAX_DEVICE_MARKS:
        ax_b.boxplot([data[i] for i in keep], positions=keep, widths=0.6)
        title = "Distribution over the run's uploads (box: quartiles)"
    else:
        _quartile_bands(ax_b, data, keep)
        title = "Per device over the run's uploads (quartiles, median, range)"
    ax_b.set_xlabel("device")
    ax_b.set_ylabel("SNR at the aggregator (dB)")
    ax_b.set_title(title, fontsize=10)
    _device_ticks(ax_b, keep)
    applied = (run.summary or {}).get("fading")
    fading = (applied.get("model") if isinstance(applied, dict) and applied.get("model")
              else run.setting("fading"))
    by = f", {applied['source']}" if isinstance(applied, dict) and applied.get("source") else ""
    caption = (f"Receive SNR (dB) of each upload per round and its distribution per device "
               f"(fading: {fading if fading is not None else 'not recorded'}{by})")
    return Plot("snr.png", caption, _png(fig))


#: The figures of a report, in report order.
PLOTTERS = (accuracy_loss_plot, epsilon_plot, energy_plot, snr_plot)
#: Every file name a plotter may write (a stale one of a figure not drawn is removed).
PLOT_NAMES = ("accuracy_loss.png", "epsilon.png", "energy.png", "snr.png")
