"""Public bounds of the uplink compression (003 Lemma 3), shared by the device that
compresses and the settings both ends resolve: the fixed quantizer scale and the variance
factor ``theta_qs``. Nothing here depends on data."""

from __future__ import annotations

import math

import numpy as np


def fixed_quantizer_scale(*, clip: float, d: int, l: int, clip_mode: str) -> float:
    """Public bound ``B`` on ``||(d/l) g_S||_2`` for a clipped ``g``: the fixed quantizer scale.

    ``Z sqrt(d/l)`` for coordinate clipping, ``Z d / l`` for norm clipping. Quantizing with this
    scale sends nothing data-dependent in the clear (noise after compression needs it; the
    strict accounting's ``sparse_norm_bound`` is the same formula, kept in the privacy
    accounting).
    """
    check_d_l(d, l, "fixed_quantizer_scale")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"fixed_quantizer_scale: clip={clip!r} must be finite and > 0")
    if clip_mode == "coordinate":
        return clip * math.sqrt(d / l)
    if clip_mode == "norm":
        return clip * d / l
    raise ValueError(f"fixed_quantizer_scale: clip_mode={clip_mode!r} must be coordinate/norm")


def theta_qs(*, d: int, l: int, levels: int | None) -> float:
    """Lemma 3's variance factor ``1/theta_s + theta_q / sqrt(theta_s)``.

    With ``theta_s = l/d`` and ``theta_q = sqrt(d)/Q``: ``d/l + d / (Q sqrt(l))``; without
    quantization the second term is 0.
    """
    check_d_l(d, l, "theta_qs")
    extra = 0.0 if levels is None else d / (levels * math.sqrt(l))
    return d / l + extra


def check_d_l(d: int, l: int, where: str) -> None:
    for name, value in (("d", d), ("l", l)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{where}: {name}={value!r} must be an integer >= 1")
    if l > d:
        raise ValueError(f"{where}: l={l} must be <= d={d}")
