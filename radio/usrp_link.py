"""The ``usrp`` link: frames over the air through the ``tx`` and ``rx`` flowgraphs.

The receiver flowgraph streams continuously from a known USRP time (``flowgraphs/rx.py``);
a reader thread keeps the last seconds in a ring buffer indexed by sample count. Each upload
is sent as one timed burst (``flowgraphs/tx.py``: header-delimited records turned into
``tx_sob``/``tx_time``/``tx_eob`` tags) ``burst_lead_s`` ahead of the transmitter's clock;
the link then cuts the receive window around the burst's time (mapped to the receiver's
clock, measured at start-up) and demodulates it like any other frame. The channel state is
estimated (pilots); ``probe`` returns ``None``.

No USRP found at start, a flowgraph that fails to start or exits, a receiver stream that
stalls or falls behind (the sample-to-time mapping is then lost), or a transmitter that no
longer takes samples make the link dead (:class:`~radio.link.LinkFailed`); a capture window
missed or a frame not found lose one upload (:class:`~radio.link.LinkError`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from radio.flowgraph_process import (
    FLOWGRAPH_DIR,
    SYSTEM_PYTHON,
    FlowgraphError,
    FlowgraphProcess,
    free_tcp_port,
)
from radio.frame_link import Carried, FrameLink
from radio.framing import WaveformParams
from radio.link import LinkError, LinkFailed, Reception
from radio.uhd_probe import find_usrps

#: Header layout shared with ``flowgraphs/burst_tagger.py``.
BURST_MAGIC = complex(1234.5, -5432.25)
_SPLIT = 1 << 20


def burst_header(n_samples: int, tx_time_s: float) -> np.ndarray:
    """The 4-item header announcing a burst of ``n_samples`` at USRP time ``tx_time_s``."""
    if not 0 < n_samples < _SPLIT * _SPLIT or tx_time_s < 0:
        raise ValueError(f"bad burst: n={n_samples}, tx_time={tx_time_s}")
    secs = int(np.floor(tx_time_s))
    frac = tx_time_s - secs
    return np.array(
        [
            BURST_MAGIC,
            complex(n_samples // _SPLIT, n_samples % _SPLIT),
            complex(secs // _SPLIT, secs % _SPLIT),
            complex(frac, 0.0),
        ],
        dtype=np.complex64,
    )


@dataclass(frozen=True)
class UsrpSettings:
    """Radio settings of the ``usrp`` link (from the hardware config's ``usrp`` section)."""

    tx_args: str
    rx_args: str
    center_freq_hz: float
    sample_rate_hz: float
    tx_gain_db: float
    rx_gain_db: float
    tx_antenna: str = "TX/RX"
    rx_antenna: str = "RX2"
    tx_amplitude: float = 0.25
    clock_source: str = "internal"
    time_source: str = "internal"
    burst_lead_s: float = 0.05
    capture_margin_s: float = 0.02
    python: str = SYSTEM_PYTHON
    ring_seconds: float = 4.0


class _RxRing:
    """Reader thread: receiver samples into a ring buffer indexed by absolute count."""

    def __init__(self, address: str, capacity: int) -> None:
        self.buf = np.zeros(capacity, dtype=np.complex64)
        self.total = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(address)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            data = np.frombuffer(self.sock.recv(), dtype=np.complex64)
            with self.lock:
                idx = (self.total + np.arange(data.size)) % self.buf.size
                self.buf[idx] = data
                self.total += data.size

    def read(self, start: int, n: int, timeout_s: float) -> np.ndarray:
        deadline = time.monotonic() + timeout_s
        while self.total < start + n:
            if time.monotonic() > deadline:
                raise LinkFailed(
                    f"usrp link: receiver stream stalled at {self.total} samples (waited "
                    f"{timeout_s:.1f} s for samples {start}..{start + n})"
                )
            time.sleep(0.01)
        with self.lock:
            if start < self.total - self.buf.size:
                raise LinkError(
                    f"usrp link: capture window at sample {start} already overwritten "
                    f"(ring holds {self.total - self.buf.size}..{self.total})"
                )
            return self.buf[(start + np.arange(n)) % self.buf.size].copy()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.sock.close(0)


class UsrpLink(FrameLink):
    """Over-the-air uploads through a USRP transmitter and receiver.

    Parameters
    ----------
    waveform
        Frame numerology; its sample rate must equal ``settings.sample_rate_hz``.
    settings
        Device args, gains, antennas, clock and time sources, burst timing.
    log_dir
        Folder for the flowgraphs' logs (``tx.log``, ``rx.log``, kept); ``None``: anonymous
        temporary files, gone when the link is closed.
    **kwargs
        Passed to :class:`~radio.frame_link.FrameLink`.

    Raises
    ------
    LinkFailed
        No USRP answers for the transmitter's or receiver's device args (checked with
        ``uhd.find`` before any flowgraph opens a device), or a flowgraph fails to start.
    """

    name = "usrp"

    def __init__(
        self,
        waveform: WaveformParams,
        settings: UsrpSettings,
        *,
        log_dir: Path | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(waveform, **kwargs)  # type: ignore[arg-type]
        self.settings = s = settings
        if abs(s.sample_rate_hz - waveform.sample_rate_hz) > 1e-6 * s.sample_rate_hz:
            raise ValueError(
                f"usrp sample rate {s.sample_rate_hz} != waveform {waveform.sample_rate_hz}"
            )
        for role, args in (("transmitter", s.tx_args), ("receiver", s.rx_args)):
            probe = find_usrps(args, python=s.python)
            if not probe.devices:
                why = probe.message or "UHD found no device"
                raise LinkFailed(
                    f"usrp link: no USRP found for the {role} ('{args}'): {why}; check the "
                    "hardware config's usrp.tx_args / usrp.rx_args, or run "
                    "'testbed radio probe'"
                )
        self.tx_proc: FlowgraphProcess | None = None
        self.rx_proc: FlowgraphProcess | None = None
        self.ring: _RxRing | None = None
        self.push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        in_address = f"tcp://127.0.0.1:{self.push.bind_to_random_port('tcp://127.0.0.1')}"
        out_address = f"tcp://127.0.0.1:{free_tcp_port()}"
        common = [
            "--samp-rate", repr(s.sample_rate_hz), "--center-freq", repr(s.center_freq_hz),
            "--clock-source", s.clock_source, "--time-source", s.time_source,
        ]
        self.start_time = 1.0
        try:
            self.rx_proc = FlowgraphProcess(
                FLOWGRAPH_DIR / "rx.py",
                [*common, "--device-args", s.rx_args, "--gain", repr(s.rx_gain_db),
                 "--antenna", s.rx_antenna, "--out-address", out_address,
                 "--start-time", repr(self.start_time)],
                python=s.python, log_dir=log_dir,
            )
            self.ring = _RxRing(out_address, int(s.ring_seconds * s.sample_rate_hz))
            self.tx_proc = FlowgraphProcess(
                FLOWGRAPH_DIR / "tx.py",
                [*common, "--device-args", s.tx_args, "--gain", repr(s.tx_gain_db),
                 "--antenna", s.tx_antenna, "--in-address", in_address],
                python=s.python, log_dir=log_dir,
            )
            self.clock_offset_s = self.rx_proc.call_float("get_time_now") - (
                self.tx_proc.call_float("get_time_now")
            )
        except FlowgraphError as exc:
            self.close()
            raise LinkFailed(f"usrp link could not start: {exc}") from exc
        except BaseException:
            # KeyboardInterrupt during start-up included: no flowgraph survives.
            self.close()
            raise

    def _carry(
        self, samples: np.ndarray, *, device: int, round_index: int, rng: np.random.Generator
    ) -> Carried:
        assert self.tx_proc is not None and self.rx_proc is not None and self.ring is not None
        s = self.settings
        fs = s.sample_rate_hz
        where = f"device {device}, round {round_index}"
        scaled = samples * s.tx_amplitude
        peak = float(np.max(np.abs(scaled)))
        if peak > 1.0:
            raise LinkError(
                f"usrp link: upload of {where} not sent: peak amplitude {peak:.2f} exceeds "
                "the DAC range (1.0); lower usrp.tx_amplitude or the power scaling"
            )
        try:
            tx_time = self.tx_proc.call_float("get_time_now") + s.burst_lead_s
            rx_now = self.rx_proc.call_float("get_time_now")
        except FlowgraphError as exc:
            raise LinkFailed(
                f"usrp link failed at {where}: {exc}"
            ) from exc
        expected = int((rx_now - self.start_time) * fs)
        if self.ring.total < expected - int(0.5 * fs):
            # Samples dropped (overflow) or the stream stopped: sample index no longer maps
            # to USRP time, so no later capture window can be placed either.
            raise LinkFailed(
                f"usrp link failed at {where}: receiver lost "
                f"samples (have {self.ring.total}, expected ~{expected} by USRP time "
                f"{rx_now:.3f} s); the sample-to-time mapping is gone"
            )
        burst = np.concatenate([burst_header(scaled.size, tx_time), scaled.astype(np.complex64)])
        if not self.push.poll(int(1000 * max(s.burst_lead_s, 1.0)), zmq.POLLOUT):
            raise LinkFailed(
                f"usrp link failed at {where}: the tx flowgraph "
                f"(pid {self.tx_proc.pid}) takes no samples"
            )
        self.push.send(burst.tobytes())
        t_rx = tx_time + self.clock_offset_s - s.capture_margin_s
        start = int(round((t_rx - self.start_time) * fs))
        n = scaled.size + int(2 * s.capture_margin_s * fs)
        timeout = s.burst_lead_s + n / fs + 5.0
        try:
            rx = self.ring.read(max(start, 0), n, timeout)
        except LinkFailed as exc:
            try:
                self.rx_proc.check_alive()  # a dead receiver says so, with its log
            except FlowgraphError as dead:
                raise LinkFailed(f"usrp link failed at {where}: {dead}") from dead
            raise LinkFailed(f"usrp link failed at {where}: {exc}") from exc
        except LinkError as exc:
            raise LinkError(f"usrp link: upload of {where} lost: {exc}") from exc
        return Carried(rx.astype(np.complex128), scaled.size, rx.size, {"tx_time_s": tx_time})

    def transmit(
        self, *, device: int, round_index: int, symbols: np.ndarray, rng: np.random.Generator
    ) -> Reception:
        for proc in (self.tx_proc, self.rx_proc):
            if proc is None:
                raise LinkFailed("usrp link is closed")
            try:
                proc.check_alive()
            except FlowgraphError as exc:
                raise LinkFailed(
                    f"usrp link failed at device {device}, round {round_index}: {exc}"
                ) from exc
        return super().transmit(device=device, round_index=round_index, symbols=symbols, rng=rng)

    def close(self) -> None:
        """Stop both flowgraphs, the reader thread and the socket. Idempotent."""
        try:
            if self.ring is not None:
                self.ring.close()
                self.ring = None
        finally:
            try:
                for proc in (self.tx_proc, self.rx_proc):
                    if proc is not None:
                        proc.stop()
            finally:
                self.tx_proc = self.rx_proc = None
                self.push.close(0)

