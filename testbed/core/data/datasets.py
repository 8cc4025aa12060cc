"""Data sets as numpy arrays: Fashion-MNIST / MNIST (IDX) and CIFAR-10 (python batches).

Nothing is downloaded: files are read from a directory the user provides (Fashion-MNIST
defaults to Debian's ``dataset-fashion-mnist`` at ``/usr/share/datasets/fashion-mnist``).
Each split is kept in the data cache (:mod:`testbed.core.data.cache`, keyed by its files'
sha256) as its 8-bit pixel codes and a table of each code's normalised value
(:mod:`testbed.core.data.coded`), and memory-mapped from there by later runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.data.cache import cached_arrays
from testbed.core.data.cifar import TEST_BATCH, TRAIN_BATCHES, read_cifar_batch
from testbed.core.data.coded import CodedImages, take_rows
from testbed.core.data.idx import read_idx

#: IDX file stems; each may appear as ``stem``, ``stem.gz`` or with ``-idx`` written ``.idx``.
IDX_STEMS = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

#: Per-channel normalisation (mean, std) of each data set's training images in [0, 1].
NORMALISATION = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


class DatasetNotFoundError(FileNotFoundError):
    """The data set's files are not where the config says; the message says how to fix it."""


@dataclass(frozen=True)
class Dataset:
    """A classification data set.

    Attributes
    ----------
    x_train, x_test
        ``float32``, shape ``(n, ...)``: ``(n, channels, height, width)`` normalised per
        channel for the shipped image sets, kept coded (:class:`CodedImages`: indexing
        decodes the rows asked, ``np.asarray`` the whole array); any sample shape, as its
        loader returned it, for a data set by import string
        (:mod:`testbed.core.extensions`).
    y_train, y_test
        ``int64``, shape ``(n,)``.
    n_classes
        Number of labels (10 for all shipped data sets; the largest label + 1 for one by
        import string).
    """

    name: str
    x_train: np.ndarray | CodedImages
    y_train: np.ndarray
    x_test: np.ndarray | CodedImages
    y_test: np.ndarray
    n_classes: int = 10


def _idx_candidates(directory: Path, stem: str) -> list[Path]:
    dotted = stem.replace("-idx", ".idx")
    return [directory / name for s in (stem, dotted) for name in (s, f"{s}.gz")]


def _find_idx(directory: Path, stem: str, dataset: str) -> Path:
    for candidate in _idx_candidates(directory, stem):
        if candidate.is_file():
            return candidate
    hint = (
        "install Debian's package 'dataset-fashion-mnist' (make run does) or set data_dir"
        if dataset == "fashion-mnist"
        else "download the IDX files yourself and point data_dir at their folder"
    )
    raise DatasetNotFoundError(
        f"{dataset}: no '{stem}' (or .gz) in '{directory}'. Looked for: "
        + ", ".join(str(c) for c in _idx_candidates(directory, stem))
        + f". To provide it: {hint}."
    )


def _normalise(images: np.ndarray, dataset: str) -> np.ndarray:
    mean, std = NORMALISATION[dataset]
    x = images.astype(np.float32) / 255.0
    m = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return (x - m) / s


def load_dataset(name: str, data_dir: str | Path | None) -> Dataset:
    """Load ``fashion-mnist``, ``mnist`` or ``cifar10`` from ``data_dir``.

    Raises
    ------
    DatasetNotFoundError
        When the directory or a file is missing, naming every path tried and how to
        provide the data.
    """
    return _load(name, data_dir, ("train", "test"))


def load_test_set(name: str, data_dir: str | Path | None) -> Dataset:
    """The test split only (``t10k-*`` IDX files, or CIFAR-10's ``test_batch``); the
    training arrays are empty: what an aggregator evaluates on, on a host without training
    data.

    Raises
    ------
    DatasetNotFoundError
        As :func:`load_dataset`, for the test files.
    """
    return _load(name, data_dir, ("test",))


def load_train_shard(name: str, data_dir: str | Path) -> Dataset:
    """One device's own training data: the training files in ``data_dir`` and nothing else
    (``train-images``/``train-labels`` IDX files holding its rows; for CIFAR-10, the
    ``data_batch_*`` files present, at least one). The test arrays are empty. Normalised as
    the whole data set is (:data:`NORMALISATION`), so a shard written from the full set
    trains exactly as that device's part of it.

    Raises
    ------
    DatasetNotFoundError
        The directory or its training files are missing.
    """
    return _load(name, data_dir, ("train",), shard=True)


def _load(name: str, data_dir: str | Path | None, splits: tuple[str, ...], *,
          shard: bool = False) -> Dataset:
    """The splits of ``name`` in ``data_dir`` (the others empty)."""
    if name not in NORMALISATION:
        raise ValueError(f"dataset: got {name!r}; allowed: {sorted(NORMALISATION)}")
    if data_dir is None:
        raise DatasetNotFoundError(
            f"{name}: no data_dir given and there is no default location for it; "
            f"set data_dir to the folder holding its files (--set data_dir=/path)"
        )
    directory = Path(data_dir).expanduser()
    if not directory.is_dir():
        raise DatasetNotFoundError(
            f"{name}: data_dir '{directory}' is not a directory. "
            + (
                "Install Debian's 'dataset-fashion-mnist' (make run does) or set data_dir."
                if name == "fashion-mnist"
                else "Set data_dir to the folder holding the files."
            )
        )
    if name == "cifar10":
        folder = directory / "cifar-10-batches-py"
        folder = folder if folder.is_dir() else directory
        wanted = ([*TRAIN_BATCHES] if "train" in splits else []) + (
            [TEST_BATCH] if "test" in splits else [])
        present = [n for n in TRAIN_BATCHES if (folder / n).is_file()]
        missing = [n for n in wanted if not (folder / n).is_file()]
        if shard:  # a device's own batches: whichever it holds
            missing = [] if present else ["data_batch_* (at least one)"]
        if missing:
            raise DatasetNotFoundError(
                f"cifar10: missing {missing} in '{folder}'. Provide the CIFAR-10 python "
                "batches (cifar-10-batches-py: data_batch_1..5, test_batch) and set data_dir."
            )
        sources = {"train": [folder / n for n in (present if shard else TRAIN_BATCHES)],
                   "test": [folder / TEST_BATCH]}
    else:  # images, then labels
        sources = {split: [_find_idx(directory, IDX_STEMS[f"{xy}_{split}"], name)
                           for xy in ("x", "y")]
                   for split in ("train", "test") if split in splits}
    arrays = {split: _normalised_split(name, directory, split, sources[split])
              for split in ("train", "test") if split in splits}
    read = next(iter(arrays.values()))["x"]
    # the splits not read: empty, of the same shape
    empty = {"x": take_rows(read, slice(0, 0)), "y": np.zeros(0, dtype=np.int64)}
    train, test = arrays.get("train", empty), arrays.get("test", empty)
    return Dataset(name=name, x_train=train["x"], y_train=train["y"], x_test=test["x"],
                   y_test=test["y"])


def _normalised_split(name: str, directory: Path, split: str,
                      files: list[Path]) -> dict[str, Any]:
    """One split read from ``files`` (IDX: images, labels; CIFAR-10: its batches):
    ``{"x": the normalised images (coded: :class:`~testbed.core.data.coded.CodedImages`,
    decoding to :func:`_normalise`'s float32 values), "y": int64 labels}``, through the data
    cache (:mod:`testbed.core.data.cache`, keyed by the files' sha256 and
    :data:`NORMALISATION`).

    Raises
    ------
    ValueError
        The files hold different numbers of images and labels (or are malformed).
    """

    def build() -> dict[str, np.ndarray]:
        if name == "cifar10":
            parts = [read_cifar_batch(f) for f in files]
            x = np.concatenate([x for x, _ in parts])
            y = np.concatenate([y for _, y in parts])
        else:
            x, y = read_idx(files[0])[:, None, :, :], read_idx(files[1])
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{name}: image and label counts differ in '{directory}'")
        if x.dtype != np.uint8:  # not 8-bit pixels (an IDX file of another type): float32
            return {"x": _normalise(x, name), "y": y.astype(np.int64)}
        coded = CodedImages.of(np.ascontiguousarray(x), lambda v: _normalise(v, name))
        return {"codes": coded.codes, "lut": coded.lut, "y": y.astype(np.int64)}

    mean, std = NORMALISATION[name]
    params = {"dataset": name, "split": split, "mean": list(mean), "std": list(std),
              "images": "uint8 codes and a float32 table per channel"}
    arrays = cached_arrays(f"{name}-{split}-coded", params, files, build)
    if "codes" not in arrays:
        return arrays
    return {"x": CodedImages(arrays["codes"], arrays["lut"]), "y": arrays["y"]}
