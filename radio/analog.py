"""Uncoded analog mapping: two real values per complex baseband symbol."""

from __future__ import annotations

import numpy as np


def n_symbols_for(n_reals: int) -> int:
    """Number of complex symbols that carry ``n_reals`` real values (``ceil(n/2)``)."""
    if n_reals < 0:
        raise ValueError(f"n_reals must be >= 0, got {n_reals}")
    return (n_reals + 1) // 2


def reals_to_symbols(values: np.ndarray) -> np.ndarray:
    """Pack reals into complex symbols, ``x_k = v_{2k} + j v_{2k+1}``.

    Parameters
    ----------
    values
        Real array, shape ``(n,)``. An odd ``n`` is zero-padded by one.

    Returns
    -------
    numpy.ndarray
        ``complex128``, shape ``(ceil(n / 2),)``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"values must be 1-d, got shape {v.shape}")
    if v.size % 2:
        v = np.concatenate([v, np.zeros(1)])
    return v[0::2] + 1j * v[1::2]


def symbols_to_reals(symbols: np.ndarray, n_reals: int) -> np.ndarray:
    """Inverse of :func:`reals_to_symbols`: ``float64``, shape ``(n_reals,)``."""
    s = np.asarray(symbols, dtype=np.complex128)
    if s.ndim != 1 or s.size != n_symbols_for(n_reals):
        raise ValueError(
            f"expected {n_symbols_for(n_reals)} symbols for {n_reals} reals, got shape {s.shape}"
        )
    out = np.empty(2 * s.size, dtype=np.float64)
    out[0::2] = s.real
    out[1::2] = s.imag
    return out[:n_reals]
