"""The models of the source papers, and flat-vector access to their parameters.

* ``mnist-cnn``: 003's MNIST CNN, the classic 21,840-parameter net: conv 5x5 (1->10),
  max-pool 2, ReLU; conv 5x5 (10->20), max-pool 2, ReLU; FC 320->50, ReLU; FC 50->10;
  softmax (inside the cross-entropy loss).
* ``cifar-cnn``: 003's CIFAR-10 CNN, "three 3x3 conv layers, two FC layers, softmax"; the
  paper gives no widths, we use 32-64-64 channels (padding 1, max-pool 2 after each) and
  FC 1024->64->10: 122,570 parameters.
* ``logreg``: multinomial logistic regression on the flattened image (the peer papers').
* ``package.module:factory``: a lab's own model, ``factory(input_shape, n_classes)``
  (:mod:`testbed.core.extensions`, docs/extensions.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from testbed.core.extensions import build_user_model, is_import_string


class MnistCnn(nn.Module):
    """003's MNIST CNN (21,840 parameters on 28x28x1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape ``(batch, 10)``, from images ``(batch, 1, 28, 28)``."""
        x = torch.relu(torch.max_pool2d(self.conv1(x), 2))
        x = torch.relu(torch.max_pool2d(self.conv2(x), 2))
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class CifarCnn(nn.Module):
    """003's CIFAR-10 CNN with documented widths (122,570 parameters on 32x32x3)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.fc1 = nn.Linear(64 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape ``(batch, 10)``, from images ``(batch, 3, 32, 32)``."""
        x = self.features(x).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


class LogReg(nn.Module):
    """Multinomial logistic regression on flattened inputs."""

    def __init__(self, in_features: int, n_classes: int = 10) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape ``(batch, n_classes)``."""
        return self.linear(x.flatten(1))


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    seed: int,
    n_classes: int = 10,
    extensions_path: Sequence[str] = (),
) -> nn.Module:
    """Instantiate a model with weights drawn from ``seed``.

    Parameters
    ----------
    name
        ``mnist-cnn``, ``cifar-cnn``, ``logreg`` or an import string
        ``package.module:factory`` (called as ``factory(input_shape, n_classes)``).
    input_shape
        One sample's shape, e.g. ``(channels, height, width)``.
    seed
        Seed of the initial weights (the experiment's model-init stream): torch's RNG is
        seeded with it while the model is built, and restored afterwards.
    n_classes
        Number of labels K (logits per sample); the two CNNs have 10.
    extensions_path
        Directories searched first for an import string's module.

    Raises
    ------
    ValueError
        An unknown name, a sample shape or label count the built-in model does not take.
    testbed.core.extensions.ExtensionError
        An import string that does not import, or whose factory fails or returns no
        ``torch.nn.Module``.
    """
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        if is_import_string(name):
            model: nn.Module = build_user_model(name, input_shape, n_classes, extensions_path)
        elif name == "mnist-cnn":
            if input_shape != (1, 28, 28):
                raise ValueError(f"model 'mnist-cnn' takes (1, 28, 28) inputs, got {input_shape}")
            model = MnistCnn()
        elif name == "cifar-cnn":
            if input_shape != (3, 32, 32):
                raise ValueError(f"model 'cifar-cnn' takes (3, 32, 32) inputs, got {input_shape}")
            model = CifarCnn()
        elif name == "logreg":
            model = LogReg(int(np.prod(input_shape)), n_classes)
        else:
            raise ValueError(f"model: got {name!r}; allowed: 'mnist-cnn', 'cifar-cnn', 'logreg'")
        if name in ("mnist-cnn", "cifar-cnn") and n_classes > 10:
            raise ValueError(f"model {name!r} has 10 outputs; the data set has {n_classes} labels")
    finally:
        torch.random.set_rng_state(gen_state)
    return model


#: Layers whose output mixes the examples of a batch.
_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def check_record_level_model(model: nn.Module) -> None:
    """Refuse models whose per-example gradients are undefined or not trainable (what
    record-level privacy needs; checked when the run's model is built, before any work).

    Raises
    ------
    ValueError
        If the model contains a batch-normalisation layer (named), has a frozen parameter,
        or has no parameters.
    """
    for name, module in model.named_modules():
        if isinstance(module, _BATCHNORM):
            raise ValueError(
                f"record-level privacy: module {name or '<root>'!r} is "
                f"{type(module).__name__}; batch normalisation mixes the examples of a batch, "
                "so per-example gradients (and a per-record sensitivity) are undefined. "
                "Use GroupNorm or LayerNorm, or no normalisation."
            )
    params = list(model.parameters())
    if not params:
        raise ValueError("record-level privacy: the model has no parameters")
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise ValueError(f"record-level privacy: frozen parameters {frozen} are not supported")


def n_params(model: nn.Module) -> int:
    """Number of trainable parameters d."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def get_flat(model: nn.Module, params: Sequence[torch.Tensor] | None = None) -> np.ndarray:
    """All parameters as one ``float32`` vector, shape ``(d,)`` (a copy).

    ``params``: ``list(model.parameters())`` when the caller has it listed already (a
    trainer calls this once per device and round).
    """
    listed = list(model.parameters()) if params is None else params
    with torch.no_grad():  # torch.cat always allocates: the result aliases no parameter
        return torch.cat([p.reshape(-1) for p in listed]).cpu().numpy()


def set_flat(
    model: nn.Module, flat: np.ndarray, params: Sequence[torch.Tensor] | None = None
) -> None:
    """Load a ``(d,)`` vector into the model's parameters (in place).

    ``params``: ``list(model.parameters())`` when the caller has it listed already.
    """
    listed = list(model.parameters()) if params is None else params
    vec = torch.as_tensor(np.asarray(flat, dtype=np.float32))
    d = n_params(model)
    if vec.ndim != 1 or vec.numel() != d:
        raise ValueError(f"flat vector has shape {tuple(vec.shape)}, model has {d}")
    # Copy (never alias): vector_to_parameters would make the parameters views of ``flat``,
    # and training would then silently modify the caller's array.
    with torch.no_grad():
        start = 0
        for p in listed:
            n = p.numel()
            p.copy_(vec[start : start + n].view_as(p))
            start += n
