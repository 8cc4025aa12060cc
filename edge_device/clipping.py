"""Clipping of a device's local differential before any privacy noise.

Two clipping rules bound the l2 sensitivity of the differential ``g`` (003 Section IV-C and
SEED-NOTES item 1, where the printed ``max`` must read ``min``):

* ``"coordinate"``: every coordinate is clipped to ``|g_j| <= bound / sqrt(d)``, which implies
  ``||g||_2 <= bound`` and, over any ``l`` coordinates, ``||g_S||_2 <= bound * sqrt(l / d)``.
* ``"norm"``: ``g`` is rescaled so that ``||g||_2 <= bound`` (direction kept).
* ``"none"``: a copy, no bound (no DP scheme may use it).

``bound`` is always the l2 bound ``Z``. Every function returns a new array.
"""

from __future__ import annotations

import math

import numpy as np

CLIP_MODES = ("coordinate", "norm", "none")


def clip(g: np.ndarray, *, mode: str, bound: float) -> np.ndarray:
    """Clip a differential; returns a new ``float64`` array of the same shape.

    Parameters
    ----------
    g
        Real array, any shape with ``d = g.size >= 1`` elements (a 0-d array counts as
        ``d = 1``).
    mode
        ``"coordinate"``, ``"norm"`` or ``"none"`` (see the module docstring).
    bound
        ``Z > 0``, the l2 bound of the clipped differential (finite). Ignored for ``"none"``
        but still validated.

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``g.shape``. For ``"coordinate"``: ``|out_j| <= Z / sqrt(d)``;
        for ``"norm"``: ``||out||_2 <= Z``.

    Raises
    ------
    ValueError
        For an unknown ``mode``, a non-positive or non-finite ``bound``, an empty or
        non-finite ``g``.
    """
    if mode not in CLIP_MODES:
        raise ValueError(f"clip: mode={mode!r} is not one of {CLIP_MODES}")
    if not isinstance(bound, int | float) or isinstance(bound, bool):
        raise ValueError(f"clip: bound={bound!r} must be a real number > 0")
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"clip: bound={bound!r} must be finite and > 0")
    arr = np.array(g, dtype=np.float64, copy=True)
    if arr.size == 0:
        raise ValueError("clip: g is empty (d = 0); nothing to clip")
    if not np.all(np.isfinite(arr)):
        raise ValueError("clip: g contains NaN or infinite values")
    if mode == "none":
        return arr
    d = arr.size
    if mode == "coordinate":
        limit = bound / math.sqrt(d)
        # The limit is rounded; shrink by one ulp so |g_j| <= Z/sqrt(d) holds in floats too.
        limit = float(np.nextafter(limit, 0.0))
        return np.clip(arr, -limit, limit, out=arr)  # arr is this function's copy
    norm = float(np.linalg.norm(arr.ravel()))
    if norm <= bound:
        return arr
    out = arr * (bound / norm)
    # Guard against the rescaled norm landing one rounding step above the bound.
    while float(np.linalg.norm(out.ravel())) > bound:
        out *= float(np.nextafter(1.0, 0.0))
    return out
