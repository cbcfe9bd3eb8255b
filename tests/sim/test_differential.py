"""The simulated server against a real one: the same random commands and script calls on both,
identical replies required (the simulation is only as good as this check).

The engine is the one ``fencelock.testing`` picks (``FENCELOCK_SERVER_BIN``), so CI runs this on
both legs (Valkey 8 and Redis 7). Before every request the simulated server's clock is set to the
real server's ``TIME``, so time-derived values (fences taken from ``TIME``, waiter expiries, PTTL)
differ only by the real server's time passing between the two; :func:`same` allows that much on
numbers that are time-derived (20 or more), and nothing on the small ones (flags, counts).

Short leases (``SHORT_MS``) expire for real: the requests come in rounds, the rounds are
separated by a sleep longer than a short lease, and a round is short; a round that ran slower
than :data:`ROUND_MAX_S` (a loaded machine) cannot be compared near its expiries, so the run is
repeated on a new seed (at most twice) rather than reported as a difference.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fencelock._engine.resp import INCOMPLETE, Parser, ReplyError, command
from fencelock._scripts import ALL
from fencelock.fence import SCRIPTS as FENCE_SCRIPTS
from fencelock.testing import Server
from tools.sim.server import SimServer

SHORT_MS = 150
ROUND_GAP_S = 0.2
ROUND_MAX_S = 0.1
BUDGET_S = float(os.environ.get("FENCELOCK_SIM_DIFF_SECONDS", "12"))
TIME_TOLERANCE_MS = 50


# -- comparing -------------------------------------------------------------------------------


def _number(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if (isinstance(value, bytes) and value[:1].isdigit()) or (
        value[:1] == b"-" and value[1:2].isdigit()
    ):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _close(a: int, b: int) -> bool:
    if a == b:
        return True
    if abs(a) < 20 or abs(b) < 20:
        return False  # flags, counts, small pttls: exact
    tolerance = TIME_TOLERANCE_MS * (1000 if max(abs(a), abs(b)) >= 10**14 else 1)
    return abs(a - b) <= tolerance


def same(a: Any, b: Any) -> bool:
    """The replies agree, up to the real server's time passing (see the module docstring)."""
    if isinstance(a, ReplyError) or isinstance(b, ReplyError):
        return isinstance(a, ReplyError) and isinstance(b, ReplyError) and a.message == b.message
    if isinstance(a, list) or isinstance(b, list):
        return (
            isinstance(a, list)
            and isinstance(b, list)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    if a == b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, bytes) and b" " in a:  # a wake element: 'token fence lease window'
        left, right = a.split(b" "), b.split(b" ")
        return len(left) == len(right) and all(same(x, y) for x, y in zip(left, right, strict=True))
    x, y = _number(a), _number(b)
    return x is not None and y is not None and _close(x, y)


# -- the two servers -------------------------------------------------------------------------


class RealConn:
    def __init__(self, server: Server) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=10)
        self.parser = Parser()

    def send(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def read(self) -> Any:
        while True:
            reply = self.parser.get()
            if reply is not INCOMPLETE:
                return reply
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the real server closed the connection")
            self.parser.feed(data)

    def call(self, *parts: bytes | str | int) -> Any:
        self.send(command(*parts))
        return self.read()

    def close(self) -> None:
        self.sock.close()


class SimConn:
    def __init__(self, server: SimServer, clock: list[float]) -> None:
        self.server = server
        self.clock = clock
        self.session = server.connect()
        self.parser = Parser()

    def call(self, *parts: bytes | str | int) -> Any:
        self.session.feed(command(*parts))
        self.parser.feed(self.session.take_output())
        reply = self.parser.get()
        if reply is INCOMPLETE and self.session.block is not None:
            # blocked: the real server answered after the timeout; so does the simulated one
            at = self.server.next_timer_at()
            assert at is not None, "blocked with no timeout"
            self.clock[0] = at
            self.server.advance()
            self.parser.feed(self.session.take_output())
            reply = self.parser.get()
        assert reply is not INCOMPLETE, f"no reply from the simulated server to {parts!r}"
        return reply


# -- what is sent ----------------------------------------------------------------------------


def _keys(resource: str) -> dict[str, str]:
    tag = "{" + resource + "}"
    return {
        name: f"{tag}:{name}"
        for name in [
            "lock",
            "fence",
            "info",
            "waiters",
            "handoff",
            "wake",
            "claimed",
            "queue",
            "beats",
            "prefix",
            "readers",
            "intent",
            "res",
            "observers",
            "s0",
            "s0i",
            "s0h",
            "s1",
            "s1i",
            "s1h",
        ]
    } | {"lock": tag}


_SCRIPT_KEYS: dict[str, tuple[str, ...]] = {
    "acquire": ("lock", "fence", "info", "waiters", "handoff", "wake", "claimed"),
    "release": ("lock", "info", "waiters", "wake", "handoff", "fence", "claimed"),
    "extend": ("lock",),
    "fence_commit": ("lock", "fence"),
    "elect_announce": ("lock", "info", "observers"),
    "elect_read": ("lock", "info", "observers"),
    "sem_acquire": ("fence", "waiters", "s0", "s0i", "s0h", "s1", "s1i", "s1h"),
    "sem_sweep": ("waiters", "wake", "s0", "s0i", "s1", "s1i"),
    "sem_fence_commit": ("s0", "fence"),
    "rw_read_acquire": ("lock", "fence", "readers", "intent", "waiters", "wake"),
    "rw_read_commit": ("readers", "fence"),
    "rw_read_extend": ("readers",),
    "rw_read_release": ("readers", "waiters", "wake"),
    "rw_write_acquire": ("lock", "fence", "info", "waiters", "handoff", "readers", "intent"),
    "rw_write_release": ("lock", "info", "waiters", "wake", "intent"),
    "fair_acquire": ("lock", "fence", "info", "queue", "beats", "prefix"),
    "fair_release": ("lock", "info", "queue", "beats", "prefix"),
    "fair_leave": ("lock", "queue", "beats", "prefix"),
    "fence_write": ("res",),
    "fence_apply": ("res",),
    "fence_advance": ("res",),
}


# RedisFence's scripts (fence.py loads them beside the lock scripts, includes in place)
SCRIPTS = {script.name: script for script in (*ALL, *FENCE_SCRIPTS)}


_TYPED = {
    "string": ("lock", "info", "handoff", "intent", "fence", "s0", "s0i", "s0h", "s1"),
    "hash": ("res",),
    "list": ("wake", "claimed"),
    "zset": ("waiters", "queue", "beats", "readers", "observers"),
}
# Generator.plain's choices by the type their key holds (others: strings)
_KIND = {6: "hash", 7: "hash", 8: "list", 9: "list", 18: "list", 19: "list", 20: "list"} | {
    n: "zset" for n in range(10, 17)
}


class Generator:
    """Random requests in the shapes the library sends (tokens, leases, fences, waiters)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.fences = ["0", "1", "17", str(10**15), str(2 * 10**15), str(10**18)]

        self.short = True  # short leases allowed (this round ends with a sleep past them)

    def lease(self) -> str:
        return str(
            self.rng.choice((SHORT_MS, 60_000, 120_000) if self.short else (60_000, 120_000))
        )

    def token(self) -> str:
        return self.rng.choice(("w1aaaaaaaaaaaaaa-t1", "w2bbbbbbbbbbbbbb-t2", "h-next-t3"))

    def waiter(self) -> str:
        # "+w1...": a first attempt's id, registered nowhere yet (acquire.lua)
        return self.rng.choice(("-", "w1aaaaaaaaaaaaaa", "+w1aaaaaaaaaaaaaa", "w2bbbbbbbbbbbbbb"))

    def script_call(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        rng = self.rng
        name = rng.choice(sorted(_SCRIPT_KEYS))
        keys = _keys(rng.choice(("a", "b")))
        names = _SCRIPT_KEYS[name]
        if name == "sem_acquire" and rng.random() < 0.5:
            names = names[:5]
        if name == "sem_sweep" and rng.random() < 0.5:
            names = names[:4]
        k = tuple(keys[n] for n in names)
        tok, lease, waiter = self.token(), self.lease(), self.waiter()
        info = rng.choice(("", '{"host":"x"}'))
        # a short hand-off window only where the round ends with a sleep past it, as a short
        # lease: a marker expiring mid-round is read at a time the two servers differ on
        window = str(rng.choice((100, 5000) if self.short else (5000, 5000)))
        wait = str(rng.choice((0, 3000)))
        fence = rng.choice(self.fences)
        args: tuple[str, ...]
        keep = rng.choice(("0", "2000", "604800000"))  # the fence register's retention
        if name in ("acquire", "rw_read_acquire", "rw_write_acquire"):
            args = (tok, lease, info, rng.choice("01"), waiter, wait, keep)
        elif name == "sem_acquire":
            args = (tok, lease, info, rng.choice("01"), waiter, wait, rng.choice("01"), keep)
        elif name == "release":
            nxt = rng.choice(("", "h-next-t3"))
            args = (tok, window, "5000", nxt, lease, waiter, keep)
        elif name in ("extend", "rw_read_extend"):
            args = (tok, lease)
        elif name in ("fence_commit", "rw_read_commit", "sem_fence_commit"):
            args = (tok, fence, keep)
        elif name == "elect_announce":
            args = (rng.choice((tok, "")), '{"term":1}', "5000")
        elif name == "elect_read":
            args = (rng.choice(("", "o1")), lease)
        elif name in ("rw_read_release", "sem_sweep"):
            args = (tok, window, "5000")
        elif name == "rw_write_release":
            args = (tok, window, "5000", "", lease, waiter, keep)
        elif name == "fair_acquire":
            w = rng.choice(("w1aaaaaaaaaaaaaa", "w2bbbbbbbbbbbbbb", "-"))
            ftok = (w if w != "-" else "x" * 16) + "-t"
            args = (ftok, lease, info, w, rng.choice(("0", "1", "5")), "3000", keep)
        elif name == "fair_release":
            args = (rng.choice(("w1aaaaaaaaaaaaaa-t", "w2bbbbbbbbbbbbbb-t")), window, "5000")
        elif name == "fair_leave":
            args = (rng.choice(("w1aaaaaaaaaaaaaa", "w2bbbbbbbbbbbbbb")), "5000")
        elif name == "fence_write":
            args = (fence, rng.choice(("v1", "v2")))
        elif name == "fence_apply":
            args = (fence, rng.choice(("1", "-3", "9007199254740991")), rng.choice(("", "0")))
        else:
            args = (fence,)
        return name, k, args

    def plain(self) -> tuple[str | int, ...]:
        rng = self.rng
        keys = _keys(rng.choice(("a", "b")))
        choice = rng.randrange(24)
        if rng.random() < 0.2:  # any key: wrong types, WRONGTYPE inside scripts
            key = rng.choice(sorted(set(keys.values())))
        else:  # a key of the type the command works on
            names = _TYPED[_KIND.get(choice, "string")]
            key = keys[rng.choice(names)]
        value = rng.choice(("1", "v", "w1aaaaaaaaaaaaaa-t1 123 1000 100", str(10**15)))
        if choice == 0:
            return ("GET", key)
        if choice == 1:
            opts: list[str] = rng.choice(([], ["NX"], ["XX"], ["GET"], ["KEEPTTL"]))
            if rng.random() < 0.6:
                opts = [*opts, "PX", self.lease()] if "KEEPTTL" not in opts else opts
            return ("SET", key, value, *opts)
        if choice == 2:
            return ("DEL", key, *rng.sample(sorted(keys.values()), rng.randrange(2)))
        if choice == 3:
            return ("EXISTS", key, key)
        if choice == 4:
            return ("PEXPIRE", key, rng.choice(("0", "-5", self.lease())))
        if choice == 5:
            return ("PTTL", key)
        if choice == 6:
            return ("HGET", key, rng.choice(("fence", "value")))
        if choice == 7:
            return ("HSET", key, "fence", rng.choice(self.fences), "value", "7")
        if choice == 8:
            return ("RPUSH", key, *rng.sample(("1", "2", value), rng.randrange(1, 3)))
        if choice == 9:
            return ("LRANGE", key, rng.choice((0, 1, -2)), rng.choice((-1, 0, 7)))
        if choice == 10:
            return (
                "ZADD",
                key,
                rng.choice(("1", "2.5", "0.1", "-inf", str(10**12))),
                rng.choice("xyz"),
            )
        if choice == 11:
            return ("ZCARD", key)
        if choice == 12:
            return ("ZRANGE", key, 0, rng.choice((0, -1)), *rng.choice(((), ("WITHSCORES",))))
        if choice == 13:
            low = rng.choice(("-inf", "(1", "2"))
            extra = rng.choice(((), ("LIMIT", 0, 1), ("WITHSCORES",)))
            return ("ZRANGEBYSCORE", key, low, rng.choice(("+inf", "10")), *extra)
        if choice == 14:
            return ("ZREM", key, rng.choice("xyz"), "q")
        if choice == 15:
            return ("ZREMRANGEBYSCORE", key, "-inf", rng.choice(("1", "(2.5", "+inf")))
        if choice == 16:
            return ("ZSCORE", key, rng.choice("xyz"))
        if choice == 17:
            return ("TYPE", key)
        if choice == 18:
            return ("LPOP", key)
        if choice == 19:
            return ("BLPOP", key, rng.choice(("0.01", "0.02")))
        if choice == 20:
            return ("BLMOVE", key, keys["claimed"], "LEFT", "RIGHT", "0.01")
        if choice == 21:
            return ("MGET", key, keys["lock"])
        if choice == 22:
            return ("INCR", key)
        return ("EXISTS", key)


# -- the run ---------------------------------------------------------------------------------


def _real_time(conn: RealConn) -> float:
    seconds, micros = conn.call("TIME")
    return int(seconds) + int(micros) / 1e6


def _engine_name(server: Server) -> str:
    return server.engine.name


def run_pair(
    server: Server, seed: int, budget_s: float, *, patch: Callable[[SimServer], None] | None = None
) -> tuple[int, list[str], bool]:
    """Random rounds on ``server`` and on a simulated server of its engine.

    Returns (requests compared, the differences found, whether a round ran too slowly to judge
    the expiries near its end).
    """
    rng = random.Random(seed)
    gen = Generator(rng)
    real = RealConn(server)
    real.call("FLUSHALL")
    clock = [_real_time(real)]
    sim = SimServer(clock=lambda: clock[0], seed=seed, engine=_engine_name(server))
    if patch is not None:
        patch(sim)
    conn = SimConn(sim, clock)
    for script in SCRIPTS.values():
        loaded = (
            real.call("SCRIPT", "LOAD", script.source),
            conn.call("SCRIPT", "LOAD", script.source),
        )
        assert loaded[0] == loaded[1] == script.sha.encode()
    differences: list[str] = []
    compared = 0
    slow = False
    deadline = time.monotonic() + budget_s
    try:
        while time.monotonic() < deadline and len(differences) < 5:
            started = time.monotonic()
            gen.short = rng.random() < 0.2
            for request in _round(gen, rng):
                clock[0] = _real_time(real)
                want, got = real.call(*request), conn.call(*request)
                compared += 1
                if not same(want, got):
                    differences.append(
                        f"seed {seed} #{compared} {request!r}:\n  real {want!r}\n  sim  {got!r}"
                    )
            if gen.short:
                if time.monotonic() - started > ROUND_MAX_S:
                    slow = True
                time.sleep(ROUND_GAP_S)
    finally:
        real.close()
    return compared, differences, slow


def _round(gen: Generator, rng: random.Random) -> Iterator[tuple[str | int, ...]]:
    for _ in range(rng.randrange(8, 20)):
        if rng.random() < 0.55:
            name, keys, args = gen.script_call()
            script = SCRIPTS[name]
            how = rng.random()
            if how < 0.1:
                yield ("EVAL", script.source.decode(), len(keys), *keys, *args)
            else:
                yield ("EVALSHA", script.sha, len(keys), *keys, *args)
        else:
            yield gen.plain()


@pytest.fixture(scope="module")
def real_server() -> Iterator[Server]:
    # no password: the comparison speaks raw RESP on its own sockets, with no AUTH first
    with Server(password=None) as server:
        yield server


def test_sim_replies_as_the_real_server_does(real_server: Server) -> None:
    seed = int(os.environ.get("FENCELOCK_SIM_DIFF_SEED", "0")) or random.SystemRandom().randrange(
        1, 2**31
    )
    for attempt in range(3):
        compared, differences, slow = run_pair(real_server, seed + attempt, BUDGET_S)
        if not differences or not slow:
            break
    assert compared > 1000, f"only {compared} requests compared"
    assert not differences, "\n".join(differences)


def test_a_wrong_conversion_rule_is_caught(real_server: Server) -> None:
    """The check is not blind: a simulated server that replies a Lua number as a bulk string
    (the engines: an integer, truncated) differs from the real one within the budget."""
    from tools.sim import lua

    original = lua.Scripts._reply

    def wrong(self: lua.Scripts, value: Any) -> Any:
        if type(value) is int:
            return b"%d" % value
        return original(self, value)

    def patch(sim: SimServer) -> None:
        sim.scripts._reply = wrong.__get__(sim.scripts)  # type: ignore[method-assign]

    compared, differences, _ = run_pair(real_server, 12345, 3.0, patch=patch)
    assert differences, f"{compared} requests compared and no difference found"


def _blocked_clients(conn: RealConn) -> int:
    info = conn.call("INFO", "clients").decode()
    return int(info.split("blocked_clients:")[1].split()[0])


def test_blocked_clients_as_the_real_server(real_server: Server) -> None:
    """Blocking in the shapes the drivers use, on several connections: BLPOP and BLMOVE woken
    by a push (a script's RPUSH too) in blocking order, requests pipelined behind a blocked
    one, CLIENT UNBLOCK, a timeout. Each step's replies on every connection must agree."""
    real_conns = [RealConn(real_server) for _ in range(3)]
    real_conns[0].call("FLUSHALL")
    clock = [_real_time(real_conns[0])]
    sim = SimServer(clock=lambda: clock[0], seed=1, engine=_engine_name(real_server))
    sims = [sim.connect() for _ in range(3)]
    ids = [c.call("CLIENT", "ID") for c in real_conns]
    sim_ids = [s.client_id for s in sims]
    push = "redis.call('RPUSH', KEYS[1], ARGV[1]); return redis.call('LLEN', KEYS[1])"
    steps: list[tuple[int, tuple[Any, ...], bool]] = [
        # (connection, request, it blocks)
        (0, ("BLPOP", "{q}:wake", "0"), True),
        (0, ("PING",), True),  # pipelined behind the blocked BLPOP
        (1, ("BLMOVE", "{q}:wake", "{q}:claimed", "LEFT", "RIGHT", "0"), True),
        (2, ("RPUSH", "{q}:wake", "g1"), False),  # the first blocked (0) gets it, then PONG
        (2, ("EVAL", push, 1, "{q}:wake", "g2"), False),  # served after the script: 1 moves it
        (2, ("LRANGE", "{q}:claimed", 0, -1), False),
        (0, ("BLMOVE", "{q}:wake", "{q}:claimed", "LEFT", "RIGHT", "0"), True),
        (2, ("CLIENT", "UNBLOCK", "@0"), False),
        (1, ("BLPOP", "{q}:none", "0.05"), True),  # times out
        (2, ("CLIENT", "UNBLOCK", "@1"), False),  # not blocked any more: 0
    ]
    real_out: list[list[Any]] = [[], [], []]
    sim_out: list[list[Any]] = [[], [], []]
    parsers = [Parser() for _ in range(3)]
    try:
        for index, request, blocks in steps:
            parts = tuple(
                ids[int(p[1:])] if isinstance(p, str) and p.startswith("@") else p for p in request
            )
            sim_parts = tuple(
                sim_ids[int(p[1:])] if isinstance(p, str) and p.startswith("@") else p
                for p in request
            )
            clock[0] = _real_time(real_conns[2])
            before = _blocked_clients(real_conns[2])
            real_conns[index].send(command(*parts))
            sims[index].feed(command(*sim_parts))
            if blocks and request[0] != "PING":
                limit = time.monotonic() + 5
                while _blocked_clients(real_conns[2]) <= before:
                    assert time.monotonic() < limit, f"{request!r} did not block"
                    time.sleep(0.002)
            elif not blocks:
                real_out[index].append(real_conns[index].read())
            if request[0] == "BLPOP" and request[-1] != "0":
                time.sleep(0.1)
                clock[0] = _real_time(real_conns[2])
                sim.advance()
            # the simulated replies are there at once; wait (bounded) for the real ones to match
            for i in range(3):
                parsers[i].feed(sims[i].take_output())
                while (reply := parsers[i].get()) is not INCOMPLETE:
                    sim_out[i].append(reply)
            limit = time.monotonic() + 2.0
            while any(len(r) < len(x) for r, x in zip(real_out, sim_out, strict=True)):
                if time.monotonic() > limit:
                    break
                for i, conn in enumerate(real_conns):
                    conn.sock.settimeout(0.01)
                    try:
                        data = conn.sock.recv(65536)
                        conn.parser.feed(data)
                    except TimeoutError:
                        pass
                    finally:
                        conn.sock.settimeout(10)
                    while (reply := conn.parser.get()) is not INCOMPLETE:
                        real_out[i].append(reply)
            assert all(
                len(r) == len(s) and all(same(x, y) for x, y in zip(r, s, strict=True))
                for r, s in zip(real_out, sim_out, strict=True)
            ), f"after {request!r}:\n real {real_out}\n sim  {sim_out}"
        assert real_out[0][:2] == [[b"{q}:wake", b"g1"], b"PONG"]
        assert real_out[1][0] == b"g2"
    finally:
        for conn in real_conns:
            conn.close()
