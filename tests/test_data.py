"""Data readers (on files the tests make) and the device partitions."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from testbed.core.data.cifar import CifarFormatError, read_cifar10
from testbed.core.data.datasets import DatasetNotFoundError, load_dataset
from testbed.core.data.idx import IdxFormatError, read_idx, write_idx
from testbed.core.data.partition import (
    iid_partition,
    label_fractions,
    noniid_counts,
    noniid_partition,
)
from tests.conftest import make_idx_dataset


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip(tmp_path: Path, suffix: str, dtype: type) -> None:
    arr = (np.arange(2 * 3 * 5) - 7).astype(dtype).reshape(2, 3, 5)
    path = tmp_path / f"a.idx{suffix}"
    write_idx(path, arr)
    back = read_idx(path)
    assert back.shape == arr.shape and back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, arr)


def test_idx_reads_big_endian_header_by_hand(tmp_path: Path) -> None:
    # Built byte by byte, independently of write_idx: 2 labels as int32 big-endian.
    raw = bytes([0, 0, 0x0C, 1]) + (2).to_bytes(4, "big") + (7).to_bytes(4, "big")
    raw += (-1).to_bytes(4, "big", signed=True)
    (tmp_path / "l").write_bytes(raw)
    np.testing.assert_array_equal(read_idx(tmp_path / "l"), [7, -1])


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"\x00", "too short"),
        (b"\x01\x00\x08\x01" + (1).to_bytes(4, "big") + b"\x00", "bad IDX magic"),
        (b"\x00\x00\x42\x01" + (1).to_bytes(4, "big") + b"\x00", "bad IDX magic"),
        (b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + b"\x00", "header says"),
    ],
)
def test_idx_malformed(tmp_path: Path, blob: bytes, match: str) -> None:
    (tmp_path / "f").write_bytes(blob)
    with pytest.raises(IdxFormatError, match=match):
        read_idx(tmp_path / "f")


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_shaped_dataset(tmp_path: Path, gz: bool) -> None:
    make_idx_dataset(tmp_path, n_train=50, n_test=20, gz=gz)
    data = load_dataset("mnist", tmp_path)
    assert data.x_train.shape == (50, 1, 28, 28) and data.x_train.dtype == np.float32
    assert data.y_test.shape == (20,) and data.y_test.dtype == np.int64
    assert set(np.unique(data.y_train)) <= set(range(10))


def test_missing_dataset_says_where_it_looked_and_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("fashion-mnist", tmp_path)
    msg = str(info.value)
    assert str(tmp_path) in msg and "train-images-idx3-ubyte" in msg
    assert "dataset-fashion-mnist" in msg
    with pytest.raises(DatasetNotFoundError, match="not a directory"):
        load_dataset("mnist", tmp_path / "nope")
    with pytest.raises(DatasetNotFoundError, match="no data_dir"):
        load_dataset("mnist", None)


def _write_cifar(directory: Path, n: int = 7) -> None:
    rng = np.random.default_rng(1)
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {
            b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            b"labels": list(rng.integers(0, 10, size=n)),
            b"batch_label": name.encode(),
        }
        with (directory / name).open("wb") as fh:
            pickle.dump(batch, fh)


def test_cifar_reader(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "cifar-10-batches-py")
    x_train, y_train, x_test, y_test = read_cifar10(tmp_path)
    assert x_train.shape == (35, 3, 32, 32) and x_test.shape == (7, 3, 32, 32)
    assert y_train.shape == (35,)
    # Channel-first layout: the first 1024 bytes of a row are the red plane.
    with (tmp_path / "cifar-10-batches-py" / "test_batch").open("rb") as fh:
        raw = pickle.load(fh)
    np.testing.assert_array_equal(x_test[0, 0].ravel(), raw[b"data"][0, :1024])
    data = load_dataset("cifar10", tmp_path)
    assert data.x_train.shape == (35, 3, 32, 32)


def test_cifar_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="data_batch_1"):
        load_dataset("cifar10", tmp_path)
    _write_cifar(tmp_path)
    (tmp_path / "test_batch").write_bytes(gzip.compress(b"not a pickle"))
    with pytest.raises(CifarFormatError):
        read_cifar10(tmp_path)


def test_iid_partition_is_disjoint_and_equal() -> None:
    parts = iid_partition(1000, 7, np.random.default_rng(0))
    assert all(len(p) == 1000 // 7 for p in parts)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)


@pytest.mark.parametrize(("devices", "frac"), [(10, 0.75), (20, 0.75), (5, 0.5), (10, 1.0)])
def test_noniid_proportions(devices: int, frac: float) -> None:
    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(10), 600)  # balanced, 6000 samples
    rng.shuffle(labels)
    parts = noniid_partition(labels, devices, rng, dominant_fraction=frac, n_classes=10)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "devices share samples"
    per_device = len(labels) // devices
    for i, p in enumerate(parts):
        assert abs(len(p) - per_device) <= 0.01 * per_device + 10
        fr = label_fractions(labels, p, 10)
        assert int(np.argmax(fr)) == i % 10
        assert fr[i % 10] == pytest.approx(frac, abs=0.01)
        others = np.delete(fr, i % 10)
        if frac < 1 and devices % 10 == 0:
            # balanced setting: the rest spread evenly over the other labels
            assert others.max() - others.min() <= 2 / len(p) + 1e-12


def test_noniid_counts_rows_sum_to_share() -> None:
    counts = noniid_counts(10, 10, 6000, 0.75)
    assert (counts.sum(axis=1) == 6000).all()
    assert (counts[np.arange(10), np.arange(10)] == 4500).all()


def test_partitions_are_seeded() -> None:
    labels = np.repeat(np.arange(10), 100)
    a = noniid_partition(labels, 10, np.random.default_rng(5))
    b = noniid_partition(labels, 10, np.random.default_rng(5))
    c = noniid_partition(labels, 10, np.random.default_rng(6))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
