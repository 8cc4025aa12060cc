"""A running sum of floats that equals ``math.fsum`` of every value added, in O(1) per add.

``math.fsum`` returns the correctly rounded (round-half-even) value of the *exact* sum of its
inputs, whatever their order. Every finite double is an integer multiple of ``2**-1074``, so
the exact sum of any number of doubles is an integer multiple of ``2**-1074`` too: keeping
that integer (a Python int, unbounded) and dividing by ``2**1074`` at the end (Python's
int / int true division is correctly rounded) gives the same double as ``math.fsum`` of the
whole list, bit for bit, without keeping the list. An infinite value makes the sum infinite,
as in ``fsum``; a sum too large for a double raises ``OverflowError``, as ``fsum`` does.

The accountants use it so that composing one more event, or asking what one more event
would give (``epsilon_if``), costs the same after a million events as after one, while the
composed value stays exactly what ``math.fsum`` of the stored list returned before.
"""

from __future__ import annotations

import math

#: ``2**1074``: every finite double times this is an integer.
_SCALE_BITS = 1074
_SCALE = 1 << _SCALE_BITS


def scaled(value: float) -> int:
    """``value * 2**1074`` as an exact integer (``value`` a finite float or int)."""
    num, den = float(value).as_integer_ratio()
    # den is a power of two, at most 2**1074 for any finite double
    return num << (_SCALE_BITS + 1 - den.bit_length())


class ExactSum:
    """Exact running sum of non-negative reals (``inf`` allowed).

    Parameters
    ----------
    values
        Initial values (optional).

    Raises
    ------
    ValueError
        On a NaN or a negative value.
    """

    __slots__ = ("_count", "_infinite", "_scaled")

    def __init__(self, values: tuple[float, ...] | list[float] = ()) -> None:
        self._scaled = 0
        self._infinite = False
        self._count = 0
        for v in values:
            self.add(v)

    def add(self, value: float) -> None:
        """Add one value (``>= 0``, may be ``inf``)."""
        if not value >= 0:  # also catches NaN
            raise ValueError(f"ExactSum: values must be >= 0, got {value!r}")
        self._count += 1
        if value == math.inf:
            self._infinite = True
        else:
            self._scaled += scaled(value)

    def __len__(self) -> int:
        return self._count

    def value(self) -> float:
        """``math.fsum`` of every value added (``0.0`` when empty)."""
        if self._infinite:
            return math.inf
        return self._scaled / _SCALE

    def value_with(self, extra: float) -> float:
        """``math.fsum`` of every value added plus ``extra``, the sum itself unchanged."""
        if not extra >= 0:
            raise ValueError(f"ExactSum: values must be >= 0, got {extra!r}")
        if self._infinite or extra == math.inf:
            return math.inf
        return (self._scaled + scaled(extra)) / _SCALE

    def copy(self) -> ExactSum:
        """An independent copy."""
        out = ExactSum()
        out._scaled, out._infinite, out._count = self._scaled, self._infinite, self._count
        return out
