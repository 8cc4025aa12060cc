"""The markdown report of a calibration, with a figure per measurement.

``testbed radio calibrate --out CAL.yaml`` writes ``CAL.md`` beside it and the figures in
``CAL-figures/``: received power against DAC amplitude (the transmit power and where it
compresses), burst timing error against ``tx_time`` over the run (drift), carrier offset per
burst, and the receiver's noise per capture block against its lower bound (and, on virtual
radios, the true N0). :func:`summary_lines` is the same content as lines for the terminal.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from testbed.core.config.calibration import Calibration, DeviceCalibration
from testbed.radio_calibration.measure import Measurement
from testbed.radio_calibration.truth import TruthCheck


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _fmt(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "not measured"
    return f"{value * scale:.{digits}g}{(' ' + unit) if unit else ''}"


def _power_figure(m: Measurement, path: Path) -> None:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    for d in m.calibration.devices:
        if not d.amplitudes:
            continue
        a = np.asarray(d.amplitudes)
        p = 10 * np.log10(np.maximum(np.asarray(d.rx_powers), 1e-300))
        line = ax.plot(a, p, "o-", label=f"device {d.device}")[0]
        ref = p[0] + 20 * np.log10(a / a[0])  # a^2 through the smallest point
        ax.plot(a, ref, ":", color=line.get_color())
        if d.compression_amplitude is not None:
            ax.axvline(d.compression_amplitude, color=line.get_color(), alpha=0.4)
    ax.axvline(m.calibration.devices[0].tx_amplitude if m.calibration.devices else 0,
               color="k", ls="--", lw=0.8, label="configured tx_amplitude")
    ax.set_xscale("log")
    ax.set_xlabel("DAC amplitude of a unit-power stream")
    ax.set_ylabel("received power (dB, receiver full scale)")
    ax.set_title("Power ladder (dotted: a^2; vertical: compression)")
    ax.legend(fontsize=7)
    _save(fig, path)


def _timing_figure(m: Measurement, path: Path) -> None:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    for raw in m.devices:
        found = [b for b in raw.bursts if b.found]
        if not found:
            continue
        t = np.array([b.expected_rx_s - found[0].expected_rx_s for b in found])
        e = np.array([b.timing_error_s for b in found]) * 1e6
        ax.plot(t, e - e[0], "o-", ms=3, label=f"device {raw.device} (offset {e[0]:.2f} us)")
    ax.set_xlabel("receiver time since the first burst (s)")
    ax.set_ylabel("timing error minus the first burst's (us)")
    ax.set_title("Burst start against tx_time (slope: drift)")
    ax.legend(fontsize=7)
    _save(fig, path)


def _cfo_figure(m: Measurement, path: Path) -> None:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    for raw in m.devices:
        cfo = [b.cfo_hz for b in raw.bursts if b.found]
        if cfo:
            ax.plot(range(len(cfo)), cfo, "o-", ms=3, label=f"device {raw.device}")
    ax.set_xlabel("burst")
    ax.set_ylabel("carrier offset (Hz)")
    ax.set_title("Carrier offset per burst")
    ax.legend(fontsize=7)
    _save(fig, path)


def _noise_figure(m: Measurement, path: Path, true_n0_sample: dict[float, float]) -> None:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    rx = m.calibration.receiver
    for gain, blocks in m.noise_blocks.items():
        line = ax.plot(blocks, ".", ms=3, label=f"blocks at {gain:g} dB")[0]
        floor = rx.floor_at(gain) if rx is not None else None
        if floor is not None:
            ax.axhline(floor.n0_sample, color=line.get_color(), lw=1, label="estimate")
            ax.axhline(floor.n0_sample_lower, color=line.get_color(), ls="--", lw=1,
                       label=f"lower bound ({floor.confidence:g})")
        if gain in true_n0_sample:
            ax.axhline(true_n0_sample[gain], color="k", ls=":", lw=1, label="true (virtual)")
    ax.set_xlabel("capture block (10^4 samples)")
    ax.set_ylabel("noise power per sample (receiver units)")
    ax.set_title("Receiver noise floor")
    ax.legend(fontsize=7)
    _save(fig, path)


def device_line(d: DeviceCalibration) -> str:
    """One device's calibration in one line."""
    ref = (f"tx_power_ref_w {_fmt(d.tx_power_ref_w, 'W')} "
           f"[{_fmt(d.tx_power_ref_w_lower)}, {_fmt(d.tx_power_ref_w_upper)}]"
           if d.tx_power_ref_w is not None else
           f"received {_fmt(d.rx_power_w, 'W')} (tx power not measured: no --attenuation-db)")
    comp = ("no compression up to " + _fmt(max(d.amplitudes)) if d.amplitudes else "no ladder") \
        if d.compression_amplitude is None else f"compresses at {d.compression_amplitude:.4g}"
    return (f"device {d.device}: {ref}; {comp}; CFO {_fmt(d.cfo_hz, 'Hz')}; timing error "
            f"mean {_fmt(d.timing_error_mean_s, 'us', 1e6)}, spread "
            f"{_fmt(d.timing_error_std_s, 'us', 1e6)}, worst "
            f"{_fmt(d.timing_error_worst_s, 'us', 1e6)} over {d.bursts} bursts; drift "
            f"{_fmt(d.drift_ppm, 'ppm')} +- {_fmt(d.drift_ppm_uncertainty, 'ppm', digits=2)}; "
            f"clock offset to the receiver {_fmt(d.clock_offset_s, 's', digits=9)}"
            + ("" if d.pps_seconds_off is None else f"; PPS seconds off {d.pps_seconds_off}")
            + f"; late burst {d.late_burst.replace('_', ' ')}")


def summary_lines(cal: Calibration, checks: list[TruthCheck] | None = None) -> list[str]:
    """The calibration for a person, one line per device, the receiver, guard, deadline,
    problems, unmeasured quantities and (virtual radios) the truth checks."""
    lines = [f"calibration of '{cal.hw_config}' on {cal.radios} radios, "
             f"{cal.written_utc.isoformat(timespec='seconds')}"]
    lines += [device_line(d) for d in cal.devices]
    rx = cal.receiver
    if rx is not None:
        for f in rx.noise:
            w = ("" if f.n0_w_per_hz is None else
                 f", {f.n0_dbm_per_hz:.2f} dBm/Hz (lower bound "
                 f"{10 * math.log10(max(f.n0_lower_w_per_hz or 1e-300, 1e-300)) + 30:.2f})")
            lines.append(f"receiver at {f.rx_gain_db:g} dB: N0 {f.n0_sample:.4g} per sample, "
                         f"lower bound {f.n0_sample_lower:.4g} ({f.confidence:g}){w}")
        margin = _fmt(rx.realtime_margin_s, "s", digits=3)
        lines.append(f"receiver stream: {rx.overflows} overflow(s), {rx.lost_samples} samples "
                     f"lost in {rx.capture_s:.1f} s; real-time margin {margin}")
    lines.append(f"guard {_fmt(cal.guard_s, 'ms', 1e3)}; deadline {_fmt(cal.deadline_s, 's')}")
    lines += [f"PROBLEM: {p}" for p in cal.problems]
    lines += [f"not measured: {u}" for u in cal.unmeasured]
    lines += [c.line() for c in checks or []]
    return lines


def write_report(m: Measurement, md_path: Path, *, checks: list[TruthCheck] | None = None,
                 true_n0_sample: dict[float, float] | None = None,
                 cal_path: Path | None = None) -> list[Path]:
    """Write the markdown report ``md_path`` and its figures (``<stem>-figures/``).

    Returns the files written (the report first).
    """
    cal = m.calibration
    fig_dir = md_path.parent / f"{md_path.stem}-figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    figures = {
        "power": (fig_dir / "power_ladder.png", "Received power against DAC amplitude"),
        "timing": (fig_dir / "timing.png", "Timing error of timed bursts"),
        "cfo": (fig_dir / "cfo.png", "Carrier offset"),
        "noise": (fig_dir / "noise.png", "Receiver noise floor"),
    }
    _power_figure(m, figures["power"][0])
    _timing_figure(m, figures["timing"][0])
    _cfo_figure(m, figures["cfo"][0])
    _noise_figure(m, figures["noise"][0], true_n0_sample or {})
    out = [f"# Radio calibration: {cal.hw_config} ({cal.radios} radios)", "",
           f"Measured {cal.written_utc.isoformat(timespec='seconds')} by `testbed radio "
           f"calibrate`" + (f"; written to `{cal_path}` (include it with `calibration: "
                            f"{cal_path.name}` in the hardware config)." if cal_path else "."),
           "", "## Transmitters", "",
           "| device | tx_power_ref_w (W) | interval | gain offset (dB) | compresses at | "
           "CFO (Hz) | timing mean / spread / worst (us) | drift (ppm) | late burst |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in cal.devices:
        out.append(
            f"| {d.device} | {_fmt(d.tx_power_ref_w)} | [{_fmt(d.tx_power_ref_w_lower)}, "
            f"{_fmt(d.tx_power_ref_w_upper)}] | {_fmt(d.gain_offset_db, digits=3)} | "
            f"{_fmt(d.compression_amplitude)} | {_fmt(d.cfo_hz, digits=5)} | "
            f"{_fmt(d.timing_error_mean_s, scale=1e6)} / {_fmt(d.timing_error_std_s, scale=1e6)}"
            f" / {_fmt(d.timing_error_worst_s, scale=1e6)} | {_fmt(d.drift_ppm, digits=3)} +- "
            f"{_fmt(d.drift_ppm_uncertainty, digits=2)} | {d.late_burst.replace('_', ' ')} |")
    out += ["", "## Receiver, clocks, guard and deadline", ""]
    out += [f"* {line}" for line in summary_lines(cal)[1 + len(cal.devices):]
            if not line.startswith(("PROBLEM", "not measured"))]
    out += ["", "## Problems found", ""]
    out += [f"* {p}" for p in cal.problems] or ["* none"]
    out += ["", "## Not measured", ""]
    out += [f"* {u}" for u in cal.unmeasured] or ["* nothing"]
    if checks:
        out += ["", "## Against the virtual truth", "", "| check | measured | true | "
                "tolerance | |", "| --- | --- | --- | --- | --- |"]
        for c in checks:
            who = "receiver" if c.device is None else f"device {c.device}"
            out.append(f"| {who} {c.quantity} | {_fmt(c.measured, digits=6)} | "
                       f"{c.truth:.6g} | {c.tolerance:.3g} | {'ok' if c.ok else 'FAIL'} |")
    out += ["", "## Figures", ""]
    for path, title in figures.values():
        out += [f"### {title}", "", f"![{title}]({fig_dir.name}/{path.name})", ""]
    md_path.write_text("\n".join(out) + "\n")
    return [md_path, *(p for p, _ in figures.values())]
