"""Encrypted, authenticated ZeroMQ sockets of the lab control plane (CurveZMQ + ZAP).

The aggregator runs a :class:`CurveServer` (a ROUTER), each edge device a
:class:`CurveClient` (a DEALER). Every connection is encrypted with CurveZMQ; the server
admits only clients whose public key is in the allow-list directory
(:func:`testbed.core.curve_keys.load_allow_list`), checked by a ZAP handler
(:class:`zmq.auth.thread.ThreadAuthenticator`). IP addresses are not restricted: the lab
runs across hosts, and the key is the identity.

How a message gets its device id: the ZAP handler answers each successful handshake with
the client's z85 public key as the ZAP user id; libzmq attaches it to every message of
that connection as the ``User-Id`` property; :meth:`CurveServer.recv` reads it from the
first payload frame and maps it through the allow-list to the device id carried by the
certificate metadata. A client's claim about its own id is never trusted.

Failure modes, by design:

* A client whose key is not on the allow-list never completes the handshake (ZAP answers
  400); none of its messages reaches the ROUTER, and it keeps retrying quietly.
* A client holding a wrong server key fails the handshake the same way.
* A frame longer than ``max_message_bytes`` makes libzmq drop the *connection* (the
  client reconnects; the frame and any sent with it are lost).
* Fail closed: the socket sets a ZAP domain and ``ZMQ_ZAP_ENFORCE_DOMAIN``, so a missing
  ZAP handler refuses every client instead of admitting every client (libzmq's default
  without a handler); and :meth:`CurveServer.recv` drops any message without a known
  ``User-Id`` as a second line of defence.

ZeroMQ sockets are not thread-safe: use each object from one thread. A ZAP handler is
bound per :class:`zmq.Context`, so one context holds at most one :class:`CurveServer`.
"""

from __future__ import annotations

import errno
import math
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import zmq
from zmq.auth.base import Authenticator
from zmq.auth.thread import ThreadAuthenticator

from testbed.core.curve_keys import (
    ALLOWED_DIRNAME,
    aggregator_public_key,
    load_aggregator_keys,
    load_allow_list,
    load_device_keys,
)

#: Where libzmq looks for the ZAP handler of a context (fixed by the ZAP specification).
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: ZAP domain of the lab control plane; the authenticator's allow-list is bound to it.
ZAP_DOMAIN = "dpfl-testbed"
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
#: Default seconds :meth:`CurveClient.send` waits for room in the queue.
DEFAULT_SEND_TIMEOUT_S = 5.0
#: Reconnect interval of a client, milliseconds (first retry, and the back-off ceiling).
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 1000


class _ReleaseZapEndpoint(Authenticator):
    """Unbinds the ZAP endpoint before the ZAP socket is closed.

    pyzmq's stop() closes the ZAP socket without unbinding it, and the inproc endpoint
    stays taken: a later authenticator on the same context fails with EADDRINUSE
    (measured with pyzmq 27 / libzmq 4.3.5).
    """

    def stop(self) -> None:
        zap = self.zap_socket
        if zap is not None and not zap.closed:
            try:
                zap.unbind(ZAP_ENDPOINT)
            except zmq.ZMQError:
                pass  # never bound: start() failed
        super().stop()


class _ZapAuthenticator(ThreadAuthenticator, _ReleaseZapEndpoint):
    """ThreadAuthenticator that gives its ZAP endpoint back when stopped.

    In the method order ThreadAuthenticator.stop() joins the thread, then calls
    _ReleaseZapEndpoint.stop(), so the ZAP socket is unbound only once no other thread
    uses it.
    """


def _check_timeout(timeout_s: float, name: str = "timeout_s") -> float:
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not math.isfinite(timeout_s)
        or timeout_s < 0
    ):
        raise ValueError(f"{name}: got {timeout_s!r}; allowed: a finite number of seconds >= 0")
    return float(timeout_s)


def _check_max_message_bytes(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
        MIN_MAX_MESSAGE_BYTES <= value <= MAX_MAX_MESSAGE_BYTES
    ):
        raise ValueError(
            f"max_message_bytes: got {value!r}; allowed: an integer with "
            f"{MIN_MAX_MESSAGE_BYTES} <= max_message_bytes <= {MAX_MAX_MESSAGE_BYTES}"
        )
    return value


def _check_hwm(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ValueError(f"hwm: got {value!r}; allowed: an integer with 1 <= hwm <= 1000000")
    return value


def _check_key_pair(public: bytes, secret: bytes, who: str) -> tuple[bytes, bytes]:
    """``(public, secret)`` if they are z85 CURVE keys that belong together."""
    for name, key in (("public", public), ("secret", secret)):
        if not isinstance(key, bytes) or len(key) != 40:
            raise ValueError(f"{who} {name} key: expected 40 bytes of z85, got {key!r:.60}")
    try:
        derived = zmq.curve_public(secret)
    except zmq.ZMQError as exc:
        raise ValueError(f"{who} secret key: not a z85 CURVE key ({exc})") from None
    if derived != public:
        raise ValueError(f"{who} public key does not belong to its secret key")
    return public, secret


def _check_frames(frames: list[bytes], max_message_bytes: int) -> list[bytes]:
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


class CurveServer:
    """ROUTER socket that admits only allow-listed devices and names each message's sender.

    Parameters
    ----------
    context : zmq.Context
        Context of the socket and of its ZAP handler (at most one CurveServer per context).
    endpoint : str
        Where to bind, e.g. ``tcp://0.0.0.0:5555``; ``tcp://127.0.0.1:*`` (or port 0)
        picks a free port, see :attr:`last_endpoint`.
    keys_dir : Path, optional
        Keys directory holding ``aggregator.key_secret`` and ``allowed/``.
    allowed_dir : Path, optional
        Allow-list directory (default ``keys_dir/allowed``).
    server_public, server_secret : bytes, optional
        z85 key pair of the server, instead of reading it from ``keys_dir``.
    max_message_bytes : int
        Largest frame accepted, bytes of plaintext; a larger one makes libzmq drop the
        sender's connection. Default 256 MiB.
    hwm : int
        Send and receive high-water marks, messages per peer.

    Raises
    ------
    ValueError
        Missing or inconsistent key arguments, bad limits.
    KeyFileMissingError, KeyFileError
        Key files or the allow-list missing or unusable.
    RuntimeError
        A ZAP handler already runs in ``context``.
    OSError
        The endpoint cannot be bound.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        *,
        keys_dir: Path | None = None,
        allowed_dir: Path | None = None,
        server_public: bytes | None = None,
        server_secret: bytes | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        hwm: int = DEFAULT_HWM,
    ) -> None:
        self.max_message_bytes = _check_max_message_bytes(max_message_bytes)
        _check_hwm(hwm)
        if (server_public is None) != (server_secret is None):
            raise ValueError("server_public and server_secret: give both or neither")
        if server_public is not None and server_secret is not None:
            if keys_dir is not None:
                raise ValueError("keys_dir and server_public/server_secret: give one, not both")
            public, secret = _check_key_pair(server_public, server_secret, "server")
        elif keys_dir is not None:
            public, secret = load_aggregator_keys(Path(keys_dir))
        else:
            raise ValueError("server keys: give keys_dir or server_public and server_secret")
        if allowed_dir is None:
            if keys_dir is None:
                raise ValueError("allowed_dir: required when keys_dir is not given")
            allowed_dir = Path(keys_dir) / ALLOWED_DIRNAME
        self.allowed_dir = Path(allowed_dir)
        self._allow = load_allow_list(self.allowed_dir)
        self.public_key = public
        #: Messages dropped by :meth:`recv` for want of a known ``User-Id``, or oversized.
        self.dropped = 0
        #: Whether a missing ZAP handler refuses clients (a libzmq draft socket option).
        self.zap_enforced = False
        self._closed = False
        self._socket: zmq.Socket[Any] | None = None
        self._auth: ThreadAuthenticator | None = _ZapAuthenticator(context)
        try:
            self._start_authenticator()
            self._socket = self._bind(context, endpoint, public, secret, hwm)
        except BaseException:
            self.close()
            raise
        #: The endpoint actually bound (the port chosen for ``*`` or 0).
        self.last_endpoint: str = self._socket.get_string(zmq.LAST_ENDPOINT)

    def _start_authenticator(self) -> None:
        assert self._auth is not None
        try:
            self._auth.start()
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise RuntimeError(
                    "a ZAP handler already runs in this zmq.Context; use one CurveServer per "
                    "context"
                ) from None
            raise
        # configure_curve logs, rather than raises, a directory it cannot read; so the
        # allow-list was loaded (and checked) above and the two readings are compared.
        self._auth.configure_curve(domain=ZAP_DOMAIN, location=str(self.allowed_dir))
        loaded = set(self._auth.certs.get(ZAP_DOMAIN, {}))
        if loaded != set(self._allow):
            raise RuntimeError(
                f"{self.allowed_dir}: the ZAP handler read {len(loaded)} keys, the allow-list "
                f"{len(self._allow)}; did the directory change while starting?"
            )

    def _bind(
        self, context: zmq.Context[Any], endpoint: str, public: bytes, secret: bytes, hwm: int
    ) -> zmq.Socket[Any]:
        sock = context.socket(zmq.ROUTER)
        self._socket = sock
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + CURVE_FRAME_OVERHEAD_BYTES)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        try:
            sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            self.zap_enforced = True
        except zmq.ZMQError:
            pass  # a libzmq without the (draft) option: recv's User-Id check still holds
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            message = f"cannot bind the control plane to {endpoint!r}: {exc}"
            raise OSError(exc.errno, message) from None
        return sock

    @property
    def allow_list(self) -> dict[bytes, int]:
        """z85 public key -> device id of the admitted devices (a copy)."""
        return dict(self._allow)

    def _device_of(self, frames: list[zmq.Frame]) -> int | None:
        """Device id of a received ``[identity, payload...]`` message, None to drop it."""
        if len(frames) < 2:
            return None
        if any(len(f) > self.max_message_bytes for f in frames[1:]):
            return None
        try:
            user_id = frames[1].get("User-Id")
        except zmq.ZMQError:
            return None  # no ZAP user id: the connection was not authenticated
        if not isinstance(user_id, str):
            return None
        return self._allow.get(user_id.encode("ascii", errors="replace"))

    def recv(self, timeout_s: float) -> tuple[bytes, int, list[bytes]] | None:
        """Next message from an admitted device, or None after ``timeout_s`` seconds.

        Returns
        -------
        tuple of (bytes, int, list of bytes) or None
            ``(identity, device, frames)``: the ROUTER routing id to answer with
            :meth:`send`, the sender's device id from the allow-list, and the payload
            frames. None if nothing arrived in time.
        """
        timeout = _check_timeout(timeout_s)
        sock = self._open_socket()
        deadline = time.monotonic() + timeout
        while True:
            remaining_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            if not sock.poll(remaining_ms, zmq.POLLIN):
                return None
            frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            device = self._device_of(frames)
            if device is not None:
                return frames[0].bytes, device, [f.bytes for f in frames[1:]]
            self.dropped += 1
            if remaining_ms == 0:
                return None

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        """Queue ``frames`` for the peer ``identity`` (from :meth:`recv`); never blocks.

        As with any ROUTER, a message to a peer that is gone or whose queue is full is
        dropped silently; the protocol above must detect the loss.
        """
        payload = _check_frames(frames, self.max_message_bytes)
        self._open_socket().send_multipart([identity, *payload], flags=zmq.NOBLOCK)

    def _open_socket(self) -> zmq.Socket[Any]:
        if self._closed or self._socket is None:
            raise RuntimeError("CurveServer is closed")
        return self._socket

    def close(self) -> None:
        """Close the socket and stop the ZAP handler; calling it again does nothing."""
        self._closed = True
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def __enter__(self) -> CurveServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class CurveClient:
    """DEALER socket of one device, encrypted to and authenticated by the aggregator.

    Each key comes from its explicit argument if given, else from ``keys_dir``
    (``device-{device}.key_secret`` and ``aggregator.key``).

    Parameters
    ----------
    context : zmq.Context
        Context of the socket.
    endpoint : str
        Aggregator endpoint to connect to, e.g. ``tcp://10.0.0.1:5555``.
    keys_dir : Path, optional
        Keys directory of this device host.
    device : int, optional
        Device id whose key pair to load from ``keys_dir``.
    client_public, client_secret : bytes, optional
        z85 key pair of this device.
    server_public : bytes, optional
        z85 public key of the aggregator.
    max_message_bytes : int
        Largest frame sent or accepted, bytes; default 256 MiB.
    hwm : int
        Send and receive high-water marks, messages.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        *,
        keys_dir: Path | None = None,
        device: int | None = None,
        client_public: bytes | None = None,
        client_secret: bytes | None = None,
        server_public: bytes | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        hwm: int = DEFAULT_HWM,
    ) -> None:
        self.max_message_bytes = _check_max_message_bytes(max_message_bytes)
        _check_hwm(hwm)
        if (client_public is None) != (client_secret is None):
            raise ValueError("client_public and client_secret: give both or neither")
        if client_public is not None and client_secret is not None:
            public, secret = _check_key_pair(client_public, client_secret, "client")
        elif keys_dir is not None and device is not None:
            public, secret = load_device_keys(Path(keys_dir), device)
        else:
            raise ValueError("client keys: give keys_dir and device, or client_public and "
                             "client_secret")
        if server_public is None:
            if keys_dir is None:
                raise ValueError("server_public: required when keys_dir is not given")
            server_public = aggregator_public_key(Path(keys_dir))
        elif not isinstance(server_public, bytes) or len(server_public) != 40:
            raise ValueError(f"server_public: expected 40 bytes of z85, got {server_public!r:.60}")
        self.public_key = public
        self.endpoint = endpoint
        self._closed = False
        sock = context.socket(zmq.DEALER)
        self._socket: zmq.Socket[Any] | None = sock
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + CURVE_FRAME_OVERHEAD_BYTES)
            sock.setsockopt(zmq.RCVHWM, hwm)
            sock.setsockopt(zmq.SNDHWM, hwm)
            sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"cannot connect to {endpoint!r}: {exc}") from None

    def recv(self, timeout_s: float) -> list[bytes] | None:
        """Next message from the aggregator (its frames), or None after ``timeout_s`` s."""
        timeout = _check_timeout(timeout_s)
        sock = self._open_socket()
        if not sock.poll(math.ceil(timeout * 1000), zmq.POLLIN):
            return None
        return sock.recv_multipart(flags=zmq.NOBLOCK)

    def send(self, frames: list[bytes], timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> None:
        """Queue ``frames`` for the aggregator.

        The message waits in the queue while the connection is (re)established; it is
        never delivered if the handshake cannot succeed (key not allowed, wrong server
        key), and there is no error for that: the protocol above must time out. Once
        libzmq has taken the server's refusal as final (a race with its reconnecting), the
        session is gone and every send waits ``timeout_s`` and raises ``TimeoutError``.

        Raises
        ------
        TimeoutError
            The queue stayed full (``hwm`` messages) for ``timeout_s`` seconds.
        ValueError
            Empty message, or a frame longer than ``max_message_bytes``.
        """
        payload = _check_frames(frames, self.max_message_bytes)
        timeout = _check_timeout(timeout_s)
        sock = self._open_socket()
        deadline = time.monotonic() + timeout
        while True:
            remaining_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            if sock.poll(remaining_ms, zmq.POLLOUT):
                try:
                    sock.send_multipart(payload, flags=zmq.NOBLOCK)
                    return
                except zmq.Again:
                    # The pipe went between poll and send (a refused or dropped
                    # connection is torn down and re-established): poll again.
                    time.sleep(0.005)
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"send to {self.endpoint}: queue full for {timeout_s} s "
                    "(aggregator unreachable?)"
                )

    def _open_socket(self) -> zmq.Socket[Any]:
        if self._closed or self._socket is None:
            raise RuntimeError("CurveClient is closed")
        return self._socket

    def close(self) -> None:
        """Close the socket; calling it again does nothing."""
        self._closed = True
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def __enter__(self) -> CurveClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
