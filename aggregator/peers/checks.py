"""The argument checks the peer systems share (:mod:`aggregator.peers`: the planners, their
accounting, FedSGD-DPC's bound and pilot fit).

Each returns the value in its plain Python type or raises ``ValueError`` naming the function
that was called (``where``), the argument, its value and what is allowed, e.g.
``sigma_for: G=-1.0 must be a finite number in (0, inf)``. Booleans are refused wherever a
number is asked for, and numbers must be finite: an infinite end of an interval is open.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_real(where: str, name: str, value: object, low: float = -math.inf,
               high: float = math.inf, *, low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite float in the interval from ``low`` to ``high`` (closed ends by
    default), else ``ValueError`` naming ``where`` and ``name``."""
    span = _interval(low, high, low_open or math.isinf(low), high_open or math.isinf(high))
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{where}: {name}={value!r} must be a finite number in {span}")
    v = float(value)
    bad = (not math.isfinite(v) or v < low or v > high or (low_open and v == low)
           or (high_open and v == high))
    if bad:
        raise ValueError(f"{where}: {name}={value!r} must be a finite number in {span}")
    return v


def check_int(where: str, name: str, value: object, low: int, high: float = math.inf) -> int:
    """``value`` as an int in ``[low, high]``, else ``ValueError`` naming ``where`` and
    ``name``."""
    span = f"[{low}, {'inf)' if math.isinf(high) else f'{int(high)}]'}"
    if (isinstance(value, bool) or not isinstance(value, int | np.integer)
            or not low <= int(value) <= high):
        raise ValueError(f"{where}: {name}={value!r} must be an integer in {span}")
    return int(value)


def check_delta(where: str, value: object) -> float:
    """``value`` as a float in ``(0, 1)``, else ``ValueError`` naming ``where``."""
    return check_real(where, "delta", value, 0.0, 1.0, low_open=True, high_open=True)


def check_epsilon(where: str, value: object, name: str = "epsilon") -> float:
    """``value`` as a finite float ``> 0``, else ``ValueError`` naming ``where`` and
    ``name``."""
    return check_real(where, name, value, 0.0, low_open=True)


def check_choice(where: str, name: str, value: object, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else ``ValueError`` naming ``where`` and
    ``name``."""
    if value not in allowed:
        raise ValueError(f"{where}: {name}={value!r} is not one of {tuple(allowed)}")
    return str(value)
