"""Noise calibration for the record unit with ``dp_accounting.calibrate_dp_mechanism``.

The library searches a parameter with Brent's method on fresh ``dp_accounting``
accountants and makes sure the point it returns does not exceed the target epsilon. To
calibrate against *our* numbers (the same order grid, conversion, replace-one treatment and
``z`` rounding as :func:`~testbed.core.privacy.accountants.record_planning.record_epsilon_for`),
the fresh accountant is a thin adapter around our composition engine.
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
from dp_accounting import dp_event

from testbed.core.privacy.analysis.record_compose import PldEngine, RdpEngine

_MAX_DOUBLINGS = 60
_RELATIVE_TOL = 1e-6


# dp_accounting ships no type information (no py.typed), so its base class is Any to mypy.
class _EngineAccountant(dp_accounting.PrivacyAccountant):  # type: ignore[misc]
    """A ``dp_accounting`` accountant that composes Poisson-sampled Gaussians with our engine."""

    def __init__(self, engine: RdpEngine | PldEngine) -> None:
        relation = (dp_accounting.NeighboringRelation.REPLACE_ONE
                    if engine.relation == "replace-one"
                    else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        super().__init__(relation)
        self._engine = engine
        self._state: Any = engine.identity()
        self._composed = False

    def _maybe_compose(self, event: dp_event.DpEvent, count: int,
                       do_compose: bool) -> Any:
        if isinstance(event, dp_event.SelfComposedDpEvent):
            return self._maybe_compose(event.event, event.count * count, do_compose)
        if isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(
            event.event, dp_event.GaussianDpEvent
        ):
            if do_compose and count > 0:
                part = self._engine.contribution(
                    event.sampling_probability, event.event.noise_multiplier, count)
                self._state = self._engine.compose(self._state, part)
                self._composed = True
            return None
        return self.CompositionErrorDetails(
            invalid_event=event,
            error_message="only Poisson-sampled Gaussian events are supported",
        )

    def get_epsilon(self, target_delta: float) -> float:
        if not self._composed:
            return 0.0
        return self._engine.epsilon(self._state, target_delta)[0]


def calibrate(engine: RdpEngine | PldEngine, *, q: float, steps: int,
              target_epsilon: float, delta: float) -> float:
    """Smallest ``z`` (within ``1e-6`` relative) with epsilon ``<= target_epsilon``.

    Inputs are validated by the caller. Raises ``ValueError`` when no noise multiplier up
    to ``2**60`` meets the target.
    """

    def event(z: float) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)

    def epsilon(z: float) -> float:
        accountant = _EngineAccountant(engine)
        accountant.compose(event(z))
        return accountant.get_epsilon(delta)

    hi = 1.0
    for _ in range(_MAX_DOUBLINGS):
        if epsilon(hi) <= target_epsilon:
            break
        hi *= 2.0
    else:
        raise ValueError(f"calibrate: no noise multiplier up to {hi:g} reaches epsilon "
                         f"{target_epsilon} (q={q}, steps={steps}, delta={delta})")
    lo = hi / 2.0
    while epsilon(lo) <= target_epsilon:  # z -> 0 gives inf, so this ends
        hi, lo = lo, lo / 2.0
    z = float(dp_accounting.calibrate_dp_mechanism(
        lambda: _EngineAccountant(engine), event, target_epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi),
        tol=_RELATIVE_TOL * hi,
    ))
    # calibrate_dp_mechanism promises a non-positive gap; keep that promise explicit
    if not epsilon(z) <= target_epsilon:
        z = hi
    if not math.isfinite(z) or z <= 0:
        raise ValueError(f"calibrate: no valid noise multiplier found (got {z})")
    return z
