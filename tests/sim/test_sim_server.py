"""Unit tests of the simulated server (pure: no real server; the differential test compares it
with one)."""

from __future__ import annotations

from typing import Any

import pytest

from fencelock._core import fencing
from fencelock._engine.handshake import identity_from
from fencelock._engine.resp import INCOMPLETE, Parser, ReplyError, command
from fencelock._scripts import ACQUIRE, EXTEND, RELEASE
from tests.sim.test_differential import same
from tools.sim.resp import NIL_ARRAY, OK, Err, ProtocolError, RequestParser, Status, encode
from tools.sim.server import SimServer


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def replies(data: bytes) -> list[Any]:
    parser = Parser()
    parser.feed(data)
    out = []
    while (reply := parser.get()) is not INCOMPLETE:
        out.append(reply)
    return out


def call(session: Any, *parts: Any) -> Any:
    session.feed(command(*parts))
    (reply,) = replies(session.take_output())
    return reply


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(clock: Clock) -> SimServer:
    return SimServer(clock=clock, seed=7)


def acquire_args(token: str, lease: int = 1000) -> tuple[Any, ...]:
    keys = ("{k}", "{k}:f", "{k}:i", "{k}:w", "{k}:h", "{k}:wake", "{k}:c")
    return ("EVALSHA", ACQUIRE.sha, 7, *keys, token, lease, "", "0", "-", 0)


def test_requests_in_any_chunking_and_pipelined() -> None:
    stream = command("SET", "k", "v") + command("GET", "k") + command("PING")
    parser = RequestParser()
    got = []
    for i in range(len(stream)):
        parser.feed(stream[i : i + 1])
        while (request := parser.next()) is not None:
            got.append(request)
    assert got == [[b"SET", b"k", b"v"], [b"GET", b"k"], [b"PING"]]


def test_a_malformed_request_is_a_protocol_error() -> None:
    parser = RequestParser()
    parser.feed(b"GET k\r\n")
    with pytest.raises(ProtocolError):
        parser.next()


def test_reply_encoding() -> None:
    assert encode([b"a", 1, None, NIL_ARRAY, OK, Err("ERR x")]) == (
        b"*6\r\n$1\r\na\r\n:1\r\n$-1\r\n*-1\r\n+OK\r\n-ERR x\r\n"
    )
    assert encode(Status(b"PONG")) == b"+PONG\r\n"


def test_byte_at_a_time_feed_runs_each_command_once_complete(server: SimServer) -> None:
    session = server.connect()
    stream = command("RPUSH", "l", "a") + command("LRANGE", "l", 0, -1)
    for i in range(len(stream)):
        session.feed(stream[i : i + 1])
    assert replies(session.take_output()) == [1, [b"a"]]


def test_the_handshake_reads_the_identity(server: SimServer, clock: Clock) -> None:
    session = server.connect()
    session.feed(command("INFO", "server") + command("ROLE"))
    identity = identity_from(replies(session.take_output()))
    assert identity is not None
    assert (identity.engine, identity.role, identity.run_id) == ("valkey", "master", server.run_id)
    assert identity.version == (8, 1, 8)
    clock.now += 42.5
    session.feed(command("INFO", "server") + command("ROLE"))
    assert identity_from(replies(session.take_output())).uptime_s == 42  # type: ignore[union-attr]
    redis = SimServer(clock=clock, seed=7, engine="redis").connect()
    redis.feed(command("INFO", "server") + command("ROLE"))
    other = identity_from(replies(redis.take_output()))
    assert other is not None and (other.engine, other.version) == ("redis", (7, 0, 15))


def test_run_id_is_deterministic_and_changes_on_restart(clock: Clock) -> None:
    a, b = SimServer(clock=clock, seed=3), SimServer(clock=clock, seed=3)
    assert a.run_id == b.run_id != SimServer(clock=clock, seed=4).run_id
    first = a.run_id
    a.crash(wipe=False)
    a.restart()
    assert a.run_id != first
    c = SimServer(clock=clock, seed=3)
    c.restart()
    assert c.run_id == a.run_id


def test_expiry_on_the_server_clock(server: SimServer, clock: Clock) -> None:
    session = server.connect()
    assert call(session, "SET", "k", "v", "PX", 100) == b"OK"
    clock.now += 0.0995
    assert call(session, "PTTL", "k") == 1  # 0.5 ms left shows as 1 (floored clock ms)
    clock.now += 0.001
    assert call(session, "GET", "k") is None
    assert call(session, "PTTL", "k") == -2


def test_the_real_scripts_grant_refuse_extend_and_release(server: SimServer, clock: Clock) -> None:
    session = server.connect()
    assert isinstance(call(session, *acquire_args("t1")), ReplyError)  # NOSCRIPT
    for script in (ACQUIRE, EXTEND, RELEASE):
        assert call(session, "SCRIPT", "LOAD", script.source) == script.sha.encode()
    granted = call(session, *acquire_args("t1"))
    now_us = int(clock.now * 1e6)
    assert granted[0] == 1 and abs(int(granted[1]) - now_us) <= 1
    refused = call(session, *acquire_args("t2"))
    assert refused == [0, 1000]
    assert call(session, "EVALSHA", EXTEND.sha, 2, "{k}", "{k}:i", "t2", 5000) == 0
    assert call(session, "EVALSHA", EXTEND.sha, 2, "{k}", "{k}:i", "t1", 5000) == 1
    assert call(session, "PTTL", "{k}") == 5000
    release = ("{k}", "{k}:i", "{k}:w", "{k}:wake", "{k}:h", "{k}:f", "{k}:c")
    assert call(session, "EVALSHA", RELEASE.sha, 7, *release, "t2", 100, 5000, "", 1000, "-") == 0
    assert call(session, "EVALSHA", RELEASE.sha, 7, *release, "t1", 100, 5000, "", 1000, "-") == 1
    second = call(session, *acquire_args("t2"))
    assert second[0] == 1 and int(second[1]) == int(granted[1]) + 1  # same µs: F + 1


def test_noscript_after_restart_and_flush(server: SimServer) -> None:
    session = server.connect()
    call(session, "SCRIPT", "LOAD", EXTEND.source)
    assert call(session, "SCRIPT", "EXISTS", EXTEND.sha) == [1]
    server.flush_scripts()
    reply = call(session, "EVALSHA", EXTEND.sha, 2, "a", "b", "t", 1)
    assert isinstance(reply, ReplyError) and reply.message == "NOSCRIPT No matching script."
    call(session, "SCRIPT", "LOAD", EXTEND.source)
    server.crash(wipe=True)
    assert session.closed and not server.up
    with pytest.raises(ConnectionRefusedError):
        server.connect()
    server.restart()
    fresh = server.connect()
    assert fresh.client_id != session.client_id
    assert call(fresh, "SCRIPT", "EXISTS", EXTEND.sha) == [0]


def test_crash_keeps_or_wipes_data(server: SimServer) -> None:
    session = server.connect()
    call(session, "SET", "k", "v")
    server.crash(wipe=False)
    server.restart()
    assert call(server.connect(), "GET", "k") == b"v"
    server.crash(wipe=True)
    server.restart()
    assert call(server.connect(), "GET", "k") is None


def test_script_errors_have_the_engines_shape(server: SimServer) -> None:
    session = server.connect()
    call(session, "HSET", "h", "a", "1")
    reply = call(session, "EVAL", "local a = 1\nreturn redis.call('GET', KEYS[1])", 1, "h")
    sha = "1d5e5d09a8d2b1d9fb6f6b1aa0a48a7c9f9a8d68"
    assert reply.message.startswith("WRONGTYPE Operation against a key holding the wrong kind")
    assert reply.message.endswith(", on @user_script:2.")
    assert call(session, "EVAL", "return {1, 2.9, -2.9, false, true, 'x', nil, 3}", 0) == [
        1,
        2,
        -2,
        None,
        1,
        b"x",
    ]
    assert call(session, "EVAL", "return redis.pcall('GET', KEYS[1])", 1, "h").message == (
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    )
    assert "readonly table" in call(session, "EVAL", "x = 1", 0).message
    del sha


def test_blocking_pop_is_fifo_and_blocks_later_requests(server: SimServer, clock: Clock) -> None:
    first, second, pusher = server.connect(), server.connect(), server.connect()
    first.feed(command("BLPOP", "q", "1.000") + command("PING"))
    second.feed(command("BLPOP", "q", "2.000"))
    assert first.take_output() == b"" and second.take_output() == b""
    assert server.next_timer_at() == pytest.approx(clock.now + 1.0)
    assert call(pusher, "RPUSH", "q", "x") == 1
    assert replies(first.take_output()) == [[b"q", b"x"], b"PONG"]
    assert second.take_output() == b""
    clock.now += 2.0
    server.advance()
    assert replies(second.take_output()) == [None]
    assert server.next_timer_at() is None


def test_blmove_claims_and_client_unblock_ends_a_wait(server: SimServer) -> None:
    waiter, other = server.connect(), server.connect()
    assert call(waiter, "CLIENT", "ID") == waiter.client_id
    waiter.feed(command("BLMOVE", "wake", "claimed", "LEFT", "RIGHT", "0"))
    assert call(other, "RPUSH", "wake", "grant") == 1
    assert replies(waiter.take_output()) == [b"grant"]
    assert call(other, "LRANGE", "claimed", 0, -1) == [b"grant"]
    waiter.feed(command("BLMOVE", "wake", "claimed", "LEFT", "RIGHT", "0"))
    assert call(other, "CLIENT", "UNBLOCK", waiter.client_id) == 1
    assert replies(waiter.take_output()) == [None]
    assert call(other, "CLIENT", "UNBLOCK", waiter.client_id) == 0


def test_a_script_push_wakes_a_blocked_client_after_the_script(server: SimServer) -> None:
    waiter, other = server.connect(), server.connect()
    waiter.feed(command("BLPOP", "wake", "0"))
    script = "redis.call('RPUSH', KEYS[1], '1'); return redis.call('LLEN', KEYS[1])"
    assert call(other, "EVAL", script, 1, "wake") == 1  # the list still held it in the script
    assert replies(waiter.take_output()) == [[b"wake", b"1"]]


def test_a_closed_session_abandons_its_block(server: SimServer) -> None:
    waiter, other = server.connect(), server.connect()
    waiter.feed(command("BLPOP", "q", "0"))
    waiter.close()
    assert call(other, "RPUSH", "q", "x") == 1
    assert call(other, "LRANGE", "q", 0, -1) == [b"x"]


def test_wait_without_replicas(server: SimServer, clock: Clock) -> None:
    session = server.connect()
    assert call(session, "WAIT", 0, 0) == 0
    session.feed(command("WAIT", 1, 50))
    assert session.take_output() == b""
    clock.now += 0.05
    server.advance()
    assert replies(session.take_output()) == [0]


def test_time_follows_the_clock(server: SimServer, clock: Clock) -> None:
    clock.now = 1234.5678905
    assert call(server.connect(), "TIME") == [b"1234", b"567890"]


def test_same_allows_time_and_not_flags() -> None:
    assert same([1, b"1700000000000123"], [1, b"1700000000000456"])
    assert not same([1, b"5"], [0, b"5"])
    assert not same(2, 3)
    assert not same(b"1", 1)
    assert not same(ReplyError("ERR a"), ReplyError("ERR b"))
    assert not same([1], [1, None])


def test_commands_per_second(server: SimServer, clock: Clock) -> None:
    """The simulated server's speed on the library's hot path (a generous floor; the measured
    figure is printed with -s)."""
    import time

    session = server.connect()
    call(session, "SCRIPT", "LOAD", ACQUIRE.source)
    call(session, "SCRIPT", "LOAD", EXTEND.source)
    payload = command(*acquire_args("t1", 60_000)) + command(
        "EVALSHA", EXTEND.sha, 2, "{k}", "{k}:i", "t1", 60_000
    )
    n = 3000
    started = time.perf_counter()
    out = b""
    for _ in range(n):
        clock.now += 0.001
        session.feed(payload)
        out = session.take_output()
    elapsed = time.perf_counter() - started
    assert replies(out) == [[0, 60_000 - 1], 1]  # refused (t1 holds it), extended: real work
    rate = 2 * n / elapsed
    print(f"\nsimulated server: {rate:,.0f} script calls/s")
    assert rate > 2000


@pytest.mark.parametrize(
    ("now_us", "register", "step", "expected"),
    [
        (1_700_000_000_123_456, None, 0, 1_700_000_000_123_456),  # TIME itself
        (1_700_000_000_123_456, None, 10_000, 1_700_000_000_130_000),  # rounded up
        (1_700_000_000_120_000, None, 10_000, 1_700_000_000_120_000),  # already a multiple
        (1_700_000_000_995_001, None, 10_000, 1_700_000_001_000_000),  # into the next second
        (1_700_000_000_123_456, 1_700_000_000_130_000, 10_000, 1_700_000_000_130_001),  # F + 1
        (1_700_000_000_123_456, None, 7, 1_700_000_000_123_456),  # not a divisor of 10^6
        (1_700_000_000_123_456, 2**53 + 1, 10_000, 2**53 + 2),  # exact past 2^53
    ],
)
def test_the_acquire_scripts_floor_step_is_what_fencing_bump_computes(
    clock: Clock, now_us: int, register: int | None, step: int, expected: int
) -> None:
    # the real acquire.lua (ARGV[8]) against its mirror, fencing.bump, on the simulated server
    clock.now = now_us / 1e6
    session = SimServer(clock=clock, seed=7).connect()
    assert call(session, "SCRIPT", "LOAD", ACQUIRE.source) == ACQUIRE.sha.encode()
    if register is not None:
        call(session, "SET", "{k}:f", str(register))
    at = call(session, "TIME")
    server_us = int(at[0]) * 1_000_000 + int(at[1])
    granted = call(session, *acquire_args("t1"), 0, step)
    assert granted[0] == 1 and int(granted[1]) == expected
    assert fencing.bump(register or 0, server_us, step) == expected
    assert call(session, "GET", "{k}:f") == str(expected).encode()


def test_acquire_on_a_server_without_set_get_reads_and_writes_the_register(
    server: SimServer, clock: Clock
) -> None:
    """A server before ``SET ... GET`` (Redis < 6.2) refuses it as a syntax error; the acquire
    script then reads the register and writes it (fence_math.lua's fence_issue), with the same
    fences: F + 1 in the same microsecond, the TIME floor after."""
    setter, arity = server._table[b"SET"]
    refused: list[list[bytes]] = []

    def set_without_get(a: list[bytes]) -> Any:
        if any(part.upper() == b"GET" for part in a[3:]):
            refused.append(a)
            return Err("ERR syntax error")
        return setter(a)

    server._table[b"SET"] = (set_without_get, arity)
    session = server.connect()
    call(session, "SCRIPT", "LOAD", ACQUIRE.source)
    call(session, "SET", "{k}:f", "17")
    granted = call(session, *acquire_args("t1"))
    assert granted[0] == 1 and abs(int(granted[1]) - int(clock.now * 1e6)) <= 1
    assert call(session, "GET", "{k}:f") == granted[1]
    call(session, "DEL", "{k}")
    again = call(session, *acquire_args("t2"))  # the same microsecond: F + 1
    assert again[0] == 1 and int(again[1]) == int(granted[1]) + 1
    assert call(session, "GET", "{k}:f") == again[1]
    assert len(refused) == 2  # the one-command way was tried, and refused, each time
