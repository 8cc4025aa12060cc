"""Virtual USRPs: the device args that name one, and its clock.

Device args ``type=virtual,serial=NAME`` (in ``usrp.devices[i].tx_args`` or ``usrp.rx_args``)
make the ``tx``/``rx`` flowgraphs build stand-ins for ``uhd.usrp_sink``/``uhd.usrp_source``
that send their bursts to, and take their samples from, the virtual air
(``testbed air``; docs/virtual_lab.md). Nothing here imports UHD, GNU Radio or numpy: the
flowgraphs (``/usr/bin/python3``) and the testbed (its venv) both import this module.

Keys of a virtual device's args (all but ``type`` and ``serial`` optional):

``serial``
    The device's name (letters, digits, ``_``, ``-``): the air's ``virtual_air.paths``
    entry of a transmitter is found by it.
``clock_offset_s``
    Device time minus host time at power-on (s); ``set_time_now`` / ``set_time_next_pps``
    replace it, as on a USRP.
``drift_ppm``
    The device clock's frequency error against the host's (ppm): device time advances
    ``1 + drift_ppm 1e-6`` seconds per host second. Only transmitters may drift: the air's
    sample timeline is the receiver's sample clock.
``host_clock_error_s``
    How far the clock of the host this device hangs on reads from true time (s), as the
    flowgraph sees it when it latches the host's UNIX second at a PPS edge
    (``--time-epoch host-pps``): a host clock more than half a second off latches the wrong
    second, the whole-second PPS disagreement ``testbed radio calibrate`` names (tests).
``full_scale_w``
    Power (W) a full-scale stream (``|s| = 1``) radiates at 0 dB gain (transmitter), or the
    input power (W) that reads as full scale at 0 dB gain (receiver; default 1e-3, 0 dBm).
    Transmitter default 1.25: with ``usrp.tx_amplitude`` 0.02, 30 dB of gain and 5 samples
    per symbol, a unit-power symbol stream radiates 0.1 W (``hw_configs/virtual_lab.yaml``;
    the analog uploads' peaks reach ~12x their RMS, so the DAC needs that headroom).
``max_power_w``
    The transmitter's largest mean output over a burst (W); a burst above it leaves
    scaled down to it (the amplifier's limit) and is counted.
``min_gain_db``, ``max_gain_db``, ``gain_step_db``
    The gain range and step: a requested gain is clipped and rounded to it, and read back
    as applied (a WBX: 0 .. 31.5 dB in 0.5 dB).

Receiver only, for tests (injected overflows: docs/virtual_lab.md):

``gaps``
    How many gaps the receiver makes in its stream (an integer >= 0; default 0: none).
    Each drops ``gap_samples`` of the air's samples, is counted as an overflow, and the
    first sample after it carries a new ``rx_time`` tag, as a USRP's overflow does.
``gap_samples``
    Samples dropped per gap (an integer >= 1; default 1000).
``gap_every_s``
    Seconds of stream between gaps (> 0; default 1.0): the first gap ``gap_every_s`` after
    the stream's first sample, then every ``gap_every_s`` of samples delivered.
``gap_timing``
    ``regular`` (default: exactly every ``gap_every_s``) or ``random`` (exponential
    intervals of mean ``gap_every_s``: gaps at random times).
``gap_seed``
    Seed of the random gap times (an integer >= 0; default: fresh from the OS).

Time base: "true time" is the host's UNIX clock (:func:`time.time`) of the process the
device runs in; on one machine every virtual device and the air share it. PPS edges (with a
time source ``external``/``gpsdo``/``mimo``) fall on whole true seconds, seen by every
virtual device alike: the shared PPS of an OctoClock.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Keys a virtual device's args may hold.
VIRTUAL_KEYS = (
    "type", "serial", "clock_offset_s", "drift_ppm", "host_clock_error_s", "full_scale_w",
    "max_power_w",
    "min_gain_db", "max_gain_db", "gain_step_db",
    "gaps", "gap_samples", "gap_every_s", "gap_timing", "gap_seed",
)
#: Keys of a virtual receiver's injected gaps (a transmitter refuses them).
GAP_KEYS = ("gaps", "gap_samples", "gap_every_s", "gap_timing", "gap_seed")
#: Allowed ``gap_timing`` values.
GAP_TIMINGS = ("regular", "random")
#: Most gaps, and most samples per gap, a receiver injects.
MAX_GAPS = 1_000_000
MAX_GAP_SAMPLES = 100_000_000
_SERIAL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Largest clock drift accepted (ppm): far beyond any crystal, to catch unit mistakes.
MAX_DRIFT_PPM = 1000.0


def split_args(args: str) -> dict[str, str]:
    """Device args ``"type=virtual, serial=edge0"`` as a mapping (keys lower-cased).

    Raises
    ------
    ValueError
        A comma-separated part that is not ``key=value``.
    """
    out: dict[str, str] = {}
    for part in args.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"'{part.strip()}' is not key=value")
        out[key.strip().lower()] = value.strip()
    return out


def is_virtual(args: str) -> bool:
    """Whether device args name a virtual device (``type=virtual``, also in args that do not
    parse: :meth:`VirtualArgs.parse` then says what is wrong, rather than UHD)."""
    return "type=virtual" in "".join(args.split()).lower()


@dataclass(frozen=True)
class VirtualArgs:
    """A virtual device's parameters (the module docstring lists the keys)."""

    serial: str
    clock_offset_s: float = 0.0
    drift_ppm: float = 0.0
    host_clock_error_s: float = 0.0
    full_scale_w: float | None = None
    max_power_w: float = 0.1
    min_gain_db: float = 0.0
    max_gain_db: float = 31.5
    gain_step_db: float = 0.5
    gaps: int = 0
    gap_samples: int = 1000
    gap_every_s: float = 1.0
    gap_timing: str = "regular"
    gap_seed: int | None = None

    @classmethod
    def parse(cls, args: str) -> VirtualArgs:
        """Read ``type=virtual,serial=NAME[,key=value...]``.

        Raises
        ------
        ValueError
            Not ``type=virtual``, no or a bad ``serial``, an unknown key, or a value out of
            range; the message names the key, the value and what is allowed.
        """
        try:
            kv = split_args(args)
        except ValueError as exc:
            raise ValueError(f"device args '{args}': {exc}") from None
        if kv.get("type", "").lower() != "virtual":
            raise ValueError(f"device args '{args}': not a virtual device (needs type=virtual)")
        unknown = sorted(set(kv) - set(VIRTUAL_KEYS))
        if unknown:
            raise ValueError(f"device args '{args}': unknown key(s) {', '.join(unknown)}; "
                             f"allowed for type=virtual: {', '.join(VIRTUAL_KEYS)}")
        serial = kv.get("serial", "")
        if not _SERIAL.match(serial):
            raise ValueError(f"device args '{args}': serial={serial!r}; allowed: 1-64 letters, "
                             "digits, '_' or '-' (type=virtual needs a serial)")

        def num(key: str, default: float, lo: float, hi: float, *, strict_lo: bool = False
                ) -> float:
            if key not in kv:
                return default
            try:
                v = float(kv[key])
            except ValueError:
                v = math.nan
            ok = math.isfinite(v) and (v > lo if strict_lo else v >= lo) and v <= hi
            if not ok:
                rel = ">" if strict_lo else ">="
                raise ValueError(f"device args '{args}': {key}={kv[key]}; allowed: a number "
                                 f"{rel} {lo:g} and <= {hi:g}")
            return v

        def count(key: str, default: int, lo: int, hi: int) -> int:
            if key not in kv:
                return default
            try:
                v = int(kv[key])
            except ValueError:
                v = lo - 1
            if not lo <= v <= hi:
                raise ValueError(f"device args '{args}': {key}={kv[key]}; allowed: an integer "
                                 f">= {lo} and <= {hi}")
            return v

        timing = kv.get("gap_timing", "regular").lower()
        if timing not in GAP_TIMINGS:
            raise ValueError(f"device args '{args}': gap_timing={kv['gap_timing']}; allowed: "
                             f"{', '.join(GAP_TIMINGS)}")
        out = cls(
            serial=serial,
            clock_offset_s=num("clock_offset_s", 0.0, -1e10, 1e10),
            drift_ppm=num("drift_ppm", 0.0, -MAX_DRIFT_PPM, MAX_DRIFT_PPM),
            host_clock_error_s=num("host_clock_error_s", 0.0, -1e6, 1e6),
            full_scale_w=(num("full_scale_w", 1.0, 0.0, 1e6, strict_lo=True)
                          if "full_scale_w" in kv else None),
            max_power_w=num("max_power_w", 0.1, 0.0, 1e3, strict_lo=True),
            min_gain_db=num("min_gain_db", 0.0, -100.0, 200.0),
            max_gain_db=num("max_gain_db", 31.5, -100.0, 200.0),
            gain_step_db=num("gain_step_db", 0.5, 0.0, 10.0),
            gaps=count("gaps", 0, 0, MAX_GAPS),
            gap_samples=count("gap_samples", 1000, 1, MAX_GAP_SAMPLES),
            gap_every_s=num("gap_every_s", 1.0, 0.0, 1e6, strict_lo=True),
            gap_timing=timing,
            gap_seed=count("gap_seed", 0, 0, 2**63 - 1) if "gap_seed" in kv else None,
        )
        if out.max_gain_db < out.min_gain_db:
            raise ValueError(f"device args '{args}': max_gain_db={out.max_gain_db} is below "
                             f"min_gain_db={out.min_gain_db}")
        return out

    def gap_problem(self, sample_rate_hz: float, *, receiver: bool) -> str:
        """Why the gap keys do not suit this device (empty: they do): only a receiver
        injects gaps, and a gap must be shorter than the stream between two."""
        given = [k for k in GAP_KEYS if getattr(self, k) != getattr(VirtualArgs, k)]
        if not receiver and given:
            return (f"{', '.join(given)} on a transmitter (serial={self.serial}); allowed only "
                    "in a virtual receiver's args (usrp.rx_args)")
        if receiver and self.gaps and self.gap_every_s * sample_rate_hz <= self.gap_samples:
            return (f"gap_every_s={self.gap_every_s:g} is {self.gap_every_s * sample_rate_hz:.0f} "
                    f"samples at {sample_rate_hz:g} S/s; allowed: more than "
                    f"gap_samples={self.gap_samples}")
        return ""

    @property
    def tx_full_scale_w(self) -> float:
        """W a full-scale stream radiates at 0 dB gain (default 1.25)."""
        return 1.25 if self.full_scale_w is None else self.full_scale_w

    @property
    def rx_full_scale_w(self) -> float:
        """Input W that reads as full scale at 0 dB gain (default 1e-3: 0 dBm)."""
        return 1e-3 if self.full_scale_w is None else self.full_scale_w

    def applied_gain(self, gain_db: float) -> float:
        """The gain (dB) the device applies for a requested one: clipped, then rounded to
        the step (as UHD does with a WBX)."""
        g = min(max(float(gain_db), self.min_gain_db), self.max_gain_db)
        if self.gain_step_db > 0:
            g = self.min_gain_db + round((g - self.min_gain_db) / self.gain_step_db) \
                * self.gain_step_db
        return min(g, self.max_gain_db)


class VirtualClock:
    """A device clock: offset and drift against the host's, set as a USRP's is.

    Device time at true (host) time ``h`` is ``base + (h - h_base)(1 + drift_ppm 1e-6)``.
    At power-on ``base = h0 + clock_offset_s`` at ``h_base = h0``. ``set_time_now(T)`` makes
    it ``T`` now; ``set_time_next_pps(T)`` makes it ``T`` at the next whole true second (the
    shared PPS edge). Thread-safe.

    Parameters
    ----------
    clock_offset_s, drift_ppm
        As in :class:`VirtualArgs`.
    host
        The true clock (s); :func:`time.time` unless a test passes its own.
    """

    def __init__(self, clock_offset_s: float = 0.0, drift_ppm: float = 0.0,
                 host: Callable[[], float] = time.time) -> None:
        self.host = host
        self.rate = 1.0 + drift_ppm * 1e-6
        h0 = float(host())
        self._base = h0 + clock_offset_s
        self._h_base = h0
        self._pending: tuple[float, float] | None = None  # (edge true time, device time)
        self._lock = threading.Lock()

    def _settle(self, h: float) -> None:
        if self._pending is not None and h >= self._pending[0]:
            self._h_base, self._base = self._pending
            self._pending = None

    def at(self, h: float) -> float:
        """Device time (s) at true time ``h`` (s)."""
        with self._lock:
            self._settle(float(self.host()))
            if self._pending is not None and h >= self._pending[0]:
                edge, base = self._pending
                return base + (h - edge) * self.rate
            return self._base + (h - self._h_base) * self.rate

    def now(self) -> float:
        """Device time now (s): ``get_time_now``."""
        return self.at(float(self.host()))

    def to_true(self, t_device: float) -> float:
        """True time (s) at which the device clock reads ``t_device`` (s)."""
        with self._lock:
            self._settle(float(self.host()))
            if self._pending is not None:
                edge, base = self._pending
                if t_device >= base:
                    return edge + (t_device - base) / self.rate
            return self._h_base + (t_device - self._base) / self.rate

    def set_time_now(self, t_device: float) -> None:
        """``set_time_now``: the device time is ``t_device`` from now."""
        with self._lock:
            self._base, self._h_base, self._pending = float(t_device), float(self.host()), None

    def set_time_next_pps(self, t_device: float) -> None:
        """``set_time_next_pps``: the device time is ``t_device`` at the next PPS edge."""
        with self._lock:
            h = float(self.host())
            self._settle(h)
            self._pending = (float(math.floor(h) + 1.0), float(t_device))

    def time_last_pps(self) -> float:
        """``get_time_last_pps``: the device time (s) latched at the last PPS edge."""
        h = float(self.host())
        edge = float(math.floor(h))
        with self._lock:
            self._settle(h)
            return self._base + (edge - self._h_base) * self.rate
