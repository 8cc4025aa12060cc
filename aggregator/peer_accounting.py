"""The peer systems' own privacy accounting, reported next to the testbed's dp-accounting
figure of the same run (docs/peers/). The run enforces the testbed's figure; these are the
papers' numbers as printed (corrected where SEED-NOTES says)."""

from __future__ import annotations

import math
from typing import Any

from aggregator.peers.dp_pasgd_accounting import paper_epsilon, rho_total
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.record_schemes import RecordSettings, step_sigma


def peer_report(cfg: ExperimentConfig, rs: RecordSettings, uploads: int) -> dict[str, Any] | None:
    """The paper's own epsilon of one device after ``uploads`` uploads, or ``None`` when the
    run's scheme is not a peer system.

    Parameters
    ----------
    cfg
        The run's config.
    rs
        The device's record-level settings (noise multiplier z per step, clip C, batch B).
    uploads
        Uploads the device made (each carries ``rs.steps`` noisy local steps).
    """
    if cfg.scheme == "fedsgd-dpc":
        return _fedsgd_dpc(cfg, rs, uploads)
    if cfg.scheme == "zcdp-secagg":
        return _zcdp_secagg(cfg, rs, uploads)
    if cfg.scheme != "dp-pasgd":
        return None
    steps = uploads * rs.steps
    G, X = rs.example_clip, rs.expected_batch
    sigma = step_sigma(rs)
    return {
        "paper": "000 DP-PASGD",
        "accounting": (
            "zCDP, eq. (9) with the corrected root of (23)/(25): rho = 2 K G^2 / (X^2 sigma^2) "
            "over all K local steps, replace-one, no subsampling amplification"
        ),
        "unit": "record",
        "delta": cfg.privacy.delta,
        "local_steps": steps,
        "rho": rho_total(steps, G, X, sigma) if steps else 0.0,
        "epsilon": paper_epsilon(steps, G, X, sigma, cfg.privacy.delta) if steps else 0.0,
    }


def _fedsgd_dpc(cfg: ExperimentConfig, rs: RecordSettings, uploads: int) -> dict[str, Any]:
    """004's accounting over the replies made: Theorem 1 (Laplace, linear composition of
    ``2 xi_1 / (d_i s)`` per reply, replace-one) or the Gaussian moments-accountant form
    (c2 = 2)."""
    from aggregator.peers.fedsgd_dpc_accounting import (
        gaussian_epsilon_per_reply,
        laplace_epsilon_per_reply,
        linear_composition,
    )

    if rs.noise_distribution == "laplace":
        per = laplace_epsilon_per_reply(
            rs.laplace_scale, clip_l1=rs.example_clip, local_size=float(rs.dataset_size)
        )
        return {
            "paper": "004 FedSGD-DPC (Laplace)",
            "accounting": (
                "Theorem 1: per reply eps = 2 xi_1 / (d_i s) (l1 sensitivity of the average "
                "under replace-one), linear composition over the R replies this device made"
            ),
            "unit": "record",
            "delta": 0.0,
            "replies": uploads,
            "laplace_scale": rs.laplace_scale,
            "epsilon_per_reply": per,
            "epsilon": linear_composition(per, uploads),
        }

    sigma = step_sigma(rs)
    per_reply = gaussian_epsilon_per_reply(
        sigma, cfg.privacy.delta, clip_l2=rs.example_clip, local_size=float(rs.dataset_size)
    )
    return {
        "paper": "004 FedSGD-DPC (Gaussian)",
        "accounting": (
            "per reply eps = c2 q sqrt(log(1/delta)) / z-form of Abadi et al.'s theorem "
            "(c2 = 2), total sqrt(R) x per reply over the R replies this device made"
        ),
        "unit": "record",
        "delta": cfg.privacy.delta,
        "replies": uploads,
        "epsilon": math.sqrt(uploads) * per_reply if uploads else 0.0,
    }


def _zcdp_secagg(cfg: ExperimentConfig, rs: RecordSettings, uploads: int) -> dict[str, Any]:
    """002's zCDP with the 1/r secure-aggregation credit, and the trust it needs."""
    from aggregator.peers.zcdp_secagg_accounting import TRUST_ASSUMPTION, paper_epsilon

    r = cfg.clients_per_round or cfg.devices
    gamma = max(1, min(int(round(rs.expected_batch)), rs.dataset_size))
    sigma = step_sigma(rs)
    out: dict[str, Any] = {
        "paper": "002 zCDP FL with secure aggregation",
        "accounting": (
            "eq. (10): C participations of 2 tau G^2 / (r m gamma sigma^2)-zCDP (1/r credit of "
            "secure aggregation), Lemma 4 conversion"
        ),
        "unit": "record",
        "delta": cfg.privacy.delta,
        "participations": uploads,
        "trust": TRUST_ASSUMPTION,
    }
    try:
        out["epsilon"] = paper_epsilon(
            participations=uploads, tau=rs.steps, G=rs.example_clip, m=rs.dataset_size,
            gamma=gamma, sigma=sigma, r=r, delta=cfg.privacy.delta,
        ) if uploads else 0.0
    except ValueError as exc:
        out["epsilon"] = None
        out["error"] = str(exc)
    return out
