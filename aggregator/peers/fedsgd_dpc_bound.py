"""FedSGD-DPC (paper 004): the convergence bound ``U(T, b)`` of Theorems 3/4 and eq. 6.

The problem constants (:class:`ConvergenceConstants`), the validated planning problem the
planner (:mod:`aggregator.peers.fedsgd_dpc`) and the pilot fit
(:mod:`aggregator.peers.fedsgd_dpc_pilot_fit`) share, Section V-B's ``(A1, A2)``, eq. 6
``T* = sqrt(gamma^2 + (A1 + gamma Y0)/A2) - gamma``, the continuous ``b*`` for a fixed ``T``
and the bound itself. Pure functions, no randomness.

Units: ``Y0`` and the bound are squared parameter distances; gradients and clips in loss
units per parameter; epsilons in nats. Derivations: ``docs/peers/fedsgd-dpc.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aggregator.peers.checks import check_choice, check_int, check_real
from aggregator.peers.fedsgd_dpc_accounting import (
    DEFAULT_C2,
    MECHANISMS,
    Mechanism,
)

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
        lam = check_real(where, "smoothness", self.smoothness, 0.0, low_open=True)
        checked = {
            "smoothness": lam,
            "strong_convexity": check_real(where, "strong_convexity", self.strong_convexity, 0.0,
                                           lam, low_open=True),
            "grad_bound": check_real(where, "grad_bound", self.grad_bound, 0.0),
            "non_iid": check_real(where, "non_iid", self.non_iid, 0.0),
            "initial_gap": check_real(where, "initial_gap", self.initial_gap, 0.0),
            "local_variance": check_real(where, "local_variance", self.local_variance, 0.0),
        }
        for name, value in checked.items():  # plain floats, not numpy scalars
            object.__setattr__(self, name, value)

    @property
    def gamma(self) -> float:
        """``gamma = 2 lambda / mu >= 2`` (Theorem 3's learning-rate offset)."""
        return 2.0 * self.smoothness / self.strong_convexity

    def learning_rate(self, t: int) -> float:
        """Theorem 3's step size ``eta_t = 2 / (mu (t + gamma))``; ``eta_0 = 1 / lambda``."""
        return 2.0 / (self.strong_convexity * (check_int("learning_rate", "t", t, 0) + self.gamma))

    def to_dict(self) -> dict[str, float]:
        """Plain floats, with ``gamma``."""
        return {"smoothness": self.smoothness, "strong_convexity": self.strong_convexity,
                "grad_bound": self.grad_bound, "non_iid": self.non_iid,
                "initial_gap": self.initial_gap, "local_variance": self.local_variance,
                "gamma": self.gamma}


@dataclass(frozen=True)
class PlanningProblem:
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


def planning_problem(where: str, epsilon: object, delta: object, N: object, mechanism: object,
                     constants: object, dim: object, n_samples: object, clip: object,
                     q: object, c2: object) -> PlanningProblem:
    """The arguments of a planning call, checked (``ValueError`` naming ``where``), as a
    :class:`PlanningProblem`; pure DP (``laplace``) takes ``delta = 0`` and ``q = 1``."""
    mech = check_choice(where, "mechanism", mechanism, MECHANISMS)
    if not isinstance(constants, ConvergenceConstants):
        raise ValueError(f"{where}: constants={constants!r} must be a ConvergenceConstants")
    n = check_int(where, "N", N, 2)
    d = check_real(where, "n_samples", n_samples, 0.0, low_open=True)
    if mech == "gaussian":
        dl = check_real(where, "delta", delta, 0.0, 1.0, low_open=True, high_open=True)
        if q is None:
            raise ValueError(f"{where}: q=None: the Gaussian mechanism needs q in (0, 1]")
        qq = check_real(where, "q", q, 0.0, 1.0, low_open=True)
    else:
        check_real(where, "delta", delta, 0.0, 1.0, high_open=True)
        dl, qq = 0.0, 1.0  # pure DP, full batch (the paper's q = 1 for Laplace)
    return PlanningProblem(mechanism=mech,
                           epsilon=check_real(where, "epsilon", epsilon, 0.0, low_open=True),
                           delta=dl, N=n, constants=constants, dim=check_int(where, "dim", dim, 1),
                           n_samples=d, clip=check_real(where, "clip", clip, 0.0, low_open=True),
                           q=qq, c2=check_real(where, "c2", c2, 0.0, low_open=True))


def sampling_term(b: int, N: int) -> float:
    """``(N - b) / ((N - 1) b)``: Lemma 2's client-sampling variance factor (no ``2 G^2``)."""
    return (N - b) / ((N - 1) * b)


def noise_kappa(pb: PlanningProblem) -> float:
    """``kappa`` with noise term ``kappa x / mu^2`` (x = b T^2/eps^2 or T log(1/delta)/eps^2)."""
    if pb.mechanism == "laplace":
        return 32.0 * pb.dim * pb.clip**2 / pb.n_samples**2
    return 4.0 * pb.c2**2 * pb.dim * pb.clip**2 * pb.N / pb.n_samples**2


def head_term(pb: PlanningProblem, b: int) -> float:
    """``4 omega_0 / mu^2 + gamma Y0`` (``A1 + gamma Y0`` for Laplace), b-dependent part."""
    c = pb.constants
    omega0 = 2.0 * sampling_term(b, pb.N) * c.grad_bound**2 + 2.0 * c.smoothness * c.non_iid
    if pb.mechanism == "gaussian":
        omega0 += c.local_variance / (pb.q * pb.n_samples)  # sum_i d_i Lambda^2 / (q d^2)
    return 4.0 * omega0 / c.strong_convexity**2 + c.gamma * c.initial_gap


def objective(pb: PlanningProblem, T: float, b: int) -> float:
    """``(head_term(pb, b) + noise) / (T + gamma)``: the convergence bound after ``T`` rounds
    with ``b`` devices a round, the mechanism's noise included (what the planners minimise)."""
    c = pb.constants
    kappa = noise_kappa(pb) / c.strong_convexity**2
    if pb.mechanism == "laplace":
        noise = kappa * b * T * T / pb.epsilon**2
    else:
        noise = kappa * T * math.log(1.0 / pb.delta) / pb.epsilon**2
    return (head_term(pb, b) + noise) / (T + c.gamma)


def laplace_coefficients(b: int, *, epsilon: float, N: int, constants: ConvergenceConstants,
                         dim: int, n_samples: float, clip_l1: float) -> tuple[float, float]:
    """``(A1, A2)`` of Section V-B for a fixed ``b`` (every client at the same ``eps``).

    ``A1 = (4/mu^2)(2 (N-b)/(N-1) G^2/b + 2 lambda Gamma)`` and
    ``A2 = (32/mu^2) p b xi_1^2 / (N d^2) sum_i 1/eps_i^2 = 32 p b xi_1^2 / (mu^2 d^2 eps^2)``,
    so that ``U(T) = (A1 + A2 T^2 + gamma Y0) / (T + gamma)``. ``n_samples`` is ``d``, the
    records of all clients together; ``dim`` is ``p``.
    """
    pb = planning_problem("laplace_coefficients", epsilon, 0.0, N, "laplace", constants, dim,
                          n_samples, clip_l1, None, DEFAULT_C2)
    b = check_int("laplace_coefficients", "b", b, 1, pb.N)
    a1 = head_term(pb, b) - constants.gamma * constants.initial_gap
    a2 = noise_kappa(pb) * b / (constants.strong_convexity**2 * pb.epsilon**2)
    return a1, a2


def optimal_rounds(A1: float, A2: float, gamma: float, initial_gap: float) -> float:
    """Eq. 6: ``T* = sqrt(gamma^2 + (A1 + gamma Y0) / A2) - gamma`` (continuous, ``>= 0``).

    The stationary point of the convex ``U(T) = (A1 + A2 T^2 + gamma Y0)/(T + gamma)``.
    ``A1 >= 0``, ``A2 > 0``, ``gamma > 0``, ``initial_gap = Y0 >= 0``.
    """
    where = "optimal_rounds"
    a1 = check_real(where, "A1", A1, 0.0)
    a2 = check_real(where, "A2", A2, 0.0, low_open=True)
    g = check_real(where, "gamma", gamma, 0.0, low_open=True)
    y0 = check_real(where, "initial_gap", initial_gap, 0.0)
    return math.sqrt(g * g + (a1 + g * y0) / a2) - g


def optimal_clients_fixed_rounds(T: int, *, epsilon: float, N: int,
                                 constants: ConvergenceConstants, dim: int,
                                 n_samples: float, clip_l1: float) -> float:
    """Laplace, ``T`` fixed: the continuous ``b* = sqrt(B1 / B2)`` of Section V-B.

    ``= G N d / (2 T xi_1) / sqrt(p (N - 1) sum_i 1/eps_i^2)``, not clamped to ``[1, N]``;
    Table I's "b* (fix T = 50)" column is its ceiling.
    """
    pb = planning_problem("optimal_clients_fixed_rounds", epsilon, 0.0, N, "laplace", constants,
                          dim, n_samples, clip_l1, None, DEFAULT_C2)
    T = check_int("optimal_clients_fixed_rounds", "T", T, 1)
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
    pb = planning_problem("objective_bound", epsilon, delta, N, mechanism, constants, dim,
                          n_samples, clip, q, c2)
    return objective(pb, check_int("objective_bound", "T", T, 0),
                     check_int("objective_bound", "b", b, 1, pb.N))
