"""Split a training set across devices: IID, or the non-IID split of 003 Section VI-A.

Non-IID: every device gets ``D / N`` samples, a fraction ``dominant_fraction`` (0.75 in
the paper) from one dominant label and the rest spread over the other labels (evenly in the
paper's balanced setting; see :func:`noniid_counts`).
Device ``i``'s dominant label is ``i mod n_classes``.
"""

from __future__ import annotations

import numpy as np


def iid_partition(n_samples: int, devices: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal ``floor(n_samples / devices)`` indices to each device.

    Returns
    -------
    list of numpy.ndarray
        ``devices`` arrays of ``int64`` sample indices, disjoint.
    """
    if devices < 1 or n_samples < devices:
        raise ValueError(f"need 1 <= devices <= n_samples, got {devices} and {n_samples}")
    per = n_samples // devices
    perm = rng.permutation(n_samples)
    return [np.sort(perm[i * per : (i + 1) * per]) for i in range(devices)]


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split into integers proportional to ``weights`` (largest remainder)."""
    w = np.asarray(weights, dtype=np.float64)
    if total <= 0 or w.sum() <= 0:
        return np.zeros(w.size, dtype=np.int64)
    exact = total * w / w.sum()
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:short]] += 1
    return out


def noniid_counts(
    devices: int,
    n_classes: int,
    per_device: int,
    dominant_fraction: float,
    supply: np.ndarray | None = None,
) -> np.ndarray:
    """Samples wanted per device and label, shape ``(devices, n_classes)``.

    Each device takes ``round(dominant_fraction * per_device)`` from its dominant label;
    the rest is spread over the other labels in proportion to what those labels have left
    after the dominant shares (evenly when labels are balanced and every label is some
    device's dominant one, as in the paper's N = 10 setting). ``supply`` is the number of
    samples per label (balanced and unlimited when ``None``).
    """
    sup = (
        np.full(n_classes, devices * per_device, dtype=np.int64)
        if supply is None
        else np.asarray(supply, dtype=np.int64)
    )
    counts = np.zeros((devices, n_classes), dtype=np.int64)
    n_dom = int(round(dominant_fraction * per_device))
    dominant = np.arange(devices) % n_classes
    counts[np.arange(devices), dominant] = n_dom
    left = np.maximum(sup - counts.sum(axis=0), 0)
    if supply is None:
        left = np.ones(n_classes, dtype=np.int64)
    for i in range(devices):
        weights = left.astype(np.float64).copy()
        weights[dominant[i]] = 0.0
        if weights.sum() == 0:
            weights = np.ones(n_classes)
            weights[dominant[i]] = 0.0
        # Rotate tie-breaking so no label always receives the rounding extra.
        order = np.roll(np.arange(n_classes), -i)
        counts[i, order] += _largest_remainder(per_device - n_dom, weights[order])
    return counts


def noniid_partition(
    labels: np.ndarray,
    devices: int,
    rng: np.random.Generator,
    *,
    dominant_fraction: float = 0.75,
    n_classes: int | None = None,
) -> list[np.ndarray]:
    """The paper's non-IID split; disjoint, without replacement.

    Parameters
    ----------
    labels
        ``int``, shape ``(D,)``.
    devices
        N.
    rng
        Generator (data-split stream).
    dominant_fraction
        Share of each device's samples from its dominant label.

    Returns
    -------
    list of numpy.ndarray
        ``devices`` arrays of sample indices. When a label has fewer samples than the
        split asks for, every device's share of that label shrinks proportionally (so a
        device may get slightly fewer than ``D / N``); the dominant share is then reported
        by :func:`label_fractions`.
    """
    y = np.asarray(labels)
    k = int(n_classes if n_classes is not None else y.max() + 1)
    if not 0 < dominant_fraction <= 1:
        raise ValueError(f"dominant_fraction must be in (0, 1], got {dominant_fraction}")
    if devices < 1 or y.size < devices:
        raise ValueError(f"need 1 <= devices <= samples, got {devices} and {y.size}")
    per_device = y.size // devices
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(k)]
    supply = np.array([p.size for p in pools], dtype=np.int64)
    want = noniid_counts(devices, k, per_device, dominant_fraction, supply)
    for c in range(k):
        demand = int(want[:, c].sum())
        if demand > pools[c].size:
            want[:, c] = np.floor(want[:, c] * pools[c].size / demand).astype(np.int64)
    shards: list[list[np.ndarray]] = [[] for _ in range(devices)]
    for c in range(k):
        start = 0
        for i in range(devices):
            n = int(want[i, c])
            shards[i].append(pools[c][start : start + n])
            start += n
    return [np.sort(np.concatenate(s)) for s in shards]


def label_fractions(labels: np.ndarray, indices: np.ndarray, n_classes: int) -> np.ndarray:
    """Fraction of each label among ``labels[indices]``, shape ``(n_classes,)``."""
    counts = np.bincount(np.asarray(labels)[indices], minlength=n_classes)
    return counts / max(1, counts.sum())
