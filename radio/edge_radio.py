"""The ``usrp`` link split across hosts: each edge transmits on its own USRP in its TDMA slot
(:class:`EdgeTransmitter`); the aggregator captures the round once and cuts one window per
device (:class:`radio.slot_receiver.SlotReceiver`).

**Time base of a schedule** (the times in :class:`radio.tdma.Slot`):

* with a shared reference (``usrp.time_source`` ``external``/``gpsdo``, or ``mimo``): USRP
  time. Every tx and rx flowgraph latches the host's UNIX second at a PPS edge
  (``--time-epoch host-pps``), so all USRPs keep the same time; the aggregator takes
  :meth:`radio.slot_receiver.SlotReceiver.now_s` and the edges transmit at exactly the
  slot times;
* otherwise: the aggregator host's clock (UNIX seconds). An edge converts a slot time to
  its own clock with its control-plane :class:`~radio.time_sync.OffsetEstimate` (aggregator
  minus edge) and to its USRP's time with a host-to-USRP reading taken just before each
  burst; the aggregator maps the schedule to its USRP the same way.

The guard of :func:`radio.tdma.slot_guard_s` covers the uncertainty of these mappings
(:attr:`TxReport.timing_uncertainty_s`,
:attr:`radio.slot_receiver.SlotReceiver.timing_uncertainty_s`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radio.flowgraph_process import FlowgraphError
from radio.link import LinkError, LinkFailed
from radio.time_sync import OffsetEstimate, measure_offset
from radio.uhd_probe import ProbeResult, find_usrps
from radio.usrp_settings import DeviceRadio
from radio.usrp_stream import TxStream, scale_for_dac

#: A burst must reach the flowgraph at least this long (s) before it is due.
MIN_LEAD_S = 0.02
#: A burst due further ahead than this (s) is taken for a time-base mistake.
MAX_LEAD_S = 30.0
#: Largest |USRP time - host time| (s) accepted after a PPS latch to the host's second.
MAX_LATCH_SKEW_S = 1.0
#: Host-to-USRP readings per mapping (the fastest is used).
CLOCK_READS = 3
#: Seconds after a burst's end before its late report is read: a USRP reports a burst that
#: reached it after its time (UHD's TIME_ERROR async event) when it finds it, at the latest
#: by then; the report reaches the host within this.
LATE_REPORT_WAIT_S = 0.1

Probe = Callable[..., ProbeResult]


class RadioUnavailable(RuntimeError):
    """A device's or the aggregator's USRP cannot be used; the message says what to check."""


def require_usrp(who: str, key: str, args: str, python: str, probe: Probe = find_usrps) -> None:
    """Look for the USRP at ``args`` (UHD, under ``python``). A virtual device
    (``type=virtual``, :mod:`radio.virtual_device`) is not looked for: UHD is not asked.

    Raises
    ------
    RadioUnavailable
        None found, or UHD not importable; names ``who``, the config ``key`` and the args.
    """
    from radio.virtual_device import is_virtual

    if is_virtual(args):
        return
    res = probe(args, python=python)
    if res.devices:
        return
    retry = f"then run: uhd_find_devices --args \"{args}\" (Debian package uhd-host)"
    if not res.uhd_available:
        raise RadioUnavailable(
            f"{who}: cannot look for its USRP ({key} = '{args}'): {res.message}; install "
            f"python3-uhd for {python} ('make' does), {retry}"
        )
    raise RadioUnavailable(
        f"{who}: no USRP found for {key} = '{args}' ({res.message or 'UHD found no device'}). "
        "Check that the N210 is powered and cabled to this host's Ethernet port, that the "
        "port is on the N210's subnet (e.g. 192.168.10.1/24 for addr=192.168.10.x), and the "
        f"address or serial in the hardware config; {retry}"
    )


def args_key(radio: DeviceRadio) -> str:
    """The config key of a device's transmitter args (``usrp.devices[i].tx_args``)."""
    return radio.key if radio.from_fallback else f"{radio.key}.tx_args"


def usrp_minus_host(read_usrp: Callable[[], float], clock: Callable[[], float]) -> OffsetEstimate:
    """USRP time minus host time, bracketed by host clock reads (no drift allowance)."""
    try:
        return measure_offset(read_usrp, exchanges=CLOCK_READS, clock=clock, hold_s=0.0,
                              drift_ppm=0.0)
    except FlowgraphError as exc:
        raise LinkFailed(str(exc)) from exc


@dataclass(frozen=True)
class TxReport:
    """What one edge burst did.

    Attributes
    ----------
    device
        Device id.
    n_samples
        Samples in the burst.
    airtime_s
        Burst duration on air (s): ``n_samples / sample_rate_hz``.
    tx_power_w
        Mean power radiated over the burst (W): ``tx_power_ref_w`` times the burst's mean
        symbol power.
    tx_time_usrp_s
        When the burst leaves, in the USRP's time (s).
    lead_s
        How long before that time the burst was handed to the flowgraph (s).
    timing_uncertainty_s
        Bound (s) on how far the burst start may be from the slot start (0 with a shared
        reference; else offset plus host-to-USRP mapping uncertainty).
    end_host_s
        When the burst ends on this host's clock (s).
    late_before
        The transmitter's count of late bursts before this one was handed over.
    slack_s
        How long before that time the flowgraph had taken the whole burst (s): the part of
        ``lead_s`` the hand-over did not use (negative: it took the burst after its time).
    """

    device: int
    n_samples: int
    airtime_s: float
    tx_power_w: float
    tx_time_usrp_s: float
    lead_s: float
    timing_uncertainty_s: float
    end_host_s: float = 0.0
    late_before: int = 0
    slack_s: float = 0.0


class EdgeTransmitter:
    """One edge device's transmitter: the ``tx`` flowgraph on the device's own USRP.

    Parameters
    ----------
    radio
        The device's settings (:func:`testbed.core.config.hardware.device_radio`).
    offset
        Control-plane offset, aggregator clock minus this host's (needed before the first
        burst without a shared reference; :meth:`set_offset`).
    log_dir
        Folder for ``tx.log``; ``None``: an anonymous temporary file.
    probe
        Device finder run before the flowgraph opens the USRP.
    clock
        This host's clock (s); the offset must have been measured against it.
    stream
        An already started stream (tests); skips the probe and the flowgraph start.

    Raises
    ------
    RadioUnavailable
        No USRP, the flowgraph failed to start, or (shared reference) the USRP's time is not
        the host's UNIX time after the PPS latch.
    """

    def __init__(
        self, radio: DeviceRadio, *, offset: OffsetEstimate | None = None,
        log_dir: Path | None = None, probe: Probe = find_usrps, startup_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time, stream: TxStream | None = None,
    ) -> None:
        self.radio = radio
        self.offset = offset
        self.clock = clock
        who = f"device {radio.device}"
        if stream is None:
            require_usrp(who, args_key(radio), radio.tx_args, radio.python, probe)
            try:
                stream = TxStream(
                    device_args=radio.tx_args, gain_db=radio.tx_gain_db,
                    antenna=radio.tx_antenna, sample_rate_hz=radio.sample_rate_hz,
                    center_freq_hz=radio.center_freq_hz, clock_source=radio.clock_source,
                    time_source=radio.time_source,
                    time_epoch="host-pps" if radio.shared_time else "zero",
                    python=radio.python, log_dir=log_dir, startup_timeout_s=startup_timeout_s,
                    air_address=radio.air_address,
                )
            except FlowgraphError as exc:
                raise RadioUnavailable(f"{who}: the tx flowgraph could not start: {exc}") from exc
        self.stream: TxStream | None = stream
        if radio.shared_time:
            skew = self.usrp_minus_host().offset_s
            if abs(skew) > MAX_LATCH_SKEW_S:
                self.close()
                raise RadioUnavailable(
                    f"{who}: USRP time is {skew:+.3f} s from this host's clock after the PPS "
                    f"latch (time_source {radio.time_source}); check the PPS cable, NTP on "
                    "this host, and with mimo that the MIMO master latched the PPS"
                )

    def _stream(self) -> TxStream:
        if self.stream is None:
            raise LinkFailed(f"device {self.radio.device}: transmitter is closed")
        return self.stream

    def usrp_minus_host(self) -> OffsetEstimate:
        """This USRP's time minus this host's clock, read now (s)."""
        return usrp_minus_host(self._stream().usrp_time_now, self.clock)

    def set_offset(
        self, offset: OffsetEstimate, *, receiver_usrp_minus_host_s: float | None = None
    ) -> None:
        """Use ``offset`` (aggregator clock minus this host's) for later bursts.

        With a shared reference and the aggregator's ``receiver_usrp_minus_host_s``
        (:meth:`radio.slot_receiver.SlotReceiver.usrp_minus_host`), check that both USRPs
        latched the same second.

        Raises
        ------
        RadioUnavailable
            The USRP times differ by about a whole second.
        """
        self.offset = offset
        if self.radio.shared_time and receiver_usrp_minus_host_s is not None:
            mine = self.usrp_minus_host()
            # Both in aggregator host time: this USRP's time minus the aggregator's clock.
            diff = (mine.offset_s - offset.offset_s) - receiver_usrp_minus_host_s
            if abs(diff) > 0.25 + offset.uncertainty_s + mine.uncertainty_s:
                raise RadioUnavailable(
                    f"device {self.radio.device}: USRP time differs from the aggregator's "
                    f"by {diff:+.3f} s; the PPS latches picked different seconds (host clocks "
                    "disagree near a half second): restart this edge, and check NTP"
                )

    def transmit(self, samples: np.ndarray, tx_time_s: float, *, hand_over_late: bool = False,
                 shift_s: float = 0.0) -> TxReport:
        """Send one burst due at ``tx_time_s`` (schedule time base, e.g. a slot's start).

        Parameters
        ----------
        samples
            Baseband samples, shape ``(n,)`` (:func:`radio.modem.modulate` output).
        tx_time_s
            When the burst is due (s), on the schedule's time base (module docstring).
        hand_over_late, shift_s
            Fault injection only: hand the burst to the flowgraph after its time (a stalled
            host: the USRP must find it late), or move it ``shift_s`` seconds from its time
            after the checks (an edge that mistakes its slot).

        Returns
        -------
        TxReport
            Returned once the burst is queued; it leaves the USRP at ``tx_time_usrp_s``.

        Raises
        ------
        LinkError
            Not sent: peak above the DAC range, mean power above ``max_tx_power_w``, or due
            in less than :data:`MIN_LEAD_S` (slot missed).
        LinkFailed
            The flowgraph died or takes no samples.
        ValueError
            Bad samples, no offset without a shared reference, or due more than
            :data:`MAX_LEAD_S` ahead (wrong time base).
        """
        r = self.radio
        stream = self._stream()
        x = np.asarray(samples)
        if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
            raise ValueError(f"samples: need a non-empty finite 1-d array, got shape {x.shape}")
        what = f"device {r.device}: burst due at {tx_time_s:.6f} s"
        sps = r.sample_rate_hz / r.symbol_rate_hz
        power_w = r.tx_power_ref_w * float(np.mean(np.abs(x) ** 2)) * sps
        if power_w > r.max_tx_power_w * (1 + 1e-9):
            raise LinkError(
                f"{what} not sent: mean power {power_w:.4g} W exceeds {r.key}.max_tx_power_w "
                f"= {r.max_tx_power_w} W; lower the power scaling"
            )
        scaled = scale_for_dac(x, r.tx_amplitude, what)
        try:
            stream.check_alive()
        except FlowgraphError as exc:
            raise LinkFailed(f"device {r.device}: {exc}") from exc
        mapping = self.usrp_minus_host()
        if r.shared_time:
            t_usrp, uncertainty = float(tx_time_s), 0.0
        else:
            if self.offset is None:
                raise ValueError(f"device {r.device}: no clock offset to the aggregator; "
                                 "call set_offset first (time_source is not shared)")
            t_usrp = self.offset.to_local(tx_time_s) + mapping.offset_s
            uncertainty = self.offset.uncertainty_s + mapping.uncertainty_s
        lead = t_usrp - (self.clock() + mapping.offset_s)
        if lead > MAX_LEAD_S:
            raise ValueError(f"{what}: {lead:.1f} s ahead (more than {MAX_LEAD_S:g} s); "
                             "tx_time_s must be on the schedule's time base")
        if lead < MIN_LEAD_S:
            raise LinkError(f"{what} not sent: due in {1e3 * lead:.1f} ms, less than the "
                            f"{1e3 * MIN_LEAD_S:.0f} ms a burst needs (slot missed)")
        try:
            late_before = stream.late_bursts()
        except FlowgraphError as exc:
            raise LinkFailed(f"device {r.device}: {exc}") from exc
        t_usrp += shift_s
        if hand_over_late:
            time.sleep(max(0.0, lead + shift_s) + 0.05)
        stream.send(scaled, t_usrp, f"device {r.device}", wait_s=max(lead, 1.0))
        slack = t_usrp - (self.clock() + mapping.offset_s)
        airtime = x.size / r.sample_rate_hz
        return TxReport(
            device=r.device, n_samples=int(x.size), airtime_s=airtime,
            tx_power_w=power_w, tx_time_usrp_s=t_usrp, lead_s=lead,
            timing_uncertainty_s=uncertainty, end_host_s=t_usrp + airtime - mapping.offset_s,
            late_before=late_before, slack_s=slack,
        )

    def confirm(self, report: TxReport) -> None:
        """Wait until the burst of ``report`` is over, then check that the USRP did not
        report it late (a late burst never leaves: nothing of it was on the air).

        Raises
        ------
        LinkError
            The USRP reported the burst late (UHD's TIME_ERROR): it was not sent.
        LinkFailed
            The flowgraph died.
        """
        stream = self._stream()
        wait = report.end_host_s + LATE_REPORT_WAIT_S - self.clock()
        if wait > 0:
            time.sleep(min(wait, MAX_LEAD_S))
        try:
            late = stream.late_bursts()
        except FlowgraphError as exc:
            raise LinkFailed(f"device {self.radio.device}: {exc}") from exc
        if late > report.late_before:
            raise LinkError(
                f"device {self.radio.device}: burst due at USRP time "
                f"{report.tx_time_usrp_s:.6f} s not sent: the USRP reported it late "
                "(TIME_ERROR: it reached the device after its time)"
            )

    def close(self) -> None:
        """Stop the flowgraph. Idempotent."""
        if self.stream is not None:
            self.stream.close()
        self.stream = None
