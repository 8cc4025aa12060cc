"""The server's side of secure aggregation (:mod:`testbed.core.secagg`): the
honest-but-curious state machine that relays keys and shares, collects the masked inputs,
reconstructs the masks of the sum and decodes it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from testbed.core.secagg import MIN_DEVICES, ProtocolError, SecAggAbortError
from testbed.core.secagg.codec import FixedPointCodec
from testbed.core.secagg.crypto import (
    ShamirShare,
    expand_mask,
    mask_sign,
    pairwise_seed,
    self_mask_seed,
    shamir_combine,
)
from testbed.core.secagg.messages import (
    AdvertiseKeys,
    EncryptedShare,
    MaskedInput,
    Roster,
    ServerView,
    ShareKeys,
    UnmaskingReply,
    UnmaskingRequest,
)


class SecAggServer:
    """The honest-but-curious server's state machine for one round.

    Parameters
    ----------
    round_index, dimension, codec, self_masks
        As for :class:`SecAggDevice` (the server must use the same values).
    threshold
        Shamir threshold ``t``; default ``|U1| // 2 + 1``, must lie in ``[2, |U1| - 1]`` (so
        that at least one device may drop). Each device holds one share of every member's
        secrets, its own included.
    """

    def __init__(self, *, round_index: int, dimension: int, codec: FixedPointCodec,
                 threshold: int | None = None, self_masks: bool = True) -> None:
        if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
            raise ValueError(f"SecAggServer: dimension={dimension!r} must be an integer >= 1")
        self.round_index = int(round_index)
        self.dimension = dimension
        self.codec = codec
        self.self_masks = self_masks
        self._threshold = threshold
        self.view = ServerView()
        self._state = "keys"
        self._roster: Roster | None = None
        self._u2: frozenset[int] = frozenset()
        self._u3: frozenset[int] = frozenset()
        self._inputs: dict[int, MaskedInput] = {}
        self._sum_int: npt.NDArray[np.int64] | None = None

    def _expect(self, state: str, action: str) -> None:
        if self._state != state:
            raise ProtocolError(f"server: cannot {action} in state {self._state!r}")

    @property
    def threshold(self) -> int:
        """``t`` (after :meth:`roster`)."""
        if self._roster is None:
            raise ProtocolError("server: threshold is fixed by roster()")
        return self._roster.threshold

    def receive_keys(self, msg: AdvertiseKeys) -> None:
        """Phase 0 input."""
        self._expect("keys", "receive keys")
        if msg.round_index != self.round_index or any(m.device == msg.device
                                                      for m in self.view.keys):
            raise ProtocolError(f"server: duplicate or foreign keys from {msg.device}")
        self.view.keys.append(msg)

    def roster(self) -> Roster:
        """Close phase 0: ``U1`` (at least 3 devices) and the threshold."""
        self._expect("keys", "publish the roster")
        keys = {m.device: m for m in self.view.keys}
        n1 = len(keys)
        if n1 < MIN_DEVICES:
            raise SecAggAbortError(f"server: |U1|={n1} devices advertised keys, need "
                                   f"{MIN_DEVICES}")
        t = n1 // 2 + 1 if self._threshold is None else self._threshold
        if isinstance(t, bool) or not isinstance(t, int) or not 2 <= t <= n1 - 1:
            raise ValueError(f"SecAggServer: threshold={t!r} must be an integer in "
                             f"[2, |U1| - 1 = {n1 - 1}]")
        self.codec.check_summands(n1)
        self._roster = Roster(self.round_index, t, keys)
        self._state = "shares"
        return self._roster

    def receive_share_keys(self, msg: ShareKeys) -> None:
        """Phase 1 input."""
        self._expect("shares", "receive shares")
        assert self._roster is not None
        if msg.device not in self._roster.keys or any(m.device == msg.device
                                                      for m in self.view.share_keys):
            raise ProtocolError(f"server: unexpected ShareKeys from {msg.device}")
        self.view.share_keys.append(msg)

    def forward_shares(self) -> tuple[frozenset[int], dict[int, list[EncryptedShare]]]:
        """Close phase 1: ``U2`` and, per member, the ciphertexts addressed to it."""
        self._expect("shares", "forward shares")
        u2 = frozenset(m.device for m in self.view.share_keys)
        if len(u2) < self.threshold:
            raise SecAggAbortError(f"server: |U2|={len(u2)} below threshold {self.threshold}")
        inbox: dict[int, list[EncryptedShare]] = {j: [] for j in u2}
        for msg in self.view.share_keys:
            for enc in msg.shares:
                if enc.recipient in u2:
                    inbox[enc.recipient].append(enc)
        self._u2 = u2
        self._state = "masked"
        return u2, inbox

    def receive_masked(self, msg: MaskedInput) -> None:
        """Phase 2 input; one arriving after :meth:`unmasking_request` is kept in ``view.late``."""
        if self._state != "masked":
            self.view.late.append(msg)
            return
        masked = np.asarray(msg.masked)
        if (msg.device not in self._u2 or msg.device in self._inputs
                or masked.shape != (self.dimension,) or masked.dtype != np.uint64):
            raise ProtocolError(f"server: bad MaskedInput from {msg.device}")
        self.view.masked.append(msg)
        self._inputs[msg.device] = msg

    def unmasking_request(self) -> UnmaskingRequest:
        """Close phase 2: ``U3`` = inputs received (at least ``t``), the rest of ``U2`` dropped."""
        self._expect("masked", "request unmasking")
        u3 = frozenset(self._inputs)
        if len(u3) < self.threshold:
            raise SecAggAbortError(f"server: only {len(u3)} masked inputs arrived, fewer than "
                                   f"the threshold t={self.threshold}")
        self._u3 = u3
        self._state = "unmask"
        return UnmaskingRequest(self.round_index, u3, self._u2 - u3)

    def receive_unmasking(self, reply: UnmaskingReply) -> None:
        """Phase 3 input."""
        self._expect("unmask", "receive unmasking replies")
        if reply.device not in self._u3 or any(m.device == reply.device
                                               for m in self.view.unmasking):
            raise ProtocolError(f"server: unexpected UnmaskingReply from {reply.device}")
        self.view.unmasking.append(reply)

    @property
    def included(self) -> frozenset[int]:
        """``U3``: the devices whose updates are in the sum."""
        return self._u3

    def aggregate(self) -> npt.NDArray[np.float64]:
        """Sum of the ``U3`` updates, shape ``(d,)`` float64 (update units).

        Raises ``SecAggAbortError`` with fewer than ``t`` replies, or when a residue is left
        (the signed sum exceeds ``|U3| * max_int``, which a wrong mask makes near certain).
        """
        self._expect("unmask", "aggregate")
        assert self._roster is not None
        t, k, c = self.threshold, self.codec.modulus_bits, self.codec
        if len(self.view.unmasking) < t:
            raise SecAggAbortError(f"server: {len(self.view.unmasking)} devices answered the "
                                   f"unmasking request, fewer than the threshold t={t}")
        dropped = self._u2 - self._u3
        seed_shares: dict[int, list[ShamirShare]] = {j: [] for j in self._u3}
        key_shares: dict[int, list[ShamirShare]] = {j: [] for j in dropped}
        for reply in self.view.unmasking:
            for j, s in reply.self_mask_shares:
                seed_shares[j].append(s)
            for j, s in reply.mask_key_shares:
                key_shares[j].append(s)
        total = np.zeros(self.dimension, dtype=np.uint64)
        for j in sorted(self._u3):
            total = c.add(total, self._inputs[j].masked)
            if self.self_masks:
                seed = shamir_combine(seed_shares[j], threshold=t)
                total = c.sub(total, expand_mask(
                    self_mask_seed(seed, round_index=self.round_index, device=j),
                    self.dimension, k))
        for j in sorted(dropped):
            secret = X25519PrivateKey.from_private_bytes(
                shamir_combine(key_shares[j], threshold=t))
            if secret.public_key().public_bytes_raw() != self._roster.keys[j].mask_public:
                raise SecAggAbortError(f"server: reconstructed key of {j} does not match")
            for i in sorted(self._u3):
                pair = pairwise_seed(secret, self._roster.keys[i].mask_public,
                                     round_index=self.round_index, a=i, b=j)
                m = expand_mask(pair, self.dimension, k)
                total = c.sub(total, m) if mask_sign(i, j) > 0 else c.add(total, m)
        signed = c.to_signed(total)
        if np.any(np.abs(signed) > len(self._u3) * c.max_int):
            raise SecAggAbortError("server: unmasking left a residue (inconsistent masks)")
        self._sum_int = signed
        self._state = "done"
        return signed.astype(np.float64) / c.scale

    def integer_sum(self) -> npt.NDArray[np.int64]:
        """The signed fixed-point sum of the ``U3`` encodings (after :meth:`aggregate`)."""
        if self._sum_int is None:
            raise ProtocolError("server: integer_sum() before aggregate()")
        return self._sum_int.copy()
