"""zCDP accounting and planner of peer scheme 002 (Hu, Guo, Gong, IEEE OJ-CS 2021).

Symbols, as printed (002 Sections III-V), with units:

* ``n`` devices, ``r`` of them selected uniformly per round (``Omega_t``), ``T`` rounds;
* ``tau`` local noisy SGD steps per round;
* ``m`` records per device (local data set size);
* ``gamma`` the mini-batch **size** in records (not a fraction: the sampling fraction is
  ``gamma / m``); the batch-average gradient is ``g = (1/gamma) sum grad l``;
* ``G`` the l2 bound of a per-record gradient (Assumption 1, enforced by clipping);
* ``sigma`` the std of the Gaussian noise added per coordinate to ``g`` at every step (eq. 6),
  in gradient units;
* ``C_i`` the rounds device ``i`` takes part in (Theorem 1), ``T r / n`` in expectation.

Neighbouring data sets replace one record (Definition 1), so one step's sensitivity is
``2 G / gamma`` (Corollary 1) and one step is ``2 G^2 / (gamma^2 sigma^2)``-zCDP. The local
data are reshuffled into ``m / gamma`` disjoint batches every ``m / gamma`` steps, so a record
is used ``tau gamma / m`` times per round (parallel composition within an epoch, Lemma 3):
``2 tau G^2 / (m gamma sigma^2)`` per round for what a device's own update reveals. With
secure aggregation the paper credits the other ``r - 1`` devices' noise and divides by ``r``:
``2 tau G^2 / (r m gamma sigma^2)`` per round (:func:`paper_round_rho`), then composes over
``C_i`` rounds and converts with ``eps = rho + 2 sqrt(rho log(1/delta))`` (eq. 10).

Beside the paper's figures, the testbed's own (:func:`testbed_epsilon`) composes the same
per-step Gaussian mechanisms with Google's ``dp-accounting``, without the ``1/r`` credit, and
(:func:`secagg_sum_epsilon`) the same with the noise of the *sum* (std ``sqrt(h) sigma`` for
``h`` honest summands) to check the credit independently. The derivation, its trust
assumption and where the paper's argument is only heuristic are in
``docs/peers/zcdp-secagg.md``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.stats import binom

#: What the ``1/r`` secure-aggregation credit assumes; reported in every plan.
TRUST_ASSUMPTION = (
    "The 1/r credit holds only against an adversary that sees the aggregate alone: an "
    "honest-but-curious server (and outside eavesdroppers) that runs the secure-aggregation "
    "protocol as specified, with no participating device colluding with it, so every other "
    "participant's Gaussian noise stays secret. A curious participant knows its own update and "
    "noise and can subtract them from the aggregate (credit 1/(r-1)); c colluding participants "
    "leave 1/(r-c); dropouts leave only the |U3| >= t updates that reach the sum. For tau > 1 "
    "local steps the credit is the paper's heuristic (the aggregate is not a Gaussian mechanism "
    "of the data); for tau = 1 it is a theorem. Without the credit (colluding peers) a device's "
    "guarantee is the testbed figure, r times the zCDP."
)

SAMPLINGS = ("shuffle", "poisson")
ACCOUNTANTS = ("rdp", "pld")
PARTICIPATION_MODES = ("expected", "given", "bound")
#: Renyi orders for dp-accounting's RDP accountant: its default grid widened at both ends.
_ORDERS = tuple(
    [1.0 + x / 100.0 for x in range(1, 100)]
    + [2.0 + x / 10.0 for x in range(0, 90)]
    + [float(a) for a in range(11, 64)]
    + [float(2**k) for k in range(6, 17)]
)
_MAX_GRID = 10_000_000


# ---------------------------------------------------------------------------- validation


def _real(where: str, name: str, value: Any, lo: float, hi: float, *,
          lo_open: bool = True, hi_open: bool = True) -> float:
    ok = isinstance(value, int | float | np.floating | np.integer) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (
            v < hi if hi_open else v <= hi)
    if not ok:
        lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ValueError(f"{where}: {name}={value!r} must be a finite number in {lb}{lo:g}, "
                         f"{hi:g}{rb}")
    return float(value)


def _int(where: str, name: str, value: Any, lo: int, hi: float = math.inf) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not (
            lo <= int(value) <= hi):
        top = "inf" if hi == math.inf else f"{int(hi)}"
        raise ValueError(f"{where}: {name}={value!r} must be an integer in [{lo}, {top}]")
    return int(value)


def _delta(where: str, delta: Any) -> float:
    return _real(where, "delta", delta, 0.0, 1.0)


# ---------------------------------------------------------------------- zCDP conversions


def zcdp_to_epsilon(*, rho: float, delta: float) -> float:
    """``(epsilon, delta)`` of a ``rho``-zCDP mechanism (Bun & Steinke 2016, Prop. 1.3).

    ``epsilon = rho + 2 sqrt(rho log(1/delta))`` (002 Lemma 4). Valid, not the tightest: the
    RDP conversion of dp-accounting is smaller for the same curve.
    """
    rho = _real("zcdp_to_epsilon", "rho", rho, 0.0, math.inf, lo_open=False)
    delta = _delta("zcdp_to_epsilon", delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def epsilon_to_zcdp(*, epsilon: float, delta: float) -> float:
    """Largest ``rho`` whose :func:`zcdp_to_epsilon` is at most ``epsilon``.

    ``rho* = (sqrt(log(1/delta) + epsilon) - sqrt(log(1/delta)))^2``, the positive root of
    ``rho + 2 sqrt(rho L) = epsilon`` in ``sqrt(rho)`` (SEED-NOTES, 000: the other root is
    wrong). Written as ``epsilon^2 / (sqrt(L + epsilon) + sqrt(L))^2`` to avoid cancellation.
    """
    epsilon = _real("epsilon_to_zcdp", "epsilon", epsilon, 0.0, math.inf)
    log_inv = math.log(1.0 / _delta("epsilon_to_zcdp", delta))
    return epsilon**2 / (math.sqrt(log_inv + epsilon) + math.sqrt(log_inv)) ** 2


# ------------------------------------------------------------------ paper's formulas


def per_step_rho(*, G: float, gamma: int, sigma: float, honest_summands: int = 1) -> float:
    """zCDP of one local step: ``(2G/gamma)^2 / (2 h sigma^2)``.

    Replace-one sensitivity ``2G/gamma`` of the batch-average gradient (002 Corollary 1),
    Gaussian noise of std ``sqrt(h) sigma`` (``h`` honest summands; 1 = the device alone).
    """
    where = "per_step_rho"
    G = _real(where, "G", G, 0.0, math.inf)
    gamma = _int(where, "gamma", gamma, 1)
    sigma = _real(where, "sigma", sigma, 0.0, math.inf)
    h = _int(where, "honest_summands", honest_summands, 1)
    return 2.0 * G**2 / (h * gamma**2 * sigma**2)


def paper_round_rho(*, tau: int, G: float, m: int, gamma: int, sigma: float, r: int) -> float:
    """002's per-round zCDP of a participant, as printed: ``2 tau G^2 / (r m gamma sigma^2)``.

    Parameters
    ----------
    tau
        Local steps per round.
    G
        Per-record gradient l2 bound (gradient units).
    m
        Records per device.
    gamma
        Mini-batch size in records, ``1 <= gamma <= m``.
    sigma
        Per-coordinate noise std added to the batch-average gradient (gradient units).
    r
        Updates in the secure sum whose noise is secret from the adversary (the paper: all
        ``r`` selected devices; ``1`` gives the figure without secure aggregation).
    """
    where = "paper_round_rho"
    tau = _int(where, "tau", tau, 1)
    m = _int(where, "m", m, 1)
    gamma = _int(where, "gamma", gamma, 1, m)
    r = _int(where, "r", r, 1)
    return tau * gamma / m * per_step_rho(G=G, gamma=gamma, sigma=sigma, honest_summands=r)


def expected_participations(*, T: int, r: int, n: int) -> float:
    """``T r / n``: the expected number of rounds a device takes part in (002 Theorem 1)."""
    where = "expected_participations"
    n = _int(where, "n", n, 1)
    return _int(where, "T", T, 1) * _int(where, "r", r, 1, n) / n


def participation_bound(*, T: int, r: int, n: int, failure_prob: float) -> int:
    """Smallest ``c`` with ``P(max_i C_i > c) <= failure_prob`` under uniform selection.

    ``C_i ~ Binomial(T, r/n)``; a union bound over the ``n`` devices gives
    ``n P(C > c) <= failure_prob``. Theorem 1 uses ``T r / n`` (an expectation, no
    guarantee); a guarantee that holds with probability ``1 - failure_prob`` uses this count
    and adds ``failure_prob`` to delta.
    """
    where = "participation_bound"
    n = _int(where, "n", n, 1)
    T = _int(where, "T", T, 1)
    r = _int(where, "r", r, 1, n)
    beta = _real(where, "failure_prob", failure_prob, 0.0, 1.0)
    counts = np.arange(T + 1)
    tail = n * binom.sf(counts, T, r / n)
    return int(counts[np.argmax(tail <= beta)])


def paper_epsilon(*, participations: float, tau: int, G: float, m: int, gamma: int,
                  sigma: float, r: int, delta: float) -> float:
    """002 eq. (10): ``C`` rounds of :func:`paper_round_rho`, converted by Lemma 4.

    ``participations`` is ``C_i`` (may be the fractional expectation ``T r / n``).
    """
    c = _real("paper_epsilon", "participations", participations, 0.0, math.inf, lo_open=False)
    rho = c * paper_round_rho(tau=tau, G=G, m=m, gamma=gamma, sigma=sigma, r=r)
    return zcdp_to_epsilon(rho=rho, delta=delta)


# ------------------------------------------------------- the testbed's own (dp-accounting)


def record_uses(*, participations: int, tau: int, m: int, gamma: int) -> int:
    """Times one record enters a batch over ``participations`` rounds under epoch shuffling.

    The device's ``participations * tau`` local steps are cut into epochs of ``m / gamma``
    disjoint batches (``gamma`` must divide ``m``); a record is in one batch per epoch, and at
    most once in a trailing partial epoch: ``ceil(participations tau gamma / m)``. Equals
    002's ``C tau gamma / m`` when that is an integer.
    """
    where = "record_uses"
    c = _int(where, "participations", participations, 0)
    tau = _int(where, "tau", tau, 1)
    m = _int(where, "m", m, 1)
    gamma = _int(where, "gamma", gamma, 1, m)
    if m % gamma:
        raise ValueError(f"{where}: gamma={gamma} must divide m={m} (002 partitions the data "
                         "into m/gamma mini-batches)")
    return -(-c * tau // (m // gamma))


def device_dp_event(*, participations: int, tau: int, G: float, m: int, gamma: int,
                    sigma: float, honest_summands: int = 1, sampling: str = "shuffle",
                    q: float | None = None) -> dp_event.DpEvent:
    """The dp-accounting event of one device's record over ``participations`` rounds.

    Parameters
    ----------
    participations
        Rounds the device takes part in (an integer: a realized or bounded count).
    tau, G, m, gamma, sigma
        As in :func:`paper_round_rho`.
    honest_summands
        ``h``: the released Gaussian has noise std ``sqrt(h) sigma`` (the secure sum of ``h``
        updates whose noise is secret); ``1`` = the device's own update.
    sampling
        ``"shuffle"`` (002): one ``GaussianDpEvent`` per record use, noise multiplier
        ``sqrt(h) sigma / (2G/gamma)`` (replace-one sensitivity; compose it under
        ``ADD_OR_REMOVE_ONE``, whose Gaussian has sensitivity 1: dp-accounting's PLD
        accountant would double it again under ``REPLACE_ONE``, its RDP accountant would not).
        ``"poisson"``: every local step samples each record with probability ``q`` and divides
        by the public ``gamma``; add/remove sensitivity ``G/gamma``, ``participations * tau``
        ``PoissonSampledDpEvent(q, GaussianDpEvent(sqrt(h) sigma gamma / G))``.
    q
        Sampling probability for ``"poisson"`` (default ``gamma / m``).
    """
    where = "device_dp_event"
    if sampling not in SAMPLINGS:
        raise ValueError(f"{where}: sampling={sampling!r} must be one of {SAMPLINGS}")
    G = _real(where, "G", G, 0.0, math.inf)
    sigma = _real(where, "sigma", sigma, 0.0, math.inf)
    h = _int(where, "honest_summands", honest_summands, 1)
    m = _int(where, "m", m, 1)
    gamma = _int(where, "gamma", gamma, 1, m)
    if sampling == "shuffle":
        if q is not None:
            raise ValueError(f"{where}: q={q!r} applies only to sampling='poisson'")
        uses = record_uses(participations=participations, tau=tau, m=m, gamma=gamma)
        z = math.sqrt(h) * sigma * gamma / (2.0 * G)
        return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), uses)
    c = _int(where, "participations", participations, 0)
    tau = _int(where, "tau", tau, 1)
    rate = gamma / m if q is None else _real(where, "q", q, 0.0, 1.0, hi_open=False)
    z = math.sqrt(h) * sigma * gamma / G
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(z)), c * tau)


def _epsilon(event: dp_event.DpEvent, delta: float, accountant: str, where: str) -> float:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"{where}: accountant={accountant!r} must be one of {ACCOUNTANTS}")
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    acc: dp_accounting.PrivacyAccountant
    if accountant == "rdp":
        acc = rdp_privacy_accountant.RdpAccountant(_ORDERS, relation)
    else:
        acc = pld_privacy_accountant.PLDAccountant(relation)
    return float(acc.compose(event).get_epsilon(delta))


def testbed_epsilon(*, participations: int, tau: int, G: float, m: int, gamma: int,
                    sigma: float, delta: float, sampling: str = "shuffle",
                    q: float | None = None, accountant: str = "rdp") -> float:
    """Record-level epsilon of a device's own updates, no secure-aggregation credit.

    What the device's uploads reveal when the other participants collude with the server (or
    secure aggregation is absent): the per-step Gaussian mechanisms of :func:`device_dp_event`
    with ``honest_summands=1``, composed and converted by dp-accounting (``"rdp"``: its RDP
    conversion; ``"pld"``: privacy loss distributions). A rigorous bound for any ``tau``.
    """
    event = device_dp_event(participations=participations, tau=tau, G=G, m=m, gamma=gamma,
                            sigma=sigma, sampling=sampling, q=q)
    return _epsilon(event, _delta("testbed_epsilon", delta), accountant, "testbed_epsilon")


def secagg_sum_epsilon(*, participations: int, tau: int, G: float, m: int, gamma: int,
                       sigma: float, delta: float, honest_summands: int,
                       sampling: str = "shuffle", q: float | None = None,
                       accountant: str = "rdp") -> float:
    """Record-level epsilon from the secure sum's sensitivity, composed by dp-accounting.

    The sum of ``h = honest_summands`` updates changes, when one record of one device
    changes, by that device's step sensitivity (``2G/gamma``, as printed); the noise of the
    sum has std ``sqrt(h) sigma``. Its zCDP is 002's with ``r = h``; this checks the ``1/r``
    arithmetic with an independent library. It is a theorem for ``tau = 1`` only (see
    ``TRUST_ASSUMPTION``).
    """
    event = device_dp_event(participations=participations, tau=tau, G=G, m=m, gamma=gamma,
                            sigma=sigma, honest_summands=honest_summands, sampling=sampling,
                            q=q)
    return _epsilon(event, _delta("secagg_sum_epsilon", delta), accountant,
                    "secagg_sum_epsilon")


# ------------------------------------------------------------------------- planner


@dataclass(frozen=True)
class ConvergenceConstants:
    """Constants of 002 Theorem 2 (eq. 18), used to choose ``T`` and ``r``.

    Attributes
    ----------
    smoothness
        ``L`` (1 / parameter units squared, loss units).
    grad_variance
        ``beta^2``: bound on a per-record stochastic gradient's variance (Assumption 3).
    learning_rate
        ``eta``; Theorem 2 needs ``5 eta L + 3 tau^2 eta^2 L^2 <= 1``.
    dimension
        ``d`` model parameters.
    initial_gap
        ``f(theta_0) - f*`` (loss units).
    """

    smoothness: float
    grad_variance: float
    learning_rate: float
    dimension: int
    initial_gap: float

    def __post_init__(self) -> None:
        where = "ConvergenceConstants"
        _real(where, "smoothness", self.smoothness, 0.0, math.inf)
        _real(where, "grad_variance", self.grad_variance, 0.0, math.inf, lo_open=False)
        _real(where, "learning_rate", self.learning_rate, 0.0, math.inf)
        _int(where, "dimension", self.dimension, 1)
        _real(where, "initial_gap", self.initial_gap, 0.0, math.inf, lo_open=False)


def convergence_bound(*, T: Any, tau: int, r: Any, sigma: Any, gamma: int,
                      constants: ConvergenceConstants) -> Any:
    """002 eq. (18): bound on the average squared gradient norm after ``K = T tau`` steps.

    ``T``, ``r`` and ``sigma`` may be numpy arrays (broadcast). Raises ``ValueError`` when the
    learning rate breaks Theorem 2's condition ``5 eta L + 3 tau^2 eta^2 L^2 <= 1``.
    """
    c = constants
    eta, lip, var, d = c.learning_rate, c.smoothness, c.grad_variance, c.dimension
    if 5 * eta * lip + 3 * tau**2 * eta**2 * lip**2 > 1:
        raise ValueError(f"convergence_bound: learning_rate={eta!r} breaks 5 eta L + "
                         f"3 tau^2 eta^2 L^2 <= 1 (L={lip}, tau={tau})")
    T = np.asarray(T, dtype=float)
    r = np.asarray(r, dtype=float)
    s2 = np.asarray(sigma, dtype=float) ** 2
    k = T * tau
    local = (tau - 1) * (2 * tau - 1) * (2 * eta**2 * lip**2 * var / (3 * gamma)
                                         + eta**2 * lip**2 * d * s2 * (r + 1) / (3 * r))
    out = (2 * c.initial_gap / (eta * k) + eta * lip * var / (2 * gamma)
           + eta * lip * d * s2 / (2 * r) + local)
    return out if out.ndim else float(out)


@dataclass(frozen=True)
class SecaggPlan:
    """A noise level (and ``T``, ``r``) meeting ``(epsilon, delta)`` under 002's accounting.

    Attributes
    ----------
    epsilon, delta
        The target; ``delta_total`` adds the participation-bound failure probability.
    n, r, T, tau, G, m, gamma
        As in the module docstring (``T``, ``r`` chosen when the caller left them open).
    participations, participation_mode
        ``C`` used in the composition and where it came from: ``"expected"`` (``T r / n``,
        as printed), ``"given"``, or ``"bound"`` (:func:`participation_bound`).
    honest_summands
        Updates whose noise is credited: ``(min_aggregated or r) - colluding``.
    rho_target, rho_round, rho_total
        ``rho*`` of the target, per round and composed (``rho_total <= rho_target``).
    sigma
        Per-coordinate noise std added to the batch-average gradient (gradient units).
    epsilon_zcdp
        ``rho_total`` converted by Lemma 4 (``<= epsilon``).
    epsilon_no_credit_zcdp
        Same noise, no secure-aggregation credit (``h = 1``), by Lemma 4.
    epsilon_no_credit, epsilon_credit
        The testbed's dp-accounting figures (:func:`testbed_epsilon`,
        :func:`secagg_sum_epsilon`) at ``ceil(participations)``; ``None`` when ``gamma``
        does not divide ``m``.
    epoch_aligned
        ``tau gamma / m`` is an integer (Theorem 1's assumption).
    credit_is_theorem
        ``tau == 1``: the aggregate is a Gaussian mechanism and the credit is rigorous.
    convergence_bound
        eq. (18) at the plan, or ``None`` without convergence constants.
    trust_assumption
        :data:`TRUST_ASSUMPTION`.
    """

    epsilon: float
    delta: float
    delta_total: float
    n: int
    r: int
    T: int
    tau: int
    G: float
    m: int
    gamma: int
    participations: float
    participation_mode: str
    honest_summands: int
    colluding: int
    rho_target: float
    rho_round: float
    rho_total: float
    sigma: float
    epsilon_zcdp: float
    epsilon_no_credit_zcdp: float
    epsilon_no_credit: float | None
    epsilon_credit: float | None
    epoch_aligned: bool
    credit_is_theorem: bool
    convergence_bound: float | None
    trust_assumption: str = TRUST_ASSUMPTION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field."""
        return asdict(self)


def _sigma_for(rho_target: float, *, participations: Any, tau: int, G: float, m: int,
               gamma: int, honest: Any) -> Any:
    # rho_total = C * tau * gamma / m * 2 G^2 / (h gamma^2 sigma^2) = rho_target
    return np.sqrt(2.0 * np.asarray(participations) * tau * G**2
                   / (np.asarray(honest) * m * gamma * rho_target))


def plan_zcdp_secagg(epsilon: float, delta: float, n: int, r: int | None, tau: int,
                     T: int | None, G: float, m: int, gamma: int, *,
                     participations: float | None = None,
                     participation_failure_prob: float | None = None,
                     colluding: int = 0, min_aggregated: int | None = None,
                     convergence: ConvergenceConstants | None = None,
                     round_budget: int | None = None, upload_budget: int | None = None,
                     accountant: str = "rdp") -> SecaggPlan:
    """Choose ``sigma`` (and ``T``, ``r`` when ``None``) so that 002's guarantee meets the target.

    Parameters
    ----------
    epsilon, delta
        Target per device, ``epsilon > 0``, ``0 < delta < 1``.
    n
        Devices.
    r
        Devices selected per round, ``1 <= r <= n``; ``None``: chosen in ``[3, n]`` (secure
        aggregation needs at least 3) to minimise eq. (18) (needs ``convergence``).
    tau
        Local steps per round.
    T
        Rounds; ``None``: chosen in ``[1, round_budget]`` to minimise eq. (18) (needs
        ``convergence`` and ``round_budget``).
    G, m, gamma
        Gradient bound, records per device, mini-batch size (records).
    participations
        ``C`` per device; default ``T r / n`` as printed (an expectation).
    participation_failure_prob
        Instead of the expectation use :func:`participation_bound` at this probability,
        added to ``delta_total``. Exclusive with ``participations``.
    colluding
        Participants whose noise the adversary knows (a curious peer: 1).
    min_aggregated
        Fewest updates the server accepts in a sum (the secure-aggregation threshold ``t``);
        default ``r`` (no dropouts).
    convergence
        Theorem 2 constants; needed to choose ``T`` or ``r`` and to report the bound.
    round_budget, upload_budget
        Most rounds ``T``, most uploads ``T r`` (communication budget) when choosing.
    accountant
        dp-accounting accountant of the testbed figures.

    Raises
    ------
    ValueError
        Naming the argument, its value and its allowed range.
    """
    where = "plan_zcdp_secagg"
    epsilon = _real(where, "epsilon", epsilon, 0.0, math.inf)
    delta = _delta(where, delta)
    n = _int(where, "n", n, 1)
    tau = _int(where, "tau", tau, 1)
    G = _real(where, "G", G, 0.0, math.inf)
    m = _int(where, "m", m, 1)
    gamma = _int(where, "gamma", gamma, 1, m)
    colluding = _int(where, "colluding", colluding, 0, max(n - 1, 0))
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"{where}: accountant={accountant!r} must be one of {ACCOUNTANTS}")
    if participations is not None and participation_failure_prob is not None:
        raise ValueError(f"{where}: give participations={participations!r} or "
                         f"participation_failure_prob={participation_failure_prob!r}, not both")
    choose = T is None or r is None
    if choose and convergence is None:
        raise ValueError(f"{where}: convergence=None, but choosing T={T!r} / r={r!r} needs "
                         "ConvergenceConstants")
    if T is None:
        if round_budget is None:
            raise ValueError(f"{where}: T=None needs round_budget (an integer >= 1)")
        t_grid = np.arange(1, _int(where, "round_budget", round_budget, 1) + 1)
    else:
        t_grid = np.array([_int(where, "T", T, 1)])
    if r is None:
        if n < 3:
            raise ValueError(f"{where}: r=None chooses r in [3, n], but n={n} < 3")
        r_grid = np.arange(max(3, colluding + 1), n + 1)
    else:
        r_grid = np.array([_int(where, "r", r, 1, n)])
    if upload_budget is not None:
        _int(where, "upload_budget", upload_budget, 1)
    if t_grid.size * r_grid.size > _MAX_GRID:
        raise ValueError(f"{where}: round_budget={round_budget!r} times {r_grid.size} values "
                         f"of r exceeds {_MAX_GRID} candidates")
    if min_aggregated is not None:
        _int(where, "min_aggregated", min_aggregated, colluding + 1, int(r_grid.max()))
    t_mesh, r_mesh = np.meshgrid(t_grid, r_grid, indexing="ij")
    tt, rr = t_mesh.ravel(), r_mesh.ravel()
    keep = np.ones(tt.shape, dtype=bool)
    if upload_budget is not None:
        keep &= tt * rr <= upload_budget
    summands = np.full(rr.shape, min_aggregated) if min_aggregated is not None else rr
    honest = summands - colluding
    keep &= honest >= 1
    if not keep.any():
        if upload_budget is None or not (honest >= 1).any():
            raise ValueError(f"{where}: colluding={colluding} must be below the summands "
                             f"(r={r!r}, min_aggregated={min_aggregated!r})")
        raise ValueError(f"{where}: upload_budget={upload_budget!r} admits no T * r with "
                         f"T >= 1 and r in [{int(r_grid.min())}, {n}]")
    tt, rr, honest = tt[keep], rr[keep], honest[keep]

    delta_total = delta
    if participations is not None:
        if choose:
            raise ValueError(f"{where}: participations={participations!r} cannot be fixed "
                             "while T or r is being chosen")
        mode = "given"
        counts = np.array([_real(where, "participations", participations, 0.0,
                                 float(tt[0]), hi_open=False)])
    elif participation_failure_prob is not None:
        mode = "bound"
        beta = _real(where, "participation_failure_prob", participation_failure_prob, 0.0,
                     1.0 - delta)
        delta_total = delta + beta
        counts = np.array([participation_bound(T=int(a), r=int(b), n=n, failure_prob=beta)
                           for a, b in zip(tt, rr, strict=True)], dtype=float)
    else:
        mode = "expected"
        counts = tt * rr / n
    rho_target = epsilon_to_zcdp(epsilon=epsilon, delta=delta)
    sigmas = _sigma_for(rho_target, participations=np.maximum(counts, 1e-300), tau=tau, G=G,
                        m=m, gamma=gamma, honest=honest)
    if convergence is not None:
        bounds = np.asarray(convergence_bound(T=tt, tau=tau, r=rr, sigma=sigmas, gamma=gamma,
                                              constants=convergence))
        best = int(np.argmin(bounds)) if choose else 0
        bound: float | None = float(bounds[best])
    else:
        best, bound = 0, None
    t_best, r_best, h_best = int(tt[best]), int(rr[best]), int(honest[best])
    count, sigma = float(counts[best]), float(sigmas[best])
    rho_round = paper_round_rho(tau=tau, G=G, m=m, gamma=gamma, sigma=sigma, r=h_best)
    rho_total = count * rho_round
    eps_credit: float | None = None
    eps_plain: float | None = None
    if m % gamma == 0:
        c_int = math.ceil(count - 1e-9)
        eps_plain = testbed_epsilon(participations=c_int, tau=tau, G=G, m=m, gamma=gamma,
                                    sigma=sigma, delta=delta, accountant=accountant)
        eps_credit = secagg_sum_epsilon(participations=c_int, tau=tau, G=G, m=m, gamma=gamma,
                                        sigma=sigma, delta=delta, honest_summands=h_best,
                                        accountant=accountant)
    return SecaggPlan(
        epsilon=epsilon, delta=delta, delta_total=delta_total, n=n, r=r_best, T=t_best,
        tau=tau, G=G, m=m, gamma=gamma, participations=count, participation_mode=mode,
        honest_summands=h_best, colluding=colluding, rho_target=rho_target,
        rho_round=rho_round, rho_total=rho_total, sigma=sigma,
        epsilon_zcdp=zcdp_to_epsilon(rho=rho_total, delta=delta),
        epsilon_no_credit_zcdp=zcdp_to_epsilon(rho=rho_total * h_best, delta=delta),
        epsilon_no_credit=eps_plain, epsilon_credit=eps_credit,
        epoch_aligned=(tau * gamma) % m == 0, credit_is_theorem=tau == 1,
        convergence_bound=bound,
    )
