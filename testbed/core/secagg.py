"""Pairwise-mask secure aggregation with dropout recovery (Bonawitz et al., CCS 2017).

002 (Section IV-B, Fig. 2) masks each device's fixed-point update with pairwise PRF masks
that cancel in the sum and assumes no participant drops. This module implements the
protocol it cites, [25], in its honest-but-curious form, one instance per round:

0. ``AdvertiseKeys``: each device draws two fresh X25519 key pairs (mask, channel) and sends
   the public keys; the server forwards the roster (``U1``, at least 3 devices).
1. ``ShareKeys``: each device Shamir-shares (``t`` of ``|U1|`` points, one per member, its
   own kept; prime field ``2^521 - 1``) its mask private key and, with double masking, a
   fresh self-mask seed ``b_i``; every share travels AES-256-GCM-encrypted under the pairwise
   channel key, so the server relays ciphertexts only. Senders form ``U2``.
2. ``MaskedInput``: ``y_i = enc(x_i) + PRG(b_i) + sum_{j in U2, j > i} PRG(s_ij)
   - sum_{j in U2, j < i} PRG(s_ij) mod 2^k`` with ``s_ij = HKDF-SHA256(X25519(i, j))`` and
   ``PRG`` = AES-256-CTR keystream. Senders form ``U3`` (``|U3| >= t``).
3. ``UnmaskingReply``: each survivor reveals its share of ``b_j`` for ``j in U3`` and of
   the mask key of ``j in U2 \\ U3``; an honest device answers once and never both for one
   ``j``. The server reconstructs, removes the self-masks and the unmatched pairwise masks,
   and decodes the sum of the ``U3`` updates.

Every message the server receives is a frozen dataclass recorded in :class:`ServerView`.
Randomness comes from ``random_bytes`` (default :func:`secrets.token_bytes`); tests pass a
seeded source to be reproducible. See ``docs/peers/zcdp-secagg.md``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

RandomBytes = Callable[[int], bytes]
UInt64Array = npt.NDArray[np.uint64]

#: Shamir field: the Mersenne prime 2^521 - 1 (> 2^256, so any 32-byte secret fits).
SHAMIR_PRIME = 2**521 - 1
_SHARE_BYTES = 66
_KEY_BYTES = 32
_INFO_PAIR = b"dpfl-testbed/secagg/v1/pairwise-mask"
_INFO_SELF = b"dpfl-testbed/secagg/v1/self-mask"
_INFO_CHANNEL = b"dpfl-testbed/secagg/v1/share-channel"
_MIN_DEVICES = 3


class SecAggAbortError(RuntimeError):
    """The round cannot complete (too few devices, shares or survivors; unmasking failed)."""


class ProtocolError(RuntimeError):
    """A call out of order, or a request an honest party refuses."""


# --------------------------------------------------------------------- fixed point


@dataclass(frozen=True)
class FixedPointCodec:
    """Real vectors <-> integers mod ``2^k``, two's complement.

    ``encode(x) = round(clip(x, -clip, clip) * scale) mod 2^k``. A sum of ``s`` encodings
    decodes exactly when ``s * max_int <= 2^(k-1) - 1`` (:meth:`check_summands`), with
    ``max_int = round(clip * scale)``; the resolution is ``1 / scale`` per summand.

    Attributes
    ----------
    clip
        Largest magnitude encoded per coordinate (update units); larger values are clipped
        (post-processing of an already private update).
    scale
        Integers per update unit.
    modulus_bits
        ``k`` in ``[2, 64]``; values are held in ``uint64``.
    """

    clip: float
    scale: float
    modulus_bits: int = 64

    def __post_init__(self) -> None:
        k = self.modulus_bits
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= 64:
            raise ValueError(f"FixedPointCodec: modulus_bits={k!r} must be an integer in [2, 64]")
        for name in ("clip", "scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < np.inf:
                raise ValueError(f"FixedPointCodec: {name}={v!r} must be finite and > 0")
        if not 1 <= self.max_int <= min(2 ** (k - 1) - 1, 2**53):
            raise ValueError(f"FixedPointCodec: clip * scale = {self.clip * self.scale:g} must "
                             f"round to an integer in [1, {min(2 ** (k - 1) - 1, 2**53)}]")

    @classmethod
    def fit(cls, *, clip: float, summands: int, modulus_bits: int = 64) -> FixedPointCodec:
        """The largest power-of-two ``scale`` for which ``summands`` encodings cannot overflow."""
        if isinstance(summands, bool) or not isinstance(summands, int) or summands < 1:
            raise ValueError(f"FixedPointCodec.fit: summands={summands!r} must be an integer >= 1")
        if isinstance(clip, bool) or not isinstance(clip, int | float) or not 0 < clip < np.inf:
            raise ValueError(f"FixedPointCodec.fit: clip={clip!r} must be finite and > 0")
        if isinstance(modulus_bits, bool) or not isinstance(modulus_bits, int) or not (
                2 <= modulus_bits <= 64):
            raise ValueError(f"FixedPointCodec.fit: modulus_bits={modulus_bits!r} must be an "
                             "integer in [2, 64]")
        if summands > 2 ** (modulus_bits - 1) - 1:
            raise ValueError(f"FixedPointCodec.fit: summands={summands} must be at most "
                             f"2^{modulus_bits - 1} - 1")
        limit = min((2 ** (modulus_bits - 1) - 1) // summands, 2**53)
        exponent = int(np.floor(np.log2((limit - 0.5) / clip)))
        while exponent > -1074 and np.floor(clip * 2.0**exponent + 0.5) > limit:
            exponent -= 1
        return cls(clip=float(clip), scale=2.0**exponent, modulus_bits=modulus_bits)

    @property
    def max_int(self) -> int:
        """Largest encoded magnitude, ``round(clip * scale)``."""
        return int(np.floor(self.clip * self.scale + 0.5))

    @property
    def mask(self) -> np.uint64:
        """``2^k - 1`` as ``uint64``."""
        return np.uint64((1 << self.modulus_bits) - 1)

    def capacity(self) -> int:
        """Most summands whose sum decodes exactly."""
        return (2 ** (self.modulus_bits - 1) - 1) // self.max_int

    def check_summands(self, summands: int) -> None:
        """Raise ``ValueError`` unless ``summands * max_int < 2^(k-1)``."""
        if summands > self.capacity():
            raise ValueError(
                f"FixedPointCodec: summands={summands} times max_int={self.max_int} "
                f"(clip={self.clip:g} * scale={self.scale:g}) must be < 2^{self.modulus_bits - 1}"
                f"; at most {self.capacity()} summands fit")

    def encode(self, x: npt.ArrayLike) -> UInt64Array:
        """Encode a real vector, shape ``(d,)`` float -> ``(d,)`` uint64 in ``[0, 2^k)``."""
        v = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError("FixedPointCodec.encode: the update has non-finite entries")
        ints = np.rint(np.clip(v, -self.clip, self.clip) * self.scale).astype(np.int64)
        return ints.view(np.uint64) & self.mask

    def to_signed(self, v: UInt64Array) -> npt.NDArray[np.int64]:
        """Residues mod ``2^k`` -> signed integers in ``[-2^(k-1), 2^(k-1))``."""
        u = np.asarray(v, dtype=np.uint64) & self.mask
        if self.modulus_bits == 64:
            return u.view(np.int64).copy()
        s = u.astype(np.int64)
        s[s >= 2 ** (self.modulus_bits - 1)] -= 2**self.modulus_bits
        return s

    def decode(self, v: UInt64Array) -> npt.NDArray[np.float64]:
        """Residues (a sum of encodings) -> reals: ``to_signed(v) / scale``, float64."""
        return self.to_signed(v).astype(np.float64) / self.scale

    def add(self, a: UInt64Array, b: UInt64Array) -> UInt64Array:
        """``(a + b) mod 2^k`` (uint64 addition wraps mod 2^64, a multiple of 2^k)."""
        return (np.asarray(a, dtype=np.uint64) + np.asarray(b, dtype=np.uint64)) & self.mask

    def sub(self, a: UInt64Array, b: UInt64Array) -> UInt64Array:
        """``(a - b) mod 2^k``."""
        return (np.asarray(a, dtype=np.uint64) - np.asarray(b, dtype=np.uint64)) & self.mask


# ------------------------------------------------------------ key derivation, masks


def _hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=None, info=info).derive(secret)


def _ids(*values: int) -> bytes:
    return b"".join(int(v).to_bytes(8, "big") for v in values)


def pairwise_seed(private: X25519PrivateKey, peer_public: bytes, *, round_index: int,
                  a: int, b: int) -> bytes:
    """32-byte mask seed of the pair ``{a, b}``: HKDF-SHA256 of their X25519 secret.

    Symmetric in ``a, b`` (either side computes it); the round and the ordered pair are in
    HKDF's ``info`` for domain separation.
    """
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return _hkdf(shared, _INFO_PAIR + _ids(round_index, min(a, b), max(a, b)))


def self_mask_seed(seed: bytes, *, round_index: int, device: int) -> bytes:
    """AES key of device ``device``'s self-mask from its random seed ``b_i``."""
    return _hkdf(seed, _INFO_SELF + _ids(round_index, device))


def expand_mask(seed: bytes, dimension: int, modulus_bits: int) -> UInt64Array:
    """``dimension`` pseudo-random residues mod ``2^modulus_bits`` from a 32-byte seed.

    AES-256-CTR keystream (zero IV: every seed is a fresh HKDF output used for one stream),
    read as little-endian uint64 and reduced mod ``2^k``: uniform if AES is a PRF.
    """
    if len(seed) != _KEY_BYTES:
        raise ValueError(f"expand_mask: seed of {len(seed)} bytes, need {_KEY_BYTES}")
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    stream = enc.update(bytes(8 * dimension)) + enc.finalize()
    out = np.frombuffer(stream, dtype="<u8").astype(np.uint64)
    return out & np.uint64((1 << modulus_bits) - 1)


# ------------------------------------------------------------------------ Shamir


@dataclass(frozen=True)
class ShamirShare:
    """Point ``(x, y)`` of a degree ``t - 1`` polynomial over GF(2^521 - 1)."""

    x: int
    y: int


def shamir_split(secret: bytes, *, threshold: int, xs: Sequence[int],
                 random_bytes: RandomBytes = secrets.token_bytes) -> list[ShamirShare]:
    """Split ``secret`` (at most 64 bytes) into shares at the non-zero points ``xs``.

    Any ``threshold`` shares recover it; fewer reveal nothing (information-theoretically).
    """
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"shamir_split: threshold={threshold} must lie in [1, {len(xs)}]")
    if len(set(xs)) != len(xs) or any(not 0 < x < SHAMIR_PRIME for x in xs):
        raise ValueError(f"shamir_split: xs={list(xs)} must be distinct and non-zero")
    if len(secret) > 64:
        raise ValueError(f"shamir_split: secret of {len(secret)} bytes, at most 64")
    coeffs = [int.from_bytes(secret, "big")]
    for _ in range(threshold - 1):  # uniform in the field: 80 bytes reduced, bias < 2^-118
        coeffs.append(int.from_bytes(random_bytes(80), "big") % SHAMIR_PRIME)
    shares = []
    for x in xs:
        y = 0
        for c in reversed(coeffs):
            y = (y * x + c) % SHAMIR_PRIME
        shares.append(ShamirShare(int(x), y))
    return shares


def shamir_combine(shares: Sequence[ShamirShare], *, threshold: int,
                   length: int = _KEY_BYTES) -> bytes:
    """Recover the secret (``length`` bytes) from at least ``threshold`` shares (Lagrange at 0)."""
    pts = list({s.x: s for s in shares}.values())[:threshold]
    if len(pts) < threshold:
        raise SecAggAbortError(f"shamir_combine: {len(pts)} distinct shares, need {threshold}")
    secret = 0
    for i, si in enumerate(pts):
        num, den = 1, 1
        for j, sj in enumerate(pts):
            if i != j:
                num = num * (-sj.x) % SHAMIR_PRIME
                den = den * (si.x - sj.x) % SHAMIR_PRIME
        secret = (secret + si.y * num * pow(den, -1, SHAMIR_PRIME)) % SHAMIR_PRIME
    if secret >= 2 ** (8 * length):
        raise SecAggAbortError("shamir_combine: reconstruction out of range (bad shares)")
    return secret.to_bytes(length, "big")


# ---------------------------------------------------------------------- messages


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


def _sign(owner: int, peer: int) -> int:
    """Device ``owner`` adds ``+PRG(s)`` for a peer with a larger id, ``-PRG(s)`` otherwise."""
    return 1 if peer > owner else -1


def _channel_key(private: X25519PrivateKey, peer_public: bytes, round_index: int,
                 a: int, b: int) -> AESGCM:
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return AESGCM(_hkdf(shared, _INFO_CHANNEL + _ids(round_index, min(a, b), max(a, b))))


# ------------------------------------------------------------------------- device


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
        self._mask_key = X25519PrivateKey.from_private_bytes(random_bytes(_KEY_BYTES))
        self._channel = X25519PrivateKey.from_private_bytes(random_bytes(_KEY_BYTES))
        self._seed = random_bytes(_KEY_BYTES) if self_masks else b""
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
        if len(members) < _MIN_DEVICES or not 2 <= roster.threshold <= len(members) - 1:
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
            aead = _channel_key(self._channel, roster.keys[j].channel_public,
                                self.round_index, self.device_id, j)
            nonce = self._random(12)
            plain = ss.y.to_bytes(_SHARE_BYTES, "big") + ks.y.to_bytes(_SHARE_BYTES, "big")
            aad = _ids(self.round_index, self.device_id, j)
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
            aead = _channel_key(self._channel, self._roster.keys[msg.sender].channel_public,
                                self.round_index, self.device_id, msg.sender)
            plain = aead.decrypt(msg.nonce, msg.ciphertext,
                                 _ids(self.round_index, msg.sender, self.device_id))
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
            y = c.add(y, m) if _sign(self.device_id, j) > 0 else c.sub(y, m)
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


# ------------------------------------------------------------------------- server


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
        if n1 < _MIN_DEVICES:
            raise SecAggAbortError(f"server: |U1|={n1} devices advertised keys, need "
                                   f"{_MIN_DEVICES}")
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
                total = c.sub(total, m) if _sign(i, j) > 0 else c.add(total, m)
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


# ------------------------------------------------------------------------ a round


@dataclass(frozen=True, eq=False)
class RoundResult:
    """Outcome of :func:`run_round`.

    Attributes
    ----------
    total
        ``(d,)`` float64: the decoded sum of the included updates.
    integer_total
        ``(d,)`` int64: the signed fixed-point sum (``total * scale``).
    included
        ``U3``, the devices in the sum.
    dropped
        Devices of ``U2`` whose input never arrived (their masks were removed).
    view
        Every message the server received.
    """

    total: npt.NDArray[np.float64]
    integer_total: npt.NDArray[np.int64]
    included: frozenset[int]
    dropped: frozenset[int]
    view: ServerView


def run_round(updates: Mapping[int, npt.ArrayLike], dropped_after_masking: Collection[int] = (),
              *, codec: FixedPointCodec, dropped_before_keys: Collection[int] = (),
              dropped_before_upload: Collection[int] = (), threshold: int | None = None,
              self_masks: bool = True, round_index: int = 0,
              random_bytes: RandomBytes = secrets.token_bytes) -> RoundResult:
    """Run one round among the devices of ``updates`` (id -> ``(d,)`` update) in memory.

    Parameters
    ----------
    dropped_after_masking
        Send their masked input, then never answer the unmasking request: included.
    dropped_before_keys
        Never advertise keys (not ready when ``Omega_t`` is formed): excluded, no trace.
    dropped_before_upload
        Take part in key sharing, then their masked input never arrives: excluded, and the
        survivors' masks with them are removed through Shamir recovery of their mask keys.
    codec, threshold, self_masks, round_index, random_bytes
        As for :class:`SecAggServer` / :class:`SecAggDevice`.
    """
    sets = [frozenset(s) for s in (dropped_after_masking, dropped_before_keys,
                                   dropped_before_upload)]
    if any(not s <= set(updates) for s in sets) or sum(map(len, sets)) != len(frozenset().union(
            *sets)):
        raise ValueError("run_round: the dropped sets must be disjoint subsets of the devices")
    after, before_keys, before_upload = sets
    shapes = {np.shape(u) for u in updates.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"run_round: updates must share one 1-D shape, got {shapes}")
    d = next(iter(shapes))[0]
    server = SecAggServer(round_index=round_index, dimension=d, codec=codec,
                          threshold=threshold, self_masks=self_masks)
    devices = {i: SecAggDevice(i, round_index=round_index, dimension=d, codec=codec,
                               self_masks=self_masks, random_bytes=random_bytes)
               for i in sorted(updates) if i not in before_keys}
    for dev in devices.values():
        server.receive_keys(dev.advertise_keys())
    roster = server.roster()
    for dev in devices.values():
        server.receive_share_keys(dev.share_keys(roster))
    u2, inbox = server.forward_shares()
    for j in sorted(u2):
        devices[j].receive_shares(inbox[j], u2)
    for j in sorted(u2 - before_upload):
        server.receive_masked(devices[j].masked_update(updates[j]))
    request = server.unmasking_request()
    for j in sorted(request.received - after):
        server.receive_unmasking(devices[j].reveal_shares(request))
    total = server.aggregate()
    return RoundResult(total, server.integer_sum(), server.included, request.dropped,
                       server.view)
