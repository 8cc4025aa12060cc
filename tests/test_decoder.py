"""Decoding at the aggregator: channel inversion, mask placement, projection."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.decoder import decode_differential, project_coordinates
from radio.analog import reals_to_symbols
from radio.link import ChannelState, Reception
from testbed.core.masks import sparsify_mask
from testbed.core.transport.protocol import UploadHeader


def test_inversion_undoes_gain_and_alpha_and_places_values() -> None:
    d, l, alpha = 50, 12, 0.3
    idx = sparsify_mask("secret", 2, 7, d, l)
    values = np.random.default_rng(0).standard_normal(l)
    h = 0.2 * np.exp(1j * 0.7)
    x = alpha * reals_to_symbols(values)
    rec = Reception(h * x, ChannelState.known(np.full(x.size, h), 0.0), x.size, x.size, 0.0)
    header = UploadHeader(device=2, round_index=7, d=d, n_values=l, alpha=alpha, sparsified=True)
    g = decode_differential(
        rec, header, lambda hd: sparsify_mask("secret", hd.device, hd.round_index, hd.d, l)
    )
    np.testing.assert_allclose(g[idx], values, atol=1e-12)
    assert np.count_nonzero(g) == l


def test_projection_never_moves_further_from_a_point_in_the_box() -> None:
    rng = np.random.default_rng(1)
    bound = 0.5
    truth = rng.uniform(-bound, bound, 10_000)
    noisy = truth + rng.normal(0, 3.0, truth.size)
    out = project_coordinates(noisy, bound)
    assert np.all(np.abs(out) <= bound)
    assert np.all(np.abs(out - truth) <= np.abs(noisy - truth) + 1e-15)
    assert np.mean((out - truth) ** 2) < 0.1 * np.mean((noisy - truth) ** 2)
    with pytest.raises(ValueError):
        project_coordinates(noisy, 0.0)
