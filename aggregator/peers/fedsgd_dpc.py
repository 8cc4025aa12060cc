"""FedSGD-DPC (paper 004): accounting, the testbed's figure, the closed-form planner, the fit.

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
* Planner: ``U(T, b)`` of Theorems 3/4, eq. 6 ``T* = sqrt(gamma^2 + (A1 + gamma Y0)/A2) -
  gamma`` and the best of ``b = 1`` and ``b = N``; :func:`plan_fedsgd_dpc`.
* :func:`fit_pilot_curves` / :func:`estimate_constants`: the convergence constants from pilot
  ``(round, loss)`` curves by least squares on the bound's form.

Units: gradients, clips and noise scales are in loss units per parameter (the averaged
gradient a client sends); epsilons in nats; ``Y0`` is a squared parameter distance. The
derivations and the paper's slips are in ``docs/peers/fedsgd-dpc.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import dp_accounting
import numpy as np
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.optimize import minimize_scalar

from testbed.core.privacy.record_accountant import record_epsilon_for

Mechanism = Literal["laplace", "gaussian"]
ReplyCount = Literal["expected", "round_robin", "worst_case"]
MECHANISMS: tuple[str, ...] = ("laplace", "gaussian")
REPLY_COUNTS: tuple[str, ...] = ("expected", "round_robin", "worst_case")
#: The Gaussian constant ``c2`` of Theorem 2 when none is given (see the module docstring).
DEFAULT_C2 = 2.0

# ------------------------------------------------------------------------------ validation


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def _real(where: str, name: str, value: object, low: float = -math.inf,
          high: float = math.inf, *, low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite float in the interval, else ``ValueError`` naming all three."""
    span = _interval(low, high, low_open or math.isinf(low), high_open or math.isinf(high))
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{where}: {name}={value!r} must be a real number in {span}")
    v = float(value)
    bad = (not math.isfinite(v) or v < low or v > high or (low_open and v == low)
           or (high_open and v == high))
    if bad:
        raise ValueError(f"{where}: {name}={value!r} is outside the allowed range {span}")
    return v


def _int(where: str, name: str, value: object, low: int, high: float = math.inf) -> int:
    span = f"[{low}, {'inf)' if math.isinf(high) else f'{int(high)}]'}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{where}: {name}={value!r} must be an integer in {span}")
    if not low <= int(value) <= high:
        raise ValueError(f"{where}: {name}={value!r} is outside the allowed range {span}")
    return int(value)


def _choice(where: str, name: str, value: object, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{where}: {name}={value!r} is not one of {tuple(allowed)}")
    return str(value)


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
    N = _int(where, "N", N, 2)
    b = _int(where, "b", b, 1, N)
    T = _int(where, "T", T, 1)
    count = _choice(where, "count", count, REPLY_COUNTS)  # type: ignore[assignment]
    if count == "expected":
        return b * T / N
    if count == "round_robin":
        return float(-(-b * T // N))
    return float(T)


def linear_composition(eps_per_reply: float, replies: float) -> float:
    """Basic composition: ``replies`` pure-DP releases of ``eps_per_reply`` each (nats)."""
    eps = _real("linear_composition", "eps_per_reply", eps_per_reply, 0.0)
    r = _real("linear_composition", "replies", replies, 0.0)
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
    s = _real(where, "scale", scale, 0.0, low_open=True)
    xi = _real(where, "clip_l1", clip_l1, 0.0, low_open=True)
    d_i = _real(where, "local_size", local_size, 0.0, low_open=True)
    return 2.0 * xi / (d_i * s)


def laplace_scale(epsilon: float, *, T: int, b: int, N: int, clip_l1: float,
                  local_size: float, count: ReplyCount = "expected") -> float:
    """Theorem 1: the Laplace scale ``2 R xi_1 / (d_i eps)`` for a total ``eps`` over ``R``.

    ``R = replies_per_client(T, b, N, count=count)``; the paper's ``count="expected"``.
    Inverse of :func:`laplace_epsilon_total`. Units as :func:`laplace_epsilon_per_reply`.
    """
    where = "laplace_scale"
    eps = _real(where, "epsilon", epsilon, 0.0, low_open=True)
    xi = _real(where, "clip_l1", clip_l1, 0.0, low_open=True)
    d_i = _real(where, "local_size", local_size, 0.0, low_open=True)
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
    eps = _real(where, "epsilon", epsilon, 0.0, low_open=True)
    dl = _real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    xi = _real(where, "clip_l2", clip_l2, 0.0, low_open=True)
    d_i = _real(where, "local_size", local_size, 0.0, low_open=True)
    c = _real(where, "c2", c2, 0.0, low_open=True)
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
    s = _real(where, "sigma", sigma, 0.0, low_open=True)
    dl = _real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    xi = _real(where, "clip_l2", clip_l2, 0.0, low_open=True)
    d_i = _real(where, "local_size", local_size, 0.0, low_open=True)
    c = _real(where, "c2", c2, 0.0, low_open=True)
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
    s = _real(where, "sigma", sigma, 0.0)
    qq = _real(where, "q", q, 0.0, 1.0, low_open=True)
    xi = _real(where, "clip_l2", clip_l2, 0.0, low_open=True)
    d_i = _real(where, "local_size", local_size, 0.0, low_open=True)
    return s * qq * d_i / xi


def moments_accountant_regime(*, q: float, noise_multiplier: float, epsilon: float,
                              delta: float) -> bool:
    """Whether Abadi et al.'s Lemma 3 conditions hold at the order their proof uses.

    ``z >= 1``, ``q < 1/(16 z)`` and ``lambda = 2 log(1/delta)/eps <= z^2 log(1/(q z))``.
    Outside this regime Theorem 2 (hence :func:`gaussian_epsilon_total`) has no proof; the
    paper's own setting (``q = 0.01``, ``b = N``, ``T = 100``, ``eps = 1``) is outside it.
    """
    where = "moments_accountant_regime"
    qq = _real(where, "q", q, 0.0, 1.0, low_open=True)
    z = _real(where, "noise_multiplier", noise_multiplier, 0.0, low_open=True)
    eps = _real(where, "epsilon", epsilon, 0.0, low_open=True)
    dl = _real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
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
        engines (:func:`~testbed.core.privacy.record_accountant.record_epsilon_for`).
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
    mech = _choice(where, "mechanism", mechanism, MECHANISMS)
    s = _real(where, "noise_scale", noise_scale, 0.0, low_open=True)
    xi = _real(where, "clip", clip, 0.0, low_open=True)
    d_i = _real(where, "local_size", local_size, 0.0, low_open=True)
    dl = _real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    acc = _choice(where, "accountant", accountant, ("pld", "rdp"))
    rel = _choice(where, "relation", relation, ("add-remove", "replace-one"))
    cnt = _choice(where, "count", count, ("round_robin", "worst_case"))
    disc = _real(where, "pld_discretization", pld_discretization, 0.0, 0.1, low_open=True)
    replies = int(replies_per_client(T, b, N, count=cnt))  # type: ignore[arg-type]
    if mech == "gaussian":
        if q is None:
            raise ValueError(f"{where}: q=None: the Gaussian mechanism needs q in (0, 1]")
        z = gaussian_noise_multiplier(s, q=_real(where, "q", q, 0.0, 1.0, low_open=True),
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


# ------------------------------------------------------------------- convergence bound


@dataclass(frozen=True)
class ConvergenceConstants:
    """The problem constants of Theorems 3 and 4.

    Attributes
    ----------
    smoothness
        ``lambda`` (often ``L``), Assumption 3, ``> 0`` (1 / parameter^2, loss units).
    strong_convexity
        ``mu``, Assumption 4, ``0 < mu <= lambda`` (the paper uses strong convexity; a PL
        constant plays the same role in the recursion ``Y_{t+1} <= (1 - mu eta) Y_t + ...``).
    grad_bound
        ``G``, Assumption 5: ``E ||grad F_i(theta, zeta)||^2 <= G^2``, ``>= 0``.
    non_iid
        ``Gamma = F* - sum_i (d_i/d) F_i*`` (Definition 4), ``>= 0``, loss units.
    initial_gap
        ``Y0 = ||theta_0 - theta*||^2``, ``>= 0``, squared parameter units.
    local_variance
        ``Lambda^2`` (Assumption 6, the same for every client), ``>= 0``; Gaussian only.
    """

    smoothness: float
    strong_convexity: float
    grad_bound: float
    non_iid: float
    initial_gap: float
    local_variance: float = 0.0

    def __post_init__(self) -> None:
        where = "ConvergenceConstants"
        lam = _real(where, "smoothness", self.smoothness, 0.0, low_open=True)
        checked = {
            "smoothness": lam,
            "strong_convexity": _real(where, "strong_convexity", self.strong_convexity, 0.0,
                                      lam, low_open=True),
            "grad_bound": _real(where, "grad_bound", self.grad_bound, 0.0),
            "non_iid": _real(where, "non_iid", self.non_iid, 0.0),
            "initial_gap": _real(where, "initial_gap", self.initial_gap, 0.0),
            "local_variance": _real(where, "local_variance", self.local_variance, 0.0),
        }
        for name, value in checked.items():  # plain floats, not numpy scalars
            object.__setattr__(self, name, value)

    @property
    def gamma(self) -> float:
        """``gamma = 2 lambda / mu >= 2`` (Theorem 3's learning-rate offset)."""
        return 2.0 * self.smoothness / self.strong_convexity

    def learning_rate(self, t: int) -> float:
        """Theorem 3's step size ``eta_t = 2 / (mu (t + gamma))``; ``eta_0 = 1 / lambda``."""
        return 2.0 / (self.strong_convexity * (_int("learning_rate", "t", t, 0) + self.gamma))

    def to_dict(self) -> dict[str, float]:
        """Plain floats, with ``gamma``."""
        return {"smoothness": self.smoothness, "strong_convexity": self.strong_convexity,
                "grad_bound": self.grad_bound, "non_iid": self.non_iid,
                "initial_gap": self.initial_gap, "local_variance": self.local_variance,
                "gamma": self.gamma}


@dataclass(frozen=True)
class _Problem:
    """A validated planning problem (one place for the argument checks)."""

    mechanism: str
    epsilon: float
    delta: float
    N: int
    constants: ConvergenceConstants
    dim: int
    n_samples: float
    clip: float
    q: float
    c2: float

    @property
    def local_size(self) -> float:
        return self.n_samples / self.N


def _problem(where: str, epsilon: object, delta: object, N: object, mechanism: object,
             constants: object, dim: object, n_samples: object, clip: object,
             q: object, c2: object) -> _Problem:
    mech = _choice(where, "mechanism", mechanism, MECHANISMS)
    if not isinstance(constants, ConvergenceConstants):
        raise ValueError(f"{where}: constants={constants!r} must be a ConvergenceConstants")
    n = _int(where, "N", N, 2)
    d = _real(where, "n_samples", n_samples, 0.0, low_open=True)
    if mech == "gaussian":
        dl = _real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
        if q is None:
            raise ValueError(f"{where}: q=None: the Gaussian mechanism needs q in (0, 1]")
        qq = _real(where, "q", q, 0.0, 1.0, low_open=True)
    else:
        _real(where, "delta", delta, 0.0, 1.0, high_open=True)
        dl, qq = 0.0, 1.0  # pure DP, full batch (the paper's q = 1 for Laplace)
    return _Problem(mechanism=mech,
                    epsilon=_real(where, "epsilon", epsilon, 0.0, low_open=True),
                    delta=dl, N=n, constants=constants, dim=_int(where, "dim", dim, 1),
                    n_samples=d, clip=_real(where, "clip", clip, 0.0, low_open=True),
                    q=qq, c2=_real(where, "c2", c2, 0.0, low_open=True))


def _sampling_term(b: int, N: int) -> float:
    """``(N - b) / ((N - 1) b)``: Lemma 2's client-sampling variance factor (no ``2 G^2``)."""
    return (N - b) / ((N - 1) * b)


def _noise_kappa(pb: _Problem) -> float:
    """``kappa`` with noise term ``kappa x / mu^2`` (x = b T^2/eps^2 or T log(1/delta)/eps^2)."""
    if pb.mechanism == "laplace":
        return 32.0 * pb.dim * pb.clip**2 / pb.n_samples**2
    return 4.0 * pb.c2**2 * pb.dim * pb.clip**2 * pb.N / pb.n_samples**2


def _head(pb: _Problem, b: int) -> float:
    """``4 omega_0 / mu^2 + gamma Y0`` (``A1 + gamma Y0`` for Laplace), b-dependent part."""
    c = pb.constants
    omega0 = 2.0 * _sampling_term(b, pb.N) * c.grad_bound**2 + 2.0 * c.smoothness * c.non_iid
    if pb.mechanism == "gaussian":
        omega0 += c.local_variance / (pb.q * pb.n_samples)  # sum_i d_i Lambda^2 / (q d^2)
    return 4.0 * omega0 / c.strong_convexity**2 + c.gamma * c.initial_gap


def _objective(pb: _Problem, T: float, b: int) -> float:
    c = pb.constants
    kappa = _noise_kappa(pb) / c.strong_convexity**2
    if pb.mechanism == "laplace":
        noise = kappa * b * T * T / pb.epsilon**2
    else:
        noise = kappa * T * math.log(1.0 / pb.delta) / pb.epsilon**2
    return (_head(pb, b) + noise) / (T + c.gamma)


def laplace_coefficients(b: int, *, epsilon: float, N: int, constants: ConvergenceConstants,
                         dim: int, n_samples: float, clip_l1: float) -> tuple[float, float]:
    """``(A1, A2)`` of Section V-B for a fixed ``b`` (every client at the same ``eps``).

    ``A1 = (4/mu^2)(2 (N-b)/(N-1) G^2/b + 2 lambda Gamma)`` and
    ``A2 = (32/mu^2) p b xi_1^2 / (N d^2) sum_i 1/eps_i^2 = 32 p b xi_1^2 / (mu^2 d^2 eps^2)``,
    so that ``U(T) = (A1 + A2 T^2 + gamma Y0) / (T + gamma)``. ``n_samples`` is ``d``, the
    records of all clients together; ``dim`` is ``p``.
    """
    pb = _problem("laplace_coefficients", epsilon, 0.0, N, "laplace", constants, dim,
                  n_samples, clip_l1, None, DEFAULT_C2)
    b = _int("laplace_coefficients", "b", b, 1, pb.N)
    a1 = _head(pb, b) - constants.gamma * constants.initial_gap
    a2 = _noise_kappa(pb) * b / (constants.strong_convexity**2 * pb.epsilon**2)
    return a1, a2


def optimal_rounds(A1: float, A2: float, gamma: float, initial_gap: float) -> float:
    """Eq. 6: ``T* = sqrt(gamma^2 + (A1 + gamma Y0) / A2) - gamma`` (continuous, ``>= 0``).

    The stationary point of the convex ``U(T) = (A1 + A2 T^2 + gamma Y0)/(T + gamma)``.
    ``A1 >= 0``, ``A2 > 0``, ``gamma > 0``, ``initial_gap = Y0 >= 0``.
    """
    where = "optimal_rounds"
    a1 = _real(where, "A1", A1, 0.0)
    a2 = _real(where, "A2", A2, 0.0, low_open=True)
    g = _real(where, "gamma", gamma, 0.0, low_open=True)
    y0 = _real(where, "initial_gap", initial_gap, 0.0)
    return math.sqrt(g * g + (a1 + g * y0) / a2) - g


def optimal_clients_fixed_rounds(T: int, *, epsilon: float, N: int,
                                 constants: ConvergenceConstants, dim: int,
                                 n_samples: float, clip_l1: float) -> float:
    """Laplace, ``T`` fixed: the continuous ``b* = sqrt(B1 / B2)`` of Section V-B.

    ``= G N d / (2 T xi_1) / sqrt(p (N - 1) sum_i 1/eps_i^2)``, not clamped to ``[1, N]``;
    Table I's "b* (fix T = 50)" column is its ceiling.
    """
    pb = _problem("optimal_clients_fixed_rounds", epsilon, 0.0, N, "laplace", constants, dim,
                  n_samples, clip_l1, None, DEFAULT_C2)
    T = _int("optimal_clients_fixed_rounds", "T", T, 1)
    sum_inv = pb.N / pb.epsilon**2
    return (constants.grad_bound * pb.N * pb.n_samples / (2.0 * T * pb.clip)
            / math.sqrt(pb.dim * (pb.N - 1) * sum_inv))


def objective_bound(T: int, b: int, *, epsilon: float, delta: float, N: int,
                    mechanism: Mechanism, constants: ConvergenceConstants, dim: int,
                    n_samples: float, clip: float, q: float | None = None,
                    c2: float = DEFAULT_C2) -> float:
    """``U(T, b)``: Theorem 3 (Laplace) or 4 (Gaussian) at ``t = T``, squared param units.

    Laplace: ``(A1(b) + gamma Y0 + A2(b) T^2) / (T + gamma)``. Gaussian:
    ``(4 omega_0'(b)/mu^2 + gamma Y0 + E3 T) / (T + gamma)`` with
    ``E3 = (4/mu^2) c2^2 p xi_2^2 N log(1/delta) / (d^2 eps^2)``, the printed
    ``E1/(b(T+gamma)) + E2/(T+gamma) + E3``. ``T >= 0`` (``T = 0``: the bound before training).
    """
    pb = _problem("objective_bound", epsilon, delta, N, mechanism, constants, dim, n_samples,
                  clip, q, c2)
    return _objective(pb, _int("objective_bound", "T", T, 0),
                      _int("objective_bound", "b", b, 1, pb.N))


# ------------------------------------------------------------------------------ planner


@dataclass(frozen=True)
class DpcPlan:
    """A FedSGD-DPC plan: rounds, clients per round, noise and what the paper says it costs.

    Attributes
    ----------
    mechanism
        ``"laplace"`` or ``"gaussian"``.
    T, b, N
        Rounds (queries), clients per round, clients.
    epsilon, delta
        The per-client target over the run (``delta = 0`` for Laplace: pure DP).
    replies_per_client
        ``b T / N``, the count the paper composes over.
    max_replies_per_client
        ``ceil(b T / N)``: the most any client replies under round robin.
    noise_scale
        Laplace scale or Gaussian std per coordinate on the averaged gradient.
    eps_per_reply
        Laplace: ``eps / R``; Gaussian: ``eps / sqrt(R)`` (the paper's sqrt composition).
    eps_total_paper
        The paper's accounting at ``noise_scale`` over ``b T / N`` replies (= ``epsilon``).
    eps_total_round_robin
        The same formula over ``ceil(b T / N)`` replies (``>= epsilon``).
    objective_bound
        ``U(T, b)`` (squared parameter units).
    T_continuous
        Laplace: eq. 6 at the chosen ``b``; Gaussian: ``inf`` (U falls with T) or ``0``.
    candidates
        ``(b, T, U)`` for each ``b`` examined.
    """

    mechanism: str
    T: int
    b: int
    N: int
    epsilon: float
    delta: float
    replies_per_client: float
    max_replies_per_client: int
    noise_scale: float
    eps_per_reply: float
    eps_total_paper: float
    eps_total_round_robin: float
    objective_bound: float
    T_continuous: float
    candidates: tuple[tuple[int, int, float], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``candidates`` as a list of dicts)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["candidates"] = [{"b": b, "T": t, "objective_bound": u}
                             for b, t, u in self.candidates]
        return out


def _integer_rounds(pb: _Problem, b: int, t_cont: float) -> int:
    """The integer ``T >= 1`` minimising the convex ``U(., b)``: floor or ceil of ``T*``."""
    lo = max(1, math.floor(t_cont))
    return min((lo, lo + 1), key=lambda t: (_objective(pb, t, b), t))


def plan_fedsgd_dpc(epsilon: float, delta: float, N: int, mechanism: Mechanism = "laplace",
                    constants: ConvergenceConstants | None = None, *, dim: int,
                    n_samples: float, clip: float, q: float | None = None,
                    c2: float = DEFAULT_C2, T_fixed: int | None = None,
                    b_search: Literal["paper", "all"] = "paper") -> DpcPlan:
    """Choose ``T`` and ``b`` by the paper's rules and calibrate the noise.

    Parameters
    ----------
    epsilon
        Every client's budget over the run, nats, ``> 0``.
    delta
        Gaussian: ``0 < delta < 1``. Laplace: in ``[0, 1)``, unused (pure DP).
    N
        Clients, ``>= 2``.
    mechanism
        ``"laplace"`` or ``"gaussian"``.
    constants
        :class:`ConvergenceConstants` (required).
    dim
        ``p``, model parameters.
    n_samples
        ``d``, records of all clients (each holds ``d / N``, the paper's equal ``d_i``).
    clip
        ``xi_1`` (l1, Laplace) or ``xi_2`` (l2, Gaussian).
    q
        Record sampling rate (Gaussian only, required there).
    c2
        Theorem 2's constant (Gaussian).
    T_fixed
        Rounds to use instead of eq. 6; required for the Gaussian, whose bound is monotone
        in ``T`` (``T* = inf`` or ``0``; the paper fixes ``T = 100``).
    b_search
        ``"paper"``: the better of ``b = 1`` and ``b = N`` (Section V-B's KKT analysis: with
        continuous ``T`` there is no interior optimum). ``"all"``: every ``b`` in ``1..N``;
        differs only when the integer ``T >= 1`` binds (``T*`` near 1), where ``U(1, b)`` is
        convex in ``b`` with an interior minimum.

    Returns
    -------
    DpcPlan
        Laplace ``T`` is the integer ``>= 1`` next to eq. 6 with the lower bound; ties go to
        the smaller ``b`` (fewer replies).
    """
    where = "plan_fedsgd_dpc"
    if constants is None:
        raise ValueError(f"{where}: constants=None: a ConvergenceConstants is required")
    pb = _problem(where, epsilon, delta, N, mechanism, constants, dim, n_samples, clip, q, c2)
    t_fix = None if T_fixed is None else _int(where, "T_fixed", T_fixed, 1)
    search = _choice(where, "b_search", b_search, ("paper", "all"))
    gamma = constants.gamma
    cands: list[tuple[int, int, float, float]] = []
    for b in (sorted({1, pb.N}) if search == "paper" else range(1, pb.N + 1)):
        if pb.mechanism == "laplace":
            a1 = _head(pb, b) - gamma * constants.initial_gap
            a2 = _noise_kappa(pb) * b / (constants.strong_convexity**2 * pb.epsilon**2)
            t_cont = optimal_rounds(a1, a2, gamma, constants.initial_gap)
        else:
            e3 = (_noise_kappa(pb) * math.log(1.0 / pb.delta)
                  / (constants.strong_convexity * pb.epsilon) ** 2)
            t_cont = math.inf if _head(pb, b) > gamma * e3 else 0.0
            if t_fix is None:
                raise ValueError(
                    f"{where}: T_fixed=None: for the Gaussian mechanism the bound is monotone "
                    f"in T (T* = {t_cont}); give T_fixed >= 1 (the paper uses 100)")
        t_int = t_fix if t_fix is not None else _integer_rounds(pb, b, t_cont)
        cands.append((b, t_int, _objective(pb, t_int, b), t_cont))
    b_best, t_best, u_best, t_cont_best = min(cands, key=lambda c: (c[2], c[0]))
    r = replies_per_client(t_best, b_best, pb.N)
    r_max = int(replies_per_client(t_best, b_best, pb.N, count="round_robin"))
    d_i = pb.local_size
    if pb.mechanism == "laplace":
        scale = laplace_scale(pb.epsilon, T=t_best, b=b_best, N=pb.N, clip_l1=pb.clip,
                              local_size=d_i)
        per = laplace_epsilon_per_reply(scale, clip_l1=pb.clip, local_size=d_i)
        total = linear_composition(per, r)
        total_rr = linear_composition(per, r_max)
    else:
        scale = gaussian_sigma(pb.epsilon, pb.delta, T=t_best, b=b_best, N=pb.N,
                               clip_l2=pb.clip, local_size=d_i, c2=pb.c2)
        per = gaussian_epsilon_per_reply(scale, pb.delta, clip_l2=pb.clip, local_size=d_i,
                                         c2=pb.c2)
        total = per * math.sqrt(r)
        total_rr = per * math.sqrt(r_max)
    return DpcPlan(mechanism=pb.mechanism, T=t_best, b=b_best, N=pb.N, epsilon=pb.epsilon,
                   delta=pb.delta, replies_per_client=r, max_replies_per_client=r_max,
                   noise_scale=scale, eps_per_reply=per, eps_total_paper=total,
                   eps_total_round_robin=total_rr, objective_bound=u_best,
                   T_continuous=t_cont_best,
                   candidates=tuple((b, t, u) for b, t, u, _ in cands))


# ------------------------------------------------------------------ constants from pilots


@dataclass(frozen=True)
class PilotCurve:
    """One pilot run: the planned ``T`` and ``b``, the budget, and the observed curve.

    Attributes
    ----------
    rounds
        Rounds ``t`` observed, integers in ``[0, T]``.
    values
        The observable at those rounds (loss, or ``||theta_t - theta*||^2``), finite.
    b, T
        Clients per round and *planned* total rounds (the noise was calibrated for ``T``).
    epsilon
        The run's per-client budget (nats).
    """

    rounds: tuple[int, ...]
    values: tuple[float, ...]
    b: int
    T: int
    epsilon: float

    def __post_init__(self) -> None:
        where = "PilotCurve"
        T = _int(where, "T", self.T, 1)
        _int(where, "b", self.b, 1)
        _real(where, "epsilon", self.epsilon, 0.0, low_open=True)
        rounds = tuple(_int(where, "rounds[]", t, 0, T) for t in self.rounds)
        values = tuple(_real(where, "values[]", v) for v in self.values)
        if len(rounds) != len(values) or not rounds:
            raise ValueError(f"{where}: rounds and values must be non-empty and of equal "
                             f"length (got {len(rounds)} and {len(values)})")
        object.__setattr__(self, "rounds", rounds)
        object.__setattr__(self, "values", values)


@dataclass(frozen=True)
class PilotFit:
    """Result of :func:`fit_pilot_curves`.

    Attributes
    ----------
    constants
        The fitted :class:`ConvergenceConstants` (effective: the bound treated as equality).
    optimum_loss
        ``F*`` (fitted, or as given; ``0`` for the distance observable).
    rms_residual
        Root-mean-square residual of the fit, in the observable's units.
    coefficients
        ``(alpha, beta, c)``: the fitted lumped coefficients of ``r_b``, ``1`` and ``x``.
    """

    constants: ConvergenceConstants
    optimum_loss: float
    rms_residual: float
    coefficients: tuple[float, float, float]


def _design(pb: _Problem, curves: Sequence[PilotCurve], gamma: float,
            fit_offset: bool) -> tuple[np.ndarray, np.ndarray]:
    rows, ys = [], []
    for cv in curves:
        r_b = _sampling_term(cv.b, pb.N)
        if pb.mechanism == "laplace":
            x = cv.b * cv.T**2 / cv.epsilon**2
        else:
            x = cv.T * math.log(1.0 / pb.delta) / cv.epsilon**2
        for t, v in zip(cv.rounds, cv.values, strict=True):
            w = 1.0 / (t + gamma)
            rows.append(([1.0] if fit_offset else []) + [r_b * w, w, x * w])
            ys.append(v)
    return np.asarray(rows, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _solve(a: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(a / scale, y, rcond=None)
    coef = coef / scale
    resid = y - a @ coef
    return coef, float(np.dot(resid, resid))


def fit_pilot_curves(curves: Sequence[PilotCurve], *, N: int, dim: int, n_samples: float,
                     clip: float, mechanism: Mechanism = "laplace", delta: float = 0.0,
                     q: float | None = None, c2: float = DEFAULT_C2,
                     initial_gap: float | None = None, non_iid: float | None = None,
                     local_variance: float = 0.0,
                     observable: Literal["loss", "distance"] = "loss",
                     optimum_loss: float | None = None,
                     gamma_range: tuple[float, float] = (2.0, 1e4)) -> PilotFit:
    """Fit the convergence constants to pilot curves by least squares on the bound's form.

    Model (Theorems 3/4 with ``<=`` read as ``=``), for a pilot with ``(b, T, eps)``::

        Y_t = [ u r_b + v + (kappa / mu^2) x ] / (t + gamma)
        r_b = (N - b)/((N - 1) b),  u = 8 G^2 / mu^2,
        v = 8 lambda Gamma / mu^2 + 4 Lambda^2 / (mu^2 q d) [Gaussian] + gamma Y0,
        x = b T^2 / eps^2, kappa = 32 p xi_1^2 / d^2          (Laplace)
        x = T log(1/delta) / eps^2, kappa = 4 c2^2 p xi_2^2 N / d^2   (Gaussian)

    ``observable="distance"``: ``values`` are ``Y_t``. ``"loss"``: ``values`` are losses,
    modelled as ``F* + (lambda/2) Y_t`` (smoothness at the optimum), ``lambda/2 = gamma mu/4``.
    For each ``gamma`` the coefficients (and ``F*``) are linear least squares; ``gamma`` is
    found by a log-grid search refined with a bounded scalar minimiser. Then ``mu`` follows
    from the noise coefficient (``kappa`` is known), ``lambda = gamma mu / 2``, ``G`` from
    ``u``, and ``v`` gives whichever of ``Y0`` and ``Gamma`` is not given (the paper
    estimates both from clients' local optima; the curves only see their combination).

    Parameters
    ----------
    curves
        At least three pilots whose ``(r_b, x)`` are not collinear (e.g. two values of ``b``
        and two budgets), each with at least two rounds.
    N, dim, n_samples, clip, mechanism, delta, q, c2
        As :func:`plan_fedsgd_dpc` (``delta`` and ``q`` needed for the Gaussian).
    initial_gap, non_iid
        Exactly one of the two must be given (``>= 0``); the other is solved for.
    local_variance
        ``Lambda^2`` (Gaussian), taken as known.
    observable
        ``"loss"`` or ``"distance"``.
    optimum_loss
        ``F*`` if known (``"loss"`` only); ``None`` fits it.
    gamma_range
        Search interval for ``gamma`` (``2 <= low < high``; ``gamma >= 2`` iff ``mu <= lambda``).

    Returns
    -------
    PilotFit
    """
    where = "fit_pilot_curves"
    pb = _problem(where, 1.0, delta, N, mechanism, ConvergenceConstants(1.0, 1.0, 0.0, 0.0, 0.0),
                  dim, n_samples, clip, q, c2)
    obs = _choice(where, "observable", observable, ("loss", "distance"))
    if (initial_gap is None) == (non_iid is None):
        raise ValueError(f"{where}: give exactly one of initial_gap={initial_gap!r} and "
                         f"non_iid={non_iid!r}; the curves identify only their combination")
    y0_known = None if initial_gap is None else _real(where, "initial_gap", initial_gap, 0.0)
    gm_known = None if non_iid is None else _real(where, "non_iid", non_iid, 0.0)
    lam2 = _real(where, "local_variance", local_variance, 0.0)
    if len(gamma_range) != 2:
        raise ValueError(f"{where}: gamma_range={gamma_range!r} must be (low, high)")
    g_lo = _real(where, "gamma_range[0]", gamma_range[0], 2.0)
    g_hi = _real(where, "gamma_range[1]", gamma_range[1], g_lo, low_open=True)
    curves = list(curves)
    for cv in curves:
        if not isinstance(cv, PilotCurve):
            raise ValueError(f"{where}: curves contains {cv!r}, not a PilotCurve")
        _int(where, "curve.b", cv.b, 1, pb.N)
    fit_offset = obs == "loss" and optimum_loss is None
    f_star = 0.0 if obs == "distance" or optimum_loss is None else _real(
        where, "optimum_loss", optimum_loss)
    if obs == "distance" and optimum_loss is not None:
        raise ValueError(f"{where}: optimum_loss={optimum_loss!r} applies only to "
                         "observable='loss'")
    shifted = [PilotCurve(cv.rounds, tuple(v - f_star for v in cv.values), cv.b, cv.T,
                          cv.epsilon) for cv in curves]
    a_probe, _ = _design(pb, shifted, g_lo, fit_offset)
    if len(curves) < 3 or np.linalg.matrix_rank(a_probe) < a_probe.shape[1]:
        raise ValueError(
            f"{where}: {len(curves)} curve(s) do not identify the model: need >= 3 pilots "
            "whose (b, noise level) are not collinear (two values of b and two budgets), "
            "each with >= 2 rounds")

    def rss(log_g: float) -> float:
        return _solve(*_design(pb, shifted, math.exp(log_g), fit_offset))[1]

    grid = np.linspace(math.log(g_lo), math.log(g_hi), 121)
    vals = [rss(float(g)) for g in grid]
    k = int(np.argmin(vals))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    res = minimize_scalar(rss, bounds=(float(lo), float(hi)), method="bounded",
                          options={"xatol": 1e-10})
    log_g = float(res.x) if res.fun <= vals[k] else float(grid[k])
    gamma = math.exp(log_g)
    a, y = _design(pb, shifted, gamma, fit_offset)
    coef, ss = _solve(a, y)
    if fit_offset:
        f_star, coef = float(coef[0]), coef[1:]
    alpha, beta, c = (float(v) for v in coef)
    kappa = _noise_kappa(pb)
    if c <= 0:
        raise ValueError(f"{where}: fitted noise coefficient c={c:g} <= 0: the pilots show no "
                         "privacy-noise effect, so mu is not identified (vary b T^2/eps^2)")
    # c = s kappa / mu^2 with the observable's scale s: 1 (distance) or lambda/2 = gamma mu/4
    mu = gamma * kappa / (4.0 * c) if obs == "loss" else math.sqrt(kappa / c)
    s = gamma * mu / 4.0 if obs == "loss" else 1.0
    lam = gamma * mu / 2.0
    u, v = alpha / s, beta / s
    if u < 0:
        raise ValueError(f"{where}: fitted sampling coefficient u={u:g} < 0 (G^2 < 0): the "
                         "curves do not follow the bound's b-dependence")
    v -= 4.0 * lam2 / (mu**2 * pb.q * pb.n_samples) if pb.mechanism == "gaussian" else 0.0
    if y0_known is not None:
        y0, gm = y0_known, (v - gamma * y0_known) * mu**2 / (8.0 * lam)
        solved, value = "non_iid", gm
    else:
        gm = float(gm_known)  # type: ignore[arg-type]
        y0 = (v - 8.0 * lam * gm / mu**2) / gamma
        solved, value = "initial_gap", y0
    if value < 0:
        raise ValueError(f"{where}: solved {solved}={value:g} < 0: the given "
                         f"{'initial_gap' if solved == 'non_iid' else 'non_iid'} is larger "
                         "than the curves allow")
    const = ConvergenceConstants(smoothness=lam, strong_convexity=mu,
                                 grad_bound=math.sqrt(u * mu**2 / 8.0), non_iid=gm,
                                 initial_gap=y0, local_variance=lam2)
    return PilotFit(constants=const, optimum_loss=f_star,
                    rms_residual=math.sqrt(ss / len(y)), coefficients=(alpha, beta, c))


def estimate_constants(curves: Sequence[PilotCurve], **kwargs: Any) -> ConvergenceConstants:
    """:func:`fit_pilot_curves` (same keyword arguments), returning only the constants."""
    return fit_pilot_curves(curves, **kwargs).constants
