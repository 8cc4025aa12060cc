"""The lead of a paced round's slots, sized from what the edges' bursts used of it.

The first slot of a paced round opens ``lead`` seconds after the aggregator sends the
``slot`` messages (:mod:`aggregator.lab.usrp_split`). In that time each edge receives its
message, maps the slot to its radio's clock and hands the burst over; the radio then needs
it in hand before ``tx_time``. The hardware config's lead (``usrp.burst_lead_s`` plus
:data:`aggregator.lab.usrp_split.SLOT_MESSAGE_ALLOWANCE_S`) is sized for a loaded host; on a
quiet one most of it is waiting, every round.

Each on-air upload's transmitter report says how much of its lead was left once the radio
had taken the whole burst (``tx_report.slack_s``). The lead a burst *used* is the lead it
was given (its slot's start less the time the slots were set) less that slack: the control
plane's delivery, the edge's hand-over and the flowgraph's intake. The next round's lead is

    ``min(configured, max(MIN_LEAD_S, SAFETY_FACTOR * worst_used + MARGIN_S))``

over the last :data:`HISTORY_ROUNDS` rounds that reported, never above the configured lead
(the bound the edges' ``deadline_s`` and their clock offsets' drift allowance assume).
A slot missed (a device given a slot that withdrew its burst, or whose window held no frame)
sets the lead back to the configured one and forgets the history: a miss costs that upload
(withdrawn and not charged; or lost), never privacy, and the lead only shrinks again from
fresh reports. Until :data:`WARMUP_ROUNDS` rounds have reported, the configured lead is used.
"""

from __future__ import annotations

from collections import deque

#: Rounds of reports the lead is sized from.
HISTORY_ROUNDS = 8
#: Rounds that must have reported before the lead shrinks below the configured one.
WARMUP_ROUNDS = 2
#: The lead is this many times the most any burst used in the history, ...
SAFETY_FACTOR = 2.0
#: ... plus this (s): a radio's own time to have the burst in hand before ``tx_time``.
MARGIN_S = 0.05
#: The least lead (s) ever given.
MIN_LEAD_S = 0.1


class SlotLead:
    """The slot lead of each paced round (module docstring).

    Parameters
    ----------
    configured_s
        The hardware config's lead (s): the first rounds' and the most ever given.

    Raises
    ------
    ValueError
        ``configured_s`` not positive.
    """

    def __init__(self, configured_s: float) -> None:
        if not configured_s > 0:
            raise ValueError(f"configured_s: need a lead > 0 s, got {configured_s}")
        self.configured_s = float(configured_s)
        #: Each reporting round's most used lead (s), newest last.
        self.history: deque[float] = deque(maxlen=HISTORY_ROUNDS)
        #: The lead (s) each device of the current round was given.
        self.given: dict[int, float] = {}
        self._round_used: list[float] = []

    def next_s(self) -> float:
        """The lead (s) for the next round's slots; folds in the reports of the round
        before (call once per round, before laying out its slots)."""
        if self._round_used:
            self.history.append(max(self._round_used))
            self._round_used = []
        self.given = {}
        if len(self.history) < WARMUP_ROUNDS:
            return self.configured_s
        wanted = SAFETY_FACTOR * max(self.history) + MARGIN_S
        return min(self.configured_s, max(MIN_LEAD_S, wanted))

    def set_given(self, device: int, lead_s: float) -> None:
        """Device ``device``'s burst of this round is due ``lead_s`` seconds after its
        ``slot`` message was sent."""
        self.given[device] = float(lead_s)

    def report(self, device: int, slack_s: float) -> float | None:
        """Device ``device``'s transmitter had ``slack_s`` seconds left once its radio took
        the burst; returns the lead it used (s), ``None`` if it was given no slot."""
        given = self.given.get(device)
        if given is None:
            return None
        used = given - float(slack_s)
        self._round_used.append(used)
        return used

    def missed(self) -> None:
        """A slot of this round was missed: back to the configured lead, history forgotten."""
        self.history.clear()
        self._round_used = []
