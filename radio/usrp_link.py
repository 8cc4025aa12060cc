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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from radio.flowgraph_process import SYSTEM_PYTHON, FlowgraphError
from radio.frame_link import Carried, FrameLink
from radio.framing import WaveformParams
from radio.link import LinkError, LinkFailed, Reception
from radio.time_sync import measure_offset
from radio.uhd_probe import find_usrps
from radio.usrp_stream import (  # noqa: F401 - BURST_MAGIC, burst_header re-exported
    BURST_MAGIC,
    RxStream,
    TxStream,
    burst_header,
    scale_for_dac,
)
from radio.virtual_device import is_virtual


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
    #: Virtual devices (:mod:`radio.virtual_device`): where the transmitter's bursts go and
    #: where the receiver's stream comes from (``testbed air``); "" for real USRPs.
    tx_air_address: str = ""
    rx_air_address: str = ""


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
    on_close
        Called once the flowgraphs are stopped (a virtual air started for this link).
    **kwargs
        Passed to :class:`~radio.frame_link.FrameLink`.

    Raises
    ------
    LinkFailed
        No USRP answers for the transmitter's or receiver's device args (checked with
        ``uhd.find`` before any flowgraph opens a device), or a flowgraph fails to start.
    """

    name = "usrp"

    @property
    def noise_is_secret(self) -> bool:
        """``True``: the receiver's own thermal noise, drawn by no generator."""
        return True

    def __init__(
        self,
        waveform: WaveformParams,
        settings: UsrpSettings,
        *,
        log_dir: Path | None = None,
        on_close: Callable[[], None] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(waveform, **kwargs)  # type: ignore[arg-type]
        self.on_close = on_close
        self.settings = s = settings
        if abs(s.sample_rate_hz - waveform.sample_rate_hz) > 1e-6 * s.sample_rate_hz:
            raise ValueError(
                f"usrp sample rate {s.sample_rate_hz} != waveform {waveform.sample_rate_hz}"
            )
        for role, args in (("transmitter", s.tx_args), ("receiver", s.rx_args)):
            if is_virtual(args):
                continue  # nothing to discover
            probe = find_usrps(args, python=s.python)
            if not probe.devices:
                why = probe.message or "UHD found no device"
                raise LinkFailed(
                    f"usrp link: no USRP found for the {role} ('{args}'): {why}; check the "
                    "hardware config's usrp.tx_args / usrp.rx_args, or run "
                    "'testbed radio probe'; without USRPs, --fallback emulate runs on "
                    "emulated radios"
                )
        self.tx: TxStream | None = None
        self.rx: RxStream | None = None
        radio: dict[str, Any] = {
            "sample_rate_hz": s.sample_rate_hz, "center_freq_hz": s.center_freq_hz,
            "clock_source": s.clock_source, "time_source": s.time_source,
            "python": s.python, "log_dir": log_dir,
        }
        try:
            self.rx = RxStream(device_args=s.rx_args, gain_db=s.rx_gain_db,
                               antenna=s.rx_antenna, ring_seconds=s.ring_seconds,
                               air_address=s.rx_air_address, **radio)
            self.tx = TxStream(device_args=s.tx_args, gain_db=s.tx_gain_db,
                               antenna=s.tx_antenna, air_address=s.tx_air_address, **radio)
            # Receiver time minus transmitter time, from the fastest of several bracketed
            # readings (one pair of sequential calls is off by their latency: tens of ms
            # on a loaded host, more than the capture margin).
            tx_minus_rx = measure_offset(self.tx.usrp_time_now, exchanges=5,
                                         clock=self.rx.usrp_time_now, drift_ppm=0.0,
                                         hold_s=0.0)
            self.clock_offset_s = -tx_minus_rx.offset_s
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
        assert self.tx is not None and self.rx is not None
        s = self.settings
        fs = s.sample_rate_hz
        where = f"device {device}, round {round_index}"
        scaled = scale_for_dac(samples, s.tx_amplitude, f"usrp link: upload of {where}")
        try:
            tx_time = self.tx.usrp_time_now() + s.burst_lead_s
            # Not before the receiver streams (it starts start_after_s after its epoch):
            # a first upload right after start-up would be captured before its samples.
            tx_time = max(tx_time, self.rx.start_time - self.clock_offset_s
                          + s.capture_margin_s)
            rx_now = self.rx.usrp_time_now()
        except FlowgraphError as exc:
            raise LinkFailed(
                f"usrp link failed at {where}: {exc}"
            ) from exc
        # Samples dropped (overflow) or the stream stopped: sample index no longer maps to
        # USRP time, so no later capture window can be placed either.
        self.rx.check_mapping(rx_now, f"usrp link failed at {where}")
        self.tx.send(scaled, tx_time, f"usrp link failed at {where}",
                     wait_s=max(s.burst_lead_s, 1.0))
        t_rx = tx_time + self.clock_offset_s - s.capture_margin_s
        n = scaled.size + int(2 * s.capture_margin_s * fs)
        timeout = s.burst_lead_s + n / fs + 5.0
        try:
            rx = self.rx.read_at(t_rx, n, timeout)
        except LinkFailed as exc:
            raise LinkFailed(f"usrp link failed at {where}: {exc}") from exc
        except LinkError as exc:
            raise LinkError(f"usrp link: upload of {where} lost: {exc}") from exc
        return Carried(rx.astype(np.complex128), scaled.size, rx.size, {"tx_time_s": tx_time})

    def transmit(
        self, *, device: int, round_index: int, symbols: np.ndarray, rng: np.random.Generator
    ) -> Reception:
        for stream in (self.tx, self.rx):
            if stream is None:
                raise LinkFailed("usrp link is closed")
            try:
                stream.check_alive()
            except FlowgraphError as exc:
                raise LinkFailed(
                    f"usrp link failed at device {device}, round {round_index}: {exc}"
                ) from exc
        return super().transmit(device=device, round_index=round_index, symbols=symbols, rng=rng)

    def close(self) -> None:
        """Stop both flowgraphs, the reader thread and the socket. Idempotent."""
        try:
            if self.rx is not None:
                self.rx.close()
        finally:
            self.rx = None
            try:
                if self.tx is not None:
                    self.tx.close()
            finally:
                self.tx = None
                on_close, self.on_close = self.on_close, None
                if on_close is not None:
                    on_close()
