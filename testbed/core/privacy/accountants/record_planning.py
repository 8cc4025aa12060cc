"""Record-level epsilons of a fixed number of identical releases, and the noise that meets
a target epsilon: Poisson-subsampled Gaussian steps (:func:`record_epsilon_for`,
:func:`calibrate_noise_multiplier`) and full-batch Laplace releases
(:func:`laplace_epsilon_for`, :func:`calibrate_laplace_noise_multiplier`), with the same
engines as :class:`~testbed.core.privacy.accountants.record_accountant.RecordAccountant`, so a plan
meets the budget the run enforces."""

from __future__ import annotations

import math

from testbed.core.privacy.analysis.record_epsilon import (
    DEFAULT_PLD_DISCRETIZATION,
    RecordEpsilon,
    check_delta,
    epsilon_result,
    make_engine,
)
from testbed.core.privacy.record_events import RELATIONS

_LAPLACE_CALIBRATION_ROUNDS = 20


def record_epsilon_for(*, q: float, z: float, steps: int, delta: float,
                       accountant: str = "rdp", relation: str = "add-remove",
                       z_resolution: float = 0.0,
                       pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> RecordEpsilon:
    """Record-level epsilon of ``steps`` identical Poisson-subsampled Gaussian steps.

    Parameters
    ----------
    q
        Sampling probability in ``(0, 1]`` (1: no amplification).
    z
        Noise multiplier ``std / (C / B)`` (``>= 0``; ``0`` gives ``inf``).
    steps
        Number of steps ``K >= 1``.
    delta
        Target delta in ``(0, 1)``.
    accountant, relation, z_resolution, pld_discretization
        As for :class:`RecordAccountant` (``z_resolution`` defaults to exact here).
    """
    check_delta("record_epsilon_for", delta)
    if isinstance(q, bool) or not (isinstance(q, int | float) and 0 < q <= 1):
        raise ValueError(f"record_epsilon_for: q={q!r} must lie in (0, 1]")
    if isinstance(z, bool) or not (isinstance(z, int | float) and z >= 0):
        raise ValueError(f"record_epsilon_for: z={z!r} must be >= 0")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"record_epsilon_for: steps={steps!r} must be an integer >= 1")
    engine = make_engine(accountant, relation, z_resolution, pld_discretization)
    state = engine.compose(engine.identity(), engine.contribution(q, z, steps))
    return epsilon_result(engine, state, float(delta), 1, steps)


def calibrate_noise_multiplier(*, q: float, steps: int, target_epsilon: float, delta: float,
                               accountant: str = "rdp", relation: str = "add-remove",
                               z_resolution: float = 0.0,
                               pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
                               ) -> float:
    """Smallest noise multiplier ``z`` whose epsilon after ``steps`` steps meets the target.

    Uses ``dp_accounting.calibrate_dp_mechanism`` (Brent's method, then a check that the
    returned point does not exceed the target) on an adapter around the same engine as
    :func:`record_epsilon_for`, so ``record_epsilon_for(..., z=result)`` never exceeds
    ``target_epsilon``. Tolerance ``1e-6`` relative to the bracket.
    """
    from testbed.core.privacy.analysis.record_calibration import calibrate

    check_delta("calibrate_noise_multiplier", delta)
    if isinstance(target_epsilon, bool) or not (
        isinstance(target_epsilon, int | float) and 0 < target_epsilon < math.inf
    ):
        raise ValueError(f"calibrate_noise_multiplier: target_epsilon={target_epsilon!r} "
                         "must be finite and > 0")
    record_epsilon_for(q=q, z=1.0, steps=steps, delta=delta, accountant=accountant,
                       relation=relation)  # validates q, steps and names
    engine = make_engine(accountant, relation, z_resolution, pld_discretization)
    return calibrate(engine, q=float(q), steps=steps, target_epsilon=float(target_epsilon),
                     delta=float(delta))


def laplace_epsilon_for(*, b: float, count: int, delta: float, accountant: str = "pld",
                        relation: str = "add-remove",
                        pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> RecordEpsilon:
    """Record-level epsilon of ``count`` full-batch Laplace releases of parameter ``b``.

    Parameters
    ----------
    b
        ``scale / (xi_1 / D)`` (``>= 0``; ``0`` gives ``inf``): each release is ``(1 / b)``-DP
        under add/remove.
    count
        Releases (``>= 1``).
    delta, accountant, relation, pld_discretization
        As for :class:`RecordAccountant` (the same engines, so the enforced accountant of a
        run with these events reports exactly this).
    """
    check_delta("laplace_epsilon_for", delta)
    if isinstance(b, bool) or not (isinstance(b, int | float) and b >= 0):
        raise ValueError(f"laplace_epsilon_for: b={b!r} must be >= 0")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"laplace_epsilon_for: count={count!r} must be an integer >= 1")
    engine = make_engine(accountant, relation, None, pld_discretization)
    state = engine.compose(engine.identity(), engine.laplace_contribution(float(b), count))
    return epsilon_result(engine, state, float(delta), count, count)


def calibrate_laplace_noise_multiplier(*, count: int, target_epsilon: float, delta: float,
                                       accountant: str = "pld", relation: str = "add-remove",
                                       pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
                                       ) -> float:
    """``b`` whose ``count`` Laplace releases are ``target_epsilon``-DP by basic composition.

    Pure DP composes linearly and that is tight for the Laplace mechanism (the privacy loss
    reaches ``count / b`` with positive probability): ``b = count / target`` under
    add/remove, ``2 count / target`` under replace-one (sensitivity ``2 xi_1 / D``). That
    ``b`` is then checked with the engine that will enforce the budget
    (:func:`laplace_epsilon_for`, i.e. ``dp_accounting``'s PLD or RDP of
    ``LaplaceDpEvent(b)``) and enlarged by the ratio it reports until it reports at most the
    target: the PLD's pessimistic discretization may add up to ``count`` x the interval.
    """
    check_delta("calibrate_laplace_noise_multiplier", delta)
    if isinstance(target_epsilon, bool) or not (
        isinstance(target_epsilon, int | float) and 0 < target_epsilon < math.inf
    ):
        raise ValueError(f"calibrate_laplace_noise_multiplier: target_epsilon="
                         f"{target_epsilon!r} must be finite and > 0")
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r} not in {RELATIONS}")
    factor = 2.0 if relation == "replace-one" else 1.0
    b = factor * count / float(target_epsilon)
    for _ in range(_LAPLACE_CALIBRATION_ROUNDS):
        eps = laplace_epsilon_for(b=b, count=count, delta=delta, accountant=accountant,
                                  relation=relation,
                                  pld_discretization=pld_discretization).epsilon
        if eps <= target_epsilon:
            return b
        b *= (eps / target_epsilon) * (1.0 + 1e-9)
    raise ValueError(
        f"calibrate_laplace_noise_multiplier: {accountant} keeps b={b:.6g} above the target "
        f"{target_epsilon:.6g} after {_LAPLACE_CALIBRATION_ROUNDS} enlargements"
    )
