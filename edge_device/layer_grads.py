"""Layer-wise per-example gradients: the ``layers`` backend of :mod:`edge_device.per_example`.

:class:`LayerwiseSum` is set up once per model: it sorts every module that owns parameters
into one of three kinds, fixes each parameter's place in the flat gradient, and then, per
batch, needs one forward pass (with forward hooks that keep each layer's input and output),
one ``torch.autograd.grad`` to the layer outputs (no weight gradient is formed there) and a
fixed handful of batched tensor operations per layer:

* ``"linear"``: ``nn.Linear`` on ``(b, in)`` inputs. Example ``i``'s weight gradient is the
  outer product ``go_i a_i^T``, so its norm comes from the activations and backprops alone
  (ghost clipping): ``||go_i||^2 (||a_i||^2 + 1)`` in l2 (``+ 1`` for the bias),
  ``||go_i||_1 (||a_i||_1 + 1)`` in l1, each factor summed in ``float64``
  (:func:`row_sizes`). The clipped sum is ``(f * go)^T a`` (and ``sum_i f_i go_i`` for the bias);
  per-example gradients are never formed. On ``(b, ..., in)`` inputs the per-example
  gradient is a sum of outer products and is materialised (one ``einsum``).
* ``"conv"``: ``nn.Conv1d`` / ``nn.Conv2d`` / ``nn.Conv3d`` (any stride, dilation, groups,
  padding and padding mode): every example's weight gradient from one batched matrix
  product over the input's patches, or one grouped weight gradient with the examples as
  groups, whichever is faster for the shapes (:mod:`edge_device.conv_grads`). Ghost norms
  (``sum_{t,t'} (a_t . a_t')(go_t . go_t')``) would cost ``L^2 (in k^2 + out)`` per example
  against ``L in k^2 out`` here, more for every convolution of this project's models, and
  cancel in ``float32``, which would void the clip's rounding bound.
* ``"vmap"``: parameterised ``torch.nn`` layers without a closed form here
  (:data:`VMAP_LAYERS`: ``LayerNorm``, ``GroupNorm``, ``RMSNorm``, ``Embedding``,
  ``PReLU``, transposed convolutions): ``torch.func.vmap`` of the layer's own
  vector-Jacobian product, from its kept input and output gradient. Only that layer runs per
  example, not the model.

Materialised per-example gradients (conv, linear on sequences, vmap layers) are ``(b, p)``
``float32`` rows; their norms are taken in ``float64`` (:func:`row_sizes`) and the clipped
sum is ``f @ rows``, so the norm and the sum use the same ``float32`` gradient. Everything
is written straight into the flat ``(d,)`` result. The rows are formed for a chunk of
examples at a time (:data:`WORK_BUDGET`, 16 MiB of rows and patches: 117 examples of the
MNIST CNN), each chunk's norms, clip factors and share of the sum taken before the next:
an example's factor needs only its own rows, and a whole large batch's rows and patches
would leave the cache (at B = 1024 a record-level step of the MNIST CNN cost 1.4-1.9x a
non-private one with them formed at once, 0.8-1.2x in chunks). Their work arrays are
reused from chunk to chunk and call to call, one set per thread.

The formulas assume what per-example gradients assume of a model (no layer mixes the
examples of a batch: :func:`testbed.core.models.check_record_level_model` refuses batch
normalisation) and that every layer sees the batch as it came, example ``i`` in row ``i``
of its input and output. A model whose parameterised layers are not all of these kinds,
with a parameter owned by two layers, or (found at its first batch, see :exc:`Unsupported`)
with a layer applied twice in one forward pass, a kept tensor modified in place afterwards,
a layer whose input or output has other than ``b`` rows (the examples folded into the
batch dimension, say), or a ``vmap`` layer called with other than one tensor argument, is
not handled here: ``backend="auto"`` then uses ``vmap`` over the whole model.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.modules.conv import _ConvNd

from edge_device.conv_grads import Scratch, conv_weight_rows, to_weight_layout

Norm = Literal[1, 2]
Kind = Literal["linear", "conv", "vmap"]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: ``torch.nn`` layers whose per-example gradients come from ``vmap`` of the layer alone:
#: each treats the examples of a batch independently and has no side effect in its forward.
VMAP_LAYERS: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.Embedding,
    nn.PReLU,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


class Unsupported(RuntimeError):
    """The model breaks an assumption of the layer-wise formulas at run time (a layer applied
    twice in one forward pass, a kept input or output modified in place, a layer whose input
    or output does not have the batch's examples as rows, a ``vmap`` layer called with other
    than one positional tensor)."""


def row_sizes(rows: torch.Tensor, norm: Norm = 2) -> torch.Tensor:
    """Squared l2 norms, or l1 norms, of ``float32`` rows, in ``float64``.

    Parameters
    ----------
    rows
        ``float32``, ``(b, p)`` (or ``(b, ...)``: each example's entries), any strides.
    norm
        ``2``: ``||r_i||_2^2``; ``1``: ``||r_i||_1``.

    Returns
    -------
    torch.Tensor
        ``float64``, ``(b,)``. ``torch.linalg.vector_norm(..., dtype=float64)`` widens each
        ``float32`` entry before it is squared (exactly: 48 significant bits) and sums in
        ``float64`` (fused, no ``float64`` copy of the rows), so the result is within
        ``(p + 2) 2^-53`` relative of the exact value.
    """
    dims = tuple(range(1, rows.ndim))
    size = torch.linalg.vector_norm(rows, ord=norm, dim=dims, dtype=torch.float64)
    return size if norm == 1 else size.square()


@dataclass
class _Layer:
    """One parameterised layer: its kind and where its parameters sit in the flat gradient."""

    module: nn.Module
    kind: Kind
    #: Own parameters by name, in ``named_parameters`` order.
    params: dict[str, nn.Parameter]
    #: ``name -> (start, stop)`` in the flat gradient.
    slots: dict[str, tuple[int, int]]
    #: ``vmap`` kind: per-example gradients of the layer's own parameters.
    per_example: Callable[..., dict[str, torch.Tensor]] | None = None
    #: This batch's kept ``(input, output, their versions)``; ``None`` until the layer runs.
    kept: tuple[torch.Tensor, torch.Tensor, int, int] | None = field(default=None)
    #: Its place among the model's parameterised layers (keys its work arrays).
    index: int = 0


def _kind(module: nn.Module) -> Kind | None:
    own = {n for n, _ in module.named_parameters(recurse=False)}
    if type(module) is nn.Linear or type(module) in _CONV:
        if not own <= {"weight", "bias"}:
            return None
        return "linear" if type(module) is nn.Linear else "conv"
    if type(module) in VMAP_LAYERS:
        children = any(True for _ in module.children())
        sparse_or_renorm = isinstance(module, nn.Embedding) and (
            module.sparse or module.max_norm is not None)  # max_norm rewrites the weight
        return None if children or sparse_or_renorm else "vmap"
    return None


def _conv(layer: _Layer) -> _ConvNd:
    """The module of a layer of kind ``"conv"``."""
    module = layer.module
    if not isinstance(module, _ConvNd):
        raise TypeError(f"layer {layer.index}: a {type(module).__name__} is not a convolution")
    return module


def _vmap_per_example(module: nn.Module) -> Callable[..., dict[str, torch.Tensor]]:
    def vjp_one(
        params: dict[str, torch.Tensor], xi: torch.Tensor, goi: torch.Tensor
    ) -> torch.Tensor:
        out = functional_call(module, params, (xi.unsqueeze(0),))
        return (out * goi.unsqueeze(0)).sum()  # its gradient in params is the VJP with go_i

    return vmap(grad(vjp_one), in_dims=(None, 0, 0))  # type: ignore[no-any-return]


class _WorkArrays(threading.local):
    """The convolutions' work arrays (:data:`edge_device.conv_grads.Scratch`), one set per
    thread shared by every :class:`LayerwiseSum` in it: a process simulating many devices
    holds one record-level trainer per device, and each keeping its own would hold their
    sum. Keyed by the layer's place in its model and its weight's shape, so the layers of
    one call (whose rows are all needed until its end) never share; calls follow one another
    in a thread, so sharing across trainers is safe."""

    def __init__(self) -> None:
        self.by_layer: dict[tuple[int, tuple[int, ...]], Scratch] = {}


_WORK = _WorkArrays()


def _work_arrays(layer: _Layer) -> Scratch:
    """This thread's work arrays for ``layer`` (its ``index`` and weight shape)."""
    key = (layer.index, tuple(_conv(layer).weight.shape))
    return _WORK.by_layer.setdefault(key, {})


def plan_layers(model: nn.Module, params: list[nn.Parameter]) -> list[_Layer] | None:
    """The model's parameterised layers with their kinds and flat slots, or ``None`` when one
    of them (or a parameter owned by two) is not covered (module docstring)."""
    offsets: dict[int, int] = {}
    start = 0
    for p in params:
        offsets[id(p)] = start
        start += p.numel()
    layers: list[_Layer] = []
    owned: set[int] = set()
    for module in model.modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        kind = _kind(module)
        if kind is None or any(id(p) in owned or id(p) not in offsets for _, p in own):
            return None  # not covered, or a parameter shared by two layers
        owned.update(id(p) for _, p in own)
        slots = {n: (offsets[id(p)], offsets[id(p)] + p.numel()) for n, p in own}
        layers.append(_Layer(module, kind, dict(own), slots,
                             _vmap_per_example(module) if kind == "vmap" else None,
                             index=len(layers)))
    return layers


#: Bytes of per-example rows and patches formed at once (:class:`LayerwiseSum` takes the
#: examples of a batch in chunks of at most this much work).
WORK_BUDGET = 16 << 20


def chunk_examples(per: int, like: torch.Tensor, b: int) -> int:
    """Examples per chunk of per-example work when each example forms ``per`` entries of
    ``like``'s dtype: as many as fit :data:`WORK_BUDGET`, at least 1, at most ``b``. On a
    GPU (any device but the CPU) the whole batch: the budget is the CPU's cache, measured
    there, and a GPU wants large kernels."""
    if like.device.type != "cpu" or per <= 0:
        return max(b, 1)
    return max(1, min(b, WORK_BUDGET // (per * like.element_size())))


def _chunk_size(materialised: list[tuple[_Layer, torch.Tensor, torch.Tensor]], b: int) -> int:
    """:func:`chunk_examples` for the materialised layers: each example's rows (its
    parameters in these layers) and, for a convolution, its patches (``in * prod(kernel) *
    positions`` entries)."""
    if not materialised:
        return max(b, 1)
    per = 0
    for layer, a, go in materialised:
        per += sum(p.numel() for p in layer.params.values())
        if layer.kind == "conv":
            kernel = _conv(layer).kernel_size
            per += a.shape[1] * math.prod(kernel) * math.prod(go.shape[2:])
    return chunk_examples(per, materialised[0][1], b)


class LayerwiseSum:
    """Clipped per-example gradient sums by the layer-wise formulas (module docstring).

    Parameters
    ----------
    model
        The model (its current parameters are used at each call).
    layers
        :func:`plan_layers`' result for ``model`` (not ``None``).
    d
        Number of parameters.
    """

    def __init__(self, model: nn.Module, layers: list[_Layer], d: int) -> None:
        self.model = model
        self.layers = layers
        self.d = d
        self.dtype = next(iter(layers[0].params.values())).dtype
        self._hooks = [self._keeper(layer) for layer in layers]

    @staticmethod
    def _keeper(layer: _Layer) -> Callable[..., None]:
        def keep(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
        ) -> None:
            if layer.kept is not None:
                raise Unsupported(f"{type(module).__name__} applied twice in one forward")
            if not args or not isinstance(args[0], torch.Tensor) or not isinstance(
                out, torch.Tensor
            ) or (layer.kind == "vmap" and (len(args) != 1 or kwargs)):
                raise Unsupported(f"{type(module).__name__} called with an unexpected signature")
            layer.kept = (args[0], out, args[0]._version, out._version)

        return keep

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        clip: float,
        norm: Norm,
        clip_factors: Callable[[torch.Tensor, float], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(sum_i f_i g_i, norms, losses)`` as :class:`~edge_device.per_example.
        ClippedGradientSum` returns them; ``clip_factors`` maps ``float64`` norms to the
        ``float32`` factors ``f``.

        Raises
        ------
        Unsupported
            When the model breaks an assumption of the formulas (nothing is then returned).
        """
        layers = self.layers
        handles = [
            layer.module.register_forward_hook(hook, with_kwargs=True)
            for layer, hook in zip(layers, self._hooks, strict=True)
        ]
        try:
            losses = F.cross_entropy(self.model(x), y, reduction="none")
            used = [layer for layer in layers if layer.kept is not None]
            kept = [layer.kept for layer in used]
        finally:
            for h in handles:
                h.remove()
            for layer in layers:
                layer.kept = None
        b = x.shape[0]
        for a, out, va, vo in kept:  # type: ignore[misc]
            if a._version != va or out._version != vo:
                raise Unsupported("a layer's input or output was modified in place")
            if a.ndim == 0 or out.ndim == 0 or a.shape[0] != b or out.shape[0] != b:
                raise Unsupported("a layer sees other than the batch's examples as its rows")
        gouts = torch.autograd.grad(
            losses.sum(), [k[1] for k in kept], allow_unused=True  # type: ignore[index]
        )
        total = torch.zeros(self.d, dtype=self.dtype, device=x.device)
        size = torch.zeros(b, dtype=torch.float64, device=x.device)  # squared l2, or l1
        outer: list[tuple[_Layer, torch.Tensor, torch.Tensor]] = []  # (layer, a, go)
        materialised: list[tuple[_Layer, torch.Tensor, torch.Tensor]] = []  # (layer, a, go)
        for layer, k, go in zip(used, kept, gouts, strict=True):
            if go is None:
                continue  # the loss does not depend on this layer: zero gradient
            a = k[0].detach()  # type: ignore[index]
            if layer.kind == "linear" and a.ndim == 2:  # ghost norm of go_i a_i^T
                bias = 1.0 if "bias" in layer.params else 0.0
                size += row_sizes(go, norm) * (row_sizes(a, norm) + bias)
                outer.append((layer, a, go))
            else:
                materialised.append((layer, a, go))
        # The per-example rows, their norms and their clipped sum, a chunk of examples at a
        # time: each example's clip factor needs only its own rows, and a chunk's work arrays
        # stay in the cache and below the reuse limit (at B = 1024 the MNIST CNN's rows and
        # patches of the whole batch are 165 MB, and this part of a step cost 2.5 times as
        # much per example as at B = 64).
        norms64 = torch.empty(b, dtype=torch.float64, device=x.device)
        factor = torch.empty(b, dtype=torch.float32, device=x.device)
        chunk = _chunk_size(materialised, b)
        for lo in range(0, b, chunk):
            hi = min(b, lo + chunk)
            part = size[lo:hi]
            rows: list[tuple[torch.Tensor, int, int, _ConvNd | None]] = []
            for layer, a, go in materialised:
                for name, rows_i, last in self._materialise(layer, a[lo:hi], go[lo:hi], hi - lo):
                    start, stop = layer.slots[name]
                    part += row_sizes(rows_i, norm)
                    rows.append((rows_i, start, stop, _conv(layer) if last else None))
            norms64[lo:hi] = part if norm == 1 else part.sqrt()
            f = factor[lo:hi]
            f.copy_(clip_factors(norms64[lo:hi], clip))
            for rows_i, start, stop, conv in rows:
                if conv is not None:  # summed in the (out, *k, in) layout, then put in the weight's
                    total[start:stop] += to_weight_layout(rows_i.t() @ f, conv)
                elif lo == 0:
                    torch.mv(rows_i.t(), f, out=total[start:stop])
                else:
                    total[start:stop].addmv_(rows_i.t(), f)
        for layer, a, go in outer:
            scaled = go * factor[:, None]  # fl32(f_i go_i), (b, out)
            start, stop = layer.slots["weight"]
            torch.mm(scaled.t(), a, out=total[start:stop].view(go.shape[1], a.shape[1]))
            if "bias" in layer.slots:
                start, stop = layer.slots["bias"]
                torch.sum(scaled, 0, out=total[start:stop])
        return total, norms64.float(), losses.detach()

    @staticmethod
    def _materialise(
        layer: _Layer, a: torch.Tensor, go: torch.Tensor, b: int
    ) -> list[tuple[str, torch.Tensor, bool]]:
        """Per-example gradients ``(b, p)`` of the layer's own parameters, by name, and
        whether they are in a convolution's channels-last layout ``(out, *k, in)``."""
        bias = "bias" in layer.params
        if layer.kind == "linear":  # (b, ..., in): a sum of outer products per example
            out = [("weight", torch.einsum("b...o,b...i->boi", go, a).reshape(b, -1), False)]
            if bias:
                out.append(("bias", go.reshape(b, -1, go.shape[-1]).sum(1), False))
            return out
        if layer.kind == "conv":
            rows, last = conv_weight_rows(a, go, _conv(layer), scratch=_work_arrays(layer))
            out = [("weight", rows, last)]
            return out + ([("bias", go.reshape(b, go.shape[1], -1).sum(2), False)] if bias else [])
        params = {name: p.detach() for name, p in layer.params.items()}
        per = layer.per_example(params, a, go)  # type: ignore[misc]
        return [(name, per[name].reshape(b, -1), False) for name in layer.params]
