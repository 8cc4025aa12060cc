"""Root-raised-cosine pulse shaping and matched filtering.

The pulse is normalised to unit energy (``sum(g**2) == 1``) so that, with white sample
noise of variance ``N0`` per complex sample, the matched-filter output sampled at the symbol
instants carries noise of variance ``N0`` per symbol and the symbols themselves come out
with gain 1 (the cascade ``g * g`` is a Nyquist raised cosine with peak ``sum(g**2)``).
"""

from __future__ import annotations

from functools import lru_cache

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
        self._grid = np.arange(self.fine.size, dtype=np.float64)
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
        return np.interp(at, self._grid, self.fine.real) + 1j * np.interp(
            at, self._grid, self.fine.imag
        )


#: Output samples per pass of :func:`_fir_into` (its scratch stays in cache).
_FIR_CHUNK = 16384


def _fir_into(out: np.ndarray, seg: np.ndarray, taps: np.ndarray) -> None:
    """``out = np.convolve(seg, taps, "valid")`` for real ``taps`` and ``complex64`` samples.

    Shift and accumulate on the interleaved ``float32`` view, a cache-sized chunk at a time:
    for short filters several times faster than :func:`numpy.convolve`.

    Parameters
    ----------
    out
        ``complex64``, contiguous, shape ``(m,)``; overwritten.
    seg
        ``complex64``, contiguous, shape ``(m + T - 1,)``.
    taps
        Real, shape ``(T,)``.
    """
    rev = np.asarray(taps, dtype=np.float32)[::-1]
    used = [u for u in range(rev.size) if rev[u] != 0.0]
    src, dst = seg.view(np.float32), out.view(np.float32)
    m = out.size
    tmp = np.empty(2 * min(m, _FIR_CHUNK), dtype=np.float32)
    for c0 in range(0, m, _FIR_CHUNK):
        c1 = min(m, c0 + _FIR_CHUNK)
        acc, t = dst[2 * c0 : 2 * c1], tmp[: 2 * (c1 - c0)]
        acc[:] = 0.0
        for u in used:
            np.multiply(src[2 * (c0 + u) : 2 * (c1 + u)], rev[u], out=t)
            acc += t


def _fir_run(out: np.ndarray, x: np.ndarray, i0: int, taps: np.ndarray, e_min: int) -> None:
    """``out[t] = sum_e taps[e - e_min] x[i0 + t - e]``, ``x`` zero outside ``[0, n)``.

    ``x`` is ``complex64`` and contiguous; only the few outputs that reach past its ends
    read from a zero-padded copy.
    """
    m, n, n_taps = out.size, x.size, taps.size
    e_max = e_min + n_taps - 1
    t_lo = min(max(e_max - i0, 0), m)
    t_hi = min(max(n + e_min - i0, t_lo), m)
    if t_hi > t_lo:
        _fir_into(out[t_lo:t_hi], x[i0 + t_lo - e_max : i0 + t_hi - e_min], taps)
    for a, b in ((0, t_lo), (t_hi, m)):
        if b > a:
            lo, hi = i0 + a - e_max, i0 + b - e_min
            seg = np.zeros(hi - lo, dtype=np.complex64)
            seg[max(-lo, 0) : (hi - lo) - max(hi - n, 0)] = x[max(lo, 0) : min(hi, n)]
            _fir_into(out[a:b], seg, taps)


@lru_cache(maxsize=4)
def _phase_taps(upsample: int) -> tuple[np.ndarray, int]:
    """The interpolator of :func:`sample_at` as a table of short filters.

    :func:`scipy.signal.resample_poly` computes fine sample ``upsample * i + q`` as
    ``sum_e G[q, e] x[i - e]``; the rows are read off its impulse response, for
    ``q = 0 .. upsample`` (row ``upsample`` is fine sample ``upsample * (i + 1)``).

    Returns
    -------
    tuple
        ``G`` (``float64``, shape ``(upsample + 1, T)``, column ``c`` holds ``e = c + e_min``)
        and ``e_min``.
    """
    c = 64
    impulse = np.zeros(2 * c + 1)
    impulse[c] = 1.0
    from scipy import signal  # imported on use: it costs every CLI process 0.6 s
    fine = signal.resample_poly(impulse, upsample, 1)
    e = np.arange(-c // 2, c // 2 + 1)
    q = np.arange(upsample + 1)
    table = fine[upsample * (c + e[None, :]) + q[:, None]]
    used = np.flatnonzero(np.any(table != 0.0, axis=0))
    return table[:, used[0] : used[-1] + 1].copy(), int(e[used[0]])


def sample_line(
    x: np.ndarray, start: float, step: float, count: int, upsample: int = 8
) -> np.ndarray:
    """:func:`sample_at` at the evenly spaced positions ``start + step * k``, ``k < count``.

    The same interpolant as :func:`sample_at` (equal up to single-precision rounding), made
    fast for ``step`` near 1 (a receiver clock against a transmitter's): the positions fall
    into runs of constant phase of the ``upsample`` grid, one run every ``1 / (upsample
    |step - 1|)`` samples, and each run is two short FIR filters (one when ``step == 1``)
    instead of an ``upsample``-fold resampling of the whole signal. Spacings far from 1
    (runs shorter than 64 samples) go through :func:`sample_at`.

    Parameters
    ----------
    x
        Complex samples, shape ``(n,)``; zero outside ``[0, n)``.
    start, step
        First position and spacing (samples); every position must lie in ``[0, n - 1]``.
    count
        Number of positions.

    Returns
    -------
    numpy.ndarray
        ``complex64``, shape ``(count,)``.
    """
    n = x.size
    last = start + step * (count - 1)
    if count < 1 or step <= 0 or start < 0 or last > n - 1 + 1e-9:
        raise ValueError(
            f"positions start={start}, step={step}, count={count} must be >= 1 positions, "
            f"step > 0, inside [0, {n - 1}]"
        )
    # Fine-grid position of k: upsample * k + u_k with u_k = u0 + d k; a run keeps floor(u_k).
    u0 = upsample * start
    d = upsample * (step - 1.0)
    if abs(d) * count > count / 64 + upsample:
        # Runs shorter than ~64 samples: the general path is cheaper.
        return sample_at(x, start + step * np.arange(count), upsample).astype(np.complex64)
    table, e_min = _phase_taps(upsample)
    xc = np.ascontiguousarray(x, dtype=np.complex64)
    if d != 0:
        return _sample_drift(xc, u0, d, count, table, e_min)
    # One run: every position at the same fine phase q + a past input sample k + base.
    f = int(np.floor(u0))
    q, base = f % upsample, f // upsample
    lo, hi = table[q], table[q + 1]
    out = np.empty(count, dtype=np.complex64)
    _fir_run(out, xc, base, lo + (u0 - f) * (hi - lo), e_min)
    return out


def _sample_drift(
    x: np.ndarray, u0: float, d: float, count: int, table: np.ndarray, e_min: int
) -> np.ndarray:
    """:func:`sample_line` when the fine phase drifts (``step != 1``).

    Position ``k`` lies at fine-grid offset ``u_k = u0 + d k`` past ``upsample * k``: input
    sample ``i = k + base`` with ``base = floor(u_k) // upsample`` and fine phase
    ``phi = u_k - upsample * base``; its filter is ``G[q] + (phi - q) (G[q + 1] - G[q])``
    with ``q = floor(phi)``. Blocks of constant ``base`` (``1 / |step - 1|`` samples) are
    filtered a cache-sized chunk at a time with per-sample weights (linear in ``phi`` over
    each run of constant ``q``), one tap after another.

    Parameters
    ----------
    x
        ``complex64``, contiguous, shape ``(n,)``.
    table, e_min
        From :func:`_phase_taps`.
    """
    up = table.shape[0] - 1
    n_taps = table.shape[1]
    slope = np.diff(table, axis=0)  # (up, T): G[q + 1] - G[q]
    # Weight of tap e at phase phi in [q, q + 1): at[e, q] + phi * dt[e, q].
    at = np.ascontiguousarray((table[:-1] - np.arange(up)[:, None] * slope).T, dtype=np.float32)
    dt = np.ascontiguousarray(slope.T, dtype=np.float32)
    pad = n_taps + 1
    planes = np.zeros((2, x.size + 2 * pad), dtype=np.float32)
    planes[0, pad:-pad], planes[1, pad:-pad] = x.real, x.imag
    # Runs of constant f = floor(u_k), from the closed form of u_k (no per-sample floor).
    sgn = 1 if d > 0 else -1
    runs: list[tuple[int, int, int]] = []
    for f in range(int(np.floor(u0)), int(np.floor(u0 + d * (count - 1))) + sgn, sgn):
        if d > 0:
            k0, k1 = int(np.ceil((f - u0) / d)), int(np.ceil((f + 1 - u0) / d))
        else:
            k0, k1 = int(np.floor((f + 1 - u0) / d)) + 1, int(np.floor((f - u0) / d)) + 1
        k0, k1 = max(k0, 0), min(k1, count)
        if k1 > k0:
            runs.append((f, k0, k1))
    out = np.empty(count, dtype=np.complex64)
    res = np.empty((2, min(count, _FIR_CHUNK)), dtype=np.float32)
    tmp = np.empty_like(res)
    weights = np.empty((n_taps, res.shape[1]), dtype=np.float32)
    j = 0
    while j < len(runs):
        # A block: the runs sharing base = f // up, processed a chunk at a time.
        b = runs[j][0] // up
        j_end = j
        while j_end < len(runs) and runs[j_end][0] // up == b:
            j_end += 1
        block = runs[j:j_end]
        j = j_end
        for c0 in range(block[0][1], block[-1][2], _FIR_CHUNK):
            c1 = min(block[-1][2], c0 + _FIR_CHUNK)
            m = c1 - c0
            phi = (u0 - up * b + d * np.arange(c0, c1)).astype(np.float32)
            w = weights[:, :m]
            for f, k0, k1 in block:
                r0, r1 = max(k0, c0) - c0, min(k1, c1) - c0
                if r1 > r0:
                    qr = min(max(f - up * b, 0), up - 1)
                    np.multiply(dt[:, qr, None], phi[None, r0:r1], out=w[:, r0:r1])
                    w[:, r0:r1] += at[:, qr, None]
            acc, t = res[:, :m], tmp[:, :m]
            acc[:] = 0.0
            i0 = c0 + b + pad  # padded index of x[k + base] at the chunk's start
            for c in range(n_taps):
                e = c + e_min
                np.multiply(planes[:, i0 - e : i0 - e + m], w[c], out=t)
                acc += t
            out.real[c0:c1] = acc[0]
            out.imag[c0:c1] = acc[1]
    return out
