"""CurveZMQ keys, allow-list and authenticated control-plane sockets (loopback only)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth

from testbed.cli import cmd_keys
from testbed.core.transport.curve_client import CurveClient, KeyRefusedError
from testbed.core.transport.curve_keys import (
    KeyFileError,
    KeyFileMissingError,
    KeySet,
    aggregator_public_key,
    generate_keys,
    load_aggregator_keys,
    load_allow_list,
    load_device_keys,
    read_certificate,
)
from testbed.core.transport.curve_server import CurveServer

pytestmark = pytest.mark.timeout(20)

ANY_PORT = "tcp://127.0.0.1:*"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeySet:
    """A key set of three devices."""
    return generate_keys(tmp_path_factory.mktemp("keys") / "lab", 3)


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> KeySet:
    """Valid keys of another lab: not on the allow-list of ``keys``."""
    return generate_keys(tmp_path_factory.mktemp("stranger"), 1)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    """A context of the test's own; at the end every socket must have been closed: its
    ``term()`` (which blocks until they are, and which no timeout can interrupt) runs in a
    thread, and a context still open after 60 s fails the test and is destroyed, so that a
    socket left open fails this test instead of hanging the whole run."""
    context: zmq.Context[Any] = zmq.Context()
    yield context
    done = threading.Event()
    threading.Thread(target=lambda: (context.term(), done.set()), daemon=True).start()
    if not done.wait(60.0):
        context.destroy(linger=0)
        pytest.fail("a socket was left open: the context could not terminate in 60 s")


# ------------------------------------------------------------------------------- key files


def test_generated_files_modes_and_allow_list(keys: KeySet) -> None:
    assert keys.devices == 3
    for path in keys.files():
        assert path.is_file(), path
    secrets = [keys.aggregator_secret, *keys.device_secret]
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert not list(keys.out_dir.glob(".*.tmp")), "temporary files left behind"
    # the allow-list holds exactly the device public certificates, no secret
    assert sorted(p.name for p in keys.allowed_dir.iterdir()) == [
        "device-0.key", "device-1.key", "device-2.key"
    ]
    for path in keys.allowed_dir.iterdir():
        assert read_certificate(path).secret_key is None
        assert b"secret-key" not in path.read_bytes()
    # pyzmq reads the same files: the public file gives the public key of the secret file
    for public_path, secret_path in zip(keys.device_public, keys.device_secret, strict=True):
        public, none = zmq.auth.load_certificate(public_path)
        public2, secret = zmq.auth.load_certificate(secret_path)
        assert none is None and secret is not None
        assert public == public2 == zmq.curve_public(secret)
    allow = load_allow_list(keys.allowed_dir)
    assert set(allow) == set(zmq.auth.load_certificates(keys.allowed_dir))
    for i in range(3):
        public, secret = load_device_keys(keys.out_dir, i)
        assert allow[public] == i
        assert zmq.curve_public(secret) == public
    public, secret = load_aggregator_keys(keys.out_dir)
    assert aggregator_public_key(keys.out_dir) == public == zmq.curve_public(secret)
    assert public not in allow
    assert len({*allow, public}) == 4  # all keys distinct


def test_refuses_to_overwrite(keys: KeySet) -> None:
    before = {p: p.read_bytes() for p in keys.files()}
    with pytest.raises(ValueError, match="out_dir.*already holds key files"):
        generate_keys(keys.out_dir, 3)
    with pytest.raises(ValueError, match="out_dir"):
        generate_keys(keys.out_dir, 1)  # a smaller set overlaps too
    assert {p: p.read_bytes() for p in keys.files()} == before


def test_refuses_a_non_empty_allow_list(tmp_path: Path) -> None:
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "old.key").write_text("stale")
    with pytest.raises(ValueError, match="not empty"):
        generate_keys(tmp_path, 1)
    assert not (tmp_path / "aggregator.key").exists()


@pytest.mark.parametrize("devices", [0, -1, 10_001, True, 1.5, "3", None])
def test_bad_devices_value_is_named(tmp_path: Path, devices: Any) -> None:
    with pytest.raises(ValueError, match=r"devices: got .*1 <= devices <= 10000"):
        generate_keys(tmp_path / "k", devices)
    assert not (tmp_path / "k").exists()


def test_missing_and_malformed_key_files(keys: KeySet, tmp_path: Path) -> None:
    with pytest.raises(KeyFileMissingError, match="testbed keys --out DIR --devices N") as info:
        load_aggregator_keys(tmp_path)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="aggregator.key"):
        aggregator_public_key(tmp_path)
    with pytest.raises(FileNotFoundError, match="device-7.key_secret"):
        load_device_keys(keys.out_dir, 7)
    with pytest.raises(FileNotFoundError, match="allow-list directory"):
        load_allow_list(tmp_path / "allowed")

    bad = tmp_path / "aggregator.key_secret"
    bad.write_text('curve\n    public-key = "not a key"\n    secret-key = "x"\n')
    bad.chmod(0o600)
    with pytest.raises(KeyFileError, match="public-key is not a 40-character z85"):
        load_aggregator_keys(tmp_path)
    # a key pair whose halves do not belong together
    text = keys.aggregator_secret.read_text()
    other_public = read_certificate(keys.device_public[0]).public_key.decode()
    own_public = read_certificate(keys.aggregator_public).public_key.decode()
    bad.write_text(text.replace(own_public, other_public))
    with pytest.raises(KeyFileError, match="does not belong"):
        load_aggregator_keys(tmp_path)
    # a secret readable by others is refused, as ssh does
    shutil.copyfile(keys.aggregator_secret, bad)
    bad.chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_aggregator_keys(tmp_path)
    # device 1's key pair filed as device 0: the metadata catches it
    moved = tmp_path / "device-0.key_secret"
    shutil.copyfile(keys.device_secret[1], moved)
    moved.chmod(0o600)
    with pytest.raises(KeyFileError, match="device 1, not 0"):
        load_device_keys(tmp_path, 0)


def test_allow_list_duplicates_and_secrets_name_the_files(
    keys: KeySet, stranger: KeySet, tmp_path: Path
) -> None:
    allowed = tmp_path / "allowed"
    shutil.copytree(keys.allowed_dir, allowed)
    shutil.copyfile(allowed / "device-1.key", allowed / "copy.key")
    with pytest.raises(ValueError, match=r"copy\.key and .*device-1\.key.*same public key"):
        load_allow_list(allowed)
    (allowed / "copy.key").unlink()
    # another lab's device 0: a different key claiming an id already taken
    shutil.copyfile(stranger.allowed_public[0], allowed / "intruder.key")
    with pytest.raises(ValueError, match=r"device-0\.key and .*intruder\.key.*device 0"):
        load_allow_list(allowed)
    (allowed / "intruder.key").unlink()
    shutil.copyfile(keys.device_secret[0], allowed / "device-0.key_secret")
    with pytest.raises(ValueError, match="secret certificate in the allow-list"):
        load_allow_list(allowed)
    (allowed / "device-0.key_secret").unlink()
    for path in allowed.iterdir():
        path.unlink()
    with pytest.raises(ValueError, match="holds no device certificate"):
        load_allow_list(allowed)


# --------------------------------------------------------------------------- the sockets


def test_allowed_clients_exchange_messages_with_their_device_ids(
    keys: KeySet, ctx: zmq.Context[Any]
) -> None:
    with CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir) as server:
        assert server.last_endpoint.startswith("tcp://127.0.0.1:")
        assert not server.last_endpoint.endswith(":*")
        assert server.zap_enforced
        with (
            CurveClient(ctx, server.last_endpoint, keys_dir=keys.out_dir, device=2) as two,
            CurveClient(ctx, server.last_endpoint, keys_dir=keys.out_dir, device=0) as zero,
        ):
            two.send([b"hello", b"from two"])
            got = server.recv(5.0)
            assert got is not None
            identity_two, device, frames = got
            assert (device, frames) == (2, [b"hello", b"from two"])
            zero.send([b"zero"])
            got = server.recv(5.0)
            assert got is not None and got[1:] == (0, [b"zero"])
            # replies are routed to the right peer
            server.send(identity_two, [b"to two"])
            assert two.recv(5.0) == [b"to two"]
            assert zero.recv(0.2) is None
        assert server.dropped == 0


def _send_to_refused(client: CurveClient, frames: list[bytes]) -> None:
    """Send from a client whose handshake the server refuses. libzmq either keeps the pipe
    (reconnecting: the message is queued and never delivered) or, once it has processed
    the server's ERROR, closes the session for good (no pipe: the send waits and times
    out); which one happens is a race, so both outcomes are accepted."""
    with contextlib.suppress(TimeoutError):
        client.send(frames, timeout_s=0.5)


def test_unlisted_key_is_refused_and_allowed_client_still_works(
    keys: KeySet, stranger: KeySet, ctx: zmq.Context[Any]
) -> None:
    with CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir) as server:
        endpoint = server.last_endpoint
        public, secret = load_device_keys(stranger.out_dir, 0)
        plain = ctx.socket(zmq.DEALER)  # no CURVE at all
        plain.setsockopt(zmq.LINGER, 0)
        try:
            plain.connect(endpoint)
            plain.send(b"plaintext")
            with CurveClient(
                ctx, endpoint, client_public=public, client_secret=secret,
                server_public=aggregator_public_key(keys.out_dir),
            ) as intruder:
                _send_to_refused(intruder, [b"let me in"])
                assert server.recv(2.0) is None
                with CurveClient(ctx, endpoint, keys_dir=keys.out_dir, device=1) as one:
                    one.send([b"still works"])
                    got = server.recv(5.0)
                    assert got is not None and got[1:] == (1, [b"still works"])
                _send_to_refused(intruder, [b"again"])
                assert server.recv(0.5) is None
        finally:
            plain.close(linger=0)


@pytest.mark.timeout(300)  # generous: a loaded machine; the refusal itself takes ms
def test_a_refused_key_is_reported_by_recv_at_once(
    keys: KeySet, stranger: KeySet, ctx: zmq.Context[Any]
) -> None:
    """The server's ZAP handler refuses a key not on the allow-list and says so (CurveZMQ
    ERROR); the client sees ZMQ_EVENT_HANDSHAKE_FAILED_AUTH on its socket monitor and
    recv() raises KeyRefusedError long before its timeout, naming the endpoint and the
    key. An allowed client on the same server is not affected."""
    with CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir) as server:
        endpoint = server.last_endpoint
        public, secret = load_device_keys(stranger.out_dir, 0)
        with (
            CurveClient(ctx, endpoint, client_public=public, client_secret=secret,
                        server_public=aggregator_public_key(keys.out_dir)) as intruder,
            CurveClient(ctx, endpoint, keys_dir=keys.out_dir, device=1) as one,
        ):
            _send_to_refused(intruder, [b"hello"])
            started = time.monotonic()
            with pytest.raises(KeyRefusedError) as err:
                intruder.recv(120.0)
            assert time.monotonic() - started < 100.0  # the refusal, not the timeout
            assert err.value.public_key == public and err.value.endpoint == endpoint
            message = str(err.value)
            assert endpoint in message and public.decode() in message
            assert "not on the aggregator's allow-list" in message
            with pytest.raises(KeyRefusedError):  # remembered: the session is gone
                intruder.recv(0.0)
            one.send([b"still admitted"])
            got = server.recv(60.0)
            assert got is not None and got[1:] == (1, [b"still admitted"])
            assert one.recv(0.5) is None  # no refusal, nothing sent: just the timeout


def test_send_polls_again_when_the_pipe_goes_between_poll_and_send(
    keys: KeySet, ctx: zmq.Context[Any]
) -> None:
    """A refused or dropped connection can be torn down after POLLOUT said writable; the
    non-blocking send then raises zmq.Again. send() must poll again, not raise it (seen
    once under load in test_unlisted_key_is_refused_and_allowed_client_still_works)."""
    with CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir) as server:
        with CurveClient(ctx, server.last_endpoint, keys_dir=keys.out_dir, device=1) as one:
            sock = one._open_socket()
            real = sock.send_multipart
            raised: list[int] = []

            def torn_down_once(frames: list[bytes], flags: int = 0) -> Any:
                if not raised:
                    raised.append(flags)
                    raise zmq.Again(errno.EAGAIN)
                return real(frames, flags=flags)

            sock.send_multipart = torn_down_once  # type: ignore[method-assign]
            one.send([b"after the race"])
            assert raised == [zmq.NOBLOCK]
            got = server.recv(5.0)
            assert got is not None and got[1:] == (1, [b"after the race"])


def test_wrong_server_key_gets_nothing_through(
    keys: KeySet, stranger: KeySet, ctx: zmq.Context[Any]
) -> None:
    public, secret = load_device_keys(keys.out_dir, 0)
    with (
        CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir) as server,
        CurveClient(
            ctx, server.last_endpoint, client_public=public, client_secret=secret,
            server_public=aggregator_public_key(stranger.out_dir),
        ) as client,
    ):
        client.send([b"secret update"])
        assert server.recv(1.5) is None


def test_oversized_frame_is_dropped_at_the_exact_limit(
    keys: KeySet, ctx: zmq.Context[Any]
) -> None:
    limit = 4096
    with (
        CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir, max_message_bytes=limit) as server,
        CurveClient(
            ctx, server.last_endpoint, keys_dir=keys.out_dir, device=0,
            max_message_bytes=2 * limit,
        ) as client,
    ):
        client.send([b"x" * (limit + 1)])
        assert server.recv(1.0) is None
        # libzmq dropped the connection; the client reconnects and a frame at the limit passes
        client.send([b"y" * limit])
        got = server.recv(5.0)
        assert got is not None and got[1] == 0 and got[2] == [b"y" * limit]
        with pytest.raises(ValueError, match="max_message_bytes"):
            server.send(got[0], [b"z" * (limit + 1)])


def test_one_server_per_context_and_idempotent_close(
    keys: KeySet, ctx: zmq.Context[Any]
) -> None:
    server = CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir)
    try:
        with pytest.raises(RuntimeError, match="one CurveServer per"):
            CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir)
    finally:
        server.close()
        server.close()
    with pytest.raises(RuntimeError, match="closed"):
        server.recv(0.0)
    # the ZAP endpoint was released: a new server on the same context starts
    with CurveServer(ctx, ANY_PORT, keys_dir=keys.out_dir) as again:
        assert again.recv(0.0) is None


# ---------------------------------------------------------------------------------- CLI


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="testbed")
    cmd_keys.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_writes_keys_then_refuses_a_second_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "keys"
    assert _run_cli(["keys", "--out", str(out), "--devices", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"] == 2
    assert report["hosts"]["aggregator"] == [
        str(out / "aggregator.key"), str(out / "aggregator.key_secret"), f"{out / 'allowed'}/"
    ]
    assert report["hosts"]["device-1"] == [
        str(out / "device-1.key"), str(out / "device-1.key_secret"), str(out / "aggregator.key")
    ]
    assert load_allow_list(out / "allowed") == {
        load_device_keys(out, i)[0]: i for i in range(2)
    }

    assert _run_cli(["keys", "--out", str(out), "--devices", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "already holds key files" in captured.err

    assert _run_cli(["keys", "--out", str(tmp_path / "new"), "--devices", "0"]) == 2
    assert "devices: got 0" in capsys.readouterr().err

    assert _run_cli(["keys", "--out", str(tmp_path / "text"), "--devices", "1"]) == 0
    text = capsys.readouterr().out
    assert "device-0 host:" in text and "aggregator host:" in text
