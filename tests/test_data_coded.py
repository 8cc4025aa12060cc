"""Images kept as 8-bit codes and a table per channel: the normalised float32 values bit for
bit, wherever they are read (indexing, a trainer's batches, a whole array)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_device.trainer import DeviceData
from testbed.core.data.coded import CodedImages, concatenate, float32_images, take_rows
from testbed.core.data.datasets import NORMALISATION, _normalise


def _codes(n: int, channels: int, seed: int) -> np.ndarray:
    """``n`` random images with every code in every channel (the first 256 pixels)."""
    codes = np.random.default_rng(seed).integers(0, 256, (n, channels, 16, 16), np.uint8)
    codes.reshape(n, channels, -1)[0, :, :256] = np.arange(256, dtype=np.uint8)
    return codes


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", sorted(NORMALISATION))
def test_decoded_images_are_the_normalised_images_bit_for_bit(name: str) -> None:
    channels = len(NORMALISATION[name][0])
    codes = _codes(40, channels, seed=1)
    coded = CodedImages.of(codes, lambda v: _normalise(v, name))
    ref = _normalise(codes, name)
    assert coded.shape == ref.shape and coded.dtype == ref.dtype == np.float32
    assert np.array_equal(_bits(np.asarray(coded)), _bits(ref))
    assert np.array_equal(_bits(coded[3:9]), _bits(ref[3:9]))
    rows = np.array([7, 0, 7, 39])
    assert np.array_equal(_bits(coded[rows]), _bits(ref[rows]))
    assert np.array_equal(_bits(coded[5]), _bits(ref[5]))  # one image: its (C, H, W)
    kept = coded.rows(rows)
    assert isinstance(kept, CodedImages) and len(kept) == 4
    assert np.array_equal(_bits(np.asarray(kept)), _bits(ref[rows]))


def test_rows_concatenation_and_plain_arrays() -> None:
    coded = CodedImages.of(_codes(10, 1, seed=2), lambda v: _normalise(v, "mnist"))
    ref = np.asarray(coded)
    both = concatenate([coded.rows(slice(0, 4)), coded.rows(slice(4, 10))])
    assert isinstance(both, CodedImages) and np.array_equal(np.asarray(both), ref)
    other = CodedImages.of(_codes(3, 1, seed=3), lambda v: _normalise(v, "fashion-mnist"))
    mixed = concatenate([coded, other])  # two tables: decoded
    assert isinstance(mixed, np.ndarray) and mixed.shape == (13, 1, 16, 16)
    assert np.array_equal(mixed[10:], np.asarray(other))
    plain = np.ones((5, 1, 2, 2), np.float64)
    assert take_rows(plain, [1, 2]).shape == (2, 1, 2, 2)
    assert float32_images(plain).dtype == np.float32 and float32_images(coded) is coded
    assert len(take_rows(coded, slice(0, 0))) == 0


def test_bad_codes_tables_and_indexes_are_refused() -> None:
    codes = _codes(4, 1, seed=4)
    with pytest.raises(ValueError, match="codes must be uint8"):
        CodedImages(codes.astype(np.int16), np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError, match=r"lut must be float32 \(1, 256\)"):
        CodedImages(codes, np.zeros((3, 256), np.float32))
    coded = CodedImages(codes, np.zeros((1, 256), np.float32))
    with pytest.raises(IndexError, match="first axis"):
        coded.rows((slice(None), 0))


@pytest.mark.parametrize("channels", [1, 3])
def test_a_trainers_batches_decode_to_the_same_tensors(channels: int) -> None:
    name = "mnist" if channels == 1 else "cifar10"
    codes = _codes(30, channels, seed=5)
    coded = CodedImages.of(codes, lambda v: _normalise(v, name))
    plain = _normalise(codes, name)
    y = np.arange(30, dtype=np.int64) % 10
    index = np.array([3, 0, 29, 11, 11, 7])
    for a, b in ((DeviceData(coded, y), DeviceData(plain, y)),
                 (DeviceData(coded, y, index), DeviceData(plain, y, index))):
        rows = torch.tensor([0, 5, 2, 2])
        (xa, ya), (xb, yb) = a.batch(rows), b.batch(rows)
        assert xa.dtype == torch.float32 and torch.equal(ya, yb)
        assert np.array_equal(_bits(xa.numpy()), _bits(xb.numpy()))
        (sa, _), (sb, _) = a.span(1, 4), b.span(1, 4)
        assert np.array_equal(_bits(sa.numpy()), _bits(sb.numpy()))
    assert DeviceData(coded, y).x.dtype == torch.uint8  # kept as codes
