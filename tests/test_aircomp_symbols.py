"""AirComp at the symbol level: truncated channel inversion, one-slot superposition, the
aggregation error, and the noise shares that meet the aggregate noise multiplier."""

from __future__ import annotations

import math

import numpy as np
import pytest

from radio.aircomp import (
    aggregation_nmse,
    amplitude_for,
    misalignment_bounds,
    pre_equalize,
    superpose,
)
from radio.analog import reals_to_symbols, symbols_to_reals
from testbed.core.privacy.analysis.aircomp_noise import round_events, share_sigma


def test_truncated_inversion_keeps_devices_within_their_power() -> None:
    h_hat = np.array([1.0, 0.5j, 0.1, 2.0 * np.exp(1j)])
    p_max, power = 4.0, 1.0
    c = amplitude_for(h_hat, p_max, power, participants=3)
    assert c == pytest.approx(1.0)  # reaches: 2, 1, 0.2, 4 -> the third largest
    eq = pre_equalize(h_hat, c, p_max, power)
    assert eq.participating.tolist() == [True, True, False, True]
    assert np.all(np.abs(eq.alpha) ** 2 * power <= p_max * (1 + 1e-12))
    np.testing.assert_allclose((h_hat * eq.alpha)[eq.participating], c)
    assert eq.alpha[2] == 0
    with pytest.raises(ValueError, match="participants must lie in"):
        amplitude_for(h_hat, p_max, power, participants=5)


def test_misalignment_bounds_are_the_gain_bounds_over_the_estimate() -> None:
    lo, hi = misalignment_bounds(np.array([2.0, 1j]), np.array([1.8, 0.9]),
                                 np.array([2.2, 1.25]))
    np.testing.assert_allclose(lo, [0.9, 0.9])
    np.testing.assert_allclose(hi, [1.1, 1.25])


def test_one_slot_carries_the_sum_with_the_predicted_error() -> None:
    """Ten devices, Rayleigh channels known to each, one slot: ``y / c`` is the sum of the
    noisy values, off by the receiver noise only, ``n0 / (2 c^2)`` per real coordinate.
    The slot is one upload's length: TDMA would need ten."""
    rng = np.random.default_rng(5)
    n, d = 10, 4000
    values = rng.normal(0.0, 0.02, (n, d))  # each device's v_j + n_j
    h = (rng.normal(size=n) + 1j * rng.normal(size=n)) / math.sqrt(2)
    p_max, power, n0 = 1.0, float(np.mean(values**2)) * 2, 1e-3
    c = amplitude_for(h, p_max, power, participants=n)
    eq = pre_equalize(h, c, p_max, power)
    sent = np.stack([eq.alpha[j] * reals_to_symbols(values[j]) for j in range(n)])
    y = superpose(sent, h, n0, rng)
    assert y.shape == (d // 2,)  # one slot, one upload's symbols
    estimate = symbols_to_reals(y / c, d)
    truth = values.sum(axis=0)
    predicted = (n0 / (2 * c**2)) * d / float(np.sum(truth**2))
    assert aggregation_nmse(estimate, truth) == pytest.approx(predicted, rel=0.1)


def test_noise_shares_meet_the_aggregate_multiplier() -> None:
    """``share_sigma`` closes the loop with the accountant: the events of a round in which
    every device added its share have exactly the target noise multiplier."""
    z, clip, batch, n = 1.3, 1.0, 64.0, 10
    recv = 0.2 * (z * clip / batch) ** 2  # the receiver supplies a fifth of the variance
    for t in (0, 3, n - 1):
        sigma = share_sigma(z, devices=n, colluding=t, example_clip=clip,
                            expected_batch=batch, receiver_noise_var=recv)
        events = round_events(round_index=0, devices=list(range(n)), sigma=[sigma] * n,
                              rho_lower=[1.0] * n, rho_upper=[1.0] * n,
                              sampling_rate=[0.05] * n, expected_batch=[batch] * n,
                              dataset_size=[3000] * n, example_clip=clip,
                              receiver_noise_var=recv, colluding=t)
        for e in events:
            assert e.effective_noise_multiplier == pytest.approx(z, rel=1e-12)
    alone = share_sigma(z, devices=n, colluding=n - 1, example_clip=clip, expected_batch=batch)
    shared = share_sigma(z, devices=n, colluding=0, example_clip=clip, expected_batch=batch)
    assert shared == pytest.approx(alone / math.sqrt(n))
    with pytest.raises(ValueError, match="colluding"):
        share_sigma(z, devices=n, colluding=n, example_clip=clip, expected_batch=batch)
