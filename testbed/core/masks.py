"""Sparsification masks derived from (run secret, device, round).

Shared by the edge device (which sends the ``l`` values at these positions) and the
aggregator (which puts received values back there), so it lives in the shared core.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

#: Domain-separation tag of the mask derivation; a new derivation gets a new tag.
_MASK_TAG = b"dpfl-testbed/sparsify-mask/v1"


def sparsify_mask(run_secret: str, device: int, round_index: int, d: int, l: int) -> np.ndarray:
    """Indices of the ``l`` coordinates a device sends in a round.

    The seed is ``HMAC-SHA256(key=run_secret, msg=tag | device | round | d | l)``, so both
    ends derive the same mask and nobody without the run secret can predict it. The mask is
    uniformly random over the ``l``-subsets of ``range(d)`` (``Generator.choice`` without
    replacement) and is independent of the data.

    Parameters
    ----------
    run_secret
        The run's secret (non-empty string, e.g. from ``testbed.core.seeding.new_run_secret``).
    device, round_index
        Device index and global round index, both ``>= 0``.
    d
        Model size (``>= 1``).
    l
        Number of coordinates kept, ``1 <= l <= d``.

    Returns
    -------
    numpy.ndarray
        ``int64``, shape ``(l,)``, sorted, distinct, in ``[0, d)``.
    """
    if not isinstance(run_secret, str) or not run_secret:
        raise ValueError("sparsify_mask: run_secret must be a non-empty string")
    for name, value in (("device", device), ("round_index", round_index)):
        if not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"sparsify_mask: {name}={value!r} must be an integer >= 0")
    for name, value in (("d", d), ("l", l)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"sparsify_mask: {name}={value!r} must be an integer")
    if d < 1 or not 1 <= l <= d:
        raise ValueError(f"sparsify_mask: need 1 <= l <= d, got l={l}, d={d}")
    if l == d:
        return np.arange(d, dtype=np.int64)
    msg = b"|".join(
        [_MASK_TAG, str(int(device)).encode(), str(int(round_index)).encode(),
         str(int(d)).encode(), str(int(l)).encode()]
    )
    digest = hmac.new(run_secret.encode("utf-8"), msg, hashlib.sha256).digest()
    seed = int.from_bytes(digest, "big")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    idx = rng.choice(d, size=l, replace=False, shuffle=False)
    return np.sort(idx.astype(np.int64))


