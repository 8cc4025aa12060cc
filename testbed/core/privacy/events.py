"""Privacy events: one frozen record per upload of one device, with the values actually used.

This module depends on nothing else in the package. A field's meaning, once given, never
changes: a new meaning gets a new event type (and a new ``TYPE`` tag in the JSON).

Conventions (binding for whoever fills an event)
------------------------------------------------
* The device sends ``x = alpha * C(g + eta)`` (``mechanism="before"``, Algorithm 1 of 003)
  or ``x = alpha * (C(g) + eta)`` (``mechanism="after"``, eq. 21), where ``C`` includes the
  ``d / l`` sparsification scaling and the quantizer, and ``g`` is the clipped differential.
* ``sigma`` is the artificial noise standard deviation per coordinate, in the units of the
  vector it is added to: of ``g`` for ``"before"``, of ``C(g)`` for ``"after"`` (for a discrete
  Gaussian on the quantization grid of spacing ``s / Q``: ``sigma = sqrt(sigma2) * s / Q``
  with ``sigma2`` the sampler's scale in grid units).
* ``gain`` is the real ``|h| >= 0`` the receiver credits: the upper confidence bound on
  ``max |h|`` over the upload when ``h`` is estimated (a larger gain means less privacy).
* ``n0`` is the channel noise variance **per real coordinate** credited, i.e. the lower
  confidence bound. Analog symbols are complex, two reals per symbol; a complex noise of
  ``E|n|^2 = N0`` puts ``N0 / 2`` on each real coordinate, so the runner records
  ``n0 = N0_lower / 2``.
* ``trusted_channel_noise`` in ``[0, 1]``: the fraction of ``n0`` credited
  (``0`` = local DP: the channel noise is not trusted at all).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, TypeVar

#: Where the artificial noise sits; ``"none"``: no privacy mechanism (nothing is credited).
MECHANISMS = ("before", "after", "none")
CLIP_MODES = ("coordinate", "norm", "none")
#: Quantizer scale: ``"norm"`` = the l2 norm of the sparse vector, sent as side information
#: (003 eq. 7); ``"fixed"`` = the public bound ``Z sqrt(d/l)`` (coordinate clipping) or
#: ``Z d / l`` (norm clipping) on that norm, so nothing data-dependent is sent in the clear.
QUANTIZER_SCALES = ("norm", "fixed")


#: Instance attribute holding the shared store of :meth:`JsonEvent.derived` values (events
#: whose ``__dict__`` holds the same store object are copies of one event: the same class and
#: fields but round and device, see :meth:`JsonEvent.for_round_and_device`).
DERIVED_STORE = _DERIVED = "_derived"
T = TypeVar("T")


class EventError(ValueError):
    """An event field is missing, of the wrong type or out of range."""


class JsonEvent:
    """JSON form shared by every event type: a ``type`` tag plus the dataclass fields.

    Subclasses are frozen dataclasses with a class-level ``TYPE`` tag; parsing refuses
    another tag and unknown keys, and lets the dataclass validate the values.
    """

    TYPE: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping with a ``type`` tag (JSON-ready)."""
        out: dict[str, Any] = {"type": self.TYPE}
        out.update(asdict(self))  # type: ignore[call-overload]
        return out

    def to_json(self) -> str:
        """One-line JSON (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls: type[E], data: dict[str, Any]) -> E:
        """Inverse of :meth:`to_dict`; refuses another type tag and unknown keys."""
        name = cls.__name__
        if not isinstance(data, dict):
            raise EventError(f"{name}: expected a JSON object, got {type(data).__name__}")
        kind = data.get("type")
        if kind != cls.TYPE:
            raise EventError(f"{name}: type={kind!r}, expected {cls.TYPE!r}")
        fields = {k: v for k, v in data.items() if k != "type"}
        unknown = sorted(set(fields) - set(cls.__dataclass_fields__))  # type: ignore[attr-defined]
        if unknown:
            raise EventError(f"{name}: unknown keys {unknown}")
        try:
            return cls(**fields)
        except TypeError as exc:
            raise EventError(f"{name}: {exc}") from exc

    @classmethod
    def from_json(cls: type[E], text: str) -> E:
        """Inverse of :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EventError(f"{cls.__name__}: not JSON: {exc}") from exc
        return cls.from_dict(data)

    def derived(self, token: Hashable, compute: Callable[[Any], T]) -> T:
        """``compute(self)``: a value an accountant derives from this event's fields *other
        than* ``round`` and ``device`` (a coefficient, a composition key).

        Events made by :meth:`for_round_and_device` (a ledger read) share one store with the
        event they were copied from, so the value is computed once for all of them (they
        differ only in round and device, and events are frozen, so it cannot go stale). Any
        other event computes it on each call: a store per event would cost more memory than
        the computation costs time.
        """
        store = self.__dict__.get(_DERIVED)
        if store is None:
            return compute(self)
        try:
            return store[token]  # type: ignore[no-any-return]
        except KeyError:
            value = store[token] = compute(self)
            return value

    def for_round_and_device(self: E, round_index: int, device: int) -> E:
        """This event with another ``round`` and ``device``, every other field (and the
        store of :meth:`derived` values) shared, without re-running the other fields' checks.

        For reading many ledger lines that differ only in those two values (the ledger
        checks one of them in full and copies it for the rest).

        Raises
        ------
        EventError
            If ``round_index`` or ``device`` is not an integer ``>= 0``.
        """
        if type(round_index) is not int or round_index < 0:
            raise EventError(f"{type(self).__name__}.round={round_index!r} must be an integer >= 0")
        if type(device) is not int or device < 0:
            raise EventError(f"{type(self).__name__}.device={device!r} must be an integer >= 0")
        state = self.__dict__
        if _DERIVED not in state:
            state[_DERIVED] = {}  # created here so that every copy shares it
        copy = state.copy()  # one copy of the whole table: faster than adding key by key
        copy["round"] = round_index
        copy["device"] = device
        out = object.__new__(type(self))
        object.__setattr__(out, "__dict__", copy)
        return out


E = TypeVar("E", bound=JsonEvent)


@dataclass(frozen=True)
class UploadEvent(JsonEvent):
    """One upload of one device in one round.

    Attributes
    ----------
    round, device
        Global round index and device index (``>= 0``).
    mechanism
        ``"before"``, ``"after"`` or ``"none"`` (see the module docstring).
    sigma
        Artificial noise std per coordinate (``>= 0``).
    alpha
        Power scaling applied to the compressed vector (``>= 0``, symbol-power units).
    gain
        Credited ``|h|`` (``>= 0``), an upper bound when estimated.
    n0
        Credited channel noise variance per real coordinate (``>= 0``), a lower bound.
    trusted_channel_noise
        Fraction of ``n0`` credited, in ``[0, 1]``.
    d, l
        Model size and coordinates sent (``1 <= l <= d``; ``l == d``: no sparsification).
    q
        Quantization levels ``Q >= 1``, or ``None`` (no quantization).
    clip
        ``Z > 0``, the l2 clipping bound.
    clip_mode
        ``"coordinate"``, ``"norm"`` or ``"none"``.
    quantizer_scale
        ``"norm"`` or ``"fixed"`` (see :data:`QUANTIZER_SCALES`).
    bound_failure_prob
        Probability that a credited confidence bound (``gain`` upper, ``n0`` lower) is
        wrong, in ``[0, 1]``; ``0`` when nothing estimated is credited. Reports add it to
        delta (``delta_total``).
    """

    TYPE: ClassVar[str] = "upload/v1"

    round: int
    device: int
    mechanism: str
    sigma: float
    alpha: float
    gain: float
    n0: float
    trusted_channel_noise: float
    d: int
    l: int
    q: int | None
    clip: float
    clip_mode: str = "coordinate"
    quantizer_scale: str = "norm"
    bound_failure_prob: float = 0.0

    def __post_init__(self) -> None:
        for name in ("round", "device", "d", "l"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise EventError(f"UploadEvent.{name}={value!r} must be an integer")
        if self.round < 0 or self.device < 0:
            raise EventError(
                f"UploadEvent: round={self.round} and device={self.device} must be >= 0"
            )
        if self.d < 1 or not 1 <= self.l <= self.d:
            raise EventError(f"UploadEvent: need 1 <= l <= d, got l={self.l}, d={self.d}")
        if self.q is not None and (
            isinstance(self.q, bool) or not isinstance(self.q, int) or self.q < 1
        ):
            raise EventError(f"UploadEvent.q={self.q!r} must be None or an integer >= 1")
        for name in ("sigma", "alpha", "gain", "n0", "trusted_channel_noise", "clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise EventError(f"UploadEvent.{name}={value!r} must be a real number")
            if not math.isfinite(value) or value < 0:
                raise EventError(f"UploadEvent.{name}={value!r} must be finite and >= 0")
        if self.clip <= 0:
            raise EventError(f"UploadEvent.clip={self.clip!r} must be > 0")
        if not isinstance(self.bound_failure_prob, int | float) or not (
            0 <= self.bound_failure_prob <= 1
        ):
            raise EventError(
                f"UploadEvent.bound_failure_prob={self.bound_failure_prob!r} must lie in [0, 1]"
            )
        if self.trusted_channel_noise > 1:
            raise EventError(
                f"UploadEvent.trusted_channel_noise={self.trusted_channel_noise!r} "
                "must lie in [0, 1]"
            )
        if self.mechanism not in MECHANISMS:
            raise EventError(f"UploadEvent.mechanism={self.mechanism!r} not in {MECHANISMS}")
        if self.clip_mode not in CLIP_MODES:
            raise EventError(f"UploadEvent.clip_mode={self.clip_mode!r} not in {CLIP_MODES}")
        if self.quantizer_scale not in QUANTIZER_SCALES:
            raise EventError(
                f"UploadEvent.quantizer_scale={self.quantizer_scale!r} "
                f"not in {QUANTIZER_SCALES}"
            )

    @property
    def n0_credited(self) -> float:
        """``trusted_channel_noise * n0``: the channel noise variance per real coordinate."""
        return self.trusted_channel_noise * self.n0
