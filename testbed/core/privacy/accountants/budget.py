"""Budget enforcement: a device transmits only if its epsilon stays within its target.

The runner asks :meth:`BudgetGuard.allows` *before* a device transmits, with the event the
upload will produce (for hardware links, where the channel is unknown until received, the
event must credit no channel noise: ``trusted_channel_noise=0`` or ``n0=0``). Because
:meth:`~testbed.core.privacy.accountants.accountant.PrivacyAccountant.epsilon_if` returns exactly
what the
accountant reports after ``add``, a device whose uploads are all gated by the guard never ends
above its target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol


class _HasEpsilon(Protocol):
    @property
    def epsilon(self) -> float: ...


class SupportsEpsilon(Protocol):
    """What the guard needs of an accountant (``PrivacyAccountant``, ``RecordAccountant``)."""

    def epsilon(self, device: int) -> _HasEpsilon: ...

    def epsilon_if(self, device: int, event: Any) -> _HasEpsilon: ...


class BudgetGuard:
    """Gate uploads on a per-device epsilon target.

    Parameters
    ----------
    accountant
        The accountant that records the uploads (the guard only reads it): any object with
        ``epsilon(device)`` and ``epsilon_if(device, event)`` whose ``epsilon_if`` returns
        exactly what ``epsilon`` returns after ``add``.
    epsilon_target
        One target for every device, or a mapping device -> target (every device that
        uploads must then have one). Targets are finite and ``> 0``.
    """

    def __init__(
        self, accountant: SupportsEpsilon, epsilon_target: float | Mapping[int, float]
    ) -> None:
        if not all(callable(getattr(accountant, m, None)) for m in ("epsilon", "epsilon_if")):
            raise TypeError(
                f"BudgetGuard: accountant must have epsilon() and epsilon_if(), got "
                f"{type(accountant).__name__}"
            )
        targets = (
            dict(epsilon_target) if isinstance(epsilon_target, Mapping) else None
        )
        values = targets.values() if targets is not None else [epsilon_target]
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"BudgetGuard: epsilon_target={value!r} must be a number")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"BudgetGuard: epsilon_target={value!r} must be finite, > 0")
        self._accountant = accountant
        self._targets = targets
        self._default = None if targets is not None else float(epsilon_target)  # type: ignore[arg-type]

    def target(self, device: int) -> float:
        """The device's epsilon target."""
        if self._targets is None:
            assert self._default is not None
            return self._default
        if device not in self._targets:
            raise KeyError(f"BudgetGuard: no epsilon target for device {device}")
        return float(self._targets[device])

    def projected(self, device: int, event: Any) -> _HasEpsilon:
        """The device's epsilon if ``event`` were recorded."""
        return self._accountant.epsilon_if(device, event)

    def allows(self, device: int, event: Any) -> bool:
        """``True`` iff recording ``event`` keeps the device within its target."""
        return self.projected(device, event).epsilon <= self.target(device)

    def remaining(self, device: int) -> float:
        """Target minus the device's current epsilon (may be 0, never credited back)."""
        return self.target(device) - self._accountant.epsilon(device).epsilon
