"""Per-example clipped gradient sums for record-level DP-SGD.

:class:`ClippedGradientSum` computes, for a batch of ``b`` examples,
``sum_i f_i g_i`` where ``g_i`` is the gradient of example ``i``'s cross-entropy loss over
*all* model parameters (flattened in ``model.parameters()`` order, as
:func:`testbed.core.models.get_flat`) and ``f_i`` its clip factor (:func:`clip_factors`).

Clipping that provably stays at or below ``C`` in float32: ``f_i = min(1, C (1 - 2^-20) /
(n_i + 1e-6))`` is computed in float64 from the norm ``n_i`` of the float32 gradient (within
``rho <= u / 2`` relative, ``u = 2^-24``: every float32 coordinate, or for a linear layer's
ghost norm every float32 factor, is widened to float64 before it is squared and summed,
:func:`per_example_norms`, :func:`edge_device.layer_grads.row_sizes`), then rounded *toward
zero* to float32. Each scaled coordinate ``fl32(f_i g_ij)`` (or, for a linear layer,
``fl32(fl32(f_i go_o) a_k)``) is within ``(1 + u)^2`` of the exact product, so
``||clip(g_i)|| <= C (1 - 16 u)(1 + u)^2 / (1 - rho) < C`` for ``d < 2^28`` in both
the l2 and the l1 norm: the clip is ``C`` shrunk by eight float32 ulps (``2^-20``
relative, about 1e-6) and the accounting uses ``C``. Opacus' ``C / (||g|| + 1e-6)`` in float32
overshoots ``C`` by up to about 3.5e-7 relative (measured). The sum over a batch is rounded
again; that rounding is not part of any one example's contribution.

Two backends, chosen once per model when the object is built (``backend="auto"``, the
default here, in :class:`edge_device.dp_trainer.RecordTrainer` and in the configuration key
``privacy.per_example``):

* ``"layers"`` (:mod:`edge_device.layer_grads`), whenever every module that owns parameters
  is one it covers: ``nn.Linear`` (ghost clipping: on ``(b, in)`` inputs the per-example
  norm comes from the layer's input and output gradient, ``||go_i|| ||a_i||``, and the
  clipped sum is ``(f * go)^T a``, no per-example gradient is formed), ``nn.Conv1d/2d/3d``
  (per-example weight gradients from one batched matrix product over the input's patches
  or one grouped weight gradient, :mod:`edge_device.conv_grads`; their float32 rows give
  both the norm and the sum), and ``LayerNorm``, ``GroupNorm``, ``RMSNorm``,
  ``Embedding``, ``PReLU`` and transposed convolutions (``torch.func.vmap`` of that layer
  alone). One batched forward pass with
  forward hooks, one ``torch.autograd.grad`` to the layer outputs, then a fixed handful of
  batched operations per layer, written straight into the flat result.
* ``"vmap"``: ``torch.func.vmap(grad_and_value(...))`` over ``functional_call`` of the whole
  model: any model ``torch.func`` can batch; per-example gradients ``(n, d)`` are
  materialised for a chunk of ``n`` examples at a time on the CPU (16 MiB of rows,
  :func:`edge_device.layer_grads.chunk_examples`; at B = 1024 the MNIST CNN's round went
  from 2.2-2.6x to 1.2-1.7x of a non-private one). ``"auto"`` uses it for a model with another
  parameterised layer or a parameter shared by two layers, and switches to it for good at
  the first batch that shows a layer applied twice or a kept activation modified in place
  (the layer-wise formulas would miss the tie).

Both compute the same clipped sum (``tests/test_per_example_layers.py`` and
``tests/test_dp_trainer.py`` check them against a per-example loop and against each other,
with examples below and above the clip, on several models and batch sizes, in both norms).
Process CPU time of a whole record-level round (20 steps: Poisson sampling from the OS
CSPRNG, the clipped sum, per-step noise, the SGD steps) as a ratio to a non-private round
on the same batch (:class:`edge_device.trainer.LocalTrainer`), the variants alternating in
one process, one torch thread, a quiet 16-core host, 6,000 Fashion-MNIST-shaped examples:

============  =====  ==============  ================  =============  ==========
model         batch  ``auto``        ``auto``, noise   ``layers``     ``vmap``
                     (``layers``)    at the upload     before         (before)
============  =====  ==============  ================  =============  ==========
mnist-cnn     32     1.42-1.46x      1.15-1.16x        1.66x          2.14-2.30x
mnist-cnn     64     1.24-1.29x      1.11-1.22x        1.59x          1.94-1.95x
mnist-cnn     128    1.17-1.20x      1.09-1.11x        1.48x          1.82-1.88x
mnist-cnn     256    1.18-1.24x      1.13-1.15x        1.45x          1.87-2.50x
cifar-cnn     32     1.49x           1.33x             1.95x          1.71x
cifar-cnn     64     1.43x           1.38x             2.13x          1.86x
============  =====  ==============  ================  =============  ==========

(cifar-cnn: 10 steps. ``benchmarks/bench_record_round.py --full`` and a script with the
previous code, same host, two runs; "before" is this module before the layer-wise default:
its ``layers`` with grouped convolutions over the batch and float64 copies for the norms,
and ``vmap``, then the runs' default.) These are the best of a few rounds each, which
flatters the private side (the fastest Poisson round drew the fewest examples); the medians
of 9 rounds on a 2-core machine are 1.60x, 1.39x, 1.28x and 1.23x at B = 32 to 256 (README,
"Results"). Of what remains above 1x, about 1 ms per step is
the per-step noise (``d = 21,840`` Gaussians from ``os.urandom``; at the time of the table
1.2 ms, 0.27x of a step at B = 32, the difference of the first two columns) and 0.03 ms the
secret Poisson sample (about one CSPRNG byte per example,
:func:`testbed.core.noise.secure_bernoulli`); both are privacy-relevant. The per-example
weight gradients of the two convolutions with their norms cost about twice the batched
weight gradients of a non-private step. ``vmap`` and Opacus
also pay a fixed per-call overhead that dominates small models.

``norm=1`` clips in the l1 norm instead (004's Laplace mechanism), with the same factor from
the l1 norm. Both backends support it (``layers``: for a linear layer on ``(b, in)`` inputs
``||go_i a_i^T||_1 = ||go_i||_1 ||a_i||_1``).

Models with batch normalisation are refused: a BatchNorm layer in training mode mixes the
examples of a batch, so a per-example gradient (and hence a per-record sensitivity) does
not exist.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from edge_device.layer_grads import (
    LayerwiseSum,
    Unsupported,
    chunk_examples,
    plan_layers,
    row_sizes,
)

# re-exported (explicit alias): checked here and when the run's model is built
from testbed.core.models import check_record_level_model as check_record_level_model

Backend = Literal["auto", "layers", "vmap"]
BACKENDS: tuple[str, ...] = ("auto", "layers", "vmap")

#: Added to each per-example norm before dividing (as Opacus; keeps a zero norm finite).
NORM_MARGIN = 1e-6
#: Relative shrink of every clip factor: eight float32 ulps, ``2^-20`` (see the module
#: docstring: covers the norm's float64 error and two float32 roundings of the product).
CLIP_SHRINK = 2.0**-20
#: The norm per-example gradients are clipped in.
Norm = Literal[1, 2]


class ClippedGradientSum:
    """Sum of per-example clipped gradients of the cross-entropy loss of a model.

    Parameters
    ----------
    model
        The model; its current parameters are used at each call (nothing is copied), so the
        caller may update them in place between calls.
    backend
        ``"auto"`` (default: ``"layers"`` where it covers the model, else ``"vmap"``),
        ``"layers"`` or ``"vmap"`` (see the module docstring). Decided here, once.
    device
        Where the per-example gradients are computed (``compute.device`` resolved,
        :func:`testbed.core.compute.resolve_device`); ``None``: where the model's
        parameters are. The model is moved there, and each batch given to a call.

    Raises
    ------
    ValueError
        For an unknown backend, a model :func:`check_record_level_model` refuses, or
        ``"layers"`` on a model with a parameterised layer it does not cover.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        backend: Backend = "auto",
        device: torch.device | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
        check_record_level_model(model)
        if device is None:
            first = next(iter(model.parameters()))  # check_record_level_model: there is one
            device = first.device
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.params = list(model.parameters())
        self.d = sum(p.numel() for p in self.params)
        self._auto = backend == "auto"
        layers = plan_layers(model, self.params) if backend != "vmap" else None
        if backend == "layers" and layers is None:
            raise ValueError(
                "backend='layers' covers nn.Linear, nn.Conv1d/2d/3d and the layers in "
                "edge_device.layer_grads.VMAP_LAYERS, each parameter owned by one layer; this "
                "model has another parameterised layer or a shared parameter: use "
                "backend='vmap'"
            )
        self._layerwise = None if layers is None else LayerwiseSum(model, layers, self.d)
        self.backend: Backend = "vmap" if layers is None else "layers"
        self._vmap_fn: Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]] | None = None

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, clip: float, *, norm: Norm = 2
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Clipped gradient sum of one batch.

        Parameters
        ----------
        x
            ``float32`` inputs, ``(b, ...)`` with ``b >= 1``.
        y
            ``int64`` labels, ``(b,)``.
        clip
            ``C > 0``, the bound of each example's gradient in the ``norm`` (loss units per
            parameter unit).
        norm
            ``2`` (default) or ``1``: the norm each example's gradient is clipped in.

        Returns
        -------
        total
            ``float32``, ``(d,)``: ``sum_i f_i g_i`` with :func:`clip_factors`' ``f_i``, so
            each example's scaled gradient has norm ``< C`` in float32. All three are on
            :attr:`device`.
        norms
            ``float32``, ``(b,)``: the unclipped per-example norms ``||g_i||_2`` (or
            ``||g_i||_1``).
        losses
            ``float32``, ``(b,)``: per-example losses at the current parameters.
        """
        if x.shape[0] == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"need a non-empty batch; got {x.shape[0]} inputs, {y.shape[0]} labels"
            )
        if norm not in (1, 2):
            raise ValueError(f"norm={norm!r} must be 1 or 2")
        x, y = x.to(self.device), y.to(self.device)  # no copy when already there
        b = x.shape[0]
        step = pass_examples(x, b)
        if step >= b:
            return self._clipped(x, y, clip, norm)
        # A large batch on the CPU in passes of `step` examples: each pass's activations and
        # their gradients, not the whole batch's, are held at once (an example's clipped
        # gradient needs only its own); the passes' sums are added in order.
        parts = [self._clipped(x[lo : lo + step], y[lo : lo + step], clip, norm)
                 for lo in range(0, b, step)]
        total = parts[0][0]
        for part in parts[1:]:
            total.add_(part[0])
        return total, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])

    def _clipped(
        self, x: torch.Tensor, y: torch.Tensor, clip: float, norm: Norm
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`__call__` on one pass's examples (checked there)."""
        if self._layerwise is not None:
            try:
                return self._layerwise(x, y, clip, norm, clip_factors)
            except Unsupported:
                if not self._auto:
                    raise
                self._layerwise, self.backend = None, "vmap"  # fall back for good
        return self._vmap(x, y, clip, norm)

    def _vmap(
        self, x: torch.Tensor, y: torch.Tensor, clip: float, norm: Norm = 2
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model = self.model
        if self._vmap_fn is None:

            def loss_one(
                params: dict[str, torch.Tensor],
                buffers: dict[str, torch.Tensor],
                xi: torch.Tensor,
                yi: torch.Tensor,
            ) -> torch.Tensor:
                out = functional_call(model, (params, buffers), (xi.unsqueeze(0),))
                return F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")

            self._vmap_fn = vmap(
                grad_and_value(loss_one), in_dims=(None, None, 0, 0), randomness="different"
            )
        params = {k: v.detach() for k, v in model.named_parameters()}
        buffers = {k: v.detach() for k, v in model.named_buffers()}
        b = x.shape[0]
        # a chunk of examples at a time, as the layer-wise path (their (n, d) rows in the
        # cache; at B = 1024 the MNIST CNN's clipped sum took 283 ms in one piece, 188 ms in
        # chunks of 192)
        chunk = chunk_examples(self.d, next(iter(params.values())), b)  # rows: the params' dtype
        total: torch.Tensor | None = None
        norms: list[torch.Tensor] = []
        losses: list[torch.Tensor] = []
        for lo in range(0, b, chunk):
            hi = min(b, lo + chunk)
            per, loss = self._vmap_fn(params, buffers, x[lo:hi], y[lo:hi])
            flat = torch.cat([per[k].reshape(hi - lo, -1) for k in params], dim=1)  # (n, d)
            norms64 = per_example_norms(flat, norm)
            part = clip_factors(norms64, clip) @ flat
            total = part if total is None else total.add_(part)
            norms.append(norms64)
            losses.append(loss.detach())
        assert total is not None  # b >= 1: checked by __call__
        return total, torch.cat(norms).float(), torch.cat(losses)


#: Examples per forward and backward pass of a clipped sum on the CPU: a larger batch is
#: taken in passes of this many, so that only one pass's activations and their gradients
#: are held at once. The MNIST CNN's clipped sum at B = 1024: peak RSS 365 MiB in one pass,
#: 283-284 MiB in passes of 128, in about the same time (194-248 ms, noisy host).
PASS_EXAMPLES = 128


def pass_examples(x: torch.Tensor, b: int) -> int:
    """Examples per pass (:data:`PASS_EXAMPLES`) for a batch ``x`` of ``b`` examples; on a
    GPU (any device but the CPU) the whole batch, which it computes best in one pass."""
    return b if x.device.type != "cpu" else PASS_EXAMPLES


def per_example_norms(flat: torch.Tensor, norm: Norm = 2) -> torch.Tensor:
    """Per-example norms of float32 gradients, computed in float64.

    Parameters
    ----------
    flat
        ``float32``, ``(b, d)``: one gradient per row.
    norm
        ``2`` or ``1``.

    Returns
    -------
    torch.Tensor
        ``float64``, ``(b,)``: ``||g_i||_1`` or ``||g_i||_2`` of the float32 row. Each
        coordinate is widened to float64 before it is squared (exact) and the row is summed
        in float64 (:func:`edge_device.layer_grads.row_sizes`: fused, no float64 copy of the
        rows), so the result is within ``(d + 3) 2^-53`` relative of the exact norm, below
        ``u / 2`` (``u = 2^-24``) for ``d < 2^28``. Faster than reducing blocks of float32
        coordinates first (0.75 against 1.0 ms for the MNIST CNN at b = 64).
    """
    size = row_sizes(flat, norm)
    return size if norm == 1 else size.sqrt()


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """Clip factors that keep every scaled float32 gradient at or below ``C``.

    Parameters
    ----------
    norms
        ``(b,)`` per-example norms (any float dtype; computed as :func:`per_example_norms`
        does for the guarantee), in the units of ``clip``.
    clip
        ``C > 0``.

    Returns
    -------
    torch.Tensor
        ``float32``, ``(b,)``: ``min(1, C (1 - 2^-20) / (n_i + 1e-6))`` computed in float64
        and rounded toward zero, so ``f_i <=`` the float64 value. With ``n_i`` within
        ``d 2^-53`` of ``||g_i||`` the scaled row ``fl32(f_i g_i)`` has norm ``< C`` (module
        docstring). An infinite norm gives 0; a NaN norm gives NaN.
    """
    wide = (clip * (1.0 - CLIP_SHRINK) / (norms.double() + NORM_MARGIN)).clamp(max=1.0)
    narrow = wide.float()
    above = narrow.double() > wide
    return torch.where(above, torch.nextafter(narrow, torch.zeros_like(narrow)), narrow)
