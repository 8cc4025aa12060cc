"""Local training on an edge device: H minibatch SGD steps from the global model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from testbed.models import get_flat, set_flat


@dataclass(frozen=True)
class LocalResult:
    """Outcome of one device's local training.

    Attributes
    ----------
    weights
        ``float32``, shape ``(d,)``: the local model after H steps.
    differential
        ``float64``, shape ``(d,)``: ``g = (w_global - w_local) / lr`` (003 Algorithm 1,
        line 9), the sum of the H minibatch gradients.
    mean_loss
        Mean training loss over the H minibatches (before each step).
    """

    weights: np.ndarray
    differential: np.ndarray
    mean_loss: float


class LocalTrainer:
    """Runs H steps of plain minibatch SGD on one device's shard.

    Parameters
    ----------
    model
        A model instance reused across devices (its weights are overwritten).
    x, y
        The device's samples: ``float32`` ``(n, C, H, W)`` and ``int64`` ``(n,)``.
    """

    def __init__(self, model: nn.Module, x: np.ndarray, y: np.ndarray) -> None:
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"device data: {len(x)} images and {len(y)} labels")
        self.model = model
        self.x = torch.from_numpy(np.ascontiguousarray(x))
        self.y = torch.from_numpy(np.ascontiguousarray(y))
        self.loss_fn = nn.CrossEntropyLoss()

    def train(
        self,
        w_global: np.ndarray,
        *,
        steps: int,
        batch_size: int,
        lr: float,
        rng: np.random.Generator,
    ) -> LocalResult:
        """H SGD steps from ``w_global``; minibatches drawn with ``rng``."""
        if steps < 1 or batch_size < 1 or lr <= 0:
            raise ValueError(
                f"need steps, batch_size >= 1 and lr > 0; got {steps}, {batch_size}, {lr}"
            )
        model = self.model
        set_flat(model, w_global)
        model.train()
        n = len(self.y)
        losses = []
        for _ in range(steps):
            idx = torch.from_numpy(rng.choice(n, size=min(batch_size, n), replace=False))
            model.zero_grad(set_to_none=True)
            loss = self.loss_fn(model(self.x[idx]), self.y[idx])
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-lr)
            losses.append(float(loss.detach()))
        w_local = get_flat(model)
        g = (np.asarray(w_global, dtype=np.float64) - w_local.astype(np.float64)) / lr
        return LocalResult(weights=w_local, differential=g, mean_loss=float(np.mean(losses)))
