"""The interpolator of :func:`radio.pulse.sample_at` along a line of positions, fast.

:func:`sample_line` (and :func:`sample_line_chunks`, the same in pieces) evaluates the
band-limited interpolant of :func:`radio.pulse.sample_at` (``scipy.signal.resample_poly``
by 8, linear between the phases) at ``start + step * k``: a fractional delay
(``step = 1``) or a delay with a sample-rate offset (``step != 1``), which is what the
waveform emulator (:mod:`radio.waveform_channel`) applies to every received sample. The
filter table is read off ``resample_poly``'s impulse response (:func:`_phase_taps`) and
applied as small matrix products over rows of output samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np

from radio.pulse import sample_at


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


# Evenly spaced positions are computed a row of _ROW outputs at a time, as matrix products
# (BLAS) of the row's input window with banded Toeplitz matrices built from the filter table.
#: Output samples per row (a multiple of _BLOCK).
_ROW = 64
#: Output samples per column block: one product per block with a ``(_BLOCK + T - 1, _BLOCK)``
#: band (narrower blocks waste fewer multiplications on the band's zeros; 16 columns fill the
#: vector registers).
_BLOCK = 16
#: Rows per matrix product: operands and results (~1 MB) stay in the core's cache. A phase's
#: rows are split into equal batches of at most ``_BATCH_ROWS + _BATCH_ROWS // 4`` (no small
#: remainder: with a sample-rate offset a chunk holds a little over 512 rows of each phase).
_BATCH_ROWS = 512
#: Input samples rounded to single precision at a time (128 kB) before their real and
#: imaginary parts are split apart.
_SPLIT_BLOCK = 1 << 14
#: Output samples per chunk of :func:`sample_line_chunks` (a multiple of ``_ROW``): the
#: phases are grouped over a chunk, so a chunk spans many runs of constant phase.
LINE_CHUNK = 1 << 18


def _banded(taps: np.ndarray, width: int) -> np.ndarray:
    """The FIR ``taps`` as a band matrix acting on an input window.

    Parameters
    ----------
    taps
        Real filter ``h``, shape ``(T,)``.
    width
        Outputs per window.

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(width + T - 1, width)``: ``(v @ M)[j] = sum_c h[c] v[j + T - 1 - c]``.
    """
    n_taps = taps.size
    band = np.zeros((width + n_taps - 1, width))
    for j in range(width):
        band[j : j + n_taps, j] = taps[::-1]
    return band


@lru_cache(maxsize=4)
def _phase_bands(upsample: int) -> tuple[np.ndarray, np.ndarray]:
    """The filters of the ``upsample`` phases and their slopes as band matrices.

    Returns
    -------
    tuple
        ``level`` and ``slope``, ``float64``, shape ``(upsample, _BLOCK + T - 1, _BLOCK)``:
        :func:`_banded` of ``G[q]`` and of ``G[q + 1] - G[q]`` (``G`` from :func:`_phase_taps`).
    """
    table, _ = _phase_taps(upsample)
    level = np.stack([_banded(table[q], _BLOCK) for q in range(upsample)])
    slope = np.stack([_banded(table[q + 1] - table[q], _BLOCK) for q in range(upsample)])
    return level, slope


def _phase_runs(u0: float, d: float, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of constant ``f = floor(u0 + d k)`` over ``k < count``.

    Returns
    -------
    tuple
        ``f``, ``k0``, ``k1`` (``int64``, shape ``(runs,)``, ascending ``k0``): ``f`` holds for
        ``k0 <= k < k1``. The run ends come from the closed form ``k = (f - u0) / d`` (no
        per-sample floor).
    """
    first = int(np.floor(u0))
    if d == 0:
        return np.array([first]), np.array([0]), np.array([count])
    last = int(np.floor(u0 + d * (count - 1)))
    sgn = 1 if d > 0 else -1
    f = np.arange(first, last + sgn, sgn, dtype=np.int64)
    fl = f.astype(np.float64)
    if d > 0:
        k0, k1 = np.ceil((fl - u0) / d), np.ceil((fl + 1 - u0) / d)
    else:
        k0, k1 = np.floor((fl + 1 - u0) / d) + 1, np.floor((fl - u0) / d) + 1
    k0 = np.clip(k0, 0, count).astype(np.int64)
    k1 = np.clip(k1, 0, count).astype(np.int64)
    keep = k1 > k0
    f, k0, k1 = f[keep], k0[keep], k1[keep]
    # Neighbouring runs share their end (the same expression); the ends of the line are
    # pinned so that rounding cannot leave a position outside every run.
    k0[0], k1[-1] = 0, count
    return f, k0, k1


def sample_line(
    x: np.ndarray, start: float, step: float, count: int, upsample: int = 8
) -> np.ndarray:
    """:func:`sample_at` at the evenly spaced positions ``start + step * k``, ``k < count``.

    The same interpolant as :func:`sample_at` (equal up to single-precision rounding), made
    fast for ``step`` near 1 (a receiver clock against a transmitter's); see
    :func:`sample_line_chunks`, whose chunks this joins.

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
    _check_line(x.size, start, step, count)
    out = np.empty(-(-count // _ROW) * _ROW, dtype=np.complex64)  # whole rows
    for _ in sample_line_chunks(x, start, step, count, upsample, out=out):
        pass
    return out[:count]


def _check_line(n: int, start: float, step: float, count: int) -> None:
    """Refuse a line of positions that leaves ``[0, n - 1]`` (:func:`sample_line`)."""
    last = start + step * (count - 1)
    if count < 1 or step <= 0 or start < 0 or last > n - 1 + 1e-9:
        raise ValueError(
            f"positions start={start}, step={step}, count={count} must be >= 1 positions, "
            f"step > 0, inside [0, {n - 1}]"
        )


def sample_line_chunks(
    x: np.ndarray, start: float, step: float, count: int, upsample: int = 8,
    out: np.ndarray | None = None,
) -> Iterator[np.ndarray]:
    """:func:`sample_line` a chunk at a time, in order (for a consumer that streams).

    Position ``k`` lies at fine-grid offset ``u_k = u0 + d k`` past ``upsample * k``
    (``u0 = upsample * start``, ``d = upsample * (step - 1)``): input sample ``k + base`` with
    ``base = floor(u_k) // upsample``, fine phase ``q = floor(u_k) - upsample * base`` and
    fraction ``a = u_k - floor(u_k)``; its filter is ``G[q] + a (G[q + 1] - G[q])``
    (:func:`_phase_taps`). The positions fall into runs of constant ``floor(u_k)``, one run
    every ``1 / |d|`` samples. The output is cut into rows of ``_ROW`` samples; a row's values
    are its input window (``_ROW + T - 1`` samples) times band matrices, real and imaginary
    parts as separate rows, many rows of the same phase in one matrix product (BLAS). With
    ``step == 1`` that is one filter; otherwise two (``G[q]`` and the slope, combined per
    sample with ``a``), and a row crossing a run's end is computed for each run and merged.
    Single precision throughout, like the radio's sample stream. Spacings far from 1 (runs
    shorter than 64 samples) go through :func:`sample_at`.

    Parameters
    ----------
    x
        Complex samples (``complex64`` or ``complex128``), shape ``(n,)``; zero outside
        ``[0, n)``.
    start, step
        First position and spacing (samples); every position must lie in ``[0, n - 1]``.
    count
        Number of positions (``>= 1``).
    upsample
        Phases of the interpolator.
    out
        Where to write the positions (``complex64``, contiguous, at least ``count``
        samples), chunk by chunk, instead of a buffer of the sampler's own. Positions are
        computed in rows of ``_ROW``: samples of ``out`` past ``count`` up to the next
        multiple of ``_ROW`` are overwritten too, when ``out`` is that long.

    Yields
    ------
    numpy.ndarray
        ``complex64``, shape ``(m,)``: positions ``k0 .. k0 + m - 1``, consecutive chunks of
        ``LINE_CHUNK`` (the last one shorter). Each is a view of ``out`` or of a buffer that
        the next chunk overwrites; the consumer may modify it.
    """
    _check_line(x.size, start, step, count)
    if out is not None and (out.dtype != np.complex64 or out.ndim != 1 or out.size < count
                            or not out.flags.c_contiguous):
        raise ValueError(f"out: got {out.dtype} shape {out.shape}; allowed: a contiguous "
                         f"complex64 array of at least {count} samples")
    u0 = upsample * start
    d = upsample * (step - 1.0)
    if abs(d) * count > count / 64 + upsample:
        # Runs shorter than ~64 samples: the general path is cheaper.
        values = sample_at(x, start + step * np.arange(count), upsample).astype(np.complex64)
        if out is not None:
            out[:count] = values
            values = out
        for c0 in range(0, count, LINE_CHUNK):
            yield values[c0 : min(c0 + LINE_CHUNK, count)]
        return
    yield from _LineSampler(x, u0, d, count, upsample, out).chunks()


class _LineSampler:
    """The engine of :func:`sample_line_chunks` for one line of positions.

    Parameters
    ----------
    x
        Complex samples, shape ``(n,)``.
    u0, d
        Fine-grid offset of position 0 and its change per position (fine samples).
    count
        Number of positions.
    upsample
        Phases of the interpolator.
    out
        The caller's buffer for the positions (:func:`sample_line_chunks`), or ``None``.
    """

    def __init__(self, x: np.ndarray, u0: float, d: float, count: int, upsample: int,
                 out: np.ndarray | None = None) -> None:
        self.x, self.u0, self.d, self.count, self.up = x, u0, d, count, upsample
        table, e_min = _phase_taps(upsample)
        self.n_taps = table.shape[1]
        self.e_max = e_min + self.n_taps - 1
        self.width = _ROW + self.n_taps - 1  # input samples per row
        self.f, self.k0, self.k1 = _phase_runs(u0, d, count)
        blocks = _ROW // _BLOCK
        self.slope: np.ndarray | None
        if d == 0:
            # One run, one filter: G[q] + a (G[q + 1] - G[q]) in double precision.
            f0 = int(self.f[0])
            q = f0 % upsample
            band = _banded(table[q] + (u0 - f0) * (table[q + 1] - table[q]), _BLOCK)
            band32 = band.astype(np.float32)
            self.level = np.broadcast_to(band32, (upsample, blocks, *band.shape))
            self.slope = None
        else:
            # Sample j of a row starting at fraction a0 has a = a0 + d j: the d j part goes
            # into the level matrices (one per column block), a0 times the slope is added.
            level, slope = _phase_bands(upsample)
            ramp = d * np.arange(_ROW).reshape(blocks, 1, _BLOCK)
            self.level = (level[:, None] + ramp * slope[:, None]).astype(np.float32)
            self.slope = slope.astype(np.float32)
        self._batch_max = _BATCH_ROWS + _BATCH_ROWS // 4
        rows = min(self._batch_max, -(-count // _ROW))
        self._y = np.empty((2, 2 * rows * _ROW), dtype=np.float32)
        self._res = np.empty((rows, _ROW), dtype=np.complex64)
        self._dest = out
        self._own = np.empty(0, dtype=np.complex64)  # chunks that do not fit in the caller's
        self._span = np.empty(0, dtype=np.complex64)

    def chunks(self) -> Iterator[np.ndarray]:
        """The positions a chunk at a time (see :func:`sample_line_chunks`)."""
        for c0 in range(0, self.count, LINE_CHUNK):  # c0 is a multiple of _ROW
            c1 = min(c0 + LINE_CHUNK, self.count)
            ra, rb = c0 // _ROW, -(-c1 // _ROW)
            dest = self._dest
            if dest is not None and rb * _ROW <= dest.size:
                self._fill(ra, rb, dest[c0 : rb * _ROW])
                yield dest[c0:c1]
                continue
            if self._own.size < (rb - ra) * _ROW:
                self._own = np.empty(min(LINE_CHUNK, -(-self.count // _ROW) * _ROW),
                                     dtype=np.complex64)
            self._fill(ra, rb, self._own)
            if dest is None:
                yield self._own[: c1 - c0]
            else:
                dest[c0:c1] = self._own[: c1 - c0]
                yield dest[c0:c1]

    def _fill(self, ra: int, rb: int, target: np.ndarray) -> None:
        """Compute rows ``ra .. rb - 1`` (positions ``ra * _ROW ..``) into ``target``
        (``complex64``, contiguous, at least ``(rb - ra) * _ROW`` samples)."""
        up, count = self.up, self.count
        # Entries: (row, run) pairs; a row crossing a run's end has one entry per run.
        j0 = int(np.searchsorted(self.k1, ra * _ROW, side="right"))
        j1 = int(np.searchsorted(self.k0, rb * _ROW, side="left"))
        f, k0, k1 = self.f[j0:j1], self.k0[j0:j1], self.k1[j0:j1]
        r_first = np.maximum(k0 // _ROW, ra)
        per_run = np.minimum((k1 - 1) // _ROW, rb - 1) - r_first + 1
        run = np.repeat(np.arange(f.size), per_run)
        row = r_first[run] + np.arange(run.size) - np.repeat(np.cumsum(per_run) - per_run, per_run)
        fe, s = f[run], row * _ROW
        lo, hi = np.maximum(k0[run], s), np.minimum(k1[run], s + _ROW)
        whole = (lo == s) & (hi == np.minimum(s + _ROW, count))
        base = fe // up
        phase = fe - up * base
        xs = s + base - self.e_max  # input index of each entry's window
        xa = int(xs.min())
        window = self._windows(xa, int(xs.max()) + self.width)
        offs = xs - xa
        frac0 = ((self.u0 - fe) + self.d * s).astype(np.float32)  # a at each row's start
        # Phase by phase, whole rows first (then the entries to merge).
        key = (2 * phase + ~whole).astype(np.int8)
        order = np.argsort(key, kind="stable")  # a radix sort
        bounds = np.searchsorted(key[order], np.arange(2 * up + 1))
        out = target[: (rb - ra) * _ROW].reshape(-1, _ROW)
        partial: list[tuple[np.ndarray, np.ndarray]] = []
        for ph in range(up):
            group = order[bounds[2 * ph] : bounds[2 * ph + 2]]
            n_whole = int(bounds[2 * ph + 1] - bounds[2 * ph])
            size = -(-group.size // -(-group.size // self._batch_max)) if group.size else 1
            for b0 in range(0, group.size, size):
                idx = group[b0 : b0 + size]
                m = idx.size
                rows = row[idx] - ra
                n_w = min(max(n_whole - b0, 0), m)
                direct = n_w == m and rows[-1] - rows[0] == m - 1
                dst = out[rows[0] : rows[0] + m] if direct else self._res[:m]
                self._batch(ph, window, offs[idx], frac0[idx], dst)
                if direct:
                    continue
                if n_w:
                    out[rows[:n_w]] = dst[:n_w]
                if n_w < m:
                    partial.append((idx[n_w:], dst[n_w:].copy()))
        if partial:
            # Each crossed row is split among its entries: write each entry's own samples.
            idx = np.concatenate([p[0] for p in partial])
            vals = np.concatenate([p[1] for p in partial])
            j = np.arange(_ROW)
            mine = (j >= (lo[idx] - s[idx])[:, None]) & (j < (hi[idx] - s[idx])[:, None])
            out.reshape(-1)[((s[idx] - ra * _ROW)[:, None] + j)[mine]] = vals[mine]

    def _windows(self, xa: int, xb: int) -> np.ndarray:
        """Every row window of ``x[xa:xb]`` (zero outside ``x``), real and imaginary parts apart.

        With one filter the rows are consecutive and copied as one strided block, so the
        windows read the interleaved samples (``x`` itself when it is ``complex64`` and covers
        the span). With two, rows are gathered phase by phase, and a gather from separate
        real and imaginary rows comes out contiguous: the span is split into those first.

        Returns
        -------
        numpy.ndarray
            ``float32`` view, shape ``(xb - xa - width + 1, 2, width)``: ``[i, 0, t]`` is the
            real part of ``x[xa + i + t]``, ``[i, 1, t]`` its imaginary part; valid until the
            next call.
        """
        x, n, need = self.x, self.x.size, xb - xa
        a = max(xa, 0)
        b = max(min(xb, n), a)  # x[a:b] lies in the span, the rest is zero
        rows = need - self.width + 1
        if self.slope is None:
            if x.dtype == np.complex64 and xa == a and xb == b and x.flags.c_contiguous:
                span = x[xa:xb]
            else:
                if self._span.size < need:
                    self._span = np.empty(need + need // 8, dtype=np.complex64)
                span = self._span[:need]
                span[: a - xa] = 0.0
                span[a - xa : b - xa] = x[a:b]
                span[b - xa :] = 0.0
            return np.ndarray(
                (rows, 2, self.width), dtype=np.float32, buffer=span, strides=(8, 4, 8)
            )
        if self._span.size < need:
            self._span = np.empty(need + need // 8, dtype=np.complex64)
        flat = self._span.view(np.float32)
        size = flat.size // 2
        planes = flat.reshape(2, size)
        planes[:, : a - xa] = 0.0
        if x.dtype == np.complex64:
            planes[0, a - xa : b - xa] = x.real[a:b]
            planes[1, a - xa : b - xa] = x.imag[a:b]
        else:
            # Rounded to single precision a block at a time (one contiguous cast), then
            # split while the block is in the cache.
            block = np.empty(min(_SPLIT_BLOCK, b - a), dtype=np.complex64)
            for c in range(a, b, _SPLIT_BLOCK):
                e = min(c + _SPLIT_BLOCK, b)
                part = block[: e - c]
                part[:] = x[c:e]
                planes[0, c - xa : e - xa] = part.real
                planes[1, c - xa : e - xa] = part.imag
        planes[:, b - xa : need] = 0.0
        return np.ndarray(
            (rows, 2, self.width), dtype=np.float32, buffer=planes,
            strides=(4, 4 * size, 4),
        )

    def _batch(
        self, phase: int, window: np.ndarray, offs: np.ndarray, frac0: np.ndarray, dst: np.ndarray
    ) -> None:
        """Rows of one phase into ``dst`` (``complex64``, shape ``(m, _ROW)``).

        Parameters
        ----------
        phase
            Fine phase ``q`` of every row.
        window
            Row windows (:meth:`_windows`), shape ``(L, 2, width)``.
        offs
            Each row's window in ``window``, shape ``(m,)``.
        frac0
            The fraction ``a`` at each row's first sample, ``float32 (m,)`` (unused with one
            filter).
        """
        m, width = offs.size, self.width
        if m == 1 or (
            offs[-1] - offs[0] == _ROW * (m - 1) and bool(np.all(np.diff(offs) == _ROW))
        ):
            xw = np.ascontiguousarray(window[offs[0] : offs[-1] + 1 : _ROW])  # consecutive rows
        else:
            xw = window[offs]
        xw2 = xw.reshape(2 * m, width)  # rows: entry 0 real, entry 0 imaginary, entry 1 ...
        ks = _BLOCK + self.n_taps - 1
        level = self._y[0, : 2 * m * _ROW].reshape(2 * m, _ROW)
        slope = self._y[1, : 2 * m * _ROW].reshape(2 * m, _ROW)
        for i, b in enumerate(range(0, _ROW, _BLOCK)):
            part = xw2[:, b : b + ks]
            np.matmul(part, self.level[phase, i], out=level[:, b : b + _BLOCK])
            if self.slope is not None:
                np.matmul(part, self.slope[phase], out=slope[:, b : b + _BLOCK])
        level3 = level.reshape(m, 2, _ROW)
        if self.slope is None:
            np.copyto(dst.real, level3[:, 0])
            np.copyto(dst.imag, level3[:, 1])
            return
        slope3 = slope.reshape(m, 2, _ROW)
        np.multiply(slope3, frac0[:, None, None], out=slope3)
        np.add(level3, slope3, out=level3)
        np.copyto(dst.real, level3[:, 0])
        np.copyto(dst.imag, level3[:, 1])
