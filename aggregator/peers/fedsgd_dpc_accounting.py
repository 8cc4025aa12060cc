"""FedSGD-DPC (paper 004): the paper's privacy accounting and the testbed's figure.

Zhou, Liu, Fu, Wu, Li, Yu, "Optimizing the Numbers of Queries and Replies in Federated
Learning with Differential Privacy". Each of ``T`` rounds the server queries ``b`` of ``N``
clients; a client replies with one local gradient step (its full local set of ``d_i = d / N``
records for the Laplace mechanism, a sampled fraction ``q`` for the Gaussian one) plus noise.
A client replies ``R = b T / N`` times *in expectation*; that is the count the paper composes
over. Everything here is a pure function of its arguments; randomness never enters.

* Paper accounting, as printed. Laplace (Theorem 1): scale ``s = 2 R xi_1 / (d_i eps)``, i.e.
  ``eps / R`` per reply (l1 sensitivity ``2 xi_1 / d_i``, replace-one), composed linearly.
  Gaussian (Theorem 2, Abadi et al.'s moments-accountant theorem with unnamed constants):
  ``sigma = c2 xi_2 sqrt(R log(1/delta)) / (d_i eps)``, i.e. ``sqrt(R)`` composition, *not*
  linear; ``c2 = 2`` by default (the leading-order constant of Abadi et al.'s proof).
* :func:`testbed_epsilon`: the same noise composed by ``dp-accounting`` (PLD or RDP) over a
  reply count that bounds every client's replies (``ceil(b T / N)`` under round robin).

Units: gradients, clips and noise scales are in loss units per parameter (the averaged
gradient a client sends); epsilons in nats. The derivations and the paper's slips are in
``docs/peers/fedsgd-dpc.md``.
"""

from __future__ import annotations

import math
from typing import Literal

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from aggregator.peers.checks import check_choice, check_int, check_real
from testbed.core.privacy.accountants.record_planning import record_epsilon_for

Mechanism = Literal["laplace", "gaussian"]
ReplyCount = Literal["expected", "round_robin", "worst_case"]
MECHANISMS: tuple[str, ...] = ("laplace", "gaussian")
REPLY_COUNTS: tuple[str, ...] = ("expected", "round_robin", "worst_case")
#: The Gaussian constant ``c2`` of Theorem 2 when none is given (see the module docstring).
DEFAULT_C2 = 2.0

# ------------------------------------------------------------------- paper accounting


def replies_per_client(T: int, b: int, N: int, *, count: ReplyCount = "expected") -> float:
    """How many replies one client makes in ``T`` rounds of ``b`` out of ``N`` clients.

    Parameters
    ----------
    T, b, N
        Rounds (queries) ``>= 1``, clients per round ``1 <= b <= N``, clients ``N >= 2``.
    count
        ``"expected"``: ``b T / N``, what the paper composes over (Theorems 1 and 2); not a
        bound on any one client. ``"round_robin"``: ``ceil(b T / N)``, the most replies any
        client makes under Algorithm 1's round-robin selection. ``"worst_case"``: ``T``,
        the bound under the random selection the analysis assumes (Lemmas 1, 2).

    Returns
    -------
    float
        The count (an integer value except for ``"expected"``).
    """
    where = "replies_per_client"
    N = check_int(where, "N", N, 2)
    b = check_int(where, "b", b, 1, N)
    T = check_int(where, "T", T, 1)
    count = check_choice(where, "count", count, REPLY_COUNTS)  # type: ignore[assignment]
    if count == "expected":
        return b * T / N
    if count == "round_robin":
        return float(-(-b * T // N))
    return float(T)


def linear_composition(eps_per_reply: float, replies: float) -> float:
    """Basic composition: ``replies`` pure-DP releases of ``eps_per_reply`` each (nats)."""
    eps = check_real("linear_composition", "eps_per_reply", eps_per_reply, 0.0)
    r = check_real("linear_composition", "replies", replies, 0.0)
    return eps * r


def laplace_epsilon_per_reply(scale: float, *, clip_l1: float, local_size: float) -> float:
    """Epsilon of one Laplace reply (Theorem 1 with ``R = 1``), nats.

    Parameters
    ----------
    scale
        Laplace scale per coordinate on the averaged gradient, ``> 0``.
    clip_l1
        ``xi_1``: bound on a record's gradient l1 norm, ``> 0``.
    local_size
        ``d_i``: records the client averages over (its whole local set), ``> 0``.

    Returns
    -------
    float
        ``(2 xi_1 / d_i) / scale``: the l1 sensitivity of the average under replace-one.
    """
    where = "laplace_epsilon_per_reply"
    s = check_real(where, "scale", scale, 0.0, low_open=True)
    xi = check_real(where, "clip_l1", clip_l1, 0.0, low_open=True)
    d_i = check_real(where, "local_size", local_size, 0.0, low_open=True)
    return 2.0 * xi / (d_i * s)


def laplace_scale(epsilon: float, *, T: int, b: int, N: int, clip_l1: float,
                  local_size: float, count: ReplyCount = "expected") -> float:
    """Theorem 1: the Laplace scale ``2 R xi_1 / (d_i eps)`` for a total ``eps`` over ``R``.

    ``R = replies_per_client(T, b, N, count=count)``; the paper's ``count="expected"``.
    Inverse of :func:`laplace_epsilon_total`. Units as :func:`laplace_epsilon_per_reply`.
    """
    where = "laplace_scale"
    eps = check_real(where, "epsilon", epsilon, 0.0, low_open=True)
    xi = check_real(where, "clip_l1", clip_l1, 0.0, low_open=True)
    d_i = check_real(where, "local_size", local_size, 0.0, low_open=True)
    r = replies_per_client(T, b, N, count=count)
    return 2.0 * r * xi / (d_i * eps)


def laplace_epsilon_total(scale: float, *, T: int, b: int, N: int, clip_l1: float,
                          local_size: float, count: ReplyCount = "expected") -> float:
    """Linear composition of :func:`laplace_epsilon_per_reply` over ``R`` replies (nats)."""
    per = laplace_epsilon_per_reply(scale, clip_l1=clip_l1, local_size=local_size)
    return linear_composition(per, replies_per_client(T, b, N, count=count))


def gaussian_sigma(epsilon: float, delta: float, *, T: int, b: int, N: int, clip_l2: float,
                   local_size: float, c2: float = DEFAULT_C2,
                   count: ReplyCount = "expected") -> float:
    """Theorem 2 (eq. 5): ``sigma = c2 xi_2 sqrt(R log(1/delta)) / (d_i eps)``.

    Parameters
    ----------
    epsilon, delta
        Target over the whole run, ``eps > 0``, ``0 < delta < 1``.
    T, b, N, count
        As :func:`replies_per_client`.
    clip_l2
        ``xi_2``: bound on a record's gradient l2 norm, ``> 0``.
    local_size
        ``d_i``, ``> 0``. The sampled batch is averaged over its expected size ``q d_i``;
        ``q`` cancels (``sigma = z xi_2 / (q d_i)`` with ``z = c2 q sqrt(R log(1/delta))/eps``).
    c2
        The unnamed constant of Theorem 2, ``> 0`` (default 2; the paper gives none).

    Returns
    -------
    float
        Gaussian std per coordinate on the averaged gradient.
    """
    where = "gaussian_sigma"
    eps = check_real(where, "epsilon", epsilon, 0.0, low_open=True)
    dl = check_real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    xi = check_real(where, "clip_l2", clip_l2, 0.0, low_open=True)
    d_i = check_real(where, "local_size", local_size, 0.0, low_open=True)
    c = check_real(where, "c2", c2, 0.0, low_open=True)
    r = replies_per_client(T, b, N, count=count)
    return c * xi * math.sqrt(r * math.log(1.0 / dl)) / (d_i * eps)


def gaussian_epsilon_total(sigma: float, delta: float, *, T: int, b: int, N: int,
                           clip_l2: float, local_size: float, c2: float = DEFAULT_C2,
                           count: ReplyCount = "expected") -> float:
    """Inverse of :func:`gaussian_sigma`: the paper's epsilon (nats) for a given ``sigma``.

    Grows as ``sqrt(R)`` (the moments accountant), not linearly. Valid, per Theorem 2, only
    for ``eps < c1 q^2 T`` with an unnamed ``c1``; see :func:`moments_accountant_regime`.
    """
    where = "gaussian_epsilon_total"
    s = check_real(where, "sigma", sigma, 0.0, low_open=True)
    dl = check_real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    xi = check_real(where, "clip_l2", clip_l2, 0.0, low_open=True)
    d_i = check_real(where, "local_size", local_size, 0.0, low_open=True)
    c = check_real(where, "c2", c2, 0.0, low_open=True)
    r = replies_per_client(T, b, N, count=count)
    return c * xi * math.sqrt(r * math.log(1.0 / dl)) / (d_i * s)


def gaussian_epsilon_per_reply(sigma: float, delta: float, *, clip_l2: float,
                               local_size: float, c2: float = DEFAULT_C2) -> float:
    """:func:`gaussian_epsilon_total` at ``R = 1``; the total is ``sqrt(R)`` times this."""
    return gaussian_epsilon_total(sigma, delta, T=1, b=1, N=2, clip_l2=clip_l2,
                                  local_size=local_size, c2=c2, count="worst_case")


def gaussian_noise_multiplier(sigma: float, *, q: float, clip_l2: float,
                              local_size: float) -> float:
    """``z = sigma / (xi_2 / (q d_i))``: std over the add/remove sensitivity of the average.

    The batch sum of clipped gradients is divided by its public expected size ``q d_i``
    (docs/privacy.md 10.1), so adding or removing a record moves it by ``<= xi_2 / (q d_i)``.
    """
    where = "gaussian_noise_multiplier"
    s = check_real(where, "sigma", sigma, 0.0)
    qq = check_real(where, "q", q, 0.0, 1.0, low_open=True)
    xi = check_real(where, "clip_l2", clip_l2, 0.0, low_open=True)
    d_i = check_real(where, "local_size", local_size, 0.0, low_open=True)
    return s * qq * d_i / xi


def moments_accountant_regime(*, q: float, noise_multiplier: float, epsilon: float,
                              delta: float) -> bool:
    """Whether Abadi et al.'s Lemma 3 conditions hold at the order their proof uses.

    ``z >= 1``, ``q < 1/(16 z)`` and ``lambda = 2 log(1/delta)/eps <= z^2 log(1/(q z))``.
    Outside this regime Theorem 2 (hence :func:`gaussian_epsilon_total`) has no proof; the
    paper's own setting (``q = 0.01``, ``b = N``, ``T = 100``, ``eps = 1``) is outside it.
    """
    where = "moments_accountant_regime"
    qq = check_real(where, "q", q, 0.0, 1.0, low_open=True)
    z = check_real(where, "noise_multiplier", noise_multiplier, 0.0, low_open=True)
    eps = check_real(where, "epsilon", epsilon, 0.0, low_open=True)
    dl = check_real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    if z < 1.0 or qq >= 1.0 / (16.0 * z):
        return False
    return 2.0 * math.log(1.0 / dl) / eps <= z * z * math.log(1.0 / (qq * z))


# ------------------------------------------------------------------ the testbed's figure


def testbed_epsilon(*, mechanism: Mechanism, noise_scale: float, T: int, b: int, N: int,
                    clip: float, local_size: float, delta: float, q: float | None = None,
                    accountant: Literal["pld", "rdp"] = "pld",
                    relation: Literal["add-remove", "replace-one"] = "add-remove",
                    count: Literal["round_robin", "worst_case"] = "round_robin",
                    pld_discretization: float = 1e-3) -> float:
    """The same noise composed by ``dp-accounting`` over every reply a client can make.

    Parameters
    ----------
    mechanism
        ``"laplace"``: full batch, ``Lap(0, noise_scale)``; each reply a
        ``LaplaceDpEvent(noise_scale / Delta_1)`` with ``Delta_1 = clip / d_i`` (add/remove)
        or ``2 clip / d_i`` (replace-one, the paper's). ``"gaussian"``: Poisson sampling at
        rate ``q``, ``N(0, noise_scale^2)``; each reply a Poisson-subsampled Gaussian of
        noise multiplier :func:`gaussian_noise_multiplier`, composed by the project's record
        engines (:func:`~testbed.core.privacy.accountants.record_planning.record_epsilon_for`).
    noise_scale
        Laplace scale or Gaussian std on the averaged gradient, ``> 0``.
    T, b, N
        As :func:`replies_per_client`.
    clip
        ``xi_1`` (l1, Laplace) or ``xi_2`` (l2, Gaussian), ``> 0``.
    local_size
        ``d_i > 0``.
    delta
        Target delta in ``(0, 1)``.
    q
        Record sampling rate in ``(0, 1]``; required for the Gaussian, ignored for Laplace.
    accountant
        ``"pld"`` (privacy loss distributions, tighter) or ``"rdp"``.
    relation
        ``"add-remove"`` (the project's default, and Abadi et al.'s) or ``"replace-one"``
        (the paper's Laplace sensitivity).
    count
        ``"round_robin"`` (``ceil(b T / N)``, Algorithm 1) or ``"worst_case"`` (``T``).
        ``"expected"`` is refused: a guarantee needs a count that bounds every client.
    pld_discretization
        PLD value discretization (nats) in ``(0, 0.1]``.

    Returns
    -------
    float
        Epsilon (nats) at ``delta`` for one client, record level.
    """
    where = "testbed_epsilon"
    mech = check_choice(where, "mechanism", mechanism, MECHANISMS)
    s = check_real(where, "noise_scale", noise_scale, 0.0, low_open=True)
    xi = check_real(where, "clip", clip, 0.0, low_open=True)
    d_i = check_real(where, "local_size", local_size, 0.0, low_open=True)
    dl = check_real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    acc = check_choice(where, "accountant", accountant, ("pld", "rdp"))
    rel = check_choice(where, "relation", relation, ("add-remove", "replace-one"))
    cnt = check_choice(where, "count", count, ("round_robin", "worst_case"))
    disc = check_real(where, "pld_discretization", pld_discretization, 0.0, 0.1, low_open=True)
    replies = int(replies_per_client(T, b, N, count=cnt))  # type: ignore[arg-type]
    if mech == "gaussian":
        if q is None:
            raise ValueError(f"{where}: q=None: the Gaussian mechanism needs q in (0, 1]")
        z = gaussian_noise_multiplier(s, q=check_real(where, "q", q, 0.0, 1.0, low_open=True),
                                      clip_l2=xi, local_size=d_i)
        return record_epsilon_for(q=float(q), z=z, steps=replies, delta=dl, accountant=acc,
                                  relation=rel, pld_discretization=disc).epsilon
    sensitivity = (2.0 if rel == "replace-one" else 1.0) * xi / d_i
    event = dp_accounting.LaplaceDpEvent(s / sensitivity)
    engine: dp_accounting.PrivacyAccountant
    if acc == "pld":
        engine = pld_privacy_accountant.PLDAccountant(value_discretization_interval=disc)
    else:
        engine = rdp_privacy_accountant.RdpAccountant()
    engine.compose(event, replies)
    return float(engine.get_epsilon(dl))
