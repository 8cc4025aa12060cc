"""The global update (003 Algorithm 1, line 15); the averaging is the scheme's ``combine``
(:func:`testbed.core.scheme_api.federation_mean` for every built-in)."""

from __future__ import annotations

import numpy as np


def global_update(w: np.ndarray, mean_differential: np.ndarray, lr: float) -> np.ndarray:
    """``w_{t+1} = w_t - lr * mean_differential``, ``float32``, shape ``(d,)``."""
    out = np.asarray(w, dtype=np.float64) - lr * np.asarray(mean_differential, dtype=np.float64)
    return out.astype(np.float32)
