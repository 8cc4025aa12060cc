"""The "paper" accounting: 003 Theorem 1 and Proposition 1, corrected per SEED-NOTES.

Per upload, the RDP at order ``a`` is ``a * c`` with (derivation in ``docs/privacy.md``):

* noise before compression (Theorem 1, eq. 16 with K uploads, not T)::

      c = 2 (h alpha)^2 (kappa / d) Z^2 / ((h alpha)^2 sigma^2 + n0_credited)

* noise after compression (Proposition 1)::

      c = 2 (h alpha)^2 (kappa / d) Z^2 (d / l + 1 / Q)^2 / ((h alpha)^2 sigma^2 + n0_credited)

where ``n0_credited = trusted_channel_noise * n0`` is per real coordinate, and
``kappa = min(Q (Q + sqrt(l)), l)`` (QSGD's bound on the expected non-zeros, capped at the
``l`` coordinates that survive sparsification, so ``kappa / d <= l / d <= 1``);
``kappa = l`` without quantization; ``l = d`` without sparsification. The ``kappa / d``
factor is the paper's and rests on per-coordinate clipping (``|g_j| <= Z / sqrt(d)``); with
norm clipping the paper's argument gives no amplification and ``kappa / d`` is replaced by 1.
Without clipping nothing is bounded and ``c = inf``. This accounting is reported for
comparison; it is **not** a sound DP bound (see the strict accounting and docs/privacy.md).
"""

from __future__ import annotations

import math

from testbed.core.privacy.analysis.rdp import referred_noise_var
from testbed.core.privacy.events import UploadEvent


def kappa(*, d: int, l: int, q: int | None) -> float:
    """Expected non-zeros after compression, capped: ``min(Q (Q + sqrt(l)), l)``.

    ``q=None`` (no quantization) gives ``l``.
    """
    if not 1 <= l <= d:
        raise ValueError(f"kappa: need 1 <= l <= d, got l={l}, d={d}")
    if q is None:
        return float(l)
    if q < 1:
        raise ValueError(f"kappa: q={q} must be >= 1 or None")
    return float(min(q * (q + math.sqrt(l)), l))


def paper_coefficient(event: UploadEvent) -> float:
    """Per-upload RDP coefficient ``c`` (RDP ``= a * c`` at order ``a``) of the paper.

    Evaluated as ``2 S^2 / (sigma^2 + n0_credited / (h alpha)^2)``, the same expression
    divided through by ``(h alpha)^2``, so that with no credited channel noise the result does
    not depend on ``h alpha`` (local DP) and ``h alpha -> 0`` with channel noise gives 0.
    """
    if event.mechanism == "none" or event.clip_mode == "none":
        return math.inf
    if event.clip_mode == "coordinate":
        share = kappa(d=event.d, l=event.l, q=event.q) / event.d
    else:
        share = 1.0
    numerator = 2.0 * share * event.clip**2
    if event.mechanism == "after":
        inv_q = 0.0 if event.q is None else 1.0 / event.q
        numerator *= (event.d / event.l + inv_q) ** 2
    channel = referred_noise_var(
        noise_var=event.n0_credited, amplitude=event.gain * event.alpha
    )
    denominator = event.sigma**2 + channel
    if denominator == 0:
        return math.inf
    return numerator / denominator
