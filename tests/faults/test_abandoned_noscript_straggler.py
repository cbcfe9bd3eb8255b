"""Simulation seed 50987 on a real server: a straggler of a given-up acquire that answers
NOSCRIPT is not sent the script in full.

One server behind a proxy that delays every chunk LATENCY_MS each way; its script cache is
emptied, then the release script loaded again (as a restarted server's cache fills), so the
acquire's EVALSHA answers NOSCRIPT while the release runs at once. The acquire is interrupted
while its call is out (asyncio: its task is cancelled; blocking: a KeyboardInterrupt from a
signal handler); its cleanup sends the release, which answers "not ours" (the acquire has not
run), and the acquire's NOSCRIPT comes back after that. It used to be answered with the
acquire in full, which then landed after the release: the grant stayed, held by nobody, until
its TTL (or until a background repeat of the release got there). Now the acquire never runs:
the fence register does not move and the lock key never appears. The lock and the semaphore
(whose attempt is the lock's, with its own scripts and slot keys), on both front ends.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

import fencelock
from fencelock._core.keys import lock_keys, slot_keys
from fencelock._scripts import BY_NAME
from fencelock.testing import Server
from fencelock.testing.proxy import Proxy
from fencelock.testing.pytest_plugin import ServerGroupFactory

aio = pytest.importorskip("fencelock.asyncio")

TTL = 30.0  # s: a grant left behind outlives the test
LIMIT = 2  # the semaphore's
LATENCY_MS = 250.0  # each way: the interrupt comes while the acquire is on its way
INTERRUPT_S = 0.05  # after the acquire started
WATCH_S = 8 * LATENCY_MS / 1000.0 + 1.0  # a late re-send would have landed within this
OPTIONS: dict[str, Any] = {"ttl": TTL, "server_timeout": 3.0}


def watched_keys(kind: str, name: str) -> list[str]:
    """The keys a grant of ``kind`` sets: the lock's key, or each of the semaphore's slots."""
    if kind == "lock":
        return [lock_keys(name).lock]
    return [slot_keys(name, slot).lock for slot in range(LIMIT)]


def release_script(primitive: Any) -> str:
    if isinstance(primitive, fencelock.Semaphore | aio.Semaphore):
        return str(primitive._sem.sweep.wiring.release)
    return str(primitive._definition.plan.wiring.release)


class Watcher:
    """Polls the keys from another connection until stopped: whether any ever existed."""

    def __init__(self, server: Server, keys: list[str]) -> None:
        self.client = server.client()
        self.keys = keys
        self.seen: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.seen += [value for value in self.client.mget(self.keys) if value is not None]

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)


@pytest.fixture
def served(fencelock_servers: ServerGroupFactory) -> Iterator[tuple[Server, Proxy]]:
    server = fencelock_servers(1)[0]
    proxy = Proxy(server.host, server.port, name="50987", password=server.password).start()
    try:
        yield server, proxy
    finally:
        proxy.stop()


def empty_cache_but_release(server: Server, release: str) -> None:
    """SCRIPT FLUSH, then the release script loaded again: the acquire answers NOSCRIPT."""
    direct = server.client()
    direct.script_flush()
    assert direct.script_load(BY_NAME[release].source.decode()) == BY_NAME[release].sha


def fence_of(server: Server, name: str) -> Any:
    return server.client().get(lock_keys(name).fence)


def check(
    server: Server, name: str, kind: str, before: Any, watcher: Watcher, started: float
) -> None:
    while time.monotonic() < started + WATCH_S:
        time.sleep(0.05)
    assert not watcher.seen, f"the interrupted acquire's grant landed: {watcher.seen[:3]}"
    assert fence_of(server, name) == before, "the interrupted acquire ran on the server"
    assert not server.client().exists(*watched_keys(kind, name))


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_cancelled_acquire_s_noscript_straggler_does_not_land_async(
    served: tuple[Server, Proxy], kind: str
) -> None:
    server, proxy = served
    name = f"s50987-async-{kind}"

    async def scenario() -> tuple[Any, Any, Watcher, float]:
        primitive: Any = (
            aio.Lock([proxy.url], name, **OPTIONS)
            if kind == "lock"
            else aio.Semaphore([proxy.url], name, LIMIT, **OPTIONS)
        )
        try:
            await (await primitive.acquire(wait=0)).release()  # connection and scripts warm
            empty_cache_but_release(server, release_script(primitive))
            proxy.latency(LATENCY_MS)
            before = fence_of(server, name)
            watcher = Watcher(server, watched_keys(kind, name)).__enter__()
            started = time.monotonic()
            task = asyncio.ensure_future(primitive.acquire(wait=0))
            await asyncio.sleep(INTERRUPT_S)
            assert not task.done()
            task.cancel()
            outcome: Any
            try:
                outcome = await asyncio.wait_for(task, 10.0)
            except BaseException as exc:
                outcome = exc
            # the loop keeps running while the straggler's NOSCRIPT comes back
            await asyncio.sleep(max(0.0, started + WATCH_S - time.monotonic()))
            return outcome, before, watcher, started
        finally:
            await primitive.aclose()

    outcome, before, watcher, started = asyncio.run(scenario())
    try:
        assert isinstance(outcome, asyncio.CancelledError), outcome
        check(server, name, kind, before, watcher, started)
    finally:
        watcher.__exit__()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_an_interrupted_acquire_s_noscript_straggler_does_not_land_sync(
    served: tuple[Server, Proxy], kind: str
) -> None:
    server, proxy = served
    name = f"s50987-sync-{kind}"
    primitive: Any = (
        fencelock.Lock([proxy.url], name, **OPTIONS)
        if kind == "lock"
        else fencelock.Semaphore([proxy.url], name, LIMIT, **OPTIONS)
    )

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        primitive.acquire(wait=0).release()  # connection and scripts warm
        empty_cache_but_release(server, release_script(primitive))
        proxy.latency(LATENCY_MS)
        before = fence_of(server, name)
        with Watcher(server, watched_keys(kind, name)) as watcher:
            started = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, INTERRUPT_S)
            with pytest.raises(KeyboardInterrupt):
                primitive.acquire(wait=0)
            check(server, name, kind, before, watcher, started)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        primitive.close()
