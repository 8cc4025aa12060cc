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


def thetas_from_integers(d: int, l: int, q: int | None) -> tuple[float, float]:
    """``(theta_q, theta_s)`` of integer ``l`` and ``Q`` (``q=None``: theta_q unused, 0)."""
    theta_s = l / d
    theta_q = math.sqrt(d) / q if q is not None else 0.0
    return theta_q, theta_s
