"""Reader for the CIFAR-10 "python version" batches (``cifar-10-batches-py``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"


class CifarFormatError(ValueError):
    """A file is not a CIFAR-10 python batch."""


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled batch.

    Returns
    -------
    images
        ``uint8``, shape ``(n, 3, 32, 32)`` (channels first, RGB).
    labels
        ``int64``, shape ``(n,)``, values in ``[0, 10)``.
    """
    p = Path(path)
    with p.open("rb") as fh:
        try:
            batch = pickle.load(fh, encoding="bytes")
        except Exception as exc:  # noqa: BLE001 - any unpickling failure is a format error
            raise CifarFormatError(f"{p}: not a CIFAR-10 python batch ({exc})") from exc
    if not isinstance(batch, dict):
        raise CifarFormatError(f"{p}: expected a dict, got {type(batch).__name__}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise CifarFormatError(f"{p}: missing 'data' or 'labels'")
    data = np.asarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise CifarFormatError(f"{p}: data has shape {data.shape}, expected (n, 3072)")
    y = np.asarray(labels, dtype=np.int64)
    if y.shape != (data.shape[0],):
        raise CifarFormatError(f"{p}: {y.shape[0]} labels for {data.shape[0]} images")
    return data.reshape(-1, 3, 32, 32), y


def read_cifar10(directory: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read all five training batches and the test batch from ``directory``.

    ``directory`` may be the ``cifar-10-batches-py`` folder itself or its parent.
    """
    d = Path(directory)
    if (d / "cifar-10-batches-py").is_dir():
        d = d / "cifar-10-batches-py"
    parts = [read_cifar_batch(d / name) for name in TRAIN_BATCHES]
    x_test, y_test = read_cifar_batch(d / TEST_BATCH)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return x_train, y_train, x_test, y_test
