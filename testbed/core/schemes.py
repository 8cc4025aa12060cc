"""The FL schemes as uplink settings per device: noise, compression, power, channel credit.

| scheme | artificial noise | sparsify | quantize | channel noise credited |
| --- | --- | --- | --- | --- |
| ``fedavg`` | none | no | no | no DP at all |
| ``ldp-fedavg`` | Gaussian, before | no | no | no (local DP) |
| ``s-dp-fl`` | Gaussian, before | yes | no | no |
| ``channel-dp`` | Gaussian, before | no | no | yes (``trusted_channel_noise``) |
| ``ee-dp-fl`` | Gaussian, before | yes | yes | yes |
| ``noise-after-compression`` | discrete Gaussian, after | yes | yes (fixed scale) | yes |

"yes" is ``SchemeSpec.credit_channel``: the scheme asks for the credit. A run gets it only
where the link's noise is secret (:mod:`testbed.core.channel_credit`, which resolves every run's
uplinks from a config whose ``trusted_channel_noise`` is 0 otherwise).

For DP schemes the power scaling ``alpha`` must not depend on the data, so it comes from
the config, a plan, or (by default) the largest value whose *expected* power bound
``alpha^2 theta_qs (Z^2 + d sigma^2) / n_symbols`` (003 Section V-A, per symbol) meets
``P_max``. ``sigma`` comes from the config, a plan, or (``privacy.sigma: null``, see
:func:`calibrate_sigma`) is the smallest value meeting the epsilon target over the planned
rounds at the mean channel gain, in the enforcing accounting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radio.units import noise_var_from_snr_db
from testbed.core.compression_bounds import theta_qs
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.privacy import epsilon_for


@dataclass(frozen=True)
class SchemeSpec:
    """What a scheme does on the uplink."""

    noise: str  # "none" | "before" | "after"
    sparsify: bool
    quantize: bool
    credit_channel: bool


SCHEMES: dict[str, SchemeSpec] = {
    "fedavg": SchemeSpec("none", False, False, False),
    "ldp-fedavg": SchemeSpec("before", False, False, False),
    "s-dp-fl": SchemeSpec("before", True, False, False),
    "channel-dp": SchemeSpec("before", False, False, True),
    "ee-dp-fl": SchemeSpec("before", True, True, True),
    "noise-after-compression": SchemeSpec("after", True, True, True),
    # 000 DP-PASGD: DP-SGD steps on the device (per-step noise), averaging every tau steps
    "dp-pasgd": SchemeSpec("before", False, False, False),
    # 004 FedSGD-DPC: b of N devices per round, one noisy step each
    "fedsgd-dpc": SchemeSpec("before", False, False, False),
    # 002: r of n devices, tau noisy steps, secure aggregation on the control plane
    "zcdp-secagg": SchemeSpec("before", False, False, False),
    # over-the-air aggregation: every device in one slot, its share of the noise (record
    # unit, upload noise); the receiver's noise is credited to all (docs/privacy.md §12)
    "aircomp": SchemeSpec("before", False, False, True),
}


@dataclass(frozen=True)
class DeviceUplink:
    """One device's uplink parameters for a run.

    Attributes
    ----------
    mechanism
        ``none``, ``before`` or ``after`` (see :mod:`testbed.core.privacy.events`).
    sigma
        Artificial noise std per coordinate (for ``after``: in units of C(g)).
    alpha
        Power scaling; ``None`` = normalise each upload to unit power (fedavg only).
    l, levels
        Coordinates sent and quantization levels (``None``: no quantization).
    trusted
        Fraction of channel noise credited (0 when the scheme credits none).
    quantizer_scale
        ``norm`` (sent as side information, eq. 7) or ``fixed`` (public bound).
    expected_power
        Bound on the expected mean symbol power (symbol-power units), ``None`` for fedavg.
    """

    mechanism: str
    sigma: float
    alpha: float | None
    l: int
    levels: int | None
    trusted: float
    quantizer_scale: str
    expected_power: float | None


def kept_coordinates(cfg: ExperimentConfig, d: int) -> int:
    """``l``: ``max(1, floor(theta_s d))`` when the scheme sparsifies, else ``d``.

    The one place ``l`` is derived from ``compression.theta_s``, when the model's size
    ``d`` is known: before any round or training (the uplinks of the aggregator, of every
    edge, of a plan).

    Raises
    ------
    ConfigError
        ``theta_s * d < 1``: the ratio keeps fewer than one of the ``d`` coordinates (it
        would silently send one); names the key, the value, ``d`` and the least allowed
        value ``1/d``.
    """
    if not SCHEMES[cfg.scheme].sparsify or not cfg.compression.sparsify:
        return d
    theta_s = cfg.compression.theta_s
    # a tolerance of 1e-9 lets theta_s = 1/d through whatever its rounding
    if theta_s * d < 1 - 1e-9:
        raise ConfigError(
            f"config key 'compression.theta_s': got {theta_s!r}, which keeps "
            f"{theta_s * d:.3g} of the model's d = {d} coordinates (fewer than one); "
            f"allowed: theta_s >= 1/d = {1 / d!r} (or compression.sparsify: false)"
        )
    return max(1, int(math.floor(theta_s * d)))


def quant_levels(cfg: ExperimentConfig) -> int | None:
    """Q when the scheme quantizes, else ``None``."""
    spec = SCHEMES[cfg.scheme]
    return cfg.compression.levels if spec.quantize and cfg.compression.quantize else None


def expected_power_bound(
    *, d: int, l: int, levels: int | None, alpha: float, clip: float, sigma: float, mechanism: str
) -> float:
    """Bound on the expected mean power per symbol of ``alpha * C(g + eta)``.

    ``E||C(g + eta)||^2 <= theta_qs (Z^2 + d sigma^2)`` (Lemma 3 with ``||g|| <= Z``); for
    noise after compression ``E||C(g) + eta||^2 <= theta_qs Z^2 + l sigma^2``. Divided by
    the ``ceil(l / 2)`` symbols that carry the ``l`` values.
    """
    tq = theta_qs(d=d, l=l, levels=levels)
    if mechanism == "after":
        energy = tq * clip**2 + l * sigma**2
    else:
        energy = tq * (clip**2 + d * sigma**2)
    return alpha**2 * energy / ((l + 1) // 2)


def max_alpha(
    *,
    d: int,
    l: int,
    levels: int | None,
    clip: float,
    sigma: float,
    mechanism: str,
    p_max_units: float,
) -> float:
    """Largest alpha whose expected power bound equals ``p_max_units``."""
    unit = expected_power_bound(
        d=d, l=l, levels=levels, alpha=1.0, clip=clip, sigma=sigma, mechanism=mechanism
    )
    return math.sqrt(p_max_units / unit)


def mean_n0_per_real(cfg: ExperimentConfig, device: int) -> float:
    """The device's channel noise per real coordinate at its configured SNR (N0 / 2)."""
    if cfg.noiseless:
        return 0.0
    return noise_var_from_snr_db(cfg.snr_db_per_device()[device]) / 2.0


def device_epsilon(
    cfg: ExperimentConfig,
    up: DeviceUplink,
    d: int,
    device: int,
    mode: str,
    rounds: int | None = None,
) -> float:
    """Epsilon after ``rounds`` (default: all) uploads at unit channel gain."""
    if up.mechanism == "none":
        return math.inf
    return epsilon_for(
        mode=mode,
        sigma=up.sigma,
        alpha=up.alpha or 0.0,
        h=1.0,
        n0=mean_n0_per_real(cfg, device),
        rounds=cfg.rounds if rounds is None else rounds,
        d=d,
        l=up.l,
        q=up.levels,
        clip=cfg.clip.bound,
        delta=cfg.privacy.delta,
        trusted=up.trusted,
        clip_mode=cfg.clip.mode,
        noise_position=up.mechanism,
    ).epsilon


def resolve_uplinks(
    cfg: ExperimentConfig, hw: HardwareConfig, d: int, devices: Sequence[int] | None = None
) -> list[DeviceUplink]:
    """Per-device uplink settings of a run, validated against power and privacy targets
    (``devices``: only these devices, in this order; default every device).

    Raises
    ------
    ConfigError
        When a configured alpha exceeds a device's power limit, or no sigma reaches the
        epsilon target.
    """
    spec = SCHEMES[cfg.scheme]
    ids = range(cfg.devices) if devices is None else devices
    if cfg.plan is not None:
        planned = uplinks_from_plan(cfg, hw, d)
        return [planned[i] for i in ids]
    l = kept_coordinates(cfg, d)
    levels = quant_levels(cfg)
    if spec.noise == "none":
        return [
            DeviceUplink("none", 0.0, cfg.power.alpha, d, None, 0.0, "norm", None)
            for _ in ids
        ]
    trusted = cfg.privacy.trusted_channel_noise if spec.credit_channel else 0.0
    scale = "fixed" if spec.noise == "after" else "norm"
    p_units = cfg.power.p_max_w / hw.tx_power_ref_w
    out = []
    for i in ids:
        sigma = cfg.privacy.sigma
        alpha = cfg.power.alpha
        if sigma is None:
            sigma, alpha = calibrate_sigma(
                cfg, d, i, l, levels, trusted, scale, spec.noise, alpha, p_units
            )
        shape: dict[str, Any] = {
            "d": d,
            "l": l,
            "levels": levels,
            "clip": cfg.clip.bound,
            "sigma": sigma,
            "mechanism": spec.noise,
        }
        limit = max_alpha(**shape, p_max_units=p_units)
        if alpha is None:
            alpha = limit
        power = expected_power_bound(**shape, alpha=alpha)
        if power > p_units * (1 + 1e-9):
            raise ConfigError(
                f"config key 'power.alpha': got {alpha}; device {i}'s expected power "
                f"{power * hw.tx_power_ref_w:.4g} W exceeds power.p_max_w={cfg.power.p_max_w} W "
                f"with sigma={sigma:.4g}; allowed: alpha <= {limit:.6g}"
            )
        out.append(
            DeviceUplink(spec.noise, float(sigma), float(alpha), l, levels, trusted, scale, power)
        )
    return out


def calibrate_sigma(
    cfg: ExperimentConfig,
    d: int,
    device: int,
    l: int,
    levels: int | None,
    trusted: float,
    scale: str,
    mechanism: str,
    alpha: float | None,
    p_units: float,
) -> tuple[float, float | None]:
    """Smallest sigma (bisection) whose epsilon over ``rounds`` uploads meets the target.

    With ``alpha`` unset, alpha follows sigma (full power: the largest alpha within
    ``P_max`` for that sigma), so both are returned. Epsilon is evaluated at unit channel
    gain in the enforcing accounting; under fading the budget guard stops devices whose
    realized channel spent more.
    """
    target = cfg.privacy.epsilon
    mode = cfg.privacy.accounting

    def eps_at(sigma: float) -> tuple[float, float]:
        a = (
            alpha
            if alpha is not None
            else max_alpha(
                d=d,
                l=l,
                levels=levels,
                clip=cfg.clip.bound,
                sigma=sigma,
                mechanism=mechanism,
                p_max_units=p_units,
            )
        )
        up = DeviceUplink(mechanism, sigma, a, l, levels, trusted, scale, None)
        return device_epsilon(cfg, up, d, device, mode), a

    if eps_at(0.0)[0] <= target:
        return 0.0, alpha
    hi = cfg.clip.bound
    for _ in range(60):
        if eps_at(hi)[0] <= target:
            break
        hi *= 2.0
    else:
        raise ConfigError(
            f"config key 'privacy.epsilon': got {target}; no artificial noise level reaches it "
            f"over {cfg.rounds} rounds in the {mode} accounting"
        )
    lo = 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if eps_at(mid)[0] <= target:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    return hi, (alpha if alpha is not None else eps_at(hi)[1])


def load_checked_plan(cfg: ExperimentConfig, d: int) -> Any:
    """The config's plan file, refused unless the config agrees with what the plan assumed.

    Checked: privacy unit and the enforced accounting (a plan made under another accounting
    would be refused by the budget guard), scheme, devices, rounds, H, d, epsilon, delta,
    the trusted fraction where credited, and per unit the clip bound (device) or the
    example clip, batch size, relation and secret sampling (record).
    """
    from testbed.core.config.plan_file import load_plan

    if cfg.plan is None:
        raise ValueError("load_checked_plan needs a config with a plan")
    plan = load_plan(cfg.plan)
    pc = cfg.privacy
    acc_key = "privacy.accountant" if plan.unit == "record" else "privacy.accounting"
    checks: list[tuple[str, Any, Any]] = [
        ("privacy.unit", pc.unit, plan.unit),
        (acc_key, pc.enforced, plan.accounting),
        ("scheme", cfg.scheme, plan.scheme),
        ("devices", cfg.devices, plan.n_devices),
        ("rounds", cfg.rounds, plan.K),
        ("local_steps", cfg.local_steps, plan.H),
        ("privacy.epsilon", pc.epsilon, plan.epsilon_target),
        ("privacy.delta", pc.delta, plan.delta),
        ("model size d", d, plan.d),
    ]
    if plan.record is None:
        checks.append(("clip.bound", cfg.clip.bound, plan.clip_bound))
    else:
        rec = plan.record
        checks += [
            ("privacy.example_clip", pc.example_clip, rec.example_clip),
            ("batch_size", float(cfg.batch_size), rec.expected_batch),
            ("privacy.relation", pc.relation, rec.relation),
            ("privacy.secure_sampling", pc.secure_sampling, rec.amplified),
        ]
    if SCHEMES[cfg.scheme].credit_channel and plan.trusted > 0:
        checks.append(("privacy.trusted_channel_noise", pc.trusted_channel_noise, plan.trusted))
    for key, have, want in checks:
        if have != want and not (
            isinstance(have, float) and isinstance(want, float) and math.isclose(have, want)
        ):
            raise ConfigError(
                f"config key '{key}': got {have!r} but plan '{cfg.plan}' was made for "
                f"{want!r}; set --set {key}={want} (or run with `testbed run CONFIG --plan "
                f"{cfg.plan}`, which takes scheme and rounds from the plan) or re-plan"
            )
    return plan


def uplinks_from_plan(cfg: ExperimentConfig, hw: HardwareConfig, d: int) -> list[DeviceUplink]:
    """Per-device settings from a ``testbed plan`` file (``plan:`` key).

    The plan fixes l, Q, alpha_i and sigma_i; the config must agree with it on everything
    else the plan assumed (scheme, devices, rounds, H, d, Z, epsilon, delta, trusted
    fraction), and each device's power is re-checked here against ``power.p_max_w``.
    """
    plan = load_checked_plan(cfg, d)
    spec = SCHEMES[cfg.scheme]
    trusted = plan.trusted if spec.credit_channel else 0.0
    out = []
    for dev in plan.devices:
        power = checked_plan_power(cfg, hw, d, plan, dev, clip=cfg.clip.bound,
                                   mechanism=spec.noise)
        out.append(
            DeviceUplink(spec.noise, dev.sigma, dev.alpha, plan.l, plan.Q, trusted, "norm", power)
        )
    return out


def checked_plan_power(
    cfg: ExperimentConfig, hw: HardwareConfig, d: int, plan: Any, dev: Any, *, clip: float,
    mechanism: str,
) -> float:
    """Expected power bound (symbol-power units) of one device of a plan, re-checked here
    against ``power.p_max_w``; :class:`ConfigError` when the plan's alpha exceeds it."""
    power = expected_power_bound(
        d=d, l=plan.l, levels=plan.Q, alpha=dev.alpha, clip=clip, sigma=dev.sigma,
        mechanism=mechanism,
    )
    if power > cfg.power.p_max_w / hw.tx_power_ref_w * (1 + 1e-6):
        raise ConfigError(
            f"plan '{cfg.plan}': device {dev.id}'s alpha={dev.alpha} gives an expected "
            f"power of {power * hw.tx_power_ref_w:.4g} W above power.p_max_w="
            f"{cfg.power.p_max_w} W"
        )
    return power
