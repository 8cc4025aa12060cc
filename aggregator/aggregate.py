"""Averaging of decoded differentials and the global update (003 Algorithm 1, line 15)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from testbed.core.scheme_api import federation_mean


def average(differentials: Sequence[np.ndarray], n_devices: int) -> np.ndarray:
    """``(1/N) sum_i g_i`` (:func:`testbed.core.scheme_api.federation_mean`, what every
    built-in scheme's ``combine`` is)."""
    return federation_mean(differentials, n_devices)


def global_update(w: np.ndarray, mean_differential: np.ndarray, lr: float) -> np.ndarray:
    """``w_{t+1} = w_t - lr * mean_differential``, ``float32``, shape ``(d,)``."""
    out = np.asarray(w, dtype=np.float64) - lr * np.asarray(mean_differential, dtype=np.float64)
    return out.astype(np.float32)
