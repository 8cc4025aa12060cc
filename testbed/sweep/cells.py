"""Cells of a sweep: one per grid combination, each an ordinary ``testbed run``.

A cell's experiment config is built exactly as ``testbed run BASE --set KEY=VALUE ...``
builds it (:func:`testbed.core.config.loader.load_experiment`): the shipped default, then the
base file, then the sweep's ``set`` overrides, then the cell's grid values. Every cell is
built and validated before any runs; the first invalid one is reported with its values.

A cell's run directory is named from its grid values alone (``scheme=ldp-fedavg__seed=0``),
so a later sweep over a grid that shares cells finds their directories again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggregator.outcome import OUTCOMES
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_experiment, load_hardware, parse_override
from testbed.sweep.spec import SweepSpec, value_text

#: Characters kept in a run directory name; anything else becomes ``_`` and a hash is added.
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")
#: Longest run directory name built from values (a hash replaces the rest).
MAX_NAME_CHARS = 150
#: Summary statuses after which a cell is not run again (``interrupted`` is resumed).
FINAL_STATUSES = tuple(s for s in OUTCOMES if s != "interrupted")
#: Final statuses that ``retry_failed`` resumes.
RETRY_STATUSES = ("failed", "link_failed")


@dataclass(frozen=True)
class Cell:
    """One grid combination.

    Attributes
    ----------
    values
        ``(grid key, value)`` pairs in the grid's order.
    name
        Run directory name (deterministic from ``values``, a safe file name).
    overrides
        ``--set`` strings, in the order applied (fixed ``set``, then the grid values).
    hw_overrides
        ``--hw-set`` strings.
    config
        The cell's validated experiment config.
    hw
        Its validated hardware config.
    """

    values: tuple[tuple[str, Any], ...]
    name: str
    overrides: tuple[str, ...]
    hw_overrides: tuple[str, ...]
    config: ExperimentConfig
    hw: HardwareConfig

    @property
    def label(self) -> str:
        """``key=value`` pairs, for logs and messages."""
        return ", ".join(f"{k}={plain_text(v)}" for k, v in self.values)

    @property
    def cpus(self) -> int:
        """CPUs the cell uses: ``torch_threads`` times its training processes (``workers``,
        an integer in a sweep)."""
        workers = getattr(self.config, "workers", 1)
        return self.config.torch_threads * (workers if isinstance(workers, int) else 1)


def plain_text(value: Any) -> str:
    """A grid value as written in names and labels: a string bare, anything else as YAML."""
    return value if isinstance(value, str) else value_text(value)


def cell_name(values: tuple[tuple[str, Any], ...]) -> str:
    """Run directory name of a cell: ``key=value`` joined by ``__`` (:func:`plain_text`).

    Characters outside ``[A-Za-z0-9._+-]`` become ``_``; when any did, or the name would be
    longer than :data:`MAX_NAME_CHARS`, 10 hex digits of the SHA-256 of the exact values
    are appended, so two different cells never share a name.
    """
    raw = "__".join(f"{k}={plain_text(v)}" for k, v in values)
    safe = "__".join(f"{_SAFE.sub('_', k)}={_SAFE.sub('_', plain_text(v))}" for k, v in values)
    if safe == raw and len(raw) <= MAX_NAME_CHARS:
        return raw
    digest = hashlib.sha256(json.dumps([[k, v] for k, v in values]).encode()).hexdigest()[:10]
    return f"{safe[:MAX_NAME_CHARS]}-h{digest}"


def _override(key: str, value: Any, flag: str) -> str:
    """``key=value`` text for ``flag``, checked to parse back to ``value`` exactly."""
    if isinstance(value, str):  # bare when it reads back as the same string (scheme=fedavg)
        item = f"{key}={value}"
        try:
            if parse_override(item, flag)[1] == value:
                return item
        except ConfigError:
            pass
    item = f"{key}={value_text(value)}"
    _, parsed = parse_override(item, flag)
    if json.dumps(parsed) != json.dumps(value) or type(parsed) is not type(value):
        raise ConfigError(  # a value the --set syntax cannot carry unchanged
            f"sweep key '{key}': value {value!r} does not survive as {flag} {item!r}"
        )
    return item


def expand(spec: SweepSpec) -> list[tuple[tuple[str, Any], ...]]:
    """Every combination of the grid, the last key varying fastest."""
    keys = list(spec.grid)
    combos = itertools.product(*spec.grid.values())
    return [tuple(zip(keys, combo, strict=True)) for combo in combos]


def build_cells(spec: SweepSpec) -> list[Cell]:
    """Build and validate every cell's experiment and hardware config.

    ``torch_threads`` is set to ``spec.cpus_per_cell`` unless ``set`` or ``grid`` names it.

    Raises
    ------
    ConfigError
        For the first cell whose config is refused, naming the cell and the key.
    """
    fixed = [_override(k, v, "--set") for k, v in spec.fixed.items()]
    if "torch_threads" not in spec.fixed and "torch_threads" not in spec.grid:
        fixed.insert(0, f"torch_threads={spec.cpus_per_cell}")
    hw_fixed = tuple(_override(k, v, "--hw-set") for k, v in spec.hw_set.items())
    combos = expand(spec)
    cells: list[Cell] = []
    names: dict[str, str] = {}
    for n, values in enumerate(combos, 1):
        label = ", ".join(f"{k}={plain_text(v)}" for k, v in values)
        try:
            overrides = (*fixed, *(_override(k, v, "--set") for k, v in values))
            cfg = load_experiment(spec.base, overrides)
            hw = load_hardware(cfg.hw_config, hw_fixed)
            from testbed.core.links import check_link_config

            check_link_config(cfg, hw, record=cfg.record)
            if getattr(cfg, "workers", 1) == "auto":
                raise ConfigError(
                    "config key 'workers': got 'auto'; in a sweep every cell would take every "
                    "core; allowed: an integer (Ray reserves torch_threads x workers CPUs per "
                    "cell)"
                )
        except ConfigError as exc:
            raise ConfigError(f"sweep cell {n}/{len(combos)} ({label}): {exc}") from None
        name = cell_name(values)
        if name in names:  # only if two values have the same text (refused by the spec)
            raise ConfigError(f"sweep cells ({names[name]}) and ({label}) share a run directory")
        names[name] = label
        cells.append(Cell(values, name, overrides, hw_fixed, cfg, hw))
    return cells


def _config_difference(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dumps (``a`` -> ``b``)."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _config_difference(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}: {json.dumps(va)} -> {json.dumps(vb)}")
    return out


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json``, or ``None`` when absent or unreadable."""
    try:
        data = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cell_action(cell: Cell, run_dir: Path, *, retry_failed: bool = False) -> str:
    """What a sweep does with ``cell`` whose run directory is ``run_dir``.

    Returns
    -------
    str
        ``"run"`` (no run yet), ``"resume"`` (a run without a final status: interrupted,
        or killed before it could write its summary; with ``retry_failed`` also
        ``failed`` and ``link_failed``) or ``"skip"`` (a final status).

    Raises
    ------
    ConfigError
        When the directory holds something else: not a run directory, or the run of
        another config (the keys that differ are named). Nothing is deleted.
    """
    if not run_dir.exists() or (
        run_dir.is_dir() and all(p.name == ".lock" for p in run_dir.iterdir())
    ):
        return "run"
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"sweep cell ({cell.label}): '{run_dir}' exists but is not a run directory (no "
            "config.yaml); move it away or choose another --out"
        )
    try:
        old = load_experiment(run_dir / "config.yaml").model_dump(mode="json")
        old_hw = load_hardware(str(run_dir / "hw_config.yaml")).model_dump(mode="json")
    except ConfigError as exc:
        raise ConfigError(
            f"sweep cell ({cell.label}): the run in '{run_dir}' has a config this version "
            f"cannot read: {exc}"
        ) from None
    new = cell.config.model_dump(mode="json")
    # Threads change speed, not results; a sweep re-run with other CPUs still matches.
    old.pop("torch_threads", None)
    new.pop("torch_threads", None)
    diff = _config_difference(old, new)
    diff += [f"hardware {d}" for d in _config_difference(old_hw, cell.hw.model_dump(mode="json"))]
    if diff:
        raise ConfigError(
            f"sweep cell ({cell.label}): '{run_dir}' holds a run of another config ("
            + "; ".join(diff[:5])
            + (f"; and {len(diff) - 5} more" if len(diff) > 5 else "")
            + "); use another --out, or move that run away"
        )
    summary = read_summary(run_dir)
    status = summary.get("status") if summary else None
    if status in FINAL_STATUSES and not (retry_failed and status in RETRY_STATUSES):
        return "skip"
    return "resume"
