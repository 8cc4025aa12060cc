"""A run survives the upgrade that adds a config key: the resume pin ignores keys that a
later version added at their defaults, and nothing else."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.runs.recovery import check_config_pin, config_pin
from testbed.core.runs.rundir import RunDir, RunDirError

#: Keys this testbed added after runs were started with it.
ADDED = {"config": ["compute.device"], "hw_config": ["usrp.fallback", "usrp.emulated"]}


def _older_pin(cfg: Any, hw: Any, edit: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pin an older version wrote for ``cfg``/``hw``: without the added keys (and with
    ``edit``'s values), its sha256 over what it holds."""
    pin = config_pin(cfg, hw)
    old = {name: {k: v for k, v in pin[name].items() if k not in ADDED[name]}
           for name in ("config", "hw_config")}
    for key, value in (edit or {}).items():
        old["config"][key] = value
    text = json.dumps(old, sort_keys=True, separators=(",", ":"))
    return {**old, "config_sha256": hashlib.sha256(text.encode()).hexdigest()}


def _rundir(tmp_path: Path, pin: dict[str, Any]) -> RunDir:
    (tmp_path / "meta.json").write_text(json.dumps({"config_pin": pin}))
    return RunDir(tmp_path)


def test_keys_added_at_their_defaults_do_not_block_a_resume(tmp_path: Path) -> None:
    cfg, hw = load_experiment(None, ["rounds=7"]), load_hardware("lab_ota")
    check_config_pin(_rundir(tmp_path, _older_pin(cfg, hw)), cfg, hw)


def test_an_added_key_off_its_default_or_a_changed_key_still_does(tmp_path: Path) -> None:
    cfg, hw = load_experiment(None, ["rounds=7"]), load_hardware("lab_ota")
    pin = _older_pin(cfg, hw)
    moved = load_experiment(None, ["rounds=7", "compute.device=cpu"])
    with pytest.raises(RunDirError, match="compute.device was '\\(absent\\)'.* now 'cpu'"):
        check_config_pin(_rundir(tmp_path, pin), moved, hw)
    more = load_experiment(None, ["rounds=8"])
    with pytest.raises(RunDirError, match="rounds was 7 .* now 8"):
        check_config_pin(_rundir(tmp_path, pin), more, hw)
    tampered = {**_older_pin(cfg, hw, {"rounds": 9}), "config_sha256": pin["config_sha256"]}
    with pytest.raises(RunDirError, match="rounds was 9"):
        check_config_pin(_rundir(tmp_path, tampered), cfg, hw)
