"""Set the thread count of the OpenBLAS libraries loaded in this process.

numpy (and scipy) ship their own OpenBLAS, which starts one thread per core for a
``dot`` as small as ``np.linalg.norm`` of a 21,840-vector. On a machine whose cores are
busy (the devices' training, other work) those threads wait for each other: measured on
the 2-core test machine, one ``norm`` took 6 ms instead of 0.06 ms, 14 % of a default
round in the uplink encoder alone. A run therefore gives BLAS the same thread count as
torch (``torch_threads``), in its own process and in every training worker. This is what
``OPENBLAS_NUM_THREADS`` does, but it can be set after numpy is imported.

Linux only (the libraries are found in ``/proc/self/maps``); elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

#: Setter symbols of the OpenBLAS builds seen in wheels (numpy/scipy's 64-bit-int
#: ``scipy_openblas``, then a plain build).
SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS shared libraries mapped into this process."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    paths = {line.split()[-1] for line in lines if "openblas" in line.rsplit("/", 1)[-1]}
    return sorted(p for p in paths if p.startswith("/"))


def limit_blas_threads(n: int) -> list[str]:
    """Give every loaded OpenBLAS ``n`` threads (``>= 1``); returns the libraries set."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: got {n!r}; allowed: an integer >= 1")
    done = []
    for path in loaded_openblas():
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same handle, nothing new
        except OSError:
            continue
        for name in SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(n)
                done.append(path)
                break
    return done
