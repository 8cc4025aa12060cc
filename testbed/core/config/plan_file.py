"""The plan file written by ``testbed plan`` and read by ``testbed run`` (scheme ee-dp-fl).

Schema (YAML mapping, ``format: dpfl-plan/1``; unknown keys are refused)::

    format: dpfl-plan/2       # dpfl-plan/1 (device unit only) is still read
    unit: device              # device | record (privacy unit the plan was made for)
    accounting: paper         # the accounting the plan's constraint uses: paper | strict
                              #   (device unit), pld | rdp (record unit, dp-accounting)
    scheme: ee-dp-fl          # ee-dp-fl | s-dp-fl | ldp-fedavg | channel-dp
    family: qs                # qs: sparsify+quantize, s: sparsify only, none: uncompressed
    T: 1700                   # total local iterations, T = K * H
    K: 85                     # uploads (global rounds) per device
    H: 20                     # local SGD steps per round
    d: 21840                  # model size
    l: 21840                  # coordinates kept by sparsification (l = d: none)
    Q: 29                     # quantization levels, null = no quantization
    clip_bound: 5.0           # Z, l2 bound of the clipped differential
    epsilon_target: 1.8
    delta: 1.0e-05
    trusted: 1.0              # fraction of channel noise credited for privacy
    energy_j: 1.70            # predicted total energy of all devices (J)
    energy_comm_j: 0.0        # ... of which radio
    energy_comp_j: 1.70       # ... of which computing
    tx_power_ref_w: 0.1       # W radiated by a unit-power symbol stream
    t_cm_s: 5.0e-06           # complex-symbol duration (s)
    beta1: 10.0               # convergence constants used
    beta2: 3.0e-07
    required_uploads: 84.6    # right side of the convergence bound (25) at this plan
    strict_exceeds_target: true   # strict accounting above epsilon_target for some device
    notes: [...]              # plain-language warnings (e.g. strict > target)
    devices:                  # one entry per device, id 0..N-1 in order
      - id: 0
        h: 0.91               # |h_i| assumed
        n0: 0.005             # channel noise variance per real coordinate (symbol-power units)
        alpha: 0.0123         # power scaling alpha_i (symbol-power units per unit value)
        sigma: 0.0            # artificial noise std per coordinate
        power_w: 0.031        # mean transmit power (W), upper bound via Lemma 3
        p_max_w: 0.1
        e_comm_j: 1.2e-05     # radio energy per upload (J)
        e_comp_j: 0.02        # computing energy per round (J)
        epsilon_paper: 1.79   # 003 Theorem 1 corrected, after K uploads
        epsilon_strict: 40.2  # strict accounting, null when the accountant is unavailable
        regime: channel       # channel | artificial | power-capped
        epsilon: 1.79         # in the plan's accounting (record: dp-accounting, as the run)
        epsilon_no_channel: null  # record: with no channel credit (better eavesdropper)
        epsilon_device_level: null  # record: the same run for a device's whole data
        noise_multiplier: null    # record: z_eff = sqrt(sigma^2 + credited channel) B / C
    solver: {iterations: 3, converged: true, alternation_energies: [...], seconds: 0.4,
             continuous_energy_j: 1.68}
    record:                   # record unit only (null for device plans)
      accountant: pld         # as privacy.accountant of the run
      relation: add-remove
      amplified: true         # secret Poisson sampling (privacy.secure_sampling)
      example_clip: 1.0       # C
      expected_batch: 1024    # B
      dataset_sizes: [6000, ...]
      sampling_rates: [0.1707, ...]   # q_i = B / D_i
      noise_floor_z: [2.13, ...]      # z_min(q_i, K) the target needs (with the margin)
      margin: 0.995           # calibrated to margin * epsilon_target
      convergence_model: decoded-noise/v1
    target_loss: 0.75         # training loss the calibration's constants were fitted for
                              #   (a run following the plan reports its energy to reach it)

Units: ``alpha`` multiplies the compressed vector before it is packed two reals per complex
symbol; ``power_w = tx_power_ref_w * mean |x|^2``. See docs/solver.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import validate
from testbed.core.config.safe_yaml import read_yaml_mapping, short_repr

#: Formats :func:`load_plan` reads (``/1``: device-level plans before the record unit).
READABLE_FORMATS = ("dpfl-plan/1", "dpfl-plan/2")


class _Strict(BaseModel):
    # inf (e.g. a strict epsilon with nothing credited) must survive JSON, not become null.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")


class DevicePlan(_Strict):
    """One device's share of a plan."""

    id: int = Field(ge=0)
    h: float = Field(gt=0)
    n0: float = Field(gt=0)
    alpha: float = Field(gt=0)
    sigma: float = Field(ge=0)
    power_w: float = Field(ge=0)
    p_max_w: float = Field(gt=0)
    e_comm_j: float = Field(ge=0)
    e_comp_j: float = Field(ge=0)
    epsilon_paper: float | None = Field(None, ge=0)
    epsilon_strict: float | None = Field(None, ge=0)
    regime: Literal["channel", "artificial", "power-capped"]
    epsilon: float | None = Field(None, ge=0)
    epsilon_no_channel: float | None = Field(None, ge=0)
    epsilon_device_level: float | None = Field(None, ge=0)
    noise_multiplier: float | None = Field(None, ge=0)


class RecordPlanInfo(_Strict):
    """What a record-level plan assumed about sampling and accounting (``unit: record``)."""

    accountant: Literal["pld", "rdp"]
    relation: Literal["add-remove", "replace-one"]
    amplified: bool
    example_clip: float = Field(gt=0)
    expected_batch: float = Field(gt=0)
    dataset_sizes: list[int] = Field(min_length=1)
    sampling_rates: list[float] = Field(min_length=1)
    noise_floor_z: list[float] = Field(min_length=1)
    margin: float = Field(gt=0, le=1)
    convergence_model: str


class SolverInfo(_Strict):
    """How the plan was found."""

    iterations: int = Field(ge=0)
    converged: bool
    alternation_energies: list[float]
    continuous_energy_j: float
    seconds: float = Field(ge=0)


class Plan(_Strict):
    """A validated plan (see the module docstring for every field)."""

    format: Literal["dpfl-plan/1", "dpfl-plan/2"] = "dpfl-plan/2"
    unit: Literal["device", "record"] = "device"
    accounting: str = "paper"
    scheme: Literal["ee-dp-fl", "s-dp-fl", "ldp-fedavg", "channel-dp"]
    family: Literal["qs", "s", "none"]
    T: int = Field(ge=1)
    K: int = Field(ge=1)
    H: int = Field(ge=1)
    d: int = Field(ge=1)
    l: int = Field(ge=1)
    Q: int | None = Field(None, ge=1)
    clip_bound: float = Field(gt=0)
    epsilon_target: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    trusted: float = Field(ge=0, le=1)
    energy_j: float = Field(ge=0)
    energy_comm_j: float = Field(ge=0)
    energy_comp_j: float = Field(ge=0)
    tx_power_ref_w: float = Field(gt=0)
    t_cm_s: float = Field(gt=0)
    beta1: float = Field(ge=0)
    beta2: float = Field(gt=0)
    required_uploads: float = Field(ge=0)
    strict_exceeds_target: bool | None = None
    notes: list[str] = Field(default_factory=list)
    devices: list[DevicePlan] = Field(min_length=1)
    solver: SolverInfo
    record: RecordPlanInfo | None = None
    target_loss: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        if self.T != self.K * self.H:
            raise ValueError(f"T: got {self.T}; must equal K * H = {self.K * self.H}")
        if self.l > self.d:
            raise ValueError(f"l: got {self.l}; allowed: 1 <= l <= d = {self.d}")
        if (self.Q is None) != (self.family != "qs"):
            raise ValueError(f"Q: got {self.Q!r}; family {self.family!r} "
                             f"{'needs' if self.family == 'qs' else 'takes no'} Q")
        if self.family == "none" and self.l != self.d:
            raise ValueError(f"l: got {self.l}; family 'none' sends all d = {self.d}")
        if (self.record is None) != (self.unit == "device"):
            raise ValueError(f"record: unit {self.unit!r} "
                             f"{'needs' if self.unit == 'record' else 'takes no'} a record mapping")
        ids = [dev.id for dev in self.devices]
        if ids != list(range(len(ids))):
            raise ValueError(f"devices: ids must be 0..N-1 in order, got {ids}")
        return self

    @property
    def n_devices(self) -> int:
        """N."""
        return len(self.devices)


def plan_to_dict(plan: Plan) -> dict:
    """Plain mapping in schema order."""
    return plan.model_dump(mode="json")


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write ``plan`` as YAML to ``path`` (parents created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(plan_to_dict(plan), sort_keys=False))
    return out


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; :class:`ConfigError` names the offending key."""
    p = Path(path)
    data = read_yaml_mapping(p, "plan file")
    if data.get("format") not in READABLE_FORMATS:
        raise ConfigError(
            f"plan file '{p}' key 'format': got {short_repr(data.get('format'))}; allowed: "
            f"{' or '.join(map(repr, READABLE_FORMATS))} (is it a file written by "
            "`testbed plan --out`?)"
        )
    return validate(Plan, data, "plan")
