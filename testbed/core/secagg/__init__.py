"""Pairwise-mask secure aggregation with dropout recovery (Bonawitz et al., CCS 2017).

002 (Section IV-B, Fig. 2) masks each device's fixed-point update with pairwise PRF masks
that cancel in the sum and assumes no participant drops. This package implements the
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

Every message the server receives is a frozen dataclass recorded in
:class:`~testbed.core.secagg.messages.ServerView`. Randomness comes from ``random_bytes``
(default :func:`secrets.token_bytes`); tests pass a seeded source to be reproducible. See
``docs/peers/zcdp-secagg.md``.

The parts, one module each: :mod:`~testbed.core.secagg.codec` (fixed point mod ``2^k``),
:mod:`~testbed.core.secagg.crypto` (key derivation, mask expansion, Shamir secret sharing),
:mod:`~testbed.core.secagg.messages` (what the parties send),
:mod:`~testbed.core.secagg.device` and :mod:`~testbed.core.secagg.server` (the two state
machines), :mod:`~testbed.core.secagg.local_round` (a whole round in one process),
:mod:`~testbed.core.secagg.aggregation` (a run's updates through it: the round's codec and
its carrier) and :mod:`~testbed.core.secagg.wire` (its messages as the control plane's
``sa_*`` fields). The package itself holds the two errors every part raises.
"""

from __future__ import annotations

#: Fewest devices a roster (``U1``) may list; the control plane checks ``sa_roster``
#: messages against it too (:mod:`testbed.core.transport.protocol_checks`).
MIN_DEVICES = 3


class SecAggAbortError(RuntimeError):
    """The round cannot complete (too few devices, shares or survivors; unmasking failed)."""


class ProtocolError(RuntimeError):
    """A call out of order, or a request an honest party refuses."""
