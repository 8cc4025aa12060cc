"""The edge's side of 002's secure aggregation in the lab (scheme ``zcdp-secagg``).

One :class:`~testbed.core.secagg.SecAggDevice` per round, with fresh X25519 keys, Shamir
coefficients and self-mask seed from the OS CSPRNG. Its private keys, seed and the unmasked
update never leave this process; what goes to the aggregator is the state machine's messages
(:mod:`testbed.core.secagg.wire`). The state machine refuses what an honest device refuses
(a second unmasking request, a request that would reveal both secrets of one device).

The edge agent's secure-aggregation phases (:mod:`edge_device.lab.secagg_phases`) drive it:
``round`` (train, :meth:`EdgeSecAgg.begin`) -> ``sa_roster`` (:meth:`~EdgeSecAgg.share`) ->
``sa_inbox`` (the agent records its upload in its ledger, then :meth:`~EdgeSecAgg.mask`) ->
``sa_unmask_req`` (:meth:`~EdgeSecAgg.reveal`); ``sa_abort`` ends the round's session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag

from testbed.core.secagg import ProtocolError as SecAggProtocolError
from testbed.core.secagg import SecAggAbortError
from testbed.core.secagg.aggregation import round_codec
from testbed.core.secagg.device import SecAggDevice
from testbed.core.secagg.wire import (
    inbox_from,
    keys_fields,
    masked_payload,
    reply_fields,
    request_from,
    roster_from,
    shares_fields,
)
from testbed.core.transport.protocol import Message, ProtocolError

#: What a step of the session raises when the device will not go on (it refuses the round).
SESSION_ERRORS = (SecAggProtocolError, SecAggAbortError, ProtocolError, InvalidTag, ValueError)


@dataclass
class Session:
    """This device's state of one round.

    Attributes
    ----------
    round, nonce
        The ``round`` request it answers.
    party
        The protocol's device state machine.
    update
        The noisy local differential it will mask, ``(d,)`` float64.
    event
        Its privacy event of the round (``None`` without DP).
    meta
        ``train_loss``, ``energy_comp_j``, ``energy_comp_source`` for ``sa_masked``.
    expect
        The aggregator message the session waits for next (``sa_roster``, ``sa_inbox``,
        ``sa_unmask_req``).
    """

    round: int
    nonce: str
    party: SecAggDevice
    update: np.ndarray
    event: Any
    meta: dict[str, Any]
    expect: str = "sa_roster"


class EdgeSecAgg:
    """This edge's secure-aggregation sessions, one round at a time.

    Parameters
    ----------
    device
        This device's id.
    d
        Model size.
    summands
        Most updates a round sums (``clients_per_round``): fixes the fixed-point codec,
        the same on the aggregator and every edge.
    """

    def __init__(self, device: int, d: int, summands: int) -> None:
        self.device = device
        self.d = d
        self.codec = round_codec(summands)
        self.session: Session | None = None
        #: Nonces of every round request a session was begun for (a replay is ignored).
        self.seen: set[str] = set()

    def begin(self, t: int, nonce: str, update: np.ndarray, event: Any,
              meta: dict[str, Any]) -> dict[str, Any]:
        """Start round ``t``'s session (a previous one is dropped); returns the ``sa_keys``
        fields (without ``device``, ``nonce``)."""
        party = SecAggDevice(self.device, round_index=t, dimension=self.d, codec=self.codec)
        self.session = Session(t, nonce, party, np.asarray(update, dtype=np.float64), event,
                               meta)
        self.seen.add(nonce)
        return keys_fields(party.advertise_keys())

    def current(self, msg: Message) -> Session | None:
        """The session ``msg`` belongs to (same round and nonce, and the message it waits
        for or ``sa_abort``), else ``None``: a replay or another round's is ignored."""
        s = self.session
        if s is None or msg["round"] != s.round or msg["nonce"] != s.nonce:
            return None
        if msg.type not in (s.expect, "sa_abort"):
            return None
        return s

    def share(self, s: Session, msg: Message) -> dict[str, Any]:
        """``sa_roster`` -> the ``sa_shares`` fields (encrypted shares for each peer)."""
        fields = shares_fields(s.party.share_keys(roster_from(msg)))
        s.expect = "sa_inbox"
        return fields

    def mask(self, s: Session, msg: Message) -> bytes:
        """``sa_inbox`` -> decrypt the shares addressed here, then the ``sa_masked`` payload
        (``d`` uint64 residues)."""
        shares, participants = inbox_from(msg)
        s.expect = "sa_unmask_req"
        s.party.receive_shares(shares, participants)
        return masked_payload(s.party.masked_update(s.update))

    def reveal(self, s: Session, msg: Message) -> dict[str, Any]:
        """``sa_unmask_req`` -> the ``sa_unmask`` fields; the session ends."""
        fields = reply_fields(s.party.reveal_shares(request_from(msg)))
        self.session = None
        return fields

    def end(self) -> None:
        """Drop the session (its keys and update with it)."""
        self.session = None
