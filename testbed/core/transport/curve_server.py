"""The aggregator's end of the lab control plane: :class:`CurveServer`, a CurveZMQ ROUTER
that admits only allow-listed devices (through a ZAP handler) and names each message's
sender. How admission works and how it fails: :mod:`testbed.core.transport.secure_socket`."""

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

from testbed.core.transport.curve_keys import ALLOWED_DIRNAME, load_aggregator_keys, load_allow_list
from testbed.core.transport.secure_socket import (
    CURVE_FRAME_OVERHEAD_BYTES,
    DEFAULT_HWM,
    DEFAULT_MAX_MESSAGE_BYTES,
    check_frames,
    check_hwm,
    check_key_pair,
    check_max_message_bytes,
    check_timeout,
)

#: Where libzmq looks for the ZAP handler of a context (fixed by the ZAP specification).
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: ZAP domain of the lab control plane; the authenticator's allow-list is bound to it.
ZAP_DOMAIN = "dpfl-testbed"


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
        self.max_message_bytes = check_max_message_bytes(max_message_bytes)
        check_hwm(hwm)
        if (server_public is None) != (server_secret is None):
            raise ValueError("server_public and server_secret: give both or neither")
        if server_public is not None and server_secret is not None:
            if keys_dir is not None:
                raise ValueError("keys_dir and server_public/server_secret: give one, not both")
            public, secret = check_key_pair(server_public, server_secret, "server")
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
        timeout = check_timeout(timeout_s)
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
        payload = check_frames(frames, self.max_message_bytes)
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
