"""Resume checks: the checkpoint, the metrics and the privacy ledger must tell one story.

A resumed run continues only when the files agree; when one is missing, unreadable or
disagrees with the others, it refuses and names the file, never restarting from round 0
next to an old ledger or resetting a device's privacy record. The one repair it makes is
the roll-forward of a round whose checkpoint was written but whose metrics line was not
(or was torn): the checkpoint carries that line.

The configuration is pinned when a run starts (:func:`config_pin`): every key of the
resolved ``config.yaml`` and ``hw_config.yaml`` but :data:`UNPINNED_KEYS`, as values plus
their sha256, in ``meta.json`` (every run) and in the privacy ledger's header (DP runs,
where the hash chain makes the header tamper-evident). :func:`check_config_pin` refuses a
resume whose configuration differs, naming the key: an edited ``rounds`` or ``scheme``
would otherwise continue the run under another schedule than the one its privacy record
and its first rounds were made for. A run started before the pin existed has none in
``meta.json`` and is resumed as before (its ledger, if any, is ``ledger-header/v1`` and is
refused by the ledger itself). A key that a later version added, at its default, is not a
difference (:func:`_only_added_at_defaults`): a run survives the upgrade that added it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from testbed.core.runs.rundir import (
    RunDir,
    RunDirError,
    append_jsonl,
    atomic_write_bytes,
    dumps,
    json_safe,
)

#: Keys that may change on resume: where the data set lives and how many processes and
#: threads train (none changes what is computed or what goes on air); ``hw_config`` is the
#: path the hardware config was read from, whose values are pinned themselves.
UNPINNED_KEYS = frozenset({"data_dir", "workers", "torch_threads", "hw_config"})
#: The pinned files, in the order they are checked.
PINNED_FILES = ("config", "hw_config")


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections as dotted keys (``privacy.epsilon``); lists stay values."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_pin(cfg: BaseModel, hw: BaseModel) -> dict[str, Any]:
    """What a run pins of its configuration: ``{"config": {key: value}, "hw_config":
    {key: value}, "config_sha256": hex}`` (dotted keys, JSON values, every key but
    :data:`UNPINNED_KEYS`; the sha256 is over the canonical JSON of both)."""
    pinned = {
        "config": {k: v for k, v in _flat(cfg.model_dump(mode="json")).items()
                   if k not in UNPINNED_KEYS},
        "hw_config": _flat(hw.model_dump(mode="json")),
    }
    pinned = json.loads(dumps(pinned))
    text = json.dumps(pinned, sort_keys=True, separators=(",", ":"))
    return {**pinned, "config_sha256": hashlib.sha256(text.encode()).hexdigest()}


def _pin_difference(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, str, Any, Any] | None:
    """The first pinned key that differs: ``(file, key, old value, new value)``; a key
    added since, at its default, is not a difference."""
    defaults = _default_pin()
    for name in PINNED_FILES:
        was, now = old.get(name), new[name]
        if not isinstance(was, dict):
            return name, "(all keys)", was, "its current values"
        for key in sorted(set(was) | set(now)):
            if key not in was and key in defaults[name] and now[key] == defaults[name][key]:
                continue
            if was.get(key, "(absent)") != now.get(key, "(absent)"):
                return name, key, was.get(key, "(absent)"), now.get(key, "(absent)")
    return None


def _only_added_at_defaults(pin: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether ``now`` differs from ``pin`` only by keys a later version added, each at its
    default (``compute.device``, ``usrp.fallback``, ...): every pinned key is present with
    its pinned value, and the pin's own sha256 is that of ``now`` restricted to its keys (so
    the pin is intact). Such a run is resumed: what it was started with is unchanged."""
    defaults = _default_pin()
    restricted: dict[str, Any] = {}
    for name in PINNED_FILES:
        was, cur = pin.get(name), now[name]
        if not isinstance(was, dict) or set(was) - set(cur):
            return False
        if any(was[k] != cur[k] for k in was):
            return False
        for key in set(cur) - set(was):
            if key not in defaults[name] or cur[key] != defaults[name][key]:
                return False
        restricted[name] = {k: cur[k] for k in was}
    text = json.dumps(restricted, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest() == pin.get("config_sha256")


def _default_pin() -> dict[str, Any]:
    """:func:`config_pin` of the default experiment and hardware configs."""
    from testbed.core.config.experiment import ExperimentConfig
    from testbed.core.config.hardware import HardwareConfig

    return config_pin(ExperimentConfig(), HardwareConfig())


def _ledger_pin(rundir: RunDir) -> dict[str, Any] | None:
    """The configuration pinned in the ledger's header (``None``: no ledger, or no pin)."""
    try:
        with rundir.ledger_path.open("rb") as fh:
            first = json.loads(fh.readline().decode("utf-8"))
    except (OSError, ValueError):
        return None  # no ledger, or a damaged one: the ledger's own checks name it
    if not isinstance(first, dict) or "config_sha256" not in first:
        return None
    return first


def _meta_pin(rundir: RunDir) -> dict[str, Any] | None:
    """The configuration pinned in ``meta.json`` (``None``: a run from before the pin)."""
    path = rundir.path / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RunDirError(
            f"{path}: unreadable ({type(exc).__name__}); refusing to resume"
        ) from None
    pin = meta.get("config_pin") if isinstance(meta, dict) else None
    return pin if isinstance(pin, dict) else None


def check_config_pin(rundir: RunDir, cfg: BaseModel, hw: BaseModel) -> None:
    """Refuse to resume when the run's configuration differs from the one it was started
    with (pinned in the ledger's header and in ``meta.json``).

    Raises
    ------
    RunDirError
        Naming the file and the key: ``config.yaml: rounds was 40 when ledger.jsonl was
        started, now 60; refusing to resume``.
    """
    now = config_pin(cfg, hw)
    for where, pin in ((rundir.ledger_path.name, _ledger_pin(rundir)),
                       ("the run", _meta_pin(rundir))):
        if pin is None or pin.get("config_sha256") == now["config_sha256"]:
            continue
        if _only_added_at_defaults(pin, now):
            continue
        diff = _pin_difference(pin, now)
        if diff is None:
            raise RunDirError(
                f"{rundir.path}: the configuration's sha256 differs from the one pinned when "
                f"{where} was started; refusing to resume")
        name, key, was, new = diff
        raise RunDirError(
            f"{rundir.path / (name + '.yaml')}: {key} was {json_safe(was)!r} when {where} was "
            f"started, now {json_safe(new)!r}; refusing to resume")


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues.

    Attributes
    ----------
    next_round
        First round to run (0-based).
    weights
        Global model after round ``next_round - 1`` (``None`` when no round completed).
    """

    next_round: int
    weights: np.ndarray | None


def _metrics_rounds(rundir: RunDir) -> tuple[list[dict[str, Any]], bool]:
    """Complete metrics lines and whether a torn last line was present."""
    path = rundir.metrics_path
    if not path.exists():
        return [], False
    text = path.read_bytes()
    torn = bool(text) and not text.endswith(b"\n")
    return rundir.metrics(), torn


def resume_point(rundir: RunDir, *, private: bool) -> ResumePoint:
    """Check and reconcile the run's files; return where to continue.

    Parameters
    ----------
    rundir
        The (locked) run directory.
    private
        Whether the run keeps a privacy ledger (any DP scheme).

    Raises
    ------
    RunDirError
        Naming the file, when a file is missing, unreadable or disagrees with the others
        (a kept upload of the round to resume that cannot be read included).
    """
    ckpt = rundir.load_checkpoint()
    metrics, torn = _metrics_rounds(rundir)
    rounds = [int(m.get("round", -1)) for m in metrics]
    ledger = rundir.ledger_path
    if ckpt is None:
        if metrics:
            raise RunDirError(
                f"{rundir.checkpoint_path} is missing but {rundir.metrics_path} records "
                f"{len(metrics)} completed rounds; refusing to restart from round 0"
            )
        if private and not ledger.exists() and _has_intents(rundir):
            raise RunDirError(f"{ledger} is missing but uploads were journalled; refusing")
        if private and ledger.exists():
            late = _ledger_rounds(rundir)
            if late and max(late) > 0:
                raise RunDirError(
                    f"{rundir.checkpoint_path} is missing but {ledger} records uploads up to "
                    f"round {max(late)}; refusing to restart from round 0"
                )
        rundir.load_inflight(0)  # a damaged kept upload is refused now, before any work
        return ResumePoint(0, None)
    last, weights, extra = ckpt
    if rounds != list(range(len(rounds))):
        raise RunDirError(
            f"{rundir.metrics_path}: rounds {rounds[:3]}...{rounds[-3:]} are not 0, 1, 2, ..."
        )
    if len(rounds) == last + 1 and not torn:
        pass
    elif len(rounds) == last and "metrics_line" in extra:
        # Crash between the checkpoint and the metrics append (or a torn append): roll forward.
        _rewrite_metrics(rundir, metrics)
        append_jsonl(rundir.metrics_path, extra["metrics_line"])
    elif len(rounds) == last + 1 and torn:
        _rewrite_metrics(rundir, metrics)  # a torn line after a complete round: drop it
    else:
        what = "missing" if not rundir.metrics_path.exists() else f"has {len(rounds)} rounds"
        raise RunDirError(
            f"{rundir.metrics_path} {what}, but {rundir.checkpoint_path} is at round {last} "
            f"({last + 1} completed); the files disagree, refusing to resume"
        )
    if private:
        if not ledger.exists():
            raise RunDirError(
                f"{ledger} is missing but {last + 1} rounds were completed; refusing to resume "
                "without the privacy record"
            )
        _check_ledger_covers_metrics(rundir, last)
    rundir.clear_inflight_before(last + 1)
    rundir.load_inflight(last + 1)  # a damaged kept upload is refused now, before any work
    return ResumePoint(last + 1, weights)


def _rewrite_metrics(rundir: RunDir, metrics: list[dict[str, Any]]) -> None:
    body = "".join(dumps(m, separators=(",", ":")) + "\n" for m in metrics)
    atomic_write_bytes(rundir.metrics_path, body.encode())


def _has_intents(rundir: RunDir) -> bool:
    from testbed.core.privacy.ledger import intents_path

    path = intents_path(rundir.ledger_path)
    return path.exists() and path.stat().st_size > 0


def _ledger_entries(rundir: RunDir) -> list[Any]:
    from testbed.core.privacy.ledger import Ledger, LedgerError

    try:
        with Ledger.open(rundir.ledger_path) as ledger:
            return ledger.take_loaded()  # what open read and checked: no second read
    except LedgerError as exc:
        raise RunDirError(str(exc)) from None


def _ledger_rounds(rundir: RunDir) -> list[int]:
    return [entry.event.round for entry in _ledger_entries(rundir)]


def _check_ledger_covers_metrics(rundir: RunDir, last: int) -> None:
    """Every upload the metrics say went on air has a ledger record; none is from the future."""
    recorded: dict[tuple[int, int], int] = {}
    for entry in _ledger_entries(rundir):
        key = (entry.event.device, entry.event.round)
        recorded[key] = recorded.get(key, 0) + 1
        if entry.event.round > last + 1:
            raise RunDirError(
                f"{rundir.ledger_path} records round {entry.event.round}, but the run only "
                f"completed round {last}; the files disagree, refusing to resume"
            )
    for m in rundir.metrics():
        for dev in m.get("devices", []):
            if dev.get("transmitted") and (dev["device"], m["round"]) not in recorded:
                raise RunDirError(
                    f"{rundir.ledger_path} has no record of device {dev['device']}'s upload in "
                    f"round {m['round']} (metrics.jsonl says it went on air); refusing to resume"
                )


def directory_is_pristine(path: Path) -> bool:
    """Whether nothing privacy-relevant was written (no ledger event, no journalled intent)."""
    from testbed.core.privacy.ledger import HEADER_TYPE

    rundir = RunDir(path)
    if _has_intents(rundir):
        return False
    ledger = rundir.ledger_path
    if not ledger.exists():
        return True
    return all(
        not line.strip() or f'"{HEADER_TYPE}"'.encode() in line
        for line in ledger.read_bytes().splitlines()
    )
