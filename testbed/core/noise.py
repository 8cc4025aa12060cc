"""Privacy noise from a cryptographically secure source.

Nothing here takes a seed: privacy noise must not be reproducible from anything an adversary
could learn (the experiment seed sits in a run's metadata). A passed ``seed`` is refused.

* :func:`gaussian`: continuous ``N(0, sigma^2)`` for noise *before* compression
  (Algorithm 1 of 003). Uniforms come from ``os.urandom`` (53 random bits each) and are turned
  into Gaussians by the Box-Muller transform. ``numpy``'s PCG-based generators are not used:
  PCG is not a CSPRNG, its state can be recovered from outputs.
* :func:`discrete_gaussian`: the exact discrete Gaussian ``N_Z(0, sigma^2)`` of Canonne,
  Kamath and Steinke (2020), "The Discrete Gaussian for Differential Privacy", Algorithms 1-3:
  rejection from a discrete Laplace with exact ``Bernoulli(exp(-gamma))`` draws in rational
  arithmetic, fed by ``secrets``. For noise *after* quantization (003 eq. 21): add it to
  the integer quantization levels.

Floating-point caveat: Box-Muller in doubles is not an exact Gaussian (Mironov 2012 showed
how textbook floating-point Laplace samplers leak through their low bits). The Gaussian path is
the standard engineering choice; the discrete sampler is exact.
"""

from __future__ import annotations

import math
import os
import secrets
from fractions import Fraction

import numpy as np

#: Draws above this size are generated in chunks (bounds memory per call).
_CHUNK = 1 << 20


def _refuse_seed(seed: object, where: str) -> None:
    if seed is not None:
        raise ValueError(
            f"{where}: refuses seed={seed!r}: privacy noise comes from the OS CSPRNG and must "
            "not be reproducible"
        )


def secure_uniform(n: int, *, seed: object = None) -> np.ndarray:
    """``n`` uniforms in ``(0, 1]`` from ``os.urandom`` (53 bits each), ``float64``."""
    _refuse_seed(seed, "secure_uniform")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"secure_uniform: n={n!r} must be an integer >= 0")
    raw = np.frombuffer(os.urandom(8 * int(n)), dtype=np.uint64)
    # In place after the two unavoidable arrays: every fresh array this size costs its page
    # faults (about 0.1 ms per 175 kB here), more than the arithmetic.
    out = (raw >> np.uint64(11)).astype(np.float64)
    out += 1.0
    out *= 1.0 / 9007199254740992.0
    return out


def gaussian(shape: int | tuple[int, ...], sigma: float, *, seed: object = None) -> np.ndarray:
    """Continuous Gaussian noise ``N(0, sigma^2 I)`` from the OS CSPRNG.

    Parameters
    ----------
    shape
        Output shape (e.g. ``d`` or ``(d,)``).
    sigma
        Standard deviation per coordinate, ``>= 0`` (same units as the vector it perturbs).
    seed
        Must be ``None``; any other value raises ``ValueError``.

    Returns
    -------
    numpy.ndarray
        ``float64`` of the given shape. ``sigma == 0`` gives zeros.
    """
    _refuse_seed(seed, "gaussian")
    if isinstance(sigma, bool) or not isinstance(sigma, int | float | np.floating):
        raise ValueError(f"gaussian: sigma={sigma!r} must be a real number >= 0")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"gaussian: sigma={sigma!r} must be finite and >= 0")
    shp = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if any(int(s) < 0 for s in shp):
        raise ValueError(f"gaussian: shape={shape!r} has a negative dimension")
    n = int(np.prod(shp, dtype=np.int64)) if shp else 1
    if sigma == 0:
        return np.zeros(shp, dtype=np.float64)
    # numpy only: the secret channel noise of the GNU Radio flowgraph process uses this too
    # (flowgraphs/csprng_noise.py, the system interpreter, which has no torch)
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, _CHUNK):
        m = min(_CHUNK, n - start)
        pairs = (m + 1) // 2
        u = secure_uniform(2 * pairs)  # u1, then u2: one read of urandom
        radius = np.log(u[:pairs])
        radius *= -2.0
        np.sqrt(radius, out=radius)
        angle = u[pairs:]
        angle *= 2.0 * np.pi
        # z = (r cos, r sin), truncated to m: straight into ``out`` when m is even
        z = out[start : start + m] if m % 2 == 0 else np.empty(2 * pairs, dtype=np.float64)
        np.cos(angle, out=z[:pairs])
        np.sin(angle, out=z[pairs:])
        z[:pairs] *= radius
        z[pairs:] *= radius
        if m % 2:
            out[start : start + m] = z[:m]
    out *= float(sigma)
    return out.reshape(shp)


# ---------------------------------------------------------------- exact discrete Gaussian


def _bernoulli(num: int, den: int) -> bool:
    """Exact ``Bernoulli(num / den)``, ``0 <= num <= den``."""
    return secrets.randbelow(den) < num


def _bernoulli_exp_le1(num: int, den: int) -> bool:
    """Exact ``Bernoulli(exp(-num/den))`` for ``0 <= num/den <= 1`` (CKS Algorithm 1)."""
    k = 1
    while secrets.randbelow(den * k) < num:  # Bernoulli(gamma / k)
        k += 1
    return k % 2 == 1


def _bernoulli_exp(num: int, den: int) -> bool:
    """Exact ``Bernoulli(exp(-num/den))`` for any ``num/den >= 0`` (CKS Algorithm 1)."""
    while num > den:
        if not _bernoulli_exp_le1(1, 1):
            return False
        num -= den
    return _bernoulli_exp_le1(num, den)


def _discrete_laplace(t: int) -> int:
    """Exact discrete Laplace, ``P[x] ∝ exp(-|x| / t)`` (CKS Algorithm 2 with s = 1)."""
    while True:
        u = secrets.randbelow(t)
        if not _bernoulli_exp(u, t):
            continue
        v = 0
        while _bernoulli_exp_le1(1, 1):
            v += 1
        x = u + t * v
        negative = secrets.randbits(1) == 1
        if negative and x == 0:
            continue
        return -x if negative else x


def _discrete_gaussian_one(a: int, b: int, t: int) -> int:
    """One exact ``N_Z(0, a/b)`` draw (CKS Algorithm 3), ``t = floor(sqrt(a/b)) + 1``."""
    two_abt2 = 2 * a * b * t * t
    bt = b * t
    while True:
        y = _discrete_laplace(t)
        diff = abs(y) * bt - a  # (|y| - sigma^2/t) * b t
        if _bernoulli_exp(diff * diff, two_abt2):
            return y


def discrete_gaussian(
    n: int, sigma2: Fraction | int | float, *, seed: object = None
) -> np.ndarray:
    """``n`` exact draws of the discrete Gaussian ``N_Z(0, sigma2)``.

    ``P[X = x] = exp(-x^2 / (2 sigma2)) / sum_y exp(-y^2 / (2 sigma2))`` for integer ``x``.
    The parameter is the *scale* ``sigma2`` of the pmf; the variance is slightly below
    ``sigma2`` (CKS Corollary 9), which the privacy analysis does not need.

    Parameters
    ----------
    n
        Number of draws (``>= 0``).
    sigma2
        ``sigma^2 > 0`` in lattice units (squared). A float is taken as the exact rational it
        represents; pass a :class:`fractions.Fraction` for a decimal value.
    seed
        Must be ``None``; any other value raises ``ValueError``.

    Returns
    -------
    numpy.ndarray
        ``int64``, shape ``(n,)``.
    """
    _refuse_seed(seed, "discrete_gaussian")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"discrete_gaussian: n={n!r} must be an integer >= 0")
    if isinstance(sigma2, bool):
        raise ValueError(f"discrete_gaussian: sigma2={sigma2!r} must be a number > 0")
    if isinstance(sigma2, float | np.floating) and not math.isfinite(sigma2):
        raise ValueError(f"discrete_gaussian: sigma2={sigma2!r} must be finite")
    frac = Fraction(sigma2) if not isinstance(sigma2, np.floating) else Fraction(float(sigma2))
    if frac <= 0:
        raise ValueError(f"discrete_gaussian: sigma2={sigma2!r} must be > 0")
    a, b = frac.numerator, frac.denominator
    t = math.isqrt(a // b) + 1
    return np.fromiter(
        (_discrete_gaussian_one(a, b, t) for _ in range(int(n))), dtype=np.int64, count=int(n)
    )


def discrete_gaussian_pmf(
    support: np.ndarray, sigma2: float, *, tail: int | None = None
) -> np.ndarray:
    """The exact normalised pmf of ``N_Z(0, sigma2)`` at the integers in ``support``.

    The normaliser sums ``exp(-y^2/(2 sigma2))`` over ``|y| <= tail`` (default
    ``50 sqrt(sigma2) + 50``; the rest is below ``1e-500``).
    """
    s2 = float(sigma2)
    if not (math.isfinite(s2) and s2 > 0):
        raise ValueError(f"discrete_gaussian_pmf: sigma2={sigma2!r} must be finite and > 0")
    m = tail if tail is not None else int(50 * math.sqrt(s2)) + 50
    ys = np.arange(-m, m + 1, dtype=np.float64)
    norm = float(np.sum(np.exp(-(ys**2) / (2 * s2))))
    x = np.asarray(support, dtype=np.float64)
    return np.exp(-(x**2) / (2 * s2)) / norm
