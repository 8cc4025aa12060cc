"""Privacy noise: statistics of the secure Gaussian and the exact discrete Gaussian.

The noise cannot be seeded (by design), so these tests are statistical with thresholds
whose false-alarm probability is below about 1e-6 each.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats

from testbed.core import noise
from testbed.core.noise import discrete_gaussian, discrete_gaussian_pmf, gaussian


def test_gaussian_variance_mean_and_shape() -> None:
    n, sigma = 400_000, 2.5
    x = gaussian(n, sigma)
    assert x.shape == (n,) and x.dtype == np.float64
    # Var of the sample variance of a Gaussian: 2 sigma^4 / n
    assert abs(x.var() - sigma**2) < 6 * sigma**2 * math.sqrt(2 / n)
    assert abs(x.mean()) < 6 * sigma / math.sqrt(n)
    assert gaussian((3, 4), 1.0).shape == (3, 4)


def test_gaussian_is_symmetric_and_normal() -> None:
    x = gaussian(200_000, 1.0)
    positives = int(np.sum(x > 0))
    assert abs(positives - 100_000) < 6 * math.sqrt(200_000 * 0.25)
    assert stats.kstest(x, "norm").pvalue > 1e-6
    assert abs(stats.kurtosis(x)) < 6 * math.sqrt(24 / 200_000)


def _spy_bytes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every byte string the module reads from the OS CSPRNG, in order."""
    drawn: list[bytes] = []
    real = noise._random_bytes

    def spy(k: int) -> bytes:
        drawn.append(real(k))
        return drawn[-1]

    monkeypatch.setattr(noise, "_random_bytes", spy)
    return drawn


def _uniforms(raw: bytes) -> np.ndarray:
    """The uniforms ``(k + 1) 2^-53`` of 64-bit little-endian words' top 53 bits, computed
    word by word in exact integer arithmetic."""
    words = [int.from_bytes(raw[8 * j : 8 * j + 8], "little") for j in range(len(raw) // 8)]
    return np.array([Fraction((w >> 11) + 1, 1 << 53) for w in words], dtype=np.float64)


@pytest.mark.parametrize("n", [1, 2, 7, 10_920, (1 << 20) + 3])
@pytest.mark.parametrize("into", [None, np.float64, np.float32])
def test_gaussian_is_box_muller_of_the_urandom_uniforms(
    n: int, into: type | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transform against numpy's Box-Muller on the same uniforms: per chunk of at most
    2^20 values (m of them), one read of 16 ceil(m/2) bytes, u1 then u2; z = r cos, then
    r sin, truncated to m. Into a caller's array or a new one, the same; into a float32
    array, the float64 values rounded once."""
    drawn = _spy_bytes(monkeypatch)
    out = None if into is None else np.full(n, np.nan, dtype=into)
    z = gaussian(n, 1.5, out=out)
    if out is not None:
        assert z is out
    parts = []
    starts = range(0, n, 1 << 20)
    assert len(drawn) == len(starts)
    for start, raw in zip(starts, drawn, strict=True):
        m = min(1 << 20, n - start)
        pairs = (m + 1) // 2
        assert len(raw) == 16 * pairs
        u = _uniforms(raw) if m < 100_000 else (
            (np.frombuffer(raw, dtype="<u8") >> np.uint64(11)).astype(np.float64) + 1.0) / 2.0**53
        r = np.sqrt(-2.0 * np.log(u[:pairs]))
        angle = 2.0 * np.pi * u[pairs:]
        parts.append(np.concatenate([r * np.cos(angle), r * np.sin(angle)])[:m])
    expect = 1.5 * np.concatenate(parts)
    if into is np.float32:
        assert z.dtype == np.float32
        # one rounding of values within 1e-13 of the expected ones: at most one ulp apart
        ulps = np.abs(z.view(np.int32) - expect.astype(np.float32).view(np.int32))
        assert ulps.max() <= 1 and np.mean(ulps) < 1e-3
    else:
        np.testing.assert_allclose(z, expect, rtol=1e-13, atol=1e-15)


def test_gaussian_into_refuses_an_unfit_array() -> None:
    for bad in (np.empty(5, dtype=np.float16), np.empty(4), np.empty(10)[::2],
                np.empty((5, 1)), [0.0] * 5):
        with pytest.raises(ValueError, match="out must be"):
            gaussian(5, 1.0, out=bad)  # type: ignore[arg-type]
    out = np.full((2, 3), 7.0)
    assert gaussian((2, 3), 0.0, out=out) is out and not out.any()


def test_secure_uniform_is_the_top_53_bits_of_urandom_words(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn = _spy_bytes(monkeypatch)
    u = noise.secure_uniform(1000)
    assert np.array_equal(u, _uniforms(drawn[0])) and u.min() > 0 and u.max() <= 1


@pytest.mark.parametrize("rate", [0.0, 1.0, 64 / 6000, 0.5, 1 / 3, 2.0**-60, 255.5 / 256])
def test_secure_bernoulli_is_a_53_bit_uniform_below_the_rate(
    rate: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each decision against the 53-bit comparison it stands for: item j's top byte h_j is
    read; for the items whose byte ties with T's top 8 bits (T = floor(q 2^53)), 8 more bytes
    each give the 45 low bits (the top 45 of the word). Kept iff h 2^45 + low < T, the event
    (k + 1) 2^-53 <= q of secure_uniform."""
    drawn = _spy_bytes(monkeypatch)
    n = 20_000
    keep = noise.secure_bernoulli(n, rate)
    assert keep.dtype == np.bool_ and keep.shape == (n,)
    t = math.floor(Fraction(rate) * 2**53)
    if rate == 1.0:
        assert not drawn and keep.all()
        return
    high = drawn[0]
    assert len(high) == n
    ties = [j for j in range(n) if high[j] == t >> 45]
    lows = drawn[1] if ties else b""
    assert len(drawn) == (2 if ties else 1) and len(lows) == 8 * len(ties)
    expect = [high[j] < t >> 45 for j in range(n)]
    for m, j in enumerate(ties):
        k = (high[j] << 45) + (int.from_bytes(lows[8 * m : 8 * m + 8], "little") >> 19)
        expect[j] = Fraction(k + 1, 2**53) <= Fraction(rate)
    assert keep.tolist() == expect


def test_secure_bernoulli_ties_are_decided_by_the_low_bits(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chosen bytes: the tie cases on both sides of T's low bits."""
    rate = (5 * 2**45 + 1000) / 2**53  # T = 5 * 2^45 + 1000: top byte 5, low bits 1000
    reads = iter([bytes([4, 5, 6, 5, 5]),
                  b"".join((v << 19).to_bytes(8, "little") for v in (999, 1000, 0))])
    monkeypatch.setattr(noise, "_random_bytes", lambda k: next(reads))
    assert noise.secure_bernoulli(5, rate).tolist() == [True, True, False, False, True]


def test_secure_bernoulli_frequency_and_bad_arguments() -> None:
    n, q = 400_000, 0.0107
    kept = int(noise.secure_bernoulli(n, q).sum())
    assert abs(kept - n * q) < 6 * math.sqrt(n * q * (1 - q))
    assert noise.secure_bernoulli(0, 0.5).shape == (0,)
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="rate"):
            noise.secure_bernoulli(3, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n="):
        noise.secure_bernoulli(-1, 0.5)
    with pytest.raises(ValueError, match="seed"):
        noise.secure_bernoulli(3, 0.5, seed=1)


def test_gaussian_draws_differ_between_calls_and_zero_sigma_is_zero() -> None:
    assert not np.array_equal(gaussian(64, 1.0), gaussian(64, 1.0))
    assert np.array_equal(gaussian(5, 0.0), np.zeros(5))


@pytest.mark.parametrize("fn", [lambda: gaussian(4, 1.0, seed=0),
                                lambda: discrete_gaussian(4, 1.0, seed=123),
                                lambda: noise.secure_uniform(3, seed=1)])
def test_a_seed_is_refused(fn) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="seed"):
        fn()


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="sigma"):
        gaussian(3, -1.0)
    with pytest.raises(ValueError, match="sigma"):
        gaussian(3, float("nan"))
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(3, 0)
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(3, float("inf"))
    with pytest.raises(ValueError, match="n="):
        discrete_gaussian(-1, 1.0)


@pytest.mark.parametrize("sigma2", [0.4, 2.5, Fraction(49, 3)])
def test_discrete_gaussian_pmf_by_chi_square(sigma2: float | Fraction) -> None:
    n = 30_000
    x = discrete_gaussian(n, sigma2)
    assert x.dtype == np.int64
    s2 = float(sigma2)
    m = int(4 * math.sqrt(s2)) + 1  # bins -m..m, tails merged into the end bins
    support = np.arange(-m, m + 1)
    p = discrete_gaussian_pmf(support, s2)
    tail = (1.0 - p.sum()) / 2
    p[0] += tail
    p[-1] += tail
    counts = np.array([np.sum(np.clip(x, -m, m) == k) for k in support])
    chi2 = float(np.sum((counts - n * p) ** 2 / (n * p)))
    assert stats.chi2.sf(chi2, support.size - 1) > 1e-6


def test_discrete_gaussian_symmetry_and_variance() -> None:
    n, s2 = 40_000, 9.0
    x = discrete_gaussian(n, s2)
    support = np.arange(-80, 81)
    p = discrete_gaussian_pmf(support, s2)
    var = float(np.sum(support.astype(float) ** 2 * p))
    fourth = float(np.sum(support.astype(float) ** 4 * p))
    se_var = math.sqrt((fourth - var**2) / n)
    assert abs(float(np.mean(x.astype(float) ** 2)) - var) < 6 * se_var
    assert abs(float(x.mean())) < 6 * math.sqrt(var / n)
    pos, neg = int(np.sum(x > 0)), int(np.sum(x < 0))
    assert abs(pos - neg) < 6 * math.sqrt(pos + neg)


def test_discrete_gaussian_large_scale_variance() -> None:
    n, s2 = 20_000, 1e4
    x = discrete_gaussian(n, s2).astype(float)
    # for sigma2 >= 1 the variance equals sigma2 up to < 1e-30 relative (CKS Cor. 9)
    assert abs(x.var() - s2) < 6 * s2 * math.sqrt(2 / n)


@pytest.mark.parametrize(("num", "den"), [(1, 2), (23, 10), (0, 1), (7, 1)])
def test_exact_bernoulli_exp(num: int, den: int) -> None:
    n = 60_000
    hits = sum(noise._bernoulli_exp(num, den) for _ in range(n))
    p = math.exp(-num / den)
    assert abs(hits - n * p) <= 6 * math.sqrt(n * p * (1 - p)) + 1e-9


def test_long_reads_are_a_chacha20_keystream_keyed_from_urandom_for_that_read_alone(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of at least DRBG_MIN_BYTES is the RFC 8439 keystream (block counter 0) under the
    256-bit key and 96-bit nonce that os.urandom gave for it; shorter reads are os.urandom
    itself. Two reads never share a key."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    seeds: list[bytes] = []
    real = noise.os.urandom

    def urandom(k: int) -> bytes:
        seeds.append(real(k))
        return seeds[-1]

    monkeypatch.setattr(noise.os, "urandom", urandom)
    short = noise._random_bytes(noise.DRBG_MIN_BYTES - 1)
    assert seeds == [short]
    longs = [noise._random_bytes(n) for n in (noise.DRBG_MIN_BYTES, 1 << 20)]
    assert [len(s) for s in seeds[1:]] == [44, 44] and seeds[1] != seeds[2]
    for seed, got in zip(seeds[1:], longs, strict=True):
        key, nonce = seed[:32], seed[32:]
        stream = Cipher(algorithms.ChaCha20(key, bytes(4) + nonce), mode=None).encryptor()
        assert got == stream.update(bytes(len(got)))
    assert longs[0] != longs[1][: len(longs[0])]


def _child_draw(conn: Any) -> None:
    conn.send((gaussian(4096, 1.0).tobytes(), noise._random_bytes(1 << 16)))
    conn.close()


def test_forked_workers_never_share_a_stream() -> None:
    """Two workers forked from one process (as the training pool forks) after it drew: each
    draws its own stream; no 8-byte word of one appears in the other's or the parent's."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    gaussian(4096, 1.0)  # the parent draws before it forks
    draws = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        worker = ctx.Process(target=_child_draw, args=(child,))
        worker.start()
        draws.append(parent.recv())
        worker.join(60)
        assert worker.exitcode == 0
    mine = (gaussian(4096, 1.0).tobytes(), noise._random_bytes(1 << 16))
    words = [set(np.frombuffer(z + b, dtype=np.uint64).tolist()) for z, b in [*draws, mine]]
    assert not words[0] & words[1] and not words[0] & words[2] and not words[1] & words[2]
