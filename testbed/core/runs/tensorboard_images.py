"""The images of a run's TensorBoard event files (:mod:`testbed.core.runs.tensorboard_log`):
the virtual air's burst timeline and the density of a recorded upload's received
constellation, as PNG.

Both draw aggregates only: a burst's time, length, transmitter and received power; a 2-D
histogram of received samples (no sample value can be read back from it).
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

#: Recording stems (``radio.sigmf_io.recording_stem``): device and round.
_STEM = re.compile(r"dev(\d+)_round(\d+)\.sigmf-meta$")
#: Bins per axis of the constellation's density.
CONSTELLATION_BINS = 64


def _png(fig: Any) -> tuple[bytes, int, int]:
    """A matplotlib figure as PNG bytes with its width and height (closed after)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72)
    width, height = (int(round(v)) for v in fig.get_size_inches() * 72)
    plt.close(fig)
    return buf.getvalue(), width, height


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _figure(width_in: float, height_in: float) -> tuple[Any, Any]:
    return _pyplot().subplots(figsize=(width_in, height_in), layout="constrained")


def timeline_png(bursts: list[dict[str, Any]], last_round: list[dict[str, Any]],
                 sample_rate_hz: float | None,
                 round_index: int) -> tuple[bytes, int, int] | None:
    """The air's bursts (lines of ``air.jsonl``) on a time axis, one row per transmitter:
    above, ``bursts`` (the newest, since the run began or the previous image); below,
    ``last_round`` (those logged during the last round: its TDMA slots). A bar per burst (its
    length at ``sample_rate_hz``), coloured by its received power, outlined red where it
    overlapped another; dropped bursts as red crosses. ``None``: no burst with a time."""
    timed = _timed(bursts)
    if not timed:
        return None
    recent = _timed(last_round)
    serials = sorted({str(b.get("serial", "?")) for b in timed + recent})
    powers = [_dbm(b) for b in timed + recent]
    known = [p for p in powers if p is not None]
    scale = (min(known), max(known)) if known else (0.0, 1.0)
    panels = 2 if recent else 1
    fig, axes = _pyplot().subplots(panels, 1, figsize=(8.0, panels * (1.0 + 0.3 * len(serials))),
                             layout="constrained", squeeze=False)
    _bars(axes[0][0], timed, serials, scale, sample_rate_hz,
          f"virtual air: the {len(timed)} newest bursts up to round {round_index}")
    if recent:
        _bars(axes[1][0], recent, serials, scale, sample_rate_hz,
              f"round {round_index}: {len(recent)} bursts (TDMA slots)")
    axes[-1][0].set_xlabel(f"s (colour: received power {scale[0]:.0f}..{scale[1]:.0f} dBm; "
                           "red: overlap or dropped)")
    return _png(fig)


def _timed(bursts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in bursts if isinstance(b.get("t_true_s"), int | float)
            and math.isfinite(b["t_true_s"])]


def _dbm(b: dict[str, Any]) -> float | None:
    p = b.get("rx_power_w")
    return 10 * math.log10(p) + 30 if isinstance(p, int | float) and p > 0 else None


def _bars(ax: Any, bursts: list[dict[str, Any]], serials: list[str],
          scale: tuple[float, float], sample_rate_hz: float | None, title: str) -> None:
    t0 = min(float(b["t_true_s"]) for b in bursts)
    row = {s: k for k, s in enumerate(serials)}
    cmap = _cmap()
    lo, hi = scale
    for b in bursts:
        y = row[str(b.get("serial", "?"))]
        x = float(b["t_true_s"]) - t0
        if b.get("dropped"):
            ax.plot([x], [y], "x", color="red", markersize=8)
            continue
        n = b.get("n")
        width = float(n) / sample_rate_hz if sample_rate_hz and isinstance(n, int | float) \
            else 0.0
        dbm = _dbm(b)
        level = (dbm - lo) / (hi - lo or 1.0) if dbm is not None else 0.0
        ax.barh(y, max(width, 1e-4), left=x, height=0.6, color=cmap(level),
                edgecolor="red" if b.get("overlaps") else "none", linewidth=1.5)
    ax.set_yticks(range(len(serials)), serials)
    ax.set_title(title, fontsize=10)


def _cmap() -> Any:
    import matplotlib

    return matplotlib.colormaps["viridis"]


def newest_recording(directory: Path) -> tuple[Path, int, int] | None:
    """The newest round's recording of ``directory`` (``record: true``): its meta file,
    device and round; ``None``: none."""
    if not directory.is_dir():
        return None
    best: tuple[int, int, Path] | None = None
    for path in directory.glob("*.sigmf-meta"):
        m = _STEM.search(path.name)
        if m is None:
            continue
        key = (int(m.group(2)), -int(m.group(1)), path)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return None
    return best[2], -best[1], best[0]


def constellation_png(recording: tuple[Path, int, int]) -> tuple[bytes, int, int] | None:
    """The density (log scale) of one recorded upload's received complex samples in a
    :data:`CONSTELLATION_BINS`-square histogram, normalised by their RMS. ``None``: the
    recording cannot be read."""
    from radio.sigmf_io import read_recording

    meta, device, round_index = recording
    try:
        rec = read_recording(meta.parent, device, round_index)
    except (OSError, ValueError, KeyError):
        return None
    x = np.asarray(rec.samples, dtype=np.complex64)
    if x.size == 0:
        return None
    rms = float(np.sqrt(np.mean(np.abs(x) ** 2))) or 1.0
    z = x / rms
    edge = 3.0
    hist, _, _ = np.histogram2d(z.real, z.imag, bins=CONSTELLATION_BINS,
                                range=[[-edge, edge], [-edge, edge]])
    fig, ax = _figure(4.5, 4.2)
    ax.imshow(np.log1p(hist.T), origin="lower", extent=(-edge, edge, -edge, edge),
              cmap="magma", aspect="equal")
    ax.set_xlabel("I / RMS")
    ax.set_ylabel("Q / RMS")
    ax.set_title(f"received baseband density, device {device}, round {round_index}")
    return _png(fig)
