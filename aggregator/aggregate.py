"""Averaging of decoded differentials and the global update (003 Algorithm 1, line 15)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def average(differentials: Sequence[np.ndarray], n_devices: int) -> np.ndarray:
    """``(1/N) sum_i g_i`` over the devices that uploaded, shape ``(d,)``.

    Devices that sat a round out contribute zero, and the sum is still divided by the
    number of devices ``N`` of the federation (003 eq. 14 averages over all N), so the
    step size does not grow when devices drop out.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    if not differentials:
        raise ValueError("no differential to average")
    total = np.zeros_like(np.asarray(differentials[0], dtype=np.float64))
    for g in differentials:
        total += np.asarray(g, dtype=np.float64)
    return total / n_devices


def global_update(w: np.ndarray, mean_differential: np.ndarray, lr: float) -> np.ndarray:
    """``w_{t+1} = w_t - lr * mean_differential``, ``float32``, shape ``(d,)``."""
    out = np.asarray(w, dtype=np.float64) - lr * np.asarray(mean_differential, dtype=np.float64)
    return out.astype(np.float32)
