"""Per-example clipping stays at or below C in float32, exactly (adversarial inputs).

The property is asserted as it is promised: the norm of the scaled float32 row, taken in
float64, never exceeds ``C`` (no tolerance). Rows are built with norms just above ``C`` (where
rounding decides), with large dimensions, heavy tails and one dominant coordinate. The old
float32 factor ``C / (||g|| + 1e-6)`` is run on the same rows to show the test can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_device.per_example import ClippedGradientSum, clip_factors, per_example_norms
from testbed.core.models import build_model

EPS32 = float(np.finfo(np.float32).eps)


def _rows(d: int, n: int, clip: float, norm: int, seed: int) -> torch.Tensor:
    """``n`` float32 rows of dimension ``d`` whose norms lie within a few ulps above ``clip``
    (and a few far above), of several shapes."""
    gen = torch.Generator().manual_seed(seed)
    kinds = [
        torch.randn(n, d, generator=gen),
        torch.randn(n, d, generator=gen) ** 3,  # heavy tails
        torch.rand(n, d, generator=gen) + 1.0,  # all positive, alike (sum rounding adds up)
    ]
    spike = torch.randn(n, d, generator=gen) * 1e-4
    spike[:, 0] = 1.0  # one dominant coordinate
    kinds.append(spike)
    rows = torch.cat(kinds).double()
    size = rows.abs().sum(1) if norm == 1 else rows.norm(dim=1)
    k = torch.randint(-4, 40, (rows.shape[0],), generator=gen).double()
    target = clip * (1.0 + k * EPS32)  # just above (and a little below) C
    target[::17] *= 1e3  # some far above
    return (rows * (target / size)[:, None]).float()


def _scaled_norm(rows: torch.Tensor, factors: torch.Tensor, norm: int) -> torch.Tensor:
    scaled = (factors[:, None] * rows).double()  # the float32 product, then widened exactly
    return scaled.abs().sum(1) if norm == 1 else scaled.square().sum(1).sqrt()


def _old_factors(rows: torch.Tensor, clip: float) -> torch.Tensor:
    return (clip / (torch.linalg.vector_norm(rows, dim=1) + 1e-6)).clamp(max=1.0)


@pytest.mark.parametrize("norm", [2, 1])
@pytest.mark.parametrize(("d", "n"), [(1, 2000), (7, 2000), (1000, 500), (1 << 16, 40),
                                      (1 << 20, 4)])
@pytest.mark.parametrize("clip", [1.0, 0.3, 300.0])
def test_scaled_rows_never_exceed_the_clip(norm: int, d: int, n: int, clip: float) -> None:
    rows = _rows(d, n, clip, norm, seed=d + n)
    factors = clip_factors(per_example_norms(rows, norm), clip)  # type: ignore[arg-type]
    assert factors.dtype == torch.float32
    got = _scaled_norm(rows, factors, norm)
    assert float(got.max()) <= clip
    # and the shrink costs at most 2^-20 relative (plus the 1e-6 absolute margin)
    assert float(got.min()) >= clip * (1 - 2.0**-19) - 1.01e-6


def test_the_old_float32_factor_overshoots() -> None:
    """Opacus' float32 ``C / (||g|| + 1e-6)``: on the same kind of rows, some exceed C."""
    clip = 1.0
    worst = 0.0
    for d, n in [(1000, 500), (1 << 16, 40)]:
        rows = _rows(d, n, clip, 2, seed=d + n)
        worst = max(worst, float(_scaled_norm(rows, _old_factors(rows, clip), 2).max()))
    assert worst > clip  # what the new factor prevents


@pytest.mark.parametrize("backend", ["vmap", "layers"])
@pytest.mark.parametrize("norm", [2, 1])
def test_one_example_sum_is_within_the_clip(backend: str, norm: int) -> None:
    """Through the per-example machinery: a batch of one gives the scaled gradient itself."""
    model = build_model("mnist-cnn", (1, 28, 28), seed=0)
    csum = ClippedGradientSum(model, backend=backend)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(12, 1, 28, 28, generator=gen) * 30.0
    y = torch.randint(0, 10, (12,), generator=gen)
    for i in range(12):
        for clip in (0.7, 3.0):
            total, norms, _ = csum(x[i : i + 1], y[i : i + 1], clip, norm=norm)  # type: ignore[arg-type]
            assert float(norms[0]) > clip
            wide = total.double()
            size = float(wide.abs().sum() if norm == 1 else wide.norm())
            assert size <= clip
            assert size >= clip * (1 - 1e-5)
