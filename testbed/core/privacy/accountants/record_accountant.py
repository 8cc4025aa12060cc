"""Per-device record-level accountant: compose Poisson-subsampled Gaussians with dp-accounting.

Each :class:`~testbed.core.privacy.record_events.RecordEvent` contributes ``steps``
subsampled-Gaussian steps with sampling probability ``q_eff`` (``q``, or 1 without secret
sampling) and noise multiplier ``z_eff`` (artificial plus credited channel noise, that
round's realized channel), so heterogeneous sequences compose exactly, event by event.
Accountants: ``"rdp"`` (Renyi DP curves, dp_accounting's conversion) and ``"pld"`` (privacy
loss distributions, tighter). The device-level figure of the same run
(:func:`~testbed.core.privacy.analysis.record_device_level.device_level_epsilon`) and the figure
with no channel credit are reported beside it: a record-level epsilon says nothing about a
device's whole data set.

:class:`~testbed.core.privacy.record_events.LaplaceRecordEvent` (004's full-batch Laplace
release) composes in the same per-device state: one Laplace mechanism of parameter
``b = scale / (xi_1 / D)`` (``dp_accounting.LaplaceDpEvent(b)`` in the PLD engine, its exact
RDP curve in the RDP engine), so a device's epsilon, the budget gate and the reports work
the same for both mechanisms.

At scale (docs/privacy.md §11): a device's state is a pure function of the sequence of its
events' contribution keys, so devices with the same sequence share one state and one
converted epsilon (:class:`~testbed.core.privacy.accountants.state_trie.StateTrie`): 1,000 devices
making the same upload cost one composition, bit for bit what each would have composed alone.

The figure's type and the engines behind it are in
:mod:`~testbed.core.privacy.analysis.record_epsilon`; one-shot epsilons of identical releases and
the noise that meets a target in :mod:`~testbed.core.privacy.accountants.record_planning`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from testbed.core.privacy.accountants.replay_runs import advance_run, run_starts
from testbed.core.privacy.accountants.state_trie import Node, StateTrie
from testbed.core.privacy.aircomp_events import AirCompEvent
from testbed.core.privacy.analysis.record_compose import ContributionKey, RdpEngine
from testbed.core.privacy.analysis.record_device_level import device_level_epsilon
from testbed.core.privacy.analysis.record_epsilon import (
    DEFAULT_PLD_DISCRETIZATION,
    RecordEpsilon,
    check_delta,
    epsilon_result,
    make_engine,
)
from testbed.core.privacy.event_types import RECORD_CLASSES, AnyRecordEvent, by_type_tag
from testbed.core.privacy.events import EventError
from testbed.core.privacy.record_events import LaplaceRecordEvent

_STATE_VERSION = 1
_STATE_KIND = "record-accountant"
_NO_CHANNEL_CACHE_SIZE = 4096
#: The record-level event types, by JSON ``type`` tag.
RECORD_EVENT_TYPES: dict[str, type[AnyRecordEvent]] = by_type_tag(RECORD_CLASSES)


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


def _all_colluding_group(event: AnyRecordEvent) -> tuple[str, float, float]:
    """The event's group in :meth:`RecordAccountant.epsilon_all_colluding`."""
    if isinstance(event, AirCompEvent):
        return ("sgm", event.effective_sampling_rate, event.noise_multiplier_all_colluding)
    if isinstance(event, LaplaceRecordEvent):
        return ("laplace", 1.0, event.noise_multiplier)
    return ("sgm", event.effective_sampling_rate, event.effective_noise_multiplier)



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
        self._engine = make_engine(accountant, relation, z_resolution, pld_discretization)
        self._delta = check_delta("RecordAccountant", delta)
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
        if not isinstance(event, RECORD_CLASSES):
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
            result = node.result = epsilon_result(self._engine, node.state, self._delta,
                                                  node.events, node.steps)
        return result  # type: ignore[no-any-return]

    def add(self, event: AnyRecordEvent) -> None:
        """Record one event (``steps`` subsampled-Gaussian steps of ``event.device``, or one
        full-batch Laplace release)."""
        if type(event) not in RECORD_CLASSES or event.relation != self._relation:
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

    def add_all(self, events: Iterable[AnyRecordEvent]) -> None:
        """:meth:`add` of each of ``events``, in order (a ledger replay): the same states,
        histories and epsilons, bit for bit, with less work per event. Copies of one event
        (:meth:`~testbed.core.privacy.events.JsonEvent.for_round_and_device`: one class,
        every field but round and device the same, one shared store of derived values) are
        checked and keyed once per run of them, and a run is composed at once
        (:mod:`~testbed.core.privacy.accountants.replay_runs`)."""
        events = events if isinstance(events, list) else list(events)
        starts = run_starts(events)
        trie, nodes, history = self._trie, self._nodes, self._events
        root, child, relation = trie.root, trie.child, self._relation
        token, compute = self._key_token, self._compute_key
        ends = [*starts[1:], len(events)] if starts else []
        for a, b in zip(starts, ends, strict=True):
            first = events[a]
            if type(first) not in RECORD_CLASSES or first.relation != relation:
                self._check(first)  # raises (or accepts a subclass)
            key = first.derived(token, compute)
            advance_run(events[a:b], key, child, root, nodes, history)
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
        return self._grouped(device, _no_channel_group)

    def epsilon_all_colluding(self, device: int) -> RecordEpsilon:
        """The same history with every other device colluding: an over-the-air round
        (:class:`AirCompEvent`) counts the device's own noise and the receiver's only;
        other events are the device's own releases and enter as they are."""
        return self._grouped(device, _all_colluding_group)

    def _grouped(self, device: int, group_of: Any) -> RecordEpsilon:
        """The device's history composed as one contribution per group ``group_of(event)``
        (``(kind, q, z)``) of equal events: exact, and one composition per group."""
        counts: dict[tuple[str, float, float], int] = {}
        for event in self._events.get(device, ()):
            group = group_of(event)
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
        result = epsilon_result(self._engine, state, self._delta, node.events, node.steps)
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
    cls = RECORD_EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EventError(f"unknown record event type {kind!r}; known: {sorted(RECORD_EVENT_TYPES)}")
    return cls.from_dict(data)
