"""Images kept as their 8-bit codes and decoded when read: a quarter of the memory of the
normalised ``float32`` arrays, the same values bit for bit.

Every shipped image set (MNIST, Fashion-MNIST, CIFAR-10) stores 8-bit pixels, and its
normalised value is a function of the pixel and its channel alone
(:func:`testbed.core.data.datasets._normalise`: ``(v / 255 - mean_c) / std_c`` in
``float32``). So the normalised image is ``lut[c, v]`` with ``lut`` that function applied to
the 256 codes of each channel, by the same ``float32`` operations (IEEE division and
subtraction round the same way element by element, however they are vectorised): the
decoded values are those of normalising the whole array, bit for bit
(``tests/test_data_coded.py``). Fashion-MNIST's training images take 47 MB instead of
188 MB, mapped from the data cache and shared by the processes of a run.

:class:`CodedImages` reads like the ``float32`` array for what the runs do with one:
``shape``, ``len``, ``dtype`` (``float32``, what it decodes to), and indexing, which returns
the decoded ``float32`` values of the rows asked (a slice of test images to evaluate, a
device's rows). :meth:`CodedImages.rows` selects rows without decoding them (a subset of the
training set, a device's shard). ``np.asarray`` decodes the whole array (what a consumer
that needs one ``float32`` array gets). Trainers gather a batch's codes and decode it
(:class:`edge_device.trainer.DeviceData`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: Codes of an 8-bit pixel.
LEVELS = 256


class CodedImages:
    """Images ``(n, C, H, W)`` as ``uint8`` codes and a ``float32`` table per channel.

    Parameters
    ----------
    codes
        ``uint8``, shape ``(n, C, H, W)`` (any sample shape whose axis 1 is the channel).
    lut
        ``float32``, shape ``(C, 256)``: channel ``c``'s value of code ``v`` is
        ``lut[c, v]``.
    """

    dtype = np.dtype(np.float32)

    def __init__(self, codes: np.ndarray, lut: np.ndarray) -> None:
        if codes.dtype != np.uint8 or codes.ndim < 2:
            raise ValueError(f"coded images: codes must be uint8 (n, C, ...), got "
                             f"{codes.dtype} {codes.shape}")
        if lut.dtype != np.float32 or lut.shape != (codes.shape[1], LEVELS):
            raise ValueError(f"coded images: lut must be float32 ({codes.shape[1]}, "
                             f"{LEVELS}), got {lut.dtype} {lut.shape}")
        self.codes = codes
        self.lut = lut

    @classmethod
    def of(cls, codes: np.ndarray, normalise: Callable[[np.ndarray], np.ndarray]
           ) -> CodedImages:
        """``codes`` with the table that ``normalise`` (``uint8 (n, C, ...)`` to
        ``float32``, element by element per channel) gives each channel's 256 codes."""
        channels = codes.shape[1]
        every = np.broadcast_to(np.arange(LEVELS, dtype=np.uint8), (1, channels, LEVELS))
        lut = normalise(np.ascontiguousarray(every).reshape(1, channels, 1, LEVELS))
        return cls(codes, np.ascontiguousarray(lut.reshape(channels, LEVELS), np.float32))

    @property
    def shape(self) -> tuple[int, ...]:
        """``(n, C, H, W)``, as the decoded array's."""
        return tuple(self.codes.shape)

    @property
    def ndim(self) -> int:
        return self.codes.ndim

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def __repr__(self) -> str:
        return f"CodedImages(shape={self.shape}, channels={self.lut.shape[0]})"

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """``float32`` values of ``codes`` (``uint8``, ``(m, C, ...)``, this set's layout)."""
        if self.lut.shape[0] == 1:  # one channel: a plain lookup (np.take, 4x fancy indexing)
            return np.take(self.lut[0], codes)
        channel = np.arange(self.lut.shape[0], dtype=np.intp).reshape(
            1, -1, *([1] * (codes.ndim - 2)))
        return self.lut[channel, codes]

    def __getitem__(self, key: Any) -> np.ndarray:
        """The decoded ``float32`` values of ``codes[key]`` (rows, a slice, an index)."""
        picked = self.codes[key]
        if isinstance(key, int | np.integer):  # one image: its (C, H, W)
            return self.decode(picked[None])[0]
        if picked.ndim != self.codes.ndim:
            raise IndexError("coded images: index rows (the first axis) only")
        return self.decode(picked)

    def rows(self, index: Any) -> CodedImages:
        """The images ``index`` (rows: a slice, integers or a mask), still coded."""
        picked = self.codes[index]
        if picked.ndim != self.codes.ndim:
            raise IndexError("coded images: select rows (the first axis) only")
        return CodedImages(picked, self.lut)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.decode(self.codes)
        return out if dtype is None else out.astype(dtype, copy=False)


def float32_images(x: Any) -> np.ndarray | CodedImages:
    """``x`` as ``float32`` images: coded images as they are (decoded where read), anything
    else as a ``float32`` array."""
    return x if isinstance(x, CodedImages) else np.asarray(x, dtype=np.float32)


def take_rows(x: np.ndarray | CodedImages, index: Any) -> np.ndarray | CodedImages:
    """Rows ``index`` of ``x``, coded images staying coded."""
    return x.rows(index) if isinstance(x, CodedImages) else x[index]


def concatenate(parts: list[np.ndarray | CodedImages]) -> np.ndarray | CodedImages:
    """The rows of ``parts`` in order: coded when every part is coded with one table,
    else decoded ``float32``."""
    if parts and all(isinstance(p, CodedImages) for p in parts):
        coded = [p for p in parts if isinstance(p, CodedImages)]
        if all(np.array_equal(p.lut, coded[0].lut) for p in coded):
            return CodedImages(np.concatenate([p.codes for p in coded]), coded[0].lut)
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
