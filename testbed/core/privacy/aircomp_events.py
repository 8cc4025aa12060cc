"""Record-level privacy of over-the-air aggregation (AirComp) with distributed noise.

A new meaning, so a new type (``TYPE = "record-aircomp/v1"``); no old type changes meaning.

One round (docs/privacy.md "Over-the-air aggregation"): every participating device ``j``
releases ``v_j + n_j``, ``v_j`` its clipped per-example gradient sum over a Poisson batch
(rate ``q_j``) divided by the public ``B_j``, ``n_j ~ N(0, sigma_j^2 I)`` from its OS
CSPRNG. It pre-equalizes with its channel estimate (``alpha_j = c / h_hat_j``) and all
transmit in one slot; the receiver sees ``y = sum_j h_j alpha_j (v_j + n_j) + n``,
``n ~ N(0, n0 I)`` per real coordinate, and divides by ``c``:

    y / c = sum_j rho_j (v_j + n_j) + n / c,        rho_j = h_j alpha_j / c = h_j / h_hat_j.

Device ``i``'s record moves ``v_i`` by at most ``C / B_i`` (l2), so ``y / c`` by at most
``|rho_i| C / B_i``. Every other term is independent of device ``i``'s records. The noise in
``y / c`` is Gaussian with variance per real coordinate

    |rho_i|^2 sigma_i^2 + sum_{j in H} |rho_j|^2 sigma_j^2 + n0 / |c|^2,

``H`` the other devices trusted to have added their noise. Dividing by the sensitivity, the
round is one Poisson-subsampled Gaussian step of noise multiplier

    z_i = sqrt( sigma_i^2 + (sum_{j in H} (rho_j,lo sigma_j)^2 + tau n0_lo / |c|^2)
                 / rho_i,hi^2 ) * B_i / C

(own noise and own signal share ``rho_i``, so that ratio is exact; the others' noise and the
receiver's are credited with lower bounds ``rho_j,lo``, ``n0_lo`` against an upper bound
``rho_i,hi`` of device ``i``'s own gain; ``tau`` the trusted fraction of the receiver noise).
``t`` colluding devices (``privacy.colluding_devices``) know their own noise and subtract
it: the ``t`` largest terms ``(rho_j,lo sigma_j)^2`` are removed from ``H``. With ``t = N -
1`` only device ``i``'s own noise and the receiver's remain.

The event stores the terms, not only ``z_i``, so that the figure under any other trust
assumption (all others colluding; no receiver noise) is computed from the same record.
This module imports nothing from the package but the event base and its checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.core.privacy.events import EventError, JsonEvent
from testbed.core.privacy.record_events import RELATIONS


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise EventError(f"AirCompEvent.{name}={value!r} must be an integer >= {low}")


def _check_real(name: str, value: Any, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EventError(f"AirCompEvent.{name}={value!r} must be a finite real number")
    if value < 0 or (positive and value == 0):
        raise EventError(f"AirCompEvent.{name}={value!r} must be {'>' if positive else '>='} 0")


@dataclass(frozen=True)
class AirCompEvent(JsonEvent):
    """Device ``device``'s part in one over-the-air aggregation round (one subsampled
    Gaussian step).

    Attributes
    ----------
    round, device
        Global round index and device index (``>= 0``).
    sampling_rate
        Poisson sampling probability ``q`` of each of the device's records, in ``(0, 1]``.
    amplified
        ``True`` iff the sampling was secret (CSPRNG); ``False`` credits no amplification.
    example_clip
        ``C > 0``: l2 bound on each per-example gradient.
    expected_batch
        ``B > 0``: the public normalizer of the device's clipped sum.
    dataset_size
        Records on the device (``>= 1``); for the device-level figure.
    sigma
        The device's own artificial noise std per coordinate (value units, ``>= 0``).
    gain_ratio_upper
        ``rho_i,hi > 0``: an upper bound on ``|h_i alpha_i| / c`` (1 with perfect alignment).
    others_noise_std
        ``rho_j,lo sigma_j`` of every other device that transmitted in the slot (value units,
        each ``>= 0``), in any order.
    receiver_noise_var
        ``tau n0_lo / |c|^2``: the receiver noise credited, per real coordinate of ``y / c``
        (value units, ``>= 0``; 0 credits none).
    colluding
        ``t``: the other devices assumed to collude (their noise not credited), ``>= 0``;
        more than the others present removes them all.
    relation
        ``"add-remove"`` (default) or ``"replace-one"``.
    bound_failure_prob
        Probability that a credited bound (``rho`` upper and lower bounds, ``n0_lo``) is
        wrong, in ``[0, 1]``; added to delta in reports (``delta_total``).
    """

    TYPE: ClassVar[str] = "record-aircomp/v1"

    round: int
    device: int
    sampling_rate: float
    amplified: bool
    example_clip: float
    expected_batch: float
    dataset_size: int
    sigma: float
    gain_ratio_upper: float = 1.0
    others_noise_std: tuple[float, ...] = ()
    receiver_noise_var: float = 0.0
    colluding: int = 0
    relation: str = "add-remove"
    bound_failure_prob: float = 0.0

    #: One step per event (the upload of a FedSGD round).
    steps: ClassVar[int] = 1

    def __post_init__(self) -> None:
        _check_int("round", self.round, 0)
        _check_int("device", self.device, 0)
        _check_int("dataset_size", self.dataset_size, 1)
        _check_int("colluding", self.colluding, 0)
        if not isinstance(self.amplified, bool):
            raise EventError(f"AirCompEvent.amplified={self.amplified!r} must be a bool")
        for name in ("sampling_rate", "example_clip", "expected_batch", "gain_ratio_upper"):
            _check_real(name, getattr(self, name), positive=True)
        for name in ("sigma", "receiver_noise_var", "bound_failure_prob"):
            _check_real(name, getattr(self, name))
        if self.sampling_rate > 1:
            raise EventError(f"AirCompEvent.sampling_rate={self.sampling_rate!r} must lie in "
                             "(0, 1]")
        if self.bound_failure_prob > 1:
            raise EventError(f"AirCompEvent.bound_failure_prob={self.bound_failure_prob!r} "
                             "must lie in [0, 1]")
        others = self.others_noise_std
        if not isinstance(others, list | tuple):
            raise EventError(f"AirCompEvent.others_noise_std={others!r} must be a list")
        for k, s in enumerate(others):
            _check_real(f"others_noise_std[{k}]", s)
        object.__setattr__(self, "others_noise_std", tuple(float(s) for s in others))
        if self.relation not in RELATIONS:
            raise EventError(f"AirCompEvent.relation={self.relation!r} not in {RELATIONS}")

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping with a ``type`` tag, JSON's shapes (``others_noise_std`` a list, as
        it comes back from the wire or the ledger)."""
        out = super().to_dict()
        out["others_noise_std"] = list(self.others_noise_std)
        return out

    def others_var(self, colluding: int) -> float:
        """``sum_{j in H} (rho_j,lo sigma_j)^2`` with the ``colluding`` largest removed."""
        terms = sorted((s * s for s in self.others_noise_std), reverse=True)
        return math.fsum(terms[colluding:])

    def noise_multiplier(self, *, colluding: int | None = None, receiver: bool = True) -> float:
        """``z_i`` (dimensionless): with ``colluding`` devices (default: the event's ``t``)
        and with or without the receiver noise credited."""
        t = self.colluding if colluding is None else colluding
        shared = self.others_var(t) + (self.receiver_noise_var if receiver else 0.0)
        ratio = math.sqrt(shared) / self.gain_ratio_upper
        return math.hypot(self.sigma, ratio) * self.expected_batch / self.example_clip

    @property
    def effective_sampling_rate(self) -> float:
        """``sampling_rate`` if the sampling was secret, else ``1.0`` (no amplification)."""
        return float(self.sampling_rate) if self.amplified else 1.0

    @property
    def effective_noise_multiplier(self) -> float:
        """``z_i`` under the enforced assumption (the event's ``t``, receiver noise credited)."""
        return self.noise_multiplier()

    @property
    def noise_multiplier_without_channel(self) -> float:
        """``z_i`` with no receiver noise credited (an eavesdropper with a better channel
        sees the superposition with less noise), the event's ``t``."""
        return self.noise_multiplier(receiver=False)

    @property
    def noise_multiplier_all_colluding(self) -> float:
        """``z_i`` with every other device colluding: own noise and the receiver's only."""
        return self.noise_multiplier(colluding=len(self.others_noise_std))

    @property
    def channel_credited(self) -> bool:
        """``True`` iff receiver noise is credited."""
        return self.receiver_noise_var > 0
