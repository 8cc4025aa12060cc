"""Local training of many simulated devices in one vectorised pass (``compute.batch_devices``).

A simulated run trains its devices one after another (:class:`edge_device.trainer.
LocalTrainer`); at 1,000 devices of a small model the cost is torch's per-operation
overhead, not arithmetic. :class:`BatchedTrainer` trains ``K`` devices together: their
parameters are stacked along a leading device axis and each of the H SGD steps is one call
of ``torch.func.vmap(grad_and_value(loss))`` over the devices (``torch.func.functional_call``
of the run's model), the approach of JAX-based federated simulators (FedJAX's "vmap over
clients").

What is the same as one device at a time: every device's minibatches (drawn with its own
generator, the same draws in the same order, :meth:`LocalTrainer.train`), the loss (mean
cross-entropy over the minibatch), the SGD step ``w -= lr * grad`` from the same global
model, and the outputs (the local model, the differential ``(w_global - w_local) / lr`` in
``float64``, the mean loss). What differs: the kernels (batched matrix products instead of
one device's), so the results agree with the sequential ones to float32 rounding in general
(``tests/test_batched_trainer.py``: the MNIST CNN within 1e-5 relative). For logistic
regression on one CPU thread (``torch_threads: 1``, the default) the models are the same bit
for bit as measured, runs included (the reported losses to a float32 ulp or so per step:
vmap's batched cross-entropy sums a minibatch's terms in its own order); with more
intra-op threads the sequential products split their sums differently.
``compute.batch_devices: 1`` (the default) keeps the sequential reference. Worth it for
small models: logistic regression trains about 3.5x faster per device (0.25 against
0.85 ms, 5 steps of batch 8); the MNIST CNN is slower batched (vmap turns its
convolutions into grouped ones).

Devices whose shards are smaller than the batch size train on ``D`` examples a step, as
alone; devices are grouped by that size. A model with buffers (batch normalisation's
running statistics) or with randomness in its forward pass (dropout) is refused: its
state or its draws would not be each device's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from edge_device.trainer import (
    DeviceData,
    LocalResult,
    draw_minibatches,
    local_result,
    model_device,
)
from testbed.core.data.coded import CodedImages, float32_images

#: Layers that draw random numbers in training.
_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)


class BatchingUnsupported(ValueError):
    """The model cannot be trained with the devices batched (module docstring)."""


def check_batchable(model: nn.Module) -> None:
    """Refuse a model whose devices cannot be trained together (buffers, dropout).

    Raises
    ------
    BatchingUnsupported
        Naming what the model has.
    """
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise BatchingUnsupported(
            f"the model has buffers ({', '.join(buffers[:3])}): their state would be shared "
            "by the devices trained together")
    random = [type(m).__name__ for m in model.modules()
              if isinstance(m, _DROPOUT) and m.p > 0]
    if random:
        raise BatchingUnsupported(
            f"the model draws random numbers in training ({random[0]}): the devices trained "
            "together would not have their own draws")
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise BatchingUnsupported(
            f"the model has frozen parameters ({', '.join(frozen[:3])}): trained together, "
            "they would be trained")


class BatchedTrainer:
    """H steps of plain minibatch SGD for several devices at once.

    Parameters
    ----------
    model
        The run's model (its architecture; its weights are not changed).
    x, y
        The training set every device's rows are taken from: ``float32`` ``(n, ...)`` and
        ``int64`` ``(n,)``.
    device
        Where the devices train; ``None``: where the model is.
    """

    def __init__(
        self,
        model: nn.Module,
        x: np.ndarray | CodedImages,
        y: np.ndarray,
        *,
        device: torch.device | None = None,
    ) -> None:
        check_batchable(model)
        # the shared training set as tensors (no copy when already float32 / int64)
        self.data = DeviceData(float32_images(x), np.asarray(y, dtype=np.int64))
        self.device = model_device(model) if device is None else torch.device(device)
        self.model = model.to(self.device)
        self.names = [name for name, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.sizes = [p.numel() for _, p in model.named_parameters()]
        self.d = sum(self.sizes)

        def loss(params: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor
                 ) -> torch.Tensor:
            return F.cross_entropy(functional_call(self.model, params, (xb,)), yb)

        # per device, the gradient of its own mean loss, as torch.autograd would give it alone
        # (the first call imports torch._dynamo, which torch.func's grad uses: ~1 s once)
        self._step: Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]] = vmap(
            grad_and_value(loss))

    def train(
        self,
        w_global: np.ndarray,
        parts: Sequence[np.ndarray],
        *,
        steps: int,
        batch_size: int,
        lr: float,
        rngs: Sequence[np.random.Generator],
    ) -> list[LocalResult]:
        """H SGD steps of each device from ``w_global``.

        Parameters
        ----------
        w_global
            ``(d,)``: the global model.
        parts
            Each device's rows of the training set (``int``, ``(D_k,)``, ``D_k >= 1``).
        steps, batch_size, lr
            H, B and the step size, as :meth:`LocalTrainer.train` takes them.
        rngs
            Each device's minibatch generator (the one :meth:`LocalTrainer.train` would take).

        Returns
        -------
        list[LocalResult]
            One per device, in the order of ``parts``.
        """
        if steps < 1 or batch_size < 1 or lr <= 0:
            raise ValueError(
                f"need steps, batch_size >= 1 and lr > 0; got {steps}, {batch_size}, {lr}")
        if len(parts) != len(rngs):
            raise ValueError(f"{len(parts)} devices' rows and {len(rngs)} generators")
        w = np.asarray(w_global)
        if w.shape != (self.d,):
            raise ValueError(f"w_global has shape {w.shape}, the model has {self.d} parameters")
        results: list[LocalResult | None] = [None] * len(parts)
        groups: dict[int, list[int]] = {}  # the per-step batch size -> devices
        for k, rows in enumerate(parts):
            if len(rows) < 1:
                raise ValueError(f"device {k} of the batch has no samples")
            groups.setdefault(min(batch_size, len(rows)), []).append(k)
        for members in groups.values():
            # every step's draws of each device first, in its own order (as LocalTrainer)
            draws = np.stack([draw_minibatches(rngs[k], len(parts[k]), batch_size, steps)
                              for k in members])  # (K, H, size), positions in each device's rows
            rows = np.stack([np.asarray(parts[k], dtype=np.int64)[draws[j]]
                             for j, k in enumerate(members)])  # (K, H, size), set rows
            for k, res in zip(members, self._train_group(w, rows, lr), strict=True):
                results[k] = res
        return [r for r in results if r is not None]

    def _train_group(self, w: np.ndarray, rows: np.ndarray, lr: float) -> list[LocalResult]:
        n_dev, steps, size = rows.shape
        dev = self.device
        start = torch.from_numpy(np.asarray(w, dtype=np.float32)).to(dev)
        flat = start.unsqueeze(0).repeat(n_dev, 1)  # (K, d): every device's own copy
        params = {name: v.view(n_dev, *shape) for name, v, shape in zip(
            self.names, torch.split(flat, self.sizes, dim=1), self.shapes, strict=True)}
        index = torch.from_numpy(rows)
        losses = torch.empty(n_dev, steps, dtype=torch.float32, device=dev)
        for s in range(steps):
            xb, yb = self.data.batch(index[:, s].reshape(-1))
            xb, yb = xb.to(dev), yb.to(dev)
            try:
                grads, loss = self._step(params, xb.view(n_dev, size, *xb.shape[1:]),
                                         yb.view(n_dev, size))
            except RuntimeError as exc:  # an operation vmap has no batching rule for
                raise BatchingUnsupported(
                    f"the model's forward pass cannot be batched over devices: {exc}") from exc
            with torch.no_grad():
                for name in self.names:  # w -= lr * grad, per device (the views write flat)
                    params[name].add_(grads[name], alpha=-lr)
            losses[:, s] = loss.detach()
        w_local = flat.cpu().numpy()  # (K, d) float32: the parameters were views of it
        loss_rows = losses.cpu().numpy().astype(np.float64)
        return [local_result(w, w_local[k].copy(), lr, loss_rows[k]) for k in range(n_dev)]
