"""Composed privacy states shared between devices whose event sequences are identical.

A record-level state (an RDP curve, a PLD) is built by composing contributions one event at
a time, and each contribution is a pure function of its key
(:mod:`testbed.core.privacy.analysis.record_compose`), so the state after a sequence of events is a
pure function of the sequence of keys. :class:`StateTrie` keeps each state once per distinct
sequence: a :class:`Node` holds the state after its sequence, and its children are the
states one key further. A device points at its node; when 1,000 devices make the same
upload, the first one composes and converts, the other 999 find the child already there.

Nothing is approximated: a node's state is computed by exactly the operation the
per-device composition performs (``compose(parent state, contribution_of(key))``), keys are
compared with ``==`` (the floats of the computation itself), and a node is only ever reached
by its own sequence. So every device's state, and every epsilon converted from it, is bit
for bit what composing that device's events one by one gives.

Memory: a parent holds its children weakly and a child does not hold its parent, so a node
lives while a device (or a pending what-if) points at it, or while it is among the last
``keep_recent`` nodes created: that lets a device that lags behind (it sat out some rounds
under device sampling, or joins late) find the states the others made, instead of composing
them again. Once every device has moved past a prefix and it is no longer recent, its state
is freed. So the states kept are one per distinct current history plus at most
``keep_recent``; a freed state that is needed again is composed again, identically.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Hashable
from typing import Any

#: Recently created states held for devices that lag behind (a few MB of PLDs at most).
KEEP_RECENT = 256


class Node:
    """The state after one sequence of events, and what was derived from it.

    Attributes
    ----------
    state
        The composed state (engine-specific; never modified in place).
    events
        Length of the sequence.
    steps
        Sum of the events' steps.
    result
        Cached conversion of ``state`` (set by the owner; ``None`` until then).
    """

    __slots__ = ("__weakref__", "children", "events", "result", "state", "steps")

    def __init__(self, state: Any, events: int, steps: int) -> None:
        self.state = state
        self.events = events
        self.steps = steps
        self.result: Any = None
        # key -> weak reference to the child (a dead reference is replaced when met again)
        self.children: dict[Hashable, weakref.ref[Node]] = {}


class StateTrie:
    """Interned composition of per-device event sequences.

    Parameters
    ----------
    identity
        The state of the empty sequence.
    compose
        ``compose(state, key) -> state``: the state one event further (must be a pure
        function of its arguments; the states it is given are never modified).
    steps_of
        ``steps_of(key) -> int``: the steps one event of ``key`` adds (a function of the key,
        so that a shared node's step count is right for every sequence reaching it).
    keep_recent
        How many of the most recently created nodes are held even when no device points at
        them (``>= 0``).
    """

    def __init__(self, identity: Any, compose: Callable[[Any, Hashable], Any],
                 steps_of: Callable[[Hashable], int], keep_recent: int = KEEP_RECENT) -> None:
        if isinstance(keep_recent, bool) or not isinstance(keep_recent, int) or keep_recent < 0:
            raise ValueError(f"StateTrie: keep_recent={keep_recent!r} must be an integer >= 0")
        self.root = Node(identity, 0, 0)
        self._compose = compose
        self._steps_of = steps_of
        self._recent: collections.deque[Node] = collections.deque(maxlen=keep_recent)
        self.composed = 0  # compositions actually computed (for benchmarks and tests)

    def child(self, node: Node, key: Hashable) -> Node:
        """The node one event of ``key`` after ``node`` (composed on first use)."""
        link = node.children.get(key)
        if link is not None:
            found = link()
            if found is not None:
                return found
        found = Node(self._compose(node.state, key), node.events + 1,
                     node.steps + self._steps_of(key))
        node.children[key] = weakref.ref(found)
        self._recent.append(found)
        self.composed += 1
        return found
