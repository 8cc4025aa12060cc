"""The medium of one AirComp round: what the receiver knows of each path, and the slot.

Two kinds, one interface (:class:`AirCompSlot`), used by
:class:`aggregator.aircomp_round.AirCompRound`:

* :class:`SymbolSlot` (the ``symbol`` link): each device's gain over the upload is drawn
  and known (simulation); a device pre-equalizes with the gain at the start of its upload,
  and the bounds on its misalignment are the realized ones. The receiver's ``N0`` is known.
* :class:`FrameSlot` (the ``waveform`` and ``gnuradio`` links): each device sends a pilot
  frame alone first; the receiver estimates its gain with a confidence radius
  (:func:`radio.aircomp_air.estimate_pilot`) and its own ``N0`` with a lower bound; then
  every participant's frame goes through the medium at once
  (:func:`radio.aircomp_air.render`, :meth:`radio.frame_link.FrameLink.carry_air`). The
  bounds the accountant credits are confidence bounds (their failure probability goes into
  ``delta_total``) and the burst timing error's effect on the others' noise
  (:func:`radio.aircomp_air.noise_gain_lower`).

The receiver's noise ``N0`` is the best device's (the highest ``snr_db``); a device with a
lower ``snr_db`` arrives through a correspondingly weaker path (path loss), so each device
still sees its configured SNR at unit power.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from radio.aircomp import superpose
from radio.aircomp_air import (
    PILOT_SYMBOLS,
    PROBE_SYMBOLS,
    PilotEstimate,
    decode_sum,
    draw_paths,
    estimate_pilot,
    frame_scale,
    noise_gain_lower,
    pilot_sequence,
    render,
    slot_frame,
    slot_symbols,
    with_probe,
)
from radio.frame_link import FrameLink
from radio.link import ChannelState, Link, LinkError
from radio.modem import modulate
from radio.symbol_link import SymbolLink
from testbed.core.seeding import Stream, experiment_generator

#: ``Stream.AIR_SLOT`` indices: the slot's noise, the round's paths, the pilots' noise.
_SLOT, _PATHS, _PILOTS = 0, 1, 2


class AirCompSlot(ABC):
    """What the receiver knows before the slot, and the slot itself.

    Attributes
    ----------
    h_hat
        Device -> the gain it pre-equalizes with (devices whose pilot was lost are absent).
    n0_lower
        The receiver noise ``N0`` (per complex symbol) credited, a lower bound.
    pilot_airtime_s
        Air time of the round's pilots (s).
    """

    h_hat: dict[int, complex]
    n0_lower: float
    pilot_airtime_s: float = 0.0

    @abstractmethod
    def rho_bounds(self, i: int) -> tuple[float, float]:
        """``(rho_lo, rho_hi)``: bounds on device ``i``'s ``|h_i alpha_i| / c`` (``rho_lo``
        also bounds what the path does to its noise, from below)."""

    @abstractmethod
    def failure_prob(self, participants: int, receiver_credited: bool) -> float:
        """Probability that any bound a round of ``participants`` credits is wrong."""

    @abstractmethod
    def transmit(self, values: dict[int, np.ndarray], alpha: dict[int, complex],
                 amplitude: float, round_index: int, signal_power: float) -> np.ndarray | None:
        """Every participant's symbols, each followed by its probe at amplitude
        ``sqrt(signal_power)`` (:func:`radio.aircomp_air.with_probe`), in one slot; the
        decoded sum ``y / c`` (complex, ``(n_sym + PROBE_SYMBOLS,)``), or ``None`` when the
        slot's frame was lost. ``signal_power`` bounds ``E|x_j|^2`` per symbol (a frame's
        preamble and pilots go at that power)."""

    def slot_airtime_s(self, n_sym: int, symbol_rate_hz: float, probe: bool = True) -> float:
        """Air time of the shared slot (s): the values and the probe (``probe=False``: one
        device's upload of ``n_sym`` symbols in a TDMA slot)."""
        return (n_sym + (PROBE_SYMBOLS if probe else 0)) / symbol_rate_hz


class SymbolSlot(AirCompSlot):
    """The ``symbol`` link's slot: gains drawn and known."""

    def __init__(self, link: SymbolLink, seed: int, t: int, asked: list[int], n_sym: int
                 ) -> None:
        self.link, self.seed, self.t = link, seed, t
        probed: dict[int, ChannelState] = {
            i: link.probe(device=i, round_index=t, n_symbols=n_sym + PROBE_SYMBOLS,
                          rng=experiment_generator(seed, Stream.CHANNEL, i, t))
            for i in asked}
        self.n0_lower = min((s.noise_var for s in probed.values()), default=0.0)
        n0 = self.n0_lower
        #: per device: gain over the upload and its probe (path loss included),
        #: shape (n_sym + PROBE_SYMBOLS,)
        self.gains = {i: s.gain * (math.sqrt(n0 / s.noise_var) if s.noise_var > 0 else 1.0)
                      for i, s in probed.items()}
        self.h_hat = {i: complex(g[0]) for i, g in self.gains.items()}

    def rho_bounds(self, i: int) -> tuple[float, float]:
        rho = np.abs(self.gains[i]) / abs(self.h_hat[i])
        return float(rho.min()), float(rho.max())

    def failure_prob(self, participants: int, receiver_credited: bool) -> float:
        return 0.0

    def transmit(self, values: dict[int, np.ndarray], alpha: dict[int, complex],
                 amplitude: float, round_index: int, signal_power: float) -> np.ndarray | None:
        order = sorted(values)
        a = float(np.sqrt(signal_power))
        sent = np.stack([alpha[i] * with_probe(values[i], round_index, i, a) for i in order])
        gains = np.stack([self.gains[i] for i in order])
        rng = experiment_generator(self.seed, Stream.AIR_SLOT, _SLOT, round_index)
        return superpose(sent, gains, self.n0_lower, rng, self.link.noise) / amplitude


class PilotSlot(AirCompSlot):
    """A slot whose paths were estimated from pilot frames: the bounds from the pilots'
    confidence intervals and the burst timing error.

    Attributes
    ----------
    estimates
        Device -> its pilot's estimate (devices whose pilot was lost are absent).
    kappa
        :func:`radio.aircomp_air.noise_gain_lower` of the burst timing error.
    alpha_fail
        ``1 - confidence`` of each interval.
    """

    estimates: dict[int, PilotEstimate]
    kappa: float
    alpha_fail: float

    def _settle(self, estimates: dict[int, PilotEstimate]) -> None:
        """Keep the estimates; set ``h_hat`` and the receiver's ``n0_lower``."""
        self.estimates = estimates
        self.h_hat = {i: e.h_hat for i, e in estimates.items() if e.h_hat != 0}
        self.n0_lower = min((e.noise_var_lower for e in estimates.values()), default=0.0)

    def rho_bounds(self, i: int) -> tuple[float, float]:
        lo, hi = self.estimates[i].abs_bounds()
        mag = abs(self.h_hat[i])
        return self.kappa * lo / mag, hi / mag

    def failure_prob(self, participants: int, receiver_credited: bool) -> float:
        # one |h| interval per participant; the receiver's N0 lower bound (one-sided)
        fail = participants * self.alpha_fail
        return min(1.0, fail + (self.alpha_fail / 2.0 if receiver_credited else 0.0))


class FrameSlot(PilotSlot):
    """A waveform link's slot: pilots, then every participant's frame at once.

    Parameters
    ----------
    link
        A :class:`~radio.frame_link.FrameLink` with a ``channel`` (per-device SNR).
    timing_error_samples
        Bound on each burst's timing error (samples; ``waveform.aircomp_timing_error_samples``).
    """

    def __init__(self, link: FrameLink, seed: int, t: int, asked: list[int],
                 timing_error_samples: float) -> None:
        self.link, self.seed, self.t = link, seed, t
        channel = link.channel  # type: ignore[attr-defined]
        wf = link.waveform
        n0s = {i: channel.noise_var(i) for i in asked}
        self.n0 = min(n0s.values(), default=1.0)
        n = max(asked, default=-1) + 1
        mags = np.ones(n)
        for i, v in n0s.items():
            mags[i] = math.sqrt(self.n0 / v) if v > 0 else 1.0
        self.paths = draw_paths(mags, timing_error_samples,
                                experiment_generator(seed, Stream.AIR_SLOT, _PATHS, t))
        self.kappa = noise_gain_lower(timing_error_samples, wf.samples_per_symbol, wf.rolloff)
        self.alpha_fail = 1.0 - link.confidence
        pilots = pilot_sequence()
        frame, _ = modulate(wf, pilots)
        rng = experiment_generator(seed, Stream.AIR_SLOT, _PILOTS, t)
        estimates: dict[int, PilotEstimate] = {}
        self.lost: dict[int, str] = {}
        for i in asked:
            carried = link.carry_air(render({i: frame}, {i: 1.0}, self.paths),
                                     noise_var=self.n0, rng=rng)
            try:
                rec = link.receive(carried, PILOT_SYMBOLS, device=i, round_index=t)
            except LinkError as exc:
                self.lost[i] = str(exc)
                continue
            estimates[i] = estimate_pilot(rec, pilots)
        self._settle(estimates)
        self.pilot_airtime_s = (len(asked) * slot_symbols(wf, PILOT_SYMBOLS)
                                / wf.symbol_rate_hz)

    def transmit(self, values: dict[int, np.ndarray], alpha: dict[int, complex],
                 amplitude: float, round_index: int, signal_power: float) -> np.ndarray | None:
        # Each device sends its frame's preamble and pilots at the power of its values
        # (``|alpha|^2 E|x|^2 <= P_max``) and pre-equalized like them, so the summed pilots
        # measure the common phase of the sum: frame(x / a) * alpha a, a = sqrt(E|x|^2).
        wf = self.link.waveform
        frames = {i: slot_frame(wf, v, round_index, i, signal_power) for i, v in values.items()}
        samples = render(frames, {i: frame_scale(alpha[i], signal_power) for i in frames},
                         self.paths)
        rng = experiment_generator(self.seed, Stream.AIR_SLOT, _SLOT, round_index)
        carried = self.link.carry_air(samples, noise_var=self.n0, rng=rng)
        n_sym = next(iter(values.values())).size + PROBE_SYMBOLS
        try:
            rec = self.link.receive(carried, n_sym, device=min(values), round_index=round_index)
        except LinkError:
            return None
        return decode_sum(rec, amplitude)

    def slot_airtime_s(self, n_sym: int, symbol_rate_hz: float, probe: bool = True) -> float:
        wf = self.link.waveform
        return slot_symbols(wf, n_sym + (PROBE_SYMBOLS if probe else 0)) / wf.symbol_rate_hz


def make_slot(link: Link, seed: int, t: int, asked: list[int], n_sym: int,
              timing_error_samples: float) -> AirCompSlot:
    """The slot of round ``t`` on ``link``.

    Raises
    ------
    TypeError
        A link that carries no AirComp slot.
    """
    if isinstance(link, SymbolLink):
        return SymbolSlot(link, seed, t, asked, n_sym)
    if isinstance(link, FrameLink) and hasattr(link, "channel"):
        return FrameSlot(link, seed, t, asked, timing_error_samples)
    raise TypeError(f"scheme aircomp runs on the symbol, waveform and gnuradio links, not "
                    f"{link.name!r}")
