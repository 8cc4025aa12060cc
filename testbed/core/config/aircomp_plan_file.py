"""The aircomp plan file: written by ``testbed plan --scheme aircomp --out``, followed by
``testbed run --plan`` (config key ``aircomp_plan``).

Schema (YAML mapping, unknown keys refused)::

    format: dpfl-aircomp-plan/1
    scheme: aircomp
    devices: 10                 # as the config's devices, rounds, epsilon, delta, model size
    rounds: 900
    epsilon_target: 5.0
    delta: 1.0e-05
    d: 21840
    amplitude: 0.42             # c: the common received amplitude (symbol-amplitude units,
                                #   the best device's gain 1)
    amplitude_ratio: 0.11       # c over the largest c every device reaches at this sigma
    sigma: 0.0021               # every participant's noise share (value units)
    full_power_sigma: 0.0025    # the share at the run's default c (for comparison)
    receiver_noise_var: 1.1e-7  # (N0 / 2) / c^2 per real coordinate of the sum
    receiver_noise_margin: 0.1  # eta: the accuracy constraint's margin
    trusted: 1.0                # fraction of the receiver noise credited (tau)
    energy_round_j: 0.0021      # radio energy of all devices per round (J)
    full_power_energy_round_j: 0.0180
    energy_j: 1.89              # over the rounds
    notes: [...]
    devices_plan:               # one entry per device, ids 0..N-1
      - {id: 0, h: 1.0, alpha: 0.42, power_w: 0.0031, e_comm_j_round: 0.00021}

The run takes ``sigma`` as every device's share (after checking the plan was made for its
config) and transmits at ``c = amplitude_ratio`` times the largest ``c`` every participant
reaches (units-free: the same on the symbol link and on radios); the budget gate checks every
round as always.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

FORMAT: Final = "dpfl-aircomp-plan/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AirCompDevicePlan(_Strict):
    """One device's part of the plan."""

    id: int = Field(ge=0)
    h: float = Field(gt=0)
    alpha: float = Field(ge=0)
    power_w: float = Field(ge=0)
    e_comm_j_round: float = Field(ge=0)


class AirCompPlanFile(_Strict):
    """An aircomp plan (module docstring)."""

    format: Literal["dpfl-aircomp-plan/1"] = FORMAT
    scheme: Literal["aircomp"] = "aircomp"
    devices: int = Field(ge=1)
    rounds: int = Field(ge=1)
    epsilon_target: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    d: int = Field(ge=1)
    amplitude: float = Field(gt=0)
    amplitude_ratio: float = Field(gt=0, le=1)
    sigma: float = Field(ge=0)
    full_power_sigma: float = Field(ge=0)
    receiver_noise_var: float = Field(ge=0)
    receiver_noise_margin: float = Field(ge=0)
    trusted: float = Field(ge=0, le=1)
    energy_round_j: float = Field(ge=0)
    full_power_energy_round_j: float = Field(ge=0)
    energy_j: float = Field(ge=0)
    notes: list[str] = Field(default_factory=list)
    devices_plan: list[AirCompDevicePlan] = Field(min_length=1)


def is_aircomp_plan(path: str | Path) -> bool:
    """Whether the YAML file at ``path`` is an aircomp plan (its ``format``)."""
    from testbed.core.config.safe_yaml import read_yaml_mapping

    try:
        data = read_yaml_mapping(path, "plan file")
    except Exception:  # noqa: BLE001 - not readable as a mapping: not an aircomp plan
        return False
    return data.get("format") == FORMAT


def load_aircomp_plan(path: str | Path) -> AirCompPlanFile:
    """Read and validate an aircomp plan (read once per version of the file: every round of
    a run asks for it).

    Raises
    ------
    testbed.core.config.errors.ConfigError
        Not readable, or not a valid aircomp plan (naming the key).
    """
    try:
        version = os.stat(path).st_mtime_ns
    except OSError:
        version = -1  # the read below names the problem
    return _load(str(path), version)


@functools.lru_cache(maxsize=8)
def _load(path: str, version: int) -> AirCompPlanFile:
    from testbed.core.config.loader import validate
    from testbed.core.config.safe_yaml import read_yaml_mapping

    data = read_yaml_mapping(path, "aircomp plan file")
    return validate(AirCompPlanFile, data, f"aircomp plan '{path}'")


def save_aircomp_plan(plan: AirCompPlanFile, path: str | Path) -> None:
    """Write ``plan`` as YAML (atomically)."""
    from testbed.core.config.safe_yaml import dump_yaml_text
    from testbed.core.runs.rundir import atomic_write_bytes

    atomic_write_bytes(Path(path), dump_yaml_text(plan.model_dump(mode="json")).encode())


def aircomp_plan_overrides(path: str | Path) -> list[str] | None:
    """Config overrides that make a run follow the aircomp plan at ``path`` (``None``: not an
    aircomp plan)."""
    if not is_aircomp_plan(path):
        return None
    plan = load_aircomp_plan(path)
    return [f"aircomp_plan={path}", "scheme=aircomp", f"rounds={plan.rounds}",
            f"devices={plan.devices}"]


def checked_aircomp_plan(cfg: Any, d: int) -> AirCompPlanFile:
    """The config's aircomp plan, refused unless it was made for this config.

    Raises
    ------
    testbed.core.config.errors.ConfigError
        Naming the key the plan and the config disagree on.
    """
    from testbed.core.config.errors import ConfigError

    plan = load_aircomp_plan(cfg.aircomp_plan)
    checks: list[tuple[str, Any, Any]] = [
        ("devices", cfg.devices, plan.devices), ("rounds", cfg.rounds, plan.rounds),
        ("privacy.epsilon", cfg.privacy.epsilon, plan.epsilon_target),
        ("privacy.delta", cfg.privacy.delta, plan.delta), ("model size d", d, plan.d)]
    for key, mine, theirs in checks:
        if mine != theirs:
            raise ConfigError(
                f"config key 'aircomp_plan': '{cfg.aircomp_plan}' was made for {key} = "
                f"{theirs!r}, this config has {mine!r}; re-plan with this config")
    return plan
