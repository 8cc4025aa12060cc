"""The unoptimised accountants: each device composes its own events, nothing is shared.

This is how :class:`~testbed.core.privacy.accountants.accountant.PrivacyAccountant` and
:class:`~testbed.core.privacy.accountants.record_accountant.RecordAccountant` composed before their
states were shared and their sums kept exactly (docs/privacy.md, "Accounting at scale"): the
device-level accountant keeps every coefficient and sums the list with ``math.fsum`` on
every question; the record-level accountant keeps one state per device and composes each
event's contribution onto it. Kept as the oracle of the tests
(``tests/test_accountant_scale.py``) and the baseline of ``benchmarks/bench_accountant.py``;
runs use the optimised classes. Only ``add``, ``epsilon`` and ``epsilon_if`` are provided.
"""

from __future__ import annotations

import math
from typing import Any

from testbed.core.privacy.accountants.accountant import EpsilonResult
from testbed.core.privacy.analysis.paper import paper_coefficient
from testbed.core.privacy.analysis.rdp import gaussian_epsilon
from testbed.core.privacy.analysis.record_epsilon import (
    DEFAULT_PLD_DISCRETIZATION,
    RecordEpsilon,
    epsilon_result,
    make_engine,
)
from testbed.core.privacy.analysis.strict import strict_coefficient
from testbed.core.privacy.events import UploadEvent
from testbed.core.privacy.record_events import LaplaceRecordEvent, RecordEvent

_COEFFICIENT = {"paper": paper_coefficient, "strict": strict_coefficient}


class ReferencePrivacyAccountant:
    """Device-level accountant, unoptimised: a list of coefficients per device.

    Parameters
    ----------
    mode, delta, conversion
        As for :class:`~testbed.core.privacy.accountants.accountant.PrivacyAccountant`.
    """

    def __init__(self, mode: str = "strict", delta: float = 1e-5,
                 conversion: str = "standard") -> None:
        self._mode = mode
        self._delta = float(delta)
        self._conversion = conversion
        self._coefficients: dict[int, list[float]] = {}

    def add(self, event: UploadEvent) -> None:
        """Record one upload."""
        coefficient = _COEFFICIENT[self._mode](event)
        self._coefficients.setdefault(event.device, []).append(coefficient)

    def epsilon(self, device: int) -> EpsilonResult:
        """The device's epsilon over every upload recorded so far."""
        return self._result(self._coefficients.get(device, []))

    def epsilon_if(self, device: int, event: UploadEvent) -> EpsilonResult:
        """What :meth:`epsilon` would return after :meth:`add` of ``event``."""
        extra = _COEFFICIENT[self._mode](event)
        return self._result([*self._coefficients.get(device, []), extra])

    def _result(self, coefficients: list[float]) -> EpsilonResult:
        total = math.inf if any(math.isinf(c) for c in coefficients) else math.fsum(coefficients)
        eps, order = gaussian_epsilon(coefficient=total, delta=self._delta,
                                      conversion=self._conversion)
        return EpsilonResult(epsilon=eps, order=order, mode=self._mode,
                             conversion=self._conversion, uploads=len(coefficients),
                             rdp_coefficient=total)


class ReferenceRecordAccountant:
    """Record-level accountant, unoptimised: one state per device, composed event by event.

    Parameters
    ----------
    accountant, delta, relation, z_resolution, pld_discretization
        As for :class:`~testbed.core.privacy.accountants.record_accountant.RecordAccountant`.
    """

    def __init__(self, accountant: str = "rdp", delta: float = 1e-5, *,
                 relation: str = "add-remove", z_resolution: float | None = None,
                 pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> None:
        self._engine = make_engine(accountant, relation, z_resolution, pld_discretization)
        self._delta = float(delta)
        self._states: dict[int, Any] = {}
        self._events: dict[int, int] = {}
        self._steps: dict[int, int] = {}
        self._results: dict[int, RecordEpsilon] = {}
        self._pending: tuple[int, Any, Any, Any, RecordEpsilon] | None = None

    def _contribution(self, event: RecordEvent | LaplaceRecordEvent) -> Any:
        if isinstance(event, LaplaceRecordEvent):
            return self._engine.laplace_contribution(event.noise_multiplier, 1)
        return self._engine.contribution(event.effective_sampling_rate,
                                         event.effective_noise_multiplier, event.steps)

    def _project(self, device: int,
                 event: RecordEvent | LaplaceRecordEvent) -> tuple[Any, RecordEpsilon]:
        base = self._states.get(device)
        if base is None:
            base = self._states[device] = self._engine.identity()
        pending = self._pending
        if pending is not None and pending[0] == device and pending[1] == event \
                and pending[2] is base:
            return pending[3], pending[4]
        new = self._engine.compose(base, self._contribution(event))
        result = epsilon_result(self._engine, new, self._delta, self._events.get(device, 0) + 1,
                                self._steps.get(device, 0) + event.steps)
        return new, result

    def add(self, event: RecordEvent | LaplaceRecordEvent) -> None:
        """Record one event."""
        new, result = self._project(event.device, event)
        self._states[event.device] = new
        self._events[event.device] = self._events.get(event.device, 0) + 1
        self._steps[event.device] = self._steps.get(event.device, 0) + event.steps
        self._results[event.device] = result
        self._pending = None

    def epsilon(self, device: int) -> RecordEpsilon:
        """The device's record-level epsilon over every event recorded so far."""
        if device not in self._results:
            self._results[device] = epsilon_result(self._engine, self._engine.identity(),
                                                   self._delta, 0, 0)
        return self._results[device]

    def epsilon_if(self, device: int, event: RecordEvent | LaplaceRecordEvent) -> RecordEpsilon:
        """What :meth:`epsilon` would return after :meth:`add` of ``event``."""
        new, result = self._project(device, event)
        self._pending = (device, event, self._states[device], new, result)
        return result
