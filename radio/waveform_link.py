"""The ``waveform`` link: the numpy waveform emulator between modem and receiver.

It can also *replay* a SigMF recording (``replay_dir``): the received I/Q of each device and
round then comes from the recording instead of the emulator, and only the receiver runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from radio.channel_noise import SEEDED, ChannelNoise
from radio.frame_link import Carried, FrameLink
from radio.framing import WaveformParams
from radio.link import LinkError, Reception
from radio.sigmf_io import read_recording
from radio.symbol_link import ChannelParams
from radio.waveform_channel import EmulatorParams, emulate


class WaveformLink(FrameLink):
    """Pulse-shaped frames through the numpy channel emulator.

    Parameters
    ----------
    channel
        Per-device SNR, fading kind and coherence (shared with the ``symbol`` link).
    waveform
        Frame numerology.
    emulator
        Impairments (Doppler, offsets). Its ``fading`` and ``rician_k_db`` are taken from
        ``channel``; its ``coherence_samples`` from ``channel.coherence_symbols``.
    replay_dir
        Receive from SigMF recordings there instead of emulating (the recorded noise is
        then fixed in a file: not secret).
    noise
        Source of the emulator's white noise; default: the upload's channel generator
        (seeded, not secret).
    **kwargs
        Passed to :class:`~radio.frame_link.FrameLink` (``confidence``, ``record_dir``, ...).
    """

    name = "waveform"

    def __init__(
        self,
        channel: ChannelParams,
        waveform: WaveformParams,
        emulator: EmulatorParams | None = None,
        *,
        replay_dir: Path | None = None,
        noise: ChannelNoise = SEEDED,
        **kwargs: object,
    ) -> None:
        super().__init__(waveform, **kwargs)  # type: ignore[arg-type]
        self.channel = channel
        self.noise = noise
        coherence = (
            None
            if channel.coherence_symbols is None
            else channel.coherence_symbols * waveform.samples_per_symbol
        )
        base = emulator or EmulatorParams()
        self.emulator = replace(
            base,
            fading="none" if channel.noiseless else channel.fading,
            rician_k_db=channel.rician_k_db,
            coherence_samples=coherence,
        )
        self.replay_dir = Path(replay_dir) if replay_dir is not None else None
        if self.replay_dir is not None and not self.replay_dir.is_dir():
            raise ValueError(f"replay_dir: '{self.replay_dir}' is not a directory")

    @property
    def noise_is_secret(self) -> bool:
        return self.replay_dir is None and self.noise.secret

    def _carry(
        self, samples: np.ndarray, *, device: int, round_index: int, rng: np.random.Generator
    ) -> Carried:
        if not 0 <= device < len(self.channel.snr_db):
            raise ValueError(f"device {device} outside [0, {len(self.channel.snr_db)})")
        n0 = self.channel.noise_var(device)
        rx, truth = emulate(
            samples, self.emulator, n0, self.waveform.sample_rate_hz, rng, self.noise
        )
        info = {
            "noise_var_true": truth.noise_var,
            "cfo_true_hz": truth.cfo_hz,
            "delay_true_samples": truth.delay_samples,
            "gain_power_true_mean": float(np.mean(np.abs(truth.gain) ** 2)),
        }
        # In-process: the emulated channel's output is received whole.
        return Carried(rx, rx.size, rx.size, info)

    def carry_air(self, samples: np.ndarray, *, noise_var: float,
                  rng: np.random.Generator) -> Carried:
        """The slot's samples plus the receiver's white noise (from :attr:`noise`)."""
        if self.replay_dir is not None:
            raise NotImplementedError("a replayed waveform link carries no AirComp slot")
        rx = np.asarray(samples, dtype=np.complex128)
        if noise_var > 0:
            rx = rx + self.noise.complex_normal(rx.size, noise_var, rng)
        return Carried(rx, rx.size, rx.size, {"noise_var_true": float(noise_var)})

    def transmit(
        self,
        *,
        device: int,
        round_index: int,
        symbols: np.ndarray,
        rng: np.random.Generator,
    ) -> Reception:
        if self.replay_dir is None:
            return super().transmit(
                device=device, round_index=round_index, symbols=symbols, rng=rng
            )
        x = np.asarray(symbols)
        where = (
            f"waveform link (replay of '{self.replay_dir}'): upload of device {device}, "
            f"round {round_index} lost"
        )
        try:
            rec = read_recording(self.replay_dir, device, round_index)
        except FileNotFoundError as exc:
            raise LinkError(f"{where}: {exc}") from exc
        if rec.n_payload != x.size:
            raise LinkError(
                f"{where}: recording of device {device}, round {round_index} carries "
                f"{rec.n_payload} symbols, the upload has {x.size}"
            )
        if rec.sample_rate_hz != self.waveform.sample_rate_hz:
            raise LinkError(
                f"{where}: recording sample rate {rec.sample_rate_hz} Hz != waveform "
                f"{self.waveform.sample_rate_hz} Hz"
            )
        carried = Carried(
            rec.samples.astype(np.complex128), 0, rec.samples.size, {"replayed": 1.0}
        )
        return self._receive(carried, x.size, device=device, round_index=round_index)
