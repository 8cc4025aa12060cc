"""FedSGD-DPC (paper 004): the closed-form planner of rounds ``T`` and clients ``b``.

Zhou, Liu, Fu, Wu, Li, Yu, "Optimizing the Numbers of Queries and Replies in Federated
Learning with Differential Privacy". Each of ``T`` rounds the server queries ``b`` of ``N``
clients; a client replies with one local gradient step plus noise, ``R = b T / N`` times in
expectation. Everything here is a pure function of its arguments; randomness never enters.

* Planner: ``U(T, b)`` of Theorems 3/4, eq. 6 ``T* = sqrt(gamma^2 + (A1 + gamma Y0)/A2) -
  gamma`` and the best of ``b = 1`` and ``b = N``; :func:`plan_fedsgd_dpc`, whose
  :class:`DpcPlan` carries the calibrated noise and the paper's epsilon.

The rest of the scheme: the paper's accounting and the testbed's figure in
:mod:`aggregator.peers.fedsgd_dpc_accounting`, the bound and eq. 6 in
:mod:`aggregator.peers.fedsgd_dpc_bound`, the convergence constants fitted to pilot curves
in :mod:`aggregator.peers.fedsgd_dpc_pilot_fit`. The derivations and the paper's slips are
in ``docs/peers/fedsgd-dpc.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from aggregator.peers.checks import check_choice, check_int
from aggregator.peers.fedsgd_dpc_accounting import (
    DEFAULT_C2,
    Mechanism,
    gaussian_epsilon_per_reply,
    gaussian_sigma,
    laplace_epsilon_per_reply,
    laplace_scale,
    linear_composition,
    replies_per_client,
)
from aggregator.peers.fedsgd_dpc_bound import (
    ConvergenceConstants,
    PlanningProblem,
    head_term,
    noise_kappa,
    objective,
    optimal_rounds,
    planning_problem,
)

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


def _integer_rounds(pb: PlanningProblem, b: int, t_cont: float) -> int:
    """The integer ``T >= 1`` minimising the convex ``U(., b)``: floor or ceil of ``T*``."""
    lo = max(1, math.floor(t_cont))
    return min((lo, lo + 1), key=lambda t: (objective(pb, t, b), t))


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
    pb = planning_problem(where, epsilon, delta, N, mechanism, constants, dim, n_samples, clip,
                          q, c2)
    t_fix = None if T_fixed is None else check_int(where, "T_fixed", T_fixed, 1)
    search = check_choice(where, "b_search", b_search, ("paper", "all"))
    gamma = constants.gamma
    cands: list[tuple[int, int, float, float]] = []
    for b in (sorted({1, pb.N}) if search == "paper" else range(1, pb.N + 1)):
        if pb.mechanism == "laplace":
            a1 = head_term(pb, b) - gamma * constants.initial_gap
            a2 = noise_kappa(pb) * b / (constants.strong_convexity**2 * pb.epsilon**2)
            t_cont = optimal_rounds(a1, a2, gamma, constants.initial_gap)
        else:
            e3 = (noise_kappa(pb) * math.log(1.0 / pb.delta)
                  / (constants.strong_convexity * pb.epsilon) ** 2)
            t_cont = math.inf if head_term(pb, b) > gamma * e3 else 0.0
            if t_fix is None:
                raise ValueError(
                    f"{where}: T_fixed=None: for the Gaussian mechanism the bound is monotone "
                    f"in T (T* = {t_cont}); give T_fixed >= 1 (the paper uses 100)")
        t_int = t_fix if t_fix is not None else _integer_rounds(pb, b, t_cont)
        cands.append((b, t_int, objective(pb, t_int, b), t_cont))
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
