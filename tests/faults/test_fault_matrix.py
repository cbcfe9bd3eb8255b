"""A sick minority costs nobody time, and a lock lands on every live server (F13, F19-F21).

The matrix: both front ends (sync ``Lock``; ``fencelock.asyncio.Lock`` through the blocking facade
of ``tests/integration/api.py``) x N in {3, 5} x the way the minority (N // 2 servers) is sick:

- ``hung``: SIGSTOP (``Server.pause``) after a first warm acquire, so connections to it exist;
- ``hung-cold``: fresh servers paused before this process ever connected to them (F20);
- ``black-holed``: a :class:`~fencelock.testing.BlackHole` address (connects never complete, F19);
- ``refusing``: :func:`~fencelock.testing.refused_url` (connects are refused at once);
- ``slow``: every round trip delayed by 3 x T through :func:`~fencelock.testing.delayed_proxy`;
- ``restarted-empty``: ``restart(wipe=True)`` (no keys, empty script cache) just before the calls;
- ``script-flush``: ``SCRIPT FLUSH`` on every server before the first call and again before
  every acquire (F21);
- ``fresh``: a group of servers this process never talked to (empty script caches, F21).

Each call (acquire(wait=0), try_acquire on a free lock, try_acquire on a lock held by another Lock
object, extend, release), 5 times in a row, either with a NEW Lock object per call (built per key,
as web handlers do) or with one reused Lock, must return within about the majority's answer time
plus the server timeout T: asserted as a generous bound, ``T + 0.15 s`` for every call after the
first of a test and ``2 T + 0.3 s`` for the first (it may include connecting). After every
successful acquire the lock key holds our token on every live server, read directly (at once, or
within T for a straggler's write still on its way).

With a majority hung or black-holed, every failed round (``Unavailable``) ends within
``2 T + 0.3 s``.

Server groups are shared per module (one per N); every fault is undone in ``finally`` (paused
servers resumed, proxies and black holes closed), and keys are unique per test.
"""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import redis
from integration.api import (  # the shared facade of tests/integration/api.py
    AsyncLockFacade,
    LockFactory,
    Runner,
    asyncio_module,
    front,  # noqa: F401  (a fixture)
)

import fencelock
from fencelock import Unavailable
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock.testing import BlackHole, Server, ServerGroup, delayed_proxy, refused_urls

T = 0.25  # server_timeout of every Lock here (seconds)
TTL = 5.0
HOLDER_TTL = 60.0  # the other Lock object holding the "held" key
CALLS = 5  # consecutive calls of each kind
# the same with a majority down (each call fails after ~2 server timeouts; 2 rounds of the 4
# kinds, not 3: CI's time)
MAJORITY_CALLS = 2
FIRST_CALL_BOUND_S = 2 * T + 0.3  # the first call of a test may include connecting
CALL_BOUND_S = 1.0 * T + 0.15  # every later call: the majority's answer time + T, generously
# a failed round: the round's T, a cleanup grace for its stragglers of at most T / 2 (issue 21
# item 8: the grace replaced a wait to the round's deadline), the release round's T at most
FAILED_ROUND_BOUND_S = 2.5 * T + 0.3
SLOW_DELAY_S = 3 * T

MINORITY_FAULTS = [
    "hung",
    "hung-cold",
    "black-holed",
    "refusing",
    "slow",
    "restarted-empty",
    "script-flush",
    "fresh",
]
R = TypeVar("R")


# -- front ends -------------------------------------------------------------------------------


class CancellingRunner(Runner):
    """The facade's event loop thread; at teardown it cancels what is left (e.g. a late release
    still retrying a sick server until the TTL ends) instead of waiting for it."""

    def close(self) -> None:
        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)

        with contextlib.suppress(Exception):
            self.run(cancel_the_rest(), timeout=10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        self.loop.close()


@pytest.fixture
def make_lock(front: str) -> Iterator[LockFactory]:
    """``make_lock(servers, key, **kw)``: a sync Lock, or the blocking facade of an async one
    (as ``tests/integration/api.py``'s fixture, with a runner that does not wait out the TTL)."""
    made: list[Any] = []
    runner = CancellingRunner() if front == "async" else None

    def make(servers: Any, key: str, **kwargs: Any) -> Any:
        if runner is None:
            lock: Any = fencelock.Lock(servers, key, **kwargs)
        else:
            module = asyncio_module()
            assert module is not None

            async def build() -> Any:
                return module.Lock(servers, key, **kwargs)

            lock = AsyncLockFacade(runner, runner.run(build()))
        made.append(lock)
        return lock

    try:
        yield make
    finally:
        for lock in made:
            with contextlib.suppress(Exception):
                lock.close()
        if runner is not None:
            runner.close()


# -- servers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def groups(fencelock_server_binary: str) -> Iterator[dict[int, ServerGroup]]:
    """One started group of 3 and one of 5 servers for the module (faults are undone per test)."""
    made = {n: ServerGroup(n, binary=fencelock_server_binary).start() for n in (3, 5)}
    try:
        yield made
    finally:
        for group in made.values():
            group.stop()


@dataclass
class Setup:
    """The URLs a Lock gets, and the servers that must hold the key after an acquire."""

    urls: list[str]
    live: list[Server]
    warm: bool = False  # connect to every server of the group before the fault is switched on
    switch_on: Callable[[], None] | None = None
    before_each_acquire: Callable[[], None] | None = None  # untimed, e.g. SCRIPT FLUSH again


@contextlib.contextmanager
def sick_minority(fault: str, group: ServerGroup, binary: str) -> Iterator[Setup]:
    """``group``'s servers with its last N // 2 made sick as ``fault`` says; undone on exit."""
    n = len(group)
    k = n // 2
    healthy, rest = group.servers[: n - k], group.servers[n - k :]
    healthy_urls = [s.url for s in healthy]
    undo: list[Callable[[], None]] = []
    try:
        setup = _make_sick(fault, group, binary, healthy, healthy_urls, rest, undo)
        yield setup
    finally:
        errors = []
        for action in reversed(undo):
            try:
                action()
            except Exception as exc:  # undo everything, then report
                errors.append(exc)
        if errors:
            raise errors[0]


def _make_sick(
    fault: str,
    group: ServerGroup,
    binary: str,
    healthy: list[Server],
    healthy_urls: list[str],
    rest: list[Server],
    undo: list[Callable[[], None]],
) -> Setup:
    if fault == "hung":

        def pause() -> None:
            for server in rest:
                undo.append(server.resume)
                server.pause()

        return Setup(group.urls, healthy, warm=True, switch_on=pause)
    if fault == "hung-cold":
        cold = []
        for _ in rest:
            server = Server(binary)
            undo.append(server.stop)  # stop() sends SIGCONT too
            cold.append(server.start())
            server.pause()  # before this process's fencelock ever connected to it
        return Setup(healthy_urls + [s.url for s in cold], healthy)
    if fault == "black-holed":
        holes = []
        for _ in rest:
            hole = BlackHole()
            undo.append(hole.close)
            holes.append(hole)
        return Setup(healthy_urls + [h.url for h in holes], healthy)
    if fault == "refusing":
        return Setup(healthy_urls + refused_urls(len(rest)), healthy)
    if fault == "slow":
        proxies = []
        for server in rest:
            proxy = delayed_proxy(server, SLOW_DELAY_S)
            undo.append(proxy.stop)
            proxies.append(proxy)
        # the slow servers are live, but our key reaches them after the call returned
        return Setup(healthy_urls + [p.url for p in proxies], healthy)
    if fault == "restarted-empty":

        def restart() -> None:
            for server in rest:
                server.restart(wipe=True)

        # The restarted servers are live, but a lock may rightly refuse their vote while their
        # uptime is below the TTL (delayed restart, DESIGN v0.2): the key is checked on the
        # servers that were not restarted; "fresh" and "script-flush" check every server.
        return Setup(group.urls, healthy, warm=True, switch_on=restart)
    if fault == "script-flush":

        def flush() -> None:
            for server in group:
                with server.client() as admin:
                    admin.script_flush()

        # again before every acquire: each one starts with empty script caches everywhere
        return Setup(
            group.urls, group.servers, warm=True, switch_on=flush, before_each_acquire=flush
        )
    if fault == "fresh":
        fresh = ServerGroup(len(group), binary=binary)
        undo.append(fresh.stop)
        fresh.start()
        return Setup(fresh.urls, fresh.servers)
    raise AssertionError(f"unknown fault {fault!r}")


# -- timing and checks ------------------------------------------------------------------------


class Clock:
    """Times every call; the first of a test gets the connecting allowance."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.log: list[tuple[str, float]] = []

    def call(self, what: str, fn: Callable[[], R]) -> R:
        started = time.monotonic()
        try:
            return fn()
        finally:
            elapsed = time.monotonic() - started
            self.log.append((what, elapsed))
            # a call over even the first call's bound fails at once (bounded test time)
            assert elapsed < FIRST_CALL_BOUND_S, self.report(f"{what} took {elapsed:.3f} s")

    def report(self, headline: str) -> str:
        rows = ", ".join(f"{what} {s * 1000:.0f}" for what, s in self.log)
        return f"{self.label}: {headline}; calls (ms): {rows}"

    def check(self) -> None:
        late = [(w, s) for w, s in self.log[1:] if s >= CALL_BOUND_S]
        first = self.log[0][1] if self.log else 0.0
        assert first < FIRST_CALL_BOUND_S, self.report(f"first call {first:.3f} s")
        assert not late, self.report(
            f"{len(late)}/{len(self.log) - 1} calls after the first took >= {CALL_BOUND_S:.2f} s"
        )


def assert_held_everywhere(live: list[Server], name: str, token: str, clock: Clock) -> None:
    """Our token is the lock key's value on every server of ``live`` (read directly), at once or
    within T: a straggler's write may still be on its way when the call returns."""
    key = lock_keys(name).lock
    deadline = time.monotonic() + T
    pending = list(live)
    missing: list[str] = []
    while True:
        missing = []
        still = []
        for server in pending:
            with server.client(socket_timeout=2.0) as direct:
                value = direct.get(key)
            if lock_token(value) != token.encode():  # token, 255, holder
                missing.append(f"{server.port}: {value!r}")
                still.append(server)
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    assert not missing, clock.report(
        f"{name!r} not held with our token on {len(missing)}/{len(live)} live servers "
        f"({'; '.join(missing)})"
    )


def unique(label: str) -> str:
    return f"fm:{label}:{uuid.uuid4().hex[:10]}"


# -- a sick minority ----------------------------------------------------------------------------


@pytest.mark.parametrize("per_key", [True, False], ids=["new-lock-per-call", "reused-lock"])
@pytest.mark.parametrize("fault", MINORITY_FAULTS)
@pytest.mark.parametrize("n", [3, 5])
def test_a_sick_minority_costs_no_call_more_than_the_server_timeout_and_the_lock_lands_on_every_live_server(  # noqa: E501
    groups: dict[int, ServerGroup],
    fencelock_server_binary: str,
    make_lock: LockFactory,
    front: str,
    n: int,
    fault: str,
    per_key: bool,
) -> None:
    group = groups[n]
    label = f"{front} N={n} {fault} {'new Lock per call' if per_key else 'reused Lock'}"
    clock = Clock(label)
    with sick_minority(fault, group, fencelock_server_binary) as setup:
        if setup.warm:  # connections to every server exist before the fault
            warm = make_lock(group.urls, unique("warm"), ttl=TTL, server_timeout=T)
            warm.acquire(wait=0).release()
        if setup.switch_on is not None:
            setup.switch_on()

        def new(name: str) -> Any:
            return make_lock(setup.urls, name, ttl=TTL, server_timeout=T)

        held_name = unique("held")
        # the holder's lease outlives the test even when every call is slow
        holder = make_lock(setup.urls, held_name, ttl=HOLDER_TTL, server_timeout=T)
        held = clock.call("holder acquire", lambda: holder.acquire(wait=0))
        assert_held_everywhere(setup.live, held_name, held.token, clock)

        base = unique("free")
        reused = new(base)
        contender = new(held_name)
        for i in range(CALLS):
            lock = new(f"{base}:{i}") if per_key else reused
            if setup.before_each_acquire is not None:
                setup.before_each_acquire()
            lease = clock.call("acquire", lambda: lock.acquire(wait=0))  # noqa: B023
            assert_held_everywhere(setup.live, lock.key, lease.token, clock)
            clock.call("extend", lambda: lease.extend(TTL))  # noqa: B023
            clock.call("release", lease.release)

            lock = new(f"{base}:try:{i}") if per_key else reused
            if setup.before_each_acquire is not None:
                setup.before_each_acquire()
            lease = clock.call("try_acquire", lock.try_acquire)
            assert lease is not None, clock.report("try_acquire on a free lock returned None")
            assert_held_everywhere(setup.live, lock.key, lease.token, clock)
            clock.call("release", lease.release)

            other = new(held_name) if per_key else contender
            refused = clock.call("try_acquire held", other.try_acquire)
            assert refused is None, clock.report("try_acquire on a held lock granted a lease")
            clock.check()  # fail after the first round of calls that had a late one
        clock.call("holder release", held.release)
    clock.check()


# -- a sick majority ------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["hung", "black-holed"])
@pytest.mark.parametrize("n", [3, 5])
def test_with_a_majority_down_a_failed_round_ends_within_twice_the_server_timeout(
    groups: dict[int, ServerGroup], make_lock: LockFactory, front: str, n: int, fault: str
) -> None:
    group = groups[n]
    k = n // 2 + 1
    label = f"{front} N={n} majority {fault}"
    log: list[tuple[str, float]] = []
    undo: list[Callable[[], None]] = []
    try:
        if fault == "hung":
            urls = group.urls
            warm = make_lock(urls, unique("warm"), ttl=TTL, server_timeout=T)
            warm.acquire(wait=0).release()
            for server in group.servers[:k]:
                undo.append(server.resume)
                server.pause()
        else:
            holes = [BlackHole() for _ in range(k)]
            undo += [h.close for h in holes]
            urls = [h.url for h in holes] + group.urls[k:]
        base = unique("down")
        reused = make_lock(urls, base, ttl=TTL, server_timeout=T)
        for i in range(MAJORITY_CALLS):
            for what in ("acquire", "try_acquire"):
                for per_key in (True, False):
                    lock = (
                        make_lock(urls, f"{base}:{what}:{i}", ttl=TTL, server_timeout=T)
                        if per_key
                        else reused
                    )
                    started = time.monotonic()
                    with pytest.raises(Unavailable):
                        if what == "acquire":
                            lock.acquire(wait=0)
                        else:
                            lock.try_acquire()
                    elapsed = time.monotonic() - started
                    log.append((f"{what}{'(new)' if per_key else ''}", elapsed))
            # fail after the first round of calls that had a slow one (bounded test time)
            assert all(s < FAILED_ROUND_BOUND_S for _, s in log), _majority_report(label, log)
    finally:
        for action in reversed(undo):
            action()
    assert len(log) == 4 * MAJORITY_CALLS


def _majority_report(label: str, log: list[tuple[str, float]]) -> str:
    slow = sum(1 for _, s in log if s >= FAILED_ROUND_BOUND_S)
    rows = ", ".join(f"{w} {s * 1000:.0f}" for w, s in log)
    return (
        f"{label}: {slow}/{len(log)} failed rounds took >= {FAILED_ROUND_BOUND_S:.2f} s; "
        f"calls (ms): {rows}"
    )


def test_the_direct_reads_see_a_key_written_through_a_plain_client(
    groups: dict[int, ServerGroup],
) -> None:
    """The key check above can fail: a token that is not there is reported."""
    server = groups[3][0]
    name = unique("canary")
    clock = Clock("canary")
    with server.client() as direct:
        direct.set(lock_keys(name).lock, "someone-else", px=5000)
    with pytest.raises(AssertionError, match="not held with our token on 1/1"):
        assert_held_everywhere([server], name, "ours", clock)
    assert_held_everywhere([server], name, "someone-else", clock)
    with contextlib.suppress(redis.RedisError), server.client() as direct:
        direct.delete(lock_keys(name).lock)
