"""Flat-channel draws: the values of the textbook expressions, bit for bit (signed zeros too),
so a seeded run keeps its results."""

from __future__ import annotations

import numpy as np
import pytest

from radio.channel import awgn, expand_blocks


def _textbook_awgn(n: int, noise_var: float, rng: np.random.Generator) -> np.ndarray:
    """``sqrt(N0 / 2) (a + j b)``, ``a`` and ``b`` drawn one after the other."""
    scale = np.sqrt(noise_var / 2.0)
    return scale * (rng.standard_normal(n) + 1j * rng.standard_normal(n))


class _Draws:
    """A stand-in generator returning given normal draws, in order (``standard_normal``)."""

    def __init__(self, *draws: np.ndarray) -> None:
        self.draws = np.concatenate(draws)
        self.taken = 0

    def standard_normal(self, n: int) -> np.ndarray:
        out = self.draws[self.taken : self.taken + n].copy()
        self.taken += n
        return out


@pytest.mark.parametrize("n", [0, 1, 2, 7, 3925, 10_001])
@pytest.mark.parametrize("noise_var", [1e-6, 0.01, 1.0, 37.5])
def test_awgn_bit_for_bit(n: int, noise_var: float) -> None:
    for seed in range(5):
        got = awgn(n, noise_var, np.random.default_rng(seed))
        want = _textbook_awgn(n, noise_var, np.random.default_rng(seed))
        assert got.dtype == np.complex128 and got.shape == (n,)
        assert got.tobytes() == want.tobytes()


def test_awgn_signed_zero_draws() -> None:
    """A draw of exactly +-0.0 (a ziggurat output, probability ~2^-52) gives the sign the
    complex product gives: +0.0."""
    a = np.array([0.0, -0.0, 1.0, -1.0, 0.0, -0.0, 2.5, -0.0])
    b = np.array([0.0, 0.0, -0.0, -0.0, 1.0, -1.0, -0.0, 3.0])
    got = awgn(a.size, 0.3, _Draws(a, b))  # type: ignore[arg-type]
    want = _textbook_awgn(a.size, 0.3, _Draws(a, b))  # type: ignore[arg-type]
    assert got.tobytes() == want.tobytes()


def test_expand_blocks_one_block() -> None:
    gains = np.array([0.3 - 1.2j, 5.0 + 0j])
    got = expand_blocks(gains, 9, None)
    assert got.dtype == np.complex128 and got.flags.writeable
    assert got.tobytes() == np.full(9, gains[0], dtype=np.complex128).tobytes()
    assert expand_blocks(gains, 0, None).shape == (0,)
