"""Encrypted, authenticated ZeroMQ sockets of the lab control plane (CurveZMQ + ZAP).

The aggregator runs a :class:`~testbed.core.transport.curve_server.CurveServer` (a ROUTER), each
edge
device a :class:`~testbed.core.transport.curve_client.CurveClient` (a DEALER). Every connection is
encrypted with CurveZMQ; the server admits only clients whose public key is in the allow-list
directory (:func:`testbed.core.transport.curve_keys.load_allow_list`), checked by a ZAP handler
(:class:`zmq.auth.thread.ThreadAuthenticator`). IP addresses are not restricted: the lab
runs across hosts, and the key is the identity.

How a message gets its device id: the ZAP handler answers each successful handshake with
the client's z85 public key as the ZAP user id; libzmq attaches it to every message of
that connection as the ``User-Id`` property; :meth:`CurveServer.recv` reads it from the
first payload frame and maps it through the allow-list to the device id carried by the
certificate metadata. A client's claim about its own id is never trusted.

Failure modes, by design:

* A client whose key is not on the allow-list never completes the handshake (ZAP answers
  400); none of its messages reaches the ROUTER. The server tells it so (CurveZMQ ERROR),
  libzmq stops retrying, and :meth:`CurveClient.recv
  <testbed.core.transport.curve_client.CurveClient.recv>` raises
  :class:`~testbed.core.transport.curve_client.KeyRefusedError` (seen on a socket monitor).
* A client holding a wrong server key fails the handshake the same way.
* A frame longer than ``max_message_bytes`` makes libzmq drop the *connection* (the
  client reconnects; the frame and any sent with it are lost).
* Fail closed: the socket sets a ZAP domain and ``ZMQ_ZAP_ENFORCE_DOMAIN``, so a missing
  ZAP handler refuses every client instead of admitting every client (libzmq's default
  without a handler); and :meth:`CurveServer.recv` drops any message without a known
  ``User-Id`` as a second line of defence.

ZeroMQ sockets are not thread-safe: use each object from one thread. A ZAP handler is
bound per :class:`zmq.Context`, so one context holds at most one :class:`CurveServer`.

This module holds what both ends share: the frame and queue limits and the checks of their
arguments; the sockets are in :mod:`testbed.core.transport.curve_server` and
:mod:`testbed.core.transport.curve_client`.
"""

from __future__ import annotations

import math

import zmq

from testbed.core.transport.curve_keys import Z85_KEY_CHARS

#: Default largest frame, bytes of plaintext (each frame of a multipart message).
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
#: Smallest allowed ``max_message_bytes``: libzmq's limit also applies to the handshake
#: commands (HELLO is 200 bytes; measured: MAXMSGSIZE 150 refuses every connection, 300
#: does not), so a tiny limit would lock every device out.
MIN_MAX_MESSAGE_BYTES = 1024
MAX_MAX_MESSAGE_BYTES = 2**40
#: Bytes a CURVE MESSAGE command adds to a frame on the wire (command name 8, nonce 8,
#: Poly1305 tag 16, flags 1). libzmq compares MAXMSGSIZE with the wire size, measured:
#: with MAXMSGSIZE 1000 a 967-byte frame passes and a 968-byte frame drops the connection.
CURVE_FRAME_OVERHEAD_BYTES = 33
#: Default high-water mark, messages queued per peer in each direction.
DEFAULT_HWM = 1000


def check_timeout(timeout_s: float, name: str = "timeout_s") -> float:
    """``timeout_s`` as a float if it is a finite number of seconds ``>= 0``, else
    ``ValueError`` naming ``name``."""
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not math.isfinite(timeout_s)
        or timeout_s < 0
    ):
        raise ValueError(f"{name}: got {timeout_s!r}; allowed: a finite number of seconds >= 0")
    return float(timeout_s)


def check_max_message_bytes(value: int) -> int:
    """``value`` if it is an integer in ``[MIN_MAX_MESSAGE_BYTES, MAX_MAX_MESSAGE_BYTES]``,
    else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not (
        MIN_MAX_MESSAGE_BYTES <= value <= MAX_MAX_MESSAGE_BYTES
    ):
        raise ValueError(
            f"max_message_bytes: got {value!r}; allowed: an integer with "
            f"{MIN_MAX_MESSAGE_BYTES} <= max_message_bytes <= {MAX_MAX_MESSAGE_BYTES}"
        )
    return value


def check_hwm(value: int) -> int:
    """``value`` if it is a high-water mark (an integer in ``[1, 1000000]``), else
    ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ValueError(f"hwm: got {value!r}; allowed: an integer with 1 <= hwm <= 1000000")
    return value


def check_z85_key(key: bytes, what: str) -> bytes:
    """``key`` if it is a z85-encoded CURVE key
    (:data:`~testbed.core.transport.curve_keys.Z85_KEY_CHARS`
    bytes), else ``ValueError`` naming ``what``."""
    if not isinstance(key, bytes) or len(key) != Z85_KEY_CHARS:
        raise ValueError(f"{what}: expected {Z85_KEY_CHARS} bytes of z85, got {key!r:.60}")
    return key


def check_key_pair(public: bytes, secret: bytes, who: str) -> tuple[bytes, bytes]:
    """``(public, secret)`` if they are z85 CURVE keys that belong together."""
    for name, key in (("public", public), ("secret", secret)):
        check_z85_key(key, f"{who} {name} key")
    try:
        derived = zmq.curve_public(secret)
    except zmq.ZMQError as exc:
        raise ValueError(f"{who} secret key: not a z85 CURVE key ({exc})") from None
    if derived != public:
        raise ValueError(f"{who} public key does not belong to its secret key")
    return public, secret


def check_frames(frames: list[bytes], max_message_bytes: int) -> list[bytes]:
    """``frames`` as a list if it is a non-empty sequence of byte frames each at most
    ``max_message_bytes`` long, else ``ValueError``."""
    if not isinstance(frames, list | tuple) or not frames:
        raise ValueError(f"frames: expected a non-empty list of bytes, got {frames!r:.80}")
    for i, frame in enumerate(frames):
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise ValueError(f"frames[{i}]: expected bytes, got {type(frame).__name__}")
        if len(frame) > max_message_bytes:
            raise ValueError(
                f"frames[{i}]: {len(frame)} bytes; allowed: at most max_message_bytes = "
                f"{max_message_bytes} (the receiver would drop the connection)"
            )
    return list(frames)
