"""The "strict" accounting: every step a textbook DP argument (derivation in docs/privacy.md).

Facts used: the Gaussian mechanism's RDP ``a Delta^2 / (2 s^2)`` (Mironov 2017); the same
bound for the multivariate discrete Gaussian on a lattice containing the query (Canonne,
Kamath, Steinke 2020, multivariate case); post-processing; joint quasi-convexity of the Renyi
divergence (for randomised quantizers, coupled through their randomness); and that two valid
RDP bounds of one mechanism give their minimum.

Per upload, with mask ``S`` (``l`` coordinates, data-independent, known to the server):

* ``"before"`` (``x = alpha C(g + eta)``). The sensitivity of ``g_S`` is
  ``Delta_S = 2 Z sqrt(l / d)`` (coordinate clipping) or ``2 Z`` (norm clipping).

  - no quantization: the map from ``g_S + eta_S`` to the air is linear,
    ``y = h alpha (d/l) (g_S + eta_S) + n``, ``n ~ N(0, n0)`` per real coordinate; dividing by
    ``h alpha d / l`` gives ``g_S + N(0, sigma^2 + n0 (l/d)^2 / (h alpha)^2)``, so
    ``c = Delta_S^2 / (2 (sigma^2 + n0 (l/d)^2 / (h alpha)^2))``.
  - quantization: it sits between the artificial and the channel noise and is not linear,
    so everything sent (values and the norm) is post-processing of ``g_S + eta_S``:
    ``c = Delta_S^2 / (2 sigma^2)``; the channel is not credited.

* ``"after"`` (``x = alpha (C(g) + eta)``). With ``v = (d/l) g_S``, ``||v|| <= B``,
  ``B = Z sqrt(d / l)`` (coordinate) or ``Z d / l`` (norm).

  - no quantization: ``Delta = 2 B``; noise ``sigma^2 + n0 / (h alpha)^2`` (linear to air).
  - quantization with the norm as scale (side information in the clear): the norm is a
    deterministic function of the data: ``c = inf``.
  - quantization with the fixed scale ``s = B``: every output satisfies
    ``||C(g)|| <= B (1 + sqrt(l)/Q)``, so ``Delta = 2 B (1 + sqrt(l)/Q)``; the discrete
    Gaussian and the channel noise are each a valid route,
    ``c = min(Delta^2 / (2 sigma^2), Delta^2 / (2 n0 / (h alpha)^2))``.

``n0`` here is always ``trusted_channel_noise * n0`` (per real coordinate, lower bound).
"""

from __future__ import annotations

import math

from testbed.core.privacy.analysis.rdp import gaussian_rdp_coefficient, referred_noise_var
from testbed.core.privacy.events import UploadEvent


def masked_sensitivity(*, clip: float, d: int, l: int, clip_mode: str) -> float:
    """l2 sensitivity of the clipped differential restricted to ``l`` of ``d`` coordinates."""
    if clip_mode == "coordinate":
        return 2.0 * clip * math.sqrt(l / d)
    if clip_mode == "norm":
        return 2.0 * clip
    return math.inf


def sparse_norm_bound(*, clip: float, d: int, l: int, clip_mode: str) -> float:
    """Bound ``B`` on ``||(d/l) g_S||_2``; also the quantizer's fixed scale."""
    if clip_mode == "coordinate":
        return clip * math.sqrt(d / l)
    if clip_mode == "norm":
        return clip * d / l
    return math.inf


def _channel_var(event: UploadEvent, amplitude: float) -> float:
    """Credited channel noise per real coordinate referred back through ``amplitude``."""
    return referred_noise_var(noise_var=event.n0_credited, amplitude=amplitude)


def strict_coefficient(event: UploadEvent) -> float:
    """Per-upload RDP coefficient ``c`` (RDP ``= a * c`` at order ``a``), strict."""
    if event.mechanism == "none" or event.clip_mode == "none":
        return math.inf
    ha = event.gain * event.alpha
    if event.mechanism == "before":
        delta_s = masked_sensitivity(
            clip=event.clip, d=event.d, l=event.l, clip_mode=event.clip_mode
        )
        if event.q is not None:
            return gaussian_rdp_coefficient(sensitivity=delta_s, noise_std=event.sigma)
        total = event.sigma**2 + _channel_var(event, ha * event.d / event.l)
        return gaussian_rdp_coefficient(sensitivity=delta_s, noise_std=math.sqrt(total))
    bound = sparse_norm_bound(clip=event.clip, d=event.d, l=event.l, clip_mode=event.clip_mode)
    if event.q is None:
        total = event.sigma**2 + _channel_var(event, ha)
        return gaussian_rdp_coefficient(sensitivity=2.0 * bound, noise_std=math.sqrt(total))
    if event.quantizer_scale == "norm":
        return math.inf
    sens = 2.0 * bound * (1.0 + math.sqrt(event.l) / event.q)
    via_noise = gaussian_rdp_coefficient(sensitivity=sens, noise_std=event.sigma)
    via_channel = gaussian_rdp_coefficient(
        sensitivity=sens, noise_std=math.sqrt(_channel_var(event, ha))
    )
    return min(via_noise, via_channel)
