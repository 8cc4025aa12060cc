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
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.loader import validate
from testbed.core.config.safe_yaml import read_yaml_mapping

#: Format tag of a peer plan file.
PEER_PLAN_FORMAT = "dpfl-peer-plan/1"


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


class FedsgdDpcScenario(BaseModel):
    """``peers: fedsgd-dpc:``: 004's mechanism (Gaussian; the paper fixes T for it) and its
    convergence constants (docs/peers/fedsgd-dpc.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    mechanism: str = Field("gaussian", pattern="^gaussian$",
                           description="gaussian (Laplace is not run by the testbed yet)")
    T: int = Field(100, ge=1, le=1_000_000, description="rounds (the paper fixes T = 100)")
    smoothness: float = Field(gt=0)
    strong_convexity: float = Field(gt=0)
    grad_bound: float = Field(gt=0)
    non_iid: float = Field(ge=0)
    initial_gap: float = Field(ge=0)


class ZcdpSecaggScenario(BaseModel):
    """``peers: zcdp-secagg:``: 002's r devices per round, tau local steps, T rounds."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    r: int = Field(ge=3, le=100_000, description="devices per round (secure aggregation: >= 3)")
    tau: int = Field(1, ge=1, le=100_000, description="local steps per round")
    T: int = Field(ge=1, le=1_000_000, description="rounds")
    credit: bool = Field(
        False,
        description=(
            "plan with 002's 1/r secure-aggregation credit (trusts non-colluding peers); the "
            "run's enforced accounting does not credit it, so such a plan is usually refused"
        ),
    )


_SCENARIOS: dict[str, type[BaseModel]] = {
    "dp-pasgd": DpPasgdScenario, "fedsgd-dpc": FedsgdDpcScenario,
    "zcdp-secagg": ZcdpSecaggScenario,
}


def read_peer_scenario(path: str | Path | None, scheme: str) -> Any:
    """The ``peers: SCHEME:`` mapping of a scenario file.

    Raises
    ------
    ConfigError
        No file, no such section, or a bad key (named).
    """
    if path is None:
        keys = ", ".join(_SCENARIOS[scheme].model_fields)
        raise ConfigError(
            f"--scenario: the {scheme} planner needs a scenario file with 'peers: {scheme}: "
            f"{{{keys}}}' (docs/peers/{scheme}.md)"
        )
    data = read_yaml_mapping(Path(path), "scenario file")
    section = (data.get("peers") or {}).get(scheme) if isinstance(data.get("peers"), dict) else None
    if section is None:
        raise ConfigError(f"scenario file '{path}' key 'peers.{scheme}': missing")
    return validate(_SCENARIOS[scheme], section, f"scenario peers.{scheme}")


def plan_peer(scheme: str, cfg: ExperimentConfig, d: int, sizes: list[int], sc: Any
              ) -> tuple[Any, dict[str, Any]]:
    """The peer ``scheme``'s own plan for this config and the overrides a run follows it
    with; ``sizes``: each device's data set size."""
    if scheme == "dp-pasgd":
        plan, overrides = plan_for_config(cfg, d, sc)
    else:
        try:
            if scheme == "fedsgd-dpc":
                plan, overrides = _plan_fedsgd_dpc(cfg, d, sizes, sc)
            else:
                plan, overrides = _plan_zcdp_secagg(cfg, sizes, sc)
        except ValueError as exc:
            raise ConfigError(f"{scheme} plan: {exc}") from None
    check_run_accepts(cfg, sizes, scheme, overrides)
    return plan, overrides


class PeerPlanRefused(RuntimeError):
    """The run, which enforces the testbed's accounting, would refuse the paper's plan."""


def check_run_accepts(cfg: ExperimentConfig, sizes: list[int], scheme: str,
                      overrides: dict[str, Any]) -> float:
    """The testbed's epsilon of the plan's noise if every device took part in every round
    (the run calibrates and gates per device the same way); returns it.

    Raises
    ------
    PeerPlanRefused
        Above the config's target: the run would stop with ``budget_exhausted``.
    """
    from testbed.core.privacy.accountants.record_planning import record_epsilon_for

    q = cfg.batch_size / min(sizes) if cfg.privacy.secure_sampling else 1.0
    steps = int(overrides["rounds"]) * int(overrides["local_steps"])
    eps = record_epsilon_for(
        q=min(1.0, q), z=float(overrides["privacy.noise_multiplier"]), steps=steps,
        delta=cfg.privacy.delta, accountant=cfg.privacy.accountant,
        relation=cfg.privacy.relation,
    ).epsilon
    if eps > cfg.privacy.epsilon:
        raise PeerPlanRefused(
            f"{scheme}: the paper's plan (noise multiplier "
            f"{overrides['privacy.noise_multiplier']:.4g}) gives epsilon {eps:.4g} > "
            f"{cfg.privacy.epsilon:g} under the run's accounting ({cfg.privacy.accountant}, "
            f"Poisson sampling, no secure-aggregation credit); the run would refuse it"
            + (" (the plan relies on 002's 1/r credit: set credit: false)" if scheme ==
               "zcdp-secagg" else "")
        )
    return float(eps)


def _plan_fedsgd_dpc(cfg: ExperimentConfig, d: int, sizes: list[int], sc: FedsgdDpcScenario
                     ) -> tuple[Any, dict[str, Any]]:
    from aggregator.peers.fedsgd_dpc import plan_fedsgd_dpc
    from aggregator.peers.fedsgd_dpc_accounting import gaussian_noise_multiplier
    from aggregator.peers.fedsgd_dpc_bound import ConvergenceConstants

    n_i = float(min(sizes))
    q = cfg.batch_size / n_i
    consts = ConvergenceConstants(
        smoothness=sc.smoothness, strong_convexity=sc.strong_convexity,
        grad_bound=sc.grad_bound, non_iid=sc.non_iid, initial_gap=sc.initial_gap,
    )
    plan = plan_fedsgd_dpc(
        cfg.privacy.epsilon, cfg.privacy.delta, cfg.devices, "gaussian", consts, dim=d,
        n_samples=n_i, clip=cfg.privacy.example_clip, q=q, T_fixed=sc.T,
    )
    z = gaussian_noise_multiplier(plan.noise_scale, q=q, clip_l2=cfg.privacy.example_clip,
                                  local_size=n_i)
    return plan, {
        "scheme": "fedsgd-dpc", "privacy.unit": "record", "privacy.noise": "per-step",
        "local_steps": 1, "rounds": int(plan.T), "clients_per_round": int(plan.b),
        "privacy.noise_multiplier": float(z),
    }


def _plan_zcdp_secagg(cfg: ExperimentConfig, sizes: list[int], sc: ZcdpSecaggScenario
                      ) -> tuple[Any, dict[str, Any]]:
    from aggregator.peers.zcdp_secagg import plan_zcdp_secagg

    m = int(min(sizes))
    plan = plan_zcdp_secagg(
        cfg.privacy.epsilon, cfg.privacy.delta, cfg.devices, sc.r, sc.tau, sc.T,
        cfg.privacy.example_clip, m, int(cfg.batch_size),
        colluding=0 if sc.credit else sc.r - 1,
    )
    z = plan.sigma * cfg.batch_size / cfg.privacy.example_clip
    return plan, {
        "scheme": "zcdp-secagg", "privacy.unit": "record", "privacy.noise": "per-step",
        "local_steps": int(sc.tau), "rounds": int(sc.T), "clients_per_round": int(sc.r),
        "privacy.noise_multiplier": float(z),
    }


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


def save_peer_plan(path: Path, scheme: str, plan: Any, overrides: dict[str, Any]) -> None:
    """Write a peer plan file (atomic)."""
    from testbed.core.config.safe_yaml import dump_yaml_text
    from testbed.core.runs.rundir import atomic_write_bytes

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
