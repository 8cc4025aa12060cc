"""A ledger replay composed a run at a time: bit for bit the same as event by event.

A ledger read (:mod:`~testbed.core.privacy.ledger_shape`) gives long *runs* of copies of one
event: every field but ``round`` and ``device`` the same, one shared store of derived values
(:meth:`~testbed.core.privacy.events.JsonEvent.for_round_and_device`). Within such a run every
event has the same contribution key, so what event-by-event composition does to a device
depends only on how many of the run's events are its own:

* its node moves ``c`` children down the state trie (``child(child(...(node, key)...))``,
  ``c`` times), where ``c`` is its number of events in the run;
* its history gains its events, in the run's order.

:func:`advance_run` does exactly that with a stable sort by device instead of a dictionary
lookup per event. Devices are taken in the order of their first event, so the dictionaries
of nodes and histories gain new devices in the same order as event by event, and every
trie node is composed from the same parent and key (the nodes composed here are held until
the run is done, so none is composed twice). Runs shorter than :data:`MIN_RUN` events, and
runs whose devices do not fit int64, go event by event.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import compress, repeat
from operator import attrgetter, is_, is_not
from typing import Any

import numpy as np

from testbed.core.privacy.accountants.state_trie import Node
from testbed.core.privacy.events import DERIVED_STORE

#: Runs shorter than this go event by event (the sort's fixed cost is larger there).
MIN_RUN = 256

_device_of = attrgetter("device")
_dict_of = attrgetter("__dict__")


def run_starts(events: Sequence[Any]) -> list[int]:
    """Where each run of ``events`` starts: the indices ``i`` where the event's store of
    derived values is not the one of event ``i - 1``, and every event without a store
    (each such event is a run of its own). Always starts with 0 for a non-empty list."""
    n = len(events)
    if n == 0:
        return []
    stores: list[Any] = list(map(dict.get, map(_dict_of, events), repeat(DERIVED_STORE)))
    if any(map(is_, stores, repeat(None))):
        stores = [object() if s is None else s for s in stores]  # never equal to a neighbour
    return [0, *compress(range(1, n), map(is_not, stores[1:], stores[:-1]))]


def advance_run(
    events: Sequence[Any], key: Hashable, child: Callable[[Node, Hashable], Node], root: Node,
    nodes: dict[int, Node], history: dict[int, list[Any]],
) -> None:
    """Add a run of ``events`` of one contribution ``key``: each device's node moves one
    ``child(node, key)`` per event of its own, and its history gains its events in order.

    Parameters
    ----------
    events
        The run, in ledger order, shape ``(n,)``; every event has the same ``key``.
    key
        Their contribution key.
    child
        The trie's ``child(node, key)``.
    root
        The trie's root (the node of a device with no events).
    nodes, history
        The accountant's device -> node and device -> events, updated in place.
    """
    n = len(events)
    devices = _devices(events) if n >= MIN_RUN else None
    if devices is None:
        _advance_each(events, key, child, root, nodes, history)
        return
    order = np.argsort(devices, kind="stable")
    ordered = devices[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    by_first = np.argsort(order[starts])  # the devices in the order of their first event
    grouped = np.fromiter(events, dtype=object, count=n)[order]
    chains: dict[int, list[Node]] = {}  # id(start node) -> [start, its child, ...]
    for g in by_first.tolist():
        device, a, b = int(ordered[starts[g]]), int(starts[g]), int(ends[g])
        start = nodes.get(device, root)
        chain = chains.get(id(start))
        if chain is None:
            chain = chains[id(start)] = [start]
        while len(chain) <= b - a:
            chain.append(child(chain[-1], key))
        nodes[device] = chain[b - a]
        own = grouped[a:b].tolist()
        events_of = history.get(device)
        if events_of is None:
            history[device] = own
        else:
            events_of.extend(own)


def _devices(events: Sequence[Any]) -> np.ndarray | None:
    """The events' devices as int64, shape ``(n,)``; ``None`` when one does not fit."""
    try:
        return np.fromiter(map(_device_of, events), dtype=np.int64, count=len(events))
    except (OverflowError, TypeError, ValueError):
        return None


def _advance_each(
    events: Sequence[Any], key: Hashable, child: Callable[[Node, Hashable], Node], root: Node,
    nodes: dict[int, Node], history: dict[int, list[Any]],
) -> None:
    """:func:`advance_run` event by event: a device where the last event's device was moves
    to the node that one moved to."""
    parent: Node | None = None
    reached: Node | None = None
    for event in events:
        device = event.device
        node = nodes.get(device, root)
        if node is not parent:
            parent, reached = node, child(node, key)
        nodes[device] = reached  # type: ignore[assignment]
        events_of = history.get(device)
        if events_of is None:
            history[device] = [event]
        else:
            events_of.append(event)
