"""Compression factors of 003 Section IV for the three families the schemes use.

Notation: ``theta_s = l / d`` (sparsification ratio), ``theta_q = sqrt(d) / Q`` (quantization),
``kappa = Q (Q + sqrt(l))`` expected non-zeros after C_{q,s} (003 eq. 8), so
``kappa / d = theta_q^-2 + theta_q^-1 theta_s^(1/2)``, and the variance factor of Lemma 3,
``theta_qs = theta_s^-1 + theta_q theta_s^(-1/2)`` (``E||C(g)||^2 <= theta_qs ||g||^2``).

Families
--------
``"qs"``   sparsify then quantize (EE-DP-FL): the formulas above.
``"s"``    sparsify only (S-DP-FL): ``kappa / d = theta_s``, ``theta_qs = 1 / theta_s``.
``"none"`` no compression (LDP-FedAvg, Channel-DP): ``kappa / d = 1``, ``theta_qs = 1``.

``kappa / d`` is not capped at ``l / d`` here: an uncapped value only makes the solver's own
privacy constraint stricter than an accountant that caps it.
"""

from __future__ import annotations

import math
from typing import Literal

Family = Literal["qs", "s", "none"]
FAMILIES: tuple[str, ...] = ("qs", "s", "none")


def kappa_ratio(family: str, theta_q: float, theta_s: float) -> float:
    """``kappa / d`` (dimensionless) for a family at ``(theta_q, theta_s)``."""
    if family == "qs":
        return theta_q**-2 + theta_s**0.5 / theta_q
    if family == "s":
        return theta_s
    if family == "none":
        return 1.0
    raise ValueError(f"family: got {family!r}; allowed: {FAMILIES}")


def theta_qs(family: str, theta_q: float, theta_s: float) -> float:
    """Lemma 3 variance factor ``theta_qs >= 1`` for a family at ``(theta_q, theta_s)``."""
    if family == "qs":
        return 1.0 / theta_s + theta_q / math.sqrt(theta_s)
    if family == "s":
        return 1.0 / theta_s
    if family == "none":
        return 1.0
    raise ValueError(f"family: got {family!r}; allowed: {FAMILIES}")


#: Name of the convergence model used for record-level plans (stored in calibration files).
DECODED_NOISE_MODEL = "decoded-noise/v1"


def decoded_noise_energy(
    family: str, theta_q: float, theta_s: float, d: int, sigma2: float, chan: float
) -> float:
    """Noise energy ``E||ghat - C(g)||^2`` bound of one decoded upload (value units squared).

    ``theta_qs d sigma^2`` (Lemma 3 applied to the artificial noise ``eta ~ N(0, sigma^2 I_d)``
    added before compression) plus ``l chan`` (the channel noise ``n0 / (h alpha)^2`` per
    coordinate after inversion, on the ``l = theta_s d`` values sent). This is the noise term
    of the convergence model ``K >= beta1 theta_qs + beta2 mean_i noise_i`` used for
    record-level plans (``DECODED_NOISE_MODEL``); the paper's (25) writes
    ``kappa (theta_qs sigma^2 + chan)``, which for sparsification alone undercounts the
    artificial noise by the factor ``d / l`` (docs/solver.md section 12).

    Parameters
    ----------
    family
        ``"qs"``, ``"s"`` or ``"none"``.
    theta_q, theta_s
        Compression parameters (``theta_q`` unused outside ``"qs"``).
    d
        Model size.
    sigma2
        Artificial noise variance per coordinate (value units squared).
    chan
        Channel noise variance per coordinate after inversion, ``n0 / (h alpha)^2``.
    """
    tqs = theta_qs(family, theta_q, theta_s)
    return tqs * d * sigma2 + theta_s * d * chan
