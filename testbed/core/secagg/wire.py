"""002's secure-aggregation messages on the control plane: the message objects of
:mod:`testbed.core.secagg` to and from the fields of the ``sa_*`` messages of
:mod:`testbed.core.transport.protocol`.

:mod:`testbed.core.transport.protocol` checks sizes and shapes; the ``*_from`` functions here check
what a field means for this round (the sender is the owner, Shamir points and ordinates in range)
and raise :class:`testbed.core.transport.protocol.ProtocolError` otherwise, so a bad message is
dropped like any other junk. Bytes travel as lower-case hex, the masked update as the payload (``d``
little-endian uint64 residues).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from testbed.core.secagg.crypto import SHAMIR_PRIME, ShamirShare
from testbed.core.secagg.messages import (
    AdvertiseKeys,
    EncryptedShare,
    MaskedInput,
    Roster,
    ShareKeys,
    UnmaskingReply,
    UnmaskingRequest,
)
from testbed.core.transport.protocol import Message, ProtocolError
from testbed.core.transport.protocol_schema import SECAGG_ORDINATE_HEX


def keys_fields(msg: AdvertiseKeys) -> dict[str, Any]:
    """``sa_keys`` fields (without ``device``, ``nonce``) of a device's phase-0 message."""
    return {"round": msg.round_index, "mask_public": msg.mask_public.hex(),
            "channel_public": msg.channel_public.hex()}


def keys_from(msg: Message) -> AdvertiseKeys:
    """The :class:`AdvertiseKeys` an ``sa_keys`` message carries."""
    return AdvertiseKeys(msg["device"], msg["round"], bytes.fromhex(msg["mask_public"]),
                         bytes.fromhex(msg["channel_public"]))


def roster_fields(roster: Roster) -> dict[str, Any]:
    """``sa_roster`` fields (without ``device``, ``nonce``)."""
    keys = [{"device": j, "mask_public": k.mask_public.hex(),
             "channel_public": k.channel_public.hex()} for j, k in sorted(roster.keys.items())]
    return {"round": roster.round_index, "threshold": roster.threshold, "keys": keys}


def roster_from(msg: Message) -> Roster:
    """The :class:`Roster` an ``sa_roster`` message carries."""
    t = msg["round"]
    keys = {k["device"]: AdvertiseKeys(k["device"], t, bytes.fromhex(k["mask_public"]),
                                       bytes.fromhex(k["channel_public"]))
            for k in msg["keys"]}
    return Roster(t, msg["threshold"], keys)


def shares_fields(msg: ShareKeys) -> dict[str, Any]:
    """``sa_shares`` fields (without ``device``, ``nonce``) of a device's phase-1 message."""
    return {"round": msg.round_index, "shares": [
        {"recipient": s.recipient, "nonce": s.nonce.hex(), "ciphertext": s.ciphertext.hex()}
        for s in msg.shares]}


def shares_from(msg: Message, members: Collection[int]) -> ShareKeys:
    """The :class:`ShareKeys` an ``sa_shares`` message carries.

    Raises
    ------
    ProtocolError
        Unless it addresses exactly every other member of ``members`` (``U1``): a device
        that leaves a peer out could not be recovered by it.
    """
    me = msg["device"]
    recipients = {s["recipient"] for s in msg["shares"]}
    if recipients != set(members) - {me}:
        raise ProtocolError(f"sa_shares: device {me} addressed {sorted(recipients)}, not every "
                            f"other member of U1 {sorted(set(members) - {me})}")
    shares = tuple(EncryptedShare(me, s["recipient"], bytes.fromhex(s["nonce"]),
                                  bytes.fromhex(s["ciphertext"])) for s in msg["shares"])
    return ShareKeys(me, msg["round"], shares)


def inbox_fields(round_index: int, participants: Collection[int],
                 shares: Sequence[EncryptedShare]) -> dict[str, Any]:
    """``sa_inbox`` fields (without ``device``, ``nonce``): ``U2`` and the ciphertexts
    addressed to the recipient."""
    return {"round": round_index, "participants": sorted(participants), "shares": [
        {"sender": s.sender, "nonce": s.nonce.hex(), "ciphertext": s.ciphertext.hex()}
        for s in shares]}


def inbox_from(msg: Message) -> tuple[list[EncryptedShare], frozenset[int]]:
    """The ciphertexts addressed to the recipient and ``U2`` of an ``sa_inbox`` message."""
    me = msg["device"]
    shares = [EncryptedShare(s["sender"], me, bytes.fromhex(s["nonce"]),
                             bytes.fromhex(s["ciphertext"])) for s in msg["shares"]]
    return shares, frozenset(msg["participants"])


def masked_payload(msg: MaskedInput) -> bytes:
    """The ``sa_masked`` payload: ``d`` little-endian uint64 residues."""
    return np.ascontiguousarray(msg.masked, dtype="<u8").tobytes()


def masked_from(msg: Message) -> MaskedInput:
    """The :class:`MaskedInput` an ``sa_masked`` message carries (``(d,)`` uint64)."""
    assert msg.payload is not None  # the protocol checked its length: 8 d bytes
    masked = np.frombuffer(msg.payload, dtype="<u8").astype(np.uint64)
    return MaskedInput(msg["device"], msg["round"], masked)


def request_fields(request: UnmaskingRequest) -> dict[str, Any]:
    """``sa_unmask_req`` fields (without ``device``, ``nonce``)."""
    return {"round": request.round_index, "received": sorted(request.received),
            "dropped": sorted(request.dropped)}


def request_from(msg: Message) -> UnmaskingRequest:
    """The :class:`UnmaskingRequest` an ``sa_unmask_req`` message carries."""
    return UnmaskingRequest(msg["round"], frozenset(msg["received"]),
                            frozenset(msg["dropped"]))


def reply_fields(reply: UnmaskingReply) -> dict[str, Any]:
    """``sa_unmask`` fields (without ``device``, ``nonce``) of a device's phase-3 message."""
    def enc(items: tuple[tuple[int, ShamirShare], ...]) -> list[list[Any]]:
        return [[j, s.x, s.y.to_bytes(SECAGG_ORDINATE_HEX // 2, "big").hex()] for j, s in items]

    return {"round": reply.round_index, "self_mask_shares": enc(reply.self_mask_shares),
            "mask_key_shares": enc(reply.mask_key_shares)}


def reply_from(msg: Message, request: UnmaskingRequest) -> UnmaskingReply:
    """The :class:`UnmaskingReply` an ``sa_unmask`` message carries.

    Raises
    ------
    ProtocolError
        A share at another point than the sender's (``device + 1``), an ordinate outside
        GF(2^521 - 1), or shares of owners the request did not ask for (self-mask seeds of
        ``U3``, mask keys of the dropped).
    """
    me = msg["device"]

    def dec(key: str, owners: frozenset[int]) -> tuple[tuple[int, ShamirShare], ...]:
        out = []
        for owner, x, y_hex in msg[key]:
            y = int(y_hex, 16)
            if x != me + 1 or y >= SHAMIR_PRIME or owner not in owners:
                raise ProtocolError(f"sa_unmask: device {me}'s {key} entry of owner {owner} "
                                    "is not a share this round asked for")
            out.append((owner, ShamirShare(x, y)))
        return tuple(out)

    return UnmaskingReply(me, msg["round"], dec("self_mask_shares", request.received),
                          dec("mask_key_shares", request.dropped))
