"""Local training on an edge device: H minibatch SGD steps from the global model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from testbed.core.data.coded import LEVELS, CodedImages
from testbed.core.models import get_flat, set_flat


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


class DeviceData:
    """One device's samples: its own arrays, or rows of arrays shared by many devices.

    Parameters
    ----------
    x, y
        ``float32`` ``(n, C, H, W)`` (or the same images coded,
        :class:`~testbed.core.data.coded.CodedImages`: each batch is gathered as codes and
        decoded, the same float32 values) and ``int64`` ``(n,)``: the device's samples, or
        (with ``index``) the training set that every device's rows are taken from.
    index
        ``None``, or ``int`` ``(D,)``: the device's rows of ``x`` and ``y``. The arrays are
        then never copied per device; each batch gathers its rows (``x[index[batch]]``).
    """

    def __init__(self, x: np.ndarray | CodedImages, y: np.ndarray,
                 index: np.ndarray | None = None) -> None:
        if len(x) != len(y):
            raise ValueError(f"device data: {len(x)} images and {len(y)} labels")
        #: The images (``float32``), or their ``uint8`` codes (:meth:`_decode`).
        self.x = torch.from_numpy(np.ascontiguousarray(
            x.codes if isinstance(x, CodedImages) else x))
        self._lut: torch.Tensor | None = None
        if isinstance(x, CodedImages):  # code v of channel c: entry 256 c + v
            self._lut = torch.from_numpy(np.ascontiguousarray(x.lut).reshape(-1))
            channels = x.lut.shape[0]
            self._offset = (torch.arange(channels, dtype=torch.int32) * LEVELS).view(
                1, channels, *([1] * (self.x.dim() - 2)))
        self.y = torch.from_numpy(np.ascontiguousarray(y))
        self.index = None if index is None else torch.from_numpy(np.asarray(index, np.int64))
        if len(self) == 0:
            raise ValueError("device data: no samples")
        if self.index is not None and (
            int(self.index.min()) < 0 or int(self.index.max()) >= len(self.y)
        ):
            raise ValueError(f"device data: index outside [0, {len(self.y)})")

    def __len__(self) -> int:
        """``D``, the device's number of samples."""
        return len(self.y) if self.index is None else int(self.index.numel())

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The device's samples ``rows`` (positions in ``[0, D)``, ``int64`` ``(b,)``)."""
        # index_select: the same gather as ``x[rows]``, without advanced indexing's overhead
        if self.index is not None:
            rows = self.index.index_select(0, rows)
        return self._decode(self.x.index_select(0, rows)), self.y.index_select(0, rows)

    def span(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The device's samples ``start .. stop - 1`` (in its own order)."""
        if self.index is None:
            return self._decode(self.x[start:stop]), self.y[start:stop]
        return self.batch(torch.arange(start, min(stop, len(self)), dtype=torch.int64))

    def _decode(self, x: torch.Tensor) -> torch.Tensor:
        """Gathered images as ``float32``: as they are, or codes looked up in the table (an
        ``int32`` index_select, the fastest of the lookups measured: 52 us for 64 MNIST
        images against 103 us for ``take`` and 9 us to gather float32 images)."""
        if self._lut is None:
            return x
        codes = x.int()
        if self._offset.numel() > 1:
            codes += self._offset
        return self._lut.index_select(0, codes.view(-1)).view(x.shape)


def draw_minibatches(
    rng: np.random.Generator, n: int, batch_size: int, steps: int
) -> np.ndarray:
    """Every step's minibatch of a device's local round, drawn before the steps: ``steps``
    draws of ``min(batch_size, n)`` distinct positions in ``[0, n)``, in order, from ``rng``
    (the device's MINIBATCH stream). ``int64``, shape ``(steps, min(batch_size, n))``."""
    size = min(batch_size, n)
    return np.stack([rng.choice(n, size=size, replace=False) for _ in range(steps)])


def local_result(
    w_global: np.ndarray, w_local: np.ndarray, lr: float, losses: Sequence[float]
) -> LocalResult:
    """A local round's outcome: ``w_local`` (``float32 (d,)``), the differential
    ``(w_global - w_local) / lr`` in ``float64`` (``w_local`` widened exactly) and the mean of
    the steps' losses."""
    g = np.array(w_global, dtype=np.float64)  # a copy: w_global is the caller's
    g -= w_local  # float32 -> float64 exactly, as w_local.astype(np.float64)
    g /= lr
    return LocalResult(weights=w_local, differential=g, mean_loss=float(np.mean(losses)))


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    first = next(iter(model.parameters()), None)
    return torch.device("cpu") if first is None else first.device


class LocalTrainer:
    """Runs H steps of plain minibatch SGD on one device's shard.

    Parameters
    ----------
    model
        A model instance reused across devices (its weights are overwritten).
    x, y
        The device's samples: ``float32`` ``(n, C, H, W)`` and ``int64`` ``(n,)``; with
        ``index``, the shared training set (see :class:`DeviceData`).
    index
        ``None``, or the device's rows of ``x`` and ``y``, ``int`` ``(D,)``.
    device
        Where the model trains (``compute.device`` resolved,
        :func:`testbed.core.compute.resolve_device`); ``None``: where the model's parameters
        are. The model is moved there; each minibatch is gathered on the CPU and moved there;
        the result comes back to the CPU.
    """

    def __init__(
        self,
        model: nn.Module,
        x: np.ndarray | CodedImages,
        y: np.ndarray,
        index: np.ndarray | None = None,
        *,
        device: torch.device | None = None,
    ) -> None:
        self.device = model_device(model) if device is None else torch.device(device)
        self.model = model.to(self.device)
        #: the model's parameters, in order (listed once: every step goes over them twice)
        self.params = list(self.model.parameters())
        self.data = DeviceData(x, y, index)

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
        model, params, data, device = self.model, self.params, self.data, self.device
        set_flat(model, w_global, params)
        model.train()
        # Every step's minibatch drawn first (the same draws, in the same order): numpy's
        # work interleaved with torch's slows both (a step costs ~40 us more).
        batches = torch.from_numpy(draw_minibatches(rng, len(data), batch_size, steps))
        losses: list[float] = []
        for idx in batches:
            for p in params:  # model.zero_grad(set_to_none=True)
                p.grad = None
            xb, yb = data.batch(idx)
            xb, yb = xb.to(device), yb.to(device)  # no copy on the CPU
            loss = nn.functional.cross_entropy(model(xb), yb)  # what nn.CrossEntropyLoss() does
            loss.backward()
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-lr)
            losses.append(loss.item())
        return local_result(w_global, get_flat(model, params), lr, losses)
