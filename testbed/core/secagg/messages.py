"""The messages of secure aggregation (:mod:`testbed.core.secagg`), device -> server and
server -> devices, and :class:`ServerView`, everything the server received in a round."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from testbed.core.secagg.codec import UInt64Array
from testbed.core.secagg.crypto import ShamirShare


@dataclass(frozen=True)
class AdvertiseKeys:
    """Device -> server, phase 0: the two X25519 public keys (32 bytes each)."""

    device: int
    round_index: int
    mask_public: bytes
    channel_public: bytes


@dataclass(frozen=True)
class EncryptedShare:
    """One device's shares for one peer: AES-256-GCM ciphertext the server only relays."""

    sender: int
    recipient: int
    nonce: bytes
    ciphertext: bytes


@dataclass(frozen=True)
class ShareKeys:
    """Device -> server, phase 1: encrypted shares for every other member of ``U1``."""

    device: int
    round_index: int
    shares: tuple[EncryptedShare, ...]


@dataclass(frozen=True, eq=False)
class MaskedInput:
    """Device -> server, phase 2: the masked update, ``(d,)`` uint64 residues mod ``2^k``."""

    device: int
    round_index: int
    masked: UInt64Array


@dataclass(frozen=True)
class UnmaskingReply:
    """Device -> server, phase 3: ``(owner, share)`` of self-mask seeds and mask keys."""

    device: int
    round_index: int
    self_mask_shares: tuple[tuple[int, ShamirShare], ...]
    mask_key_shares: tuple[tuple[int, ShamirShare], ...]


@dataclass(frozen=True)
class Roster:
    """Server -> devices after phase 0: ``U1`` and its public keys."""

    round_index: int
    threshold: int
    keys: Mapping[int, AdvertiseKeys]


@dataclass(frozen=True)
class UnmaskingRequest:
    """Server -> survivors after phase 2: whose input arrived (``U3``) and who dropped."""

    round_index: int
    received: frozenset[int]
    dropped: frozenset[int]


@dataclass
class ServerView:
    """Everything the server received in one round, in arrival order per phase."""

    keys: list[AdvertiseKeys] = field(default_factory=list)
    share_keys: list[ShareKeys] = field(default_factory=list)
    masked: list[MaskedInput] = field(default_factory=list)
    unmasking: list[UnmaskingReply] = field(default_factory=list)
    late: list[MaskedInput] = field(default_factory=list)

    def messages(self) -> list[object]:
        """All received messages, phase by phase."""
        return [*self.keys, *self.share_keys, *self.masked, *self.unmasking, *self.late]
