"""Decoding at the aggregator: channel inversion, undo alpha, place values (003 eq. 14)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from radio.analog import symbols_to_reals
from radio.link import Reception
from testbed.core.transport.protocol import UploadHeader

#: ``mask_for(header) -> indices`` of the transmitted coordinates (sparsified uploads).
MaskFn = Callable[[UploadHeader], np.ndarray]


def invert_channel(reception: Reception) -> np.ndarray:
    """Zero-forcing ``y / h`` per symbol with the gain the receiver knows, ``complex128``."""
    gain = reception.state.gain
    if gain.shape != reception.symbols.shape:
        raise ValueError(f"gain shape {gain.shape} != symbols shape {reception.symbols.shape}")
    if not gain.all():  # some gain == 0 (a complex value is false only when 0 + 0j)
        raise ValueError("channel gain is exactly zero for some symbol: cannot invert")
    return reception.symbols / gain


def decode_values(reception: Reception, header: UploadHeader) -> np.ndarray:
    """The transmitted values as estimated: ``Re/Im(y / h) / alpha``, shape ``(n_values,)``."""
    if header.alpha <= 0:
        raise ValueError(f"header alpha must be > 0, got {header.alpha}")
    return symbols_to_reals(invert_channel(reception), header.n_values) / header.alpha


def decode_differential(
    reception: Reception, header: UploadHeader, mask_for: MaskFn | None = None
) -> np.ndarray:
    """Estimate of the device's differential, ``float64``, shape ``(d,)``.

    Dense uploads are returned as decoded; sparsified ones are placed at the mask
    positions (the ``d / l`` scaling was applied by the sender) with zeros elsewhere.
    """
    values = decode_values(reception, header)
    if not header.sparsified:
        if header.n_values != header.d:
            raise ValueError(f"dense upload carries {header.n_values} values for d={header.d}")
        return values
    if mask_for is None:
        raise ValueError("sparsified upload but no mask function given")
    idx = mask_for(header)
    if idx.shape != (header.n_values,):
        raise ValueError(f"mask has {idx.shape} indices for {header.n_values} values")
    out = np.zeros(header.d, dtype=np.float64)
    out[idx] = values
    return out


def project_coordinates(g_hat: np.ndarray, bound: float) -> np.ndarray:
    """Clip every coordinate of a decoded differential to ``[-bound, bound]`` (new array).

    With per-coordinate clipping a sent value lies in ``[-(d/l) Z/sqrt(d), (d/l) Z/sqrt(d)]``
    before noise, so projecting the noisy estimate onto that box never moves it further
    from the truth coordinate-wise, and as post-processing of the received signal it costs
    no privacy. It trades a bias for a large cut in noise when the noise dominates.
    """
    if not bound > 0:
        raise ValueError(f"bound must be > 0, got {bound}")
    return np.clip(np.asarray(g_hat, dtype=np.float64), -bound, bound)
