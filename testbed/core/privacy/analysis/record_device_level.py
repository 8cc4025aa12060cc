"""Device-level epsilon of a device's record-level events: add/remove of its whole data set,
reported beside the record-level figure (:func:`device_level_epsilon`, and its running form
:class:`DeviceLevelSum`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

from testbed.core.privacy.analysis.exact_sum import ExactSum
from testbed.core.privacy.analysis.record_epsilon import check_delta
from testbed.core.privacy.event_types import RECORD_CLASSES, AnyRecordEvent
from testbed.core.privacy.record_events import LaplaceRecordEvent

_GAUSSIAN_DP_CACHE_SIZE = 65536


def _compute_device_level_term(event: AnyRecordEvent) -> tuple[str, float]:
    factor = 2.0 if event.relation == "replace-one" else 1.0
    if isinstance(event, LaplaceRecordEvent):
        b_dev = event.device_noise_multiplier / factor
        return ("unbounded", math.inf) if b_dev == 0 else ("pure", 1.0 / b_dev)
    z_dev = event.effective_noise_multiplier / (factor * event.dataset_size)
    if z_dev == 0:
        return ("unbounded", math.inf)
    ratio = 1.0 / z_dev
    return ("gaussian", event.steps * ratio * ratio)


def _device_level_term(event: AnyRecordEvent) -> tuple[str, float]:
    """``("gaussian", steps (D / z_eff)^2)``, ``("pure", xi_1 / s)`` or ``("unbounded",
    inf)``: one event's part of :func:`device_level_epsilon`."""
    return event.derived("device-level-term", _compute_device_level_term)


def device_level_epsilon(events: Iterable[AnyRecordEvent], delta: float) -> float:
    """Device-level epsilon of the same steps: add/remove of a device's whole data set.

    Every Gaussian step is taken as a Gaussian mechanism with **no** subsampling (all ``D``
    records may fall in one batch) and l2 sensitivity ``D C / B`` (``2 D C / B`` for
    replace-one), i.e. noise multiplier ``z_eff / D`` (``z_eff / (2D)``), with the same
    channel credit. Gaussian mechanisms compose exactly (Gaussian DP: ``mu = sqrt(sum steps
    (D/z_eff)^2)``), and ``mu`` is converted exactly (Balle & Wang 2018,
    ``dp_accounting.get_epsilon_gaussian``).

    A Laplace event (:class:`LaplaceRecordEvent`) releases the l1-clipped sum over all ``D``
    records divided by the public ``D``: a whole data set added or removed moves it by at
    most ``D xi_1 / D = xi_1`` in l1 (``2 xi_1`` replace-one), so it is a Laplace mechanism of
    parameter ``s / xi_1`` (``s / (2 xi_1)``), pure ``xi_1 / s``-DP. Laplace events compose
    by basic composition (``sum xi_1 / s``; tight for pure DP, and a PLD would need
    ``eps / 1e-4`` points at device-level epsilons in the thousands), added to the Gaussian
    part's epsilon at ``delta`` (basic composition of ``(e1, delta)`` and ``(e2, 0)``).
    """
    delta = check_delta("device_level_epsilon", delta)
    level = DeviceLevelSum()
    for event in events:
        level.add(event)
        if level.unbounded:
            return math.inf
    return level.epsilon(delta)


@functools.lru_cache(maxsize=_GAUSSIAN_DP_CACHE_SIZE)
def _gaussian_dp_epsilon(mu: float, delta: float) -> float:
    """``dp_accounting.get_epsilon_gaussian(1 / mu, delta)`` (deterministic, so cached)."""
    from dp_accounting import get_epsilon_gaussian

    return float(get_epsilon_gaussian(1.0 / mu, delta))


class DeviceLevelSum:
    """Running form of :func:`device_level_epsilon`: add events one by one, ask any time.

    The sums ``sum steps (D / z_eff)^2`` and ``sum xi_1 / s`` are kept exactly
    (:class:`~testbed.core.privacy.analysis.exact_sum.ExactSum`, equal to ``math.fsum`` of the
    terms), so the result does not depend on how the events were grouped or when it is asked.
    """

    __slots__ = ("_gaussian", "_pure", "unbounded")

    def __init__(self) -> None:
        self._gaussian = ExactSum()
        self._pure = ExactSum()
        self.unbounded = False  # a step without any noise: epsilon is inf

    def add(self, event: AnyRecordEvent) -> None:
        """Add one event (``TypeError`` for anything but a record-level event)."""
        if not isinstance(event, RECORD_CLASSES):
            raise TypeError(
                f"expected RecordEvents or LaplaceRecordEvents, got {type(event).__name__}"
            )
        kind, value = _device_level_term(event)
        if kind == "gaussian":
            self._gaussian.add(value)
        elif kind == "pure":
            self._pure.add(value)
        else:
            self.unbounded = True

    def epsilon(self, delta: float) -> float:
        """The device-level epsilon of the events added, at ``delta`` (validated by the
        caller)."""
        if self.unbounded:
            return math.inf
        laplace = self._pure.value()
        mu = math.sqrt(self._gaussian.value())
        if mu == 0:
            return laplace
        if math.isinf(mu):
            return math.inf
        return _gaussian_dp_epsilon(mu, delta) + laplace


