"""Peer systems' planners driven by an experiment config and a scenario file's ``peers:``
section; their plan files, which ``testbed run --plan`` follows like an EE-DP-FL plan.

Scenario file::

    peers:
      dp-pasgd: {budget: 3000, c1: 100, c2: 1, smoothness: 1.0, strong_convexity: 0.01,
                 grad_variance: 1.0, initial_gap: 2.3}

The paper prints none of Theorem 1's constants; they are the user's (docs/peers/dp-pasgd.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from aggregator.peers.dp_pasgd import DpPasgdPlan, plan_dp_pasgd
from testbed.config.errors import ConfigError
from testbed.config.experiment import ExperimentConfig
from testbed.config.loader import validate
from testbed.config.safe_yaml import read_yaml_mapping

#: Format tag of a peer plan file.
PEER_PLAN_FORMAT = "dpfl-peer-plan/1"
#: Peer schemes with a planner.
PEER_PLANNERS = ("dp-pasgd",)


class DpPasgdScenario(BaseModel):
    """``peers: dp-pasgd:`` of a scenario file: 000's resource budget and Theorem 1's
    constants (all required but c1, c2)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    budget: float = Field(gt=0, description="resource budget C_th = c1 K / tau + c2 K")
    c1: float = Field(100.0, gt=0, description="cost of one averaging round (upload)")
    c2: float = Field(1.0, gt=0, description="cost of one local step")
    smoothness: float = Field(gt=0, description="L")
    strong_convexity: float = Field(gt=0, description="lambda (<= L)")
    grad_variance: float = Field(ge=0, description="xi^2, per-device stochastic gradient variance")
    initial_gap: float = Field(ge=0, description="F(w_0) - F* (the initial loss gap)")


def read_peer_scenario(path: str | Path | None, scheme: str) -> DpPasgdScenario:
    """The ``peers: SCHEME:`` mapping of a scenario file.

    Raises
    ------
    ConfigError
        No file, no such section, or a bad key (named).
    """
    if path is None:
        raise ConfigError(
            f"--scenario: the {scheme} planner needs Theorem 1's constants in a scenario file "
            f"('peers: {scheme}: {{budget, smoothness, strong_convexity, grad_variance, "
            "initial_gap}}'; docs/peers/dp-pasgd.md)"
        )
    data = read_yaml_mapping(Path(path), "scenario file")
    section = (data.get("peers") or {}).get(scheme) if isinstance(data.get("peers"), dict) else None
    if section is None:
        raise ConfigError(f"scenario file '{path}' key 'peers.{scheme}': missing")
    return validate(DpPasgdScenario, section, f"scenario peers.{scheme}")


def plan_for_config(cfg: ExperimentConfig, d: int, sc: DpPasgdScenario
                    ) -> tuple[DpPasgdPlan, dict[str, Any]]:
    """000's plan for this config (G = example_clip, X = batch_size, eta = lr, M = devices,
    the config's epsilon and delta) and the config overrides that make a run follow it."""
    try:
        plan = plan_dp_pasgd(
            cfg.privacy.epsilon, cfg.privacy.delta, sc.budget, c1=sc.c1, c2=sc.c2,
            G=cfg.privacy.example_clip, X=float(cfg.batch_size), d=d, num_devices=cfg.devices,
            smoothness=sc.smoothness, strong_convexity=sc.strong_convexity,
            learning_rate=cfg.lr, grad_variance=sc.grad_variance, initial_gap=sc.initial_gap,
        )
    except ValueError as exc:
        raise ConfigError(f"dp-pasgd plan: {exc}") from None
    # the testbed's multiplier z: noise std on the averaged clipped gradient is z C / B
    z = plan.sigma * cfg.batch_size / cfg.privacy.example_clip
    overrides = {
        "scheme": "dp-pasgd", "privacy.unit": "record", "privacy.noise": "per-step",
        "local_steps": int(plan.tau), "rounds": int(plan.K // plan.tau),
        "privacy.noise_multiplier": float(z),
    }
    return plan, overrides


def save_peer_plan(path: Path, scheme: str, plan: DpPasgdPlan, overrides: dict[str, Any]) -> None:
    """Write a peer plan file (atomic)."""
    from testbed.config.safe_yaml import dump_yaml_text
    from testbed.rundir import atomic_write_bytes

    body = {"format": PEER_PLAN_FORMAT, "scheme": scheme, "overrides": overrides,
            "plan": plan.to_dict()}
    atomic_write_bytes(Path(path), dump_yaml_text(body).encode())


def peer_plan_overrides(path: Path) -> list[str] | None:
    """``KEY=VALUE`` overrides of a peer plan file, or ``None`` if it is not one."""
    data = read_yaml_mapping(Path(path), "plan file")
    if data.get("format") != PEER_PLAN_FORMAT:
        return None
    over = data.get("overrides")
    if not isinstance(over, dict):
        raise ConfigError(f"plan file '{path}' key 'overrides': missing or not a mapping")
    return [f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in over.items()]
