"""The virtual air as an object: take bursts, render the receiver's stream, keep the log.

:class:`VirtualAir` holds the model (paths, timeline, log) and no sockets and no clock loop:
:mod:`testbed.lab.air.process` drives it in real time over ZeroMQ (``testbed air``), and
tests drive it in process, faster than real time, with :meth:`VirtualAir.render_chunk`.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from radio.link_budget import budget_snr_db, sample_noise_power_w
from radio.units import ratio_to_db
from radio.virtual_wire import BurstHeader, ChunkHeader, decode_burst
from testbed.core.config.hardware import HardwareConfig
from testbed.lab.air.log import AirLog
from testbed.lab.air.paths import PathChannel, serial_seed
from testbed.lab.air.timeline import HeldBurst, Timeline

#: Longest burst taken (s of samples); a longer one is dropped (``too_long``).
MAX_BURST_S = 10.0
#: Furthest ahead of the render cursor a burst may start (s); further: ``too_far_ahead``
#: (a transmitter clock far off would otherwise hold its samples for ever).
MAX_AHEAD_S = 60.0
#: Released bursts remembered for the ``overlaps`` of late arrivals.
RECENT_BURSTS = 256
#: Reasons a burst is dropped (keys of the summary's ``dropped_by_reason``).
DROP_REASONS = ("malformed", "unknown_serial", "sample_rate", "out_of_band", "empty",
                "too_long", "too_far_ahead", "past")


@dataclass
class AirCounts:
    """What the air did (the summary line of the log).

    Attributes
    ----------
    bursts
        Bursts put on the air (late ones included).
    dropped
        Bursts dropped, all reasons.
    dropped_by_reason
        Per reason of :data:`DROP_REASONS`.
    late
        Bursts that arrived after their start was rendered (only their tail went on air).
    late_samples
        Samples those lost.
    chunks_sent, chunks_dropped
        Stream chunks sent, and dropped (no receiver connected, or it fell behind).
    samples_rendered
        Air samples rendered.
    max_lag_s
        Largest delay (s) of a chunk's rendering after it was due.
    """

    bursts: int = 0
    dropped: int = 0
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    late: int = 0
    late_samples: int = 0
    chunks_sent: int = 0
    chunks_dropped: int = 0
    samples_rendered: int = 0
    max_lag_s: float = 0.0


def _stderr(message: str) -> None:
    print(f"air: {message}", file=sys.stderr, flush=True)


def _header_problem(h: BurstHeader) -> str | None:
    """Why a decoded header is unusable (wrong types, non-finite numbers), or ``None``."""
    if not isinstance(h.serial, str):
        return f"serial={h.serial!r}; allowed: a string"
    for key in ("t_true_s", "sample_rate_hz", "center_freq_hz", "gain_db", "power_w"):
        v = getattr(h, key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return f"{key}={v!r}; allowed: a finite number"
    if isinstance(h.n, bool) or not isinstance(h.n, int) or h.n < 0:
        return f"n={h.n!r}; allowed: an integer >= 0"
    return None


class VirtualAir:
    """Every virtual transmitter's bursts on one sample timeline, plus thermal noise.

    Parameters
    ----------
    hw
        A virtual hardware config (``hw.virtual``): its ``virtual_air`` section, sample rate
        ``fs = hw.sample_rate_hz``, carrier and symbol rate.
    log_dir
        Where ``air.jsonl`` goes (:mod:`testbed.lab.air.log`); ``None``: no log file.
    t0_true_s
        True time (s) of air sample 0; default: now (:func:`time.time`).
    warn
        Where one-line notices (late and dropped bursts) go; default: stderr.

    Raises
    ------
    ValueError
        ``hw`` is not a virtual config.
    """

    def __init__(self, hw: HardwareConfig, *, log_dir: str | Path | None = None,
                 t0_true_s: float | None = None,
                 warn: Callable[[str], None] = _stderr) -> None:
        if not hw.virtual:
            raise ValueError(f"usrp.rx_args: got '{hw.usrp.rx_args}', a real USRP; the virtual "
                             "air needs a virtual config (type=virtual,serial=NAME)")
        self.hw = hw
        self.air = hw.virtual_air
        self.fs = float(hw.sample_rate_hz)
        self.t0 = float(time.time() if t0_true_s is None else t0_true_s)
        if not math.isfinite(self.t0):
            raise ValueError(f"t0_true_s: got {t0_true_s}; allowed: a finite time (s)")
        self.noise_power_w = sample_noise_power_w(self.air.temperature_k,
                                                  self.air.noise_figure_db, self.fs)
        #: Samples per stream chunk (at least 1).
        self.chunk_samples = max(1, round(self.air.chunk_s * self.fs))
        self.paths: dict[str, PathChannel] = {}
        for p in self.air.paths:
            seed = self.air.fading_seed
            rng = (np.random.default_rng(serial_seed(seed, p.serial)) if seed is not None
                   else np.random.default_rng())
            self.paths[p.serial] = PathChannel(
                p, self.air, center_freq_hz=hw.center_freq_hz, sample_rate_hz=self.fs,
                t0_true_s=self.t0, fading_rng=rng)
        self.timeline = Timeline(self.noise_power_w)
        self.log = AirLog(log_dir)
        self.counts = AirCounts()
        self.warn = warn
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_BURSTS)
        self._closed = False

    # ------------------------------------------------------------------ budget

    def snr_db(self, rx_power_w: float) -> float:
        """``Es/N0`` (dB) of a frame received at ``rx_power_w`` (W) in this air."""
        return budget_snr_db(rx_power_w, self.hw.symbol_rate_hz, self.air.temperature_k,
                             self.air.noise_figure_db)

    def start_line(self) -> str:
        """The one line ``testbed air`` prints at start: addresses, rate, per-path budget
        (``Es/N0`` of a burst radiated at ``tx_power_ref_w``, before fading)."""
        ref = self.hw.tx_power_ref_w
        parts = [f"{s} {pc.gain_db:.1f} dB -> {self.snr_db(ref * pc.gain):.1f} dB Es/N0"
                 for s, pc in self.paths.items()]
        noise_dbm = ratio_to_db(self.noise_power_w) + 30
        return (f"air: bursts at {self.air.burst_address}, stream at "
                f"{self.air.stream_address}, {self.fs:.0f} S/s, t0 {self.t0:.6f}, noise "
                f"{noise_dbm:.1f} dBm/sample, fading {self.air.fading}; paths (at "
                f"{ref:g} W): " + ("; ".join(parts) or "none"))

    # ------------------------------------------------------------------ bursts

    def _drop(self, reason: str, detail: str, header: BurstHeader | None) -> dict[str, Any]:
        c = self.counts
        c.dropped += 1
        c.dropped_by_reason[reason] = c.dropped_by_reason.get(reason, 0) + 1
        line: dict[str, Any] = {"dropped": reason, "detail": detail}
        if header is not None:
            line.update(serial=header.serial, t_true_s=header.t_true_s, n=header.n)
        self.log.write(line)
        who = f"burst from {header.serial} at {header.t_true_s:.6f} " if header else "burst "
        self.warn(f"{who}dropped ({reason}): {detail}")
        return line

    def take(self, frames: list[bytes]) -> dict[str, Any]:
        """Decode a burst message (:func:`radio.virtual_wire.decode_burst`) and put it on the
        air; a message that does not decode is dropped (``malformed``). Returns the burst's
        record (a dropped one has ``dropped``)."""
        try:
            header, samples = decode_burst(frames)
        except (ValueError, TypeError, KeyError) as exc:
            return self._drop("malformed", str(exc), None)
        return self.add_burst(header, samples)

    def add_burst(self, header: BurstHeader, samples: np.ndarray) -> dict[str, Any]:
        """Put one burst on the air through its transmitter's path.

        Parameters
        ----------
        header
            Its header (serial, true start time, rate, carrier, power).
        samples
            Radiated amplitude (``|x|^2`` in W), ``complex``, shape ``(header.n,)``.

        Returns
        -------
        dict
            The burst's record (see :mod:`testbed.lab.air.log`), still filling in
            (``overlaps``) while it is held; a dropped burst's has ``dropped``.
        """
        problem = _header_problem(header)
        if problem is not None:
            return self._drop("malformed", problem, None)
        x = np.asarray(samples)
        if x.ndim != 1 or x.size != header.n:
            return self._drop("malformed", f"samples of shape {x.shape}; the header says "
                              f"n={header.n}", header)
        pc = self.paths.get(header.serial)
        if pc is None:
            return self._drop("unknown_serial", f"serial {header.serial!r} has no "
                              f"virtual_air.paths entry (listed: {', '.join(self.paths)})",
                              header)
        if abs(header.sample_rate_hz - self.fs) > 1e-9 * self.fs:
            return self._drop("sample_rate", f"sample_rate_hz={header.sample_rate_hz:g}; the "
                              f"air runs at {self.fs:g} S/s", header)
        cfo_extra = header.center_freq_hz - self.hw.center_freq_hz
        if abs(pc.path.cfo_hz + cfo_extra) >= self.fs / 2:
            return self._drop("out_of_band", f"carrier {header.center_freq_hz:g} Hz (path "
                              f"cfo {pc.path.cfo_hz:g} Hz) is outside the receiver's "
                              f"{self.fs:g} S/s band at {self.hw.center_freq_hz:g} Hz", header)
        if header.n == 0:
            return self._drop("empty", "n=0", header)
        if header.n > MAX_BURST_S * self.fs:
            return self._drop("too_long", f"n={header.n}; allowed: at most {MAX_BURST_S:g} s "
                              f"({MAX_BURST_S * self.fs:.0f} samples)", header)
        s = pc.start_index(header.t_true_s)
        ahead = (s - self.timeline.next_index) / self.fs
        if ahead > MAX_AHEAD_S:
            return self._drop("too_far_ahead", f"starts {ahead:.1f} s after the last rendered "
                              f"sample; allowed: at most {MAX_AHEAD_S:g} s", header)
        if s + header.n <= self.timeline.next_index:
            gone = (self.timeline.next_index - s - header.n) / self.fs
            return self._drop("past", f"ends {gone:.6f} s before the first unrendered "
                              "sample", header)
        rx = pc.receive(x, header.t_true_s, cfo_extra_hz=cfo_extra)
        record: dict[str, Any] = {
            "serial": header.serial, "t_true_s": header.t_true_s, "start_index": s,
            "n": header.n, "power_w": header.power_w, "rx_power_w": rx.rx_power_w,
            "path_gain_db": pc.gain_db, "fading_gain_db": rx.fading_gain_db,
            "budget_snr_db": self.snr_db(rx.rx_power_w), "overlaps": [],
            "late_to_air_samples": 0,
            # how long before the air rendered its first sample it arrived (s; the margin
            # its transmitter's lead left; negative: late, see late_to_air_samples)
            "ahead_of_air_s": (s - self.timeline.next_index) / self.fs,
        }
        rendered = self.timeline.next_index
        if self.timeline.add(rx.first, rx.samples, record) is None:
            return self._drop("past", "only the interpolator's tail was unrendered", header)
        self.counts.bursts += 1
        lost = min(header.n, max(0, math.ceil(rendered - s)))
        if lost:
            record["late_to_air_samples"] = lost
            self.counts.late += 1
            self.counts.late_samples += lost
            self.warn(f"late_to_air: burst from {header.serial} at {header.t_true_s:.6f} lost "
                      f"its first {lost} samples (already rendered)")
        self._mark_overlaps(record)
        return record

    def _mark_overlaps(self, record: dict[str, Any]) -> None:
        """Name the bursts overlapping ``record`` in time in each other's ``overlaps`` (a
        burst already logged only in the new one's)."""
        s, e = record["start_index"], record["start_index"] + record["n"]
        held = [hb.record for hb in self.timeline.held if hb.record is not record]
        for other in held + list(self._recent):
            if other["start_index"] < e and s < other["start_index"] + other["n"]:
                record["overlaps"].append(other["serial"])
                if any(other is h for h in held):
                    other["overlaps"].append(record["serial"])

    def _release(self, hb: HeldBurst) -> None:
        rec = hb.record
        rec["overlaps"] = sorted(set(rec["overlaps"]))
        self.log.write(rec)
        self._recent.append(rec)

    # ------------------------------------------------------------------ rendering

    @property
    def next_index(self) -> int:
        """Air index of the next sample to render."""
        return self.timeline.next_index

    def index_time(self, index: float) -> float:
        """True time (s) of air index ``index``."""
        return self.t0 + index / self.fs

    def chunks_due(self, t_true_s: float) -> int:
        """Whole chunks whose last sample lies before ``t_true_s`` (s) and are not rendered."""
        avail = (t_true_s - self.t0) * self.fs - self.timeline.next_index
        return max(0, math.floor(avail / self.chunk_samples))

    def note_lag(self, t_true_s: float) -> None:
        """Record how late (s) the next chunk's rendering starts if it starts at render time
        ``t_true_s`` (the air renders time ``t`` at host time ``t + render_delay_s``)."""
        due = self.index_time(self.timeline.next_index + self.chunk_samples)
        self.counts.max_lag_s = max(self.counts.max_lag_s, t_true_s - due)

    def render_chunk(self, n: int | None = None) -> tuple[ChunkHeader, np.ndarray]:
        """Render the next ``n`` samples (default one chunk): noise plus every burst on them.

        Returns
        -------
        header
            Its :class:`radio.virtual_wire.ChunkHeader`.
        samples
            ``complex64`` amplitude at the receiver (``|y|^2`` in W), shape ``(n,)``.
        """
        m = self.chunk_samples if n is None else int(n)
        if m < 1:
            raise ValueError(f"n: got {n}; allowed: an integer >= 1 (samples)")
        index, y, released = self.timeline.render(m)
        for hb in released:
            self._release(hb)
        self.counts.samples_rendered += m
        return ChunkHeader(index=index, t0_true_s=self.t0, sample_rate_hz=self.fs, n=m), y

    def render_until(self, t_true_s: float) -> list[tuple[ChunkHeader, np.ndarray]]:
        """Render every whole chunk that ends before ``t_true_s`` (s)."""
        return [self.render_chunk() for _ in range(self.chunks_due(t_true_s))]

    # ------------------------------------------------------------------ end

    def summary(self) -> dict[str, Any]:
        """The counts so far, with ``t0_true_s`` and ``sample_rate_hz``."""
        out = asdict(self.counts)
        out.update(t0_true_s=self.t0, sample_rate_hz=self.fs,
                   noise_power_w=self.noise_power_w)
        return out

    def close(self) -> dict[str, Any]:
        """Log the bursts still held (``"unrendered_samples"`` says how many of theirs never
        went on air), then the summary line; close the log. Idempotent; returns the summary."""
        if not self._closed:
            self._closed = True
            for hb in self.timeline.held:
                hb.record["unrendered_samples"] = hb.end - max(hb.first,
                                                               self.timeline.next_index)
                self._release(hb)
            self.timeline.held = []
            self.log.write({"summary": self.summary()})
            self.log.close()
        return self.summary()
