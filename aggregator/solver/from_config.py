"""Build a solver :class:`Scenario` from an experiment config plus an optional scenario file.

The experiment schema lacks what only the solver needs (beta1/beta2, per-device gains, Q
bounds), so ``testbed plan CONFIG --scenario FILE`` takes a YAML file whose ``solver:``
mapping (or the whole file, if it has no ``solver`` key) may set::

    solver:
      h: [1.0, 0.8, ...]       # |h_i| per device (default: 1, the mean gain at snr_db)
      n0: [0.005, ...]         # channel noise per REAL coordinate (default: from snr_db)
      p_max_w: [0.1, ...]      # W per device (default: power.p_max_w)
      e_comp_j: [0.5, ...]     # J per round per device (default: energy.e_comp_j)
      d: 21840                 # model size (default: counted from the config's model)
      beta1: 10.0              # convergence constants of (25) (default: uncalibrated values,
      beta2: 3.0e-7            #   see DEFAULT_BETAS, a note says so in the plan output)
      calibration: cal.yaml    # or: take beta1/beta2 from `testbed calibrate --out` output
      q_min: 1
      q_max: 32                # 003: 1 <= Q <= 32
      l_min: 1
      k_max: 10000000
      rounds_margin: 0.1       # record unit: plan for (1 + margin) x the modelled rounds
                               #   (default: the calibration's fit error; 0 = none)

From the experiment config: ``devices``, ``local_steps`` (H), ``clip.bound`` (Z, with
``clip.mode: coordinate`` required: the paper accounting's kappa/d needs it),
``privacy.epsilon/delta/trusted_channel_noise``, ``snr_db`` (per device; ``N0 = 10^(-snr/10)``
per complex symbol, half of it per real coordinate), ``power.p_max_w``, ``energy.e_comp_j``;
from the hardware config: ``t_cm = 1 / symbol_rate_hz`` and ``tx_power_ref_w``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from aggregator.solver.record_problem import RecordTerms
from aggregator.solver.scenario import Scenario, ScenarioError
from radio.units import noise_var_from_snr_db
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import validate
from testbed.core.config.safe_yaml import read_yaml_mapping, short_repr

#: Used when neither the scenario file nor a calibration gives beta1/beta2 (not fitted:
#: the plan output says so).
DEFAULT_BETAS = (10.0, 3e-7)


class ScenarioFile(BaseModel):
    """The ``solver:`` mapping of a scenario file (every key optional).

    Types are strict (no booleans or strings for numbers) and numbers finite; a per-device
    value is a number or a non-empty list of numbers.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    h: list[float] | float | None = None
    n0: list[float] | float | None = None
    p_max_w: list[float] | float | None = None
    e_comp_j: list[float] | float | None = None
    d: int | None = Field(None, ge=1, le=10**10)
    beta1: float | None = Field(None, ge=0)
    beta2: float | None = Field(None, gt=0)
    calibration: str | None = None
    q_min: int = Field(1, ge=1)
    q_max: int = Field(32, ge=1)
    l_min: int = Field(1, ge=1)
    k_max: int = Field(10_000_000, ge=1, le=10**12)
    rounds_margin: float | None = Field(None, ge=0, le=10)

    @field_validator("h", "n0", "p_max_w", "e_comp_j", mode="before")
    @classmethod
    def _numbers(cls, v: Any) -> Any:
        # Checked before the list | float union so one error names the problem.
        if v is None:
            return v
        if isinstance(v, list) and not v:
            raise ValueError("allowed: a number or a non-empty list of numbers (one per device)")
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise ValueError(
                    f"{short_repr(x, 80)} is not a number; allowed: a number or a list of "
                    "numbers (one per device)"
                )
            if not math.isfinite(x):
                raise ValueError(f"{x} is not finite; allowed: finite numbers")
        return v


def read_scenario_file(path: str | Path | None) -> ScenarioFile:
    """Parse and validate a scenario file (``None``: all defaults)."""
    if path is None:
        return ScenarioFile.model_validate({})
    p = Path(path)
    data = read_yaml_mapping(p, "scenario file")
    if "solver" in data or "peers" in data:
        extra = sorted(str(k) for k in set(data) - {"solver", "peers"})
        if extra:
            raise ConfigError(
                f"scenario file key {short_repr(extra[0])}: unknown key (allowed: solver, "
                "peers)"
            )
        data = data.get("solver") or {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"scenario file key 'solver': got {short_repr(data)}; allowed: a mapping"
            )
    sf = validate(ScenarioFile, data, "scenario")
    if sf.calibration is not None and not Path(sf.calibration).is_absolute():
        sf = sf.model_copy(update={"calibration": str(p.parent / sf.calibration)})
    return sf


def scenario_from_config(
    cfg: ExperimentConfig,
    hw: HardwareConfig,
    sf: ScenarioFile,
    *,
    count_params: Callable[[ExperimentConfig], int] | None = None,
) -> tuple[Scenario, list[str]]:
    """The solver scenario of an experiment; returns it with notes for the user.

    ``count_params(cfg)`` gives d when the scenario file does not (the CLI passes a
    function that builds the model).
    """
    notes: list[str] = []
    if cfg.clip.mode != "coordinate":
        raise ConfigError(
            f"config key 'clip.mode': got {cfg.clip.mode!r}; the EE-DP-FL plan needs "
            "'coordinate' (003 per-coordinate clipping, which the paper accounting assumes); "
            "use --set clip.mode=coordinate"
        )
    if sf.d is not None:
        d = sf.d
    elif count_params is not None:
        d = count_params(cfg)
    else:
        raise ConfigError("scenario key 'd': model size needed (no parameter counter given)")
    if sf.beta1 is not None and sf.beta2 is not None:
        betas = (sf.beta1, sf.beta2)
    elif sf.calibration is not None:
        betas = read_calibration_betas(sf.calibration, model="paper-25")
        notes.append(f"beta1, beta2 from calibration file {sf.calibration}")
    else:
        betas = DEFAULT_BETAS
        notes.append(
            f"beta1 = {betas[0]:g}, beta2 = {betas[1]:g} are uncalibrated defaults; "
            "fit them with `testbed calibrate` for this model and data"
        )
    try:
        scn = Scenario(
            **_devices_and_link(cfg, hw, sf, notes),
            d=d, local_steps=cfg.local_steps, clip_bound=cfg.clip.bound,
            epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta,
            beta1=betas[0], beta2=betas[1], k_max=sf.k_max,
        )
    except ScenarioError as exc:
        raise ConfigError(f"scenario: {exc}") from None
    return scn, notes


def _devices_and_link(
    cfg: ExperimentConfig, hw: HardwareConfig, sf: ScenarioFile, notes: list[str]
) -> dict[str, Any]:
    """The per-device and link fields of a scenario (h, n0, p_max_w, e_comp_j, t_cm_s,
    tx_power_ref_w, trusted, Q/l/K bounds) from the config and scenario file; appends the
    notes about defaults and fading to ``notes``."""
    n = cfg.devices
    if sf.h is None:
        notes.append("h_i = 1 for every device (mean gain at the configured snr_db)")
    n0: Any = sf.n0 if sf.n0 is not None else [
        noise_var_from_snr_db(s) / 2.0 for s in cfg.snr_db_per_device()
    ]
    if cfg.fading != "none":
        notes.append(
            f"fading '{cfg.fading}': the plan assumes the fixed gains h_i; under fading the "
            "run's budget guard accounts each round's realized gain and may stop a device early"
        )
    return dict(
        h=_per_device(sf.h if sf.h is not None else 1.0, n, "h"),
        n0=_per_device(n0, n, "n0"),
        p_max_w=_per_device(sf.p_max_w if sf.p_max_w is not None else cfg.power.p_max_w,
                            n, "p_max_w"),
        e_comp_j=_per_device(
            sf.e_comp_j if sf.e_comp_j is not None else cfg.energy.e_comp_j, n, "e_comp_j"
        ),
        t_cm_s=1.0 / hw.symbol_rate_hz, tx_power_ref_w=hw.tx_power_ref_w,
        trusted=cfg.privacy.trusted_channel_noise, q_min=sf.q_min, q_max=sf.q_max,
        l_min=sf.l_min,
    )


def _per_device(value: Any, n: int, name: str) -> tuple[float, ...]:
    vals = value if isinstance(value, list) else [value] * n
    if len(vals) != n:
        raise ConfigError(f"scenario key '{name}': expected {n} values (devices), got {len(vals)}")
    return tuple(float(v) for v in vals)


def read_calibration_betas(path: str | Path, *, model: str) -> tuple[float, float]:
    """``(beta1, beta2)`` from a ``testbed calibrate --out`` file fitted for ``model``.

    ``model`` is the convergence model the plan uses (``"paper-25"`` for device-level plans,
    ``DECODED_NOISE_MODEL`` for record-level ones); a file without a ``model`` key is a
    device-level (``paper-25``) calibration.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"scenario key 'calibration': file '{p}' does not exist")
    data = read_yaml_mapping(p, "calibration file")
    have = data.get("model", "paper-25")
    if have != model:
        raise ConfigError(
            f"calibration file '{p}' key 'model': got {short_repr(have)}; this plan needs a "
            f"calibration of the {model!r} convergence model (run `testbed calibrate` with the "
            "same privacy.unit as the plan)"
        )
    b1, b2 = data.get("beta1"), data.get("beta2")
    if any(isinstance(b, bool) or not isinstance(b, int | float) for b in (b1, b2)):
        raise ConfigError(
            f"calibration file '{p}': needs numeric keys 'beta1' and 'beta2' "
            f"(got {short_repr(b1, 60)}, {short_repr(b2, 60)})"
        )
    assert isinstance(b1, int | float) and isinstance(b2, int | float)
    b1, b2 = float(b1), float(b2)
    if not (math.isfinite(b1) and math.isfinite(b2)) or b1 < 0 or b2 <= 0:
        raise ConfigError(
            f"calibration file '{p}': need finite beta1 >= 0 and beta2 > 0, got {b1}, {b2}"
        )
    return b1, b2


def record_scenario_from_config(
    cfg: ExperimentConfig,
    hw: HardwareConfig,
    sf: ScenarioFile,
    *,
    d: int,
    dataset_sizes: list[int],
) -> tuple[Scenario, RecordTerms, list[str]]:
    """Scenario and record terms of a record-level FedSGD experiment (``privacy.unit: record``).

    The privacy target, delta, accountant, relation and sampling come from the config
    exactly as the run will use them; ``clip_bound`` is the power norm bound
    ``C sqrt(1 + 1/B)``. beta1, beta2 must be given (scenario file or a calibration of the
    ``decoded-noise/v1`` model): there are no defaults for the record unit.

    Raises
    ------
    ConfigError
        For a config the record-level planner does not cover, or missing constants.
    """
    from aggregator.solver.compression_terms import DECODED_NOISE_MODEL

    pc = cfg.privacy
    if pc.noise != "upload" or cfg.local_steps != 1:
        raise ConfigError(
            f"config keys 'privacy.noise'/'local_steps': got {pc.noise!r}/{cfg.local_steps}; "
            "record-level plans are for FedSGD with one noisy upload per round "
            "(privacy.noise=upload, local_steps=1), where the channel noise adds to the "
            "privacy noise (docs/privacy.md 10.2)"
        )
    if pc.noise_multiplier is not None:
        raise ConfigError(
            f"config key 'privacy.noise_multiplier': got {pc.noise_multiplier}; a plan sets the "
            "noise itself from the epsilon target; use null"
        )
    if sf.beta1 is not None and sf.beta2 is not None:
        margin = sf.rounds_margin or 0.0
        betas = (sf.beta1 * (1 + margin), sf.beta2 * (1 + margin))
        notes = ["beta1, beta2 from the scenario file"
                 + (f", times (1 + rounds_margin {margin:g})" if margin else "")]
    elif sf.calibration is not None:
        betas = read_calibration_betas(sf.calibration, model=DECODED_NOISE_MODEL)
        notes = [f"beta1, beta2 from calibration file {sf.calibration}"]
        if sf.rounds_margin is None:
            err = read_yaml_mapping(Path(sf.calibration), "calibration file").get("fit_error")
            margin = float(err) if isinstance(err, int | float) and err > 0 else 0.0
        else:
            margin = sf.rounds_margin
        if margin > 0:
            betas = (betas[0] * (1 + margin), betas[1] * (1 + margin))
            notes.append(
                f"rounds margin {margin:.3g}: the plan budgets (1 + {margin:.3g}) x the rounds "
                "the fitted model predicts (the calibration's fit error; scenario key "
                "'rounds_margin' sets it, 0 for none)"
            )
    else:
        raise ConfigError(
            "scenario keys 'beta1'/'beta2' or 'calibration': record-level plans need the "
            "convergence constants fitted for this model and data; run `testbed calibrate "
            "CONFIG --out cal.yaml` and pass `solver: {calibration: cal.yaml}`"
        )
    n = cfg.devices
    if len(dataset_sizes) != n:
        raise ConfigError(f"dataset sizes: expected {n}, got {len(dataset_sizes)}")
    for i, size in enumerate(dataset_sizes):
        if size < cfg.batch_size:
            raise ConfigError(
                f"config key 'batch_size': got {cfg.batch_size}; device {i} holds only {size} "
                "samples (the Poisson rate batch_size / samples must be <= 1)"
            )
    terms = RecordTerms(
        sampling_rates=tuple(cfg.batch_size / size for size in dataset_sizes),
        amplified=pc.secure_sampling, example_clip=pc.example_clip,
        expected_batch=float(cfg.batch_size), accountant=pc.accountant, relation=pc.relation,
    )
    try:
        scn = Scenario(
            **_devices_and_link(cfg, hw, sf, notes),
            d=d, local_steps=1, clip_bound=terms.norm_bound, epsilon=pc.epsilon,
            delta=pc.delta, beta1=betas[0], beta2=betas[1], k_max=min(sf.k_max, 100_000),
        )
    except ScenarioError as exc:
        raise ConfigError(f"scenario: {exc}") from None
    return scn, terms, notes


def calibration_range(path: str | Path) -> tuple[float, float, float] | None:
    """``(lowest, highest noise term, target loss)`` of the pilots a calibration fitted.

    ``None`` when the file holds no usable pilot data (e.g. constants typed in by hand).
    """
    data = read_yaml_mapping(Path(path), "calibration file")
    runs = data.get("runs")
    if not isinstance(runs, list):
        return None
    terms = [
        float(r["noise_term"]) for r in runs
        if isinstance(r, dict) and r.get("used") and isinstance(r.get("noise_term"), int | float)
    ]
    target = data.get("target_loss")
    if not terms or not isinstance(target, int | float):
        return None
    return min(terms), max(terms), float(target)
