"""The FL schemes under record-level privacy: per-device sampling, noise and channel credit.

With ``privacy.unit: record`` a device protects each of its samples (003 Definition 1):
every local step clips each example's gradient to ``C`` (``privacy.example_clip``), sums
over a Poisson batch of rate ``q_i = B / D_i`` (``B = batch_size``, ``D_i`` the device's
samples) and divides by ``B``. The noise goes either

* ``privacy.noise: per-step``: ``N(0, (z C)^2)`` on every local step's clipped sum (DP-SGD
  on the device). One :class:`~testbed.core.privacy.record_events.RecordEvent` of ``H`` steps
  per round; no channel noise is credited (it reaches only the last step's value through
  the weights, not linearly).
* ``privacy.noise: upload`` (needs ``local_steps: 1``, i.e. FedSGD): one noisy upload per
  round, ``v + N(0, sigma^2)`` with ``v`` the clipped sum over ``B``. Schemes that credit the
  channel, sent without quantization, add the channel noise after inversion,
  ``trusted n0 (l/d)^2 / (h alpha)^2`` per coordinate, to the same linear map; ``sigma`` is
  then only what the channel does not already provide at the mean channel gain.

With ``privacy.noise_distribution: laplace`` (scheme ``fedsgd-dpc`` only, 004's Laplace
mechanism) a device's one local step takes *all* its records (no sampling), clips each
example's gradient in the l1 norm to ``xi_1`` (``privacy.example_clip``), divides the sum by
the public ``D_i`` and adds ``Lap(0, s)`` per coordinate from the OS CSPRNG. ``D_i`` is the
device's shard size as partitioned, fixed before the first round (``dataset_size`` in every
ledger event and in the summary), and both the divisor and ``s = b xi_1 / D_i`` come from it,
never from the records a step sees. One record added or removed then moves the value by at
most ``xi_1 / D_i`` in l1, so each reply is
``(xi_1 / (D_i s))``-DP; ``s`` is set so the ``ceil(b T / N)`` replies a device makes under
round robin compose (basically, tight for pure DP) to the target
(:func:`~testbed.core.privacy.accountants.record_planning.calibrate_laplace_noise_multiplier`). Each
reply is one :class:`~testbed.core.privacy.record_events.LaplaceRecordEvent`.

The noise multiplier is calibrated per device with dp-accounting (in the enforced
accountant) so the target epsilon is met after ``rounds`` rounds; the budget guard, fed the
realized channel, stops a device that spent more. Derivations: ``docs/privacy.md`` section
"Record-level privacy".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from testbed.core.config.aircomp_checks import aircomp_colluding, aircomp_margin
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.privacy.accountants.record_planning import (
    calibrate_laplace_noise_multiplier,
    calibrate_noise_multiplier,
)
from testbed.core.privacy.analysis.aircomp_noise import share_sigma
from testbed.core.schemes import (
    SCHEMES,
    DeviceUplink,
    expected_power_bound,
    kept_coordinates,
    max_alpha,
    mean_n0_per_real,
    quant_levels,
)

#: Calibrate to this fraction of the target: the enforced PLD accountant composes per round
#: (and may round z down by 1e-3 relative for its cache), so a z calibrated exactly for
#: ``rounds x H`` steps could be refused by numerical noise in the very last round.
CALIBRATION_MARGIN = 0.995


@dataclass(frozen=True)
class RecordSettings:
    """One device's record-level mechanism for a run.

    Attributes
    ----------
    noise
        ``"per-step"`` or ``"upload"``.
    steps
        Subsampled-Gaussian steps per round's event (``H`` per-step, ``1`` upload).
    sampling_rate
        ``q = B / D``, Poisson inclusion probability of each record per step.
    amplified
        Whether the sampling is secret (CSPRNG), i.e. amplification is credited.
    example_clip, expected_batch
        ``C`` and ``B``.
    dataset_size
        ``D``, the device's records as partitioned, fixed before the first round; for the
        Laplace mechanism the public normaliser ``D_i`` (the divisor and the scale's).
    step_noise_multiplier
        ``z`` of the per-step noise ``N(0, (z C)^2)`` on the clipped sum (0 with upload noise).
    target_noise_multiplier
        The calibrated effective noise multiplier per step (artificial plus credited channel
        at the mean channel gain).
    relation
        ``"add-remove"`` or ``"replace-one"``.
    credit_channel
        Whether channel noise is credited (upload noise, a crediting scheme, no quantizer).
    noise_distribution
        ``"gaussian"`` (the above) or ``"laplace"``: full batch (``sampling_rate`` 1, not
        amplified, ``expected_batch = dataset_size``), l1 clip ``example_clip``, Laplace
        noise of scale ``laplace_scale``; ``target_noise_multiplier`` is then
        ``b = laplace_scale / (example_clip / dataset_size)`` and ``step_noise_multiplier``
        is 0.
    laplace_scale
        ``s``: Laplace scale per coordinate on the averaged gradient (gradient units; the
        variance is ``2 s^2``); ``0`` for the Gaussian.
    """

    noise: str
    steps: int
    sampling_rate: float
    amplified: bool
    example_clip: float
    expected_batch: float
    dataset_size: int
    step_noise_multiplier: float
    target_noise_multiplier: float
    relation: str
    credit_channel: bool
    noise_distribution: str = "gaussian"
    laplace_scale: float = 0.0


def laplace_replies(cfg: ExperimentConfig) -> int:
    """``ceil(b T / N)``: the most replies any device makes in ``T = rounds`` rounds when
    ``b = clients_per_round`` (default all) of ``N = devices`` reply, round robin."""
    b = cfg.clients_per_round or cfg.devices
    return -(-b * cfg.rounds // cfg.devices)


def check_delta_bound(cfg: ExperimentConfig, dataset_sizes: Sequence[int]) -> dict[str, Any]:
    """Refuse ``delta >= 1 / n`` before any work, ``n`` the size of the protected data set.

    A mechanism that publishes each of ``n`` individuals' data whole with probability
    ``delta`` is ``(0, delta)``-DP; at ``delta >= 1 / n`` it publishes about ``delta n >= 1``
    of them, so such a delta promises nothing. ``n`` depends on the unit: ``record``: the
    smallest device's record count ``min D_i`` (each device's records form the data set its
    guarantee is about); ``device``: the device population ``N = devices`` (a device's whole
    data set is one individual). No check without DP (``fedavg``).

    Parameters
    ----------
    cfg
        The run's config (``privacy.delta``, ``privacy.unit``,
        ``privacy.allow_large_delta``).
    dataset_sizes
        ``D_i`` per device (records), shape ``(devices,)``, as partitioned.

    Returns
    -------
    dict
        ``{}`` when ``delta < 1 / n``; with ``privacy.allow_large_delta`` and ``delta >= 1 /
        n``, the keys the summary's privacy section repeats: ``delta_exceeds_1_over_D``
        (``True``), ``delta_bound_n`` (``n``), ``delta_bound_unit`` and ``delta_note``.

    Raises
    ------
    ConfigError
        ``delta >= 1 / n`` without ``privacy.allow_large_delta``, naming ``privacy.delta``.
    """
    if cfg.scheme == "fedavg":
        return {}
    pc = cfg.privacy
    sizes = [int(v) for v in dataset_sizes if int(v) > 0]
    if pc.unit == "record":
        if not sizes:
            return {}
        n, what = min(sizes), "records on the smallest device (min D_i)"
    else:
        n, what = int(cfg.devices), "devices (the device unit's data set is the population)"
    if pc.delta < 1.0 / n:
        return {}
    note = (f"privacy.delta={pc.delta:g} >= 1/n = {1.0 / n:.4g} with n = {n} {what}: a "
            "mechanism publishing each individual's data with probability delta meets such "
            "a guarantee, so the (epsilon, delta) figures of this run promise little")
    if not pc.allow_large_delta:
        raise ConfigError(
            f"config key 'privacy.delta': got {pc.delta:g}; unit {pc.unit}: n = {n} {what}, "
            f"so delta must be < 1/n = {1.0 / n:.4g} (customarily <= 1/(10 n) or smaller). "
            "Allowed: a delta below that, or privacy.allow_large_delta=true to run anyway "
            "(the summary then says so)"
        )
    return {"delta_exceeds_1_over_D": True, "delta_bound_n": n,
            "delta_bound_unit": pc.unit, "delta_note": note}


def step_sigma(rs: RecordSettings) -> float:
    """Per-step noise std on the averaged clipped gradient, ``z C / B`` (gradient units per
    coordinate; the papers' sigma)."""
    return rs.step_noise_multiplier * rs.example_clip / rs.expected_batch


def record_norm_bound(example_clip: float, expected_batch: float) -> float:
    """Bound on ``sqrt(E ||v||^2)`` for ``v`` = clipped sum / ``B`` over a Poisson batch.

    ``||v|| <= C |S| / B`` and ``E |S|^2 = B^2 + B (1 - q) <= B^2 + B``, so
    ``E ||v||^2 <= C^2 (1 + 1 / B)``: the data-independent norm the power budget uses.
    """
    return example_clip * math.sqrt(1.0 + 1.0 / expected_batch)


@lru_cache(maxsize=256)
def calibrated_z(
    q: float, steps: int, target: float, delta: float, accountant: str, relation: str
) -> float:
    """The noise multiplier meeting ``target`` (times ``CALIBRATION_MARGIN``) over ``steps``
    record-level steps at sampling rate ``q`` (:func:`calibrate_noise_multiplier`, cached)."""
    return calibrate_noise_multiplier(
        q=q,
        steps=steps,
        target_epsilon=target * CALIBRATION_MARGIN,
        delta=delta,
        accountant=accountant,
        relation=relation,
    )


def resolve_record_uplinks(
    cfg: ExperimentConfig,
    hw: HardwareConfig,
    d: int,
    dataset_sizes: list[int],
    devices: Sequence[int] | None = None,
) -> list[tuple[DeviceUplink, RecordSettings]]:
    """Per-device uplink and record-level settings of a ``privacy.unit: record`` run
    (``devices``: only these devices, in this order; default every device).

    Parameters
    ----------
    cfg, hw
        The experiment and hardware configs.
    d
        Model size.
    dataset_sizes
        ``D_i`` for each device, shape ``(devices,)``.

    Raises
    ------
    ConfigError
        When a device holds fewer samples than the expected batch, or a configured alpha
        exceeds the power limit.
    """
    ids = range(len(dataset_sizes)) if devices is None else devices
    if cfg.plan is not None:
        planned = _record_uplinks_from_plan(cfg, hw, d, dataset_sizes)
        return [planned[i] for i in ids]
    if cfg.privacy.noise_distribution == "laplace":
        return _laplace_uplinks(cfg, hw, d, dataset_sizes, ids)
    pc = cfg.privacy
    spec = SCHEMES[cfg.scheme]
    l = kept_coordinates(cfg, d)
    levels = quant_levels(cfg)
    credit = (spec.credit_channel and pc.noise == "upload" and levels is None
              and pc.trusted_channel_noise > 0)
    trusted = pc.trusted_channel_noise if credit else 0.0
    per_step = pc.noise == "per-step"
    steps_per_round = cfg.local_steps if per_step else 1
    batch = float(cfg.batch_size)
    norm = record_norm_bound(pc.example_clip, batch)
    p_units = cfg.power.p_max_w / hw.tx_power_ref_w
    out = []
    for i in ids:
        size = dataset_sizes[i]
        if size < cfg.batch_size:
            raise ConfigError(
                f"config key 'batch_size': got {cfg.batch_size}; device {i} holds only {size} "
                f"samples, and the Poisson rate batch_size / samples must be <= 1"
            )
        q = batch / size
        amplified = pc.secure_sampling
        if pc.noise_multiplier is not None:
            z = float(pc.noise_multiplier)
        else:
            z = calibrated_z(
                q if amplified else 1.0,
                steps_per_round * cfg.rounds,
                pc.epsilon,
                pc.delta,
                pc.accountant,
                pc.relation,
            )
        needed_std = z * pc.example_clip / batch  # per coordinate, in units of v
        if per_step:
            # The upload is the local differential, the sum of H private steps: its norm is
            # at most H times a step's and it carries H steps of noise per coordinate.
            sigma = 0.0
            shape = {
                "clip": norm * cfg.local_steps,
                "sigma": needed_std * math.sqrt(cfg.local_steps),
            }
            alpha = cfg.power.alpha or max_alpha(
                d=d, l=l, levels=levels, mechanism="before", p_max_units=p_units, **shape
            )
        elif cfg.scheme == "aircomp":
            # each device's share of the aggregate noise; alpha is the per-round
            # pre-equalization c / h_hat, applied in the slot (docs/privacy.md section 12)
            if cfg.aircomp_plan is not None:  # testbed plan --scheme aircomp
                from testbed.core.config.aircomp_plan_file import checked_aircomp_plan

                sigma = checked_aircomp_plan(cfg, d).sigma
            else:
                sigma = share_sigma(z, devices=cfg.devices, colluding=aircomp_colluding(cfg),
                                    example_clip=pc.example_clip, expected_batch=batch,
                                    others_margin=aircomp_margin(cfg, hw))
            alpha = 1.0
            shape = {"clip": norm, "sigma": sigma}
        else:
            sigma, alpha = _upload_noise(cfg, i, d, l, levels, norm, needed_std, trusted, p_units)
            shape = {"clip": norm, "sigma": sigma}
        power = expected_power_bound(
            d=d, l=l, levels=levels, alpha=alpha, mechanism="before", **shape
        )
        if power > p_units * (1 + 1e-9):
            raise ConfigError(
                f"config key 'power.alpha': got {alpha}; device {i}'s expected power "
                f"{power * hw.tx_power_ref_w:.4g} W exceeds power.p_max_w={cfg.power.p_max_w} W"
            )
        uplink = DeviceUplink("before", sigma, alpha, l, levels, trusted, "norm", power)
        settings = RecordSettings(
            noise=pc.noise,
            steps=steps_per_round,
            sampling_rate=q,
            amplified=amplified,
            example_clip=pc.example_clip,
            expected_batch=batch,
            dataset_size=int(size),
            step_noise_multiplier=z if per_step else 0.0,
            target_noise_multiplier=z,
            relation=pc.relation,
            credit_channel=credit,
        )
        out.append((uplink, settings))
    return out


@lru_cache(maxsize=256)
def _calibrated_laplace(
    replies: int, target: float, delta: float, accountant: str, relation: str
) -> float:
    return calibrate_laplace_noise_multiplier(
        count=replies,
        target_epsilon=target * CALIBRATION_MARGIN,
        delta=delta,
        accountant=accountant,
        relation=relation,
    )


def _laplace_uplinks(
    cfg: ExperimentConfig, hw: HardwareConfig, d: int, dataset_sizes: list[int],
    ids: Sequence[int],
) -> list[tuple[DeviceUplink, RecordSettings]]:
    """Per-device settings of 004's Laplace mechanism (``noise_distribution: laplace``).

    ``b = s D / xi_1`` is calibrated once for ``ceil(b T / N)`` replies (every device makes
    at most that many under round robin; the budget guard enforces it anyway), then
    ``s_i = b xi_1 / D_i`` per device. The value on air is the noisy average itself: l2 norm
    at most ``xi_1`` (l2 <= l1) and noise variance ``2 s_i^2`` per coordinate, which set the
    power budget. No channel noise is credited.
    """
    pc = cfg.privacy
    l = kept_coordinates(cfg, d)
    levels = quant_levels(cfg)
    p_units = cfg.power.p_max_w / hw.tx_power_ref_w
    if pc.noise_multiplier is not None:
        b = float(pc.noise_multiplier)
    else:
        b = _calibrated_laplace(
            laplace_replies(cfg), pc.epsilon, pc.delta, pc.accountant, pc.relation
        )
    out = []
    for i in ids:
        size = dataset_sizes[i]
        scale = b * pc.example_clip / size
        shape = {"clip": pc.example_clip, "sigma": math.sqrt(2.0) * scale}
        alpha = cfg.power.alpha or max_alpha(
            d=d, l=l, levels=levels, mechanism="before", p_max_units=p_units, **shape
        )
        power = expected_power_bound(
            d=d, l=l, levels=levels, alpha=alpha, mechanism="before", **shape
        )
        if power > p_units * (1 + 1e-9):
            raise ConfigError(
                f"config key 'power.alpha': got {alpha}; device {i}'s expected power "
                f"{power * hw.tx_power_ref_w:.4g} W exceeds power.p_max_w={cfg.power.p_max_w} W"
            )
        uplink = DeviceUplink("before", 0.0, alpha, l, levels, 0.0, "norm", power)
        settings = RecordSettings(
            noise=pc.noise,
            steps=1,
            sampling_rate=1.0,
            amplified=False,
            example_clip=pc.example_clip,
            expected_batch=float(size),
            dataset_size=int(size),
            step_noise_multiplier=0.0,
            target_noise_multiplier=b,
            relation=pc.relation,
            credit_channel=False,
            noise_distribution="laplace",
            laplace_scale=scale,
        )
        out.append((uplink, settings))
    return out


def _record_uplinks_from_plan(
    cfg: ExperimentConfig, hw: HardwareConfig, d: int, dataset_sizes: list[int]
) -> list[tuple[DeviceUplink, RecordSettings]]:
    """Per-device settings of a record-level plan (``testbed plan`` with the record unit).

    The plan fixes ``l``, ``Q``, ``alpha_i`` and ``sigma_i``; the config must agree with what
    it assumed (:func:`testbed.core.schemes.load_checked_plan`), including each device's data set
    size (hence its sampling rate). The budget guard still accounts every upload with the
    realized channel.
    """
    from testbed.core.schemes import checked_plan_power, load_checked_plan

    plan = load_checked_plan(cfg, d)
    rec = plan.record
    if rec is None:
        raise ConfigError(
            f"config key 'plan': '{cfg.plan}' is a device-level plan; set privacy.unit=device "
            "or make a record-level plan"
        )
    if list(dataset_sizes) != list(rec.dataset_sizes):
        raise ConfigError(
            f"config key 'plan': '{cfg.plan}' was made for data set sizes {rec.dataset_sizes}, "
            f"this config gives {list(dataset_sizes)} (data, partition, seed or train_samples "
            "differ); re-plan with this config"
        )
    spec = SCHEMES[cfg.scheme]
    credit = spec.credit_channel and plan.Q is None and plan.trusted > 0
    trusted = plan.trusted if credit else 0.0
    norm = record_norm_bound(rec.example_clip, rec.expected_batch)
    out = []
    for dev, size, z in zip(plan.devices, dataset_sizes, rec.noise_floor_z, strict=True):
        power = checked_plan_power(cfg, hw, d, plan, dev, clip=norm, mechanism="before")
        uplink = DeviceUplink("before", dev.sigma, dev.alpha, plan.l, plan.Q, trusted, "norm",
                              power)
        settings = RecordSettings(
            noise="upload", steps=1, sampling_rate=cfg.batch_size / size,
            amplified=cfg.privacy.secure_sampling, example_clip=rec.example_clip,
            expected_batch=rec.expected_batch, dataset_size=int(size), step_noise_multiplier=0.0,
            target_noise_multiplier=float(z), relation=rec.relation, credit_channel=credit,
        )
        out.append((uplink, settings))
    return out


def _upload_noise(
    cfg: ExperimentConfig,
    device: int,
    d: int,
    l: int,
    levels: int | None,
    norm: float,
    needed_std: float,
    trusted: float,
    p_units: float,
) -> tuple[float, float]:
    """Smallest artificial ``sigma`` (and its ``alpha``) with ``sigma^2 + channel >= needed^2``.

    The channel part ``trusted n0 (l/d)^2 / alpha^2`` is taken at unit channel gain. With
    ``power.alpha`` unset alpha follows sigma (the largest alpha within ``P_max``), so the
    channel part grows with sigma and the left side is increasing: bisection.
    """
    n0 = mean_n0_per_real(cfg, device) * trusted

    def alpha_for(sigma: float) -> float:
        if cfg.power.alpha is not None:
            return float(cfg.power.alpha)
        return max_alpha(
            d=d,
            l=l,
            levels=levels,
            clip=norm,
            sigma=sigma,
            mechanism="before",
            p_max_units=p_units,
        )

    def total(sigma: float) -> float:
        a = alpha_for(sigma)
        return sigma**2 + n0 * (l / d) ** 2 / a**2

    if needed_std == 0.0 or total(0.0) >= needed_std**2:
        return 0.0, alpha_for(0.0)
    lo, hi = 0.0, needed_std
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if total(mid) >= needed_std**2:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    return hi, alpha_for(hi)
