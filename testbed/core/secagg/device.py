"""A device's side of secure aggregation (:mod:`testbed.core.secagg`): the state machine
that advertises keys, shares them, masks the update and answers the unmasking request."""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from testbed.core.secagg import MIN_DEVICES, ProtocolError, SecAggAbortError
from testbed.core.secagg.codec import FixedPointCodec
from testbed.core.secagg.crypto import (
    KEY_BYTES,
    RandomBytes,
    ShamirShare,
    channel_key,
    expand_mask,
    id_bytes,
    mask_sign,
    pairwise_seed,
    self_mask_seed,
    shamir_split,
)
from testbed.core.secagg.messages import (
    AdvertiseKeys,
    EncryptedShare,
    MaskedInput,
    Roster,
    ShareKeys,
    UnmaskingReply,
    UnmaskingRequest,
)

_SHARE_BYTES = 66


class SecAggDevice:
    """One device's state machine for one round.

    Parameters
    ----------
    device_id
        Non-negative integer id (Shamir point ``device_id + 1``).
    round_index
        Round number (bound into every key derivation and ciphertext).
    dimension
        ``d``, length of the update.
    codec
        Fixed-point codec shared by the round.
    self_masks
        Double masking (default). Without it, a device the server wrongly declares dropped
        is exposed once its input arrives late (see the docs).
    random_bytes
        Entropy source ``n -> n bytes`` for keys, seeds, Shamir and nonces.
    """

    def __init__(self, device_id: int, *, round_index: int, dimension: int,
                 codec: FixedPointCodec, self_masks: bool = True,
                 random_bytes: RandomBytes = secrets.token_bytes) -> None:
        if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
            raise ValueError(f"SecAggDevice: device_id={device_id!r} must be an integer >= 0")
        if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
            raise ValueError(f"SecAggDevice: dimension={dimension!r} must be an integer >= 1")
        self.device_id = device_id
        self.round_index = int(round_index)
        self.dimension = dimension
        self.codec = codec
        self.self_masks = self_masks
        self._random = random_bytes
        self._mask_key = X25519PrivateKey.from_private_bytes(random_bytes(KEY_BYTES))
        self._channel = X25519PrivateKey.from_private_bytes(random_bytes(KEY_BYTES))
        self._seed = random_bytes(KEY_BYTES) if self_masks else b""
        self._state = "new"
        self._roster: Roster | None = None
        self._participants: frozenset[int] = frozenset()
        self._held: dict[int, tuple[ShamirShare | None, ShamirShare]] = {}

    def _expect(self, state: str, action: str) -> None:
        if self._state != state:
            raise ProtocolError(f"device {self.device_id}: cannot {action} in state "
                                f"{self._state!r} (expected {state!r})")

    def advertise_keys(self) -> AdvertiseKeys:
        """Phase 0: the public keys."""
        self._expect("new", "advertise keys")
        self._state = "advertised"
        return AdvertiseKeys(self.device_id, self.round_index,
                             self._mask_key.public_key().public_bytes_raw(),
                             self._channel.public_key().public_bytes_raw())

    def share_keys(self, roster: Roster) -> ShareKeys:
        """Phase 1: Shamir-share the mask key (and self-mask seed) to every peer in ``U1``."""
        self._expect("advertised", "share keys")
        if roster.round_index != self.round_index or self.device_id not in roster.keys:
            raise ProtocolError(f"device {self.device_id}: roster of round "
                                f"{roster.round_index} does not list it")
        members = sorted(roster.keys)
        if len(members) < MIN_DEVICES or not 2 <= roster.threshold <= len(members) - 1:
            raise ProtocolError(f"device {self.device_id}: threshold {roster.threshold} "
                                f"outside [2, {len(members) - 1}] for {len(members)} devices")
        xs = [j + 1 for j in members]  # every member of U1, this device included
        t = roster.threshold
        key_shares = shamir_split(self._mask_key.private_bytes_raw(), threshold=t, xs=xs,
                                  random_bytes=self._random)
        seed_shares = (shamir_split(self._seed, threshold=t, xs=xs, random_bytes=self._random)
                       if self.self_masks else [ShamirShare(x, 0) for x in xs])
        out = []
        for j, ks, ss in zip(members, key_shares, seed_shares, strict=True):
            if j == self.device_id:  # kept: it answers for its own self-mask seed
                self._held[j] = (ss if self.self_masks else None, ks)
                continue
            aead = channel_key(self._channel, roster.keys[j].channel_public,
                               self.round_index, self.device_id, j)
            nonce = self._random(12)
            plain = ss.y.to_bytes(_SHARE_BYTES, "big") + ks.y.to_bytes(_SHARE_BYTES, "big")
            aad = id_bytes(self.round_index, self.device_id, j)
            out.append(EncryptedShare(self.device_id, j, nonce, aead.encrypt(nonce, plain, aad)))
        self._roster = roster
        self._state = "shared"
        return ShareKeys(self.device_id, self.round_index, tuple(out))

    def receive_shares(self, shares: Sequence[EncryptedShare],
                       participants: Collection[int]) -> None:
        """Phase 1 -> 2: decrypt the shares addressed to this device; ``participants`` = ``U2``."""
        self._expect("shared", "receive shares")
        assert self._roster is not None
        u2 = frozenset(participants)
        if self.device_id not in u2 or not u2 <= set(self._roster.keys):
            raise ProtocolError(f"device {self.device_id}: U2={sorted(u2)} is not a subset of "
                                "the roster containing this device")
        if len(u2) < self._roster.threshold:
            raise SecAggAbortError(f"device {self.device_id}: |U2|={len(u2)} below threshold "
                                   f"{self._roster.threshold}")
        for msg in shares:
            if msg.recipient != self.device_id or msg.sender not in u2:
                raise ProtocolError(f"device {self.device_id}: unexpected share {msg.sender}"
                                    f"->{msg.recipient}")
            aead = channel_key(self._channel, self._roster.keys[msg.sender].channel_public,
                               self.round_index, self.device_id, msg.sender)
            plain = aead.decrypt(msg.nonce, msg.ciphertext,
                                 id_bytes(self.round_index, msg.sender, self.device_id))
            x = self.device_id + 1
            seed_y = int.from_bytes(plain[:_SHARE_BYTES], "big")
            key_y = int.from_bytes(plain[_SHARE_BYTES:], "big")
            self._held[msg.sender] = (ShamirShare(x, seed_y) if self.self_masks else None,
                                      ShamirShare(x, key_y))
        missing = u2 - {self.device_id} - set(self._held)
        if missing:
            raise ProtocolError(f"device {self.device_id}: no shares from {sorted(missing)}")
        self._participants = u2
        self._state = "ready"

    def masked_update(self, update: npt.ArrayLike) -> MaskedInput:
        """Phase 2: encode ``update`` (shape ``(d,)``, update units) and mask it.

        Returns the message whose ``masked`` field is ``(d,)`` uint64 mod ``2^k``.
        """
        self._expect("ready", "mask an update")
        assert self._roster is not None
        x = np.asarray(update, dtype=np.float64)
        if x.shape != (self.dimension,):
            raise ValueError(f"device {self.device_id}: update shape {x.shape}, expected "
                             f"({self.dimension},)")
        self.codec.check_summands(len(self._participants))
        k, c = self.codec.modulus_bits, self.codec
        y = c.encode(x)
        if self.self_masks:
            seed = self_mask_seed(self._seed, round_index=self.round_index, device=self.device_id)
            y = c.add(y, expand_mask(seed, self.dimension, k))
        for j in sorted(self._participants - {self.device_id}):
            s = pairwise_seed(self._mask_key, self._roster.keys[j].mask_public,
                              round_index=self.round_index, a=self.device_id, b=j)
            m = expand_mask(s, self.dimension, k)
            y = c.add(y, m) if mask_sign(self.device_id, j) > 0 else c.sub(y, m)
        self._state = "masked"
        y.setflags(write=False)
        return MaskedInput(self.device_id, self.round_index, y)

    def reveal_shares(self, request: UnmaskingRequest) -> UnmaskingReply:
        """Phase 3: shares of ``b_j`` for ``j`` in ``U3``, of the mask key for dropped ``j``.

        Refuses (``ProtocolError``) a request that does not partition ``U2``, that lists this
        device as dropped, that has fewer than ``t`` received inputs, or a second request: so
        the server never holds both secrets of one device.
        """
        self._expect("masked", "reveal shares")
        assert self._roster is not None
        got, dropped = frozenset(request.received), frozenset(request.dropped)
        if (request.round_index != self.round_index or got & dropped
                or got | dropped != self._participants or self.device_id not in got):
            raise ProtocolError(f"device {self.device_id}: request does not partition "
                                f"U2={sorted(self._participants)} with this device received")
        if len(got) < self._roster.threshold:
            raise ProtocolError(f"device {self.device_id}: |U3|={len(got)} below threshold "
                                f"{self._roster.threshold}: refusing to unmask")
        self._state = "revealed"
        seeds = tuple((j, s) for j in sorted(got) if (s := self._held[j][0]) is not None)
        keys = tuple((j, self._held[j][1]) for j in sorted(dropped))
        return UnmaskingReply(self.device_id, self.round_index, seeds, keys)
