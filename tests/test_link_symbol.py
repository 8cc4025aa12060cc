"""The symbol link: measured SNR, fading statistics, state/apply split, analog mapping."""

from __future__ import annotations

import numpy as np
import pytest

from radio.analog import n_symbols_for, reals_to_symbols, symbols_to_reals
from radio.channel import draw_block_gains, expand_blocks
from radio.link import ChannelState
from radio.symbol_link import ChannelParams, SymbolLink, apply_channel
from radio.units import linear_to_db, noise_var_from_snr_db

N = 1_000_000


def _unit_symbols(n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    return x / np.sqrt(np.mean(np.abs(x) ** 2))


@pytest.mark.parametrize("snr_db", [0.0, 5.0, 20.0, 35.0])
def test_measured_snr_within_0_2_db(snr_db: float) -> None:
    rng = np.random.default_rng(1)
    x = _unit_symbols(N, rng)
    link = SymbolLink(ChannelParams(snr_db=(snr_db,)))
    rec = link.transmit(device=0, round_index=0, symbols=x, rng=np.random.default_rng(2))
    noise = rec.symbols - rec.state.gain * x
    measured = float(
        linear_to_db(np.mean(np.abs(rec.state.gain * x) ** 2) / np.mean(np.abs(noise) ** 2))
    )
    assert abs(measured - snr_db) < 0.2
    # Noise is circular: I and Q each carry N0 / 2.
    n0 = noise_var_from_snr_db(snr_db)
    assert np.var(noise.real) == pytest.approx(n0 / 2, rel=0.01)
    assert np.var(noise.imag) == pytest.approx(n0 / 2, rel=0.01)
    assert rec.samples_sent == rec.samples_received == N
    assert rec.airtime_s == pytest.approx(N / 200e3)


def test_rayleigh_mean_power_within_2_percent_and_circular() -> None:
    h = draw_block_gains("rayleigh", 200_000, np.random.default_rng(3))
    assert np.mean(np.abs(h) ** 2) == pytest.approx(1.0, rel=0.02)
    assert abs(np.mean(h)) < 0.01
    # |h|^2 is exponential(1): P(|h|^2 < 0.1) = 1 - exp(-0.1)
    assert np.mean(np.abs(h) ** 2 < 0.1) == pytest.approx(1 - np.exp(-0.1), abs=0.003)


def test_rician_mean_power_and_k_factor() -> None:
    h = draw_block_gains("rician", 200_000, np.random.default_rng(4), rician_k_db=10.0)
    assert np.mean(np.abs(h) ** 2) == pytest.approx(1.0, rel=0.02)
    # K = |LoS|^2 / scatter power; moment estimator from E|h|^2 and E|h|^4
    p2, p4 = np.mean(np.abs(h) ** 2), np.mean(np.abs(h) ** 4)
    k_est = np.sqrt(2 * p2**2 - p4) / (p2 - np.sqrt(2 * p2**2 - p4))
    assert 10 * np.log10(k_est) == pytest.approx(10.0, abs=0.5)


def test_fading_redrawn_per_round_and_reproducible_per_seed() -> None:
    link = SymbolLink(ChannelParams(snr_db=(20.0,), fading="rayleigh"))
    x = np.ones(8, dtype=complex)
    gains = [
        link.transmit(device=0, round_index=t, symbols=x, rng=np.random.default_rng(t)).state.gain
        for t in range(3)
    ]
    assert len({complex(g[0]) for g in gains}) == 3
    assert all(np.all(g == g[0]) for g in gains), "one block per upload"
    again = link.transmit(device=0, round_index=0, symbols=x, rng=np.random.default_rng(0))
    assert again.state.gain[0] == gains[0][0]


def test_coherence_blocks_within_an_upload() -> None:
    blocks = draw_block_gains("rayleigh", 3, np.random.default_rng(0))
    per_symbol = expand_blocks(blocks, 10, 4)
    np.testing.assert_array_equal(per_symbol, blocks[[0, 0, 0, 0, 1, 1, 1, 1, 2, 2]])


def test_probe_predicts_the_state_transmit_uses() -> None:
    link = SymbolLink(ChannelParams(snr_db=(10.0, 3.0), fading="rayleigh"))
    rng = np.random.default_rng(9)
    probed = link.probe(device=1, round_index=4, n_symbols=16, rng=rng)
    rec = link.transmit(device=1, round_index=4, symbols=np.ones(16, complex), rng=rng)
    np.testing.assert_array_equal(probed.gain, rec.state.gain)
    assert rec.state.noise_var == pytest.approx(10**-0.3)


def test_noiseless_is_exact_and_known_state_applies_exactly() -> None:
    x = _unit_symbols(1000, np.random.default_rng(5))
    link = SymbolLink(ChannelParams(snr_db=(20.0,), fading="rayleigh", noiseless=True))
    rec = link.transmit(device=0, round_index=0, symbols=x, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(rec.symbols, x)
    state = ChannelState.known(np.full(1000, 0.3 - 0.4j), 0.0)
    np.testing.assert_allclose(apply_channel(x, state, np.random.default_rng(0)), (0.3 - 0.4j) * x)


def test_channel_state_validation() -> None:
    with pytest.raises(ValueError, match="noise_var_lower"):
        ChannelState(np.ones(2, complex), noise_var=1.0, noise_var_lower=2.0, noise_var_upper=3.0)
    with pytest.raises(ValueError, match="complex"):
        ChannelState(np.ones(2), noise_var=1.0, noise_var_lower=1.0, noise_var_upper=1.0)


@pytest.mark.parametrize("n", [1, 2, 7, 21840])
def test_analog_mapping_round_trip(n: int) -> None:
    v = np.random.default_rng(n).standard_normal(n)
    s = reals_to_symbols(v)
    assert s.shape == (n_symbols_for(n),) and s.dtype == np.complex128
    np.testing.assert_array_equal(symbols_to_reals(s, n), v)
    with pytest.raises(ValueError):
        symbols_to_reals(s, n + 2)
