"""The cryptographic parts of secure aggregation (:mod:`testbed.core.secagg`): HKDF-SHA256
seeds from X25519 secrets, AES-256-CTR mask expansion, the sign of a pairwise mask, the
AES-GCM key of the channel that carries the shares, and Shamir secret sharing over
GF(2^521 - 1)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from testbed.core.secagg import SecAggAbortError
from testbed.core.secagg.codec import UInt64Array

RandomBytes = Callable[[int], bytes]

#: Shamir field: the Mersenne prime 2^521 - 1 (> 2^256, so any 32-byte secret fits).
SHAMIR_PRIME = 2**521 - 1
#: Bytes of every derived key and seed (AES-256, the Shamir-shared seeds).
KEY_BYTES = 32
_INFO_PAIR = b"dpfl-testbed/secagg/v1/pairwise-mask"
_INFO_SELF = b"dpfl-testbed/secagg/v1/self-mask"
_INFO_CHANNEL = b"dpfl-testbed/secagg/v1/share-channel"


# ------------------------------------------------------------ key derivation, masks


def _hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def id_bytes(*values: int) -> bytes:
    """The integers ``values`` as 8-byte big-endian words, concatenated (HKDF ``info``
    suffixes: round, device ids)."""
    return b"".join(int(v).to_bytes(8, "big") for v in values)


def pairwise_seed(private: X25519PrivateKey, peer_public: bytes, *, round_index: int,
                  a: int, b: int) -> bytes:
    """32-byte mask seed of the pair ``{a, b}``: HKDF-SHA256 of their X25519 secret.

    Symmetric in ``a, b`` (either side computes it); the round and the ordered pair are in
    HKDF's ``info`` for domain separation.
    """
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return _hkdf(shared, _INFO_PAIR + id_bytes(round_index, min(a, b), max(a, b)))


def self_mask_seed(seed: bytes, *, round_index: int, device: int) -> bytes:
    """AES key of device ``device``'s self-mask from its random seed ``b_i``."""
    return _hkdf(seed, _INFO_SELF + id_bytes(round_index, device))


def expand_mask(seed: bytes, dimension: int, modulus_bits: int) -> UInt64Array:
    """``dimension`` pseudo-random residues mod ``2^modulus_bits`` from a 32-byte seed.

    AES-256-CTR keystream (zero IV: every seed is a fresh HKDF output used for one stream),
    read as little-endian uint64 and reduced mod ``2^k``: uniform if AES is a PRF.
    """
    if len(seed) != KEY_BYTES:
        raise ValueError(f"expand_mask: seed of {len(seed)} bytes, need {KEY_BYTES}")
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    stream = enc.update(bytes(8 * dimension)) + enc.finalize()
    out = np.frombuffer(stream, dtype="<u8").astype(np.uint64)
    return out & np.uint64((1 << modulus_bits) - 1)


def mask_sign(owner: int, peer: int) -> int:
    """Device ``owner`` adds ``+PRG(s)`` for a peer with a larger id, ``-PRG(s)`` otherwise."""
    return 1 if peer > owner else -1


def channel_key(private: X25519PrivateKey, peer_public: bytes, round_index: int,
                a: int, b: int) -> AESGCM:
    """AES-GCM key of the share channel between devices ``a`` and ``b`` in round
    ``round_index``, from X25519 of ``private`` with ``peer_public`` (the same for both)."""
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return AESGCM(_hkdf(shared, _INFO_CHANNEL + id_bytes(round_index, min(a, b), max(a, b))))


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
                   length: int = KEY_BYTES) -> bytes:
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

