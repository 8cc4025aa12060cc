"""The ``symbol`` link: in-process ``y = h x + n`` per analog symbol.

The state (``h``, ``N0``) is drawn from the upload's channel generator; the noise ``n`` from
the link's :class:`~radio.channel_noise.ChannelNoise` source (seeded by default; the testbed
gives a link whose noise it credits the OS CSPRNG's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radio.channel import Fading, draw_block_gains, expand_blocks, n_blocks_for
from radio.channel_noise import SEEDED, ChannelNoise
from radio.link import ChannelState, Link, Reception, check_upload
from radio.units import noise_var_from_snr_db


@dataclass(frozen=True)
class ChannelParams:
    """Per-device channel description shared by the simulated links.

    Attributes
    ----------
    snr_db
        Per-device receive SNR (dB) of a unit-power stream at unit mean channel gain,
        shape ``(devices,)``.
    fading
        ``none``, ``rayleigh`` or ``rician`` (block fading, ``E|h|^2 = 1``).
    rician_k_db
        Rician K-factor (dB).
    coherence_symbols
        Symbols per fading block; ``None``: one block per upload (redrawn every round).
    symbol_rate_hz
        Symbol rate (Hz); sets the air time.
    noiseless
        ``h = 1`` and no noise (for exactness tests).
    """

    snr_db: tuple[float, ...]
    fading: Fading = "none"
    rician_k_db: float = 6.0
    coherence_symbols: int | None = None
    symbol_rate_hz: float = 200e3
    noiseless: bool = False

    def noise_var(self, device: int) -> float:
        """N0 of ``device`` per complex symbol (symbol-power units)."""
        if self.noiseless:
            return 0.0
        return noise_var_from_snr_db(self.snr_db[device])

    def draw_state(self, device: int, n_symbols: int, rng: np.random.Generator) -> ChannelState:
        """Generate the channel state of one upload (gain per symbol, N0)."""
        if not 0 <= device < len(self.snr_db):
            raise ValueError(f"device {device} outside [0, {len(self.snr_db)})")
        fading: Fading = "none" if self.noiseless else self.fading
        blocks = draw_block_gains(
            fading,
            n_blocks_for(n_symbols, self.coherence_symbols),
            rng,
            rician_k_db=self.rician_k_db,
        )
        gain = expand_blocks(blocks, n_symbols, self.coherence_symbols)
        return ChannelState.known(gain, self.noise_var(device))


def apply_channel(
    symbols: np.ndarray,
    state: ChannelState,
    rng: np.random.Generator,
    noise: ChannelNoise = SEEDED,
) -> np.ndarray:
    """``y = h x + n`` with the state's gain and noise, shape as ``symbols``.

    ``n ~ CN(0, state.noise_var)`` comes from ``noise`` (default: from ``rng``).
    """
    x = np.asarray(symbols, dtype=np.complex128)
    if x.shape != state.gain.shape:
        raise ValueError(f"symbols shape {x.shape} != channel gain shape {state.gain.shape}")
    y = state.gain * x
    if state.noise_var > 0:
        y += noise.complex_normal(x.size, state.noise_var, rng)  # y is new: no copy
    return y


class SymbolLink(Link):
    """In-process symbol-level channel; the receiver knows h and N0 exactly.

    Parameters
    ----------
    params
        Per-device SNR, fading and coherence.
    noise
        Source of the additive noise; default: the upload's channel generator (seeded, not
        secret).
    """

    name = "symbol"
    exact_state = True

    def __init__(self, params: ChannelParams, noise: ChannelNoise = SEEDED) -> None:
        self.params = params
        self.noise = noise
        self._probed: dict[tuple[int, int], ChannelState] = {}

    @property
    def noise_is_secret(self) -> bool:
        return self.noise.secret

    def probe(
        self, *, device: int, round_index: int, n_symbols: int, rng: np.random.Generator
    ) -> ChannelState:
        state = self.params.draw_state(device, n_symbols, rng)
        self._probed[(device, round_index)] = state
        return state

    def transmit(
        self,
        *,
        device: int,
        round_index: int,
        symbols: np.ndarray,
        rng: np.random.Generator,
    ) -> Reception:
        x = check_upload(symbols, device, round_index)
        state = self._probed.pop((device, round_index), None)
        if state is None or state.gain.size != x.size:
            state = self.params.draw_state(device, x.size, rng)
        y = apply_channel(x, state, rng, self.noise)
        return Reception(
            symbols=y,
            state=state,
            samples_sent=x.size,
            samples_received=y.size,
            airtime_s=x.size / self.params.symbol_rate_hz,
        )
