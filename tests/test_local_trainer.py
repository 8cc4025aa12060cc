"""Local SGD on a device: the same weights, differential and loss, bit for bit, as the plain
textbook loop (``loss.backward()``, ``nn.CrossEntropyLoss``, one minibatch drawn per step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edge_device.trainer import LocalResult, LocalTrainer
from testbed.core.models import build_model, get_flat, set_flat


def _textbook(
    model: nn.Module, x: np.ndarray, y: np.ndarray, index: np.ndarray | None,
    w_global: np.ndarray, *, steps: int, batch_size: int, lr: float, rng: np.random.Generator,
) -> LocalResult:
    """The loop as first written."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    rows_of = None if index is None else torch.from_numpy(index.astype(np.int64))
    with torch.no_grad():
        for p, v in zip(model.parameters(), torch.from_numpy(w_global).split(
                [p.numel() for p in model.parameters()]), strict=True):
            p.copy_(v.view_as(p))
    model.train()
    n = len(y) if index is None else len(index)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(steps):
        idx = torch.from_numpy(rng.choice(n, size=min(batch_size, n), replace=False))
        model.zero_grad(set_to_none=True)
        rows = idx if rows_of is None else rows_of[idx]
        loss = loss_fn(model(xt[rows]), yt[rows])
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
        losses.append(float(loss.detach()))
    w_local = nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy()
    g = (np.asarray(w_global, dtype=np.float64) - w_local.astype(np.float64)) / lr
    return LocalResult(w_local, g, float(np.mean(losses)))


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("model_name", ["logreg", "mnist-cnn"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("steps", "batch_size"), [(1, 8), (5, 8), (3, 500)])
def test_bit_for_bit_with_the_textbook_loop(
    model_name: str, shared: bool, steps: int, batch_size: int
) -> None:
    x, y = _data(400)
    index = np.random.default_rng(1).permutation(400)[:60] if shared else None
    model = build_model(model_name, (1, 28, 28), 0)
    w = get_flat(model)
    reference = build_model(model_name, (1, 28, 28), 0)
    xs, ys = (x, y) if shared else (x[:60], y[:60])
    trainer = LocalTrainer(model, xs, ys, index)
    for device in range(3):  # the trainer reused, as in a run
        got = trainer.train(w, steps=steps, batch_size=batch_size, lr=0.1,
                            rng=np.random.default_rng(device))
        want = _textbook(reference, xs, ys, index, w, steps=steps, batch_size=batch_size,
                         lr=0.1, rng=np.random.default_rng(device))
        assert got.weights.dtype == np.float32 and got.differential.dtype == np.float64
        assert got.weights.tobytes() == want.weights.tobytes()
        assert got.differential.tobytes() == want.differential.tobytes()
        assert got.mean_loss == want.mean_loss
        w = got.weights.copy()


def test_flat_vectors_never_alias() -> None:
    model = build_model("logreg", (1, 28, 28), 0)
    params = list(model.parameters())
    flat = np.arange(get_flat(model).size, dtype=np.float32)
    set_flat(model, flat, params)
    out = get_flat(model, params)
    assert out.tobytes() == flat.tobytes() == get_flat(model).tobytes()
    out[:] = -1.0  # the copy out is the caller's ...
    flat[:] = -2.0  # ... and so is the vector loaded
    assert get_flat(model)[:3].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="flat vector"):
        set_flat(model, flat[:-1], params)
