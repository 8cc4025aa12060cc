"""An I/Q modulation-classification toy: a lab's own data set and model by import string.

Synthetic complex baseband bursts, one sample per symbol, of four modulations:

====  ========  =============================================
label name      constellation (unit average symbol power)
====  ========  =============================================
0     BPSK      ``{+1, -1}``
1     QPSK      ``exp(j (pi/4 + k pi/2))``, k = 0..3
2     8PSK      ``exp(j k pi/4)``, k = 0..7
3     16QAM     ``{+-1, +-3} + j {+-1, +-3}``, divided by ``sqrt(10)``
====  ========  =============================================

Each burst has :data:`SYMBOLS` uniformly drawn symbols, a random carrier phase (uniform in
``[0, 2 pi)``, constant over the burst) and complex white Gaussian noise at an SNR drawn
uniformly in ``[0, 20]`` dB (noise power ``10^(-SNR/10)`` per complex sample). A sample is
``(2, SYMBOLS)`` ``float32``: row 0 the in-phase (I), row 1 the quadrature (Q) component.
Everything is generated from :data:`SEED` (``numpy.random.default_rng``); no file is read or
written.

In an experiment config (``examples/iq_modulation.yaml``, run from the repository root)::

    dataset: examples.iq_modulation:loader
    model: examples.iq_modulation:model
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

#: Symbols per burst (one sample per symbol).
SYMBOLS = 64
#: Bursts generated per split.
TRAIN_BURSTS = 4000
TEST_BURSTS = 1000
#: Seed of the data (training and test bursts are drawn from different streams of it).
SEED = 2024
#: SNR range of the bursts (dB).
SNR_DB = (0.0, 20.0)
#: The modulations, in label order.
CLASSES = ("BPSK", "QPSK", "8PSK", "16QAM")


def constellation(label: int) -> np.ndarray:
    """The constellation of class ``label``, ``complex128`` of shape ``(M,)``, unit average
    power."""
    if label == 0:
        return np.array([1.0, -1.0], dtype=np.complex128)
    if label == 1:
        return np.exp(1j * (np.pi / 4 + np.arange(4) * np.pi / 2))
    if label == 2:
        return np.exp(1j * np.arange(8) * np.pi / 4)
    if label == 3:
        levels = np.array([-3.0, -1.0, 1.0, 3.0])
        return (levels[:, None] + 1j * levels[None, :]).ravel() / np.sqrt(10.0)
    raise ValueError(f"label {label}: allowed 0..{len(CLASSES) - 1}")


def bursts(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random bursts and their labels.

    Returns
    -------
    x
        ``float32``, shape ``(n, 2, SYMBOLS)``: I and Q rows.
    y
        ``int64``, shape ``(n,)``: labels ``0..3`` (:data:`CLASSES`).
    """
    y = rng.integers(len(CLASSES), size=n)
    z = np.empty((n, SYMBOLS), dtype=np.complex128)
    for label in range(len(CLASSES)):
        rows = np.flatnonzero(y == label)
        points = constellation(label)
        z[rows] = points[rng.integers(len(points), size=(len(rows), SYMBOLS))]
    phase = rng.uniform(0.0, 2 * np.pi, size=(n, 1))
    snr_db = rng.uniform(*SNR_DB, size=(n, 1))
    noise_std = np.sqrt(10.0 ** (-snr_db / 10.0) / 2.0)  # per real component
    noise = noise_std * (rng.standard_normal((n, SYMBOLS)) + 1j * rng.standard_normal((n, SYMBOLS)))
    z = z * np.exp(1j * phase) + noise
    x = np.stack([z.real, z.imag], axis=1).astype(np.float32)
    return x, y.astype(np.int64)


def loader(data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The data set: ``(x_train, y_train, x_test, y_test)``.

    Parameters
    ----------
    data_dir
        Ignored (the bursts are generated, nothing is read).

    Returns
    -------
    tuple of numpy.ndarray
        ``x_*`` ``float32`` ``(n, 2, 64)``, ``y_*`` ``int64`` ``(n,)``: :data:`TRAIN_BURSTS`
        training and :data:`TEST_BURSTS` test bursts, the same on every call.
    """
    train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(SEED)
                           .spawn(2))
    x_train, y_train = bursts(TRAIN_BURSTS, train_rng)
    x_test, y_test = bursts(TEST_BURSTS, test_rng)
    return x_train, y_train, x_test, y_test


class PhaseFreeFeatures(nn.Module):
    """Parameter-free front end: per burst, features that do not depend on the carrier
    phase.

    The burst ``z = I + jQ`` is scaled to unit average power; then, per symbol, ``|z|^2``
    and, for ``k = 2, 4, 8``, ``z^k`` rotated by the phase of its mean over the burst
    (the mean of ``z^k`` is large for a ``k``-fold symmetric constellation: BPSK at
    ``k = 2``, QPSK at 4, 8PSK at 8), as real and imaginary rows.

    Input ``(batch, 2, symbols)``; output ``(batch, 7, symbols)``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Features, shape ``(batch, 7, symbols)``, of bursts ``(batch, 2, symbols)``."""
        z = torch.complex(x[:, 0], x[:, 1])
        z = z / (z.abs().pow(2).mean(1, keepdim=True).sqrt() + 1e-6)
        rows = [z.abs().pow(2)]
        for k in (2, 4, 8):
            zk = z**k
            mean = zk.mean(1, keepdim=True)
            aligned = zk * (mean / (mean.abs() + 1e-6)).conj()
            rows += [aligned.real, aligned.imag]
        return torch.stack(rows, 1)


def model(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """The classifier: :class:`PhaseFreeFeatures`, two 1-D convolutions (16 channels,
    kernel 3) with ReLU, the mean over the burst, a linear layer to ``n_classes`` logits.
    No batch normalisation (record-level privacy can clip its per-example gradients).

    Parameters
    ----------
    input_shape
        ``(2, symbols)``: I and Q rows of one burst.
    n_classes
        Number of labels (4).
    """
    if len(input_shape) != 2 or input_shape[0] != 2:
        raise ValueError(f"takes bursts of shape (2, symbols), got {input_shape}")
    return nn.Sequential(
        PhaseFreeFeatures(),
        nn.Conv1d(7, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv1d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(16, n_classes),
    )
