"""The USRP flowgraph processes as streams: timed bursts out, a time-indexed capture in.

:class:`TxStream` runs ``flowgraphs/tx.py`` and pushes header-delimited bursts to it over
ZeroMQ; each leaves the USRP at its ``tx_time`` (USRP time). :class:`RxStream` runs
``flowgraphs/rx.py``, which streams continuously from a known USRP time; a reader thread
keeps the last seconds in a ring buffer indexed by sample count, so a window can be cut at
any USRP time still held. The ``usrp`` link (:mod:`radio.usrp_link`, both ends in one
process) and the lab split (:mod:`radio.edge_radio`, a transmitter per edge and the
aggregator's receiver) use them.

Start-up failures are :class:`~radio.flowgraph_process.FlowgraphError`; the callers say
which link or device they concern.
"""

from __future__ import annotations

import threading
import time
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
from radio.link import LinkError, LinkFailed

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


def scale_for_dac(samples: np.ndarray, amplitude: float, what: str) -> np.ndarray:
    """``samples * amplitude``, refused when a peak exceeds the DAC's full scale.

    Raises
    ------
    LinkError
        Peak above 1.0; ``what`` (``"usrp link: upload of device 2, round 5"``) opens the
        message. Nothing is sent.
    """
    scaled = np.asarray(samples) * amplitude
    peak = float(np.max(np.abs(scaled))) if scaled.size else 0.0
    if peak > 1.0:
        raise LinkError(
            f"{what} not sent: peak amplitude {peak:.2f} exceeds the DAC range (1.0); lower "
            "usrp.tx_amplitude or the power scaling"
        )
    return scaled


def flowgraph_args(
    sample_rate_hz: float, center_freq_hz: float, clock_source: str, time_source: str,
    time_epoch: str = "zero", air_address: str = "",
) -> list[str]:
    """Command-line arguments common to ``tx.py`` and ``rx.py``."""
    args = [
        "--samp-rate", repr(sample_rate_hz), "--center-freq", repr(center_freq_hz),
        "--clock-source", clock_source, "--time-source", time_source,
    ]
    args += ["--time-epoch", time_epoch] if time_epoch != "zero" else []
    return args + (["--air-address", air_address] if air_address else [])


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


class TxStream:
    """``flowgraphs/tx.py`` on one USRP, fed timed bursts over a ZMQ PUSH socket.

    Parameters
    ----------
    device_args, gain_db, antenna
        UHD device args, TX gain (dB), antenna port.
    sample_rate_hz, center_freq_hz, clock_source, time_source
        As in the hardware config's ``usrp`` section.
    time_epoch
        ``zero`` (USRP time 0 at start-up) or ``host-pps`` (the host's UNIX second latched
        at a PPS edge: every USRP on the same PPS keeps the same time).
    air_address
        The virtual air's burst address (``tcp://HOST:PORT``) for a virtual device
        (``device_args`` ``type=virtual,serial=NAME``; :mod:`radio.virtual_device`); empty
        for a USRP.
    python, log_dir, startup_timeout_s
        Passed to :class:`~radio.flowgraph_process.FlowgraphProcess`.

    Raises
    ------
    FlowgraphError
        The flowgraph failed to start (the socket is closed again).
    """

    def __init__(
        self, *, device_args: str, gain_db: float, antenna: str, sample_rate_hz: float,
        center_freq_hz: float, clock_source: str, time_source: str, time_epoch: str = "zero",
        air_address: str = "", python: str = SYSTEM_PYTHON, log_dir: Path | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        #: Items (headers included) pushed to the flowgraph so far.
        self.items_sent = 0
        address = f"tcp://127.0.0.1:{self.push.bind_to_random_port('tcp://127.0.0.1')}"
        try:
            self.proc: FlowgraphProcess | None = FlowgraphProcess(
                FLOWGRAPH_DIR / "tx.py",
                [*flowgraph_args(sample_rate_hz, center_freq_hz, clock_source, time_source,
                                 time_epoch, air_address),
                 "--device-args", device_args, "--gain", repr(gain_db), "--antenna", antenna,
                 "--in-address", address],
                python=python, log_dir=log_dir, startup_timeout_s=startup_timeout_s,
            )
        except BaseException:
            self.push.close(0)
            raise

    def _proc(self) -> FlowgraphProcess:
        if self.proc is None:
            raise LinkFailed("usrp transmitter is closed")
        return self.proc

    def usrp_time_now(self) -> float:
        """The USRP's current time (s)."""
        return self._proc().call_float("get_time_now")

    def late_bursts(self) -> int:
        """Bursts the USRP reported late so far (``TIME_ERROR``: they arrived after their
        ``tx_time`` and were not sent)."""
        return self._proc().call_int("get_late_bursts")

    def async_events(self) -> list[tuple[int, float | None]]:
        """The USRP's last async events (up to 64), oldest first: (UHD event code, USRP
        time (s) or None); codes 0x1 burst ack, 0x2 underflow, 0x8 time error (late)."""
        out: list[tuple[int, float | None]] = []
        for event in self._proc().call_list("get_async_events"):
            code, t = event if isinstance(event, list | tuple) else (0, None)
            out.append((int(code), None if t is None else float(t)))
        return out

    def check_alive(self) -> None:
        """Raise :class:`~radio.flowgraph_process.FlowgraphError` if the flowgraph died."""
        self._proc().check_alive()

    def send(self, scaled: np.ndarray, tx_time_s: float, where: str, wait_s: float) -> None:
        """Hand one burst (DAC-scaled samples) to the flowgraph, due at USRP ``tx_time_s``.

        Returns once the flowgraph has taken the whole burst (its ``get_samples_in``; at
        most ``wait_s`` more), so that the burst goes out even if this process dies right
        after (the flowgraph passes on what it took before it stops): ZeroMQ's send only
        queues a message, and a process killed before its I/O thread wrote it loses the
        burst. Past ``wait_s`` it returns all the same: the burst may still go out, so it is
        never reported as not sent once queued.

        Raises
        ------
        LinkFailed
            The flowgraph took no samples within ``wait_s`` (nothing was queued).
        """
        proc = self._proc()
        burst = np.concatenate(
            [burst_header(scaled.size, tx_time_s), np.asarray(scaled, dtype=np.complex64)]
        )
        if not self.push.poll(int(1000 * wait_s), zmq.POLLOUT):
            raise LinkFailed(f"{where}: the tx flowgraph (pid {proc.pid}) takes no samples")
        self.push.send(burst.tobytes())
        self.items_sent += burst.size
        end = time.monotonic() + wait_s
        try:
            while (proc.call_float("get_samples_in") < self.items_sent
                   and time.monotonic() < end):
                time.sleep(0.002)
        except FlowgraphError:
            pass  # queued; a dead flowgraph is the caller's next check (confirm)

    def close(self) -> None:
        """Stop the flowgraph and close the socket. Idempotent."""
        try:
            if self.proc is not None:
                self.proc.stop()
        finally:
            self.proc = None
            self.push.close(0)


class RxStream:
    """``flowgraphs/rx.py`` on one USRP, streaming into a ring buffer indexed by USRP time.

    Parameters
    ----------
    device_args, gain_db, antenna, sample_rate_hz, center_freq_hz, clock_source, time_source
        As in the hardware config's ``usrp`` section.
    ring_seconds
        Samples kept (s).
    start_after_s
        Streaming starts this long after the time epoch (USRP time ``start_time``).
    air_address
        The virtual air's stream address (``tcp://HOST:PORT``) for a virtual device; empty
        for a USRP.
    time_epoch, python, log_dir, startup_timeout_s
        As in :class:`TxStream`.

    Raises
    ------
    FlowgraphError
        The flowgraph failed to start (nothing is left running).
    """

    def __init__(
        self, *, device_args: str, gain_db: float, antenna: str, sample_rate_hz: float,
        center_freq_hz: float, clock_source: str, time_source: str, time_epoch: str = "zero",
        ring_seconds: float = 4.0, start_after_s: float = 1.0, air_address: str = "",
        python: str = SYSTEM_PYTHON, log_dir: Path | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.fs = sample_rate_hz
        self.ring: _RxRing | None = None
        address = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.proc: FlowgraphProcess | None = FlowgraphProcess(
            FLOWGRAPH_DIR / "rx.py",
            [*flowgraph_args(sample_rate_hz, center_freq_hz, clock_source, time_source,
                             time_epoch, air_address),
             "--device-args", device_args, "--gain", repr(gain_db), "--antenna", antenna,
             "--out-address", address, "--start-time", repr(start_after_s)],
            python=python, log_dir=log_dir, startup_timeout_s=startup_timeout_s,
        )
        try:
            self.ring = _RxRing(address, int(ring_seconds * sample_rate_hz))
            #: USRP time (s) of received sample 0.
            self.start_time = self.proc.call_float("get_start_time")
        except BaseException:
            self.close()
            raise

    def _proc(self) -> FlowgraphProcess:
        if self.proc is None or self.ring is None:
            raise LinkFailed("usrp receiver is closed")
        return self.proc

    @property
    def capacity_s(self) -> float:
        """Seconds of samples the ring holds."""
        return 0.0 if self.ring is None else self.ring.buf.size / self.fs

    def usrp_time_now(self) -> float:
        """The USRP's current time (s)."""
        return self._proc().call_float("get_time_now")

    def check_alive(self) -> None:
        """Raise :class:`~radio.flowgraph_process.FlowgraphError` if the flowgraph died."""
        self._proc().check_alive()

    def overflows(self) -> int:
        """Gaps (samples lost) in a virtual receiver's stream so far; -1 for a USRP (UHD
        does not count them for the flowgraph)."""
        return self._proc().call_int("get_overflows")

    def check_mapping(self, usrp_now_s: float, where: str) -> None:
        """Refuse to go on once samples were dropped (sample index no longer maps to time).

        Raises
        ------
        LinkFailed
            Fewer samples received than the USRP time says were taken (overflow, stall).
        """
        self._proc()
        assert self.ring is not None
        expected = int((usrp_now_s - self.start_time) * self.fs)
        if self.ring.total < expected - int(0.5 * self.fs):
            raise LinkFailed(
                f"{where}: receiver lost samples (have {self.ring.total}, expected "
                f"~{expected} by USRP time {usrp_now_s:.3f} s); the sample-to-time mapping "
                "is gone"
            )

    def read_at(self, t_usrp_s: float, n: int, timeout_s: float) -> np.ndarray:
        """``n`` samples from USRP time ``t_usrp_s``, waiting up to ``timeout_s`` for them.

        Raises
        ------
        LinkFailed
            The stream stalled (a dead flowgraph says so, with its log).
        LinkError
            The window is no longer in the ring.
        """
        proc = self._proc()
        assert self.ring is not None
        start = int(round((t_usrp_s - self.start_time) * self.fs))
        if start < 0:
            raise LinkError(
                f"usrp link: capture window at USRP time {t_usrp_s:.6f} s begins before the "
                f"receiver's stream ({self.start_time:.6f} s)"
            )
        try:
            return self.ring.read(start, n, timeout_s)
        except LinkFailed:
            proc.check_alive()  # a dead receiver says so, with its log
            raise

    def close(self) -> None:
        """Stop the reader thread and the flowgraph. Idempotent."""
        try:
            if self.ring is not None:
                self.ring.close()
        finally:
            self.ring = None
            if self.proc is not None:
                self.proc.stop()
            self.proc = None
