"""A disk cache of prepared data arrays (the normalised splits of a data set), memory-mapped
when read back.

Decompressing and normalising Fashion-MNIST costs a run 0.8 s; read from this cache, its
splits cost the sha256 of their source files (25 ms) and one checksum pass over the cached
arrays (10 ms), and the pages are shared by every process that maps them.

* Where: ``$TESTBED_CACHE_DIR`` (an empty value turns the cache off), else
  ``$XDG_CACHE_HOME/dpfl-testbed``, else ``~/.cache/dpfl-testbed``; entries under ``data/``.
* Key: the sha256 of every source file's bytes, together with everything else the arrays
  depend on (the data set, the split, the normalisation parameters, this format's version
  and the byte order), so a changed file or parameter is a different entry.
* Entry: one ``.npy`` file per array and a JSON manifest with each array's shape, dtype and
  checksum (:func:`_digest`); every file is written to a temporary name in the same folder
  and renamed into place (``os.replace``), the manifest last. Processes that race on one
  entry write the same bytes; a reader never sees a partly written file.
* Read: the arrays are memory-mapped copy-on-write (writable, the file never changes) and
  checked against the manifest; a missing, truncated or corrupted entry is built again and
  rewritten. A folder that cannot be written leaves the built arrays serving the run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: Environment variable naming the cache folder; set and empty: no cache.
CACHE_ENV = "TESTBED_CACHE_DIR"
#: Version of the entry layout and of what the arrays hold; a change makes new keys.
FORMAT = 1
#: Bytes hashed per read of a source file.
_CHUNK = 1 << 22
#: Bytes summed into one word of an array's checksum (:func:`_digest`).
_PAGE = 4096


def cache_root() -> Path | None:
    """The cache folder (it may not exist yet); ``None`` when the cache is turned off.

    ``$TESTBED_CACHE_DIR`` (empty: off), else ``$XDG_CACHE_HOME/dpfl-testbed`` (an absolute
    ``XDG_CACHE_HOME`` only, as the XDG specification says), else
    ``~/.cache/dpfl-testbed``.
    """
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return Path(value).expanduser() if value else None
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "dpfl-testbed"


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def entry_key(kind: str, params: Mapping[str, Any], sources: Iterable[str | Path]) -> str:
    """The hex key of an entry: ``kind``, ``params`` (JSON-serialisable) and the sha256 of
    each source file, in order."""
    spec = {
        "format": FORMAT,
        "byteorder": sys.byteorder,
        "kind": kind,
        "params": params,
        "sources": [file_sha256(p) for p in sources],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def cached_arrays(
    kind: str,
    params: Mapping[str, Any],
    sources: Iterable[str | Path],
    build: Callable[[], dict[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """The arrays ``build()`` returns, from the cache when an intact entry is there.

    Parameters
    ----------
    kind
        What the arrays are, part of the entry's file names (``fashion-mnist-train``).
    params
        Everything besides the source files the arrays depend on (JSON-serialisable).
    sources
        The files ``build`` reads.
    build
        Computes the arrays (array names: letters, digits, ``_``, ``-``); called on a miss,
        a damaged entry or with the cache off.

    Returns
    -------
    dict of numpy.ndarray
        Bit-for-bit ``build()``'s arrays; read from the cache, memory-mapped copy-on-write.
    """
    root = cache_root()
    if root is None:
        return build()
    stem = root / "data" / f"{kind}-{entry_key(kind, params, sources)[:40]}"
    arrays = read_entry(stem)
    if arrays is not None:
        return arrays
    arrays = build()
    with contextlib.suppress(OSError):  # cannot write there: the built arrays serve
        write_entry(stem, arrays)
    return arrays


def _digest(array: np.ndarray) -> int:
    """Checksum of an array's bytes in C order: the CRC-32 of the 64-bit sums of its 4 KiB
    pages, then of the bytes after the last whole page.

    A changed word changes its page's sum, a page moved or lost changes the sequence; and
    it takes a sixth of the time of a CRC-32 over the bytes (10 ms for Fashion-MNIST's
    training images).
    """
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    whole = raw.size - raw.size % _PAGE
    sums = raw[:whole].view(np.uint64).reshape(-1, _PAGE // 8).sum(axis=1, dtype=np.uint64)
    return zlib.crc32(raw[whole:].tobytes(), zlib.crc32(sums.tobytes()))


def _manifest_path(stem: Path) -> Path:
    return stem.with_name(f"{stem.name}.json")


def read_entry(stem: Path) -> dict[str, np.ndarray] | None:
    """The arrays of the entry at ``stem`` checked against its manifest (shape, dtype,
    checksum); ``None`` when it is missing, incomplete or damaged."""
    try:
        manifest = json.loads(_manifest_path(stem).read_text())
        out = {}
        for name, meta in manifest["arrays"].items():
            shape = tuple(int(n) for n in meta["shape"])
            path = stem.with_name(meta["file"])
            mapped = np.load(path, mmap_mode="c" if np.prod(shape) > 0 else None,
                             allow_pickle=False)
            if mapped.shape != shape or mapped.dtype.str != meta["dtype"] \
                    or _digest(mapped) != int(meta["digest"]):
                return None
            out[name] = np.asarray(mapped)  # a plain array on the mapped bytes
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError):
        return None


def _replace_into(path: Path, write: Callable[[Any], None]) -> None:
    """Write a file through ``write(file)`` under a temporary name beside ``path``, then
    rename it to ``path`` (atomic on one file system); the temporary file never stays."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)  # no fsync: a file a crash leaves damaged fails its check and is rebuilt
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_entry(stem: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` as the entry at ``stem``: one ``<stem>.<name>.npy`` each, then the
    manifest ``<stem>.json``.

    Raises
    ------
    OSError
        The folder cannot be created or written (nothing half-written is left).
    """
    stem.parent.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format": FORMAT, "arrays": {}}
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        path = stem.with_name(f"{stem.name}.{name}.npy")
        _replace_into(path, functools.partial(np.save, arr=array, allow_pickle=False))
        manifest["arrays"][name] = {"file": path.name, "shape": list(array.shape),
                                    "dtype": array.dtype.str, "digest": _digest(array)}
    text = json.dumps(manifest, indent=1).encode()
    _replace_into(_manifest_path(stem), lambda f: f.write(text))
