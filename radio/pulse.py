"""Root-raised-cosine pulse shaping and matched filtering.

The pulse is normalised to unit energy (``sum(g**2) == 1``) so that, with white sample
noise of variance ``N0`` per complex sample, the matched-filter output sampled at the symbol
instants carries noise of variance ``N0`` per symbol and the symbols themselves come out
with gain 1 (the cascade ``g * g`` is a Nyquist raised cosine with peak ``sum(g**2)``).
"""

from __future__ import annotations

import numpy as np


def rrc_taps(samples_per_symbol: int, rolloff: float, span_symbols: int) -> np.ndarray:
    """Root-raised-cosine taps with unit energy.

    Parameters
    ----------
    samples_per_symbol
        Oversampling factor ``sps`` (>= 2).
    rolloff
        Excess bandwidth ``beta`` in ``(0, 1]``.
    span_symbols
        Filter length in symbols (even); the filter has ``span_symbols * sps + 1`` taps.

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(span_symbols * sps + 1,)``, symmetric, ``sum(g**2) == 1``.
    """
    if samples_per_symbol < 2:
        raise ValueError(f"samples_per_symbol must be >= 2, got {samples_per_symbol}")
    if not 0.0 < rolloff <= 1.0:
        raise ValueError(f"rolloff must be in (0, 1], got {rolloff}")
    if span_symbols < 2 or span_symbols % 2:
        raise ValueError(f"span_symbols must be an even number >= 2, got {span_symbols}")
    sps, b = samples_per_symbol, rolloff
    t = np.arange(-span_symbols * sps // 2, span_symbols * sps // 2 + 1) / sps
    g = np.empty_like(t)
    center = np.isclose(t, 0.0)
    edge = np.isclose(np.abs(t), 1.0 / (4.0 * b))
    rest = ~(center | edge)
    g[center] = 1.0 - b + 4.0 * b / np.pi
    g[edge] = (b / np.sqrt(2.0)) * (
        (1.0 + 2.0 / np.pi) * np.sin(np.pi / (4.0 * b))
        + (1.0 - 2.0 / np.pi) * np.cos(np.pi / (4.0 * b))
    )
    tr = t[rest]
    g[rest] = (
        np.sin(np.pi * tr * (1.0 - b)) + 4.0 * b * tr * np.cos(np.pi * tr * (1.0 + b))
    ) / (np.pi * tr * (1.0 - (4.0 * b * tr) ** 2))
    return g / np.sqrt(np.sum(g**2))


def shape(symbols: np.ndarray, taps: np.ndarray, samples_per_symbol: int) -> np.ndarray:
    """Upsample ``symbols`` by ``sps`` and filter with ``taps``.

    Symbol ``k`` peaks at output sample ``k * sps + (len(taps) - 1) // 2``.

    Returns
    -------
    numpy.ndarray
        ``complex128``, shape ``((n - 1) * sps + len(taps),)``.
    """
    x = np.asarray(symbols, dtype=np.complex128)
    from scipy import signal  # imported on use: it costs every CLI process 0.6 s
    return signal.upfirdn(taps, x, up=samples_per_symbol)


def matched_filter(samples: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """Full convolution with the (symmetric) pulse, shape ``(n + len(taps) - 1,)``.

    A symbol peaking at input sample ``m`` peaks at output sample ``m + (len(taps) - 1) // 2``.
    """
    from scipy import signal  # imported on use: it costs every CLI process 0.6 s
    return signal.oaconvolve(np.asarray(samples, dtype=np.complex128), taps, mode="full")


def sample_at(x: np.ndarray, positions: np.ndarray, upsample: int = 8) -> np.ndarray:
    """Band-limited evaluation of ``x`` at fractional sample ``positions``.

    ``x`` is interpolated by ``upsample`` with a polyphase FIR (:func:`scipy.signal.resample_poly`)
    and then linearly between the fine samples. Accurate for signals well inside the band
    (here at most ``(1 + rolloff) / (2 sps)`` of the sample rate).

    Parameters
    ----------
    x
        Complex samples, shape ``(n,)``.
    positions
        Fractional sample indices into ``x``, shape ``(m,)``; must lie in ``[0, n - 1]``.

    Returns
    -------
    numpy.ndarray
        ``complex128``, shape ``(m,)``.
    """
    pos = np.asarray(positions, dtype=np.float64)
    if pos.size == 0:
        return np.zeros(0, dtype=np.complex128)
    if pos.min() < 0 or pos.max() > x.size - 1:
        raise ValueError(
            f"positions must lie in [0, {x.size - 1}], got [{pos.min():.2f}, {pos.max():.2f}]"
        )
    return Interpolant(x, pos.min(), pos.max(), upsample).at(pos)


class Interpolant:
    """The interpolant of :func:`sample_at` over ``x[lo - 16 : hi + 17]``, built once and
    evaluated at many sets of positions (a receiver trying several timings).

    Parameters
    ----------
    x
        Complex samples, shape ``(n,)``.
    first, last
        Fractional sample indices (into ``x``) the positions will span.
    upsample
        Polyphase interpolation factor.
    """

    def __init__(self, x: np.ndarray, first: float, last: float, upsample: int = 8) -> None:
        self.lo = max(int(np.floor(first)) - 16, 0)
        hi = min(int(np.ceil(last)) + 17, x.size)
        from scipy import signal  # imported on use: it costs every CLI process 0.6 s
        self.fine = signal.resample_poly(
            np.asarray(x[self.lo : hi], dtype=np.complex128), upsample, 1
        )
        self.upsample = upsample
        self._limit = (self.lo, self.lo + (self.fine.size - 1) / upsample)

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Values at ``positions`` (indices into ``x``, shape ``(m,)``): ``complex128 (m,)``.

        Raises
        ------
        ValueError
            A position outside the span given at construction.
        """
        pos = np.asarray(positions, dtype=np.float64)
        if pos.size and (pos.min() < self._limit[0] or pos.max() > self._limit[1]):
            raise ValueError(f"positions [{pos.min():.2f}, {pos.max():.2f}] outside the "
                             f"interpolated span [{self._limit[0]}, {self._limit[1]:.2f}]")
        at = (pos - self.lo) * self.upsample
        # Linear between the fine samples, numpy.interp's formula on the unit-spaced grid
        # (slope fine[j + 1] - fine[j] over a spacing of exactly 1), without the copies of
        # the whole real and imaginary parts it makes on every call.
        j = np.floor(at).astype(np.intp)
        k = np.minimum(j + 1, self.fine.size - 1)  # the last sample: itself, as interp
        frac = at - j
        re, im = self.fine.real, self.fine.imag
        return ((re[k] - re[j]) * frac + re[j]) + 1j * ((im[k] - im[j]) * frac + im[j])
