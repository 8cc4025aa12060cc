"""Test-set evaluation of the global model: the full test set, or a fixed subset of it.

Evaluation runs under :func:`torch.inference_mode` in batches of :data:`EVAL_BATCH` images
(on the MNIST CNN with one thread, batches of 250-500 were the fastest measured; 2,000 and
more were 1.5-2x slower, the activations no longer fitting in cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from testbed.core.models import set_flat

#: Images per forward pass.
EVAL_BATCH = 500


@dataclass(frozen=True)
class Evaluation:
    """Accuracy in [0, 1] and mean cross-entropy loss over the evaluated samples."""

    accuracy: float
    loss: float
    n_samples: int


@dataclass(frozen=True)
class SampleScores:
    """Per-sample results of one evaluation.

    Attributes
    ----------
    loss
        ``float64``, shape ``(n,)``: cross-entropy loss of each sample.
    correct
        ``bool``, shape ``(n,)``: whether the arg-max prediction equals the label.
    """

    loss: np.ndarray
    correct: np.ndarray

    def summary(self, index: np.ndarray | None = None) -> Evaluation:
        """Accuracy and mean loss over all samples, or over ``index`` (``int``, ``(k,)``)."""
        loss = self.loss if index is None else self.loss[index]
        correct = self.correct if index is None else self.correct[index]
        n = int(loss.size)
        if n == 0:
            raise ValueError("evaluation: no samples to summarise")
        return Evaluation(
            accuracy=float(np.count_nonzero(correct)) / n, loss=float(np.mean(loss)), n_samples=n
        )


def sample_scores(
    model: nn.Module,
    w: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = EVAL_BATCH,
) -> SampleScores:
    """Per-sample loss and correctness of weights ``w`` (``(d,)``) on ``x`` ``(n, C, H, W)``
    (``float32``), ``y`` ``(n,)`` (``int64``)."""
    if len(x) != len(y) or len(y) == 0:
        raise ValueError(f"evaluation: {len(x)} images and {len(y)} labels")
    if batch_size < 1:
        raise ValueError(f"batch_size: got {batch_size}; allowed: >= 1")
    set_flat(model, w)
    model.eval()
    losses = np.empty(len(y), dtype=np.float64)
    correct = np.empty(len(y), dtype=bool)
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            xb = torch.from_numpy(x[start : start + batch_size])
            yb = torch.from_numpy(y[start : start + batch_size])
            logits = model(xb)
            stop = start + len(yb)
            losses[start:stop] = nn.functional.cross_entropy(logits, yb, reduction="none")
            correct[start:stop] = (logits.argmax(1) == yb).numpy()
    return SampleScores(losses, correct)


def evaluate(
    model: nn.Module,
    w: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = EVAL_BATCH,
) -> Evaluation:
    """Evaluate weights ``w`` (``(d,)``) on ``x`` ``(n, C, H, W)``, ``y`` ``(n,)``."""
    return sample_scores(model, w, x, y, batch_size).summary()


def subset_indices(n_test: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A fixed evaluation subset: ``min(size, n_test)`` distinct test indices drawn with
    ``rng`` (the experiment's EVAL stream), sorted; ``int64``, shape ``(k,)``. All indices,
    in order, when ``size >= n_test``."""
    if n_test < 1 or size < 1:
        raise ValueError(f"subset_indices: need n_test, size >= 1; got {n_test}, {size}")
    if size >= n_test:
        return np.arange(n_test, dtype=np.int64)
    return np.sort(rng.choice(n_test, size=size, replace=False)).astype(np.int64)
