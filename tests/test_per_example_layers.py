"""The layer-wise per-example backend (edge_device/layer_grads.py), the default, is exact.

Its clipped sums, norms and losses are compared with ``torch.func.vmap`` over the whole model
and with a per-example loop, on the project's models and on layers of every kind it covers,
at several batch sizes, in both norms, with a clip that leaves some examples unclipped and
clips the others. Fallbacks to ``vmap`` are checked to give the same sums.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edge_device.conv_grads import METHODS, conv_weight_grad_per_example, conv_weight_rows
from edge_device.dp_trainer import RecordTrainer
from edge_device.layer_grads import Unsupported
from edge_device.per_example import ClippedGradientSum, clip_factors
from testbed.core.models import build_model, get_flat

# Small batches on a shared machine: one thread is ~10x faster than contended two.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _Zoo(nn.Module):
    """Every kind of layer the backend covers, with awkward settings."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding="same", padding_mode="reflect")
        self.gn = nn.GroupNorm(2, 4)
        self.c2 = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2, padding_mode="circular")
        self.act = nn.PReLU(8)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.c3 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, bias=False)  # the grouped path
        self.c1d = nn.Conv1d(8, 5, 4, stride=3, padding="valid")
        self.ln = nn.LayerNorm(5 * 261)
        self.rms = nn.RMSNorm(16)
        self.fc1 = nn.Linear(5 * 261, 16)
        self.fc2 = nn.Linear(16, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.c2(torch.relu(self.gn(self.c1(x)))))  # (b, 8, 14, 14)
        h = torch.tanh(self.c3(self.up(h)))  # (b, 8, 28, 28)
        h = self.c1d(h.flatten(2))  # (b, 5, 261)
        return self.fc2(self.rms(torch.tanh(self.fc1(self.ln(h.flatten(1))))))


class _Conv3d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv3d(1, 3, (2, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.fc = nn.Linear(3 * 3 * 4 * 14, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c(x.reshape(-1, 1, 4, 7, 28))).flatten(1))


class _Tokens(nn.Module):
    """Embeddings and a linear layer on ``(b, T, in)`` inputs (materialised per example)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8, padding_idx=0)
        self.mix = nn.Linear(8, 8)
        self.out = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.emb(x))).mean(1))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "mnist-cnn": lambda: build_model("mnist-cnn", (1, 28, 28), seed=3),
    "logreg": lambda: build_model("logreg", (1, 28, 28), seed=3),
    "cifar-cnn": lambda: build_model("cifar-cnn", (3, 32, 32), seed=3),
    "zoo": _Zoo,
    "conv3d": _Conv3d,
    "tokens": _Tokens,
}


def _batch(name: str, b: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (b,), generator=gen)
    if name == "tokens":
        return torch.randint(0, 50, (b, 7), generator=gen), y
    shape = (3, 32, 32) if name == "cifar-cnn" else (1, 28, 28)
    return 2.0 * torch.randn(b, *shape, generator=gen), y


def _loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, norm: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: one backward pass per example; factors as the backends compute them."""
    grads = []
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))  # type: ignore[union-attr]
    rows = torch.stack(grads).double()
    norms = rows.abs().sum(1) if norm == 1 else rows.norm(dim=1)
    return clip_factors(norms, clip).double() @ rows, norms


@pytest.mark.parametrize("norm", [2, 1])
@pytest.mark.parametrize("b", [1, 6, 33])
@pytest.mark.parametrize("name", list(MODELS))
def test_layers_equal_vmap_and_a_loop(name: str, b: int, norm: int) -> None:
    model = MODELS[name]()
    x, y = _batch(name, b, seed=b)
    layers = ClippedGradientSum(model)
    assert layers.backend == "layers"  # the default covers every one of these models
    vm = ClippedGradientSum(model, backend="vmap")
    _, raw, _ = vm(x, y, 1e30, norm=norm)  # type: ignore[arg-type]
    clip = float(raw.median()) if b > 1 else 0.5 * float(raw[0])
    total, norms, losses = layers(x, y, clip, norm=norm)  # type: ignore[arg-type]
    ref_total, ref_norms, ref_losses = vm(x, y, clip, norm=norm)  # type: ignore[arg-type]
    if b > 1:  # some examples keep their gradient, the others are clipped
        assert bool((ref_norms < clip).any()) and bool((ref_norms > clip).any())
    scale = clip * b
    torch.testing.assert_close(norms, ref_norms, rtol=2e-5, atol=1e-6 * clip)
    torch.testing.assert_close(total, ref_total, rtol=1e-4, atol=2e-6 * scale)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    # one example at a time: other float32 roundings can move a max-pool's or a ReLU's choice
    # where two inputs nearly tie, so the loop is compared as a whole, not coordinate-wise
    loop_total, loop_norms = _loop(model, x, y, clip, norm)
    torch.testing.assert_close(norms.double(), loop_norms, rtol=1e-3, atol=1e-6 * clip)
    assert float((total.double() - loop_total).norm()) <= 1e-3 * float(loop_total.norm())
    assert not model._forward_hooks  # nothing left on the (shared) model
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("chunk", [1, 5])
@pytest.mark.parametrize("norm", [2, 1])
@pytest.mark.parametrize("name", ["mnist-cnn", "zoo", "tokens", "conv3d"])
def test_examples_taken_in_chunks_give_the_same_norms_and_sum(
    name: str, norm: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-example work a chunk of examples at a time (33 = 6 chunks of 5 and one of 3):
    the same losses (one forward pass), the same norms and clipped sum to float32 rounding
    (a library kernel may round an example's rows differently in a smaller batch, and the
    chunks' sums are added in another order)."""
    from edge_device import layer_grads

    model = MODELS[name]()
    x, y = _batch(name, 33, seed=4)
    layers = ClippedGradientSum(model)
    _, raw, _ = layers(x, y, 1e30, norm=norm)  # type: ignore[arg-type]
    clip = float(raw.median())
    whole, whole_norms, whole_losses = layers(x, y, clip, norm=norm)  # type: ignore[arg-type]
    monkeypatch.setattr(layer_grads, "_chunk_size", lambda materialised, b: chunk)
    total, norms, losses = layers(x, y, clip, norm=norm)  # type: ignore[arg-type]
    assert torch.equal(losses, whole_losses)
    torch.testing.assert_close(norms, whole_norms, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-6 * clip)
    loop_total, _ = _loop(model, x, y, clip, norm)
    assert float((total.double() - loop_total).norm()) <= 1e-3 * float(loop_total.norm())


@pytest.mark.parametrize("backend", ["auto", "vmap"])
@pytest.mark.parametrize("norm", [2, 1])
@pytest.mark.parametrize("name", ["mnist-cnn", "tokens"])
def test_a_batch_in_passes_gives_the_same_norms_losses_and_sum(
    name: str, norm: int, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch larger than a pass (33 = 4 passes of 7 and one of 5: forward, backward and
    clipping per pass) against one pass: losses and norms to float32 rounding (a kernel may
    round an example differently in a smaller batch), the clipped sum too (added in another
    order), and each output in example order."""
    from edge_device import per_example

    model = MODELS[name]()
    x, y = _batch(name, 33, seed=6)
    cgs = ClippedGradientSum(model, backend=backend)  # type: ignore[arg-type]
    monkeypatch.setattr(per_example, "PASS_EXAMPLES", 1 << 30)
    _, raw, _ = cgs(x, y, 1e30, norm=norm)  # type: ignore[arg-type]
    clip = float(raw.median())
    whole, whole_norms, whole_losses = cgs(x, y, clip, norm=norm)  # type: ignore[arg-type]
    monkeypatch.setattr(per_example, "PASS_EXAMPLES", 7)
    total, norms, losses = cgs(x, y, clip, norm=norm)  # type: ignore[arg-type]
    assert norms.shape == losses.shape == (33,)
    torch.testing.assert_close(losses, whole_losses, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(norms, whole_norms, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-6 * clip)
    assert per_example.pass_examples(x.to("meta"), 33) == 33  # not the CPU: one pass


@pytest.mark.parametrize("norm", [2, 1])
@pytest.mark.parametrize("name", ["mnist-cnn", "tokens"])
def test_vmap_in_chunks_gives_the_same_norms_and_sum(
    name: str, norm: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-model vmap backend a chunk of examples at a time (33 = 6 x 5 + 3) against
    one piece: losses, norms and clipped sum as the layer-wise chunks are compared."""
    from edge_device import per_example

    model = MODELS[name]()
    x, y = _batch(name, 33, seed=5)
    vm = ClippedGradientSum(model, backend="vmap")
    _, raw, _ = vm(x, y, 1e30, norm=norm)  # type: ignore[arg-type]
    clip = float(raw.median())
    whole, whole_norms, whole_losses = vm(x, y, clip, norm=norm)  # type: ignore[arg-type]
    monkeypatch.setattr(per_example, "chunk_examples", lambda per, like, b: 5)
    total, norms, losses = vm(x, y, clip, norm=norm)  # type: ignore[arg-type]
    assert norms.shape == losses.shape == (33,)
    torch.testing.assert_close(losses, whole_losses, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(norms, whole_norms, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-6 * clip)


def test_chunk_size_fits_the_work_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MNIST CNN forms 35,680 entries per example (conv1: 260 parameters and 1 x 25 x 576
    patch entries; conv2: 5,020 and 10 x 25 x 64): 117 examples in 16 MiB of float32."""
    from edge_device import layer_grads

    model = build_model("mnist-cnn", (1, 28, 28), seed=0)
    layers = layer_grads.plan_layers(model, list(model.parameters()))
    assert layers is not None
    c1, c2 = (layer for layer in layers if layer.kind == "conv")
    work = [(c1, torch.empty(0, 1, 28, 28), torch.empty(0, 10, 24, 24)),
            (c2, torch.empty(0, 10, 12, 12), torch.empty(0, 20, 8, 8))]
    assert (16 << 20) // (4 * 35_680) == 117
    assert layer_grads._chunk_size(work, 1024) == 117
    assert layer_grads._chunk_size(work, 64) == 64
    assert layer_grads._chunk_size([], 64) == 64  # nothing materialised: one chunk
    elsewhere = [(layer, a.to("meta"), go.to("meta")) for layer, a, go in work]
    assert layer_grads._chunk_size(elsewhere, 1024) == 1024  # not the CPU: the whole batch
    monkeypatch.setattr(layer_grads, "WORK_BUDGET", 1000)
    assert layer_grads._chunk_size(work, 64) == 1
    assert layer_grads.chunk_examples(10, torch.empty(0), 64) == 25  # 1000 B / 40 B


@pytest.mark.parametrize("norm", [2, 1])
@pytest.mark.parametrize("name", ["zoo", "tokens", "cifar-cnn"])
def test_one_clipped_example_stays_within_the_clip(name: str, norm: int) -> None:
    model = MODELS[name]()
    csum = ClippedGradientSum(model)
    for seed in range(4):
        x, y = _batch(name, 1, seed=100 + seed)
        x = x * 30 if x.is_floating_point() else x
        total, norms, _ = csum(x, y, 0.25, norm=norm)  # type: ignore[arg-type]
        assert float(norms[0]) > 0.25
        got = total.double().abs().sum() if norm == 1 else total.double().norm()
        assert float(got) <= 0.25  # no tolerance: the float32 bound of the module docstring


_CONVS: list[Callable[[], nn.Module]] = [
    lambda: nn.Conv2d(1, 10, 5),
    lambda: nn.Conv2d(10, 20, 5, stride=2, bias=False),
    lambda: nn.Conv2d(8, 16, 3, padding=1),
    lambda: nn.Conv2d(8, 16, (2, 3), stride=(2, 1), dilation=(1, 2), padding=(1, 0), groups=4),
    lambda: nn.Conv2d(3, 6, 4, padding="same", padding_mode="replicate"),
    lambda: nn.Conv2d(16, 8, 3, padding="same", dilation=3),
    lambda: nn.Conv1d(6, 4, 3, stride=2, padding=2, padding_mode="circular"),
    lambda: nn.Conv3d(2, 4, (1, 2, 3), padding=(0, 1, 1)),
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", range(len(_CONVS)))
def test_conv_per_example_weight_gradients(k: int, method: str) -> None:
    torch.manual_seed(k)
    conv = _CONVS[k]()
    spatial = {1: (19,), 2: (11, 13), 3: (3, 6, 7)}[conv.weight.ndim - 2]
    a = torch.randn(5, conv.in_channels, *spatial)
    go = torch.randn_like(conv(a))
    if method == "patches_last" and conv.groups != 1:
        with pytest.raises(ValueError, match="groups"):
            conv_weight_grad_per_example(a, go, conv, method=method)  # type: ignore[arg-type]
        return
    got = conv_weight_grad_per_example(a, go, conv, method=method)  # type: ignore[arg-type]
    for i in range(5):
        (want,) = torch.autograd.grad((conv(a[i : i + 1]) * go[i : i + 1]).sum(), [conv.weight])
        torch.testing.assert_close(got[i], want.reshape(-1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_conv_rows_with_reused_work_arrays_are_the_fresh_ones(method: str) -> None:
    """Work arrays kept between calls (grown, then used at smaller batches) give the same
    rows, bit for bit, as fresh arrays; the rows are then a view of the kept array."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, padding=1)
    scratch: dict[str, torch.Tensor] = {}
    for b in (3, 9, 2, 9, 1):
        a = torch.randn(b, 4, 10, 12)
        go = torch.randn_like(conv(a))
        fresh, last = conv_weight_rows(a, go, conv, method)  # type: ignore[arg-type]
        kept, last_kept = conv_weight_rows(a, go, conv, method, scratch)  # type: ignore[arg-type]
        assert last_kept == last
        assert torch.equal(kept, fresh)
        if method != "grouped":  # the grouped weight gradient returns its own array
            assert kept.untyped_storage().data_ptr() == scratch["rows"].untyped_storage(
            ).data_ptr()
    if method != "grouped":
        assert scratch["rows"].numel() == 9 * conv.weight.numel()  # grown once, to b = 9


def test_trainers_in_one_thread_share_the_work_arrays_and_large_ones_are_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process simulating many devices holds one record-level trainer per device: the
    convolutions' work arrays are one set per thread (per layer place and shape), not one per
    trainer, and an array above the limit is made for its call only."""
    import threading

    from edge_device import conv_grads, layer_grads

    monkeypatch.setattr(layer_grads, "_WORK", layer_grads._WorkArrays())
    x = torch.randn(12, 1, 28, 28)
    y = torch.randint(0, 10, (12,))
    sums = [ClippedGradientSum(build_model("mnist-cnn", (1, 28, 28), seed=s)) for s in range(5)]
    for cgs in sums:
        cgs(x, y, 1.0)
    kept = layer_grads._WORK.by_layer
    assert len(kept) == 2  # the two convolutions, whatever the number of trainers
    held = sum(t.numel() for arrays in kept.values() for t in arrays.values())
    sums[0](x[:5], y[:5], 1.0)  # a smaller batch takes views: nothing new is held
    assert sum(t.numel() for a in kept.values() for t in a.values()) == held

    other: list[int] = []  # another thread has its own
    worker = threading.Thread(target=lambda: (sums[1](x, y, 1.0),
                                              other.append(len(layer_grads._WORK.by_layer))))
    worker.start()
    worker.join()
    assert other == [2] and len(kept) == 2

    monkeypatch.setattr(layer_grads, "_WORK", layer_grads._WorkArrays())
    monkeypatch.setattr(conv_grads, "SCRATCH_LIMIT", 1024)  # bytes: every array is larger
    want, _, _ = sums[2](x, y, 1.0)
    assert all(not arrays for arrays in layer_grads._WORK.by_layer.values())
    monkeypatch.setattr(conv_grads, "SCRATCH_LIMIT", 16 << 20)
    got, _, _ = sums[2](x, y, 1.0)
    assert torch.equal(got, want)  # kept or fresh: the same sum


class _Twice(nn.Module):
    """One layer applied twice in a forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.a, self.out = nn.Linear(784, 32), nn.Linear(32, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x.flatten(1)))
        return self.out(torch.tanh(self.a(torch.tanh(self.a(h)))))


def _inplace() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 5), nn.ReLU(inplace=True), nn.Flatten(),
                         nn.Linear(4 * 24 * 24, 10))


class _Folded(nn.Module):
    """Each image's 28 rows folded into the batch dimension before a linear layer: row-wise
    norms of that layer would be per image row, not per example."""

    def __init__(self) -> None:
        super().__init__()
        self.rows, self.out = nn.Linear(28, 8), nn.Linear(28 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        return self.out(torch.tanh(self.rows(x.reshape(b * 28, 28))).reshape(b, 28 * 8))


def _tied() -> nn.Module:
    first, second = nn.Linear(784, 784, bias=False), nn.Linear(784, 10)
    second_in = nn.Linear(784, 784, bias=False)
    second_in.weight = first.weight  # one parameter owned by two layers
    return nn.Sequential(nn.Flatten(), first, nn.Tanh(), second_in, nn.Tanh(), second)


@pytest.mark.parametrize("make", [_inplace, _tied, _Twice, _Folded])
def test_fallbacks_to_vmap_give_the_same_sums(make: Callable[[], nn.Module]) -> None:
    model = make()
    x, y = _batch("mnist-cnn", 5, seed=21)
    csum = ClippedGradientSum(model)
    total, norms, _ = csum(x, y, 0.2)
    assert csum.backend == "vmap"  # decided at set-up (tied) or at the first batch, for good
    loop_total, loop_norms = _loop(model, x, y, 0.2, 2)
    torch.testing.assert_close(norms.double(), loop_norms, rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(total.double(), loop_total, rtol=1e-4, atol=1e-6)
    if make is not _tied:
        with pytest.raises(Unsupported):
            ClippedGradientSum(make(), backend="layers")(x, y, 0.2)


def test_the_default_everywhere_is_auto_and_picks_layers() -> None:
    from testbed.core.config.loader import load_experiment  # the run configuration's default

    assert load_experiment(None, []).privacy.per_example == "auto"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 1, 28, 28)).astype(np.float32)
    y = (np.arange(40) % 10).astype(np.int64)
    model = build_model("mnist-cnn", (1, 28, 28), 1)
    trainer = RecordTrainer(model, x, y)
    assert trainer.clipped_sum.backend == "layers"
    w0 = get_flat(model)
    kw = {"steps": 3, "expected_batch_size": 8, "lr": 0.1, "example_clip": 0.5,
          "noise_multiplier": 0.0, "secure_sampling": False}
    got = trainer.train(w0, rng=np.random.default_rng(3), **kw)  # type: ignore[arg-type]
    ref = RecordTrainer(build_model("mnist-cnn", (1, 28, 28), 1), x, y, backend="vmap").train(
        w0, rng=np.random.default_rng(3), **kw)  # type: ignore[arg-type]
    assert np.array_equal(got.batch_sizes, ref.batch_sizes)
    np.testing.assert_allclose(got.differential, ref.differential, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.weights, ref.weights, rtol=1e-5, atol=1e-6)
    assert got.mean_loss == pytest.approx(ref.mean_loss, rel=1e-6)
    np.testing.assert_allclose(w0 - got.weights, 0.1 * got.differential, atol=1e-6)
