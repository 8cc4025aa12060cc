"""Power sensors in sysfs: Jetson INA3221 rails and Intel RAPL package counters.

Discovery and one reading, nothing else; :mod:`edge_device.energy_meter` integrates them.
Every path is under ``root`` (``/`` on a real host) so that tests can build fake trees.

* Jetson, JetPack 4 (TX2, Nano, Xavier; ``ina3221x`` driver):
  ``sys/bus/i2c/drivers/ina3221x/*/iio:device*/rail_name_N`` names the rail and
  ``in_powerN_input`` is its power (mW).
* Jetson, JetPack 5 (Orin; mainline ``ina3221`` hwmon driver):
  ``sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/`` with ``inN_label``, ``inN_input`` (bus
  voltage, mV) and ``currN_input`` (mA) for N = 1..3 (``in4..7`` are shunt voltages);
  channels labelled ``NC`` or disabled (``inN_enable`` = 0) are skipped.
* RAPL: ``sys/class/powercap/intel-rapl:N`` with ``name`` = ``package-*``,
  ``energy_uj`` (µJ, wraps to 0 after ``max_energy_range_uj``). ``energy_uj`` is readable
  by root only since Linux 5.10 (CVE-2020-8694).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path


class MeterUnavailable(Exception):
    """A power meter cannot be used on this host; the message is the reason."""


def _read(path: Path) -> str:
    """Text of one sysfs file (one place, so tests can simulate permission errors)."""
    return path.read_text()


def read_number(path: Path) -> float:
    """The number a sysfs file starts with (units as the file's; ``"32760 ma"`` -> 32760).

    Raises
    ------
    OSError
        When the file cannot be read (``PermissionError`` included).
    ValueError
        When it is empty or does not start with a finite number; names the file.
    """
    words = _read(path).split()
    try:
        value = float(words[0]) if words else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{path}: {' '.join(words)[:40]!r} is not a finite number")
    return value


@dataclass(frozen=True)
class Rail:
    """One INA3221 channel: ``name`` and how to read its power (W)."""

    name: str
    power_mw: Path | None = None  # JetPack 4: power in mW
    volt_mv: Path | None = None  # JetPack 5: bus voltage in mV ...
    curr_ma: Path | None = None  # ... and current in mA

    def power_w(self) -> float:
        """Power (W) now."""
        if self.power_mw is not None:
            return read_number(self.power_mw) * 1e-3
        assert self.volt_mv is not None and self.curr_ma is not None
        return read_number(self.volt_mv) * read_number(self.curr_ma) * 1e-6


def find_ina3221_rails(root: str | Path = "/") -> list[Rail]:
    """All INA3221 rails under ``root`` (both JetPack layouts), sorted by path."""
    drivers = Path(root) / "sys/bus/i2c/drivers"
    rails: list[Rail] = []
    for label_file in sorted(drivers.glob("ina3221x/*/iio:device*/rail_name_*")):
        n = label_file.name.removeprefix("rail_name_")
        power = label_file.parent / f"in_power{n}_input"
        if n.isdigit() and power.exists():
            rails.append(Rail(_read(label_file).strip() or f"rail {n}", power_mw=power))
    for curr in sorted(drivers.glob("ina3221/*/hwmon/hwmon*/curr[123]_input")):
        d, n = curr.parent, curr.name[4]
        label_file, enable = d / f"in{n}_label", d / f"in{n}_enable"
        label = _read(label_file).strip() if label_file.exists() else f"{d.name} ch{n}"
        if label.upper() == "NC" or (enable.exists() and _read(enable).strip() == "0"):
            continue
        rails.append(Rail(label, volt_mv=d / f"in{n}_input", curr_ma=curr))
    return rails


@dataclass(frozen=True)
class RaplDomain:
    """One RAPL package domain: ``name``, its ``energy_uj`` counter and wrap range (µJ)."""

    name: str
    energy_uj: Path
    max_range_uj: float


def find_rapl_domains(root: str | Path = "/") -> list[RaplDomain]:
    """RAPL package domains under ``root``; raises ``MeterUnavailable`` with the reason."""
    base = Path(root) / "sys/class/powercap"
    if not base.is_dir():
        raise MeterUnavailable(f"no {base} (no powercap driver)")
    dirs = sorted(p for p in base.glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", p.name))
    domains = []
    for d in dirs:
        try:
            name = _read(d / "name").strip()
            if not name.startswith("package"):
                continue
            read_number(d / "energy_uj")
            max_range = read_number(d / "max_energy_range_uj")
        except PermissionError as exc:
            raise MeterUnavailable(
                f"permission denied reading {exc.filename or d} (energy_uj is root-only "
                "since Linux 5.10; run as root or grant read access)"
            ) from None
        except (OSError, ValueError) as exc:
            raise MeterUnavailable(f"cannot read {d}: {exc}") from None
        if max_range <= 0:
            raise MeterUnavailable(f"{d}/max_energy_range_uj = {max_range:g}; need > 0")
        domains.append(RaplDomain(name, d / "energy_uj", max_range))
    if not domains:
        raise MeterUnavailable(f"no intel-rapl:N package domain under {base}")
    return domains
