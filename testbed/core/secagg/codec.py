"""Fixed-point encoding for secure aggregation (:mod:`testbed.core.secagg`): real update
vectors as integers mod ``2^k``, and the modular arithmetic the masks and the sum use."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

UInt64Array = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class FixedPointCodec:
    """Real vectors <-> integers mod ``2^k``, two's complement.

    ``encode(x) = round(clip(x, -clip, clip) * scale) mod 2^k``. A sum of ``s`` encodings
    decodes exactly when ``s * max_int <= 2^(k-1) - 1`` (:meth:`check_summands`), with
    ``max_int = round(clip * scale)``; the resolution is ``1 / scale`` per summand.

    Attributes
    ----------
    clip
        Largest magnitude encoded per coordinate (update units); larger values are clipped
        (post-processing of an already private update).
    scale
        Integers per update unit.
    modulus_bits
        ``k`` in ``[2, 64]``; values are held in ``uint64``.
    """

    clip: float
    scale: float
    modulus_bits: int = 64

    def __post_init__(self) -> None:
        k = self.modulus_bits
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= 64:
            raise ValueError(f"FixedPointCodec: modulus_bits={k!r} must be an integer in [2, 64]")
        for name in ("clip", "scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < np.inf:
                raise ValueError(f"FixedPointCodec: {name}={v!r} must be finite and > 0")
        if not 1 <= self.max_int <= min(2 ** (k - 1) - 1, 2**53):
            raise ValueError(f"FixedPointCodec: clip * scale = {self.clip * self.scale:g} must "
                             f"round to an integer in [1, {min(2 ** (k - 1) - 1, 2**53)}]")

    @classmethod
    def fit(cls, *, clip: float, summands: int, modulus_bits: int = 64) -> FixedPointCodec:
        """The largest power-of-two ``scale`` for which ``summands`` encodings cannot overflow."""
        if isinstance(summands, bool) or not isinstance(summands, int) or summands < 1:
            raise ValueError(f"FixedPointCodec.fit: summands={summands!r} must be an integer >= 1")
        if isinstance(clip, bool) or not isinstance(clip, int | float) or not 0 < clip < np.inf:
            raise ValueError(f"FixedPointCodec.fit: clip={clip!r} must be finite and > 0")
        if isinstance(modulus_bits, bool) or not isinstance(modulus_bits, int) or not (
                2 <= modulus_bits <= 64):
            raise ValueError(f"FixedPointCodec.fit: modulus_bits={modulus_bits!r} must be an "
                             "integer in [2, 64]")
        if summands > 2 ** (modulus_bits - 1) - 1:
            raise ValueError(f"FixedPointCodec.fit: summands={summands} must be at most "
                             f"2^{modulus_bits - 1} - 1")
        limit = min((2 ** (modulus_bits - 1) - 1) // summands, 2**53)
        exponent = int(np.floor(np.log2((limit - 0.5) / clip)))
        while exponent > -1074 and np.floor(clip * 2.0**exponent + 0.5) > limit:
            exponent -= 1
        return cls(clip=float(clip), scale=2.0**exponent, modulus_bits=modulus_bits)

    @property
    def max_int(self) -> int:
        """Largest encoded magnitude, ``round(clip * scale)``."""
        return int(np.floor(self.clip * self.scale + 0.5))

    @property
    def mask(self) -> np.uint64:
        """``2^k - 1`` as ``uint64``."""
        return np.uint64((1 << self.modulus_bits) - 1)

    def capacity(self) -> int:
        """Most summands whose sum decodes exactly."""
        return (2 ** (self.modulus_bits - 1) - 1) // self.max_int

    def check_summands(self, summands: int) -> None:
        """Raise ``ValueError`` unless ``summands * max_int < 2^(k-1)``."""
        if summands > self.capacity():
            raise ValueError(
                f"FixedPointCodec: summands={summands} times max_int={self.max_int} "
                f"(clip={self.clip:g} * scale={self.scale:g}) must be < 2^{self.modulus_bits - 1}"
                f"; at most {self.capacity()} summands fit")

    def encode(self, x: npt.ArrayLike) -> UInt64Array:
        """Encode a real vector, shape ``(d,)`` float -> ``(d,)`` uint64 in ``[0, 2^k)``."""
        v = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError("FixedPointCodec.encode: the update has non-finite entries")
        ints = np.rint(np.clip(v, -self.clip, self.clip) * self.scale).astype(np.int64)
        return ints.view(np.uint64) & self.mask

    def to_signed(self, v: UInt64Array) -> npt.NDArray[np.int64]:
        """Residues mod ``2^k`` -> signed integers in ``[-2^(k-1), 2^(k-1))``."""
        u = np.asarray(v, dtype=np.uint64) & self.mask
        if self.modulus_bits == 64:
            return u.view(np.int64).copy()
        s = u.astype(np.int64)
        s[s >= 2 ** (self.modulus_bits - 1)] -= 2**self.modulus_bits
        return s

    def decode(self, v: UInt64Array) -> npt.NDArray[np.float64]:
        """Residues (a sum of encodings) -> reals: ``to_signed(v) / scale``, float64."""
        return self.to_signed(v).astype(np.float64) / self.scale

    def add(self, a: UInt64Array, b: UInt64Array) -> UInt64Array:
        """``(a + b) mod 2^k`` (uint64 addition wraps mod 2^64, a multiple of 2^k)."""
        return (np.asarray(a, dtype=np.uint64) + np.asarray(b, dtype=np.uint64)) & self.mask

    def sub(self, a: UInt64Array, b: UInt64Array) -> UInt64Array:
        """``(a - b) mod 2^k``."""
        return (np.asarray(a, dtype=np.uint64) - np.asarray(b, dtype=np.uint64)) & self.mask
