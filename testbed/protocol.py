"""Control-plane messages shared by edge devices and the aggregator.

Only side information travels here; model-update values travel over the link as analog
symbols. This module imports nothing else of the project.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class UploadHeader:
    """Side information of one upload, sent on the control plane.

    Attributes
    ----------
    device, round_index
        Who and when.
    d
        Model size (length of the differential).
    n_values
        Real values carried by the symbols (``l`` when sparsified, else ``d``).
    alpha
        Power scaling applied to the values before the air (``x = alpha * values``).
    sparsified
        Whether the values sit at the mask positions derived from (run secret, device,
        round) and are scaled by ``d / l``.
    quant_levels
        Q when the values were stochastically quantized, else ``None``.
    quant_norm
        The quantizer's scale (l2 norm of the sparse vector, 003 eq. 7), else ``None``.
    transmitted
        ``False`` when the device sat the round out (budget exhausted); no symbols follow.
    """

    device: int
    round_index: int
    d: int
    n_values: int
    alpha: float
    sparsified: bool = False
    quant_levels: int | None = None
    quant_norm: float | None = None
    transmitted: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UploadHeader:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        return cls(**data)
