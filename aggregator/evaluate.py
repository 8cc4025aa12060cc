"""Test-set evaluation of the global model: the full test set, or a fixed subset of it.

Evaluation runs under :func:`torch.inference_mode` in batches of :data:`EVAL_BATCH` images
(on the MNIST CNN with one thread, batches of 250-500 were the fastest measured; 2,000 and
more were 1.5-2x slower, the activations no longer fitting in cache). It computes where the
model's parameters are (the run's ``compute.device``, on which
:func:`testbed.core.run_setup.initial_model` places the model) or on the ``device`` given;
the per-sample results come back to the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from testbed.core.data.coded import CodedImages
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
    x: np.ndarray | CodedImages,
    y: np.ndarray,
    batch_size: int = EVAL_BATCH,
    *,
    device: torch.device | None = None,
    threads: int = 1,
) -> SampleScores:
    """Per-sample loss and correctness of weights ``w`` (``(d,)``) on ``x`` ``(n, C, H, W)``
    (``float32``, or coded images, decoded batch by batch), ``y`` ``(n,)`` (``int64``).

    ``device``: where to compute (the model is moved there); ``None``: where the model's
    parameters are. Each batch is moved there and its results back to the CPU.
    ``threads``: on the CPU, batches evaluated at once, each on one thread (torch's
    intra-op threads set to 1 meanwhile): every sample's result is the one-thread result
    bit for bit, where splitting each operation over threads changes a convolution's
    summation order (measured: the CIFAR CNN's losses differed in the last bit on 113 of
    1,200 images with 2 intra-op threads).
    """
    if len(x) != len(y) or len(y) == 0:
        raise ValueError(f"evaluation: {len(x)} images and {len(y)} labels")
    if batch_size < 1:
        raise ValueError(f"batch_size: got {batch_size}; allowed: >= 1")
    if threads < 1:
        raise ValueError(f"threads: got {threads}; allowed: >= 1")
    if device is None:
        first = next(iter(model.parameters()), None)
        device = torch.device("cpu") if first is None else first.device
    model = model.to(device)
    set_flat(model, w)
    model.eval()
    losses = np.empty(len(y), dtype=np.float64)
    correct = np.empty(len(y), dtype=bool)

    def one_batch(start: int) -> None:
        with torch.inference_mode():  # per thread
            # .to(device) and .cpu() copy nothing when the device is the CPU
            xb = torch.from_numpy(np.asarray(x[start : start + batch_size])).to(device)
            yb = torch.from_numpy(y[start : start + batch_size]).to(device)
            logits = model(xb)
            stop = start + len(yb)
            loss = nn.functional.cross_entropy(logits, yb, reduction="none")
            losses[start:stop] = loss.cpu().numpy()
            correct[start:stop] = (logits.argmax(1) == yb).cpu().numpy()

    starts = range(0, len(y), batch_size)
    if threads == 1 or device.type != "cpu" or len(starts) == 1:
        for start in starts:
            one_batch(start)
    else:
        # one intra-op thread in each pool thread too: OpenMP keeps the count per thread,
        # and a new thread's default is every core
        with intra_op_threads(1), ThreadPoolExecutor(
                min(threads, len(starts)), initializer=torch.set_num_threads,
                initargs=(1,)) as pool:
            list(pool.map(one_batch, starts))  # raises a batch's error
    return SampleScores(losses, correct)


def evaluate(
    model: nn.Module,
    w: np.ndarray,
    x: np.ndarray | CodedImages,
    y: np.ndarray,
    batch_size: int = EVAL_BATCH,
    *,
    device: torch.device | None = None,
    threads: int = 1,
) -> Evaluation:
    """Evaluate weights ``w`` (``(d,)``) on ``x`` ``(n, C, H, W)``, ``y`` ``(n,)``, on
    ``device`` (``None``: where the model's parameters are), ``threads`` batches at once
    (:func:`sample_scores`)."""
    return sample_scores(model, w, x, y, batch_size, device=device,
                         threads=threads).summary()


@contextmanager
def intra_op_threads(n: int) -> Iterator[None]:
    """Torch's intra-op threads set to ``n`` (``>= 1``) inside the block, as before after
    it. (Results may depend on it in the last bits: evaluation takes its threads over
    batches instead, :func:`sample_scores`.)"""
    if n < 1:
        raise ValueError(f"threads: got {n}; allowed: >= 1")
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def subset_indices(n_test: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A fixed evaluation subset: ``min(size, n_test)`` distinct test indices drawn with
    ``rng`` (the experiment's EVAL stream), sorted; ``int64``, shape ``(k,)``. All indices,
    in order, when ``size >= n_test``."""
    if n_test < 1 or size < 1:
        raise ValueError(f"subset_indices: need n_test, size >= 1; got {n_test}, {size}")
    if size >= n_test:
        return np.arange(n_test, dtype=np.int64)
    return np.sort(rng.choice(n_test, size=size, replace=False)).astype(np.int64)
