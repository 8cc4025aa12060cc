"""Privacy noise from a cryptographically secure source.

Nothing here takes a seed: privacy noise must not be reproducible from anything an adversary
could learn (the experiment seed sits in a run's metadata). A passed ``seed`` is refused.

* :func:`gaussian`: continuous ``N(0, sigma^2)`` for noise *before* compression
  (Algorithm 1 of 003). Uniforms (53 random bits each) come from the OS CSPRNG: ``os.urandom``,
  or for a read of 4 kB or more a ChaCha20 keystream keyed from ``os.urandom`` for that read
  alone (:func:`_random_bytes`), and are turned into Gaussians by the Box-Muller transform.
  ``numpy``'s PCG-based generators are not used: PCG is not a CSPRNG, its state can be
  recovered from outputs.
* :func:`secure_bernoulli`: independent ``Bernoulli(q)`` inclusions (Poisson subsampling)
  from the same CSPRNG, exactly the law of ``secure_uniform(n) <= q`` from one byte per item
  (and 8 more for the one item in 256 whose byte ties with ``q``'s).
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
import threading
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


#: ``2^53``: a 53-bit integer ``k`` becomes the uniform ``(k + 1) 2^-53`` in ``(0, 1]``.
_TWO53 = 9007199254740992.0
_ULP53 = 1.0 / _TWO53


def _check_count(n: object, where: str) -> int:
    """``n`` as an ``int`` when it is a non-negative integer (not a bool), else ``ValueError``."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"{where}: n={n!r} must be an integer >= 0")
    return int(n)


#: Reads of at least this many bytes come from the keyed generator (:func:`_random_bytes`);
#: shorter ones from ``os.urandom`` itself (a key costs 44 bytes of it and a cipher set-up).
DRBG_MIN_BYTES = 4096


def _random_bytes(n: int) -> bytes:
    """``n`` bytes from the OS CSPRNG. Every random bit of this module comes through here.

    Short reads are ``os.urandom`` (``getrandom(2)`` on Linux). A read of at least
    :data:`DRBG_MIN_BYTES` is the ChaCha20 keystream (RFC 8439, OpenSSL through
    ``cryptography``) under a 256-bit key and a 96-bit nonce drawn from ``os.urandom`` for
    this read alone, block counter from 0: a deterministic random bit generator reseeded
    from the OS before every draw, as NIST SP 800-90A builds one from a block cipher (and
    Opacus's secure mode from AES-CTR). The key lives in this call's frame only; no state
    outlives the call, so no two draws, threads or forked processes share a stream. A read
    is at most a few MB (``_CHUNK`` words), far below the 2^38 bytes one key covers.
    """
    if n < DRBG_MIN_BYTES:
        return os.urandom(n)
    # imported on use: the flowgraphs' system interpreter loads this module too
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    seed = os.urandom(44)
    cipher = Cipher(algorithms.ChaCha20(seed[:32], bytes(4) + seed[32:]), mode=None)
    return cipher.encryptor().update(bytes(n))


class _Scratch(threading.local):
    """Per-thread work arrays of :func:`gaussian`, reused across calls: a fresh array of the
    size of a model's noise costs its page faults (about 0.1 ms per 175 kB here), a fifth of
    the draw. Each call overwrites what it uses; nothing is kept between calls but memory."""

    def __init__(self) -> None:
        self.raw = np.empty(0, dtype=np.uint64)
        self.uniform = np.empty(0, dtype=np.float64)

    def arrays(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of ``n`` entries: ``uint64`` raw words and ``float64`` uniforms."""
        if self.raw.size < n:
            self.raw = np.empty(n, dtype=np.uint64)
            self.uniform = np.empty(n, dtype=np.float64)
        return self.raw[:n], self.uniform[:n]


_SCRATCH = _Scratch()


def _uniforms_into(raw: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (``float64``) with uniforms in ``(0, 1]``, 53 bits each, through ``raw``
    (``uint64``, the same length, overwritten): ``(k + 1) 2^-53`` with ``k`` the top 53 bits of
    a random 64-bit word."""
    raw.view(np.uint8)[:] = np.frombuffer(_random_bytes(8 * raw.size), dtype=np.uint8)
    np.right_shift(raw, np.uint64(11), out=raw)
    out[:] = raw  # exact: k < 2^53
    out += 1.0
    out *= _ULP53


def secure_uniform(n: int, *, seed: object = None) -> np.ndarray:
    """``n`` uniforms in ``(0, 1]`` from the OS CSPRNG (53 bits each), ``float64``."""
    _refuse_seed(seed, "secure_uniform")
    n = _check_count(n, "secure_uniform")
    out = np.empty(n, dtype=np.float64)
    _uniforms_into(np.empty(n, dtype=np.uint64), out)
    return out


def secure_bernoulli(n: int, rate: float, *, seed: object = None) -> np.ndarray:
    """``n`` independent inclusions with probability ``rate`` from the OS CSPRNG.

    The law is exactly that of ``secure_uniform(n) <= rate``: with ``T = floor(rate 2^53)``,
    item ``j`` is kept when a uniform 53-bit integer ``k_j`` is below ``T`` (``(k + 1) 2^-53
    <= rate`` if and only if ``k + 1 <= T``), so ``P(keep) = T 2^-53``, within ``2^-53`` below
    ``rate``. ``k_j``'s top 8 bits are one random byte ``h_j``; only when ``h_j`` equals
    ``T``'s top 8 bits (probability ``1/256``) are its 45 low bits drawn (from 8 more bytes)
    and compared, as the comparison of ``k_j`` with ``T`` would: ``P(keep) = T_hi / 256 +
    (1/256) T_lo 2^-45 = T 2^-53``. About 1 byte per item instead of 8.

    Parameters
    ----------
    n
        Number of items, ``>= 0``.
    rate
        Inclusion probability ``q`` in ``[0, 1]``.
    seed
        Must be ``None``; any other value raises ``ValueError``.

    Returns
    -------
    numpy.ndarray
        ``bool``, ``(n,)``.
    """
    _refuse_seed(seed, "secure_bernoulli")
    n = _check_count(n, "secure_bernoulli")
    if isinstance(rate, bool) or not isinstance(rate, int | float | np.floating) or not (
        0.0 <= rate <= 1.0
    ):
        raise ValueError(f"secure_bernoulli: rate={rate!r} must be a number in [0, 1]")
    threshold = math.floor(float(rate) * _TWO53)  # T, exact: a power-of-2 scaling
    t_hi, t_lo = threshold >> 45, threshold & ((1 << 45) - 1)
    if t_hi > 255:  # rate 1: T = 2^53, every k is below it (no random bit is needed)
        return np.ones(n, dtype=bool)
    high = np.frombuffer(_random_bytes(n), dtype=np.uint8)
    keep = high < t_hi
    ties = np.flatnonzero(high == t_hi)
    if ties.size:
        low = np.frombuffer(_random_bytes(8 * ties.size), dtype=np.uint64) >> np.uint64(19)
        keep[ties] = low < np.uint64(t_lo)
    return keep


def gaussian(
    shape: int | tuple[int, ...],
    sigma: float,
    *,
    seed: object = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Continuous Gaussian noise ``N(0, sigma^2 I)`` from the OS CSPRNG.

    Parameters
    ----------
    shape
        Output shape (e.g. ``d`` or ``(d,)``).
    sigma
        Standard deviation per coordinate, ``>= 0`` (same units as the vector it perturbs).
    seed
        Must be ``None``; any other value raises ``ValueError``.
    out
        ``None``: a new ``float64`` array. Else a C-contiguous ``float64`` or ``float32``
        array of exactly ``shape``, overwritten with the draw and returned (a caller drawing
        the same size again and again keeps one and saves the fresh array's page faults).
        Into ``float32`` each value is computed in ``float64`` as for a ``float64`` array
        and rounded once (to nearest), exactly as that array's ``astype(np.float32)``.

    Returns
    -------
    numpy.ndarray
        ``out``, or a new ``float64`` array of the given shape. ``sigma == 0`` gives zeros.
    """
    _refuse_seed(seed, "gaussian")
    if isinstance(sigma, bool) or not isinstance(sigma, int | float | np.floating):
        raise ValueError(f"gaussian: sigma={sigma!r} must be a real number >= 0")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"gaussian: sigma={sigma!r} must be finite and >= 0")
    shp = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if any(int(s) < 0 for s in shp):
        raise ValueError(f"gaussian: shape={shape!r} has a negative dimension")
    shp = tuple(int(s) for s in shp)
    if out is None:
        out = np.empty(shp, dtype=np.float64)
    elif not (isinstance(out, np.ndarray) and out.dtype in (np.float64, np.float32)
              and out.shape == shp and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(
            f"gaussian: out must be a writeable C-contiguous float64 or float32 array of "
            f"shape {shp}, "
            f"got {type(out).__name__} {getattr(out, 'dtype', '')} "
            f"{getattr(out, 'shape', '')}")
    flat = out.reshape(-1)
    n = flat.size
    if sigma == 0:
        flat[:] = 0.0
        return out
    # numpy only: the secret channel noise of the GNU Radio flowgraph process uses this too
    # (flowgraphs/csprng_noise.py, the system interpreter, which has no torch)
    wide = flat.dtype == np.float64
    for start in range(0, n, _CHUNK):
        m = min(_CHUNK, n - start)
        pairs = (m + 1) // 2
        raw, u = _SCRATCH.arrays(2 * pairs)
        _uniforms_into(raw, u)  # u1, then u2: one read of urandom
        radius = u[:pairs]
        np.log(radius, out=radius)
        radius *= -2.0
        np.sqrt(radius, out=radius)
        angle = u[pairs:]
        angle *= 2.0 * np.pi
        # z = (r cos, r sin), truncated to m: straight into a float64 ``out`` when m is even,
        # else into the raw words' scratch (read already) and copied
        direct = wide and m % 2 == 0
        z = flat[start : start + m] if direct else raw.view(np.float64)
        np.cos(angle, out=z[:pairs])
        np.sin(angle, out=z[pairs:])
        z[:pairs] *= radius
        z[pairs:] *= radius
        if not direct:
            if not wide:
                z *= float(sigma)  # in float64, then rounded once below
            flat[start : start + m] = z[:m]
    if wide:
        flat *= float(sigma)
    return out


# ---------------------------------------------------------------- exact discrete Gaussian


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
    n = _check_count(n, "discrete_gaussian")
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
        (_discrete_gaussian_one(a, b, t) for _ in range(n)), dtype=np.int64, count=n
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
