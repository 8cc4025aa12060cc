"""Composition engines of the record accountant: RDP curves and privacy loss distributions.

Both engines have one call shape: ``identity()`` (nothing released), ``contribution(q, z,
steps)`` (``steps`` Poisson-subsampled Gaussian steps of sampling probability ``q`` and noise
multiplier ``z``), ``laplace_contribution(b, count)`` (``count`` Laplace mechanisms of
parameter ``b = scale / l1 sensitivity``, add/remove, no sampling),
``compose(state, contribution)`` and ``epsilon(state, delta)``. They are
deterministic: the same calls give bit-identical states and epsilons, which is what lets the
accountant's ``epsilon_if`` equal its ``epsilon`` after ``add``.

A contribution is a pure function of its *key*: ``key(q, z, steps)`` is ``("sgm", q,
round_down(z), steps)`` and ``laplace_key(b, count)`` is ``("laplace", b, count)``, exactly
the arguments the computation uses (``contribution(q, z, steps)`` is
``contribution_of(key(q, z, steps))``). Two events whose keys are equal (``==`` on the
floats) therefore contribute bit-identical curves or distributions, and a composed state is
a pure function of the sequence of keys composed: the accountant shares one state between
devices whose sequences are equal (:mod:`testbed.core.privacy.accountants.state_trie`).

* :class:`RdpEngine`: the state is the RDP curve on a fixed order grid (add/remove, both
  directions) plus, as its last entry, the order-infinity value (pure-DP epsilon: finite
  only while every part is pure, i.e. Laplace), composed by addition; per-``(q, z)`` curves
  are cached. The reported epsilon is the smaller of the converted curve and that pure
  epsilon (doubled for replace-one by group privacy).
* :class:`PldEngine`: the state is a ``dp_accounting`` privacy loss distribution (connect-
  the-dots, pessimistic discretization: an upper bound), composed incrementally; per-``(q, z,
  steps)`` distributions are cached. Memory is bounded whatever the number of steps or the
  noise (:mod:`testbed.core.privacy.analysis.pld_bounded`): a PLD that would exceed
  ``MAX_PLD_POINTS`` grid points is built or composed on a grid ``2^j`` times coarser,
  losses rounded up, so epsilon stays an upper bound (a little looser there).

``z`` is rounded *down* to a log grid of relative step ``z_resolution`` before anything is
computed (``0``: exact), so that nearby noise levels share a cache entry; rounding down can
only overstate epsilon. Laplace parameters are not rounded (one exact value per device and
run, so the cache is hit anyway). Replace-one: RDP by the weak triangle inequality
(:func:`~testbed.core.privacy.analysis.record_rdp.replace_one_rdp`); PLD by group privacy of the
add/ remove guarantee, ``(eps, d)`` for add/remove gives ``(2 eps, (1 + e^eps) d)`` for
replace-one (see docs/privacy.md, "Record-level privacy").
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from testbed.core.privacy.analysis import pld_bounded
from testbed.core.privacy.analysis.record_rdp import (
    ORDERS,
    extended_orders,
    rdp_to_epsilon,
    replace_one_rdp,
    restrict,
    round_down,
    sgm_rdp,
)

#: A state that released something with no noise at all: epsilon is infinite.
NON_PRIVATE = "non-private"
#: What a contribution is computed from: ``("sgm", q, z rounded, steps)`` or
#: ``("laplace", b, count)``.
ContributionKey = tuple[str, float, float, int] | tuple[str, float, int]
_CACHE_SIZE = 2048
_GROUP_BISECTIONS = 40
_MAX_GROUP_EPSILON = 700.0  # exp() overflows beyond; report inf


def _sgm_key(q: float, z: float, steps: int, resolution: float) -> ContributionKey:
    return ("sgm", float(q), round_down(float(z), resolution), int(steps))


def _laplace_key(b: float, count: int) -> ContributionKey:
    return ("laplace", float(b), int(count))


#: Noise multipliers above this are accounted as this one in the PLD engine: dp_accounting's
#: Gaussian privacy loss divides by the squared standard deviation, which overflows a float
#: near 1.3e154 (a channel credit through a gain of 1e-174 gives such a z). Accounting for
#: less noise than there is can only raise epsilon; at z = 1e100 the privacy loss of a step
#: is about 1e-200 nats, far below the PLD grid.
PLD_MAX_NOISE_MULTIPLIER = 1e100


class RdpEngine:
    """RDP curves over :data:`~testbed.core.privacy.analysis.record_rdp.ORDERS`.

    Parameters
    ----------
    relation
        ``"add-remove"`` or ``"replace-one"`` (the latter keeps the curve on the extended
        grid ``a, 2a, 2a - 1``).
    z_resolution
        Relative step of the log grid ``z`` is rounded down to (``0``: exact).
    """

    name = "rdp"

    def __init__(self, relation: str, z_resolution: float) -> None:
        self.relation = relation
        self.z_resolution = z_resolution
        self.orders = ORDERS
        self.grid = extended_orders(ORDERS) if relation == "replace-one" else ORDERS
        self._curve = functools.lru_cache(maxsize=_CACHE_SIZE)(self._compute_curve)
        self._laplace_curve = functools.lru_cache(maxsize=_CACHE_SIZE)(
            self._compute_laplace_curve
        )

    def _compute_curve(self, q: float, z: float) -> np.ndarray:
        curve = sgm_rdp(q=q, noise_multiplier=z, orders=self.grid)
        curve.setflags(write=False)
        return curve

    def identity(self) -> np.ndarray:
        """The curve of nothing released (zeros; last entry: order infinity)."""
        return np.zeros(len(self.grid) + 1)

    def key(self, q: float, z: float, steps: int) -> ContributionKey:
        """The key of :meth:`contribution` ``(q, z, steps)`` (``z`` rounded down)."""
        return _sgm_key(q, z, steps, self.z_resolution)

    def laplace_key(self, b: float, count: int) -> ContributionKey:
        """The key of :meth:`laplace_contribution` ``(b, count)``."""
        return _laplace_key(b, count)

    def contribution_of(self, key: ContributionKey) -> np.ndarray:
        """The contribution a key stands for (module docstring)."""
        if key[0] == "laplace":
            return self._laplace_of(float(key[1]), int(key[2]))
        return self._sgm_of(float(key[1]), float(key[2]), int(key[3]))  # type: ignore[misc]

    def contribution(self, q: float, z: float, steps: int) -> np.ndarray:
        """``steps`` times the one-step curve at ``(q, round_down(z))``; a Gaussian is not
        pure DP, so its order-infinity entry is ``inf`` (``0`` for ``z = inf``)."""
        return self.contribution_of(self.key(q, z, steps))

    def _sgm_of(self, q: float, z: float, steps: int) -> np.ndarray:
        curve = steps * self._curve(q, z)
        return np.append(curve, 0.0 if math.isinf(z) else math.inf)

    def _compute_laplace_curve(self, b: float) -> np.ndarray:
        from dp_accounting.rdp.rdp_privacy_accountant import _laplace_rdp

        # Mironov (2017) Prop. 6, exact; symmetric, so both add/remove directions agree
        curve = np.array([_laplace_rdp(1.0 / b, a) for a in self.grid])
        curve.setflags(write=False)
        return curve

    def laplace_contribution(self, b: float, count: int) -> np.ndarray:
        """``count`` times the RDP curve of the Laplace mechanism with parameter ``b``
        (``(1 / b)``-DP; ``b = 0``: every order infinite)."""
        return self.contribution_of(self.laplace_key(b, count))

    def _laplace_of(self, b: float, count: int) -> np.ndarray:
        if b == 0:
            return np.full(len(self.grid) + 1, math.inf)
        if math.isinf(b):
            return self.identity()
        return np.append(count * self._laplace_curve(b), count / b)

    def compose(self, state: Any, contribution: Any) -> np.ndarray:
        """Sequential composition: curves add order by order."""
        out: np.ndarray = state + contribution
        return out

    def curve(self, state: Any) -> np.ndarray:
        """The RDP curve at :attr:`orders` that is converted (replace-one bound if so)."""
        rdp = state[:-1]
        if self.relation == "replace-one":
            return replace_one_rdp(orders=self.orders, extended=self.grid, rdp=rdp)
        return restrict(orders=self.orders, extended=self.grid, rdp=rdp)

    def pure_epsilon(self, state: Any) -> float:
        """Pure-DP epsilon of the state (order infinity; ``inf`` once a Gaussian is in)."""
        factor = 2.0 if self.relation == "replace-one" else 1.0
        return factor * float(state[-1])

    def epsilon(self, state: Any, delta: float) -> tuple[float, float, bool]:
        """``(epsilon, order, at_edge)`` of the composed curve, or ``(pure, inf, False)``
        when the pure-DP epsilon is no larger."""
        eps, order, edge = rdp_to_epsilon(orders=self.orders, rdp=self.curve(state),
                                          delta=delta)
        pure = self.pure_epsilon(state)
        if pure <= eps:
            return pure, math.inf, False
        return eps, order, edge


class PldEngine:
    """Privacy loss distributions from ``dp_accounting.pld``.

    Parameters
    ----------
    relation
        ``"add-remove"`` or ``"replace-one"`` (group privacy over add/remove, see module).
    z_resolution
        Relative step of the log grid ``z`` is rounded down to (``0``: exact).
    discretization
        ``value_discretization_interval`` of the PLDs (nats of privacy loss).
    """

    name = "pld"

    def __init__(self, relation: str, z_resolution: float, discretization: float) -> None:
        from dp_accounting.pld import privacy_loss_distribution

        self._pld = privacy_loss_distribution
        self.relation = relation
        self.z_resolution = z_resolution
        self.discretization = discretization
        self._make = functools.lru_cache(maxsize=_CACHE_SIZE)(self._compute_pld)
        self._make_laplace = functools.lru_cache(maxsize=_CACHE_SIZE)(self._compute_laplace)

    def _interval(self, width: float) -> float | None:
        """The grid for a PLD of support ``width`` nats: the engine's, or ``x 2^j`` coarser
        so that it fits in :data:`~testbed.core.privacy.analysis.pld_bounded.MAX_PLD_POINTS`
        (``None``: no grid fits; epsilon is reported inf)."""
        j = pld_bounded.grid_exponent(width, self.discretization)
        return None if j is None else self.discretization * 2.0**j

    def _compute_pld(self, q: float, z: float, steps: int) -> Any:
        if z == 0:
            return NON_PRIVATE
        if math.isinf(z):
            return self.identity()
        z = min(z, PLD_MAX_NOISE_MULTIPLIER)  # less noise than there is: never less epsilon
        if q == 1:
            # as dp_accounting's PLDAccountant for a GaussianDpEvent composed `steps` times
            sd = z / math.sqrt(steps)
            interval = self._interval(pld_bounded.gaussian_width(sd))
            if interval is None:
                return NON_PRIVATE
            return self._pld.from_gaussian_mechanism(
                standard_deviation=sd, value_discretization_interval=interval,
            )
        # as PLDAccountant for SelfComposedDpEvent(PoissonSampledDpEvent(q, Gaussian(z)))
        interval = self._interval(pld_bounded.gaussian_width(z))
        if interval is None:
            return NON_PRIVATE
        one = self._pld.from_gaussian_mechanism(
            standard_deviation=z, value_discretization_interval=interval, sampling_prob=q,
        )
        return pld_bounded.self_compose(one, steps)

    def _compute_laplace(self, b: float, count: int) -> Any:
        if b == 0:
            return NON_PRIVATE
        if math.isinf(b):
            return self.identity()
        # as dp_accounting's PLDAccountant for a LaplaceDpEvent(b) composed `count` times
        interval = self._interval(2.0 / b)
        if interval is None:
            return NON_PRIVATE
        pld = self._pld.from_laplace_mechanism(
            parameter=b, value_discretization_interval=interval
        )
        return pld_bounded.self_compose(pld, count)

    def laplace_contribution(self, b: float, count: int) -> Any:
        """PLD of ``count`` Laplace mechanisms of parameter ``b`` (cached, not rounded)."""
        return self.contribution_of(self.laplace_key(b, count))

    def identity(self) -> Any:
        """The PLD of nothing released."""
        return self._pld.identity(value_discretization_interval=self.discretization)

    def key(self, q: float, z: float, steps: int) -> ContributionKey:
        """The key of :meth:`contribution` ``(q, z, steps)`` (``z`` rounded down)."""
        return _sgm_key(q, z, steps, self.z_resolution)

    def laplace_key(self, b: float, count: int) -> ContributionKey:
        """The key of :meth:`laplace_contribution` ``(b, count)``."""
        return _laplace_key(b, count)

    def contribution_of(self, key: ContributionKey) -> Any:
        """The (cached) PLD a key stands for (module docstring)."""
        if key[0] == "laplace":
            return self._make_laplace(float(key[1]), int(key[2]))
        return self._make(float(key[1]), float(key[2]), int(key[3]))  # type: ignore[misc]

    def contribution(self, q: float, z: float, steps: int) -> Any:
        """PLD of ``steps`` steps at ``(q, round_down(z))`` (cached)."""
        return self.contribution_of(self.key(q, z, steps))

    def compose(self, state: Any, contribution: Any) -> Any:
        """Composition of two PLDs (``NON_PRIVATE`` absorbs)."""
        if isinstance(state, str) or isinstance(contribution, str):
            return NON_PRIVATE
        return pld_bounded.compose(state, contribution)

    def epsilon(self, state: Any, delta: float) -> tuple[float, float, bool]:
        """``(epsilon, nan, False)`` of the composed PLD (no Renyi order here)."""
        if isinstance(state, str):
            return math.inf, math.nan, False
        if self.relation == "replace-one":
            return _group_of_two(state, delta), math.nan, False
        return max(float(state.get_epsilon_for_delta(delta)), 0.0), math.nan, False


def _group_of_two(pld: Any, delta: float) -> float:
    """``2 e`` for the smallest found ``e`` with ``(1 + exp(e)) delta_pld(e) <= delta``.

    Group privacy: ``D -> R -> D'`` through the add/remove neighbour ``R`` gives
    ``P[M(D) in S] <= e^(2e) P[M(D') in S] + (1 + e^e) delta_pld(e)``. Bisection keeps a
    feasible upper end, so the result is valid even where the constraint is not monotone.
    """

    def feasible(e: float) -> bool:
        return (1.0 + math.exp(e)) * float(pld.get_delta_for_epsilon(e)) <= delta

    if feasible(0.0):
        return 0.0
    hi = max(float(pld.get_epsilon_for_delta(delta)), 1e-3)
    while not feasible(hi):
        hi *= 2.0
        if hi > _MAX_GROUP_EPSILON:
            return math.inf
    lo = 0.0
    for _ in range(_GROUP_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return 2.0 * hi
