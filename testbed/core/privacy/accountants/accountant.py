"""Per-device privacy accountant: compose RDP over the uploads a device made, convert on demand.

Each upload's RDP is ``a * c_k`` (every mechanism here is Gaussian), with ``c_k`` computed
from the upload's own event, i.e. with that round's realized (credited) channel gain: fading
is accounted exactly, not in expectation. Composition over a device's uploads sums the
``c_k``: the value is ``math.fsum`` of the device's coefficients, kept as an exact running
sum (:class:`~testbed.core.privacy.analysis.exact_sum.ExactSum`, bit-identical to ``fsum`` of the
list at O(1) per upload), so :meth:`PrivacyAccountant.epsilon_if` returns bit-for-bit what
:meth:`PrivacyAccountant.epsilon` returns after :meth:`~PrivacyAccountant.add`.

Epsilon is a pure function of ``(composed coefficient, delta, conversion)``; it is computed
once per distinct argument (:func:`cached_gaussian_epsilon`), so devices with identical
histories, and ``epsilon`` after an ``epsilon_if`` of the same upload, cost a lookup.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from testbed.core.privacy.analysis.exact_sum import ExactSum
from testbed.core.privacy.analysis.paper import paper_coefficient
from testbed.core.privacy.analysis.rdp import CONVERSIONS, gaussian_epsilon
from testbed.core.privacy.analysis.strict import strict_coefficient
from testbed.core.privacy.events import CLIP_MODES, UploadEvent

MODES = ("paper", "strict")
NOISE_POSITIONS = ("before", "after")
_COEFFICIENT: dict[str, Callable[[UploadEvent], float]] = {
    "paper": paper_coefficient,
    "strict": strict_coefficient,
}
_STATE_VERSION = 1
_EPSILON_CACHE_SIZE = 65536


@dataclass(frozen=True)
class EpsilonResult:
    """``(epsilon, delta)``-DP of one device.

    Attributes
    ----------
    epsilon
        Smallest epsilon over Renyi orders (``0.0`` with no upload, ``inf`` when unbounded).
    order
        The Renyi order attaining it (``inf`` when epsilon is 0, ``nan`` when inf).
    mode
        ``"paper"`` or ``"strict"``.
    conversion
        RDP-to-DP conversion used (``"standard"`` or ``"balle2020"``).
    uploads
        Number of uploads composed.
    rdp_coefficient
        Sum of per-upload coefficients: the composed RDP is ``order * rdp_coefficient``.
    """

    epsilon: float
    order: float
    mode: str
    conversion: str = "standard"
    uploads: int = 0
    rdp_coefficient: float = 0.0


def upload_coefficient(event: UploadEvent, *, mode: str) -> float:
    """Per-upload RDP coefficient of ``event`` under accounting ``mode``.

    Ledger copies of one event compute it once (:meth:`~testbed.core.privacy.events.JsonEvent.
    derived`: it depends on the event's fields other than round and device only).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} not in {MODES}")
    return event.derived(("rdp-coefficient", mode), _COEFFICIENT[mode])


@functools.lru_cache(maxsize=_EPSILON_CACHE_SIZE)
def _cached_gaussian_epsilon(coefficient: float, delta: float, conversion: str,
                             ) -> tuple[float, float]:
    return gaussian_epsilon(coefficient=coefficient, delta=delta, conversion=conversion)


def cached_gaussian_epsilon(
    *, coefficient: float, delta: float, conversion: str = "standard"
) -> tuple[float, float]:
    """:func:`~testbed.core.privacy.analysis.rdp.gaussian_epsilon`, computed once per exact
    argument.

    The function is deterministic, so a cached value is the value; keys are the exact floats
    (``==``; ``0.0`` and ``-0.0`` give the same epsilon). An ``OrderAtEdgeWarning`` is issued
    when a value is computed, not again when it is looked up.
    """
    return _cached_gaussian_epsilon(float(coefficient), float(delta), conversion)


class PrivacyAccountant:
    """Keeps each device's upload events and answers epsilon when asked.

    Parameters
    ----------
    mode
        ``"paper"`` or ``"strict"``.
    delta
        Target delta in ``(0, 1)``.
    conversion
        ``"standard"`` (003 Lemma 2, default) or ``"balle2020"`` (tighter).
    """

    def __init__(
        self, mode: str = "strict", delta: float = 1e-5, conversion: str = "standard"
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"PrivacyAccountant: mode={mode!r} not in {MODES}")
        if not (isinstance(delta, int | float) and 0 < delta < 1):
            raise ValueError(f"PrivacyAccountant: delta={delta!r} must lie in (0, 1)")
        if conversion not in CONVERSIONS:
            raise ValueError(
                f"PrivacyAccountant: conversion={conversion!r} not in {CONVERSIONS}"
            )
        self._mode = mode
        self._delta = float(delta)
        self._conversion = conversion
        self._events: dict[int, list[UploadEvent]] = {}
        self._sums: dict[int, ExactSum] = {}
        self._last: tuple[UploadEvent, float] | None = None  # (event, its coefficient)

    @property
    def mode(self) -> str:
        """The accounting mode."""
        return self._mode

    @property
    def delta(self) -> float:
        """The target delta."""
        return self._delta

    @property
    def conversion(self) -> str:
        """The RDP-to-DP conversion."""
        return self._conversion

    def devices(self) -> tuple[int, ...]:
        """Devices with at least one upload, sorted."""
        return tuple(sorted(self._events))

    def history(self, device: int) -> tuple[UploadEvent, ...]:
        """The device's events in the order added (a copy; the accountant's list is private)."""
        return tuple(self._events.get(device, ()))

    def add(self, event: UploadEvent) -> None:
        """Record one upload."""
        if not isinstance(event, UploadEvent):
            raise TypeError(f"add: expected an UploadEvent, got {type(event).__name__}")
        coefficient = self._coefficient(event)
        device = event.device
        events = self._events.get(device)
        if events is None:
            events = self._events[device] = []
            self._sums[device] = ExactSum()
        self._sums[device].add(coefficient)
        events.append(event)

    def add_all(self, events: Iterable[UploadEvent]) -> None:
        """:meth:`add` of each of ``events``, in order (a ledger replay)."""
        for event in events:
            self.add(event)

    def epsilon(self, device: int) -> EpsilonResult:
        """The device's epsilon over all uploads recorded so far."""
        sums = self._sums.get(device)
        if sums is None:
            return self._result(0.0, 0)
        return self._result(sums.value(), len(sums))

    def epsilon_if(self, device: int, event: UploadEvent) -> EpsilonResult:
        """What :meth:`epsilon` would return after :meth:`add` of ``event`` (state unchanged)."""
        if event.device != device:
            raise ValueError(f"epsilon_if: event.device={event.device} but device={device}")
        extra = self._coefficient(event)
        sums = self._sums.get(device)
        if sums is None:
            return self._result(ExactSum().value_with(extra), 1)
        return self._result(sums.value_with(extra), len(sums) + 1)

    def _coefficient(self, event: UploadEvent) -> float:
        """The event's coefficient, kept from the last call for the same event object (a
        what-if then the upload)."""
        last = self._last
        if last is not None and last[0] is event:
            return last[1]
        coefficient = upload_coefficient(event, mode=self._mode)
        self._last = (event, coefficient)
        return coefficient

    def _result(self, total: float, uploads: int) -> EpsilonResult:
        """The result for composed coefficient ``total`` (``fsum`` of ``uploads`` values)."""
        eps, order = cached_gaussian_epsilon(
            coefficient=total, delta=self._delta, conversion=self._conversion
        )
        return EpsilonResult(
            epsilon=eps,
            order=order,
            mode=self._mode,
            conversion=self._conversion,
            uploads=uploads,
            rdp_coefficient=total,
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state: mode, delta, conversion and every event."""
        return {
            "version": _STATE_VERSION,
            "mode": self._mode,
            "delta": self._delta,
            "conversion": self._conversion,
            "events": [e.to_dict() for dev in sorted(self._events) for e in self._events[dev]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the state by ``state``; refuses another mode, delta, conversion or version."""
        if not isinstance(state, dict):
            raise ValueError("load_state_dict: state must be a mapping")
        for key, mine in (
            ("version", _STATE_VERSION),
            ("mode", self._mode),
            ("delta", self._delta),
            ("conversion", self._conversion),
        ):
            if state.get(key) != mine:
                raise ValueError(
                    f"load_state_dict: state has {key}={state.get(key)!r}, this accountant "
                    f"has {key}={mine!r}"
                )
        events = [UploadEvent.from_dict(e) for e in state.get("events", [])]
        self._events, self._sums, self._last = {}, {}, None
        for event in events:
            self.add(event)


def epsilon_for(
    *,
    mode: str,
    sigma: float,
    alpha: float,
    h: float,
    n0: float,
    rounds: int,
    d: int,
    l: int,
    q: int | None,
    clip: float,
    delta: float,
    trusted: float = 1.0,
    clip_mode: str = "coordinate",
    noise_position: str = "before",
    conversion: str = "standard",
) -> EpsilonResult:
    """Epsilon of one device after ``rounds`` identical uploads.

    Parameters
    ----------
    mode
        ``"paper"`` or ``"strict"``.
    sigma
        Artificial noise std per coordinate (units: see :mod:`testbed.core.privacy.events`).
    alpha
        Power scaling of the compressed vector.
    h
        Credited ``|h|`` (real, ``>= 0``).
    n0
        Channel noise variance **per real coordinate** (``N0 / 2`` for complex ``N0``).
    rounds
        ``K``, the number of uploads (``>= 0``).
    d, l
        Model size and coordinates sent (``l == d``: no sparsification).
    q
        Quantization levels, or ``None``.
    clip
        ``Z``, the l2 clipping bound.
    delta
        Target delta in ``(0, 1)``.
    trusted
        Fraction of ``n0`` credited, in ``[0, 1]``.
    clip_mode
        ``"coordinate"`` (default), ``"norm"`` or ``"none"``.
    noise_position
        ``"before"`` (Algorithm 1) or ``"after"`` (eq. 21) compression. ``"after"`` with
        quantization assumes the fixed public quantizer scale (``quantizer_scale="fixed"``
        of the event); with the norm sent in the clear the strict epsilon is infinite.
    conversion
        ``"standard"`` or ``"balle2020"``.
    """
    if mode not in MODES:
        raise ValueError(f"epsilon_for: mode={mode!r} not in {MODES}")
    if noise_position not in NOISE_POSITIONS:
        raise ValueError(
            f"epsilon_for: noise_position={noise_position!r} not in {NOISE_POSITIONS}"
        )
    if clip_mode not in CLIP_MODES:
        raise ValueError(f"epsilon_for: clip_mode={clip_mode!r} not in {CLIP_MODES}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"epsilon_for: rounds={rounds!r} must be an integer >= 0")
    try:
        d, l = operator.index(d), operator.index(l)
        q = None if q is None else operator.index(q)
    except TypeError as exc:
        raise ValueError(f"epsilon_for: d, l and q must be integers (q or None): {exc}") from exc
    event = UploadEvent(
        round=0,
        device=0,
        mechanism=noise_position,
        sigma=float(sigma),
        alpha=float(alpha),
        gain=float(h),
        n0=float(n0),
        trusted_channel_noise=float(trusted),
        d=d,
        l=l,
        q=q,
        clip=float(clip),
        clip_mode=clip_mode,
        quantizer_scale="fixed" if noise_position == "after" else "norm",
    )
    if not (isinstance(delta, int | float) and 0 < delta < 1):
        raise ValueError(f"epsilon_for: delta={delta!r} must lie in (0, 1)")
    if conversion not in CONVERSIONS:
        raise ValueError(f"epsilon_for: conversion={conversion!r} not in {CONVERSIONS}")
    c = upload_coefficient(event, mode=mode)
    total = 0.0 if rounds == 0 else (math.inf if math.isinf(c) else c * rounds)
    eps, order = gaussian_epsilon(coefficient=total, delta=delta, conversion=conversion)
    return EpsilonResult(
        epsilon=eps,
        order=order,
        mode=mode,
        conversion=conversion,
        uploads=rounds,
        rdp_coefficient=total,
    )
