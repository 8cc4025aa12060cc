"""Every frame of a set of preamble roots in one capture: the TDMA receiver's collision check.

The receiver's own frame search (:func:`radio.sync.coarse_sync`, then correlation) looks for
*one* frame and keeps the strongest repetition peak: a second frame that starts within two
repetition periods of a stronger one is not a candidate of its own, and a frame 6 dB below
another one overlapping it scores under the detection threshold. Used to tell whether another
device's frame is in a device's window, it missed exactly the collisions that matter (two
bursts on top of each other), and the pilots then counted the other device's signal as noise.

This module searches the whole capture for each root's preamble at every position and every
frequency offset the receiver accepts:

* the capture is frequency-corrected at :data:`COARSE_STEPS` offsets across the receiver's
  range ``+- fs / (2 P)`` (``P``: samples per repetition) and matched-filtered;
* each root's one-period correlation ``c(tau)`` is computed for every lag at once (FFT, all
  roots together, in single precision: ``rho`` stays within 1e-6 of the double-precision
  statistic wherever the capture's energy is within about 70 dB of its strongest part);
* the ``R`` repetitions are combined coherently, ``sum_k c(tau + k P) exp(-j 2 pi f k P / fs)``,
  at :data:`FINE_STEPS` residual offsets around each coarse one, so that the residual phase
  ramp over the whole preamble stays under a quarter turn;
* normalised by the energy under the preamble, the statistic ``rho`` is 1 for a clean frame,
  about ``sqrt(P_1 / P_total)`` for a frame of power ``P_1`` among others, and on anything
  else (noise, payload) has ``P(rho > t) = (1 - t^2)^(R L - 1)`` per position and offset
  (``L``: sequence length; ``rho^2`` is Beta(1, R L - 1) there).

The threshold (:func:`detection_threshold`) keeps the expected number of false detections in
one search below :data:`FALSE_ALARM`, counting every lag, offset and root searched. A false
detection costs one upload (it is reported as a collision); a missed one would credit
another device's signal as noise, so the search errs towards the former.
Derivation and the limits (how weak a colliding frame can be and still be found) in
``docs/radio.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import fft as sp_fft
from scipy.fft import next_fast_len

from radio.framing import WaveformParams, zadoff_chu
from radio.modem import pulse_taps

#: Coarse frequency hypotheses across the receiver's range ``+- fs / (2 P)``: the capture is
#: corrected at each, leaving at most ``fs / (2 P COARSE_STEPS)`` within one repetition (a
#: sixth of a turn over it for 3).
COARSE_STEPS = 3
#: Residual offsets combined around each coarse one (odd).
FINE_STEPS = 5
#: Lags per FFT block (the capture is searched block by block: FFTs stay in cache and the
#: cost linear in its length).
_BLOCK_LAGS = 1 << 14
#: Expected false detections per search (all lags, offsets and roots together).
FALSE_ALARM = 1e-5
#: Where a stronger frame of another root (or the postamble) is within a preamble's length,
#: ``rho`` must reach this: one Zadoff-Chu sequence correlates with another to exactly
#: ``1/sqrt(L)`` only at whole-symbol lags and no frequency offset. At fractional lags,
#: across a repetition's edge and under an offset, the leak measured up to 0.39 (all 34 x 33
#: root pairs of length 37, random offsets and payloads: ``tests/test_preamble_search.py``),
#: above the threshold's 0.39-0.42 for one round's capture.
CROSSTALK_RHO = 0.45


@dataclass(frozen=True)
class FoundPreamble:
    """One frame's preamble found in a capture.

    Attributes
    ----------
    root
        Its Zadoff-Chu root.
    start
        Sample index in the capture where its frame's burst starts (the first guard symbol,
        as :func:`radio.modem.modulate` lays it out).
    rho
        The detection statistic there, in ``[0, 1]``.
    cfo_hz
        The frequency offset hypothesis that scored it (Hz).
    """

    root: int
    start: int
    rho: float
    cfo_hz: float


def detection_threshold(params: WaveformParams, n_samples: int, n_roots: int) -> float:
    """The ``rho`` a frame must reach: ``sqrt(1 - (FALSE_ALARM / tests) ** (1 / (R L - 1)))``.

    ``tests`` counts every lag of an ``n_samples`` capture (the search's; the symbol-spaced
    ones alone are the independent ones, but the measured tail was heavier), times the
    frequency hypotheses and ``n_roots``. On circular Gaussian samples ``rho^2`` is
    Beta(1, R L - 1) at each (the squared cosine between a random vector of ``C^(R L)``
    and a fixed one), so each exceeds ``t`` with probability ``(1 - t^2)^(R L - 1)`` and the
    expected count of false detections is at most ``FALSE_ALARM`` (union bound).
    """
    tests = max(n_samples, 1) * COARSE_STEPS * FINE_STEPS
    tests *= max(n_roots, 1)
    known = params.zc_length * params.preamble_repeats
    return math.sqrt(1.0 - (FALSE_ALARM / tests) ** (1.0 / (known - 1)))


def false_alarm_probability(params: WaveformParams, threshold: float) -> float:
    """``P(rho > threshold)`` at one position and hypothesis on circular Gaussian samples:
    ``(1 - t^2)^(R L - 1)``."""
    known = params.zc_length * params.preamble_repeats
    return float((1.0 - min(threshold, 1.0) ** 2) ** (known - 1))


def preamble_statistic(
    samples: np.ndarray, params: WaveformParams, roots: Iterable[int],
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The detection statistic of each root at every lag, best over the frequency hypotheses
    (:class:`PreambleScan` fed the whole capture at once).

    Parameters
    ----------
    samples
        Received complex baseband samples, shape ``(n,)``.
    params
        The waveform (its ``zc_root`` is ignored: ``roots`` are searched).
    roots
        Zadoff-Chu roots.

    Returns
    -------
    dict
        ``{root: (rho, cfo_hz)}``, each of shape ``(n_lag,)``: ``rho[tau]`` in ``[0, 1]`` for
        a preamble whose first symbol peaks at matched-filter sample ``tau``, and the coarse
        frequency hypothesis that scored it (Hz). Empty arrays where ``samples`` is shorter
        than one preamble.
    """
    r = np.asarray(samples)
    scan = PreambleScan(params, roots, r.size)
    scan.feed(r)
    return scan.result()


def search_roots(params: WaveformParams, roots: Iterable[int]) -> list[int]:
    """The roots :func:`find_preambles` searches for ``roots``: those and the postamble's
    (its repetitions leak into other roots as a preamble does, see :data:`CROSSTALK_RHO`,
    so where it is must be known), ascending."""
    return sorted(set(int(r) for r in roots) | {params.postamble_root})


class PreambleScan:
    """:func:`preamble_statistic` of a capture of ``n_samples`` fed piece by piece, in time
    order (a receiver searching a round's capture while its later slots are on the air).

    The lags are searched in blocks of :data:`_BLOCK_LAGS`, each as soon as the samples it
    reads are in (its lags, the preamble after them and the pulse before them); the blocks
    and their arithmetic are the same however the capture is cut, so the statistic is bit
    for bit the one of the whole capture at once.

    Parameters
    ----------
    params
        The waveform (its ``zc_root`` is ignored: ``roots`` are searched).
    roots
        Zadoff-Chu roots.
    n_samples
        The capture's length (samples).
    """

    def __init__(self, params: WaveformParams, roots: Iterable[int], n_samples: int) -> None:
        self.root_list = sorted(set(int(r) for r in roots))
        self.params = params
        self.n_samples = int(n_samples)
        sps = params.samples_per_symbol
        L = params.zc_length
        R = params.preamble_repeats
        self.period = L * sps
        span = (L - 1) * sps + 1  # one repetition's symbols, in samples
        self.taps = pulse_taps(params)
        self.n_lag = max(self.n_samples + self.taps.size - 1 - (R - 1) * self.period - span + 1,
                         0)
        fs = params.sample_rate_hz
        coarse_range = fs / (2 * self.period)
        self.coarse = np.linspace(-coarse_range, coarse_range, 2 * COARSE_STEPS + 1)[1::2]
        fine_half = coarse_range / COARSE_STEPS
        fine = np.linspace(-fine_half, fine_half, FINE_STEPS)
        # (F, R): the repetitions' weights of each residual offset. The correlations are
        # computed in single precision (rho is compared with thresholds near 0.4; the
        # statistic moves by under 1e-6): it halves the search's time.
        self.combine = np.exp(-2j * np.pi * np.outer(fine, np.arange(R)) * self.period / fs
                              ).astype(np.complex64)
        #: Matched-filter samples past a lag that its statistic reads.
        self.tail = (R - 1) * self.period + span - 1
        self.nfft = next_fast_len(min(max(self.n_lag, 1), _BLOCK_LAGS) + self.tail)
        self.block = self.nfft - self.tail
        refs = np.zeros((len(self.root_list), span), dtype=np.complex128)
        for j, root in enumerate(self.root_list):
            refs[j, ::sps] = zadoff_chu(L, root)
        self.ref_spectra = np.conj(sp_fft.fft(refs, self.nfft, axis=-1)).astype(np.complex64)
        self.best2 = np.zeros((len(self.root_list), self.n_lag))
        self.at = np.zeros((len(self.root_list), self.n_lag))
        self.samples = np.zeros(self.n_samples, dtype=np.complex128)
        #: Samples fed so far, and lags searched so far.
        self.filled = 0
        self.searched = 0

    def feed(self, samples: np.ndarray) -> None:
        """The capture's next samples, shape ``(m,)``; searches every block they complete.

        Raises
        ------
        ValueError
            More samples than the capture holds.
        """
        x = np.asarray(samples)
        if self.filled + x.size > self.n_samples:
            raise ValueError(f"samples: {self.filled + x.size} fed to a capture of "
                             f"{self.n_samples}")
        self.samples[self.filled : self.filled + x.size] = x
        self.filled += x.size
        complete = self.filled == self.n_samples
        # A lag's statistic reads matched-filter samples up to lag + tail, which read the
        # capture up to the same index (the pulse reaches back): in once fed that far.
        ready = self.n_lag if complete else min(self.n_lag, self.filled - self.tail)
        while self.searched < self.n_lag and self.searched < ready:
            b = min(self.block, self.n_lag - self.searched)
            if self.searched + b > ready:
                break  # a block is searched whole, as from the whole capture
            self._search(self.searched, b)
            self.searched += b

    def holds_start_of(self, samples: np.ndarray, roots: Sequence[int]) -> bool:
        """Whether this scan searches ``roots`` (ascending) over a capture of
        ``samples``' length and was fed exactly its first samples."""
        x = np.asarray(samples)
        return (self.root_list == list(roots) and self.n_samples == x.size
                and bool(np.array_equal(self.samples[: self.filled], x[: self.filled])))

    def result(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``{root: (rho, cfo_hz)}`` as :func:`preamble_statistic` returns them.

        Raises
        ------
        ValueError
            The capture is not all fed yet.
        """
        if self.filled != self.n_samples:
            raise ValueError(f"the scan has {self.filled} of {self.n_samples} samples")
        return {root: (np.sqrt(np.minimum(self.best2[j], 1.0)), self.at[j])
                for j, root in enumerate(self.root_list)}

    def _search(self, a: int, b: int) -> None:
        """The statistic at lags ``a .. a + b - 1``."""
        params = self.params
        sps = params.samples_per_symbol
        R, L = params.preamble_repeats, params.zc_length
        fs = params.sample_rate_hz
        ntaps = self.taps.size
        # mf[k] (the full convolution) reads the capture at k - ntaps + 1 .. k: zeros before
        # its start and after its end.
        lo, hi = a - (ntaps - 1), a + b + self.tail
        seg = np.zeros(hi - lo, dtype=np.complex128)
        src0, src1 = max(lo, 0), min(hi, self.n_samples)
        seg[src0 - lo : src1 - lo] = self.samples[src0:src1]
        n = np.arange(lo, hi)
        from scipy import signal  # imported on use, as radio.pulse: 0.6 s for every CLI process
        for f0 in self.coarse:
            corrected = seg * np.exp(-2j * np.pi * float(f0) / fs * n)
            mf = signal.oaconvolve(corrected, self.taps, mode="valid")  # mf[a : hi]
            # R L |X|^2 / rho^2: the energy under the R L preamble symbols at each lag
            norm = (R * L) * _strided_sums(np.abs(mf) ** 2, sps, R * L)[:b]
            inv = 1.0 / np.maximum(norm, 1e-300)
            spectrum = sp_fft.fft(mf.astype(np.complex64), self.nfft)
            c_all = sp_fft.ifft(spectrum * self.ref_spectra, axis=-1)  # (roots, nfft)
            for j, c in enumerate(c_all):
                x2 = None
                for weights in self.combine:
                    x = weights[0] * c[:b]
                    for k in range(1, R):
                        x += weights[k] * c[k * self.period : k * self.period + b]
                    m2 = x.real**2
                    m2 += x.imag**2
                    x2 = m2 if x2 is None else np.maximum(x2, m2, out=x2)
                assert x2 is not None
                rho2 = x2 * inv
                best, where = self.best2[j, a : a + b], self.at[j, a : a + b]
                better = rho2 > best
                best[better] = rho2[better]
                where[better] = f0


def _strided_sums(x: np.ndarray, step: int, count: int) -> np.ndarray:
    """``out[i] = sum_{m < count} x[i + m step]`` for every ``i`` with the last term inside
    ``x``, shape ``(x.size - (count - 1) step,)``."""
    n = x.size - (count - 1) * step
    rows = -(-x.size // step)
    padded = np.zeros(rows * step)
    padded[: x.size] = x
    c = np.zeros((rows + 1, step))
    np.cumsum(padded.reshape(rows, step), axis=0, out=c[1:])
    flat = c.reshape(-1)  # flat[i] = sum of x[j] for j < i with j = i (mod step)
    return flat[count * step : count * step + n] - flat[:n]


def find_preambles(
    samples: np.ndarray, params: WaveformParams, roots: Iterable[int],
    threshold: float | None = None, scan: PreambleScan | None = None,
) -> list[FoundPreamble]:
    """Every frame of each root in ``roots`` whose preamble lies whole in ``samples``.

    Parameters
    ----------
    samples
        Received complex baseband samples, shape ``(n,)``.
    params
        The waveform (its ``zc_root`` is ignored: ``roots`` are searched).
    roots
        Zadoff-Chu roots to look for.
    threshold
        Minimum ``rho``; default :func:`detection_threshold` for this search.
    scan
        The statistic of ``samples`` searched already, or part of it (:func:`search_roots`
        of ``roots``, fed ``samples`` from their start): fed the rest and used. ``None``:
        searched here.

    Returns
    -------
    list[FoundPreamble]
        One per frame found, ordered by root then position. Positions of one root closer
        than a preamble's length are one frame (the best kept).
    """
    wanted = sorted(set(int(r) for r in roots))
    searched = search_roots(params, wanted)
    r = np.asarray(samples)
    if scan is None:
        scan = PreambleScan(params, searched, r.size)
    elif not scan.holds_start_of(r, searched):
        raise ValueError(f"scan: of roots {scan.root_list} over {scan.n_samples} samples, "
                         f"fed {scan.filled}; not the start of these samples ({r.size}, "
                         f"roots {searched})")
    scan.feed(r[scan.filled :])
    stats = scan.result()
    n = int(np.asarray(samples).size)
    t = detection_threshold(params, n, len(wanted)) if threshold is None else threshold
    sps = params.samples_per_symbol
    delay = (pulse_taps(params).size - 1) // 2
    width = params.preamble_repeats * params.zc_length * sps
    peaks = [(root, tau, value, float(cfo[tau]))
             for root, (rho, cfo) in stats.items()
             for tau, value in _peaks(rho, min(t, CROSSTALK_RHO), width)]
    found = []
    for root, tau, value, cfo_hz in peaks:
        if root not in wanted or value < t:
            continue
        leak = any(other != root and abs(at - tau) <= width and v >= value
                   for other, at, v, _ in peaks)
        if leak and value < CROSSTALK_RHO:
            continue  # explained by a stronger frame's sequence next to it
        # mf lag of the first preamble symbol -> first sample of the burst
        start = tau - 2 * delay - params.guard_symbols * sps
        found.append(FoundPreamble(root=root, start=int(start), rho=value, cfo_hz=cfo_hz))
    return found


def _peaks(rho: np.ndarray, threshold: float, width: int) -> list[tuple[int, float]]:
    """The largest ``rho`` of each run of positions above ``threshold`` (runs closer than
    ``width`` are one)."""
    above = np.flatnonzero(rho >= threshold)
    if above.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(above) > width) + 1
    out = []
    for run in np.split(above, breaks):
        k = int(run[np.argmax(rho[run])])
        out.append((k, float(rho[k])))
    return out
