"""Energy-minimising plan of over-the-air aggregation (scheme ``aircomp``): the common
received amplitude ``c``, the participating set and each device's noise share.

Per round every participant ``j`` sends ``alpha_j x_j`` with ``|alpha_j| = c / |h_j|``; its
radio energy is ``(c / |h_j|)^2 P_s(sigma) n / R_s P_ref`` (``P_s`` the bound on ``E|x|^2``
per symbol at noise share ``sigma``, ``n`` symbols at ``R_s`` per second, ``P_ref`` watts per
unit of symbol power). Per real coordinate of the decoded sum ``y / c`` (value units) the
receiver adds ``r = (N0 / 2) / c^2``. With ``Z = (z C / B)^2`` the variance one device's
record sensitivity needs (``z`` the run's calibrated noise multiplier) and ``K = N - t - m``
credited shares (``t`` colluding, ``m`` the dropout margin), the constraints are
(docs/solver.md, "Over-the-air aggregation"):

* **privacy** of every participant: ``K sigma^2 + tau r >= Z`` (``tau`` the trusted
  fraction of the receiver noise, 0 when it is not secret), so ``sigma^2 = max(0, Z - tau r)
  / K``;
* **accuracy**: the noise in the sum, ``N sigma^2 + r``, at most ``(1 + eta)`` times what
  the shares alone put there at full power, ``N Z / K`` (``eta`` the receiver-noise margin);
* **power**: ``c <= |h_j| sqrt(P_max / P_s(sigma))`` for every participant (at the smallest
  ``c`` the accuracy allows every device takes part; where that ``c`` is beyond the weakest
  device's reach, ``c`` is its reach: full power for it, less receiver noise than allowed).

The energy grows with ``c`` (``c^2`` times a ``P_s`` that does not decrease with ``c``), so
the optimum is the smallest ``c`` the accuracy constraint allows: ``r`` as large as
``acc(r) = N max(0, Z - tau r) / K + r <= (1 + eta) N Z / K`` permits, a piecewise-linear
condition solved in closed form (:func:`largest_receiver_noise`). With ``tau = 1`` and
``eta >= 0`` the receiver's noise can carry the whole privacy noise (``sigma = 0``: the
devices add none; Liu and Simeone's "privacy for free"); with ``tau = 0`` it is pure
accuracy loss and ``c`` is where it reaches ``eta`` of the shares' noise. Devices that
cannot reach ``c`` are dropped and the rest planned again (``N``, hence ``K``, smaller).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aggregator.outcome import noiseless_plan_note


class AirCompInfeasible(ValueError):
    """No participating set meets the constraints (named in the message)."""


@dataclass(frozen=True)
class AirCompPlan:
    """The plan of one aircomp round (the same every round).

    Attributes
    ----------
    amplitude
        ``c`` (receiver amplitude per unit value, symbol-amplitude units).
    reach
        The largest ``c`` every participant reaches at the planned share (``c <= reach``).
    participants
        Devices that transmit (ids).
    sigma
        Each participant's noise share (value units per coordinate).
    receiver_noise_var
        ``r = (N0 / 2) / c^2`` (value units per real coordinate of the sum).
    shares_var
        ``Z / K``: each share's variance at full power (``tau r`` not credited), for reference.
    alpha
        Device -> ``c / |h_j|`` (symbol-amplitude units per unit value).
    power
        Device -> mean transmit power (symbol-power units): ``alpha^2 P_s(sigma)``.
    energy_round_j
        Device -> radio energy per round (J).
    full_power_energy_round_j
        The same at the run's default ``c`` (the largest every participant reaches, shares at
        ``Z / K``), for comparison (J, all devices).
    notes
        Plain-language remarks (devices dropped, the binding constraint).
    """

    amplitude: float
    reach: float
    participants: tuple[int, ...]
    sigma: float
    receiver_noise_var: float
    shares_var: float
    alpha: dict[int, float]
    power: dict[int, float]
    energy_round_j: dict[int, float]
    full_power_energy_round_j: float
    notes: list[str] = field(default_factory=list)

    @property
    def energy_per_round_j(self) -> float:
        """Radio energy of all participants per round (J)."""
        return math.fsum(self.energy_round_j.values())


def largest_receiver_noise(z_var: float, n: int, k: int, tau: float, eta: float) -> float:
    """The largest ``r`` with ``N max(0, Z - tau r) / K + r <= (1 + eta) N Z / K``.

    Parameters
    ----------
    z_var
        ``Z > 0``.
    n, k
        Participants ``N`` and credited shares ``K`` (``1 <= K <= N``).
    tau, eta
        Trusted fraction in ``[0, 1]`` and margin ``>= 0``.
    """
    if not (z_var > 0 and 1 <= k <= n and 0 <= tau <= 1 and eta >= 0):
        raise ValueError("need Z > 0, 1 <= K <= N, tau in [0, 1], eta >= 0")
    cap = (1.0 + eta) * n * z_var / k
    slope = 1.0 - n * tau / k  # d acc / d r while tau r < Z
    knee = math.inf if tau == 0 else z_var / tau  # where the shares reach 0
    if slope > 0:
        r_a = eta * n * z_var / (k * slope)
        if r_a < knee:
            return r_a
    # acc(r) <= cap up to the knee; beyond it acc = r
    return max(knee, cap) if knee < math.inf else math.inf


def plan_aircomp(
    *,
    gains: Sequence[float],
    n0: float,
    p_max: Sequence[float],
    z_var: float,
    colluding: int,
    tau: float,
    eta: float,
    signal_power: Callable[[float], float],
    joules_per_unit_power: float,
) -> AirCompPlan:
    """The energy-minimising ``c``, participating set and shares (module docstring).

    Parameters
    ----------
    gains
        ``|h_j|`` of every device (path loss included; relative to the receiver's ``N0``).
    n0
        The receiver's ``N0`` per complex symbol (symbol-power units).
    p_max
        Each device's power limit (symbol-power units).
    z_var
        ``Z = (z C / B)^2`` (value units): the largest over the devices.
    colluding
        ``t + m``: the shares not credited to a device.
    tau, eta
        Trusted fraction of the receiver noise; receiver-noise margin of the accuracy
        constraint.
    signal_power
        ``sigma -> P_s(sigma)``, the bound on ``E|x|^2`` per symbol (non-decreasing).
    joules_per_unit_power
        ``n / R_s P_ref``: energy (J) of one round's slot at unit symbol power.

    Raises
    ------
    AirCompInfeasible
        No credited share (``colluding >= N``).
    """
    if not (n0 > 0 and z_var > 0 and eta >= 0 and 0 <= tau <= 1):
        raise ValueError("need N0 > 0, Z > 0, eta >= 0 and tau in [0, 1]")
    members = [j for j, g in enumerate(gains) if g > 0]
    notes: list[str] = []
    n = len(members)
    k = n - colluding
    if k < 1:
        raise AirCompInfeasible(
            f"{n} devices and colluding_devices + dropout_margin = {colluding} leave no "
            "credited share")
    r = largest_receiver_noise(z_var, n, k, tau, eta)
    sigma = math.sqrt(max(0.0, z_var - tau * r) / k)
    p_s = signal_power(sigma)
    reach = min(gains[j] * math.sqrt(p_max[j] / p_s) for j in members)
    c = math.sqrt((n0 / 2.0) / r) if r > 0 else math.inf
    if c > reach:
        # the weakest participant at its limit: less receiver noise than the margin allows
        c = reach
        r = (n0 / 2.0) / c**2
        sigma = math.sqrt(max(0.0, z_var - tau * r) / k)
        p_s = signal_power(sigma)
        notes.append("the power limits bind: the weakest participant transmits at its limit "
                     "and the receiver adds less noise than the margin allows")
    elif sigma == 0:
        notes.append("the receiver's noise carries the whole privacy noise; lower "
                     "privacy.trusted_channel_noise to keep a share on the devices")
    else:
        notes.append(f"the accuracy margin binds: the receiver adds {r / (n * z_var / k):.3g} "
                     "of the shares' noise")
    if sigma == 0:  # every participant's share is 0: said first, in the shared words
        notes.insert(0, noiseless_plan_note(members, len(gains), credited=tau, unit="record"))
    alpha = {j: c / gains[j] for j in members}
    power = {j: alpha[j] ** 2 * p_s for j in members}
    energy = {j: power[j] * joules_per_unit_power for j in members}
    full_sigma = math.sqrt(z_var / k)
    p_full = signal_power(full_sigma)
    c_full = min(gains[j] * math.sqrt(p_max[j] / p_full) for j in members)
    full = math.fsum((c_full / gains[j]) ** 2 * p_full for j in members) * joules_per_unit_power
    return AirCompPlan(
        amplitude=c, reach=min(gains[j] * math.sqrt(p_max[j] / p_s) for j in members),
        participants=tuple(members), sigma=sigma, receiver_noise_var=r,
        shares_var=z_var / k, alpha=alpha, power=power, energy_round_j=energy,
        full_power_energy_round_j=full, notes=notes,
    )
