"""Shared machinery of the links that carry a sampled waveform.

A :class:`FrameLink` modulates the payload (:mod:`radio.modem`), hands the samples to a
medium (the numpy emulator, a GNU Radio flowgraph, or USRPs), demodulates what comes back,
optionally records it as SigMF, and returns a :class:`~radio.link.Reception` whose channel
state is *estimated* from the pilots (``estimated=True``, ``N0`` confidence bounds).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radio.framing import WaveformParams
from radio.link import Link, LinkError, Reception, check_upload
from radio.modem import demodulate, modulate
from radio.sigmf_io import append_frame_log, write_recording
from radio.sync import SyncError


@dataclass(frozen=True)
class Carried:
    """What a medium returned for one upload.

    Attributes
    ----------
    samples
        Received complex baseband, shape ``(n,)``.
    samples_sent, samples_received
        Counts at both ends (a medium raises :class:`LinkError` if samples went missing).
    info
        Medium-specific values (``cfo_true_hz``, ``noise_var_true``, ...).
    """

    samples: np.ndarray
    samples_sent: int
    samples_received: int
    info: dict[str, float]


class FrameLink(Link):
    """A link that sends frames of samples through some medium.

    Parameters
    ----------
    waveform
        Numerology of the frame.
    confidence
        Confidence level of the estimated ``N0`` interval and gain bound.
    record_dir
        Store each received upload there as SigMF, and log per-frame estimates to
        ``frames.jsonl``.
    center_freq_hz, hw_name
        Recorded in the SigMF metadata.
    """

    def __init__(
        self,
        waveform: WaveformParams,
        *,
        confidence: float = 0.95,
        record_dir: Path | None = None,
        center_freq_hz: float = 915e6,
        hw_name: str = "",
    ) -> None:
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence: got {confidence}; allowed: (0, 1)")
        self.waveform = waveform
        self.confidence = confidence
        self.record_dir = Path(record_dir) if record_dir is not None else None
        self.center_freq_hz = center_freq_hz
        self.hw_name = hw_name or self.name

    @abstractmethod
    def _carry(
        self, samples: np.ndarray, *, device: int, round_index: int, rng: np.random.Generator
    ) -> Carried:
        """Send ``samples`` through the medium and return what the receiver captured."""

    def transmit(
        self,
        *,
        device: int,
        round_index: int,
        symbols: np.ndarray,
        rng: np.random.Generator,
    ) -> Reception:
        x = check_upload(symbols, device, round_index)
        tx, _ = modulate(self.waveform, x)
        carried = self._carry(tx, device=device, round_index=round_index, rng=rng)
        return self._receive(carried, x.size, device=device, round_index=round_index)

    def carry_air(self, samples: np.ndarray, *, noise_var: float,
                  rng: np.random.Generator) -> Carried:
        """Put ``samples`` (already the superposition of every transmitter's path, with
        leading and trailing silence) through the medium with the receiver's noise only,
        ``N0 = noise_var`` per sample: no random delay, carrier offset or fading of the
        medium's own (one AirComp slot, :mod:`radio.aircomp_air`).

        Raises
        ------
        NotImplementedError
            This link carries no superposed slot.
        """
        raise NotImplementedError(f"the {self.name} link carries no superposed AirComp slot")

    def receive(
        self, carried: Carried, n_payload: int, *, device: int, round_index: int
    ) -> Reception:
        """Demodulate what :meth:`carry_air` returned, on the receiver's own frequency
        reference (a shared reference: no offset to estimate); a lost frame:
        :class:`LinkError`."""
        return self._receive(carried, n_payload, device=device, round_index=round_index,
                             known_cfo_hz=0.0)

    def _receive(
        self, carried: Carried, n_payload: int, *, device: int, round_index: int,
        known_cfo_hz: float | None = None,
    ) -> Reception:
        try:
            demod = demodulate(self.waveform, carried.samples, n_payload, self.confidence,
                               known_cfo_hz)
        except SyncError as exc:
            raise LinkError(
                f"{self.name} link: upload of device {device}, round {round_index} lost: {exc}"
            ) from exc
        info = {**carried.info, **demod.info}
        if self.record_dir is not None:
            write_recording(
                self.record_dir,
                carried.samples,
                sample_rate_hz=self.waveform.sample_rate_hz,
                center_freq_hz=self.center_freq_hz,
                device=device,
                round_index=round_index,
                n_payload=n_payload,
                hw=self.hw_name,
                link=self.name,
                estimates=info,
            )
            append_frame_log(
                self.record_dir,
                {"device": device, "round": round_index, "link": self.name, **info},
            )
        return Reception(
            symbols=demod.payload,
            state=demod.state,
            samples_sent=carried.samples_sent,
            samples_received=carried.samples_received,
            airtime_s=n_payload / self.waveform.symbol_rate_hz,
            info=info,
        )
