"""The budget guard never lets a device end above its target."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.privacy import BudgetGuard, PrivacyAccountant, UploadEvent


def upload(device: int, r: int, sigma: float, alpha: float, gain: float,
           q: int | None, trusted: float) -> UploadEvent:
    return UploadEvent(round=r, device=device, mechanism="before", sigma=sigma, alpha=alpha,
                       gain=gain, n0=0.05, trusted_channel_noise=trusted, d=5000, l=500, q=q,
                       clip=5.0)


step = st.tuples(
    st.integers(0, 2),                                  # device
    st.floats(0.0, 5.0),                                # sigma
    st.floats(0.01, 20.0),                              # alpha
    st.floats(0.0, 3.0),                                # |h| (fading)
    st.sampled_from([None, 4, 16]),                     # Q
    st.floats(0.0, 1.0),                                # trusted fraction
)


@pytest.mark.filterwarnings("ignore::testbed.core.privacy.analysis.rdp.OrderAtEdgeWarning")
@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["paper", "strict"]),
    targets=st.lists(st.floats(0.05, 20.0), min_size=3, max_size=3),
    schedule=st.lists(step, min_size=1, max_size=25),
)
def test_gated_uploads_never_exceed_the_target(
    mode: str, targets: list[float], schedule: list[tuple]
) -> None:
    accountant = PrivacyAccountant(mode=mode, delta=1e-5)
    guard = BudgetGuard(accountant, {i: t for i, t in enumerate(targets)})
    for r, (device, sigma, alpha, gain, q, trusted) in enumerate(schedule):
        e = upload(device, r, sigma, alpha, gain, q, trusted)
        if guard.allows(device, e):
            accountant.add(e)
    for device, target in enumerate(targets):
        assert accountant.epsilon(device).epsilon <= target
        assert guard.remaining(device) >= 0


def test_guard_allows_what_fits_and_refuses_what_does_not() -> None:
    accountant = PrivacyAccountant(mode="strict", delta=1e-5)
    guard = BudgetGuard(accountant, 2.0)
    quiet = upload(0, 0, sigma=50.0, alpha=1.0, gain=1.0, q=None, trusted=1.0)
    loud = upload(0, 1, sigma=0.0, alpha=1.0, gain=1.0, q=16, trusted=1.0)  # strict: inf
    assert guard.allows(0, quiet)
    assert not guard.allows(0, loud)
    assert guard.projected(0, loud).epsilon == math.inf
    accountant.add(quiet)
    assert 0 < guard.remaining(0) < 2.0


def test_guard_validation() -> None:
    accountant = PrivacyAccountant(mode="paper")
    with pytest.raises(ValueError, match="epsilon_target"):
        BudgetGuard(accountant, 0.0)
    with pytest.raises(ValueError, match="epsilon_target"):
        BudgetGuard(accountant, {0: math.inf})
    with pytest.raises(TypeError, match="accountant"):
        BudgetGuard(object(), 1.0)  # type: ignore[arg-type]
    guard = BudgetGuard(accountant, {0: 1.0})
    with pytest.raises(KeyError, match="device 5"):
        guard.allows(5, upload(5, 0, 1.0, 1.0, 1.0, None, 1.0))
