"""Both accountings: closed forms, monotonicity, exact fading composition, shared contract."""

from __future__ import annotations

import dataclasses
import math

import mpmath
import pytest

from testbed.core.privacy import (
    EventError,
    PrivacyAccountant,
    UploadEvent,
    epsilon_for,
    gaussian_epsilon_closed_form,
    kappa,
    paper_coefficient,
    strict_coefficient,
)

D, L, Z, DELTA = 21840, 2184, 5.0, 1e-5
BASE = dict(sigma=0.5, alpha=2.0, h=0.8, n0=0.3, rounds=40, d=D, l=L, q=16, clip=Z, delta=DELTA)


def event(**kw: object) -> UploadEvent:
    fields = dict(round=0, device=0, mechanism="before", sigma=0.5, alpha=2.0, gain=0.8,
                  n0=0.3, trusted_channel_noise=1.0, d=D, l=L, q=16, clip=Z)
    fields.update(kw)
    return UploadEvent(**fields)  # type: ignore[arg-type]


def _mp_eps(c_total: float, delta: float) -> float:
    """Independent: golden-section search over log(a - 1) in 40-digit arithmetic."""
    mpmath.mp.dps = 40
    big_l = mpmath.log(1 / mpmath.mpf(delta))
    c = mpmath.mpf(c_total)
    f = lambda x: (1 + mpmath.exp(x)) * c + big_l / mpmath.exp(x)  # noqa: E731
    lo, hi = mpmath.mpf(-30), mpmath.mpf(30)
    ratio = (mpmath.sqrt(5) - 1) / 2
    for _ in range(300):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if f(a) < f(b):
            hi = b
        else:
            lo = a
    return float(f((lo + hi) / 2))


# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize("mode", ["paper", "strict"])
@pytest.mark.parametrize("rounds", [1, 7, 300])
def test_plain_gaussian_mechanism_matches_closed_form(mode: str, rounds: int) -> None:
    """No compression, no channel: Delta = 2Z, noise sigma: RDP a (2Z)^2/(2 sigma^2) per round."""
    sigma = 40.0
    res = epsilon_for(mode=mode, sigma=sigma, alpha=1.0, h=1.0, n0=0.0, rounds=rounds, d=D,
                      l=D, q=None, clip=Z, delta=DELTA)
    c = rounds * (2 * Z) ** 2 / (2 * sigma**2)
    closed, order = gaussian_epsilon_closed_form(coefficient=c, delta=DELTA)
    assert res.epsilon == pytest.approx(closed, rel=1e-10)
    assert res.epsilon == pytest.approx(_mp_eps(c, DELTA), rel=1e-10)
    assert res.order == pytest.approx(order, rel=1e-4)
    assert res.mode == mode and res.uploads == rounds


@pytest.mark.parametrize("mode", ["paper", "strict"])
def test_channel_only_is_the_same_gaussian_mechanism_in_both(mode: str) -> None:
    """sigma = 0, no compression: noise n0/(h alpha)^2 referred to g."""
    h, alpha, n0 = 0.7, 3.0, 0.02
    res = epsilon_for(mode=mode, sigma=0.0, alpha=alpha, h=h, n0=n0, rounds=10, d=D, l=D,
                      q=None, clip=Z, delta=DELTA)
    c = 10 * (2 * Z) ** 2 / (2 * n0 / (h * alpha) ** 2)
    assert res.epsilon == pytest.approx(gaussian_epsilon_closed_form(coefficient=c,
                                                                     delta=DELTA)[0], rel=1e-10)


def test_paper_theorem1_formula() -> None:
    ev = event()
    k = min(16 * (16 + math.sqrt(L)), L)
    expected = 2 * (0.8 * 2.0) ** 2 * (k / D) * Z**2 / ((0.8 * 2.0) ** 2 * 0.25 + 0.3)
    assert paper_coefficient(ev) == pytest.approx(expected, rel=1e-12)
    res = epsilon_for(mode="paper", **BASE)  # type: ignore[arg-type]
    assert res.epsilon == pytest.approx(_mp_eps(40 * expected, DELTA), rel=1e-10)


def test_paper_proposition1_formula() -> None:
    ev = event(mechanism="after")
    k = min(16 * (16 + math.sqrt(L)), L)
    expected = (2 * (0.8 * 2.0) ** 2 * (k / D) * Z**2 * (D / L + 1 / 16) ** 2
                / ((0.8 * 2.0) ** 2 * 0.25 + 0.3))
    assert paper_coefficient(ev) == pytest.approx(expected, rel=1e-12)
    assert paper_coefficient(ev) > paper_coefficient(event())


def test_strict_formulas() -> None:
    # before, no quantization: Delta_S = 2 Z sqrt(l/d), noise sigma^2 + n0 (l/d)^2/(h alpha)^2
    ev = event(q=None)
    var = 0.25 + 0.3 * (L / D) ** 2 / (0.8 * 2.0) ** 2
    assert strict_coefficient(ev) == pytest.approx(4 * Z**2 * (L / D) / (2 * var), rel=1e-12)
    # before, quantization: channel not credited
    assert strict_coefficient(event()) == pytest.approx(4 * Z**2 * (L / D) / (2 * 0.25))
    assert strict_coefficient(event(sigma=0.0)) == math.inf
    # after, quantization, norm in the clear: unbounded
    assert strict_coefficient(event(mechanism="after")) == math.inf
    # after, fixed scale: Delta = 2 B (1 + sqrt(l)/Q), the better of the two noises
    b = Z * math.sqrt(D / L)
    sens = 2 * b * (1 + math.sqrt(L) / 16)
    fixed = event(mechanism="after", quantizer_scale="fixed")
    best_var = max(0.25, 0.3 / (0.8 * 2.0) ** 2)
    assert strict_coefficient(fixed) == pytest.approx(sens**2 / (2 * best_var), rel=1e-12)
    # norm clipping: no sqrt(l/d) reduction
    assert strict_coefficient(event(clip_mode="norm")) == pytest.approx(4 * Z**2 / 0.5)


def test_no_mechanism_or_no_clipping_is_unbounded() -> None:
    for mode_fn in (paper_coefficient, strict_coefficient):
        assert mode_fn(event(mechanism="none")) == math.inf
        assert mode_fn(event(clip_mode="none")) == math.inf


def test_kappa_is_capped() -> None:
    assert kappa(d=100, l=40, q=None) == 40
    assert kappa(d=100, l=40, q=1000) == 40
    assert kappa(d=10000, l=1000, q=2) == pytest.approx(2 * (2 + math.sqrt(1000)))
    assert kappa(d=D, l=D, q=None) == D


# ---------------------------------------------------------------- monotonicity


def _eps(mode: str, **kw: object) -> float:
    args = dict(BASE)
    args.update(kw)
    return epsilon_for(mode=mode, **args).epsilon  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "q"), [("paper", 16), ("paper", None), ("strict", 16),
                                         ("strict", None)])
def test_monotone_in_sigma_and_rounds(mode: str, q: int | None) -> None:
    sig = [_eps(mode, q=q, sigma=s) for s in (0.1, 0.3, 1.0, 3.0)]
    assert all(a > b for a, b in zip(sig, sig[1:], strict=False))
    ks = [_eps(mode, q=q, rounds=k) for k in (1, 5, 50, 500)]
    assert all(a < b for a, b in zip(ks, ks[1:], strict=False))


@pytest.mark.parametrize(("mode", "q"), [("paper", 16), ("strict", None)])
def test_monotone_in_n0_trusted_and_gain(mode: str, q: int | None) -> None:
    """Wherever the channel is credited: more noise, more trust, less gain = smaller eps."""
    n0s = [_eps(mode, q=q, n0=n) for n in (0.01, 0.1, 1.0, 10.0)]
    assert all(a > b for a, b in zip(n0s, n0s[1:], strict=False))
    trust = [_eps(mode, q=q, trusted=t) for t in (0.0, 0.5, 1.0)]
    assert all(a > b for a, b in zip(trust, trust[1:], strict=False))
    gains = [_eps(mode, q=q, h=h) for h in (0.1, 0.5, 1.0, 2.0)]
    assert all(a < b for a, b in zip(gains, gains[1:], strict=False))


def test_strict_does_not_credit_channel_through_quantization() -> None:
    assert _eps("strict", n0=0.01) == _eps("strict", n0=100.0)


def test_paper_monotone_in_kappa() -> None:
    ks = [_eps("paper", q=q) for q in (1, 2, 8, 32)]  # kappa = Q (Q + sqrt(l)) grows with Q
    assert all(a < b for a, b in zip(ks, ks[1:], strict=False))
    ls = [_eps("paper", q=None, l=l) for l in (100, 1000, D)]  # kappa = l
    assert all(a < b for a, b in zip(ls, ls[1:], strict=False))


# ---------------------------------------------------------------- fading composition


@pytest.mark.parametrize("mode", ["paper", "strict"])
def test_varying_gain_composes_as_the_sum_of_per_round_rdp(mode: str) -> None:
    gains = [0.1, 1.7, 0.9, 2.4, 0.05, 1.0]
    acc = PrivacyAccountant(mode=mode, delta=DELTA)
    coefficient = paper_coefficient if mode == "paper" else strict_coefficient
    per_round = []
    for r, g in enumerate(gains):
        ev = event(round=r, gain=g, q=None)
        per_round.append(coefficient(ev))
        acc.add(ev)
    res = acc.epsilon(0)
    assert res.rdp_coefficient == pytest.approx(math.fsum(per_round), rel=1e-14)
    assert res.epsilon == pytest.approx(_mp_eps(math.fsum(per_round), DELTA), rel=1e-10)
    # not the same as K times the mean gain's RDP (fading accounted exactly)
    mean_gain = sum(gains) / len(gains)
    assert res.rdp_coefficient != pytest.approx(len(gains) * coefficient(event(gain=mean_gain,
                                                                               q=None)))


# ---------------------------------------------------------------- shared contract


@pytest.fixture(params=["paper", "strict"])
def accountant(request: pytest.FixtureRequest) -> PrivacyAccountant:
    return PrivacyAccountant(mode=request.param, delta=DELTA)


def test_contract_empty_device_has_zero_epsilon(accountant: PrivacyAccountant) -> None:
    res = accountant.epsilon(3)
    assert res.epsilon == 0.0 and res.uploads == 0 and res.mode == accountant.mode


def test_contract_epsilon_if_equals_epsilon_after_add(accountant: PrivacyAccountant) -> None:
    for r in range(5):
        ev = event(round=r, gain=0.3 + 0.4 * r, q=None, sigma=1.0 + r)
        before = accountant.epsilon(0)
        what_if = accountant.epsilon_if(0, ev)
        assert accountant.epsilon(0) == before  # what-if leaves the state alone
        accountant.add(ev)
        assert accountant.epsilon(0) == what_if  # bit for bit
        assert what_if.epsilon >= before.epsilon


def test_contract_devices_are_independent(accountant: PrivacyAccountant) -> None:
    accountant.add(event(device=1, q=None))
    accountant.add(event(device=1, round=1, q=None))
    accountant.add(event(device=2, q=None))
    assert accountant.devices() == (1, 2)
    assert accountant.epsilon(1).uploads == 2 and accountant.epsilon(2).uploads == 1
    assert accountant.epsilon(1).epsilon > accountant.epsilon(2).epsilon
    history = accountant.history(1)
    assert isinstance(history, tuple) and len(history) == 2


def test_contract_state_round_trip_and_refusals(accountant: PrivacyAccountant) -> None:
    for r in range(3):
        accountant.add(event(round=r, device=r % 2, gain=0.5 + r, q=None))
    state = accountant.state_dict()
    fresh = PrivacyAccountant(mode=accountant.mode, delta=DELTA)
    fresh.load_state_dict(state)
    for dev in (0, 1):
        assert fresh.epsilon(dev) == accountant.epsilon(dev)
    other = "strict" if accountant.mode == "paper" else "paper"
    with pytest.raises(ValueError, match="mode"):
        PrivacyAccountant(mode=other, delta=DELTA).load_state_dict(state)
    with pytest.raises(ValueError, match="delta"):
        PrivacyAccountant(mode=accountant.mode, delta=1e-6).load_state_dict(state)


def test_contract_epsilon_if_checks_the_device(accountant: PrivacyAccountant) -> None:
    with pytest.raises(ValueError, match="device"):
        accountant.epsilon_if(1, event(device=0))


# ---------------------------------------------------------------- validation


def test_event_validation_names_the_field() -> None:
    with pytest.raises(EventError, match="trusted_channel_noise"):
        event(trusted_channel_noise=1.5)
    with pytest.raises(EventError, match="l=30000"):
        event(l=30000)
    with pytest.raises(EventError, match="mechanism"):
        event(mechanism="during")
    with pytest.raises(EventError, match="n0"):
        event(n0=-1.0)
    with pytest.raises(EventError, match="q="):
        event(q=0)


def test_event_json_round_trip_and_meaning_tag() -> None:
    ev = event(q=None, quantizer_scale="fixed")
    assert UploadEvent.from_json(ev.to_json()) == ev
    data = ev.to_dict()
    with pytest.raises(EventError, match="type"):
        UploadEvent.from_dict({**data, "type": "upload/v0"})
    with pytest.raises(EventError, match="unknown"):
        UploadEvent.from_dict({**data, "snr": 3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.sigma = 2.0  # type: ignore[misc]


def test_epsilon_for_validation() -> None:
    with pytest.raises(ValueError, match="mode"):
        epsilon_for(**{**BASE, "mode": "loose"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="noise_position"):
        epsilon_for(mode="paper", noise_position="middle", **BASE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rounds"):
        epsilon_for(mode="paper", **{**BASE, "rounds": -1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delta"):
        epsilon_for(mode="paper", **{**BASE, "delta": 0.0})  # type: ignore[arg-type]
    assert epsilon_for(mode="strict", **{**BASE, "rounds": 0}).epsilon == 0.0  # type: ignore[arg-type]
