"""An edge device's end of the lab control plane: :class:`CurveClient`, a CurveZMQ DEALER
encrypted to and authenticated by the aggregator (:mod:`testbed.core.transport.secure_socket`).

A client whose key the aggregator's ZAP handler refuses (not on its allow-list) learns it
from the server's CurveZMQ ERROR command: libzmq (>= 4.3) reports it on a socket monitor as
``ZMQ_EVENT_HANDSHAKE_FAILED_AUTH`` with the ZAP status 400, and does not retry. The client
watches that monitor, and :meth:`CurveClient.recv` raises :class:`KeyRefusedError` at once
instead of waiting for messages that can never come.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from testbed.core.transport.curve_keys import aggregator_public_key, load_device_keys
from testbed.core.transport.secure_socket import (
    CURVE_FRAME_OVERHEAD_BYTES,
    DEFAULT_HWM,
    DEFAULT_MAX_MESSAGE_BYTES,
    check_frames,
    check_hwm,
    check_key_pair,
    check_max_message_bytes,
    check_timeout,
    check_z85_key,
)

#: Default seconds :meth:`CurveClient.send` waits for room in the queue.
DEFAULT_SEND_TIMEOUT_S = 5.0
#: Reconnect interval of a client, milliseconds (first retry, and the back-off ceiling).
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 1000
#: ZAP status code of a refused key (ZAP/RFC 27: 400 = authentication failure; 300 is a
#: temporary error, after which libzmq tries again).
ZAP_STATUS_REFUSED = 400


class KeyRefusedError(ConnectionRefusedError):
    """The aggregator refused this client's key in the CurveZMQ handshake (its ZAP handler
    answered 400: the key is not on its allow-list). Final: libzmq does not retry.

    Attributes
    ----------
    endpoint : str
        The aggregator's endpoint.
    public_key : bytes
        This client's z85 public key (40 bytes).
    """

    def __init__(self, endpoint: str, public_key: bytes) -> None:
        self.endpoint = endpoint
        self.public_key = public_key
        super().__init__(
            f"the aggregator at {endpoint} refused this device's key (public key "
            f"{public_key.decode('ascii', 'replace')}): it is not on the aggregator's "
            "allow-list"
        )


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
        self.max_message_bytes = check_max_message_bytes(max_message_bytes)
        check_hwm(hwm)
        if (client_public is None) != (client_secret is None):
            raise ValueError("client_public and client_secret: give both or neither")
        if client_public is not None and client_secret is not None:
            public, secret = check_key_pair(client_public, client_secret, "client")
        elif keys_dir is not None and device is not None:
            public, secret = load_device_keys(Path(keys_dir), device)
        else:
            raise ValueError("client keys: give keys_dir and device, or client_public and "
                             "client_secret")
        if server_public is None:
            if keys_dir is None:
                raise ValueError("server_public: required when keys_dir is not given")
            server_public = aggregator_public_key(Path(keys_dir))
        else:
            check_z85_key(server_public, "server_public")
        self.public_key = public
        self.endpoint = endpoint
        self._closed = False
        self._refused = False
        sock = context.socket(zmq.DEALER)
        self._socket: zmq.Socket[Any] | None = sock
        self._monitor: zmq.Socket[Any] | None = None
        try:
            # before connect: the first handshake's refusal must not be missed
            self._monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            self._monitor.setsockopt(zmq.LINGER, 0)
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
        """Next message from the aggregator (its frames), or None after ``timeout_s`` s.

        Raises
        ------
        KeyRefusedError
            The aggregator refused this client's key (now, or in an earlier handshake):
            no message will ever come; raised as soon as the refusal arrives.
        """
        timeout = check_timeout(timeout_s)
        sock = self._open_socket()
        self.check_admitted()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            remaining_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            ready = dict(poller.poll(remaining_ms))
            if self._monitor in ready:
                self.check_admitted()
            if sock in ready:
                return sock.recv_multipart(flags=zmq.NOBLOCK)
            if time.monotonic() >= deadline:
                return None

    def check_admitted(self) -> None:
        """Raise :class:`KeyRefusedError` if the aggregator has refused this client's key.

        Reads the socket monitor's pending events without waiting; a refusal, once seen,
        is remembered (the session is gone for good).
        """
        monitor = self._monitor
        while not self._refused and monitor is not None and monitor.poll(0, zmq.POLLIN):
            event = recv_monitor_message(monitor, flags=zmq.NOBLOCK)
            if (event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    and event["value"] == ZAP_STATUS_REFUSED):
                self._refused = True
        if self._refused:
            raise KeyRefusedError(self.endpoint, self.public_key)

    def send(self, frames: list[bytes], timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> None:
        """Queue ``frames`` for the aggregator.

        The message waits in the queue while the connection is (re)established; it is
        never delivered if the handshake cannot succeed (key not allowed, wrong server
        key), and there is no error for that here: a refused key is raised by
        :meth:`recv` (:class:`KeyRefusedError`), a wrong server key only times out. Once
        libzmq has taken the server's refusal as final (a race with its reconnecting), the
        session is gone and every send waits ``timeout_s`` and raises ``TimeoutError``.

        Raises
        ------
        TimeoutError
            The queue stayed full (``hwm`` messages) for ``timeout_s`` seconds.
        ValueError
            Empty message, or a frame longer than ``max_message_bytes``.
        """
        payload = check_frames(frames, self.max_message_bytes)
        timeout = check_timeout(timeout_s)
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
        if self._monitor is not None:
            if self._socket is not None:
                try:
                    self._socket.disable_monitor()
                except zmq.ZMQError:
                    pass  # the monitor was never started
            self._monitor.close(linger=0)
            self._monitor = None
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
