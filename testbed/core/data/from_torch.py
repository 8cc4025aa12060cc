"""Arrays from a map-style ``torch.utils.data.Dataset`` (what a lab's loader may return).

No torch import: any object with ``__len__`` and ``__getitem__`` whose items are
``(sample, label)`` pairs is read, a sample being an array, a tensor (``numpy()`` on the CPU)
or anything ``numpy.asarray`` takes, a label an integer (or a 0-d tensor / array).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_map_dataset(obj: Any) -> bool:
    """Whether ``obj`` looks like a map-style data set (not a numpy array)."""
    return (not isinstance(obj, np.ndarray) and hasattr(obj, "__len__")
            and hasattr(obj, "__getitem__"))


def _as_array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def dataset_arrays(ds: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x (n, ...), y (n,) int64)`` of every item of ``ds``, in index order.

    Raises
    ------
    ValueError
        An item that is not a ``(sample, label)`` pair, samples of different shapes, or a
        label that is not an integer (``what`` names the split in the message).
    """
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for i in range(len(ds)):
        item = ds[i]
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ValueError(f"{what}: item {i} is a {type(item).__name__}; expected a "
                             "(sample, label) pair")
        x, y = _as_array(item[0]), _as_array(item[1])
        if y.ndim != 0 or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{what}: item {i}'s label {item[1]!r} is not an integer")
        if xs and x.shape != xs[0].shape:
            raise ValueError(f"{what}: item {i} has shape {x.shape}, item 0 {xs[0].shape}")
        xs.append(x)
        ys.append(int(y))
    if not xs:
        return np.zeros((0, 1), dtype=np.float32), np.zeros(0, dtype=np.int64)
    return np.stack(xs), np.asarray(ys, dtype=np.int64)
