"""Test-set evaluation of the global model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from testbed.models import set_flat


@dataclass(frozen=True)
class Evaluation:
    """Accuracy in [0, 1] and mean cross-entropy loss over the evaluated samples."""

    accuracy: float
    loss: float
    n_samples: int


def evaluate(
    model: nn.Module, w: np.ndarray, x: np.ndarray, y: np.ndarray, batch_size: int = 2000
) -> Evaluation:
    """Evaluate weights ``w`` (``(d,)``) on ``x`` ``(n, C, H, W)``, ``y`` ``(n,)``."""
    set_flat(model, w)
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            xb = torch.from_numpy(x[start : start + batch_size])
            yb = torch.from_numpy(y[start : start + batch_size])
            logits = model(xb)
            loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
    n = len(y)
    return Evaluation(accuracy=correct / n, loss=loss_sum / n, n_samples=n)
