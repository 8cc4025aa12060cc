"""The uplink encoder: differential -> clip -> (noise) -> (compress) -> scale -> symbols.

Each stage is a small function of one call shape; :class:`UplinkEncoder` chains them for one
device and round and returns the analog symbols plus the control-plane header.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from edge_device.clipping import clip
from edge_device.compression import Compressor
from radio.analog import reals_to_symbols
from testbed.core import noise
from testbed.core.compression_bounds import fixed_quantizer_scale
from testbed.core.transport.protocol import UploadHeader


@dataclass(frozen=True)
class UplinkSettings:
    """What the encoder does for one device, fixed for a run (or from a plan).

    Attributes
    ----------
    clip_mode, clip_bound
        Clipping rule and Z (see :func:`edge_device.clipping.clip`).
    alpha
        Power scaling; ``None`` normalises each upload to unit mean symbol power (no-DP
        FedAvg only: a data-dependent alpha is not allowed with DP).
    mechanism
        ``none``, ``before`` (Gaussian noise on the clipped differential, 003 Algorithm 1)
        or ``after`` (noise on the compressed vector, eq. 21: a discrete Gaussian on the
        quantizer grid when quantizing, else Gaussian).
    sigma
        Artificial noise std per coordinate (units of the vector it is added to).
    l
        Coordinates sent (``None`` or ``d``: no sparsification).
    levels
        Quantization levels Q (``None``: no quantization).
    quantizer_scale
        ``norm``: the l2 norm of the sparse vector, sent as side information (eq. 7);
        ``fixed``: the public bound ``Z sqrt(d / l)`` (coordinate clipping) or ``Z d / l``.
    """

    clip_mode: str = "coordinate"
    clip_bound: float = 5.0
    alpha: float | None = None
    mechanism: str = "none"
    sigma: float = 0.0
    l: int | None = None
    levels: int | None = None
    quantizer_scale: str = "norm"


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
    energy = float(np.sum(np.asarray(values, dtype=np.float64) ** 2))
    return float(np.sqrt(n_sym / energy)) if energy > 0 else 1.0


class UplinkEncoder:
    """Encodes a device's local differential into analog symbols.

    Parameters
    ----------
    settings
        The stages' parameters.
    d
        Model size.
    run_secret
        Secret from which the sparsification masks derive (shared with the aggregator).
    """

    def __init__(self, settings: UplinkSettings, d: int, run_secret: str = "") -> None:
        if d < 1:
            raise ValueError(f"d must be >= 1, got {d}")
        if settings.mechanism not in ("none", "before", "after"):
            raise ValueError(f"mechanism: got {settings.mechanism!r}; allowed none/before/after")
        if settings.mechanism != "none" and settings.alpha is None:
            raise ValueError("a DP mechanism needs a fixed alpha (data-independent power)")
        l = d if settings.l is None else settings.l
        self.settings = settings
        self.d = d
        self.compressor = Compressor(d=d, l=l, levels=settings.levels)
        self._compresses = self.compressor.sparsifies or settings.levels is not None
        if self._compresses and not run_secret:
            raise ValueError("compression needs the run secret (sparsification masks)")
        self.run_secret = run_secret

    def encode(
        self,
        g: np.ndarray,
        *,
        device: int,
        round_index: int,
        quant_rng: np.random.Generator,
    ) -> EncodedUpload:
        """Encode ``g`` (``(d,)``) for ``device`` in ``round_index``.

        ``quant_rng`` drives the quantizer's stochastic rounding (experiment stream); the
        artificial noise always comes from the OS CSPRNG (:mod:`testbed.core.noise`).
        """
        g = np.asarray(g, dtype=np.float64)
        if g.shape != (self.d,):
            raise ValueError(f"differential shape {g.shape}, expected ({self.d},)")
        s = self.settings
        comp = self.compressor
        values = clip(g, mode=s.clip_mode, bound=s.clip_bound)
        if s.mechanism == "before" and s.sigma > 0:
            values = values + noise.gaussian(self.d, s.sigma)
        norm: float | None = None
        if self._compresses:
            scale = (
                fixed_quantizer_scale(clip=s.clip_bound, d=self.d, l=comp.l, clip_mode=s.clip_mode)
                if s.quantizer_scale == "fixed" and comp.levels is not None
                else None
            )
            enc = comp.encode(
                values,
                run_secret=self.run_secret,
                device=device,
                round_index=round_index,
                rng=quant_rng,
                scale=scale,
            )
            values, norm = enc.values, enc.norm
        if s.mechanism == "after" and s.sigma > 0:
            values = values + self._after_noise(values.size, norm)
        alpha = unit_power_alpha(values) if s.alpha is None else float(s.alpha)
        header = UploadHeader(
            device=device,
            round_index=round_index,
            d=self.d,
            n_values=values.size,
            alpha=alpha,
            sparsified=comp.sparsifies,
            quant_levels=comp.levels,
            quant_norm=norm,
        )
        return EncodedUpload(header=header, symbols=alpha * reals_to_symbols(values), values=values)

    def _after_noise(self, n: int, grid_scale: float | None) -> np.ndarray:
        """Noise after compression: discrete Gaussian on the quantizer grid (eq. 21)."""
        s = self.settings
        levels = self.compressor.levels
        if levels is None or not grid_scale:
            return noise.gaussian(n, s.sigma)
        step = grid_scale / levels
        sigma2 = Fraction((s.sigma / step) ** 2).limit_denominator(10**9)
        return noise.discrete_gaussian(n, sigma2).astype(np.float64) * step
