"""The uplink encoder: differential -> clip -> (noise) -> (compress) -> scale -> symbols.

Each stage is a small function of one call shape; :class:`UplinkEncoder` chains them for one
device and round and returns the analog symbols plus the control-plane header.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_device.clipping import clip
from radio.analog import reals_to_symbols
from testbed.protocol import UploadHeader


@dataclass(frozen=True)
class UplinkSettings:
    """What the encoder does, fixed for a run (or per device from a plan).

    Attributes
    ----------
    clip_mode, clip_bound
        Clipping rule and Z (see :func:`edge_device.clipping.clip`).
    alpha
        Power scaling; ``None`` normalises each upload to unit mean symbol power (no-DP
        FedAvg only: a data-dependent alpha is not allowed with DP).
    """

    clip_mode: str = "coordinate"
    clip_bound: float = 5.0
    alpha: float | None = None


@dataclass(frozen=True)
class EncodedUpload:
    """One device's upload.

    Attributes
    ----------
    header
        Control-plane side information.
    symbols
        ``complex128``, shape ``(ceil(n_values / 2),)``: ``alpha * values`` packed two per
        symbol (symbol-power units).
    values
        ``float64``, shape ``(n_values,)``: what was scaled onto the air (before alpha).
    """

    header: UploadHeader
    symbols: np.ndarray
    values: np.ndarray

    @property
    def symbol_energy(self) -> float:
        """``sum |x_k|^2`` in symbol-power units x symbols (energy / (P_ref / R_s))."""
        return float(np.sum(np.abs(self.symbols) ** 2))


def unit_power_alpha(values: np.ndarray) -> float:
    """Alpha that gives the packed symbols unit mean power (1.0 for an all-zero vector)."""
    n_sym = (values.size + 1) // 2
    energy = float(np.sum(values.astype(np.float64) ** 2))
    return float(np.sqrt(n_sym / energy)) if energy > 0 else 1.0


class UplinkEncoder:
    """Encodes a device's local differential into analog symbols.

    Parameters
    ----------
    settings
        The stages' parameters.
    d
        Model size.
    """

    def __init__(self, settings: UplinkSettings, d: int) -> None:
        if d < 1:
            raise ValueError(f"d must be >= 1, got {d}")
        self.settings = settings
        self.d = d

    def encode(self, g: np.ndarray, *, device: int, round_index: int) -> EncodedUpload:
        """Encode ``g`` (``(d,)``) for ``device`` in ``round_index``."""
        g = np.asarray(g, dtype=np.float64)
        if g.shape != (self.d,):
            raise ValueError(f"differential shape {g.shape}, expected ({self.d},)")
        s = self.settings
        values = clip(g, mode=s.clip_mode, bound=s.clip_bound)
        alpha = unit_power_alpha(values) if s.alpha is None else float(s.alpha)
        header = UploadHeader(
            device=device, round_index=round_index, d=self.d, n_values=values.size, alpha=alpha
        )
        return EncodedUpload(header=header, symbols=alpha * reals_to_symbols(values), values=values)
