"""Record-level local training: per-example clipping, Poisson batches, per-step noise.

Statistical checks use thresholds of about 6 standard errors (false alarm below ~1e-8 each).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edge_device.dp_trainer import RecordTrainer, poisson_sample
from edge_device.per_example import ClippedGradientSum
from testbed.core.models import build_model, get_flat, n_params
from tests.test_per_example_layers import _Twice

BACKENDS = ["layers", "vmap"]


# Small batches on a shared machine: one thread is ~10x faster than contended two.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n: int, seed: int = 0, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (scale * rng.standard_normal((n, 1, 28, 28))).astype(np.float32)
    return x, rng.integers(0, 10, n).astype(np.int64)


def _flat_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y, reduction=reduction).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]


def _manual_clipped_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: one backward pass per example."""
    total = torch.zeros(n_params(model))
    norms = []
    for i in range(len(y)):
        g = _flat_grad(model, x[i : i + 1], y[i : i + 1], "sum")
        norms.append(float(g.norm()))
        total += g * min(1.0, clip / (norms[-1] + 1e-6))
    return total, torch.tensor(norms)


class _Odd(nn.Module):
    """Strided, padded, dilated and bias-free convolutions, a non-square kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, stride=2, padding=1, dilation=2)
        self.c2 = nn.Conv2d(4, 5, (2, 3), stride=(1, 2), bias=False)
        self.fc = nn.Linear(5 * 12 * 6, 10)  # 28x28 -> 13x13 -> 12x6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(x)))).flatten(1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["mnist-cnn", "logreg", "odd"])
def test_clipped_sum_matches_a_per_example_loop(name: str, backend: str) -> None:
    model = _Odd() if name == "odd" else build_model(name, (1, 28, 28), seed=3)
    x, y = (torch.from_numpy(a) for a in _data(9, seed=1, scale=2.0))
    total, norms, losses = ClippedGradientSum(model, backend=backend)(x, y, 0.3)  # type: ignore[arg-type]
    ref_total, ref_norms = _manual_clipped_sum(model, x, y, 0.3)
    assert torch.all(ref_norms > 0.3)  # the clip is active for every example
    torch.testing.assert_close(norms, ref_norms, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(total, ref_total, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses, F.cross_entropy(model(x), y, reduction="none"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_example_moves_the_sum_by_at_most_the_clip(backend: str) -> None:
    model = build_model("mnist-cnn", (1, 28, 28), seed=0)
    x, y = (torch.from_numpy(a) for a in _data(6, seed=2, scale=50.0))  # huge gradients
    csum = ClippedGradientSum(model, backend=backend)  # type: ignore[arg-type]
    clip = 0.7
    total, norms, _ = csum(x, y, clip)
    assert torch.all(norms > 100 * clip)
    for i in range(6):
        keep = torch.arange(6) != i
        without, _, _ = csum(x[keep], y[keep], clip)
        moved = float((total.double() - without.double()).norm())
        assert moved <= clip * (1 + 1e-5)
        assert moved >= clip * 0.99  # clipped, not zeroed


def test_without_noise_and_clipping_the_differential_is_the_batch_gradient() -> None:
    x, y = _data(200, seed=4)
    model = build_model("mnist-cnn", (1, 28, 28), seed=1)
    w0 = get_flat(model)
    b = 30
    res = RecordTrainer(model, x, y).train(
        w0, steps=1, expected_batch_size=b, lr=0.1, example_clip=1e6, noise_multiplier=0.0,
        secure_sampling=False, rng=np.random.default_rng(7),
    )
    idx = poisson_sample(200, b / 200, rng=np.random.default_rng(7))  # the same batch
    assert res.batch_sizes.tolist() == [idx.size] and idx.size != b
    ref = build_model("mnist-cnn", (1, 28, 28), seed=1)
    mean_grad = _flat_grad(ref, torch.from_numpy(x[idx]), torch.from_numpy(y[idx]), "mean")
    expected = mean_grad.double().numpy() * (idx.size / b)  # divided by B, not the realized size
    np.testing.assert_allclose(res.differential, expected, rtol=1e-4, atol=1e-7)
    # FedSGD: the weights moved by lr times the differential
    np.testing.assert_allclose(w0 - res.weights, 0.1 * res.differential, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_example_per_batch_is_clipped_to_the_bound(backend: str) -> None:
    x, y = _data(1, seed=5, scale=80.0)
    model = build_model("mnist-cnn", (1, 28, 28), seed=2)
    res = RecordTrainer(model, x, y, backend=backend).train(  # type: ignore[arg-type]
        get_flat(model), steps=1, expected_batch_size=1, lr=0.01, example_clip=2.0,
        noise_multiplier=0.0,
    )
    assert res.batch_sizes.tolist() == [1]  # q = 1
    assert 2.0 * 0.999 <= np.linalg.norm(res.differential) <= 2.0  # exactly (per_example)


def test_per_step_noise_has_std_z_c_over_b() -> None:
    x, y = _data(100, seed=6)
    model = build_model("mnist-cnn", (1, 28, 28), seed=0)
    trainer = RecordTrainer(model, x, y)
    w0 = get_flat(model)
    z, c, b = 1.3, 0.5, 20
    kw: dict[str, Any] = {"steps": 1, "expected_batch_size": b, "lr": 0.05, "example_clip": c,
          "secure_sampling": False}
    noise = []
    for seed in range(3):  # same seed: same batch, so the difference is the noise alone
        noisy = trainer.train(w0, noise_multiplier=z, rng=np.random.default_rng(seed), **kw)
        clean = trainer.train(w0, noise_multiplier=0.0, rng=np.random.default_rng(seed), **kw)
        noise.append(noisy.differential - clean.differential)
    e = np.concatenate(noise)
    n, sigma = e.size, z * c / b
    assert abs(e.std() - sigma) < 6 * sigma / math.sqrt(2 * n)
    assert abs(e.mean()) < 6 * sigma / math.sqrt(n)
    assert not np.allclose(noise[0], noise[1])


@pytest.mark.parametrize("secure", [True, False])
def test_poisson_batch_sizes_are_binomial(secure: bool) -> None:
    n, q, draws = 500, 0.08, 3000
    rng = None if secure else np.random.default_rng(11)
    counts = np.zeros(n)
    sizes = np.empty(draws)
    for k in range(draws):
        idx = poisson_sample(n, q, rng=rng)
        assert np.all(np.diff(idx) > 0)
        counts[idx] += 1
        sizes[k] = idx.size
    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean() - mean) < 6 * math.sqrt(var / draws)
    assert abs(sizes.var(ddof=1) - var) < 6 * var * math.sqrt(2 / (draws - 1))
    # every example equally likely: inclusion counts are Binomial(draws, q)
    assert np.abs(counts - draws * q).max() < 6 * math.sqrt(draws * q * (1 - q)) + 1


def test_trainer_batch_sizes_follow_the_sampling_rate() -> None:
    x, y = _data(40, seed=8)
    model = build_model("logreg", (1, 28, 28), seed=0)
    res = RecordTrainer(model, x, y).train(
        get_flat(model), steps=400, expected_batch_size=10, lr=0.01, example_clip=1.0,
        noise_multiplier=0.0,
    )
    assert res.sampling_rate == 0.25 and res.batch_sizes.shape == (400,)
    var = 40 * 0.25 * 0.75
    assert abs(res.batch_sizes.mean() - 10) < 6 * math.sqrt(var / 400)
    assert abs(res.batch_sizes.var(ddof=1) - var) < 6 * var * math.sqrt(2 / 399)


def test_secure_sampling_refuses_a_generator_and_differs_between_runs() -> None:
    x, y = _data(60, seed=9)
    model = build_model("logreg", (1, 28, 28), seed=0)
    trainer = RecordTrainer(model, x, y)
    w0 = get_flat(model)
    kw: dict[str, Any] = {"steps": 5, "expected_batch_size": 10, "lr": 0.1, "example_clip": 1.0,
          "noise_multiplier": 0.0}
    with pytest.raises(ValueError, match="refuses a generator"):
        trainer.train(w0, rng=np.random.default_rng(0), **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs rng"):
        trainer.train(w0, secure_sampling=False, **kw)  # type: ignore[arg-type]
    a, b = trainer.train(w0, **kw), trainer.train(w0, **kw)  # type: ignore[arg-type]
    assert a.secure_sampling and not np.array_equal(a.differential, b.differential)


def test_seeded_sampling_reproduces_exactly() -> None:
    x, y = _data(60, seed=10)
    model = build_model("mnist-cnn", (1, 28, 28), seed=0)
    trainer = RecordTrainer(model, x, y)
    w0 = get_flat(model)
    kw: dict[str, Any] = {"steps": 4, "expected_batch_size": 12, "lr": 0.1, "example_clip": 1.0,
          "noise_multiplier": 0.0, "secure_sampling": False}
    a = trainer.train(w0, rng=np.random.default_rng(5), **kw)  # type: ignore[arg-type]
    b = trainer.train(w0, rng=np.random.default_rng(5), **kw)  # type: ignore[arg-type]
    c = trainer.train(w0, rng=np.random.default_rng(6), **kw)  # type: ignore[arg-type]
    assert np.array_equal(a.differential, b.differential)
    assert np.array_equal(a.weights, b.weights) and a.mean_loss == b.mean_loss
    assert not np.array_equal(a.batch_sizes, c.batch_sizes) or not np.array_equal(
        a.differential, c.differential
    )
    assert np.array_equal(get_flat(model), c.weights)  # the shared model holds the last result


def test_empty_batches_are_valid_steps() -> None:
    x, y = _data(10, seed=12)
    model = build_model("mnist-cnn", (1, 28, 28), seed=0)
    trainer = RecordTrainer(model, x, y)
    w0 = get_flat(model)
    seed = next(s for s in range(1000)  # a seed whose first two batches (q = 0.1) are empty
                if all(poisson_sample(10, 0.1, rng=g).size == 0
                       for g in [np.random.default_rng(s)] * 2))
    kw: dict[str, Any] = {"steps": 2, "expected_batch_size": 1, "lr": 0.1, "example_clip": 1.0,
          "secure_sampling": False}
    res = trainer.train(w0, noise_multiplier=0.0, rng=np.random.default_rng(seed), **kw)
    assert res.batch_sizes.tolist() == [0, 0] and math.isnan(res.mean_loss)
    assert np.array_equal(res.weights, w0) and not np.any(res.differential)
    noisy = trainer.train(w0, noise_multiplier=2.0, rng=np.random.default_rng(seed), **kw)
    # the sum of two steps' noise, each N(0, (2 * 1 / 1)^2): std 2 sqrt(2) per coordinate
    assert abs(noisy.differential.std() - 2 * math.sqrt(2)) < 0.1


def test_batchnorm_is_refused() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(),
                          nn.Linear(2 * 26 * 26, 10))
    x, y = _data(5)
    for backend in ["auto", *BACKENDS]:
        with pytest.raises(ValueError, match="batch normalisation"):
            RecordTrainer(model, x, y, backend=backend)  # type: ignore[arg-type]


class _Scale(nn.Module):
    """A parameterised layer the layer-wise formulas do not know."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def test_backend_choice_and_fallbacks() -> None:
    assert ClippedGradientSum(build_model("mnist-cnn", (1, 28, 28), 0)).backend == "layers"
    norm_model = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.LayerNorm(16),
                               nn.Linear(16, 10))
    assert ClippedGradientSum(norm_model).backend == "layers"  # LayerNorm: vmap of the layer
    own_model = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), _Scale(16), nn.Linear(16, 10))
    assert ClippedGradientSum(own_model).backend == "vmap"
    with pytest.raises(ValueError, match="vmap"):
        ClippedGradientSum(own_model, backend="layers")
    x, y = (torch.from_numpy(a) for a in _data(5, seed=14))
    torch.testing.assert_close(ClippedGradientSum(own_model)(x, y, 0.5)[0],
                               _manual_clipped_sum(own_model, x, y, 0.5)[0],
                               rtol=1e-4, atol=1e-6)

    model = _Twice()  # one layer applied twice: per-layer formulas do not apply
    x, y = (torch.from_numpy(a) for a in _data(4, seed=13))
    csum = ClippedGradientSum(model)
    total, _, _ = csum(x, y, 0.5)
    assert csum.backend == "vmap"
    torch.testing.assert_close(total, _manual_clipped_sum(model, x, y, 0.5)[0],
                               rtol=1e-4, atol=1e-6)


def test_bad_arguments_are_refused() -> None:
    x, y = _data(20)
    model = build_model("logreg", (1, 28, 28), seed=0)
    trainer = RecordTrainer(model, x, y)
    w0 = get_flat(model)
    good: dict[str, Any] = {"steps": 1, "expected_batch_size": 5, "lr": 0.1, "example_clip": 1.0,
            "noise_multiplier": 1.0}
    for key, bad in [("steps", 0), ("expected_batch_size", 21), ("expected_batch_size", 0),
                     ("lr", 0.0), ("example_clip", -1.0), ("example_clip", math.inf),
                     ("noise_multiplier", -0.1), ("noise_multiplier", math.nan)]:
        with pytest.raises(ValueError, match=key):
            trainer.train(w0, **{**good, key: bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate"):
        poisson_sample(5, 1.5)
    with pytest.raises(ValueError, match="device data"):
        RecordTrainer(model, x[:0], y[:0])
