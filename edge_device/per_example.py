"""Per-example clipped gradient sums for record-level DP-SGD.

:class:`ClippedGradientSum` computes, for a batch of ``b`` examples,
``sum_i f_i g_i`` where ``g_i`` is the gradient of example ``i``'s cross-entropy loss over
*all* model parameters (flattened in ``model.parameters()`` order, as
:func:`testbed.core.models.get_flat`) and ``f_i`` its clip factor (:func:`clip_factors`).

Clipping that provably stays at or below ``C`` in float32: ``f_i = min(1, C (1 - 2^-20) /
(n_i + 1e-6))`` is computed in float64 from the norm ``n_i`` of the float32 gradient (within
``rho <= 7.01 u`` relative, ``u = 2^-24``: :func:`per_example_norms`; the ``layers`` backend
sums float32 squares or absolute values in float64, ``rho <= u``), then rounded *toward
zero* to float32. Each scaled coordinate ``fl32(f_i g_ij)`` (or, for a linear layer,
``fl32(fl32(f_i go_o) a_k)``) is within ``(1 + u)^2`` of the exact product, so
``||clip(g_i)|| <= C (1 - 16 u)(1 + u)^2 / (1 - rho) < C`` for ``d < 2^28`` in both
the l2 and the l1 norm: the clip is ``C`` shrunk by eight float32 ulps (``2^-20``
relative, about 1e-6) and the accounting uses ``C``. Opacus' ``C / (||g|| + 1e-6)`` in float32
overshoots ``C`` by up to about 3.5e-7 relative (measured). The sum over a batch is rounded
again; that rounding is not part of any one example's contribution.

Two backends:

* ``"layers"`` (the default wherever it applies): one batched forward pass with forward
  hooks that keep each layer's input and output, one ``torch.autograd.grad`` to the layer
  outputs (no weight gradients are formed), then per layer, in closed form:

  - ``nn.Linear`` on ``(b, in)`` inputs: the per-example weight gradient is the outer
    product ``go_i a_i^T``, so its norm is ``||go_i|| ||a_i||`` and the clipped sum is
    ``(f * go)^T a``; per-example weight gradients are never materialised;
  - ``nn.Conv2d`` (``groups == 1``, zero padding): per-example weight gradients
    ``(b, out, in, kh, kw)`` from one grouped convolution of the inputs with the output
    gradients (the batch as groups; stride and dilation swap roles).

  It is the same idea as Opacus' grad samplers, without their per-parameter bookkeeping.
* ``"vmap"``: ``torch.func.vmap(grad_and_value(...))`` over ``functional_call``: any model
  ``torch.func`` can batch; per-example gradients ``(b, d)`` are materialised.

``"auto"`` picks ``"layers"`` when every module that owns parameters is a supported
``nn.Linear`` / ``nn.Conv2d``, else ``"vmap"``.

The runner uses ``vmap`` (``torch.func``, the well-kept library path) unless a run asks for
``privacy.per_example: layers``; both are checked against a per-example loop and against
each other in ``tests/test_dp_trainer.py``. Why ``layers`` exists: measured on this
project's models, one torch
thread, process CPU time per step (median of 20; clipped sum plus the SGD update, no
sampling or noise), as a ratio to a plain batched SGD step (``LocalTrainer``'s):

============  =====  ==========  ==========  ===========
model         batch  ``layers``  ``vmap``    Opacus 1.6
============  =====  ==========  ==========  ===========
mnist-cnn     32     1.24x       1.97x       2.49x
mnist-cnn     64     1.19x       1.76x       1.94x
mnist-cnn     128    1.23x       1.79x       2.07x
mnist-cnn     256    1.20x       1.78x       2.41x
logreg        64     1.35x       7.9x        9.8x
logreg        256    1.09x       8.8x        9.3x
============  =====  ==========  ==========  ===========

(mnist-cnn at batch 64: 9.2 ms plain, 11.0 ms ``layers``, 16.3 ms ``vmap``, 17.9 ms Opacus.)
Per-step CSPRNG noise and Poisson sampling add about 1 ms per step on top (d = 21,840).

With sampling and noise on top, ``vmap`` or Opacus would put a record-level round of the
MNIST CNN at or past the issue's limit (at most 2x a non-private round); both generic tools
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

# re-exported (explicit alias): checked here and when the run's model is built
from testbed.core.models import check_record_level_model as check_record_level_model

Backend = Literal["auto", "layers", "vmap"]
BACKENDS: tuple[str, ...] = ("auto", "layers", "vmap")

#: Added to each per-example norm before dividing (as Opacus; keeps a zero norm finite).
NORM_MARGIN = 1e-6
#: Relative shrink of every clip factor: eight float32 ulps, ``2^-20`` (see the module
#: docstring: covers the norm's float64 error and two float32 roundings of the product).
CLIP_SHRINK = 2.0**-20
#: Coordinates per float32 partial norm in :func:`per_example_norms`.
_BLOCK = 8
#: The norm per-example gradients are clipped in.
Norm = Literal[1, 2]

def _layers_supported(model: nn.Module) -> bool:
    owned = [id(p) for m in model.modules() for p in m.parameters(recurse=False)]
    if len(owned) != len(set(owned)):
        return False  # a parameter shared by two layers: the per-layer formulas miss the tie
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        if set(own) - {"weight", "bias"}:
            return False
        if type(module) is nn.Linear:
            continue
        if (
            type(module) is nn.Conv2d
            and module.groups == 1
            and module.padding_mode == "zeros"
            and not isinstance(module.padding, str)
        ):
            continue
        return False
    return True


class _SharedModuleError(RuntimeError):
    """A hooked layer ran more than once in one forward pass (weight sharing)."""


def conv2d_weight_grad_per_example(
    a: torch.Tensor, go: torch.Tensor, conv: nn.Conv2d
) -> torch.Tensor:
    """Per-example weight gradients of a ``groups == 1`` ``nn.Conv2d``.

    Parameters
    ----------
    a
        The layer's input, ``(b, in, H, W)``.
    go
        Gradient of the summed loss with respect to the layer's output, ``(b, out, Ho, Wo)``.
    conv
        The layer (for kernel size, stride, padding, dilation).

    Returns
    -------
    torch.Tensor
        ``(b, out, in, kh, kw)``: example ``i``'s gradient of the conv weight.
    """
    b, c_in = a.shape[:2]
    c_out = go.shape[1]
    kh, kw = conv.kernel_size
    # dW_i[o, c, p, q] = sum_t go_i[o, t] a_i[c, t*stride + p*dilation]: a convolution of the
    # input (examples as channels) with each go_i as a kernel, stride and dilation swapped.
    out = F.conv2d(
        a.transpose(0, 1),
        go.reshape(b * c_out, 1, go.shape[2], go.shape[3]),
        padding=conv.padding,  # type: ignore[arg-type]
        stride=conv.dilation,
        dilation=conv.stride,
        groups=b,
    )
    out = out[:, :, :kh, :kw]  # (in, b*out, >=kh, >=kw) -> the kernel's extent
    return out.reshape(c_in, b, c_out, kh, kw).permute(1, 2, 0, 3, 4)


class ClippedGradientSum:
    """Sum of per-example clipped gradients of the cross-entropy loss of a model.

    Parameters
    ----------
    model
        The model; its current parameters are used at each call (nothing is copied), so the
        caller may update them in place between calls.
    backend
        ``"auto"``, ``"layers"`` or ``"vmap"`` (see the module docstring).
    device
        Where the per-example gradients are computed (``compute.device`` resolved,
        :func:`testbed.core.compute.resolve_device`); ``None``: where the model's
        parameters are. The model is moved there, and each batch given to a call.

    Raises
    ------
    ValueError
        For an unknown backend, a model :func:`check_record_level_model` refuses, or
        ``"layers"`` on a model with other parameterised layers.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        backend: Backend = "auto",
        device: torch.device | None = None,
    ) -> None:
        self._auto = backend == "auto"
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
        check_record_level_model(model)
        supported = _layers_supported(model)
        if backend == "layers" and not supported:
            raise ValueError(
                "backend='layers' handles nn.Linear and nn.Conv2d (groups=1, zero padding) "
                "only; this model has other parameterised layers: use backend='vmap'"
            )
        if device is None:
            first = next(iter(model.parameters()))  # check_record_level_model: there is one
            device = first.device
        self.device = torch.device(device)
        self.model = model.to(self.device)
        if backend == "auto":
            backend = "layers" if supported else "vmap"
        self.backend: Backend = backend
        self.params = list(model.parameters())
        self.d = sum(p.numel() for p in self.params)
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
        if self.backend == "layers":
            try:
                return self._layers(x, y, clip, norm)
            except _SharedModuleError:
                if not self._auto:
                    raise
                self.backend = "vmap"  # a layer is applied twice: fall back for good
        return self._vmap(x, y, clip, norm)

    # ------------------------------------------------------------------ layers backend

    def _layers(
        self, x: torch.Tensor, y: torch.Tensor, clip: float, norm: Norm = 2
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        seen: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}

        def keep(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if module in seen:
                raise _SharedModuleError(f"{type(module).__name__} applied twice in one forward")
            seen[module] = (inputs[0], output)

        layers = [m for m in self.model.modules() if any(True for _ in m.parameters(False))]
        handles = [m.register_forward_hook(keep) for m in layers]
        try:
            losses = F.cross_entropy(self.model(x), y, reduction="none")
        finally:
            for h in handles:
                h.remove()
        used = [m for m in layers if m in seen]
        gouts = torch.autograd.grad(losses.sum(), [seen[m][1] for m in used], allow_unused=True)
        b = x.shape[0]
        l1 = norm == 1
        # l2: float32 squares (each within u = 2^-24) summed in float64; l1: absolute values
        # (exact) summed in float64 (clip_factors' bound covers both)
        sq = torch.zeros(b, dtype=torch.float64, device=x.device)

        def size(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
            return (t.abs() if l1 else t.square()).sum(dims, dtype=torch.float64)

        parts: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
        for module, go in zip(used, gouts, strict=True):
            if go is None:
                continue
            a = seen[module][0].detach()
            if isinstance(module, nn.Linear) and a.ndim == 2:
                bias_term = 1.0 if module.bias is not None else 0.0
                sq += size(go, (1,)) * (size(a, (1,)) + bias_term)
                parts.append((module, a, go))
            elif isinstance(module, nn.Linear):  # (b, ..., in): materialise per example
                gw = torch.einsum("b...o,b...i->boi", go, a)
                gb = go.reshape(b, -1, go.shape[-1]).sum(1)
                sq += size(gw, (1, 2))
                if module.bias is not None:
                    sq += size(gb, (1,))
                parts.append((module, gw, gb))
            else:
                gw = conv2d_weight_grad_per_example(a, go, module)  # type: ignore[arg-type]
                gb = go.sum((2, 3))
                sq += size(gw, (1, 2, 3, 4))
                if module.bias is not None:
                    sq += size(gb, (1,))
                parts.append((module, gw, gb))
        norms64 = sq if l1 else sq.sqrt()
        norms, factor = norms64.float(), clip_factors(norms64, clip)
        grads: dict[torch.Tensor, torch.Tensor] = {}
        for module, first, second in parts:
            weight, bias = module.weight, module.bias  # type: ignore[union-attr]
            if isinstance(module, nn.Linear) and first.ndim == 2:
                scaled = second * factor[:, None]  # first = a (b, in), second = go (b, out)
                grads[weight] = scaled.T @ first  # type: ignore[index]
                if bias is not None:
                    grads[bias] = scaled.sum(0)  # type: ignore[index]
            else:  # first = per-example weight grads, second = per-example bias grads
                grads[weight] = (factor @ first.reshape(b, -1)).view_as(weight)  # type: ignore[index,arg-type]
                if bias is not None:
                    grads[bias] = factor @ second  # type: ignore[index]
        flat = [
            grads[p].reshape(-1) if p in grads else torch.zeros(p.numel(), device=p.device)
            for p in self.params
        ]
        return torch.cat(flat), norms, losses.detach()

    # -------------------------------------------------------------------- vmap backend

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
        per, losses = self._vmap_fn(params, buffers, x, y)
        b = x.shape[0]
        flat = torch.cat([per[k].reshape(b, -1) for k in params], dim=1)  # (b, d)
        norms64 = per_example_norms(flat, norm)
        return clip_factors(norms64, clip) @ flat, norms64.float(), losses.detach()


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
        ``float64``, ``(b,)``: ``||g_i||_1`` or ``||g_i||_2`` of the float32 row. Blocks of
        8 coordinates are reduced in float32 (at most 8 roundings, any order: relative error
        ``<= gamma_8 = 8u / (1 - 8u)``, ``u = 2^-24``; one more for the block's square root),
        the blocks in float64 (``d 2^-53``). So the result is within ``7.01 u`` (l1) or
        ``5.01 u`` (l2) relative of the exact norm, for ``d < 2^28``; squares that underflow
        lose at most ``sqrt(d) 2^-75`` absolute, inside :func:`clip_factors`' ``1e-6``. This
        costs about 1 ms per step more than a float32 norm for the MNIST CNN at b = 64 (a
        plain float64 cast of the ``(b, d)`` rows cost 5-7 ms).
    """
    b, d = flat.shape
    m = d - d % _BLOCK
    # float32 norms of blocks of 8 (fused, no (b, d) temporary), then float64 across blocks
    part = torch.linalg.vector_norm(flat[:, :m].reshape(b, -1, _BLOCK), ord=norm, dim=2)
    tail = flat[:, m:].double()
    if norm == 1:
        return part.sum(1, dtype=torch.float64) + tail.abs().sum(1)
    total = torch.linalg.vector_norm(part, dim=1, dtype=torch.float64).square()
    return (total + tail.square().sum(1)).sqrt()


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
