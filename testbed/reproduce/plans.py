"""EE-DP-FL plans for the reproduction runs (``testbed plan`` in a child process).

Each (data set, epsilon) gets its own plan, made from the shipped calibration (Fashion-MNIST)
or one the user gives. ``testbed plan`` also prints the peer schemes (LDP-FedAvg,
Channel-DP, S-DP-FL) under the same target, with the artificial noise each needs: Fig. 2(a)'s
planned column comes from there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from testbed.core.config.errors import ConfigError
from testbed.core.runs.rundir import atomic_write_bytes
from testbed.reproduce.cases import BASE_CONFIG


def overrides_text(overrides: dict[str, Any]) -> list[str]:
    """``--set`` arguments for a mapping of dotted keys (values as JSON, which YAML reads)."""
    args: list[str] = []
    for key, value in overrides.items():
        text = value if isinstance(value, str) else json.dumps(value)
        args += ["--set", f"{key}={text}"]
    return args


def make_plan(
    out_dir: Path,
    name: str,
    overrides: dict[str, Any],
    calibration: Path,
    k_max: int | None,
) -> tuple[Path, dict[str, Any]]:
    """Plan ee-dp-fl for one (data set, epsilon); reuse a plan already written.

    Parameters
    ----------
    out_dir
        Where ``<name>.yaml`` (the plan), ``<name>.json`` (``--json`` output) and the
        scenario go.
    name
        File stem, e.g. ``fashion-mnist-eps5``.
    overrides
        Config overrides of the runs (data set, epsilon, run size).
    calibration
        ``testbed calibrate`` output for this data set and config.
    k_max
        Largest K the planner may choose (quick mode), ``None`` for the default.

    Returns
    -------
    tuple[Path, dict]
        The plan file and the planner's JSON (ee-dp-fl and its peers).

    Raises
    ------
    ConfigError
        When ``testbed plan`` fails or refuses (its message is quoted).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path = out_dir / f"{name}.yaml"
    json_path = out_dir / f"{name}.json"
    if plan_path.is_file() and json_path.is_file():
        return plan_path, json.loads(json_path.read_text())
    scenario: dict[str, Any] = {"calibration": str(calibration.resolve())}
    if k_max is not None:
        scenario["k_max"] = k_max
    scn_path = out_dir / f"{name}.scenario.yaml"
    atomic_write_bytes(scn_path, json.dumps({"solver": scenario}).encode())
    tmp_plan = out_dir / f".{name}.yaml.part"
    cmd = [
        sys.executable, "-m", "testbed", "plan", str(BASE_CONFIG), "--scenario", str(scn_path),
        *overrides_text(overrides), "--out", str(tmp_plan), "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not tmp_plan.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ConfigError(
            f"testbed plan for {name} exited {proc.returncode}: {' / '.join(tail)}"
        )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["plan_file"] = str(plan_path)  # where the plan will be, not its temporary name
    atomic_write_bytes(json_path, json.dumps(result, indent=1).encode())
    tmp_plan.replace(plan_path)  # the plan last: its presence means both are complete
    return plan_path, result


def planned_noise(plan_json: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per scheme (ee-dp-fl and the peers the planner printed): mean artificial noise.

    Returns
    -------
    dict
        ``{scheme: {"sigma": mean std per coordinate, "noise_multiplier": mean z,
        "energy_j": planned energy}}`` with sigma in the upload's units.
    """
    out: dict[str, dict[str, float]] = {}
    entries = {plan_json.get("scheme", "ee-dp-fl"): plan_json, **plan_json.get("peers", {})}
    for scheme, res in entries.items():
        devs = res.get("devices") or []
        if not devs or not res.get("feasible", True):
            continue
        out[scheme] = {
            "sigma": sum(float(d["sigma"]) for d in devs) / len(devs),
            "noise_multiplier": sum(float(d.get("noise_multiplier") or 0) for d in devs)
            / len(devs),
            "energy_j": float(res.get("energy_j", float("nan"))),
            "K": float(res.get("K", float("nan"))),
        }
    return out
