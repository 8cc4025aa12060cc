"""Clipping returns new arrays and bounds what it promises (properties, not pinned values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from edge_device.clipping import clip

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
vectors = arrays(np.float64, st.integers(1, 300), elements=finite)
bounds = st.floats(min_value=1e-3, max_value=1e3)


@settings(max_examples=200, deadline=None)
@given(g=vectors, z=bounds)
def test_coordinate_bounds_every_coordinate_and_the_norm(g: np.ndarray, z: float) -> None:
    out = clip(g, mode="coordinate", bound=z)
    assert out.shape == g.shape
    assert np.all(np.abs(out) <= z / math.sqrt(g.size))
    assert np.linalg.norm(out) <= z * (1 + 1e-12)
    # coordinates already inside the box are untouched; the others sit on the box, same sign
    inside = np.abs(g) < z / math.sqrt(g.size) * (1 - 1e-12)
    assert np.array_equal(out[inside], g[inside])
    assert np.all(np.sign(out[~inside]) == np.sign(g[~inside]))


@settings(max_examples=200, deadline=None)
@given(g=vectors, z=bounds)
def test_norm_bounds_the_norm_and_keeps_the_direction(g: np.ndarray, z: float) -> None:
    out = clip(g, mode="norm", bound=z)
    assert np.linalg.norm(out) <= z
    n = np.linalg.norm(g)
    if n <= z:
        assert np.array_equal(out, g)
    else:
        # parallel, same orientation
        assert np.allclose(out * n, g * np.linalg.norm(out), rtol=1e-9, atol=1e-12 * n * z)


def test_returns_a_new_array_and_leaves_the_input_alone() -> None:
    g = np.array([10.0, -10.0, 0.1, 3.0])
    before = g.copy()
    for mode in ("coordinate", "norm", "none"):
        out = clip(g, mode=mode, bound=1.0)
        assert out is not g
        assert not np.shares_memory(out, g)
        assert np.array_equal(g, before)
    assert np.array_equal(clip(g, mode="none", bound=1.0), g)


def test_zero_dimensional_array_is_clipped() -> None:
    out = clip(np.array(7.0), mode="coordinate", bound=2.0)
    assert out.shape == ()
    assert abs(float(out)) <= 2.0
    assert abs(float(clip(np.array(-7.0), mode="norm", bound=2.0))) <= 2.0


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"mode": "l2", "bound": 1.0}, "mode"),
        ({"mode": "norm", "bound": 0.0}, "bound"),
        ({"mode": "norm", "bound": -1.0}, "bound"),
        ({"mode": "coordinate", "bound": float("inf")}, "bound"),
        ({"mode": "coordinate", "bound": float("nan")}, "bound"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        clip(np.ones(3), **kwargs)


def test_non_finite_or_empty_input_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        clip(np.array([1.0, np.nan]), mode="norm", bound=1.0)
    with pytest.raises(ValueError, match="empty"):
        clip(np.array([]), mode="norm", bound=1.0)
