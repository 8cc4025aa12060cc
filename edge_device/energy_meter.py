"""Computing energy of one device's local training in a round: measured, or the model.

``energy.source`` picks the back-end (:func:`make_meter`):

* ``"model"`` (default): the configured ``energy.e_comp_j`` (J per device per round),
  label :data:`MODEL_LABEL`; results of earlier runs do not change.
* ``"measured"``: the first available power meter; refused at start, naming each meter
  probed and why it is unavailable, when there is none.
* ``"auto"``: the first available power meter, else the model (same model label).

Power meters, probed in this order (sysfs layouts in :mod:`edge_device.power_sensors`):

* ``jetson-ina3221``: the board input rail (``VDD_IN``, ``POM_5V_IN`` on the Nano) alone
  when present, else the sum of all rails; the label says which. A background thread
  samples power every ``interval_s`` (default 0.05 s), plus one sample at start and one
  at stop; the energy is the trapezoid integral of the samples.
* ``intel-rapl``: the package-domain ``energy_uj`` counters, read at start, at stop and
  every ``interval_s`` (default 1 s) in between so that each wrap is counted.

What a measurement covers: the whole board (Jetson) or the whole CPU package(s) (RAPL),
not one simulated device. The runner trains the simulated devices of a host one after
another, so a device's measured energy is the host's energy during the time slice of
that device's training (idle and background power included); the ``source`` label says
so. Use one meter per process and one measurement at a time.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from edge_device.power_sensors import (
    MeterUnavailable,
    Rail,
    RaplDomain,
    find_ina3221_rails,
    find_rapl_domains,
    read_number,
)
from testbed.core.config.errors import ConfigError

SOURCES = ("model", "measured", "auto")
MODEL_LABEL = "modelled (configured e_comp_j)"
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")  # board input rails (total power)
JETSON_INTERVAL_S = 0.05
RAPL_INTERVAL_S = 1.0
SLICE_NOTE = "this device's training time slice"
Clock = Callable[[], float]


class EnergySourceUnavailable(ConfigError):
    """``energy.source: measured`` on a host with no usable power meter."""


class MeterReadError(RuntimeError):
    """A power meter that was available could not be read during a measurement."""


class ProbeResult(NamedTuple):
    """One probed meter: ``name``, ``available`` and a one-line ``reason``."""

    name: str
    available: bool
    reason: str


@dataclass(frozen=True)
class EnergyReading:
    """Energy of one measured interval.

    Attributes
    ----------
    energy_j
        Energy (J) over the interval.
    duration_s
        Length of the interval (s), by the meter's clock.
    source
        Label of where ``energy_j`` comes from (model or which meter and rails).
    samples
        Number of meter readings taken (0 for the model).
    """

    energy_j: float
    duration_s: float
    source: str
    samples: int


@dataclass
class Measurement:
    """Result holder of :meth:`EnergyMeter.measure`, filled in when the block ends."""

    reading: EnergyReading | None = None

    def _done(self) -> EnergyReading:
        if self.reading is None:
            raise RuntimeError("energy measurement: read it after the `with` block ends")
        return self.reading

    @property
    def energy_j(self) -> float:
        """Energy (J) of the measured block."""
        return self._done().energy_j

    @property
    def source(self) -> str:
        """Label of the energy value."""
        return self._done().source


class EnergyMeter(ABC):
    """Energy over an interval: :meth:`start`/:meth:`stop`, or :meth:`measure`.

    Parameters
    ----------
    interval_s
        Background sampling interval (s, finite > 0), or ``None`` for no background
        thread (samples at start, at stop and at each :meth:`poll` only).
    clock
        Monotonic time in seconds (``time.monotonic``); injectable for tests.
    """

    name = "meter"
    source = "meter"
    detail = ""

    def __init__(self, *, interval_s: float | None, clock: Clock = time.monotonic) -> None:
        if interval_s is not None and not (
            isinstance(interval_s, int | float) and math.isfinite(interval_s) and interval_s > 0
        ):
            raise ValueError(f"energy meter: interval_s={interval_s!r}; allowed: None or > 0")
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._running = False
        self._t0 = 0.0
        self._samples = 0
        self._error: str | None = None

    @abstractmethod
    def _reset(self, now: float) -> None:
        """Begin an interval at ``now`` (take the first reading)."""

    @abstractmethod
    def _sample(self, now: float) -> None:
        """Take one reading at ``now`` and add the energy since the previous one."""

    @abstractmethod
    def _energy_j(self) -> float:
        """Energy (J) accumulated since :meth:`_reset`."""

    def start(self) -> None:
        """Begin a measurement; raises :class:`RuntimeError` when one is running."""
        if self._running:
            raise RuntimeError(f"energy meter {self.name}: start() while already measuring")
        self._error = None
        self._samples = 0
        self._t0 = self._clock()
        self._guarded(self._reset, self._t0)
        self._running = True
        if self.interval_s is not None:
            self._halt.clear()
            self._thread = threading.Thread(
                target=self._loop, name=f"energy-{self.name}", daemon=True
            )
            self._thread.start()

    def poll(self) -> None:
        """Take one reading now (the background thread does this every ``interval_s``)."""
        if not self._running:
            raise RuntimeError(f"energy meter {self.name}: poll() without start()")
        self._guarded(self._sample, self._clock())

    def stop(self) -> EnergyReading:
        """End the measurement: final reading, then the energy since :meth:`start`.

        Raises
        ------
        MeterReadError
            When a reading failed during the interval (file gone, permission, bad value).
        """
        if not self._running:
            raise RuntimeError(f"energy meter {self.name}: stop() without start()")
        self._join()
        try:
            now = self._clock()
            self._guarded(self._sample, now)
        finally:
            self._running = False
        if self._error is not None:
            raise MeterReadError(f"energy meter {self.name}: {self._error}")
        return EnergyReading(self._energy_j(), now - self._t0, self.source, self._samples)

    def abort(self) -> None:
        """End a measurement and discard it (no error when none is running)."""
        self._join()
        self._running = False

    @contextmanager
    def measure(self) -> Iterator[Measurement]:
        """Measure the ``with`` block; the yielded holder has the result after it ends."""
        holder = Measurement()
        self.start()
        try:
            yield holder
        except BaseException:
            self.abort()
            raise
        holder.reading = self.stop()

    def _guarded(self, step: Callable[[float], None], now: float) -> None:
        with self._lock:
            if self._error is not None:
                return
            try:
                step(now)
                self._samples += 1
            except (OSError, ValueError) as exc:
                self._error = f"reading failed: {exc}"

    def _loop(self) -> None:
        assert self.interval_s is not None
        while not self._halt.wait(self.interval_s):
            self._guarded(self._sample, self._clock())

    def _join(self) -> None:
        if self._thread is not None:
            self._halt.set()
            self._thread.join()
            self._thread = None


class ModelMeter(EnergyMeter):
    """The configured computing energy ``e_comp_j`` (J) per measured interval."""

    name = "model"
    source = MODEL_LABEL

    def __init__(self, e_comp_j: float, *, note: str = "", clock: Clock = time.monotonic):
        super().__init__(interval_s=None, clock=clock)
        self.e_comp_j = float(e_comp_j)
        self.detail = note or "energy.source is 'model'"

    def _reset(self, now: float) -> None:
        pass

    def _sample(self, now: float) -> None:
        pass

    def _energy_j(self) -> float:
        return self.e_comp_j

    def reading(self, duration_s: float) -> EnergyReading:
        """The configured energy for an interval of ``duration_s`` (s), with no samples: what
        :meth:`stop` gives, for devices trained together and timed as one block."""
        return EnergyReading(self.e_comp_j, duration_s, self.source, 0)

    def stop(self) -> EnergyReading:
        return self.reading(super().stop().duration_s)


class JetsonMeter(EnergyMeter):
    """Trapezoid integral of INA3221 power samples (board input rail, else all rails)."""

    name = "jetson-ina3221"

    def __init__(
        self,
        rails: list[Rail],
        *,
        interval_s: float | None = JETSON_INTERVAL_S,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(interval_s=interval_s, clock=clock)
        total = [r for r in rails if r.name in TOTAL_RAILS]
        self.rails = total[:1] or list(rails)
        if not self.rails:
            raise ValueError("JetsonMeter: no rails")
        names = "+".join(r.name for r in self.rails)
        which = f"{names} board input" if total else f"sum of rails {names}"
        self.source = f"measured (Jetson INA3221 {which}; whole board, {SLICE_NOTE})"
        self.detail = f"INA3221 rails read: {names}"
        self._last = (0.0, 0.0)
        self._e = 0.0

    def power_w(self) -> float:
        """Power (W) now: the selected rail(s)."""
        return sum(r.power_w() for r in self.rails)

    def _reset(self, now: float) -> None:
        self._e = 0.0
        self._last = (now, self.power_w())

    def _sample(self, now: float) -> None:
        p = self.power_w()
        t0, p0 = self._last
        self._e += 0.5 * (p0 + p) * (now - t0)
        self._last = (now, p)

    def _energy_j(self) -> float:
        return self._e


class RaplMeter(EnergyMeter):
    """Sum over RAPL package domains of ``energy_uj`` increments (wraps counted)."""

    name = "intel-rapl"

    def __init__(
        self,
        domains: list[RaplDomain],
        *,
        interval_s: float | None = RAPL_INTERVAL_S,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(interval_s=interval_s, clock=clock)
        if not domains:
            raise ValueError("RaplMeter: no domains")
        self.domains = list(domains)
        names = "+".join(d.name for d in domains)
        self.source = f"measured (RAPL {names}; whole CPU package, {SLICE_NOTE})"
        self.detail = "RAPL counters: " + ", ".join(str(d.energy_uj) for d in domains)
        self._last: list[float] = []
        self._uj = 0.0

    def _reset(self, now: float) -> None:
        self._uj = 0.0
        self._last = [read_number(d.energy_uj) for d in self.domains]

    def _sample(self, now: float) -> None:
        values = [read_number(d.energy_uj) for d in self.domains]
        for d, old, new in zip(self.domains, self._last, values, strict=True):
            self._uj += new - old if new >= old else new + d.max_range_uj - old
        self._last = values

    def _energy_j(self) -> float:
        return self._uj * 1e-6


def _open_jetson(root: str | Path, interval_s: float | None, clock: Clock) -> EnergyMeter:
    try:
        rails = find_ina3221_rails(root)
    except (OSError, ValueError) as exc:
        raise MeterUnavailable(f"cannot list INA3221 rails: {exc}") from None
    if not rails:
        drivers = Path(root) / "sys/bus/i2c/drivers"
        raise MeterUnavailable(
            f"no INA3221 rails under {drivers}/ina3221x/*/iio:device*/ (JetPack 4) "
            f"or {drivers}/ina3221/*/hwmon/hwmon*/ (JetPack 5)"
        )
    meter = JetsonMeter(rails, clock=clock, **_interval(interval_s))
    try:
        meter.power_w()
    except PermissionError as exc:
        raise MeterUnavailable(f"permission denied reading {exc.filename}") from None
    except (OSError, ValueError) as exc:
        raise MeterUnavailable(f"cannot read INA3221 power: {exc}") from None
    return meter


def _open_rapl(root: str | Path, interval_s: float | None, clock: Clock) -> EnergyMeter:
    return RaplMeter(find_rapl_domains(root), clock=clock, **_interval(interval_s))


def _interval(interval_s: float | None) -> dict[str, float]:
    return {} if interval_s is None else {"interval_s": interval_s}


_OPENERS = (("jetson-ina3221", _open_jetson), ("intel-rapl", _open_rapl))


def _probe(
    root: str | Path, interval_s: float | None, clock: Clock
) -> Iterator[tuple[ProbeResult, EnergyMeter | None]]:
    """Each power meter in probe order: its probe result and the opened meter (or None)."""
    for name, opener in _OPENERS:
        try:
            meter = opener(root, interval_s, clock)
        except MeterUnavailable as exc:
            yield ProbeResult(name, False, str(exc)), None
        else:
            yield ProbeResult(name, True, meter.detail), meter


def probe_meters(root: str | Path = "/") -> list[ProbeResult]:
    """Every power meter, available or not, with a one-line reason (for diagnostics).

    The last entry is the model, always available.
    """
    results = [result for result, _ in _probe(root, None, time.monotonic)]
    return [*results, ProbeResult("model", True, "configured energy.e_comp_j")]


def make_meter(
    source: str,
    e_comp_j: float,
    root: str | Path = "/",
    *,
    interval_s: float | None = None,
    clock: Clock = time.monotonic,
) -> EnergyMeter:
    """The computing-energy meter for ``energy.source``.

    Parameters
    ----------
    source
        ``"model"``, ``"measured"`` or ``"auto"`` (see the module docstring).
    e_comp_j
        Configured computing energy per device per round (J, finite >= 0), used by the
        model (and by ``"auto"`` when no meter is available).
    root
        Directory under which ``sys/...`` is looked up (``/`` on a real host).
    interval_s
        Sampling interval (s) of a measuring meter; ``None`` for its default.
    clock
        Monotonic clock in seconds (tests inject a fake one).

    Raises
    ------
    ValueError
        For an unknown ``source`` or a bad ``e_comp_j``.
    EnergySourceUnavailable
        For ``"measured"`` when no meter is available; the message lists each meter
        probed and why it is unavailable.
    """
    if source not in SOURCES:
        raise ValueError(f"energy.source: got {source!r}; allowed: {', '.join(SOURCES)}")
    if isinstance(e_comp_j, bool) or not (
        isinstance(e_comp_j, int | float) and math.isfinite(e_comp_j) and e_comp_j >= 0
    ):
        raise ValueError(f"energy.e_comp_j: got {e_comp_j!r}; allowed: a finite value >= 0")
    if source == "model":
        return ModelMeter(e_comp_j, clock=clock)
    probed = []
    for result, meter in _probe(root, interval_s, clock):
        if meter is not None:
            return meter
        probed.append(result)
    why = "; ".join(f"{p.name}: {p.reason}" for p in probed)
    if source == "measured":
        raise EnergySourceUnavailable(
            f"energy.source: 'measured' needs a power meter and none is available ({why}); "
            "allowed here: 'model' or 'auto'"
        )
    return ModelMeter(e_comp_j, note=f"energy.source 'auto': no power meter ({why})", clock=clock)
