"""The aggregator's side of the split ``usrp`` link: one capture per round, a window per slot.

The ``rx`` flowgraph streams continuously (:class:`radio.usrp_stream.RxStream`); for each
round :meth:`SlotReceiver.receive` waits until the round's TDMA schedule has passed, reads
the capture covering every slot's window once, and cuts each device's window
(``slot start - guard .. slot end + guard``). :meth:`SlotReceiver.decode` runs the waveform
receiver on one window (frame detection, CFO, timing, channel and N0 from the pilots: the
same as every estimated link). Schedule times are on the time base described in
:mod:`radio.edge_radio`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from radio.edge_radio import Probe, RadioUnavailable, require_usrp, usrp_minus_host
from radio.flowgraph_process import FlowgraphError
from radio.frame_link import Carried, FrameLink
from radio.framing import WaveformParams, device_waveform
from radio.link import LinkError, LinkFailed, ReceiverGap, Reception
from radio.modem import frame_samples
from radio.preamble_search import PreambleScan, find_preambles, search_roots
from radio.tdma import Slot, schedule_window
from radio.time_sync import OffsetEstimate
from radio.uhd_probe import find_usrps
from radio.usrp_settings import ReceiverRadio
from radio.usrp_stream import RxStream


class _Decoder(FrameLink):
    """The frame receiver of the ``usrp`` link, fed captured windows (one per device: each
    device's frames carry its own preamble root and pilots,
    :func:`radio.framing.device_waveform`)."""

    name = "usrp"

    def _carry(
        self, samples: np.ndarray, *, device: int, round_index: int, rng: np.random.Generator
    ) -> Carried:
        raise NotImplementedError("the slot receiver decodes captured windows only")

    def decode(
        self, window: np.ndarray, n_payload: int, *, device: int, round_index: int,
        known_cfo_hz: float | None = None,
    ) -> Reception:
        sent = frame_samples(self.waveform, n_payload)
        carried = Carried(np.asarray(window, dtype=np.complex128), sent, window.size, {})
        return self._receive(carried, n_payload, device=device, round_index=round_index,
                             known_cfo_hz=known_cfo_hz)


class SlotReceiver:
    """The aggregator's receiver: one ``rx`` flowgraph, one capture per round's schedule.

    Parameters
    ----------
    radio
        Receiver settings (:func:`testbed.core.config.hardware.receiver_radio`).
    waveform
        Frame numerology (its sample rate must be the radio's).
    confidence, record_dir, hw_name
        Passed to the frame receiver (N0 confidence, SigMF recording).
    log_dir, probe, startup_timeout_s, clock, stream
        As in :class:`radio.edge_radio.EdgeTransmitter`.

    Raises
    ------
    RadioUnavailable
        No USRP for ``usrp.rx_args``, or the flowgraph failed to start.
    """

    def __init__(
        self, radio: ReceiverRadio, waveform: WaveformParams, *, confidence: float = 0.95,
        record_dir: Path | None = None, hw_name: str = "", log_dir: Path | None = None,
        probe: Probe = find_usrps, startup_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time, stream: RxStream | None = None,
    ) -> None:
        if abs(radio.sample_rate_hz - waveform.sample_rate_hz) > 1e-6 * radio.sample_rate_hz:
            raise ValueError(f"usrp sample rate {radio.sample_rate_hz} != waveform "
                             f"{waveform.sample_rate_hz}")
        self.radio = radio
        self.clock = clock
        self.waveform = waveform
        self._decoder_args = {"confidence": confidence, "record_dir": record_dir,
                              "center_freq_hz": radio.center_freq_hz, "hw_name": hw_name}
        self._decoders: dict[int, _Decoder] = {}
        if stream is None:
            require_usrp("aggregator receiver", "usrp.rx_args", radio.rx_args, radio.python,
                         probe)
            try:
                stream = RxStream(
                    device_args=radio.rx_args, gain_db=radio.rx_gain_db,
                    antenna=radio.rx_antenna, sample_rate_hz=radio.sample_rate_hz,
                    center_freq_hz=radio.center_freq_hz, clock_source=radio.clock_source,
                    time_source=radio.time_source,
                    time_epoch="host-pps" if radio.shared_time else "zero",
                    ring_seconds=radio.ring_seconds, python=radio.python, log_dir=log_dir,
                    # After a PPS latch the flowgraph still has to start: 2 s of margin.
                    start_after_s=2.0 if radio.shared_time else 1.0,
                    startup_timeout_s=startup_timeout_s, air_address=radio.air_address,
                )
            except FlowgraphError as exc:
                raise RadioUnavailable(
                    f"aggregator receiver: the rx flowgraph could not start: {exc}"
                ) from exc
        self.stream: RxStream | None = stream
        #: Uncertainty (s) of the last schedule-to-USRP mapping (0 with a shared reference).
        self.timing_uncertainty_s = 0.0

    def _stream(self) -> RxStream:
        if self.stream is None:
            raise LinkFailed("aggregator receiver is closed")
        return self.stream

    def usrp_minus_host(self) -> OffsetEstimate:
        """The receiver USRP's time minus this host's clock, read now (s)."""
        return usrp_minus_host(self._stream().usrp_time_now, self.clock)

    def now_s(self) -> float:
        """The current time on the schedule's time base (s): USRP time if shared, else host."""
        if self.radio.shared_time:
            try:
                return self._stream().usrp_time_now()
            except FlowgraphError as exc:
                raise LinkFailed(str(exc)) from exc
        return self.clock()

    def receive(
        self, slots: Sequence[Slot], *, round_index: int = 0, timeout_s: float = 5.0
    ) -> dict[int, np.ndarray]:
        """Capture the round's schedule and cut each device's window.

        Waits until the last window has been received. Returns ``{device: samples}``,
        ``complex128`` of shape ``(round((window_end - window_start) fs),)`` each, for
        :meth:`decode`. Raises as :meth:`capture`.
        """
        capture, bounds = self.capture(slots, round_index=round_index, timeout_s=timeout_s)
        return {d: capture[i0:i1].astype(np.complex128) for d, (i0, i1) in bounds.items()}

    def capture(
        self, slots: Sequence[Slot], *, round_index: int = 0, timeout_s: float = 5.0
    ) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
        """Capture the round's schedule once: the samples covering every slot's window and
        each device's window in them, ``{device: (first, end)}`` (sample indices).

        Raises
        ------
        ValueError
            The schedule spans more than the ring holds.
        ReceiverGap
            A device's window overlaps a gap in the receiver's stream (an overflow; the
            first such window's). :meth:`receive_all` loses only those windows.
        LinkError
            The capture is not held (the schedule lies too far in the past, or before the
            stream started).
        LinkFailed
            The receiver died or stalled.
        """
        capture, bounds, lost = self._capture(slots, round_index, timeout_s)
        if lost:
            raise lost[min(lost)]
        return capture, bounds

    def _capture(
        self, slots: Sequence[Slot], round_index: int, timeout_s: float,
        mapping: OffsetEstimate | None = None,
    ) -> tuple[np.ndarray, dict[int, tuple[int, int]], dict[int, ReceiverGap]]:
        """:meth:`capture`, and the windows a gap in the stream took: ``{device: gap}``
        (their samples read zero in the capture); ``mapping`` as :meth:`round_mapping`'s
        (default: measured now)."""
        where = f"aggregator receiver, round {round_index}"
        stream = self._stream()
        fs = self.radio.sample_rate_hz
        w0, w1 = schedule_window(slots)
        if w1 - w0 > 0.9 * stream.capacity_s:
            raise ValueError(f"{where}: schedule spans {w1 - w0:.3f} s; the receiver holds "
                             f"{stream.capacity_s:.1f} s (ReceiverRadio.ring_seconds)")
        if mapping is None:
            mapping = self.round_mapping(round_index)
        shift = 0.0 if self.radio.shared_time else mapping.offset_s
        usrp_now = self.clock() + mapping.offset_s
        stream.check_mapping(usrp_now, f"{where} failed")
        if w0 + shift < stream.start_time:
            raise LinkError(f"{where}: schedule starts at USRP time {w0 + shift:.3f} s, before "
                            f"the receiver's stream ({stream.start_time:.3f} s)")
        n, bounds = self.capture_layout(slots)
        wait = max(0.0, w1 + shift - usrp_now) + timeout_s
        lost: dict[int, ReceiverGap] = {}
        try:
            try:
                capture = stream.read_at(w0 + shift, n, wait)
            except ReceiverGap:
                # A gap in the stream (an overflow) inside the schedule: each window on its
                # own; those that overlap the gap are lost, the others read as ever.
                capture = np.zeros(n, dtype=np.complex64)
                for device in sorted(bounds):
                    i0, i1 = bounds[device]
                    if i1 <= i0:
                        continue
                    try:
                        capture[i0:i1] = stream.read_at(w0 + shift + i0 / fs, i1 - i0,
                                                        wait)
                    except ReceiverGap as gap:
                        lost[device] = gap.reworded(
                            f"usrp link (lab): device {device}, round {round_index}: frame "
                            f"lost: {gap}")
        except LinkFailed as exc:
            raise LinkFailed(f"{where} failed: {exc}") from exc
        except LinkError as exc:
            raise LinkError(f"{where}: capture lost: {exc}") from exc
        return capture, bounds, lost

    def capture_layout(self, slots: Sequence[Slot]) -> tuple[int, dict[int, tuple[int, int]]]:
        """The capture of ``slots``: its length (samples, from the first window's start to
        the last one's end) and each device's window in it, ``{device: (first, end)}``."""
        fs = self.radio.sample_rate_hz
        w0, w1 = schedule_window(slots)
        n = int(math.ceil((w1 - w0) * fs))
        return n, {s.device: (int(round((s.window_start_s - w0) * fs)),
                              min(int(round((s.window_end_s - w0) * fs)), n)) for s in slots}

    def capture_start(self, slots: Sequence[Slot], mapping: OffsetEstimate,
                      n: int, timeout_s: float = 5.0) -> np.ndarray:
        """The first ``n`` samples of the capture of ``slots`` (as :meth:`capture` reads it
        with ``mapping``), waiting until they have been received.

        Raises
        ------
        ReceiverGap, LinkError, LinkFailed
            As :meth:`window_of`.
        """
        shift = 0.0 if self.radio.shared_time else mapping.offset_s
        w0, _ = schedule_window(slots)
        end = w0 + n / self.radio.sample_rate_hz
        wait = max(0.0, end + shift - (self.clock() + mapping.offset_s)) + timeout_s
        return self._stream().read_at(w0 + shift, n, wait)

    def decode(
        self, window: np.ndarray, n_payload: int, *, device: int, round_index: int
    ) -> Reception:
        """Find and demodulate one device's frame in its window (the waveform receiver).

        Raises
        ------
        LinkError
            No frame found (the upload is lost).
        """
        return self._decoder(device).decode(window, n_payload, device=device,
                                            round_index=round_index)

    def decode_shared(
        self, window: np.ndarray, n_payload: int, *, device: int, round_index: int
    ) -> Reception:
        """Demodulate a frame on the common waveform (every device's same preamble root and
        pilots: over-the-air aggregation) on the receiver's own frequency reference (a shared
        reference: no offset estimated, every frame's phase on the same reference).

        Raises
        ------
        LinkError
            No frame found.
        """
        if -1 not in self._decoders:
            self._decoders[-1] = _Decoder(self.waveform,
                                          **self._decoder_args)  # type: ignore[arg-type]
        return self._decoders[-1].decode(window, n_payload, device=device,
                                         round_index=round_index, known_cfo_hz=0.0)

    def _decoder(self, device: int) -> _Decoder:
        if device not in self._decoders:
            self._decoders[device] = _Decoder(device_waveform(self.waveform, device),
                                              **self._decoder_args)  # type: ignore[arg-type]
        return self._decoders[device]

    def collisions(
        self, capture: np.ndarray, bounds: Mapping[int, tuple[int, int]],
        n_payload: Mapping[int, int], *, missing: Sequence[tuple[int, int]] = (),
        scan: PreambleScan | None = None,
    ) -> dict[int, int]:
        """The devices whose frame another device's frame overlaps: ``{device: other}``.

        Every device's preamble root is searched over the whole capture
        (:func:`radio.preamble_search.find_preambles`: every position and frequency offset,
        so two frames that start together, a weaker frame under a stronger one, and a late
        frame whose preamble lies in the previous window are all found). A device's frame
        is its own root's frame found starting in its window (its window where none is);
        any other device's frame whose burst overlaps it is a collision: what the pilots
        would count as noise is partly that device's signal. Devices that share a root
        (:func:`radio.framing.device_roots`: ``k`` apart by a multiple of their number)
        cannot be told apart, and are not checked against each other.

        Parameters
        ----------
        capture
            The round's samples, shape ``(n,)``.
        bounds
            Each device's window in ``capture``, ``{device: (first, end)}``.
        n_payload
            Each device's payload symbols (its frame's length).
        missing
            Ranges ``(first, end)`` of ``capture`` that hold no samples (windows lost in a
            gap of the stream, read as zeros): a frame found overlapping one is ignored
            (the search's normalised correlation peaks falsely at the edge of zeros).
        scan
            The search of the capture's start, made while the slots went by
            (:meth:`collision_scan`); used where it holds exactly the capture's first
            samples and its roots, else the capture is searched here.
        """
        root_of = {d: device_waveform(self.waveform, d).zc_root for d in bounds}
        roots = set(root_of.values())
        if scan is not None and not scan.holds_start_of(
                capture, search_roots(self.waveform, roots)):
            scan = None
        found = find_preambles(capture, self.waveform, roots, scan=scan)
        sps = self.waveform.samples_per_symbol
        edge = self.waveform.guard_symbols * sps  # zeros at each end of a burst
        length = {root: max(frame_samples(self.waveform, n_payload[d])
                            for d in root_of if root_of[d] == root)
                  for root in set(root_of.values())}
        bursts = [(f.root, f.start + edge, f.start + length[f.root] - edge) for f in found
                  if not any(f.start < hi and lo < f.start + length[f.root]
                             for lo, hi in missing)]
        out: dict[int, int] = {}
        for device, (i0, i1) in bounds.items():
            own = root_of[device]
            mine = [(a, b) for root, a, b in bursts if root == own and i0 <= a - edge < i1]
            region = mine or [(i0, i1)]
            for root, a, b in bursts:
                if root != own and any(a < hi and lo < b for lo, hi in region):
                    out[device] = min(d for d in root_of if root_of[d] == root)
                    break
        return out

    def collision_scan(self, slots: Sequence[Slot]) -> PreambleScan:
        """An empty search of the capture of ``slots`` for their devices' roots, to be fed
        the capture's start as it comes in (:class:`RoundReception`)."""
        n, _ = self.capture_layout(slots)
        roots = {device_waveform(self.waveform, s.device).zc_root for s in slots}
        return PreambleScan(self.waveform, search_roots(self.waveform, roots), n)

    def start_round(
        self, slots: Sequence[Slot], n_payload: Mapping[int, int], *, round_index: int = 0,
        on_air: Callable[[int], bool] = lambda device: True,
    ) -> RoundReception:
        """Read and decode the round's windows as the slots go by, from a thread of their
        own (each window once its samples are in, decoded in a small pool), while the
        caller serves its control plane; :meth:`RoundReception.finish` then completes the
        round as :meth:`receive_all`. ``on_air(device)`` is asked before each window is
        read: a device that no longer may transmit (it refused) is skipped."""
        return RoundReception(self, slots, n_payload, round_index, on_air)

    def receive_all(
        self, slots: Sequence[Slot], n_payload: Mapping[int, int], *, round_index: int = 0
    ) -> dict[int, Reception | LinkError]:
        """:meth:`capture`, :meth:`collisions`, then :meth:`decode` per device; a lost frame
        (a collision, a window over a gap in the stream: :class:`~radio.link.ReceiverGap`)
        is its LinkError.

        Each reception's ``info`` also holds ``slot_start_s`` (when the burst was due,
        schedule time base) and ``timing_error_s``: where the frame was found in its window
        minus where it was due (s; positive: late).
        """
        pending = self.start_round(slots, n_payload, round_index=round_index)
        try:
            return pending.finish(slots)
        finally:
            pending.cancel()

    def round_mapping(self, round_index: int) -> OffsetEstimate:
        """The receiver USRP's time minus this host's clock for one round's reads
        (:meth:`usrp_minus_host`); sets :attr:`timing_uncertainty_s`.

        Raises
        ------
        LinkFailed
            The receiver died.
        """
        try:
            self._stream().check_alive()
            mapping = self.usrp_minus_host()
        except FlowgraphError as exc:
            raise LinkFailed(f"aggregator receiver, round {round_index}: {exc}") from exc
        self.timing_uncertainty_s = 0.0 if self.radio.shared_time else mapping.uncertainty_s
        return mapping

    def window_of(self, slot: Slot, mapping: OffsetEstimate, timeout_s: float = 5.0
                  ) -> np.ndarray:
        """Device ``slot.device``'s window (``complex64``, the samples :meth:`capture` cuts
        for it to within one at its ends), waiting until it has been received; ``mapping``
        from :meth:`round_mapping`.

        Raises
        ------
        ReceiverGap
            The window overlaps a gap in the stream.
        LinkError, LinkFailed
            As :meth:`capture`.
        """
        shift = 0.0 if self.radio.shared_time else mapping.offset_s
        fs = self.radio.sample_rate_hz
        n = max(0, int(round((slot.window_end_s - slot.window_start_s) * fs)))
        usrp_now = self.clock() + mapping.offset_s
        wait = max(0.0, slot.window_end_s + shift - usrp_now) + timeout_s
        return self._stream().read_at(slot.window_start_s + shift, n, wait)

    def settle_round(
        self, slots: Sequence[Slot], n_payload: Mapping[int, int], round_index: int,
        decoded: Callable[[int, np.ndarray], Reception | LinkError],
        mapping: OffsetEstimate | None = None,
        scan: Callable[[], PreambleScan | None] | None = None,
    ) -> dict[int, Reception | LinkError]:
        """:meth:`receive_all` with each window's decoding from ``decoded(device, window)``
        (a decode already under way: :class:`RoundReception`), the capture placed with
        ``mapping`` (default: measured now), the collision search continued from what
        ``scan()`` returns, asked once the capture is read, where it holds the capture's
        start (:meth:`collisions`)."""
        out: dict[int, Reception | LinkError] = {}
        by_device = {s.device: s for s in slots}
        fs = self.radio.sample_rate_hz
        capture, bounds, lost = self._capture(slots, round_index, 5.0, mapping)
        # The collision search over the whole capture runs beside the windows' decoding
        # (both are mostly numpy and FFTs, which release the interpreter's lock): the round
        # waits for the longer of the two instead of their sum. A window whose frame
        # collided is decoded for nothing and its result dropped.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="collisions") as pool:
            def search_collisions() -> dict[int, int]:
                made = scan() if scan is not None else None
                return self.collisions(capture, bounds, n_payload,
                                       missing=[bounds[d] for d in lost],
                                       scan=None if lost else made)

            search = pool.submit(search_collisions)
            results: dict[int, Reception | LinkError] = {}
            for device, (i0, i1) in bounds.items():
                if device not in lost:
                    results[device] = decoded(device, capture[i0:i1])
            collided = search.result()
        for device in bounds:
            if device in lost:
                # Its window overlaps a gap in the receiver's stream (an overflow): its
                # samples are not all there; the stream goes on for the others.
                out[device] = lost[device]
                continue
            if device in collided:
                # Its frame overlaps another's: what the pilots would call noise is partly
                # the other device's signal, and the decoded values are a mixture.
                out[device] = LinkError(
                    f"usrp link (lab): device {device}, round {round_index}: frame lost in a "
                    f"collision: device {collided[device]}'s frame overlaps device {device}'s"
                )
                continue
            rec = results[device]
            if isinstance(rec, LinkError):
                out[device] = rec
                continue
            slot = by_device[device]
            # The frame should start one guard into its window: the rest is timing error.
            found_s = float(rec.info.get("timing_samples", math.nan)) / fs
            out[device] = replace(rec, info={
                **rec.info, "slot_start_s": slot.start_s,
                "timing_error_s": found_s - (slot.start_s - slot.window_start_s),
            })
        return out

    def close(self) -> None:
        """Stop the flowgraph and the reader thread. Idempotent."""
        if self.stream is not None:
            self.stream.close()
        self.stream = None


#: Threads that decode a round's windows while later slots are still on the air.
DECODE_THREADS = 2


class RoundReception:
    """A round's windows, read and decoded as the slots go by
    (:meth:`SlotReceiver.start_round`).

    A thread reads each slot's window once its samples are in (in time order) and hands it
    to a pool of :data:`DECODE_THREADS` decoders, so that the first windows are decoded
    while later slots are still on the air. :meth:`finish` reads the capture of the slots
    that went on air (the gaps, the collision search) exactly as
    :meth:`SlotReceiver.receive_all` does, and takes each window's decoding from the pool;
    a window the thread did not read (a device that refused, an error of the stream) is
    decoded there from the capture. A window read here holds the samples the capture
    holds for it.
    """

    def __init__(self, receiver: SlotReceiver, slots: Sequence[Slot],
                 n_payload: Mapping[int, int], round_index: int,
                 on_air: Callable[[int], bool]) -> None:
        self.receiver = receiver
        self.round_index = round_index
        self.n_payload = dict(n_payload)
        self._on_air = on_air
        #: One mapping of the receiver's time for every read of the round.
        self.mapping = receiver.round_mapping(round_index)
        self._pool = ThreadPoolExecutor(max_workers=DECODE_THREADS,
                                        thread_name_prefix="decode")
        self._decodes: dict[int, Future[Reception | LinkError]] = {}
        self._stop = threading.Event()
        ordered = sorted(slots, key=lambda s: s.window_start_s)
        self._thread = threading.Thread(
            target=self._read_windows, args=(ordered,),
            name=f"windows-{round_index}", daemon=True)
        self._thread.start()
        #: The collision search of the whole schedule's capture, fed window by window.
        self.scan = receiver.collision_scan(ordered)
        self._slots = frozenset(s.device for s in ordered)
        self._scanner = threading.Thread(
            target=self._scan_capture, args=(ordered,),
            name=f"collisions-{round_index}", daemon=True)
        self._scanner.start()

    def _decode(self, device: int, window: np.ndarray) -> Reception | LinkError:
        try:
            return self.receiver.decode(window.astype(np.complex128), self.n_payload[device],
                                        device=device, round_index=self.round_index)
        except LinkFailed:
            raise
        except LinkError as exc:
            return exc

    def _read_windows(self, slots: list[Slot]) -> None:
        for slot in slots:
            if self._stop.is_set():
                return
            if not self._on_air(slot.device):
                continue
            try:
                window = self.receiver.window_of(slot, self.mapping)
            except LinkError:
                # A gap, a dead or stalled stream, a window not held: finish() reads the
                # capture and says which, as receive_all does.
                return
            self._decodes[slot.device] = self._pool.submit(self._decode, slot.device, window)

    def _scan_capture(self, slots: list[Slot]) -> None:
        """Feed the collision search the capture's start as each window comes in (the
        capture's first samples up to that window's end, read as :meth:`finish` reads the
        whole; the search takes only what is new). Stops at the first error: the search
        then finishes from the capture."""
        _, bounds = self.receiver.capture_layout(slots)
        for slot in slots:
            if self._stop.is_set():
                return
            end = bounds[slot.device][1]
            if end <= self.scan.filled:
                continue
            try:
                start = self.receiver.capture_start(slots, self.mapping, end)
            except LinkError:
                return
            self.scan.feed(start[self.scan.filled :])

    def finish(self, slots: Sequence[Slot]) -> dict[int, Reception | LinkError]:
        """The round's receptions for ``slots`` (those that may have transmitted), as
        :meth:`SlotReceiver.receive_all` returns them; raises as it does."""
        self._thread.join()
        # The search made while the slots went by is of the whole schedule's capture: of
        # use when every slot is settled here (a refused device's window shortens it). It
        # is waited for only once the capture is read (a scan behind on a loaded host must
        # not hold the read until the ring has moved on).
        whole = {s.device for s in slots} == self._slots
        if not whole:
            self._stop.set()

        def scan() -> PreambleScan | None:
            self._scanner.join()
            return self.scan if whole else None

        def decoded(device: int, window: np.ndarray) -> Reception | LinkError:
            future = self._decodes.get(device)
            if future is None:
                return self._decode(device, window)
            return future.result()

        return self.receiver.settle_round(slots, self.n_payload, self.round_index, decoded,
                                          self.mapping, scan)

    def cancel(self) -> None:
        """Stop reading windows and drop the decodes not started. Idempotent."""
        self._stop.set()
        self._thread.join()
        self._scanner.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
