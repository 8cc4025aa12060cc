"""DP-PASGD (paper 000, Hu et al.): zCDP accounting and the testbed's figure.

Pure functions, no randomness. The paper's mechanism: every local step of device ``m``
releases the mini-batch gradient ``g = (1/X) sum_{x in batch} grad l(theta; x)`` plus
``N(0, sigma^2 I_d)``; the models are averaged every ``tau`` steps; ``K`` local steps in all.
With ``||grad l|| <= G`` (the paper's G-Lipschitz loss; in the testbed the per-example clip
norm) and *replace-one* neighbours, one step has l2 sensitivity ``2G/X``, so (paper Sec. 5.2)

* one step is ``rho_1 = 2 G^2 / (X^2 sigma^2)``-zCDP (Gaussian mechanism, Lemma 2),
* ``K`` steps are ``rho = 2 K G^2 / (X^2 sigma^2)``-zCDP (Lemma 1; no subsampling
  amplification is credited, and every step is charged although only ``K/tau`` models leave
  the device),
* and ``(eps, delta)``-DP with ``eps = rho + 2 sqrt(rho log(1/delta))`` (Lemma 3, eq. 9).

The inverse used by the planner is the **corrected root** (SEED-NOTES 000: (23) and (25)
take the wrong one): ``rho*(eps, delta) = (sqrt(L + eps) - sqrt(L))^2``, ``L = log(1/delta)``.
The printed value is kept as :func:`rho_star_printed`, for the docs only.

Next to it, the testbed's own figure for the same mechanism (``dp_accounting``, RDP or PLD)
and for its record-level variant with secret Poisson sampling. Derivations and the planner's
rounding: ``docs/peers/dp-pasgd.md``. The resource-constrained planner that calibrates its noise
with these formulas is :mod:`aggregator.peers.dp_pasgd`. The argument checks are the peers'
shared ones (:mod:`aggregator.peers.checks`).
"""

from __future__ import annotations

import math
from typing import Any

from aggregator.peers.checks import check_delta, check_epsilon, check_int, check_real

#: Accountants of the testbed figure.
ACCOUNTANTS = ("rdp", "pld")
#: PLD value discretization (nats), the record accountant's default.
PLD_DISCRETIZATION = 1e-3


# ---------------------------------------------------------------------------- paper accounting
def rho_per_step(G: float, X: float, sigma: float) -> float:
    """zCDP of one local step: ``(2G/X)^2 / (2 sigma^2) = 2 G^2 / (X^2 sigma^2)``.

    Parameters
    ----------
    G
        Bound on every per-example gradient's l2 norm (> 0; gradient units).
    X
        Mini-batch size (> 0; the average divides by it).
    sigma
        Std of the Gaussian noise per coordinate added to the mini-batch gradient
        (>= 0; gradient units). ``0`` gives ``inf``.

    Returns
    -------
    float
        rho in nats (zCDP), replace-one neighbours.
    """
    G = check_real("rho_per_step", "G", G, 0.0, low_open=True)
    X = check_real("rho_per_step", "X", X, 0.0, low_open=True)
    sigma = check_real("rho_per_step", "sigma", sigma, 0.0)
    if sigma == 0.0:
        return math.inf
    return 2.0 * G * G / (X * X * sigma * sigma)


def rho_total(K: int, G: float, X: float, sigma: float) -> float:
    """zCDP of ``K`` local steps (additive composition): ``2 K G^2 / (X^2 sigma^2)``."""
    return check_int("rho_total", "K", K, 1) * rho_per_step(G, X, sigma)


def zcdp_to_eps(rho: float, delta: float) -> float:
    """``(eps, delta)``-DP of a ``rho``-zCDP mechanism: ``rho + 2 sqrt(rho log(1/delta))``.

    Bun and Steinke 2016, Prop. 1.3 (the paper's Lemma 3). ``rho`` in ``[0, inf]``.
    """
    if rho != math.inf:  # inf (sigma = 0: no noise) is allowed, and converts to inf
        rho = check_real("zcdp_to_eps", "rho", rho, 0.0)
    log_inv = -math.log(check_delta("zcdp_to_eps", delta))
    if math.isinf(rho):
        return math.inf
    return rho + 2.0 * math.sqrt(rho * log_inv)


def rho_star(eps: float, delta: float) -> float:
    """Largest rho with ``zcdp_to_eps(rho, delta) <= eps`` (the corrected root).

    ``sqrt(rho) = sqrt(L + eps) - sqrt(L)`` with ``L = log(1/delta)``, evaluated as
    ``eps^2 / (sqrt(L + eps) + sqrt(L))^2`` (no cancellation for small ``eps``).
    """
    eps, log_inv = check_epsilon("rho_star", eps, "eps"), -math.log(check_delta("rho_star", delta))
    root_sum = math.sqrt(log_inv + eps) + math.sqrt(log_inv)
    return eps * eps / (root_sum * root_sum)


def rho_star_printed(eps: float, delta: float) -> float:
    """**Wrong** -- the paper's printed (23)/(25) value, kept only to show the difference.

    ``Z = eps + 2L + 2 sqrt(L^2 + eps L) = (sqrt(L + eps) + sqrt(L))^2``: the square of the
    *negative* root of ``s^2 + 2 sqrt(L) s - eps = 0`` (``s = sqrt(rho)``). It equals
    ``eps^2 / rho_star(eps, delta)`` and ``zcdp_to_eps(Z, delta) = eps + 4L + 4 sqrt(L (L +
    eps)) > eps``: not a valid inverse. Never use it to calibrate noise.
    """
    eps = check_epsilon("rho_star_printed", eps, "eps")
    log_inv = -math.log(check_delta("rho_star_printed", delta))
    return eps + 2.0 * log_inv + 2.0 * math.sqrt(log_inv * log_inv + eps * log_inv)


def sigma_for(eps: float, delta: float, K: int, G: float, X: float) -> float:
    """Smallest noise std (per coordinate) with ``K`` steps within ``(eps, delta)``.

    ``sigma = (G/X) sqrt(2K / rho*(eps, delta))``, then nudged up by a few ulps if rounding
    would put ``rho_total(K, G, X, sigma)`` above ``rho*`` or its epsilon above ``eps``: the
    returned value never overshoots the target.
    """
    K = check_int("sigma_for", "K", K, 1)
    G = check_real("sigma_for", "G", G, 0.0, low_open=True)
    X = check_real("sigma_for", "X", X, 0.0, low_open=True)
    target = rho_star(eps, delta)
    sigma = (G / X) * math.sqrt(2.0 * K / target)
    for _ in range(64):
        rho = rho_total(K, G, X, sigma)
        if rho <= target and zcdp_to_eps(rho, delta) <= eps:
            return sigma
        sigma = math.nextafter(sigma, math.inf)
    return sigma * (1.0 + 1e-12)


def paper_epsilon(K: int, G: float, X: float, sigma: float, delta: float) -> float:
    """The paper's eq. (9): ``zcdp_to_eps(rho_total(K, G, X, sigma), delta)``."""
    return zcdp_to_eps(rho_total(K, G, X, sigma), delta)


def paper_noise_multiplier(sigma: float, G: float, X: float) -> float:
    """``sigma / (2G/X)``: noise std over the paper's (replace-one) sensitivity."""
    where = "paper_noise_multiplier"
    sigma = check_real(where, "sigma", sigma, 0.0)
    X = check_real(where, "X", X, 0.0, low_open=True)
    return sigma * X / (2.0 * check_real(where, "G", G, 0.0, low_open=True))


# ---------------------------------------------------------------------------- testbed figure
def _accountant(value: Any) -> str:
    if value not in ACCOUNTANTS:
        raise ValueError(f"accountant={value!r} must be one of {ACCOUNTANTS}")
    return str(value)


def testbed_epsilon(K: int, noise_multiplier: float, delta: float,
                    accountant: str = "rdp") -> float:
    """Epsilon of ``K`` Gaussian mechanisms of noise multiplier ``sigma/Delta`` (dp-accounting).

    Parameters
    ----------
    K
        Local steps (>= 1), each charged in full: no subsampling amplification, as the paper.
    noise_multiplier
        ``sigma / Delta`` (> 0) with ``Delta`` the step's l2 sensitivity under the relation
        one wants: ``2G/X`` for the paper's replace-one (:func:`paper_noise_multiplier`).
    delta
        Target delta in ``(0, 1)``.
    accountant
        ``"rdp"``: ``dp_accounting.rdp.RdpAccountant`` on the record accountant's order grid
        with ``SelfComposedDpEvent(GaussianDpEvent(z), K)``. ``"pld"``:
        ``dp_accounting.pld.PLDAccountant`` (value discretization ``1e-3`` nats, pessimistic)
        on ``GaussianDpEvent(z / sqrt(K))``, which is exactly ``K`` such mechanisms composed
        (Gaussian DP, Dong, Roth, Su 2022) and avoids a slow ``K``-fold PLD composition.

    Returns
    -------
    float
        Epsilon (nats), an upper bound; tighter than :func:`zcdp_to_eps` in practice.
    """
    import dp_accounting
    from dp_accounting import pld, rdp

    from testbed.core.privacy.analysis.record_rdp import ORDERS

    K = check_int("testbed_epsilon", "K", K, 1)
    z = check_real("testbed_epsilon", "noise_multiplier", noise_multiplier, 0.0, low_open=True)
    delta = check_delta("testbed_epsilon", delta)
    if _accountant(accountant) == "rdp":
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), K)
        acc: Any = rdp.RdpAccountant(orders=list(ORDERS))
    else:
        event = dp_accounting.GaussianDpEvent(z / math.sqrt(K))
        acc = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    return float(acc.compose(event).get_epsilon(delta))


def testbed_epsilon_subsampled(K: int, q: float, noise_multiplier: float, delta: float,
                               accountant: str = "rdp", *,
                               relation: str = "add-remove") -> float:
    """Record-level epsilon of ``K`` Poisson-subsampled Gaussian steps, as the testbed runs them.

    The testbed runs DP-PASGD with per-example clipping at ``C`` (the paper's ``G``), a
    public expected batch ``B`` (the paper's ``X``) and Poisson sampling at rate ``q`` from a
    secret source, so each step is a subsampled Gaussian and amplification is credited. The
    paper credits **no** amplification (:func:`testbed_epsilon` is its like-for-like figure).

    Parameters
    ----------
    K
        Local steps (>= 1).
    q
        Poisson sampling rate in ``(0, 1]`` (``B / D`` for ``D`` local records).
    noise_multiplier
        ``z = sigma B / C`` (> 0): std over the **add/remove** sensitivity ``C/B``, the
        convention of :class:`~testbed.core.privacy.record_events.RecordEvent` whatever the
        relation (the paper's replace-one multiplier is ``z/2``).
    delta
        Target delta in ``(0, 1)``.
    accountant
        ``"rdp"`` or ``"pld"``.
    relation
        ``"add-remove"`` (the testbed's default) or ``"replace-one"`` (the paper's; bounded
        through the add/remove neighbour, docs/privacy.md 10.1).

    Returns
    -------
    float
        Epsilon from :func:`~testbed.core.privacy.accountants.record_planning.record_epsilon_for`.
    """
    from testbed.core.privacy.accountants.record_planning import record_epsilon_for

    where = "testbed_epsilon_subsampled"
    K = check_int(where, "K", K, 1)
    q = check_real(where, "q", q, 0.0, 1.0, low_open=True)
    z = check_real(where, "noise_multiplier", noise_multiplier, 0.0, low_open=True)
    return record_epsilon_for(q=q, z=z, steps=K, delta=check_delta(where, delta),
                              accountant=_accountant(accountant), relation=relation).epsilon
