"""Record-level accounting: events, the dp-accounting engines, the accountant and the guard."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant, compute_epsilon
from hypothesis import example, given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant as OpacusRDP
from opacus.accountants.analysis.rdp import compute_rdp as opacus_compute_rdp

from testbed.core.privacy import (
    BudgetGuard,
    EventError,
    OrderAtEdgeWarning,
    RecordAccountant,
    RecordEvent,
    calibrate_noise_multiplier,
    device_level_epsilon,
    record_epsilon_for,
    sgm_rdp,
)
from testbed.core.privacy.analysis.record_rdp import ORDERS, extended_orders, round_down

DELTA = 1e-5


def event(**kw: Any) -> RecordEvent:
    """A FedSGD step: q = 0.01, B = 60, C = 1, D = 6000, z = sigma B / C = 1 by default."""
    base: dict[str, Any] = dict(round=0, device=0, steps=1, sampling_rate=0.01, amplified=True,
                                example_clip=1.0, expected_batch=60.0, dataset_size=6000,
                                sigma=1.0 / 60.0)
    base.update(kw)
    return RecordEvent(**base)


def channel(**kw: Any) -> RecordEvent:
    """A step with channel credit: n0 = (sigma/2)^2 at unit gain and alpha, l/d = 1/2."""
    base: dict[str, Any] = dict(alpha=1.0, gain=1.0, n0=(1.0 / 120.0) ** 2,
                                trusted_channel_noise=1.0, d=1000, l=500)
    base.update(kw)
    return event(**base)


def dpa_curve(q: float, z: float, steps: int, orders: tuple[float, ...] = ORDERS) -> np.ndarray:
    """dp_accounting's own RDP accountant for one event (the reference)."""
    acc = RdpAccountant(orders=list(orders))
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps))
    return acc.rdp


# ----------------------------------------------------------------------------- events


def test_event_json_round_trip() -> None:
    e = channel(round=7, device=3, relation="replace-one", amplified=False)
    text = e.to_json()
    assert json.loads(text)["type"] == "record-sgm/v1"
    assert RecordEvent.from_json(text) == e
    assert RecordEvent.from_dict(e.to_dict()) == e


@pytest.mark.parametrize(("field", "value", "match"), [
    ("round", -1, "round"), ("device", 1.0, "device"), ("steps", 0, "steps"),
    ("sampling_rate", 0.0, "sampling_rate"), ("sampling_rate", 1.5, "sampling_rate"),
    ("sampling_rate", math.nan, "sampling_rate"), ("amplified", 1, "amplified"),
    ("example_clip", 0.0, "example_clip"), ("expected_batch", math.inf, "expected_batch"),
    ("dataset_size", 0, "dataset_size"), ("sigma", -0.1, "sigma"), ("sigma", True, "sigma"),
    ("trusted_channel_noise", 1.5, "trusted"), ("n0", math.nan, "n0"),
    ("l", 2000, "l <= d"), ("relation", "swap", "relation"),
])
def test_event_refuses_bad_fields(field: str, value: Any, match: str) -> None:
    with pytest.raises(EventError, match=match):
        channel(**{field: value})


def test_event_refuses_channel_credit_over_several_steps() -> None:
    with pytest.raises(EventError, match="steps=5 with channel credit"):
        channel(steps=5)
    assert channel(steps=5, trusted_channel_noise=0.0).steps == 5  # recorded, not credited


@pytest.mark.parametrize("data", [
    {**channel().to_dict(), "extra": 1},
    {**channel().to_dict(), "type": "upload/v1"},
    [1, 2],
])
def test_event_from_dict_refuses_unknown_keys_and_tags(data: Any) -> None:
    with pytest.raises(EventError):
        RecordEvent.from_dict(data)
    with pytest.raises(EventError, match="not JSON"):
        RecordEvent.from_json("{oops")


def test_effective_noise_multiplier_follows_the_d_over_l_scaling() -> None:
    e = channel(sigma=0.02, alpha=2.0, gain=0.5, n0=0.01, trusted_channel_noise=0.5,
                d=1000, l=100)
    # on air: x = alpha (d/l) v; after dividing y by gain alpha d/l the channel adds
    # std sqrt(trusted n0) (l/d) / (gain alpha) in v's units
    chan_std = math.sqrt(0.5 * 0.01) * (100 / 1000) / (0.5 * 2.0)
    assert e.effective_noise_multiplier == pytest.approx(
        math.sqrt(0.02**2 + chan_std**2) * 60.0, rel=1e-12)
    assert e.noise_multiplier_without_channel == pytest.approx(0.02 * 60.0, rel=1e-15)
    for no_credit in ("gain", "alpha", "n0", "trusted_channel_noise"):
        plain = replace(e, **{no_credit: 0.0})  # type: ignore[arg-type]
        assert not plain.channel_credited
        assert plain.effective_noise_multiplier == plain.noise_multiplier_without_channel
    assert replace(e, amplified=False).effective_sampling_rate == 1.0


# ----------------------------------------------------------------------------- RDP math


@pytest.mark.parametrize(("q", "z", "extended"), [
    (1e-3, 0.7, False), (0.01, 1.0, True), (0.05, 3.0, False), (0.3, 0.8, False),
    (0.9, 1.5, False), (1.0, 2.0, False), (0.01, 40.0, False),
])
def test_sgm_rdp_matches_dp_accounting(q: float, z: float, extended: bool) -> None:
    # the extended grid holds 2a and 2a - 1 (up to 8192), used by replace-one
    grid = extended_orders(ORDERS) if extended else ORDERS
    ours = sgm_rdp(q=q, noise_multiplier=z, orders=grid)
    ref = dpa_curve(q, z, 1, grid)
    assert np.array_equal(np.isinf(ours), np.isinf(ref))
    finite = np.isfinite(ref)
    assert np.all(np.abs(ours[finite] - ref[finite]) <= 1e-10 * ref[finite] + 1e-14)


def test_sgm_rdp_edge_values_and_validation() -> None:
    assert np.all(sgm_rdp(q=0.1, noise_multiplier=0.0, orders=ORDERS) == np.inf)
    assert np.all(sgm_rdp(q=0.1, noise_multiplier=math.inf, orders=ORDERS) == 0)
    for bad in (dict(q=0.0, noise_multiplier=1.0), dict(q=0.1, noise_multiplier=-1.0),
                dict(q=0.1, noise_multiplier=math.nan)):
        with pytest.raises(ValueError):
            sgm_rdp(orders=ORDERS, **bad)
    assert round_down(1.2345, 1e-3) <= 1.2345 < round_down(1.2345, 1e-3) * 1.001
    assert round_down(0.7, 0.0) == 0.7


# ----------------------------------------------------------------------------- homogeneous


CASES = [(0.01, 1.0, 1000), (0.004, 1.1, 5000), (0.1, 2.0, 100), (0.05, 0.8, 50),
         (1.0, 5.0, 10), (0.001, 0.6, 3000)]


@pytest.mark.parametrize(("q", "z", "steps"), CASES)
def test_rdp_matches_opacus_and_pld_is_tighter(q: float, z: float, steps: int) -> None:
    ours = record_epsilon_for(q=q, z=z, steps=steps, delta=DELTA)
    opacus = OpacusRDP()
    opacus.history = [(z, q, steps)]
    eps_opacus, _ = opacus.get_privacy_spent(delta=DELTA)
    assert ours.epsilon == pytest.approx(eps_opacus, rel=0.01)
    pld = record_epsilon_for(q=q, z=z, steps=steps, delta=DELTA, accountant="pld")
    assert 0.5 * ours.epsilon < pld.epsilon <= ours.epsilon


def test_pld_engine_is_dp_accountings_pld_accountant() -> None:
    ref = PLDAccountant(value_discretization_interval=1e-3)
    ref.compose(dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.3)),
                200)
    ours = record_epsilon_for(q=0.02, z=1.3, steps=200, delta=DELTA, accountant="pld")
    assert ours.epsilon == ref.get_epsilon(DELTA)


# ----------------------------------------------------------------------------- heterogeneous


def random_history(seed: int, n: int) -> list[RecordEvent]:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        if rng.random() < 0.5:  # FedSGD round on air, realized fading gain
            out.append(channel(round=r, gain=float(np.sqrt(rng.exponential())),
                               sigma=float(rng.uniform(0.01, 0.03)),
                               sampling_rate=float(rng.choice([0.01, 0.02]))))
        else:  # H local steps with per-step noise, no channel credit
            out.append(event(round=r, steps=int(rng.integers(1, 6)),
                             sigma=float(rng.uniform(0.01, 0.03)),
                             amplified=bool(rng.random() < 0.8)))
    return out


def test_heterogeneous_rdp_is_the_sum_of_per_event_rdp() -> None:
    history = random_history(0, 20)
    acc = RecordAccountant("rdp", DELTA)
    for e in history:
        acc.add(e)
    orders, curve = acc.rdp_curve(0)
    # dp_accounting, event by event, summed: the whole curve
    ref = sum(dpa_curve(e.effective_sampling_rate, e.effective_noise_multiplier, e.steps)
              for e in history)
    assert np.allclose(curve, ref, rtol=1e-9, atol=0)
    eps_ref, order_ref = compute_epsilon(orders, ref, DELTA)
    assert acc.epsilon(0).epsilon == pytest.approx(eps_ref, rel=1e-9)
    assert acc.epsilon(0).order == order_ref
    # opacus, independently (its fractional-order series differs: integer orders only; it
    # overflows to nan above order ~1000)
    ints = [i for i, a in enumerate(orders) if float(a).is_integer() and a <= 512]
    opacus = sum(np.asarray(opacus_compute_rdp(
        q=e.effective_sampling_rate, noise_multiplier=e.effective_noise_multiplier,
        steps=e.steps, orders=[orders[i] for i in ints])) for e in history)
    assert np.allclose(curve[ints], opacus, rtol=1e-6, atol=0)


@pytest.mark.parametrize(("accountant", "relation"), [
    ("rdp", "add-remove"), ("pld", "add-remove"), ("rdp", "replace-one"),
    ("pld", "replace-one"),
])
def test_epsilon_if_is_epsilon_after_add_bit_for_bit(accountant: str, relation: str) -> None:
    n = 12 if accountant == "pld" else 40
    history = [replace(e, relation=relation) for e in random_history(1, n)]
    acc = RecordAccountant(accountant, DELTA, relation=relation)
    for i, e in enumerate(history):
        projected = acc.epsilon_if(0, e)
        if i % 3 == 0:  # another what-if in between: add must recompute, not reuse
            acc.epsilon_if(0, replace(e, sigma=e.sigma * 2))
        acc.add(e)
        now = acc.epsilon(0)
        assert now.epsilon == projected.epsilon
        assert now.events == projected.events == i + 1
        assert now.steps == projected.steps
        assert (now.order == projected.order) or (math.isnan(now.order)
                                                  and math.isnan(projected.order))
    assert acc.history(0) == tuple(history)


def test_replace_one_bounds_are_valid_and_not_absurd() -> None:
    # without subsampling replace-one is exactly the Gaussian with sensitivity 2C/B: z / 2
    exact = record_epsilon_for(q=1.0, z=2.5, steps=10, delta=DELTA)
    for accountant in ("rdp", "pld"):
        add = record_epsilon_for(q=1.0, z=5.0, steps=10, delta=DELTA, accountant=accountant)
        rep = record_epsilon_for(q=1.0, z=5.0, steps=10, delta=DELTA, accountant=accountant,
                                 relation="replace-one")
        assert add.epsilon < rep.epsilon
        assert 0.95 * exact.epsilon <= rep.epsilon <= 1.3 * exact.epsilon
    sub = record_epsilon_for(q=0.01, z=1.0, steps=500, delta=DELTA)
    sub_rep = record_epsilon_for(q=0.01, z=1.0, steps=500, delta=DELTA, relation="replace-one")
    assert sub.epsilon < sub_rep.epsilon < 3 * sub.epsilon


# ----------------------------------------------------------------------------- calibration


@settings(max_examples=25, deadline=None)
@given(q=st.floats(1e-3, 1.0), steps=st.integers(1, 2000), target=st.floats(0.3, 10.0))
def test_calibration_never_overshoots_and_is_tight(q: float, steps: int, target: float) -> None:
    z = calibrate_noise_multiplier(q=q, steps=steps, target_epsilon=target, delta=DELTA)
    assert record_epsilon_for(q=q, z=z, steps=steps, delta=DELTA).epsilon <= target
    assert record_epsilon_for(q=q, z=0.99 * z, steps=steps, delta=DELTA).epsilon > target


def test_calibration_with_pld() -> None:
    z = calibrate_noise_multiplier(q=0.01, steps=300, target_epsilon=1.5, delta=DELTA,
                                   accountant="pld")
    eps = record_epsilon_for(q=0.01, z=z, steps=300, delta=DELTA, accountant="pld").epsilon
    assert eps <= 1.5
    assert record_epsilon_for(q=0.01, z=0.99 * z, steps=300, delta=DELTA,
                              accountant="pld").epsilon > 1.5
    assert z < calibrate_noise_multiplier(q=0.01, steps=300, target_epsilon=1.5, delta=DELTA)


# ----------------------------------------------------------------------------- budget guard


def schedule_strategy(max_size: int) -> Any:
    step = st.tuples(
        st.integers(0, 2),                    # device
        st.floats(0.002, 0.05),               # sigma (value units; z = 60 sigma)
        st.floats(0.0, 3.0),                  # |h| (fading)
        st.floats(0.0, 1.0),                  # trusted fraction
        st.integers(1, 4),                    # local steps (channel credit only if 1)
        st.booleans(),                        # secret sampling
    )
    return st.lists(step, min_size=1, max_size=max_size)


def run_guarded(accountant: str, targets: list[float], schedule: list[tuple]) -> RecordAccountant:
    acc = RecordAccountant(accountant, DELTA, z_resolution=1e-2 if accountant == "pld" else None)
    guard = BudgetGuard(acc, {i: t for i, t in enumerate(targets)})
    for r, (device, sigma, gain, trusted, steps, secret) in enumerate(schedule):
        kw: dict[str, Any] = dict(round=r, device=device, sigma=sigma, amplified=secret,
                                  steps=steps)
        e = channel(gain=gain, trusted_channel_noise=trusted, **kw) if steps == 1 \
            else event(**kw)
        if guard.allows(device, e):
            acc.add(e)
    for device, target in enumerate(targets):
        assert acc.epsilon(device).epsilon <= target
        assert guard.remaining(device) >= 0
    return acc


@pytest.mark.filterwarnings("ignore::testbed.core.privacy.analysis.rdp.OrderAtEdgeWarning")
@settings(max_examples=40, deadline=None)
@given(targets=st.lists(st.floats(0.05, 8.0), min_size=3, max_size=3),
       schedule=schedule_strategy(30))
def test_gated_record_events_never_exceed_the_target_rdp(targets: list[float],
                                                          schedule: list[tuple]) -> None:
    run_guarded("rdp", targets, schedule)


@pytest.mark.filterwarnings("ignore::testbed.core.privacy.analysis.rdp.OrderAtEdgeWarning")
@settings(max_examples=6, deadline=None)
@given(targets=st.lists(st.floats(0.05, 8.0), min_size=3, max_size=3),
       schedule=schedule_strategy(8))
# found by this test: a credit through a gain of 1e-174 made z ~ 1e170, and dp_accounting's
# Gaussian privacy loss overflowed (OverflowError) instead of giving an epsilon
@example(targets=[1.0, 1.0, 1.0], schedule=[
    (0, 0.03125, 0.0, 0.0, 1, False), (0, 0.03125, 0.0, 0.0, 1, False),
    (0, 0.03125, 1.6981383867030058e-174, 1.175494351e-38, 1, False)])
def test_gated_record_events_never_exceed_the_target_pld(targets: list[float],
                                                         schedule: list[tuple]) -> None:
    run_guarded("pld", targets, schedule)


# ----------------------------------------------------------------------------- channel credit


def test_more_credited_channel_noise_gives_smaller_epsilon() -> None:
    eps = [record_epsilon_for(q=0.01, z=channel(n0=n0).effective_noise_multiplier, steps=1,
                              delta=DELTA).epsilon for n0 in (0.0, 1e-5, 1e-4, 1e-3)]
    assert eps == sorted(eps, reverse=True) and len(set(eps)) == 4
    for accountant in ("rdp", "pld"):
        values = []
        for gain in (0.2, 1.0, 3.0):  # a stronger credited channel: less noise, more epsilon
            acc = RecordAccountant(accountant, DELTA)
            for r in range(5):
                acc.add(channel(round=r, gain=gain))
            values.append(acc.epsilon(0).epsilon)
            assert acc.epsilon(0).epsilon < acc.epsilon_without_channel(0).epsilon
        assert values == sorted(values) and len(set(values)) == 3


def test_trusted_zero_is_no_channel_and_unamplified_is_q_one() -> None:
    for accountant in ("rdp", "pld"):
        a, b, c = (RecordAccountant(accountant, DELTA) for _ in range(3))
        for r in range(4):
            a.add(channel(round=r, trusted_channel_noise=0.0))
            b.add(event(round=r))
            c.add(channel(round=r))
        assert a.epsilon(0).epsilon == b.epsilon(0).epsilon
        # the same steps, grouped (PLD: one self-composition instead of four compositions)
        assert c.epsilon_without_channel(0).epsilon == pytest.approx(b.epsilon(0).epsilon,
                                                                     rel=1e-8)
        d = RecordAccountant(accountant, DELTA)
        d.add(event(amplified=False, steps=3))
        assert d.epsilon(0).epsilon == record_epsilon_for(
            q=1.0, z=1.0, steps=3, delta=DELTA, accountant=accountant,
            z_resolution=d.state_dict()["z_resolution"]).epsilon
        assert d.epsilon(0).epsilon > record_epsilon_for(
            q=0.01, z=1.0, steps=3, delta=DELTA, accountant=accountant).epsilon


# ----------------------------------------------------------------------------- device level


def test_device_level_is_the_composed_gaussian_with_sensitivity_d_c_over_b() -> None:
    history = [event(round=r, dataset_size=2, sigma=0.1) for r in range(20)]  # z = 6
    eps = device_level_epsilon(history, DELTA)
    # independently: dp_accounting's PLD of 20 Gaussians with noise multiplier z / D = 3
    ref = PLDAccountant(value_discretization_interval=1e-4)
    for _ in range(20):
        ref.compose(dp_accounting.GaussianDpEvent(3.0))
    assert eps == pytest.approx(ref.get_epsilon(DELTA), rel=2e-3)
    assert device_level_epsilon([event(steps=20, dataset_size=2, sigma=0.1)],
                                DELTA) == pytest.approx(eps, rel=1e-12)
    acc = RecordAccountant("rdp", DELTA)
    for r in range(20):
        acc.add(channel(round=r))
    assert acc.device_epsilon(0) > 1e3 * acc.epsilon(0).epsilon  # D = 6000: enormous
    assert device_level_epsilon([], DELTA) == 0.0
    assert device_level_epsilon([event(sigma=0.0)], DELTA) == math.inf


def test_order_at_the_edge_of_the_grid_warns() -> None:
    with pytest.warns(OrderAtEdgeWarning, match="edge"):
        res = record_epsilon_for(q=1.0, z=2000.0, steps=1, delta=DELTA)
    assert res.order_at_edge and res.order == max(ORDERS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not record_epsilon_for(q=0.01, z=1.0, steps=100, delta=DELTA).order_at_edge


# ----------------------------------------------------------------------------- state


def test_state_dict_round_trip_and_refusals() -> None:
    acc = RecordAccountant("rdp", DELTA)
    for e in random_history(2, 15):
        acc.add(e)
    acc.add(channel(round=99, device=4))
    state = json.loads(json.dumps(acc.state_dict()))
    fresh = RecordAccountant("rdp", DELTA)
    fresh.load_state_dict(state)
    assert fresh.devices() == acc.devices() == (0, 4)
    for device in (0, 4):
        assert fresh.history(device) == acc.history(device)
        assert fresh.epsilon(device) == acc.epsilon(device)
    for other in (RecordAccountant("pld", DELTA), RecordAccountant("rdp", 1e-6),
                  RecordAccountant("rdp", DELTA, relation="replace-one"),
                  RecordAccountant("rdp", DELTA, z_resolution=1e-3)):
        with pytest.raises(ValueError, match="load_state_dict"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        fresh.load_state_dict({**state, "version": 2})
    bad = json.loads(json.dumps(state))
    bad["events"][0]["sampling_rate"] = 2.0
    with pytest.raises(ValueError, match="sampling_rate"):
        fresh.load_state_dict(bad)


def test_accountant_refuses_wrong_inputs() -> None:
    acc = RecordAccountant("rdp", DELTA)
    with pytest.raises(ValueError, match="relation"):
        acc.add(event(relation="replace-one"))
    with pytest.raises(TypeError, match="RecordEvent"):
        acc.add("event")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device"):
        acc.epsilon_if(1, event(device=0))
    with pytest.raises(ValueError, match="rdp_curve"):
        RecordAccountant("pld", DELTA).rdp_curve(0)
    for bad in (dict(accountant="moments"), dict(delta=0.0), dict(relation="swap"),
                dict(z_resolution=-1e-3)):
        with pytest.raises(ValueError):
            RecordAccountant(**bad)  # type: ignore[arg-type]
    assert acc.epsilon(9).epsilon == 0.0


@pytest.mark.parametrize("q", [1.0, 0.05])
def test_a_huge_noise_multiplier_is_accounted_as_the_largest_the_pld_engine_takes(
    q: float,
) -> None:
    """z beyond PLD_MAX_NOISE_MULTIPLIER (where dp_accounting overflows) is accounted as that
    z: a finite epsilon, no less than the one of the clamped z, and about 0."""
    from testbed.core.privacy.analysis.record_compose import PLD_MAX_NOISE_MULTIPLIER

    acc = RecordAccountant("pld", DELTA)
    # z = 60 sigma = 6e154: its square overflows a float
    huge = acc.epsilon_if(0, event(round=0, device=0, sigma=1e153, amplified=q < 1, steps=1))
    clamp = acc.epsilon_if(0, event(round=0, device=0, sigma=PLD_MAX_NOISE_MULTIPLIER / 60,
                                    amplified=q < 1, steps=1))
    assert math.isfinite(huge.epsilon) and huge.epsilon >= clamp.epsilon - 1e-12
    assert huge.epsilon < 1e-3
