"""The peer systems' own privacy accounting, reported next to the testbed's dp-accounting
figure of the same run (docs/peers/). The run enforces the testbed's figure; these are the
papers' numbers as printed (corrected where SEED-NOTES says)."""

from __future__ import annotations

from typing import Any

from aggregator.peers.dp_pasgd import paper_epsilon, rho_total
from testbed.config.experiment import ExperimentConfig
from testbed.record_schemes import RecordSettings


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
    if cfg.scheme != "dp-pasgd":
        return None
    steps = uploads * rs.steps
    G, X = rs.example_clip, rs.expected_batch
    sigma = rs.step_noise_multiplier * G / X  # noise std on the averaged clipped gradient
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
