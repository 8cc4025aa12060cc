"""Per-device record-level accountant: compose Poisson-subsampled Gaussians with dp-accounting.

Each :class:`~testbed.core.privacy.record_events.RecordEvent` contributes ``steps``
subsampled-Gaussian steps with sampling probability ``q_eff`` (``q``, or 1 without secret
sampling) and noise multiplier ``z_eff`` (artificial plus credited channel noise, that
round's realized channel), so heterogeneous sequences compose exactly, event by event.
Accountants: ``"rdp"`` (Renyi DP curves, dp_accounting's conversion) and ``"pld"`` (privacy
loss distributions, tighter). The device-level figure of the same run
(:func:`device_level_epsilon`) and the figure with no channel credit are reported beside it:
a record-level epsilon says nothing about a device's whole data set.

:class:`~testbed.core.privacy.record_events.LaplaceRecordEvent` (004's full-batch Laplace
release) composes in the same per-device state: one Laplace mechanism of parameter
``b = scale / (xi_1 / D)`` (``dp_accounting.LaplaceDpEvent(b)`` in the PLD engine, its exact
RDP curve in the RDP engine), so a device's epsilon, the budget gate and the reports work
the same for both mechanisms.

At scale (docs/privacy.md §11): a device's state is a pure function of the sequence of its
events' contribution keys, so devices with the same sequence share one state and one
converted epsilon (:class:`~testbed.core.privacy.state_trie.StateTrie`): 1,000 devices making
the same upload cost one composition, bit for bit what each would have composed alone.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.core.privacy.events import EventError
from testbed.core.privacy.exact_sum import ExactSum
from testbed.core.privacy.rdp import OrderAtEdgeWarning
from testbed.core.privacy.record_compose import ContributionKey, PldEngine, RdpEngine
from testbed.core.privacy.record_events import RELATIONS, LaplaceRecordEvent, RecordEvent
from testbed.core.privacy.state_trie import Node, StateTrie

RECORD_ACCOUNTANTS = ("rdp", "pld")
#: PLD value discretization (nats): 1e-3 is within ~1e-4 relative of 1e-4 at 10x the speed.
DEFAULT_PLD_DISCRETIZATION = 1e-3
#: Relative log-grid step z is rounded down to, per accountant (RDP curves are cheap).
DEFAULT_Z_RESOLUTION = {"rdp": 0.0, "pld": 1e-3}
_STATE_VERSION = 1
_LAPLACE_CALIBRATION_ROUNDS = 20
_STATE_KIND = "record-accountant"
_NO_CHANNEL_CACHE_SIZE = 4096
_GAUSSIAN_DP_CACHE_SIZE = 65536
#: The record-level event types, by JSON ``type`` tag.
RECORD_EVENT_TYPES: dict[str, type[RecordEvent] | type[LaplaceRecordEvent]] = {
    RecordEvent.TYPE: RecordEvent,
    LaplaceRecordEvent.TYPE: LaplaceRecordEvent,
}
#: Any record-level event.
AnyRecordEvent = RecordEvent | LaplaceRecordEvent
_RECORD_CLASSES = (RecordEvent, LaplaceRecordEvent)


@dataclass(frozen=True)
class RecordEpsilon:
    """``(epsilon, delta)`` of one device at the record level.

    Attributes
    ----------
    epsilon
        ``0.0`` with nothing released, ``inf`` when unbounded.
    delta
        The delta it holds for.
    accountant
        ``"rdp"`` or ``"pld"``.
    relation
        ``"add-remove"`` or ``"replace-one"``.
    order
        The Renyi order attaining it (``"rdp"``; ``inf`` at epsilon 0), ``nan`` for ``"pld"``.
    events
        Events composed.
    steps
        Subsampled-Gaussian steps composed (sum of the events' ``steps``).
    order_at_edge
        ``True`` when the optimal order is at the edge of the grid (a valid bound, maybe not
        the smallest).
    """

    epsilon: float
    delta: float
    accountant: str
    relation: str
    order: float = math.nan
    events: int = 0
    steps: int = 0
    order_at_edge: bool = False


def _engine(accountant: str, relation: str, z_resolution: float | None,
            pld_discretization: float) -> RdpEngine | PldEngine:
    if accountant not in RECORD_ACCOUNTANTS:
        raise ValueError(f"accountant={accountant!r} not in {RECORD_ACCOUNTANTS}")
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r} not in {RELATIONS}")
    res = DEFAULT_Z_RESOLUTION[accountant] if z_resolution is None else z_resolution
    if isinstance(res, bool) or not (isinstance(res, int | float) and 0 <= res < 1):
        raise ValueError(f"z_resolution={z_resolution!r} must lie in [0, 1)")
    if not (isinstance(pld_discretization, int | float) and 0 < pld_discretization <= 0.1):
        raise ValueError(f"pld_discretization={pld_discretization!r} must lie in (0, 0.1]")
    if accountant == "rdp":
        return RdpEngine(relation, float(res))
    return PldEngine(relation, float(res), float(pld_discretization))


def _check_delta(where: str, delta: Any) -> float:
    if isinstance(delta, bool) or not (isinstance(delta, int | float) and 0 < delta < 1):
        raise ValueError(f"{where}: delta={delta!r} must lie in (0, 1)")
    return float(delta)


def _result(engine: RdpEngine | PldEngine, state: Any, delta: float, events: int,
            steps: int) -> RecordEpsilon:
    if events == 0:
        eps, order, edge = 0.0, (math.inf if engine.name == "rdp" else math.nan), False
    else:
        eps, order, edge = engine.epsilon(state, delta)
    if edge:
        warnings.warn(
            f"optimal Renyi order {order:g} is at the edge of the order grid; epsilon "
            f"{eps:.6g} is a valid upper bound but may not be the smallest",
            OrderAtEdgeWarning,
            stacklevel=3,
        )
    return RecordEpsilon(epsilon=eps, delta=delta, accountant=engine.name,
                         relation=engine.relation, order=order, events=events, steps=steps,
                         order_at_edge=edge)


def _key_steps(key: Any) -> int:
    """Steps one event of a contribution key adds (its last entry: ``steps``, or the
    Laplace ``count``, which is 1 per event)."""
    return int(key[-1])


def _compute_no_channel_group(event: AnyRecordEvent) -> tuple[str, float, float]:
    if isinstance(event, LaplaceRecordEvent):
        return ("laplace", 1.0, event.noise_multiplier)
    return ("sgm", event.effective_sampling_rate, event.noise_multiplier_without_channel)


def _no_channel_group(event: AnyRecordEvent) -> tuple[str, float, float]:
    """The event's group in :meth:`RecordAccountant.epsilon_without_channel`."""
    return event.derived("no-channel-group", _compute_no_channel_group)


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


class RecordAccountant:
    """Keeps each device's record-level events and answers epsilon when asked.

    Parameters
    ----------
    accountant
        ``"rdp"`` (default) or ``"pld"``.
    delta
        Target delta in ``(0, 1)``.
    relation
        ``"add-remove"`` (default) or ``"replace-one"``; every event must carry the same.
    z_resolution
        Relative log-grid step the noise multiplier is rounded *down* to before composing
        (conservative; lets nearby noise levels share a cache entry). ``None``: ``0``
        (exact) for RDP, ``1e-3`` for PLD (a PLD costs ~40 ms to build).
    pld_discretization
        PLD value discretization interval (nats), default ``1e-3``.
    """

    def __init__(self, accountant: str = "rdp", delta: float = 1e-5, *,
                 relation: str = "add-remove", z_resolution: float | None = None,
                 pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> None:
        self._engine = _engine(accountant, relation, z_resolution, pld_discretization)
        self._delta = _check_delta("RecordAccountant", delta)
        engine = self._engine

        def compose(state: Any, key: Any) -> Any:
            return engine.compose(state, engine.contribution_of(key))

        self._trie = StateTrie(engine.identity(), compose, _key_steps)
        self._key_token = ("record-contribution-key", engine.z_resolution)
        self._relation = engine.relation
        self._events: dict[int, list[AnyRecordEvent]] = {}
        self._nodes: dict[int, Node] = {}
        # figures asked for rarely (reports): computed from the history when asked, cached
        self._device_level: dict[int, tuple[int, float]] = {}  # device -> (events, epsilon)
        self._no_channel_results: dict[Any, RecordEpsilon] = {}
        # the node of the last what-if, held so that add() of the same event reuses it
        self._pending: Node | None = None
        self._last_key: tuple[AnyRecordEvent, ContributionKey] | None = None

    @property
    def accountant(self) -> str:
        """``"rdp"`` or ``"pld"``."""
        return self._engine.name

    @property
    def delta(self) -> float:
        """The target delta."""
        return self._delta

    @property
    def relation(self) -> str:
        """The neighbouring relation."""
        return self._engine.relation

    @property
    def compositions(self) -> int:
        """Compositions computed so far (shared histories are composed once)."""
        return self._trie.composed

    def devices(self) -> tuple[int, ...]:
        """Devices with at least one event, sorted."""
        return tuple(sorted(self._events))

    def history(self, device: int) -> tuple[AnyRecordEvent, ...]:
        """The device's events in the order added (a copy)."""
        return tuple(self._events.get(device, ()))

    def _check(self, event: AnyRecordEvent) -> None:
        if not isinstance(event, _RECORD_CLASSES):
            raise TypeError(
                f"expected a RecordEvent or LaplaceRecordEvent, got {type(event).__name__}"
            )
        if event.relation != self._relation:
            raise ValueError(
                f"event relation {event.relation!r} differs from this accountant's "
                f"{self.relation!r}"
            )

    def _compute_key(self, event: AnyRecordEvent) -> ContributionKey:
        if isinstance(event, LaplaceRecordEvent):
            return self._engine.laplace_key(event.noise_multiplier, 1)
        return self._engine.key(event.effective_sampling_rate,
                                event.effective_noise_multiplier, event.steps)

    def _key(self, event: AnyRecordEvent) -> ContributionKey:
        """The event's contribution key: kept from the last what-if of the same event object
        (``epsilon_if`` then ``add``), or shared by ledger copies (``JsonEvent.derived``)."""
        last = self._last_key
        if last is not None and last[0] is event:
            return last[1]
        key = event.derived(self._key_token, self._compute_key)
        self._last_key = (event, key)
        return key

    def _node(self, device: int) -> Node:
        return self._nodes.get(device, self._trie.root)

    def _node_result(self, node: Node) -> RecordEpsilon:
        result = node.result
        if result is None:
            result = node.result = _result(self._engine, node.state, self._delta, node.events,
                                           node.steps)
        return result  # type: ignore[no-any-return]

    def add(self, event: AnyRecordEvent) -> None:
        """Record one event (``steps`` subsampled-Gaussian steps of ``event.device``, or one
        full-batch Laplace release)."""
        if type(event) not in _RECORD_CLASSES or event.relation != self._relation:
            self._check(event)  # raises (or accepts a subclass)
        device = event.device
        node = self._trie.child(self._nodes.get(device, self._trie.root), self._key(event))
        events = self._events.get(device)
        if events is None:
            self._events[device] = [event]
        else:
            events.append(event)
        self._nodes[device] = node
        self._pending = None

    def epsilon(self, device: int) -> RecordEpsilon:
        """The device's record-level epsilon over every event recorded so far."""
        return self._node_result(self._node(device))

    def epsilon_if(self, device: int, event: AnyRecordEvent) -> RecordEpsilon:
        """What :meth:`epsilon` would return after :meth:`add` of ``event`` (bit for bit)."""
        self._check(event)
        if event.device != device:
            raise ValueError(f"epsilon_if: event.device={event.device} but device={device}")
        node = self._trie.child(self._node(device), self._key(event))
        self._pending = node
        return self._node_result(node)

    def rdp_curve(self, device: int) -> tuple[tuple[float, ...], np.ndarray]:
        """``(orders, R)``: the device's composed RDP curve (nats), ``"rdp"`` only.

        ``R`` has shape ``(len(orders),)``; for replace-one it is the bound converted.
        """
        if not isinstance(self._engine, RdpEngine):
            raise ValueError("rdp_curve: this accountant composes PLDs, not RDP curves")
        return self._engine.orders, self._engine.curve(self._node(device).state).copy()

    def epsilon_without_channel(self, device: int) -> RecordEpsilon:
        """The same history with no channel credit (``trusted_channel_noise = 0``); Laplace
        events credit none, so they enter as they are."""
        counts: dict[tuple[str, float, float], int] = {}
        for event in self._events.get(device, ()):
            group = _no_channel_group(event)
            counts[group] = counts.get(group, 0) + event.steps
        groups = tuple(sorted(counts.items()))
        node = self._node(device)
        cache_key = (groups, node.events, node.steps)
        result = self._no_channel_results.get(cache_key)
        if result is not None:
            return result
        state = self._engine.identity()
        for (kind, q, z), steps in groups:
            part = (self._engine.laplace_contribution(z, steps) if kind == "laplace"
                    else self._engine.contribution(q, z, steps))
            state = self._engine.compose(state, part)
        result = _result(self._engine, state, self._delta, node.events, node.steps)
        if len(self._no_channel_results) >= _NO_CHANNEL_CACHE_SIZE:
            self._no_channel_results.clear()
        self._no_channel_results[cache_key] = result
        return result

    def device_epsilon(self, device: int) -> float:
        """The device-level epsilon of the same history (:func:`device_level_epsilon`)."""
        history = self._events.get(device, ())
        cached = self._device_level.get(device)
        if cached is None or cached[0] != len(history):
            cached = self._device_level[device] = (len(history),
                                                   device_level_epsilon(history, self._delta))
        return cached[1]

    def _config(self) -> dict[str, Any]:
        engine = self._engine
        return {
            "version": _STATE_VERSION,
            "kind": _STATE_KIND,
            "accountant": engine.name,
            "delta": self._delta,
            "relation": engine.relation,
            "z_resolution": engine.z_resolution,
            "pld_discretization": getattr(engine, "discretization", None),
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state: the configuration and every event."""
        state = self._config()
        state["events"] = [e.to_dict() for dev in sorted(self._events)
                           for e in self._events[dev]]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the state by ``state``; refuses another configuration or version."""
        if not isinstance(state, dict):
            raise ValueError("load_state_dict: state must be a mapping")
        for key, mine in self._config().items():
            if state.get(key) != mine:
                raise ValueError(
                    f"load_state_dict: state has {key}={state.get(key)!r}, this accountant "
                    f"has {key}={mine!r}"
                )
        try:
            events = [_parse_event(e) for e in state.get("events", [])]
        except EventError as exc:
            raise ValueError(f"load_state_dict: {exc}") from exc
        self._events, self._nodes, self._device_level = {}, {}, {}
        self._pending = None
        for event in events:
            self.add(event)


def _parse_event(data: Any) -> AnyRecordEvent:
    kind = data.get("type") if isinstance(data, dict) else None
    cls = RECORD_EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise EventError(f"unknown record event type {kind!r}; known: {sorted(RECORD_EVENT_TYPES)}")
    return cls.from_dict(data)


def record_epsilon_for(*, q: float, z: float, steps: int, delta: float,
                       accountant: str = "rdp", relation: str = "add-remove",
                       z_resolution: float = 0.0,
                       pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> RecordEpsilon:
    """Record-level epsilon of ``steps`` identical Poisson-subsampled Gaussian steps.

    Parameters
    ----------
    q
        Sampling probability in ``(0, 1]`` (1: no amplification).
    z
        Noise multiplier ``std / (C / B)`` (``>= 0``; ``0`` gives ``inf``).
    steps
        Number of steps ``K >= 1``.
    delta
        Target delta in ``(0, 1)``.
    accountant, relation, z_resolution, pld_discretization
        As for :class:`RecordAccountant` (``z_resolution`` defaults to exact here).
    """
    _check_delta("record_epsilon_for", delta)
    if isinstance(q, bool) or not (isinstance(q, int | float) and 0 < q <= 1):
        raise ValueError(f"record_epsilon_for: q={q!r} must lie in (0, 1]")
    if isinstance(z, bool) or not (isinstance(z, int | float) and z >= 0):
        raise ValueError(f"record_epsilon_for: z={z!r} must be >= 0")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"record_epsilon_for: steps={steps!r} must be an integer >= 1")
    engine = _engine(accountant, relation, z_resolution, pld_discretization)
    state = engine.compose(engine.identity(), engine.contribution(q, z, steps))
    return _result(engine, state, float(delta), 1, steps)


def calibrate_noise_multiplier(*, q: float, steps: int, target_epsilon: float, delta: float,
                               accountant: str = "rdp", relation: str = "add-remove",
                               z_resolution: float = 0.0,
                               pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
                               ) -> float:
    """Smallest noise multiplier ``z`` whose epsilon after ``steps`` steps meets the target.

    Uses ``dp_accounting.calibrate_dp_mechanism`` (Brent's method, then a check that the
    returned point does not exceed the target) on an adapter around the same engine as
    :func:`record_epsilon_for`, so ``record_epsilon_for(..., z=result)`` never exceeds
    ``target_epsilon``. Tolerance ``1e-6`` relative to the bracket.
    """
    from testbed.core.privacy.record_calibration import calibrate

    _check_delta("calibrate_noise_multiplier", delta)
    if isinstance(target_epsilon, bool) or not (
        isinstance(target_epsilon, int | float) and 0 < target_epsilon < math.inf
    ):
        raise ValueError(f"calibrate_noise_multiplier: target_epsilon={target_epsilon!r} "
                         "must be finite and > 0")
    record_epsilon_for(q=q, z=1.0, steps=steps, delta=delta, accountant=accountant,
                       relation=relation)  # validates q, steps and names
    engine = _engine(accountant, relation, z_resolution, pld_discretization)
    return calibrate(engine, q=float(q), steps=steps, target_epsilon=float(target_epsilon),
                     delta=float(delta))


def laplace_epsilon_for(*, b: float, count: int, delta: float, accountant: str = "pld",
                        relation: str = "add-remove",
                        pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> RecordEpsilon:
    """Record-level epsilon of ``count`` full-batch Laplace releases of parameter ``b``.

    Parameters
    ----------
    b
        ``scale / (xi_1 / D)`` (``>= 0``; ``0`` gives ``inf``): each release is ``(1 / b)``-DP
        under add/remove.
    count
        Releases (``>= 1``).
    delta, accountant, relation, pld_discretization
        As for :class:`RecordAccountant` (the same engines, so the enforced accountant of a
        run with these events reports exactly this).
    """
    _check_delta("laplace_epsilon_for", delta)
    if isinstance(b, bool) or not (isinstance(b, int | float) and b >= 0):
        raise ValueError(f"laplace_epsilon_for: b={b!r} must be >= 0")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"laplace_epsilon_for: count={count!r} must be an integer >= 1")
    engine = _engine(accountant, relation, None, pld_discretization)
    state = engine.compose(engine.identity(), engine.laplace_contribution(float(b), count))
    return _result(engine, state, float(delta), count, count)


def calibrate_laplace_noise_multiplier(*, count: int, target_epsilon: float, delta: float,
                                       accountant: str = "pld", relation: str = "add-remove",
                                       pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
                                       ) -> float:
    """``b`` whose ``count`` Laplace releases are ``target_epsilon``-DP by basic composition.

    Pure DP composes linearly and that is tight for the Laplace mechanism (the privacy loss
    reaches ``count / b`` with positive probability): ``b = count / target`` under
    add/remove, ``2 count / target`` under replace-one (sensitivity ``2 xi_1 / D``). That
    ``b`` is then checked with the engine that will enforce the budget
    (:func:`laplace_epsilon_for`, i.e. ``dp_accounting``'s PLD or RDP of
    ``LaplaceDpEvent(b)``) and enlarged by the ratio it reports until it reports at most the
    target: the PLD's pessimistic discretization may add up to ``count`` x the interval.
    """
    _check_delta("calibrate_laplace_noise_multiplier", delta)
    if isinstance(target_epsilon, bool) or not (
        isinstance(target_epsilon, int | float) and 0 < target_epsilon < math.inf
    ):
        raise ValueError(f"calibrate_laplace_noise_multiplier: target_epsilon="
                         f"{target_epsilon!r} must be finite and > 0")
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r} not in {RELATIONS}")
    factor = 2.0 if relation == "replace-one" else 1.0
    b = factor * count / float(target_epsilon)
    for _ in range(_LAPLACE_CALIBRATION_ROUNDS):
        eps = laplace_epsilon_for(b=b, count=count, delta=delta, accountant=accountant,
                                  relation=relation,
                                  pld_discretization=pld_discretization).epsilon
        if eps <= target_epsilon:
            return b
        b *= (eps / target_epsilon) * (1.0 + 1e-9)
    raise ValueError(
        f"calibrate_laplace_noise_multiplier: {accountant} keeps b={b:.6g} above the target "
        f"{target_epsilon:.6g} after {_LAPLACE_CALIBRATION_ROUNDS} enlargements"
    )


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
    delta = _check_delta("device_level_epsilon", delta)
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
    (:class:`~testbed.core.privacy.exact_sum.ExactSum`, equal to ``math.fsum`` of the terms),
    so the result does not depend on how the events were grouped or when it is asked.
    """

    __slots__ = ("_gaussian", "_pure", "unbounded")

    def __init__(self) -> None:
        self._gaussian = ExactSum()
        self._pure = ExactSum()
        self.unbounded = False  # a step without any noise: epsilon is inf

    def add(self, event: AnyRecordEvent) -> None:
        """Add one event (``TypeError`` for anything but a record-level event)."""
        if not isinstance(event, _RECORD_CLASSES):
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


