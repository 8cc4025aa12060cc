"""Read a run directory into one typed structure for the report; never modifies a file.

Every file is optional: a run killed before its summary, an older run written before a
field existed, or a directory a person trimmed still gives a :class:`RunData`, whose
``problems`` say in words what was missing or unreadable. Only a path that holds none of
the run files is refused (:class:`NotARunDirectory`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: Files the report reads, relative to the run directory.
CONFIG = "config.yaml"
HW_CONFIG = "hw_config.yaml"
META = "meta.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LEDGER = "ledger.jsonl"
#: The device unit's accountings (its ledger header names no unit, only these).
DEVICE_ACCOUNTINGS = ("paper", "strict")
#: At least one of these makes a directory a run directory.
RUN_FILES = (CONFIG, METRICS, SUMMARY)


#: ``summary.json`` keys that must be numbers (``None`` allowed: not measured), with the
#: range a finite value must lie in; a value of another type or out of range is dropped
#: (the report shows ``n/a``) and named in the report's problems.
SUMMARY_NUMBERS: dict[str, tuple[float, float]] = {
    "final_accuracy": (0.0, 1.0),
    "best_accuracy": (0.0, 1.0),
    "final_subset_accuracy": (0.0, 1.0),
    "final_train_loss": (-math.inf, math.inf),
    "wall_time_s": (0.0, math.inf),
}
#: ``summary.json`` keys that must be integers (``None`` allowed).
SUMMARY_INTEGERS = ("exit_code", "rounds_completed", "rounds_planned", "d",
                    "final_accuracy_round", "lost_uploads", "workers")


class NotARunDirectory(ValueError):
    """The path is missing, not a directory, or holds none of :data:`RUN_FILES`."""


def as_float(value: Any) -> float | None:
    """A JSON number as ``float``; the strings ``"inf"``, ``"-inf"``, ``"nan"`` that
    :func:`testbed.core.runs.rundir.json_safe` writes for non-finite floats as those floats;
    anything else (``None``, text, ``bool``) as ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if value in ("inf", "-inf", "nan"):
        return float(value)
    return None


def _at(doc: Any, keys: tuple[str, ...]) -> Any:
    """The value at mapping keys ``keys`` in ``doc``, ``None`` where one is absent."""
    node: Any = doc
    for k in keys:
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


@dataclass
class RunData:
    """What a run directory holds, as read (nothing derived beyond indexing).

    Attributes
    ----------
    path
        The run directory.
    config, hw_config, meta, summary
        The parsed files, ``None`` when missing or unreadable.
    rounds
        ``metrics.jsonl``'s complete lines, in file order (one per committed round).
    ledger_header
        The ledger's first line (unit, target, delta, accounting), ``None`` without one.
    problems
        What was missing or unreadable, one sentence each (the report lists them).
    read
        The files that were read, relative to ``path``.
    """

    path: Path
    config: dict[str, Any] | None = None
    hw_config: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)
    ledger_header: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)

    def doc(self, name: str) -> Any:
        """The parsed file ``name`` as the report read it (``metrics.jsonl``: the list of
        lines; ``ledger.jsonl``: a list holding only its header), ``None`` if not read."""
        docs: dict[str, Any] = {
            CONFIG: self.config,
            HW_CONFIG: self.hw_config,
            META: self.meta,
            SUMMARY: self.summary,
            METRICS: self.rounds,
            LEDGER: None if self.ledger_header is None else [self.ledger_header],
        }
        return docs.get(name)

    # -- settings ------------------------------------------------------------------------
    def setting(self, *keys: str) -> Any:
        """The config value at ``keys`` (``("privacy", "epsilon")``), ``None`` if absent."""
        return _at(self.config, keys)

    def applied(self, *keys: str) -> Any:
        """``summary.json``'s value at ``keys`` (what the run applied: ``radios``,
        ``fading``), ``None`` when absent (an older summary, or no radios)."""
        return _at(self.summary, keys)

    @property
    def privacy(self) -> dict[str, Any]:
        """``summary.json``'s ``privacy`` section (``{}`` without a summary)."""
        p = (self.summary or {}).get("privacy")
        return p if isinstance(p, dict) else {}

    @property
    def scheme(self) -> str | None:
        """The run's scheme (summary, else config), ``None`` when neither says."""
        value = (self.summary or {}).get("scheme") or self.setting("scheme")
        return value if isinstance(value, str) else None

    @property
    def private(self) -> bool:
        """Whether the run is a DP run: a privacy unit in the summary, a ledger header,
        epsilon figures in the metrics, or a scheme other than ``fedavg``."""
        if self.privacy.get("unit") or self.ledger_header is not None:
            return True
        if self.scheme is not None:
            return self.scheme != "fedavg"
        return bool(self.device_keys("epsilon_"))

    def _privacy_field(self, summary_key: str, ledger_key: str, config: Any) -> Any:
        """A privacy setting from the summary, else the ledger's header, else ``config``."""
        value = self.privacy.get(summary_key)
        if value is None and self.ledger_header is not None:
            value = self.ledger_header.get(ledger_key)
        return config if value is None else value

    @property
    def unit(self) -> str | None:
        """``"record"`` or ``"device"`` for a DP run, ``None`` without DP."""
        if not self.private:
            return None
        value = self._privacy_field("unit", "unit", self.setting("privacy", "unit"))
        if value is None and self.ledger_header is not None and \
                self.ledger_header.get("accounting") in DEVICE_ACCOUNTINGS:
            value = "device"  # a device-unit ledger's header names no unit
        return value if isinstance(value, str) else None

    @property
    def enforced(self) -> str | None:
        """The accountant that enforced the budget (``pld``, ``rdp``, ``strict``,
        ``paper``), ``None`` without DP."""
        if not self.private:
            return None
        key = "accountant" if self.unit == "record" else "accounting"
        value = self._privacy_field("enforced_accounting", "accounting",
                                    self.setting("privacy", key))
        return value if isinstance(value, str) else None

    @property
    def delta(self) -> float | None:
        """The run's delta."""
        return as_float(self._privacy_field("delta", "delta", self.setting("privacy", "delta")))

    @property
    def target(self) -> float | None:
        """The per-device epsilon target, ``None`` without DP."""
        if not self.private:
            return None
        return as_float(
            self._privacy_field("epsilon_target", "epsilon_target",
                                self.setting("privacy", "epsilon"))
        )

    @property
    def n_devices(self) -> int:
        """Devices of the run: the config's ``devices``, else the summary's privacy entries,
        else one more than the largest device index in the metrics."""
        n = self.setting("devices")
        if isinstance(n, int) and n > 0:
            return n
        devs = self.privacy.get("devices")
        if isinstance(devs, list) and devs:
            return len(devs)
        idx = [i for _, _, i, _ in self.device_entries()]
        return max(idx) + 1 if idx else 0

    # -- metrics -------------------------------------------------------------------------
    @property
    def round_numbers(self) -> np.ndarray:
        """Each metrics line's ``round`` (0-based), shape ``(n_lines,)``; the line index
        where a line has none."""
        return np.array(
            [int(m["round"]) if isinstance(m.get("round"), int) else k
             for k, m in enumerate(self.rounds)],
            dtype=np.int64,
        )

    def round_series(self, key: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Rounds where line key ``key`` is a number, its values, and their line indices.

        Returns
        -------
        rounds : numpy.ndarray, shape ``(n,)``, int64
        values : numpy.ndarray, shape ``(n,)``, float64 (non-finite values kept)
        lines : list of int
            The indices in :attr:`rounds` (``metrics.jsonl`` line, 0-based) of each value.
        """
        r, v, lines = [], [], []
        for k, (rnd, m) in enumerate(zip(self.round_numbers, self.rounds, strict=True)):
            x = as_float(m.get(key))
            if x is not None:
                r.append(int(rnd))
                v.append(x)
                lines.append(k)
        return np.array(r, dtype=np.int64), np.array(v, dtype=np.float64), lines

    def round_keys(self, suffix: str) -> list[str]:
        """Top-level metrics keys ending in ``suffix`` with a number on some line (e.g. all
        ``*_accuracy``), in order of first appearance."""
        keys: list[str] = []
        for m in self.rounds:
            for k, v in m.items():
                if k.endswith(suffix) and k not in keys and as_float(v) is not None:
                    keys.append(k)
        return keys

    def device_entries(self) -> list[tuple[int, int, int, dict[str, Any]]]:
        """Every per-device entry of every metrics line: ``(line, position, device, entry)``
        (``position`` in the line's ``devices`` list; ``device`` its ``device`` field or
        the position)."""
        out = []
        for k, m in enumerate(self.rounds):
            devs = m.get("devices")
            if not isinstance(devs, list):
                continue
            for j, d in enumerate(devs):
                if isinstance(d, dict):
                    dev = d.get("device")
                    out.append((k, j, dev if isinstance(dev, int) else j, d))
        return out

    def device_values(self, key: str) -> dict[int, list[tuple[int, int, float]]]:
        """Per device, every number under per-device key ``key``: ``(line, position,
        value)`` in round order."""
        out: dict[int, list[tuple[int, int, float]]] = {}
        for k, j, dev, d in self.device_entries():
            x = as_float(d.get(key))
            if x is not None:
                out.setdefault(dev, []).append((k, j, x))
        return out

    def device_matrix(self, key: str, *, carry: bool = False) -> np.ndarray:
        """Per-device key ``key`` as a matrix, shape ``(n_devices, n_lines)``, NaN where a
        device's entry lacks it. ``carry``: a cumulative figure (epsilon) keeps its last
        value in rounds without an entry, and is 0 before the device's first one."""
        n, t = self.n_devices, len(self.rounds)
        out = np.full((n, t), np.nan)
        for k, _, dev, d in self.device_entries():
            x = as_float(d.get(key))
            if x is not None and 0 <= dev < n:
                out[dev, k] = x
        if carry:
            for i in range(n):
                last = 0.0
                for k in range(t):
                    if math.isnan(out[i, k]):
                        out[i, k] = last
                    else:
                        last = out[i, k]
        return out

    def device_keys(self, prefix: str) -> list[str]:
        """Per-device keys starting with ``prefix`` holding a number somewhere, in order of
        first appearance (e.g. ``epsilon_pld``, ``epsilon_rdp``)."""
        keys: list[str] = []
        for _, _, _, d in self.device_entries():
            for k, v in d.items():
                if k.startswith(prefix) and k not in keys and as_float(v) is not None:
                    keys.append(k)
        return keys


def _read_json(run: RunData, name: str) -> dict[str, Any] | None:
    p = run.path / name
    if not p.exists():
        return None
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        run.problems.append(f"{name} is unreadable ({type(exc).__name__}: {exc}); ignored")
        return None
    if not isinstance(obj, dict):
        run.problems.append(f"{name} does not hold a JSON object; ignored")
        return None
    run.read.append(name)
    return obj


def _read_yaml(run: RunData, name: str) -> dict[str, Any] | None:
    from testbed.core.config.safe_yaml import read_yaml_mapping

    p = run.path / name
    if not p.exists():
        return None
    try:
        obj = read_yaml_mapping(p, what=name)
    except ValueError as exc:
        run.problems.append(f"{name} is unreadable ({exc}); ignored")
        return None
    run.read.append(name)
    return obj


def _read_jsonl(run: RunData, name: str) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file; a torn last line is dropped (and said), a corrupt
    line elsewhere ends the reading there (and is said)."""
    p = run.path / name
    if not p.exists():
        return []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        run.problems.append(f"{name} is unreadable ({type(exc).__name__}: {exc}); ignored")
        return []
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            where = "its last line is torn (a write cut short)" if i == len(lines) - 1 else (
                f"line {i + 1} is corrupt"
            )
            run.problems.append(f"{name}: {where}; read the {len(out)} lines before it")
            break
        if not isinstance(obj, dict):
            run.problems.append(f"{name}: line {i + 1} is not a JSON object; read up to it")
            break
        out.append(obj)
    run.read.append(name)
    return out


def _read_ledger_header(run: RunData) -> dict[str, Any] | None:
    """The ledger's first line when it is a header (the events are not needed here)."""
    p = run.path / LEDGER
    if not p.exists():
        return None
    try:
        with p.open(encoding="utf-8") as fh:
            first = json.loads(fh.readline())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        run.problems.append(f"{LEDGER}: header unreadable ({type(exc).__name__}); ignored")
        return None
    if isinstance(first, dict) and str(first.get("type", "")).startswith("ledger-header"):
        run.read.append(f"{LEDGER} (header line)")
        return first
    return None


def _drop_mistyped(run: RunData, summary: dict[str, Any]) -> None:
    """Drop from ``summary`` each of :data:`SUMMARY_NUMBERS` / :data:`SUMMARY_INTEGERS`
    whose value has the wrong type or range, naming file, key and value in the problems."""
    for key in (*SUMMARY_NUMBERS, *SUMMARY_INTEGERS):
        value = summary.get(key)
        if value is None:
            continue
        if key in SUMMARY_NUMBERS:
            lo, hi = SUMMARY_NUMBERS[key]
            x = as_float(value)
            ok = x is not None and (math.isnan(x) or lo <= x <= hi)
            allowed = "a number" + ("" if math.isinf(lo) and math.isinf(hi)
                                    else f" in [{lo:g}, {hi:g}]")
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
            allowed = "an integer"
        if not ok:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            run.problems.append(f"{SUMMARY} key '{key}' is {shown} ({type(value).__name__}); "
                                f"allowed: {allowed}; shown as n/a")
            del summary[key]


def load_run(path: Path) -> RunData:
    """Read run directory ``path`` (read only).

    Raises
    ------
    NotARunDirectory
        When ``path`` does not exist, is not a directory, or holds none of
        :data:`RUN_FILES`.
    """
    path = Path(path)
    if not path.exists():
        raise NotARunDirectory(f"run directory '{path}' does not exist")
    if not path.is_dir():
        raise NotARunDirectory(f"'{path}' is a file, not a run directory")
    if not any((path / f).is_file() for f in RUN_FILES):
        hint = "made by `testbed run --out DIR`"
        if any((path / "aggregator" / f).is_file() for f in RUN_FILES):
            hint = f"a `testbed launch` directory: its run directory is '{path / 'aggregator'}'"
        raise NotARunDirectory(
            f"'{path}' is not a run directory: it holds none of {', '.join(RUN_FILES)} "
            f"({hint})"
        )
    run = RunData(path=path)
    run.config = _read_yaml(run, CONFIG)
    run.hw_config = _read_yaml(run, HW_CONFIG)
    run.meta = _read_json(run, META)
    run.summary = _read_json(run, SUMMARY)
    if run.summary is not None:
        _drop_mistyped(run, run.summary)
    run.rounds = _read_jsonl(run, METRICS)
    run.ledger_header = _read_ledger_header(run)
    for name in (CONFIG, METRICS):
        if not (path / name).exists():
            run.problems.append(f"no {name} in the run directory")
    if run.summary is None and not (path / SUMMARY).exists():
        run.problems.append(
            f"no {SUMMARY}: the run was killed before writing it, or is still running; "
            f"the figures below come from the {len(run.rounds)} committed rounds of {METRICS}"
        )
    return run
