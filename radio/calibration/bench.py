"""The measurements of a bench calibration, made through the ``tx``/``rx`` flowgraphs.

:class:`Bench` holds the receiver (:class:`radio.usrp_stream.RxStream`) and, one at a time,
a transmitter (:class:`radio.usrp_stream.TxStream`): it sends known timed bursts (a frame of
constant-modulus symbols, :func:`probe_symbols`), cuts the receiver's window where each is
due and demodulates it (:func:`radio.modem.demodulate`: arrival time to a fraction of a
sample, carrier offset, complex gain, SNR). It also captures noise with nothing on the air,
watches the stream for overflows and backlog, and sends a burst after its time on purpose to
see that the device reports it late and that nothing of it reaches the air.

Time bases (docs/lab.md, "Clocks"): with a shared reference every USRP reads the host's UNIX
second latched at a PPS edge, so a burst due at transmitter time ``T`` is expected at
receiver time ``T`` (minus whole seconds a wrong latch put between them); without, both
USRP clocks are mapped to this host's clock by XML-RPC readings
(:func:`radio.edge_radio.usrp_minus_host`) and the expectation carries their uncertainty.

Units: times in s on the named clock, powers in the receiver's output units (full scale 1)
unless said otherwise, amplitudes in DAC full-scale units.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from radio.edge_radio import usrp_minus_host
from radio.framing import WaveformParams
from radio.link import LinkError, LinkFailed, ReceiverGap
from radio.modem import demodulate, modulate
from radio.sync import SyncError
from radio.time_sync import OffsetEstimate
from radio.usrp_stream import RxStream, TxStream

#: UHD's async event code of a burst that reached the device after its time.
EVENT_TIME_ERROR = 0x8
#: Window margin (s) on either side of a burst's expected arrival with a shared reference.
SHARED_MARGIN_S = 2e-3
#: Window margin (s) without one, added to three times the mappings' uncertainty.
FREE_MARGIN_S = 5e-3
#: Seconds after a late burst's time before its report is read.
LATE_REPORT_WAIT_S = 0.3
#: Seconds per read of a noise capture.
NOISE_CHUNK_S = 0.25


def probe_symbols(n: int, seed: int = 45) -> np.ndarray:
    """``n`` QPSK symbols of unit modulus (``complex128``, shape ``(n,)``): the payload of
    every calibration burst (a unit-power symbol stream exactly)."""
    if n < 1:
        raise ValueError(f"n: got {n}; allowed: an integer >= 1")
    k = np.random.default_rng(seed).integers(0, 4, n)
    return np.exp(1j * (np.pi / 2 * k + np.pi / 4))


@dataclass(frozen=True)
class BurstResult:
    """One timed burst and what the receiver found of it.

    Attributes
    ----------
    amplitude
        DAC amplitude of the unit-power symbol stream (full scale 1).
    tx_time_s
        When it was due, on the transmitter's clock.
    expected_rx_s
        When the receiver expected it, on the receiver's clock.
    timing_error_s
        Where the frame started minus ``expected_rx_s`` (s; ``nan`` when not found).
    gain_power
        ``|g|^2``: received output power per DAC unit power (rx units; ``nan`` if lost).
    cfo_hz, snr_db
        Carrier offset and pilot Es/N0 (dB) the receiver estimated (``nan`` if lost).
    noise_var
        Noise power per sample the pilots estimated (rx units; ``nan`` if lost).
    error
        Why it was not found (empty when it was).
    """

    amplitude: float
    tx_time_s: float
    expected_rx_s: float
    timing_error_s: float
    gain_power: float
    cfo_hz: float
    snr_db: float
    noise_var: float
    error: str = ""

    @property
    def found(self) -> bool:
        """Whether the receiver found the frame."""
        return not self.error


@dataclass(frozen=True)
class LateCheck:
    """A burst handed over after its time, on purpose.

    Attributes
    ----------
    reported
        The device reported it late (``TIME_ERROR``: the late count rose, or an async event
        with that code came).
    on_air
        Its frame was found at the receiver (it was radiated after all).
    late_count
        The device's late-burst count after it.
    """

    reported: bool
    on_air: bool
    late_count: int


@dataclass(frozen=True)
class StreamWatch:
    """The receiver's stream watched for a while.

    Attributes
    ----------
    seconds
        USRP seconds streamed since the stream began.
    overflows, lost_samples
        Gaps in the stream (and samples lost in them; ``-1`` where the device does not say).
    max_backlog_s
        Largest delay of delivered samples behind the USRP's time seen (s).
    capacity_s
        Seconds of samples the ring holds: a backlog past it loses samples.
    """

    seconds: float
    overflows: int
    lost_samples: int
    max_backlog_s: float
    capacity_s: float

    @property
    def margin_s(self) -> float:
        """Ring capacity minus the largest backlog (s): the capture's real-time margin."""
        return self.capacity_s - self.max_backlog_s


class Bench:
    """The receiver of a calibration and the bursts sent to it.

    Parameters
    ----------
    rx
        The receiver's stream (started; its USRP time latched as configured).
    waveform
        Frame numerology (the receiver's sample rate).
    shared_time
        Whether every USRP keeps the PPS-latched host time (module docstring).
    clock
        This host's clock (s).
    """

    def __init__(self, rx: RxStream, waveform: WaveformParams, *, shared_time: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.rx = rx
        self.waveform = waveform
        self.shared_time = shared_time
        self.clock = clock
        self.fs = waveform.sample_rate_hz
        #: Largest backlog (s) seen by :meth:`backlog_s`.
        self.max_backlog_s = 0.0
        #: Overflows and samples lost before the stream began (:meth:`wait_streaming`).
        self.overflows_before, self.lost_before = 0, 0
        #: Uncertainty (s) of the last bursts' clock mappings (transmitter plus receiver;
        #: 0 with a shared reference, whose bursts need none).
        self.mapping_uncertainty_s = 0.0

    def wait_streaming(self, timeout_s: float = 30.0) -> None:
        """Wait until the receiver's stream has begun (its first ``rx_time`` anchor) and its
        USRP time has passed it.

        Raises
        ------
        LinkFailed
            The receiver died, or its time does not reach the start within ``timeout_s``.
        """
        end = time.monotonic() + timeout_s
        # the stream begins at its first rx_time anchor (later than the start time asked
        # for when the source's first samples came later)
        while (self.rx.usrp_time_now() < self.rx.start_time + 0.05
               or not self.rx.refresh_anchors().anchors
               or self.rx.usrp_time_now() < self.stream_begins_s() + 0.05):
            self.rx.check_alive()
            if time.monotonic() > end:
                raise LinkFailed(f"calibration: the receiver's USRP time did not reach its "
                                 f"stream's start ({self.rx.start_time:.3f} s) within "
                                 f"{timeout_s:g} s")
            time.sleep(0.02)
        # what the stream lost before it began (a start later than asked) is no overflow
        self.overflows_before, self.lost_before = self._counts()

    def stream_begins_s(self) -> float:
        """USRP time (s) of the stream's first sample still mapped (its first ``rx_time``
        anchor; the start time asked for before any came)."""
        anchors = self.rx.timeline.anchors
        return anchors[0].time_s if anchors else self.rx.start_time

    def rx_mapping(self) -> OffsetEstimate:
        """Receiver USRP time minus this host's clock (s)."""
        return usrp_minus_host(self.rx.usrp_time_now, self.clock)

    def backlog_s(self) -> float:
        """How far the delivered samples lag the receiver's USRP time now (s); the largest
        seen is kept in :attr:`max_backlog_s`."""
        now = self.rx.usrp_time_now()
        timeline = self.rx.refresh_anchors()
        ring = self.rx.ring
        if ring is None or not timeline.anchors:
            return 0.0
        lag = max(0.0, (timeline.index_guess(now) - ring.total) / self.fs)
        self.max_backlog_s = max(self.max_backlog_s, lag)
        return lag

    def bursts(self, tx: TxStream, amplitudes: list[float], *, n_symbols: int,
               spacing_s: float, lead_s: float, seconds_off: int = 0,
               timeout_s: float = 10.0) -> list[BurstResult]:
        """Send one burst per amplitude, ``spacing_s`` apart, the first ``lead_s`` from now,
        then read and demodulate each where it is due.

        Parameters
        ----------
        tx
            The transmitter.
        amplitudes
            DAC amplitude of each burst (each peak must stay within full scale).
        n_symbols
            Payload symbols per burst.
        spacing_s, lead_s
            Seconds between burst starts, and before the first.
        seconds_off
            Whole seconds the transmitter's USRP time runs ahead of the receiver's (a
            wrong PPS latch, shared reference only): the bursts are timed around it.
        timeout_s
            How long a window may take to arrive (s).

        Raises
        ------
        ValueError
            A burst's peak above the DAC's full scale, or bad spacing.
        LinkFailed
            A flowgraph died or the receiver stalled.
        """
        if not (spacing_s > 0 and lead_s > 0):
            raise ValueError(f"spacing_s {spacing_s}, lead_s {lead_s}: allowed: > 0")
        x = probe_symbols(n_symbols)
        s, _ = modulate(self.waveform, x)
        peak = float(np.max(np.abs(s)))
        for a in amplitudes:
            if not 0 < a * peak <= 1.0:
                raise ValueError(f"amplitude {a}: the burst's peak {a * peak:.3f} is outside "
                                 f"(0, 1] (DAC full scale); allowed: 0 < a <= {1 / peak:.4f}")
        m_rx = self.rx_mapping()
        m_tx = usrp_minus_host(tx.usrp_time_now, self.clock)
        if self.shared_time:
            margin = SHARED_MARGIN_S
            self.mapping_uncertainty_s = 0.0
        else:
            margin = FREE_MARGIN_S + 3.0 * (m_rx.uncertainty_s + m_tx.uncertainty_s)
            self.mapping_uncertainty_s = m_rx.uncertainty_s + m_tx.uncertainty_s
        late_before = tx.late_bursts()
        n_win = s.size + 2 * int(math.ceil(margin * self.fs))
        plan: list[tuple[float, float, float]] = []  # (amplitude, tx time, expected rx time)
        # Every window is read before any is demodulated (demodulating them as they come
        # would let the ring overwrite the later ones); on a loaded host handing bursts over
        # may take longer than planned, so each burst keeps at least half the lead (the
        # schedule stretches: the drift fit uses the times actually set), and the windows
        # are read whenever the unread ones span half the ring.
        windows: list[np.ndarray | ReceiverGap] = []

        def read_pending() -> None:
            for _, _, r in plan[len(windows):]:
                try:
                    windows.append(self.rx.read_at(r - margin, n_win, timeout_s))
                except ReceiverGap as exc:
                    windows.append(exc)
                self.backlog_s()

        h0 = self.clock() + lead_s
        h_prev = -math.inf
        for k, a in enumerate(amplitudes):
            h = max(h0 + k * spacing_s, h_prev + spacing_s, self.clock() + lead_s / 2)
            if len(windows) < len(plan) and \
                    h - (plan[len(windows)][2] - m_rx.offset_s) > self.rx.capacity_s / 2:
                read_pending()
                h = max(h, self.clock() + lead_s / 2)
            h_prev = h
            r_exp = h + m_rx.offset_s
            t_tx = r_exp + seconds_off if self.shared_time else h + m_tx.offset_s
            plan.append((a, t_tx, r_exp))
            tx.send((a * s).astype(np.complex64), t_tx, f"calibration burst {k}", wait_s=2.0)
        read_pending()
        out: list[BurstResult] = []
        late: int | None = None
        for (a, t_tx, r_exp), window in zip(plan, windows, strict=True):
            try:
                if isinstance(window, ReceiverGap):
                    raise window
                demod = demodulate(self.waveform, window, n_symbols)
            except (SyncError, ReceiverGap) as exc:
                nan = math.nan
                if late is None:
                    late = tx.late_bursts() - late_before
                why = (f"receiver gap: {exc}" if isinstance(exc, ReceiverGap)
                       else "no frame in its window" + (
                           f" (the transmitter reported {late} of these bursts late: handed "
                           f"over after their time; raise the lead, {lead_s:g} s)"
                           if late else ""))
                out.append(BurstResult(a, t_tx, r_exp, nan, nan, nan, nan, nan, why))
                continue
            err = demod.info["timing_samples"] / self.fs - margin
            gain_power = demod.state.mean_gain_power() / (a * a)
            out.append(BurstResult(
                a, t_tx, r_exp, float(err), float(gain_power),
                float(demod.info["cfo_est_hz"]), float(demod.info["snr_est_db"]),
                float(demod.state.noise_var)))
        return out

    def late_burst(self, tx: TxStream, amplitude: float, *, n_symbols: int,
                   seconds_off: int = 0, timeout_s: float = 10.0) -> LateCheck:
        """Hand ``tx`` a burst due 50 ms in the past; check that the device reports it late
        (``TIME_ERROR``) and that the receiver finds nothing of it where it was due.

        Raises
        ------
        LinkFailed
            A flowgraph died or the receiver stalled.
        """
        x = probe_symbols(n_symbols)
        s, _ = modulate(self.waveform, x)
        m_rx = self.rx_mapping()
        m_tx = usrp_minus_host(tx.usrp_time_now, self.clock)
        before = tx.late_bursts()
        t_tx = tx.usrp_time_now() - 0.05
        if self.shared_time:
            r_exp = t_tx - seconds_off
            margin = SHARED_MARGIN_S
        else:
            r_exp = t_tx - m_tx.offset_s + m_rx.offset_s
            margin = FREE_MARGIN_S + 3.0 * (m_rx.uncertainty_s + m_tx.uncertainty_s)
        tx.send((amplitude * s).astype(np.complex64), t_tx, "late calibration burst",
                wait_s=2.0)
        time.sleep(LATE_REPORT_WAIT_S)
        after = tx.late_bursts()
        events = tx.async_events()
        reported = after > before or any(code & EVENT_TIME_ERROR for code, _ in events)
        on_air = False
        try:
            window = self.rx.read_at(r_exp - margin, s.size + 2 * int(margin * self.fs),
                                     timeout_s)
            demodulate(self.waveform, window, n_symbols)
            on_air = True
        except (SyncError, LinkError):
            on_air = False
        return LateCheck(reported=reported, on_air=on_air, late_count=after)

    def noise(self, seconds: float, timeout_s: float = 10.0) -> list[np.ndarray]:
        """A noise-only capture of ``seconds`` starting now (nothing may transmit meanwhile):
        the pieces between receiver gaps (a chunk a gap touches is left out), ``complex64``.

        Raises
        ------
        ValueError
            ``seconds`` not > 0.
        LinkFailed
            The receiver died or stalled.
        """
        if not seconds > 0:
            raise ValueError(f"seconds: got {seconds}; allowed: > 0")
        n_chunk = max(1, int(NOISE_CHUNK_S * self.fs))
        t = max(self.rx.usrp_time_now(), self.stream_begins_s()) + 0.05
        end = t + seconds
        out: list[np.ndarray] = []
        while t < end:
            n = min(n_chunk, int(math.ceil((end - t) * self.fs)))
            try:
                out.append(self.rx.read_at(t, n, timeout_s))
                self.backlog_s()
            except ReceiverGap:
                pass
            t += n / self.fs
        return out

    def watch(self, started_host_s: float, seconds: float) -> StreamWatch:
        """Let the receiver stream until ``seconds`` have passed since ``started_host_s``
        (host clock), checking the backlog every 0.25 s, then read its overflow counters.

        Raises
        ------
        LinkFailed
            The receiver died or stalled.
        """
        while self.clock() < started_host_s + seconds:
            self.backlog_s()
            self.rx.check_mapping(self.rx.usrp_time_now(), "calibration: receiver")
            time.sleep(min(0.25, max(0.0, started_host_s + seconds - self.clock())))
        self.backlog_s()
        overflows, lost = self._counts()
        streamed = self.rx.usrp_time_now() - self.stream_begins_s()
        return StreamWatch(seconds=max(0.0, streamed),
                           overflows=overflows - self.overflows_before,
                           lost_samples=lost - self.lost_before if lost >= 0 else -1,
                           max_backlog_s=self.max_backlog_s, capacity_s=self.rx.capacity_s)

    def _counts(self) -> tuple[int, int]:
        """The receiver's overflows so far and the samples lost in them (-1: not said)."""
        lost = -1
        proc = self.rx.proc
        if proc is not None:
            counters = proc.call("get_device_counters")
            if isinstance(counters, dict) and "lost_samples" in counters:
                lost = int(counters["lost_samples"])
        return int(self.rx.overflows()), lost
