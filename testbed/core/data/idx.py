"""Reader for the IDX format of MNIST and Fashion-MNIST (plain or gzipped)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np

#: IDX type codes -> numpy dtypes (big-endian on disk).
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class IdxFormatError(ValueError):
    """A file is not a well-formed IDX file."""


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (``.gz`` is decompressed transparently).

    Parameters
    ----------
    path
        File path.

    Returns
    -------
    numpy.ndarray
        Array with the file's shape, e.g. ``(n, 28, 28)`` ``uint8`` for images or
        ``(n,)`` for labels, in native byte order.

    Raises
    ------
    IdxFormatError
        On a bad magic number, unknown type code or a size that does not match the header.
    """
    p = Path(path)
    raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    if len(raw) < 4:
        raise IdxFormatError(f"{p}: too short for an IDX header ({len(raw)} bytes)")
    zero, type_code, ndim = int.from_bytes(raw[0:2], "big"), raw[2], raw[3]
    if zero != 0 or type_code not in _IDX_DTYPES or ndim < 1:
        raise IdxFormatError(
            f"{p}: bad IDX magic {raw[:4].hex()} (expected 0000 <type> <ndim>, "
            f"type in {[hex(t) for t in _IDX_DTYPES]})"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IdxFormatError(f"{p}: truncated header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IdxFormatError(
            f"{p}: header says shape {shape} ({expected} bytes) but {len(raw) - header} follow"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as IDX (gzipped when ``path`` ends in ``.gz``); for tests and tools."""
    arr = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_DTYPES.items()}
    native = arr.dtype.newbyteorder("=")
    if native not in codes:
        raise ValueError(f"dtype {arr.dtype} has no IDX type code")
    code = codes[native]
    header = bytes([0, 0, code, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    body = arr.astype(_IDX_DTYPES[code], copy=False).tobytes()
    blob = header + body
    p = Path(path)
    p.write_bytes(gzip.compress(blob) if p.suffix == ".gz" else blob)
