"""Pilot runs for ``testbed calibrate``: their configs and predicted regressors.

Before anything trains, every pilot's config is built and its regressors
``(theta_qs, noise term)`` are computed from the uplink the runner will use, so a grid that
cannot identify both constants of the convergence model is refused up front
(:func:`check_grid`).

Record unit (``decoded-noise/v1``, record-level FedSGD): a pilot is the config run as
ee-dp-fl with ``privacy.noise=upload``, no quantizer, sparsification ``theta_s``, a fixed
noise multiplier ``z`` and no channel credit, so every device adds exactly
``sigma = z C / B`` per coordinate; alpha is the largest within ``P_max``. Regressors:
``theta_qs = d / l`` and ``mean_i (theta_qs d sigma_i^2 + l n0_i / alpha_i^2)``.

Device unit (``paper-25``): as before, at every combination of ``theta_s``, ``Q`` and
``sigma``; regressors ``theta_qs`` and ``kappa (theta_qs sigma^2 + mean_i n0_i / alpha_i^2)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aggregator.solver.calibration import PAPER_MODEL, column_cosine, design_problem
from aggregator.solver.compression_terms import DECODED_NOISE_MODEL, decoded_noise_energy
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_experiment

#: Default record-unit noise multipliers, as multiples of the z* the config's target needs.
RECORD_Z_FACTORS: tuple[float, ...] = (0.5, 1.0, 2.0)
#: Default sparsification ratios of record-unit pilots.
RECORD_THETA_S: tuple[float, ...] = (1.0,)


@dataclass(frozen=True)
class Pilot:
    """One pilot: its config, settings and predicted regressors.

    Attributes
    ----------
    cfg
        The experiment config the pilot runs.
    settings
        The grid point, e.g. ``{"theta_s": 0.25, "noise_multiplier": 1.2}``.
    theta_qs
        Lemma 3 factor (``d / l`` without quantization), dimensionless.
    noise_term
        The model's noise regressor (see :mod:`aggregator.solver.calibration`).
    detail
        What the regressors were computed from (``l``, ``d``, mean ``sigma^2``, mean channel
        term, ``kappa`` for the paper model), for the output file.
    """

    cfg: ExperimentConfig
    settings: dict[str, float]
    theta_qs: float
    noise_term: float
    detail: dict[str, Any] = field(default_factory=dict)


def _num(x: float) -> str:
    """A float as an override value the YAML parser reads back exactly."""
    return repr(float(x))


def _run_overrides(rounds: int, window: int, stop_at_loss: float | None) -> list[str]:
    out = [f"rounds={rounds}", f"eval_every={rounds}", "eval_subset=null",
           f"loss_target_window={window}"]
    if stop_at_loss is not None:
        out.append(f"stop_at_loss={_num(stop_at_loss)}")
    return out


def check_record_config(cfg: ExperimentConfig) -> None:
    """Refuse a base config whose record-level pilots would not be FedSGD upload-noise runs."""
    if cfg.local_steps != 1:
        raise ConfigError(
            f"config key 'local_steps': got {cfg.local_steps}; record-unit calibration fits "
            "the FedSGD model (one step per round, noise on the upload); allowed: 1 "
            "(--set local_steps=1), or --unit device"
        )
    if cfg.privacy.noise != "upload":
        raise ConfigError(
            f"config key 'privacy.noise': got {cfg.privacy.noise!r}; record-unit calibration "
            "needs the noise on the upload; allowed: 'upload' (--set privacy.noise=upload)"
        )


def _check_fading(cfg: ExperimentConfig) -> None:
    if cfg.fading != "none":
        raise ConfigError(
            f"config key 'fading': got {cfg.fading!r}; the calibration's regressors take the "
            "channel gain h = 1 at the configured SNR; allowed: 'none' (--set fading=none)"
        )


def target_noise_multiplier(cfg: ExperimentConfig, dataset_sizes: Sequence[int]) -> float:
    """``z*``: the mean over devices of the noise multiplier the config's run needs.

    ``privacy.noise_multiplier`` when set, else the per-device calibration for
    ``q = batch_size / D_i`` (1 without secure sampling), ``rounds`` upload steps and the
    config's epsilon, delta, accountant and relation (as the runner does).
    """
    from testbed.core.record_schemes import calibrated_z

    pc = cfg.privacy
    if pc.noise_multiplier is not None:
        return float(pc.noise_multiplier)
    zs = [
        calibrated_z(
            cfg.batch_size / size if pc.secure_sampling else 1.0,
            cfg.rounds,
            pc.epsilon,
            pc.delta,
            pc.accountant,
            pc.relation,
        )
        for size in dataset_sizes
    ]
    return float(sum(zs) / len(zs))


def record_pilots(
    config: str | None,
    overrides: Sequence[str],
    hw: HardwareConfig,
    d: int,
    dataset_sizes: Sequence[int],
    *,
    theta_s: Sequence[float],
    noise_multipliers: Sequence[float],
    rounds: int,
    window: int,
    stop_at_loss: float | None,
) -> list[Pilot]:
    """Record-unit pilots at every ``(theta_s, z)`` and their ``decoded-noise/v1`` regressors.

    Parameters
    ----------
    config, overrides
        The experiment config (path or ``None``) and the user's ``--set`` overrides.
    hw
        Hardware config.
    d
        Model size.
    dataset_sizes
        Samples per device, shape ``(devices,)``.
    theta_s, noise_multipliers
        The grid (``0 < theta_s <= 1``, ``z > 0``).
    rounds, window, stop_at_loss
        Pilot length, loss smoothing window and early-stop loss (``None``: none).
    """
    from testbed.core.record_schemes import resolve_record_uplinks
    from testbed.core.schemes import mean_n0_per_real

    pilots = []
    for ts, z in itertools.product(theta_s, noise_multipliers):
        cfg = load_experiment(config, [
            *overrides, "scheme=ee-dp-fl", "plan=null", "compression.quantize=false",
            f"compression.sparsify={'true' if ts < 1 else 'false'}",
            f"compression.theta_s={_num(ts)}", "privacy.trusted_channel_noise=0",
            f"privacy.noise_multiplier={_num(z)}", "privacy.epsilon=1000000.0",
            "power.alpha=null", *_run_overrides(rounds, window, stop_at_loss),
        ])
        _check_fading(cfg)
        pairs = resolve_record_uplinks(cfg, hw, d, list(dataset_sizes))
        l = pairs[0][0].l
        theta_qs = d / l
        sigma2 = [up.sigma**2 for up, _ in pairs]
        chan = [mean_n0_per_real(cfg, i) / float(up.alpha or math.inf) ** 2
                for i, (up, _) in enumerate(pairs)]
        energy = [decoded_noise_energy("s", 0.0, l / d, d, s2, c)
                  for s2, c in zip(sigma2, chan, strict=True)]
        pilots.append(Pilot(
            cfg=cfg,
            settings={"theta_s": ts, "noise_multiplier": z},
            theta_qs=theta_qs,
            noise_term=sum(energy) / len(energy),
            detail={"l": l, "d": d, "sigma2_mean": sum(sigma2) / len(sigma2),
                    "chan_mean": sum(chan) / len(chan),
                    "alpha_mean": sum(float(up.alpha or 0.0) for up, _ in pairs) / len(pairs)},
        ))
    return pilots


def device_pilots(
    config: str | None,
    overrides: Sequence[str],
    hw: HardwareConfig,
    d: int,
    *,
    theta_s: Sequence[float],
    levels: Sequence[int],
    sigmas: Sequence[float],
    rounds: int,
    window: int,
    stop_at_loss: float | None,
) -> list[Pilot]:
    """Device-unit pilots at every ``(theta_s, Q, sigma)`` and their ``paper-25`` regressors.

    ee-dp-fl with the given sigma, alpha at full power and paper accounting with a relaxed
    target so no budget stops a pilot. Parameters as :func:`record_pilots`.
    """
    from testbed.core.schemes import mean_n0_per_real, resolve_uplinks

    pilots = []
    for ts, q, sg in itertools.product(theta_s, levels, sigmas):
        cfg = load_experiment(config, [
            *overrides, "scheme=ee-dp-fl", "privacy.unit=device", "plan=null",
            "privacy.noise_multiplier=null", f"compression.theta_s={_num(ts)}",
            f"compression.levels={q}", "compression.sparsify=true", "compression.quantize=true",
            f"privacy.sigma={_num(sg)}", "privacy.epsilon=1000000000000.0",
            "privacy.accounting=paper", "privacy.trusted_channel_noise=1.0", "power.alpha=null",
            *_run_overrides(rounds, window, stop_at_loss),
        ])
        _check_fading(cfg)
        ups = resolve_uplinks(cfg, hw, d)
        alphas = [float(u.alpha) for u in ups if u.alpha is not None]
        if len(alphas) != len(ups):
            raise ConfigError(f"calibrate: pilot theta_s={ts}, Q={q} has no fixed alpha")
        chan = sum(mean_n0_per_real(cfg, i) / a**2 for i, a in enumerate(alphas)) / len(ups)
        l = ups[0].l
        theta_qs = d / l + (math.sqrt(d) / q) / math.sqrt(l / d)
        kappa = q * (q + math.sqrt(l))
        pilots.append(Pilot(
            cfg=cfg,
            settings={"theta_s": ts, "levels": q, "sigma": sg},
            theta_qs=theta_qs,
            noise_term=kappa * (theta_qs * sg**2 + chan),
            detail={"l": l, "d": d, "kappa": kappa, "sigma2_mean": sg**2, "chan_mean": chan},
        ))
    return pilots


def model_of(unit: str) -> str:
    """The convergence model calibrated for a privacy unit."""
    return DECODED_NOISE_MODEL if unit == "record" else PAPER_MODEL


def check_grid(pilots: Sequence[Pilot], flags: str) -> float:
    """Refuse a grid that cannot identify beta1 and beta2; return the column cosine.

    Raises
    ------
    ConfigError
        Naming the problem and ``flags`` (the options that set the grid).
    """
    rows = [(p.theta_qs, p.noise_term) for p in pilots]
    problem = design_problem(rows)
    if problem is not None:
        shown = ", ".join(
            f"({p.theta_qs:.4g}, {p.noise_term:.4g})" for p in pilots[:8]
        ) + (" ..." if len(pilots) > 8 else "")
        raise ConfigError(
            f"calibrate: the pilot grid cannot identify beta1 and beta2: {problem}. Predicted "
            f"(theta_qs, noise term) per pilot: {shown}. Change {flags} so that both vary "
            "independently"
        )
    return column_cosine(rows)
