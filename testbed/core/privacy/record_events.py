"""Record-level privacy events: one frozen record per subsampled-Gaussian release of one device.

A new meaning gets a new type: :class:`~testbed.core.privacy.events.UploadEvent` is device-level
(a device's whole clipped update); :class:`RecordEvent` (``TYPE = "record-sgm/v1"``) is
record-level (one sample of one device's local data, per-example clipping, Poisson
sampling); :class:`LaplaceRecordEvent` (``TYPE = "record-laplace/v1"``) is record-level too,
for a full-batch Laplace release (l1 clipping, no sampling; 004's Laplace mechanism). This
module imports nothing from the package but :class:`EventError`.

Conventions (binding for whoever fills an event)
------------------------------------------------
* One *step* releases ``v = (sum of clipped per-example gradients over a Poisson batch) / B
  + N(0, sigma^2 I)``: each record is in the batch independently with probability
  ``sampling_rate``; every per-example gradient has l2 norm ``<= example_clip`` (``C``);
  ``B = expected_batch`` is a public constant (never the realized batch size). Adding or
  removing one record moves the sum by at most ``C``, so ``v`` has l2 sensitivity ``C / B``
  and the noise multiplier ``sigma * B / C``.
* ``steps`` identical such steps are composed by one event: the ``H`` local steps of
  per-step noise (no channel credit then), or ``1`` for an upload-noise FedSGD round.
* ``amplified``: the Poisson sampling was drawn from a secret (cryptographic) source the
  adversary cannot predict. When ``False`` no amplification is credited: ``q`` is taken as 1.
* Channel credit (only a step whose noisy value goes linearly on the air, unquantized): the
  value is sent as ``x = alpha (d/l) v_S`` on ``l`` masked coordinates and received as
  ``y = h x + n``, ``n ~ N(0, n0)`` per real coordinate; dividing by ``gain alpha d / l``
  adds ``N(0, trusted n0 (l/d)^2 / (gain alpha)^2)`` per coordinate in ``v``'s units. ``gain``
  is an upper bound on ``|h|`` and ``n0`` a lower bound when estimated. ``gain``, ``alpha``,
  ``n0`` or ``trusted_channel_noise`` equal to 0 credits nothing. The credit belongs to the
  one step that goes on air, so an event that credits channel noise must have ``steps == 1``.
* ``relation``: ``"add-remove"`` (one record added or removed) or ``"replace-one"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.core.privacy.events import EventError, JsonEvent

#: Neighbouring relations between a device's local data sets.
RELATIONS = ("add-remove", "replace-one")


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(f"RecordEvent.{name}={value!r} must be an integer")
    if value < low:
        raise EventError(f"RecordEvent.{name}={value!r} must be >= {low}")


def _check_real(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(f"RecordEvent.{name}={value!r} must be a real number")
    if not math.isfinite(value) or value < 0:
        raise EventError(f"RecordEvent.{name}={value!r} must be finite and >= 0")


@dataclass(frozen=True)
class RecordEvent(JsonEvent):
    """``steps`` identical Poisson-subsampled Gaussian steps of one device in one round.

    Attributes
    ----------
    round, device
        Global round index and device index (``>= 0``).
    steps
        Number of identical subsampled-Gaussian steps composed (``>= 1``).
    sampling_rate
        Poisson sampling probability ``q`` of each record, in ``(0, 1]``.
    amplified
        ``True`` iff the sampling was secret (CSPRNG); ``False`` credits no amplification.
    example_clip
        ``C > 0``: l2 bound on each per-example gradient (gradient units).
    expected_batch
        ``B > 0``: the public normalizer; the step's value is the clipped sum divided by ``B``.
    dataset_size
        Records on the device (``>= 1``); used for the device-level figure only.
    sigma
        Artificial Gaussian noise std per coordinate (``>= 0``), in the units of the
        normalized value (clipped sum / ``B``).
    alpha
        Power scaling of the value on air (``>= 0``, symbol-amplitude units).
    gain
        Credited ``|h|`` (``>= 0``), an upper bound when estimated.
    n0
        Credited channel noise variance per real coordinate (``>= 0``), a lower bound.
    trusted_channel_noise
        Fraction of ``n0`` credited, in ``[0, 1]``.
    d, l
        Model size and coordinates sent (``1 <= l <= d``); the value goes on air scaled by
        ``d / l``.
    relation
        ``"add-remove"`` (default) or ``"replace-one"``.
    bound_failure_prob
        Probability that a credited confidence bound (``gain`` upper, ``n0`` lower) is
        wrong, in ``[0, 1]``; ``0`` when nothing estimated is credited. Reports add it to
        delta (``delta_total``).
    """

    TYPE: ClassVar[str] = "record-sgm/v1"

    round: int
    device: int
    steps: int
    sampling_rate: float
    amplified: bool
    example_clip: float
    expected_batch: float
    dataset_size: int
    sigma: float
    alpha: float = 0.0
    gain: float = 0.0
    n0: float = 0.0
    trusted_channel_noise: float = 0.0
    d: int = 1
    l: int = 1
    relation: str = "add-remove"
    bound_failure_prob: float = 0.0

    def __post_init__(self) -> None:
        _check_int("round", self.round, 0)
        _check_int("device", self.device, 0)
        _check_int("steps", self.steps, 1)
        _check_int("dataset_size", self.dataset_size, 1)
        _check_int("d", self.d, 1)
        _check_int("l", self.l, 1)
        if self.l > self.d:
            raise EventError(f"RecordEvent: need 1 <= l <= d, got l={self.l}, d={self.d}")
        if not isinstance(self.amplified, bool):
            raise EventError(f"RecordEvent.amplified={self.amplified!r} must be a bool")
        for name in ("sampling_rate", "example_clip", "expected_batch", "sigma", "alpha",
                     "gain", "n0", "trusted_channel_noise"):
            _check_real(name, getattr(self, name))
        if not 0 < self.sampling_rate <= 1:
            raise EventError(
                f"RecordEvent.sampling_rate={self.sampling_rate!r} must lie in (0, 1]"
            )
        for name in ("example_clip", "expected_batch"):
            if getattr(self, name) <= 0:
                raise EventError(f"RecordEvent.{name}={getattr(self, name)!r} must be > 0")
        if self.trusted_channel_noise > 1:
            raise EventError(
                f"RecordEvent.trusted_channel_noise={self.trusted_channel_noise!r} "
                "must lie in [0, 1]"
            )
        _check_real("bound_failure_prob", self.bound_failure_prob)
        if self.bound_failure_prob > 1:
            raise EventError(
                f"RecordEvent.bound_failure_prob={self.bound_failure_prob!r} must lie in [0, 1]"
            )
        if self.relation not in RELATIONS:
            raise EventError(f"RecordEvent.relation={self.relation!r} not in {RELATIONS}")
        if self.steps > 1 and self.channel_credited:
            raise EventError(
                f"RecordEvent: steps={self.steps} with channel credit; the channel adds "
                "noise to the one step that goes on air, so credit it only with steps=1 "
                "(set trusted_channel_noise=0 or n0=0 for multi-step events)"
            )

    @property
    def channel_credited(self) -> bool:
        """``True`` iff the event credits channel noise (all of gain, alpha, n0, trust > 0)."""
        return min(self.gain, self.alpha, self.n0, self.trusted_channel_noise) > 0

    @property
    def channel_noise_var(self) -> float:
        """Credited channel noise variance per coordinate after inversion, value units.

        ``trusted n0 (l/d)^2 / (gain alpha)^2``; ``0`` without credit; may be ``inf`` (a
        vanishing but positive credited gain), which credits unbounded noise.
        """
        if not self.channel_credited:
            return 0.0
        # divide before squaring: (gain alpha)^2 may underflow where the ratio does not
        ratio = math.sqrt(self.trusted_channel_noise * self.n0) * (self.l / self.d)
        ratio /= self.gain * self.alpha
        return ratio * ratio

    @property
    def effective_sampling_rate(self) -> float:
        """``sampling_rate`` if the sampling was secret, else ``1.0`` (no amplification)."""
        return float(self.sampling_rate) if self.amplified else 1.0

    @property
    def effective_noise_multiplier(self) -> float:
        """``z_eff = sqrt(sigma^2 + channel_noise_var) * B / C`` (dimensionless, may be inf)."""
        total = self.sigma**2 + self.channel_noise_var
        return math.sqrt(total) * self.expected_batch / self.example_clip

    @property
    def noise_multiplier_without_channel(self) -> float:
        """``sigma * B / C``: the noise multiplier with no channel credit (trusted = 0)."""
        return self.sigma * self.expected_batch / self.example_clip


@dataclass(frozen=True)
class LaplaceRecordEvent(JsonEvent):
    """One full-batch Laplace release of one device in one round (004's FedSGD-DPC, Laplace).

    A new meaning, so a new type (``TYPE = "record-laplace/v1"``): the device releases
    ``v = (sum over all its records of the l1-clipped per-example gradient) / D + Lap(0, s)``
    per coordinate, with no sampling. ``D = dataset_size`` is the mechanism's public
    normalizer (a constant, as ``expected_batch`` is for :class:`RecordEvent`): the device's
    shard size as partitioned, fixed before the first round, and the divisor whatever the
    number of records the step sees. So adding or removing one record moves the clipped sum
    by at most ``xi_1`` in l1 and ``v`` by at most ``Delta_1 = xi_1 / D``; replace-one moves it
    by ``2 xi_1 / D`` (004's Theorem 1). (A divisor equal to the realized size would move
    ``v`` by up to ``2 xi_1 / (D + 1)`` under add/remove; docs/privacy.md.) The
    event is pure ``(1 / b, 0)``-DP under add/remove with ``b = s / Delta_1``
    (:attr:`noise_multiplier`). No channel noise is credited (the channel's Gaussian noise
    on a Laplace value is not composed here).

    Attributes
    ----------
    round, device
        Global round index and device index (``>= 0``).
    scale
        ``s > 0``: Laplace scale per coordinate, in the units of ``v`` (gradient units);
        the variance per coordinate is ``2 s^2``.
    example_clip
        ``xi_1 > 0``: l1 bound on each per-example gradient (gradient units).
    dataset_size
        ``D >= 1``: the public normalizer (records), the device's shard size as partitioned
        before the run; all the device's records are in the step.
    relation
        ``"add-remove"`` (default) or ``"replace-one"``.
    """

    TYPE: ClassVar[str] = "record-laplace/v1"

    round: int
    device: int
    scale: float
    example_clip: float
    dataset_size: int
    relation: str = "add-remove"

    def __post_init__(self) -> None:
        for name in ("round", "device"):
            _check_int(name, getattr(self, name), 0)
        _check_int("dataset_size", self.dataset_size, 1)
        for name in ("scale", "example_clip"):
            value = getattr(self, name)
            _check_real(name, value)
            if value <= 0:
                raise EventError(f"LaplaceRecordEvent.{name}={value!r} must be > 0")
        if self.relation not in RELATIONS:
            raise EventError(
                f"LaplaceRecordEvent.relation={self.relation!r} not in {RELATIONS}"
            )

    #: One release per event (the accountant counts steps).
    steps: ClassVar[int] = 1
    #: Nothing estimated is credited.
    bound_failure_prob: ClassVar[float] = 0.0

    @property
    def sensitivity(self) -> float:
        """``Delta_1 = xi_1 / D``: l1 sensitivity of ``v`` under add/remove (gradient units)."""
        return self.example_clip / self.dataset_size

    @property
    def noise_multiplier(self) -> float:
        """``b = s / Delta_1 = s D / xi_1`` (dimensionless): the add/remove event is
        ``(1 / b)``-DP; ``dp_accounting.LaplaceDpEvent(b)``."""
        return self.scale * self.dataset_size / self.example_clip

    @property
    def device_noise_multiplier(self) -> float:
        """``s / xi_1``: ``b`` for a device's whole data set (``D`` records) added or
        removed, whose l1 sensitivity on ``v`` is ``D xi_1 / D = xi_1``."""
        return self.scale / self.example_clip
