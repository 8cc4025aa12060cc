"""zCDP accounting of peer scheme 002 (Hu, Guo, Gong, IEEE OJ-CS 2021).

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
``docs/peers/zcdp-secagg.md``. The planner, which chooses ``sigma`` (and ``T``, ``r``)
from these formulas, is :mod:`aggregator.peers.zcdp_secagg`. The argument checks are the
peers' shared ones (:mod:`aggregator.peers.checks`).
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.stats import binom

from aggregator.peers.checks import check_delta, check_int, check_real

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
#: Renyi orders for dp-accounting's RDP accountant: its default grid widened at both ends.
_ORDERS = tuple(
    [1.0 + x / 100.0 for x in range(1, 100)]
    + [2.0 + x / 10.0 for x in range(0, 90)]
    + [float(a) for a in range(11, 64)]
    + [float(2**k) for k in range(6, 17)]
)


# ---------------------------------------------------------------------- zCDP conversions


def zcdp_to_epsilon(*, rho: float, delta: float) -> float:
    """``(epsilon, delta)`` of a ``rho``-zCDP mechanism (Bun & Steinke 2016, Prop. 1.3).

    ``epsilon = rho + 2 sqrt(rho log(1/delta))`` (002 Lemma 4). Valid, not the tightest: the
    RDP conversion of dp-accounting is smaller for the same curve.
    """
    rho = check_real("zcdp_to_epsilon", "rho", rho, 0.0)
    delta = check_delta("zcdp_to_epsilon", delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def epsilon_to_zcdp(*, epsilon: float, delta: float) -> float:
    """Largest ``rho`` whose :func:`zcdp_to_epsilon` is at most ``epsilon``.

    ``rho* = (sqrt(log(1/delta) + epsilon) - sqrt(log(1/delta)))^2``, the positive root of
    ``rho + 2 sqrt(rho L) = epsilon`` in ``sqrt(rho)`` (SEED-NOTES, 000: the other root is
    wrong). Written as ``epsilon^2 / (sqrt(L + epsilon) + sqrt(L))^2`` to avoid cancellation.
    """
    epsilon = check_real("epsilon_to_zcdp", "epsilon", epsilon, 0.0, low_open=True)
    log_inv = math.log(1.0 / check_delta("epsilon_to_zcdp", delta))
    return epsilon**2 / (math.sqrt(log_inv + epsilon) + math.sqrt(log_inv)) ** 2


# ------------------------------------------------------------------ paper's formulas


def per_step_rho(*, G: float, gamma: int, sigma: float, honest_summands: int = 1) -> float:
    """zCDP of one local step: ``(2G/gamma)^2 / (2 h sigma^2)``.

    Replace-one sensitivity ``2G/gamma`` of the batch-average gradient (002 Corollary 1),
    Gaussian noise of std ``sqrt(h) sigma`` (``h`` honest summands; 1 = the device alone).
    """
    where = "per_step_rho"
    G = check_real(where, "G", G, 0.0, low_open=True)
    gamma = check_int(where, "gamma", gamma, 1)
    sigma = check_real(where, "sigma", sigma, 0.0, low_open=True)
    h = check_int(where, "honest_summands", honest_summands, 1)
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
    tau = check_int(where, "tau", tau, 1)
    m = check_int(where, "m", m, 1)
    gamma = check_int(where, "gamma", gamma, 1, m)
    r = check_int(where, "r", r, 1)
    return tau * gamma / m * per_step_rho(G=G, gamma=gamma, sigma=sigma, honest_summands=r)


def expected_participations(*, T: int, r: int, n: int) -> float:
    """``T r / n``: the expected number of rounds a device takes part in (002 Theorem 1)."""
    where = "expected_participations"
    n = check_int(where, "n", n, 1)
    return check_int(where, "T", T, 1) * check_int(where, "r", r, 1, n) / n


def participation_bound(*, T: int, r: int, n: int, failure_prob: float) -> int:
    """Smallest ``c`` with ``P(max_i C_i > c) <= failure_prob`` under uniform selection.

    ``C_i ~ Binomial(T, r/n)``; a union bound over the ``n`` devices gives
    ``n P(C > c) <= failure_prob``. Theorem 1 uses ``T r / n`` (an expectation, no
    guarantee); a guarantee that holds with probability ``1 - failure_prob`` uses this count
    and adds ``failure_prob`` to delta.
    """
    where = "participation_bound"
    n = check_int(where, "n", n, 1)
    T = check_int(where, "T", T, 1)
    r = check_int(where, "r", r, 1, n)
    beta = check_real(where, "failure_prob", failure_prob, 0.0, 1.0, low_open=True, high_open=True)
    counts = np.arange(T + 1)
    tail = n * binom.sf(counts, T, r / n)
    return int(counts[np.argmax(tail <= beta)])


def paper_epsilon(*, participations: float, tau: int, G: float, m: int, gamma: int,
                  sigma: float, r: int, delta: float) -> float:
    """002 eq. (10): ``C`` rounds of :func:`paper_round_rho`, converted by Lemma 4.

    ``participations`` is ``C_i`` (may be the fractional expectation ``T r / n``).
    """
    c = check_real("paper_epsilon", "participations", participations, 0.0)
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
    c = check_int(where, "participations", participations, 0)
    tau = check_int(where, "tau", tau, 1)
    m = check_int(where, "m", m, 1)
    gamma = check_int(where, "gamma", gamma, 1, m)
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
    G = check_real(where, "G", G, 0.0, low_open=True)
    sigma = check_real(where, "sigma", sigma, 0.0, low_open=True)
    h = check_int(where, "honest_summands", honest_summands, 1)
    m = check_int(where, "m", m, 1)
    gamma = check_int(where, "gamma", gamma, 1, m)
    if sampling == "shuffle":
        if q is not None:
            raise ValueError(f"{where}: q={q!r} applies only to sampling='poisson'")
        uses = record_uses(participations=participations, tau=tau, m=m, gamma=gamma)
        z = math.sqrt(h) * sigma * gamma / (2.0 * G)
        return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), uses)
    c = check_int(where, "participations", participations, 0)
    tau = check_int(where, "tau", tau, 1)
    rate = gamma / m if q is None else check_real(where, "q", q, 0.0, 1.0, low_open=True)
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
    return _epsilon(event, check_delta("testbed_epsilon", delta), accountant, "testbed_epsilon")


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
    return _epsilon(event, check_delta("secagg_sum_epsilon", delta), accountant,
                    "secagg_sum_epsilon")
