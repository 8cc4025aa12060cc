"""Laplace privacy noise from a cryptographically secure source (FedSGD-DPC, paper 004).

:mod:`testbed.core.noise` has no Laplace sampler, so this module adds one with the same rules:
nothing here is seeded, uniforms come from ``os.urandom`` through
:func:`testbed.core.noise.secure_uniform` (53 random bits each), and ``numpy``'s PCG
generators are never used (PCG is not a CSPRNG; its state can be recovered from outputs).
A passed ``rng`` is refused, exactly as :func:`testbed.core.noise.gaussian` refuses ``seed``.

The draw is ``X = S * E * scale`` with ``E = -log(U)``, ``U`` uniform on ``(0, 1]`` (so
``E ~ Exp(1)``) and ``S`` a fair sign from a separate ``os.urandom`` bit; ``|X|`` is then
exponential with mean ``scale`` and its sign is independent and fair, which is the Laplace law
``p(x) = exp(-|x| / scale) / (2 scale)`` (variance ``2 scale^2``).

Floating-point caveat: like every textbook floating-point Laplace sampler this one is not an
exact Laplace; Mironov (2012), "On significance of the least significant bits for differential
privacy", showed that the low bits of such samples can leak. ``U >= 2^-53`` also truncates
``|X|`` at ``53 ln 2 * scale ~ 36.7 scale`` (probability ``2^-53``). It is the standard
engineering choice, as the Gaussian path of :mod:`testbed.core.noise` is.
"""

from __future__ import annotations

import math
import os

import numpy as np

from testbed.core.noise import secure_uniform

#: Draws above this size are generated in chunks (bounds memory per call).
_CHUNK = 1 << 20


def _refuse_rng(rng: object) -> None:
    if rng is not None:
        raise ValueError(
            f"laplace_noise: refuses rng={rng!r}: privacy noise comes from the OS CSPRNG and "
            "must not be reproducible (allowed: None)"
        )


def _secure_signs(n: int) -> np.ndarray:
    """``n`` fair signs ``+-1.0`` from ``os.urandom`` (one random bit each), ``float64``."""
    bits = np.unpackbits(np.frombuffer(os.urandom((n + 7) // 8), dtype=np.uint8))[:n]
    return 1.0 - 2.0 * bits.astype(np.float64)


def laplace_noise(
    shape: int | tuple[int, ...], scale: float, *, rng: object = None
) -> np.ndarray:
    """Laplace noise ``Lap(0, scale)`` per coordinate from the OS CSPRNG.

    Parameters
    ----------
    shape
        Output shape (e.g. ``p`` or ``(p,)``); every dimension ``>= 0``.
    scale
        Laplace scale ``b >= 0`` per coordinate, in the units of the vector it perturbs (for
        FedSGD-DPC: the averaged gradient, ``2 b T xi_1 / (N d_i eps)``). The variance per
        coordinate is ``2 scale^2``.
    rng
        Must be ``None`` (the OS CSPRNG is used); any other value raises ``ValueError``.

    Returns
    -------
    numpy.ndarray
        ``float64`` of the given shape. ``scale == 0`` gives zeros.
    """
    _refuse_rng(rng)
    if isinstance(scale, bool) or not isinstance(scale, int | float | np.integer | np.floating):
        raise ValueError(f"laplace_noise: scale={scale!r} must be a real number in [0, inf)")
    if not (math.isfinite(float(scale)) and scale >= 0):
        raise ValueError(f"laplace_noise: scale={scale!r} must be finite and in [0, inf)")
    if isinstance(shape, bool):
        raise ValueError(f"laplace_noise: shape={shape!r} must be an int or a tuple of ints")
    shp = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shp):
        raise ValueError(f"laplace_noise: shape={shape!r} has a negative dimension (allowed >= 0)")
    n = int(np.prod(shp, dtype=np.int64)) if shp else 1
    if scale == 0:
        return np.zeros(shp, dtype=np.float64)
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, _CHUNK):
        m = min(_CHUNK, n - start)
        magnitude = -np.log(secure_uniform(m))
        out[start : start + m] = _secure_signs(m) * magnitude
    return (out * float(scale)).reshape(shp)
