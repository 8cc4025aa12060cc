"""Per-example weight gradients of convolutions, batched over the examples.

Example ``i``'s gradient of an ``nn.Conv1d`` / ``nn.Conv2d`` / ``nn.Conv3d`` weight is
``dW_i[o, c, k] = sum_t go_i[o, t] a_i[c, t * stride + k * dilation]`` (``a`` the padded
input, ``go`` the gradient of the summed loss with respect to the output, ``t`` over the
output positions). Three exact ways to form all ``b`` of them at once, chosen per call from
the shapes alone (:func:`choose_method`):

* ``"patches"``: the input's patches copied out of one strided view, ``(b * groups,
  in / groups * prod(k), L)`` with the output positions ``L`` innermost, times the output
  gradients in one batched matrix product;
* ``"patches_last"`` (``groups == 1``): the same with the input channels innermost
  (channels-last patches ``(b, L, prod(k) * in)``), so that each copied run is
  ``k_last * in`` long rather than the output's last extent; the rows then come out in the
  layout ``(out, *k, in)``;
* ``"grouped"``: ``torch.nn.grad.conv<n>d_weight`` of a convolution whose groups are the
  examples (times the layer's groups).

On one CPU thread (oneDNN), measured on 12 layer shapes at ``b = 64``: ``grouped`` is the
fastest when both channel counts per group are multiples of 8 and there are at least 64
output positions (its blocked kernels); otherwise ``patches`` or ``patches_last``, whichever
copies longer runs (the MNIST CNN's second layer: runs of 50 against 8, 15 % faster). All
three are faster than a grouped *forward* convolution over the batch and than
``torch.nn.functional.unfold`` on every shape measured.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
import torch.nn.grad
from torch.nn.modules.conv import _ConvNd

Method = Literal["patches", "patches_last", "grouped"]
#: Reused work arrays by role (``"cols"``, ``"rows"``), grown as needed: a dict a caller
#: keeps (one per layer and thread) and passes to :func:`conv_weight_rows`.
Scratch = dict[str, torch.Tensor]
#: Largest work array kept for reuse, bytes. A larger one is made fresh at each call and
#: freed after it: at large batches its page faults are small against the work, and a
#: process holding many trainers (one per simulated device) must not keep one each.
SCRATCH_LIMIT = 16 << 20
METHODS: tuple[str, ...] = ("patches", "patches_last", "grouped")

_CONV_WEIGHT = {1: torch.nn.grad.conv1d_weight, 2: torch.nn.grad.conv2d_weight,
                3: torch.nn.grad.conv3d_weight}


def conv_padding(conv: _ConvNd) -> tuple[list[int], str]:
    """``torch.nn.functional.pad``'s argument (last dimension first) and mode for ``conv``,
    as the layer pads its input (``"same"`` puts the odd element on the right)."""
    kernel, dilation = conv.kernel_size, conv.dilation
    padding = conv.padding
    pads: list[int] = []
    for i in reversed(range(len(kernel))):
        if padding == "valid":
            left = right = 0
        elif padding == "same":
            total = dilation[i] * (kernel[i] - 1)
            left, right = total // 2, total - total // 2
        else:
            assert not isinstance(padding, str)  # torch allows only "valid" and "same"
            left = right = padding[i]
        pads += [left, right]
    mode = conv.padding_mode
    return pads, "constant" if mode == "zeros" else str(mode)


def choose_method(conv: _ConvNd, a: torch.Tensor, go: torch.Tensor) -> Method:
    """The fastest exact method for this layer and these shapes (module docstring).

    Parameters
    ----------
    conv
        The layer.
    a, go
        Its input ``(b, in, *spatial)`` and output gradient ``(b, out, *out)``.

    Returns
    -------
    Method
        On a CPU as measured there; elsewhere (CUDA) ``"patches"``.
    """
    if a.device.type != "cpu":
        return "patches"
    groups = conv.groups
    c, out = a.shape[1] // groups, go.shape[1] // groups
    if c % 8 == 0 and out % 8 == 0 and math.prod(go.shape[2:]) >= 64:
        return "grouped"
    stride, dilation = conv.stride[-1], conv.dilation[-1]
    run_first = go.shape[-1] if stride == 1 else 1  # contiguous run, positions innermost
    run_last = c * (conv.kernel_size[-1] if dilation == 1 else 1)
    return "patches_last" if groups == 1 and run_last > run_first else "patches"


def _scratch(
    scratch: Scratch | None, role: str, shape: tuple[int, ...], like: torch.Tensor
) -> torch.Tensor:
    """A contiguous ``shape`` array of ``like``'s dtype and device: fresh when ``scratch`` is
    ``None`` or the array would exceed :data:`SCRATCH_LIMIT`, else the first entries of
    ``scratch[role]`` (grown when too small).

    A record-level step's patches and per-example rows are megabytes whose size changes
    with the Poisson batch; fresh arrays of that size come from the allocator as new pages,
    and their page faults cost as much as the copy into them (measured: up to 580 faults per
    step of the MNIST CNN at B = 64)."""
    n = math.prod(shape)
    if scratch is None or n * like.element_size() > SCRATCH_LIMIT:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    buf = scratch.get(role)
    if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
        buf = scratch[role] = torch.empty(n, dtype=like.dtype, device=like.device)
    return buf[:n].view(shape)


def conv_weight_rows(
    a: torch.Tensor,
    go: torch.Tensor,
    conv: _ConvNd,
    method: Method | None = None,
    scratch: Scratch | None = None,
) -> tuple[torch.Tensor, bool]:
    """Per-example weight gradients as rows, in the layout the method leaves them.

    Parameters
    ----------
    a
        The layer's input, ``(b, in, *spatial)``.
    go
        Gradient of the summed loss with respect to the layer's output, ``(b, out, *out)``.
    conv
        The layer (kernel size, stride, padding, padding mode, dilation, groups).
    method
        ``None``: :func:`choose_method`.
    scratch
        ``None``: fresh arrays. Else work arrays reused from call to call (:data:`Scratch`,
        up to :data:`SCRATCH_LIMIT` each): the returned rows may then be a view of
        ``scratch["rows"]``, valid until the next call with the same dict.

    Returns
    -------
    rows
        ``(b, p)``, ``p = out * in / groups * prod(kernel)``: example ``i``'s gradient of
        the weight, flattened in the weight's layout ``(out, in / groups, *kernel)``, or,
        when ``channels_last``, in the layout ``(out, *kernel, in)``.
    channels_last
        Whether the rows are in the ``(out, *kernel, in)`` layout (``"patches_last"``).
    """
    kernel, stride, dilation = conv.kernel_size, conv.stride, conv.dilation
    groups = conv.groups
    method = choose_method(conv, a, go) if method is None else method
    if method not in METHODS or (method == "patches_last" and groups != 1):
        raise ValueError(f"method={method!r} is not one of {METHODS} for groups={groups}")
    b, c = a.shape[:2]
    out, out_sp = go.shape[1], go.shape[2:]
    nd, positions = len(kernel), math.prod(go.shape[2:])
    pads, mode = conv_padding(conv)
    symmetric = mode == "constant" and all(pads[2 * j] == pads[2 * j + 1] for j in range(nd))
    if method == "grouped" and symmetric:  # the weight gradient pads by itself
        padding = tuple(pads[2 * (nd - 1 - j)] for j in range(nd))
    else:
        padding = (0,) * nd
        if any(pads):
            a = F.pad(a, pads, mode=mode)
    if method == "grouped":
        gw = _CONV_WEIGHT[nd](
            a.reshape(1, b * c, *a.shape[2:]),
            (b * out, c // groups, *kernel),
            go.reshape(1, b * out, *out_sp),
            stride=stride, padding=padding, dilation=dilation, groups=b * groups,
        )
        return gw.reshape(b, -1), False
    last = method == "patches_last"
    if last:  # channels innermost: (b, *spatial, in)
        a = a.movedim(1, -1)
    a = a.contiguous()
    st = a.stride()
    sp = range(1, 1 + nd) if last else range(2, 2 + nd)  # the spatial dimensions' strides
    k_strides = [st[d] * dilation[j] for j, d in enumerate(sp)]
    t_strides = [st[d] * stride[j] for j, d in enumerate(sp)]
    if last:  # patches[i, *t, *k, c] = a[i, t * stride + k * dilation, c]
        patches = a.as_strided((b, *out_sp, *kernel, c), (st[0], *t_strides, *k_strides, 1))
        cols = _scratch(scratch, "cols", (b, positions, math.prod(kernel) * c), a)
        cols.view(patches.shape).copy_(patches)  # the one copy
        rows = _scratch(scratch, "rows", (b, out, math.prod(kernel) * c), a)
        torch.bmm(go.reshape(b, out, positions), cols, out=rows)
        return rows.view(b, -1), True
    # patches[i, c, *k, *t] = a[i, c, t * stride + k * dilation]
    patches = a.as_strided((b, c, *kernel, *out_sp), (st[0], st[1], *k_strides, *t_strides))
    cols = _scratch(scratch, "cols", (b * groups, (c // groups) * math.prod(kernel), positions),
                    a)
    cols.view(patches.shape).copy_(patches)  # the one copy
    rows = _scratch(scratch, "rows", (b * groups, out // groups, cols.shape[1]), a)
    torch.bmm(go.reshape(b * groups, out // groups, positions), cols.transpose(1, 2), out=rows)
    return rows.view(b, -1), False


def to_weight_layout(flat: torch.Tensor, conv: _ConvNd) -> torch.Tensor:
    """A ``(..., p)`` tensor in the ``(out, *kernel, in)`` layout, returned in the weight's
    ``(out, in, *kernel)`` layout (a copy), same shape."""
    weight = conv.weight
    out, c, *kernel = weight.shape
    lead = flat.shape[:-1]
    x = flat.reshape(*lead, out, *kernel, c).movedim(-1, len(lead) + 1)
    return x.reshape(*lead, -1)


def conv_weight_grad_per_example(
    a: torch.Tensor, go: torch.Tensor, conv: _ConvNd, *, method: Method | None = None
) -> torch.Tensor:
    """Per-example weight gradients of an ``nn.Conv1d`` / ``nn.Conv2d`` / ``nn.Conv3d``.

    Parameters
    ----------
    a, go, conv, method
        As :func:`conv_weight_rows`.

    Returns
    -------
    torch.Tensor
        ``(b, out * in / groups * prod(kernel))``: row ``i`` is example ``i``'s gradient of the
        weight, flattened in the weight's layout ``(out, in / groups, *kernel)``.
    """
    rows, last = conv_weight_rows(a, go, conv, method)
    return to_weight_layout(rows, conv) if last else rows
