"""Epsilon versus SNR (003 Fig. 2(b)/(c)): piggyback DP against "channel only".

Model of one upload at receive SNR ``snr`` (dB), as the links define it: a stream of unit
power per complex symbol at unit channel power gain sees ``N0 = 10^(-snr/10)`` per complex
symbol, i.e. ``n0 = N0 / 2`` per real coordinate. The device scales by a *data-independent*
``alpha`` chosen from public bounds so that its expected power per real coordinate is at most
``1/2`` (unit symbol power):

* channel only (no compression, no artificial noise): ``E x_j^2 <= alpha^2 Z^2 / d``;
* compressed: ``E ||C(g + eta)||^2 <= theta_qs (Z^2 + d sigma^2)`` (Lemma 3) over ``l`` reals.

AWGN: ``|h| = 1`` in every round. Rayleigh block fading: ``|h|^2 ~ Exp(1)``, one draw per
upload, drawn by the caller; epsilon is composed exactly over each realization's gains and
its mean and standard deviation over realizations are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from radio.units import db_to_ratio
from testbed.core.privacy.accountants.accountant import upload_coefficient
from testbed.core.privacy.analysis.rdp import gaussian_epsilon
from testbed.core.privacy.events import UploadEvent


@dataclass(frozen=True)
class Scheme:
    """One transmission scheme of the curve.

    Attributes
    ----------
    name
        Label (``channel-only``, ``piggyback``, ...).
    l, q
        Coordinates sent and quantization levels (``None``: off).
    sigma
        Artificial noise std per coordinate (before compression).
    """

    name: str
    l: int
    q: int | None
    sigma: float


def power_scaling(*, scheme: Scheme, d: int, clip: float) -> float:
    """Data-independent ``alpha`` giving expected power ``<= 1/2`` per real coordinate."""
    base = clip**2 + d * scheme.sigma**2
    if scheme.l == d and scheme.q is None:
        per_coordinate = base / d
    else:
        extra = 0.0 if scheme.q is None else d / (scheme.q * math.sqrt(scheme.l))
        per_coordinate = (d / scheme.l + extra) * base / scheme.l
    return math.sqrt(0.5 / per_coordinate)


def epsilon_over_gains(
    *,
    mode: str,
    scheme: Scheme,
    gains: np.ndarray,
    snr_db: float,
    d: int,
    clip: float,
    delta: float,
    clip_mode: str = "coordinate",
    trusted: float = 1.0,
) -> np.ndarray:
    """Epsilon after one realization's uploads, for each realization.

    Parameters
    ----------
    gains
        ``|h|``, shape ``(realizations, rounds)``, real ``>= 0``.
    snr_db
        Receive SNR (dB) of a unit-power stream at unit gain.

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(realizations,)``.
    """
    g = np.asarray(gains, dtype=np.float64)
    if g.ndim != 2 or np.any(g < 0) or not np.all(np.isfinite(g)):
        raise ValueError("epsilon_over_gains: gains must be finite, >= 0, shape (R, K)")
    alpha = power_scaling(scheme=scheme, d=d, clip=clip)
    n0 = 0.5 * db_to_ratio(-snr_db)
    cache: dict[float, float] = {}

    def coefficient(h: float) -> float:
        if h not in cache:
            event = UploadEvent(
                round=0, device=0, mechanism="before", sigma=scheme.sigma, alpha=alpha,
                gain=h, n0=n0, trusted_channel_noise=trusted, d=d, l=scheme.l, q=scheme.q,
                clip=clip, clip_mode=clip_mode,
            )
            cache[h] = upload_coefficient(event, mode=mode)
        return cache[h]

    out = np.empty(g.shape[0], dtype=np.float64)
    for r in range(g.shape[0]):
        coefficients = [coefficient(float(h)) for h in g[r]]
        total = math.inf if any(math.isinf(c) for c in coefficients) else math.fsum(coefficients)
        out[r] = gaussian_epsilon(coefficient=total, delta=delta)[0]
    return out
