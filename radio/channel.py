"""Flat channel states: generate a gain sequence, separately from applying it.

Fading is block fading: one complex gain per coherence block, i.i.d. across blocks, devices
and rounds, normalised to ``E|h|^2 = 1``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from radio.units import db_to_linear

Fading = Literal["none", "rayleigh", "rician"]


def draw_block_gains(
    fading: Fading,
    n_blocks: int,
    rng: np.random.Generator,
    *,
    rician_k_db: float = 6.0,
) -> np.ndarray:
    """Draw one complex gain per coherence block.

    Parameters
    ----------
    fading
        ``none`` (h = 1), ``rayleigh`` (h ~ CN(0, 1)) or ``rician`` (line of sight plus
        scatter with K-factor ``rician_k_db``; LoS phase uniform).
    n_blocks
        Number of coherence blocks.
    rng
        Channel generator.

    Returns
    -------
    numpy.ndarray
        ``complex128``, shape ``(n_blocks,)``, ``E|h|^2 = 1``.
    """
    if n_blocks < 0:
        raise ValueError(f"n_blocks must be >= 0, got {n_blocks}")
    if fading == "none":
        return np.ones(n_blocks, dtype=np.complex128)
    scatter = (rng.standard_normal(n_blocks) + 1j * rng.standard_normal(n_blocks)) / np.sqrt(2)
    if fading == "rayleigh":
        return scatter
    if fading == "rician":
        k = float(db_to_linear(rician_k_db))
        los = np.exp(1j * rng.uniform(0, 2 * np.pi, n_blocks))
        return np.sqrt(k / (k + 1)) * los + np.sqrt(1 / (k + 1)) * scatter
    raise ValueError(f"fading: got {fading!r}; allowed: 'none', 'rayleigh', 'rician'")


def expand_blocks(
    block_gains: np.ndarray, n_symbols: int, coherence_symbols: int | None
) -> np.ndarray:
    """Per-symbol gains from block gains, shape ``(n_symbols,)``.

    ``coherence_symbols=None`` means one block covers the whole upload.
    """
    if coherence_symbols is None:
        gains = np.empty(n_symbols, dtype=np.complex128)  # np.full, without its Python layer
        gains.fill(block_gains[0])
        return gains
    idx = np.arange(n_symbols) // coherence_symbols
    return block_gains[idx].astype(np.complex128)


def n_blocks_for(n_symbols: int, coherence_symbols: int | None) -> int:
    """Number of coherence blocks an upload of ``n_symbols`` spans."""
    if coherence_symbols is None:
        return 1
    return max(1, -(-n_symbols // coherence_symbols))


def awgn(n: int, noise_var: float, rng: np.random.Generator) -> np.ndarray:
    """Circular complex Gaussian noise, ``E|n|^2 = noise_var``, shape ``(n,)``."""
    scale = np.sqrt(noise_var / 2.0)
    # The values of ``scale * (a + 1j * b)`` (``a``, then ``b``: ``n`` draws each) without its
    # three complex temporaries. ``+ 0.0`` turns a -0.0 into +0.0, as the complex product
    # does: bit for bit the same (tests/test_channel.py).
    parts = rng.standard_normal(2 * n)
    parts *= scale
    parts += 0.0
    out = np.empty(n, dtype=np.complex128)
    out.real = parts[:n]
    out.imag = parts[n:]
    return out
