"""Compression ``C_{q,s}`` of 003 eqs. (6)-(8): random sparsification, then QSGD quantization.

Sparsification keeps ``l`` of the ``d`` coordinates and scales them by ``d / l`` (eq. 6), so
that ``E[g^s] = g`` over the mask. The mask is *not* drawn from the privacy generator: it is
derived from ``(run_secret, device, round)`` with HMAC-SHA256, so the aggregator regenerates
it and only the ``l`` values travel. Quantization (eq. 7) maps each kept value ``v_j`` to
``sign(v_j) * s / Q * xi_j`` with ``xi_j`` a stochastic rounding of ``Q |v_j| / s``; the scale
``s`` is the l2 norm of the sparse vector (QSGD, the paper's choice), or a fixed public
scale. The norm travels as side information.

Either stage can be turned off: without sparsification ``l = d`` and the mask is every
coordinate; without quantization the values are sent as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from testbed.core.compression_bounds import check_d_l
from testbed.core.masks import sparsify_mask  # shared with the aggregator


def sparsify(g: np.ndarray, idx: np.ndarray, d: int) -> np.ndarray:
    """Eq. (6) restricted to the kept coordinates: ``g[idx] * d / l``.

    Parameters
    ----------
    g
        Real array, shape ``(d,)``.
    idx
        ``int64``, shape ``(l,)``: the mask from :func:`sparsify_mask`.
    d
        Model size; must equal ``g.size``.

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(l,)``: the values that go on air (before quantization).
    """
    v = np.asarray(g, dtype=np.float64)
    if v.ndim != 1 or v.size != d:
        raise ValueError(f"sparsify: g must have shape ({d},), got {v.shape}")
    idx = np.asarray(idx)
    if idx.ndim != 1 or idx.size == 0 or idx.size > d:
        raise ValueError(f"sparsify: idx must be 1-d with 1..{d} entries, got shape {idx.shape}")
    if idx.min() < 0 or idx.max() >= d:
        raise ValueError(f"sparsify: idx entries must lie in [0, {d})")
    return v[idx] * (d / idx.size)


def quantize(
    values: np.ndarray,
    levels: int,
    rng: np.random.Generator,
    *,
    scale: float | None = None,
) -> tuple[np.ndarray, float]:
    """Stochastic quantization of eq. (7) (QSGD), sign kept, magnitude rounded.

    ``r_j = levels * |v_j| / s``; ``xi_j = floor(r_j) + Bernoulli(r_j - floor(r_j))``; the
    output is ``sign(v_j) * s / levels * xi_j``, so ``E[out] = v``.

    Parameters
    ----------
    values
        Real array, shape ``(l,)``.
    levels
        ``Q >= 1``, the number of quantization levels.
    rng
        Generator for the rounding (not privacy noise; reproducible from the experiment seed).
    scale
        ``None`` (default): ``s = ||values||_2`` (QSGD, eq. 7), returned as side information.
        A positive number: a fixed public scale; every ``|v_j|`` must be ``<= scale``.

    Returns
    -------
    tuple
        ``(quantized, s)``: ``float64`` array of shape ``(l,)`` whose entries lie on the
        grid ``(s / levels) * Z``, and the scale ``s`` (``0.0`` for an all-zero input with
        ``scale=None``).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"quantize: values must be 1-d, got shape {v.shape}")
    if isinstance(levels, bool) or not isinstance(levels, int | np.integer) or levels < 1:
        raise ValueError(f"quantize: levels={levels!r} must be an integer >= 1")
    if not np.all(np.isfinite(v)):
        raise ValueError("quantize: values contain NaN or infinite entries")
    s = _resolve_scale(v, scale, "quantize")
    if s == 0.0:
        return np.zeros_like(v), 0.0
    xi = quantize_levels(v, levels, rng, s)
    return xi.astype(np.float64) * (s / levels), s


def quantize_levels(
    values: np.ndarray, levels: int, rng: np.random.Generator, scale: float
) -> np.ndarray:
    """Signed integer levels ``sign(v_j) * xi_j`` of :func:`quantize` (``int64``, ``(l,)``).

    ``scale`` must be ``> 0`` and at least ``max |v_j|`` (no check here; see
    :func:`quantize`).
    """
    v = np.asarray(values, dtype=np.float64)
    r = np.abs(v) * (levels / scale)
    r = np.minimum(r, float(levels))  # float rounding may put |v| = s a hair above Q
    low = np.floor(r)
    up = rng.random(v.shape) < (r - low)
    xi = low.astype(np.int64) + up.astype(np.int64)
    return np.where(v < 0, -xi, xi)


@dataclass(frozen=True)
class Encoded:
    """What one device sends for one round.

    Attributes
    ----------
    values
        ``float64``, shape ``(l,)``: the compressed values, in mask order (on air).
        With quantization, ``values == levels * step``.
    norm
        Quantizer scale ``s`` (side information) or ``None`` without quantization.
    d
        Model size.
    levels
        ``int64``, shape ``(l,)``: signed quantization levels, or ``None`` without
        quantization. Noise after compression (003 eq. 21) is a discrete Gaussian added here.
    step
        Grid spacing ``s / Q`` (``None`` without quantization).
    """

    values: np.ndarray
    norm: float | None
    d: int
    levels: np.ndarray | None = None
    step: float | None = None


@dataclass(frozen=True)
class Compressor:
    """``C_{q,s}`` with either stage optional.

    Parameters
    ----------
    d
        Model size (``>= 1``).
    l
        Coordinates kept (``1 <= l <= d``); ``l = d`` turns sparsification off.
    levels
        Quantization levels ``Q >= 1``, or ``None`` to turn quantization off.
    """

    d: int
    l: int
    levels: int | None = None

    def __post_init__(self) -> None:
        check_d_l(self.d, self.l, "Compressor")
        if self.levels is not None and (
            isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 1
        ):
            raise ValueError(f"Compressor: levels={self.levels!r} must be None or an int >= 1")

    @property
    def sparsifies(self) -> bool:
        """Whether sparsification is on (``l < d``)."""
        return self.l < self.d

    def mask(self, run_secret: str, device: int, round_index: int) -> np.ndarray:
        """The round's mask (all coordinates when sparsification is off)."""
        return sparsify_mask(run_secret, device, round_index, self.d, self.l)

    def encode(
        self,
        g: np.ndarray,
        *,
        run_secret: str,
        device: int,
        round_index: int,
        rng: np.random.Generator,
        scale: float | None = None,
    ) -> Encoded:
        """Compress ``g`` (shape ``(d,)``) into the ``l`` values that go on air.

        ``rng`` drives the quantizer's rounding; ``scale`` is passed to :func:`quantize`.
        """
        idx = self.mask(run_secret, device, round_index)
        v = sparsify(g, idx, self.d)
        if self.levels is None:
            return Encoded(values=v, norm=None, d=self.d)
        s = _resolve_scale(v, scale, "encode")
        if s == 0.0:
            zeros = np.zeros(v.size, dtype=np.int64)
            return Encoded(values=np.zeros_like(v), norm=0.0, d=self.d, levels=zeros, step=0.0)
        levels = quantize_levels(v, self.levels, rng, s)
        step = s / self.levels
        return Encoded(values=levels * step, norm=s, d=self.d, levels=levels, step=step)

    def decode(
        self, values: np.ndarray, *, run_secret: str, device: int, round_index: int
    ) -> np.ndarray:
        """Place received values (shape ``(l,)``) at the mask positions of a ``(d,)`` vector.

        The ``d / l`` scaling was applied at the sender, so this is the unbiased estimate of
        ``g`` when ``values`` are unbiased for the sent ones.
        """
        v = np.asarray(values, dtype=np.float64)
        if v.shape != (self.l,):
            raise ValueError(f"decode: values must have shape ({self.l},), got {v.shape}")
        out = np.zeros(self.d, dtype=np.float64)
        out[self.mask(run_secret, device, round_index)] = v
        return out


def _resolve_scale(v: np.ndarray, scale: float | None, where: str) -> float:
    """The quantizer scale: ``||v||`` when ``scale`` is None, else the validated fixed one."""
    if scale is None:
        return float(np.linalg.norm(v))
    if isinstance(scale, bool) or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{where}: scale={scale!r} must be finite and > 0")
    if v.size and float(np.max(np.abs(v))) > scale:
        raise ValueError(f"{where}: max |value| {np.max(np.abs(v))} exceeds scale={scale}")
    return float(scale)
