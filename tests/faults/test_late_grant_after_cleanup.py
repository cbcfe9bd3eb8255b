"""Simulation seed 205015 on real servers: a given-up attempt's acquire that reaches a server
only after the cleanup's release and its repeats still grants there; the key must not stay
until its TTL.

Three servers, the first behind a proxy. Another holder has the key on the second, so the
attempt cannot win and waits for the first, whose acquire the proxy delays DELAY_MS: the round
times out (``server_timeout``), the attempt fails, and its cleanup releases by token, on the
first server from the background once it answers again (its probe and the repeats go on new
connections). Once the proxy has read the acquire (its ``read_up`` count), it forwards at
once again; only the acquire, read while the delay held, is still late, and it lands on the first
server after the release and both its repeats. The key used to stay there, held by nobody,
for the whole TTL (the round's call was dropped at its deadline, its connection closed, its
reply never read). Now the reply is heard and the token released there: the key goes within
GONE_S, far below the TTL. The lock and the semaphore, both front ends; each test checks the
late grant really landed, so none passes by a grant that never came.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock import FencelockError
from fencelock._core.keys import lock_keys, slot_keys
from fencelock.testing import Server
from fencelock.testing.proxy import Proxy
from fencelock.testing.pytest_plugin import ServerGroupFactory

aio = pytest.importorskip("fencelock.asyncio")

TTL = 30.0  # s: a grant left behind outlives the test
SERVER_TIMEOUT = 0.5  # s: the round's budget; the delayed server's call times out
DELAY_MS = 1200.0  # the first server's acquire lands this late (past the cleanup's repeats)
GONE_S = 2.0  # s after the late grant landed: the key is gone by then (the TTL is 30 s)
BOUND = 10.0  # liveness bound of every wait (s), never a speed assertion
OPTIONS: dict[str, Any] = {"ttl": TTL, "server_timeout": SERVER_TIMEOUT}


def key_of(kind: str, name: str) -> str:
    """The key a grant of ``kind`` sets (the semaphore's limit is 1: its one slot)."""
    return lock_keys(name).lock if kind == "lock" else slot_keys(name, 0).lock


class Late:
    """From other threads: once the proxy has read the acquire (under the delay), it forwards
    at once again; the delayed server is watched (``landed``: when its fence register moved, the
    acquire having run there; ``gone``: when it held no key after that)."""

    def __init__(self, proxy: Proxy, first: Server, third: Server, key: str, fence: str) -> None:
        self.proxy = proxy
        self.first = first.client()
        self.third = third.client()
        self.key = key
        self.fence = fence
        self.before: bytes | None = None
        self.read = 0
        self.switched = threading.Event()
        self.landed: float | None = None
        self.gone: float | None = None
        self.value: bytes | None = None
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._switch, daemon=True),
            threading.Thread(target=self._watch, daemon=True),
        ]

    def _switch(self) -> None:
        end = time.monotonic() + BOUND
        read = self.read
        while time.monotonic() < end and not self._stop.is_set():
            if self.proxy.stats.read_up > read:  # the acquire, read while the delay held
                self.proxy.pass_through()
                self.switched.set()
                return
            time.sleep(0.001)

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            fence, value = self.first.mget([self.fence, self.key])
            now = time.monotonic()
            if fence != self.before and self.landed is None:
                self.landed, self.value = now, value
            if value is None and self.landed is not None and self.gone is None:
                self.gone = now

    def __enter__(self) -> Late:
        self.before = self.first.get(self.fence)  # (once the warm-up is done)
        self.read = self.proxy.stats.read_up
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5.0)

    def settled(self) -> bool:
        """The late grant landed and went, or GONE_S passed since it landed (or BOUND)."""
        if self.gone is not None:
            return True
        return self.landed is not None and time.monotonic() > self.landed + GONE_S

    def check(self, started: float) -> None:
        assert self.switched.is_set(), "the round's grant never showed on the third server"
        assert self.landed is not None, "the delayed acquire never ran (nothing tested)"
        assert self.landed > started + SERVER_TIMEOUT, "it landed before the round timed out"
        assert self.value != b"foreign"
        assert self.gone is not None, (
            f"the given-up attempt's late grant stays on the delayed server "
            f"(pttl {self.first.pttl(self.key)} ms)"
        )
        assert self.gone - self.landed < GONE_S
        assert self.first.get(self.key) is None


@pytest.fixture
def served(fencelock_servers: ServerGroupFactory) -> Iterator[tuple[list[Server], Proxy]]:
    servers = fencelock_servers(3)
    first = servers[0]
    # drain: a connection the client closes still delivers what it sent (as TCP does)
    proxy = Proxy(
        first.host, first.port, name="205015", password=first.password, drain=True
    ).start()
    try:
        yield servers, proxy
    finally:
        proxy.stop()


def arrange(servers: list[Server], proxy: Proxy, key: str) -> None:
    """Another holder on the second server; the first's traffic delayed from now on."""
    assert servers[1].client().set(key, "foreign", px=int(TTL * 1000))
    proxy.latency(DELAY_MS)


def primitive_of(module: Any, kind: str, urls: list[str], name: str) -> Any:
    if kind == "lock":
        return module.Lock(urls, name, **OPTIONS)
    return module.Semaphore(urls, name, 1, **OPTIONS)


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_given_up_attempts_late_grant_is_released_sync(
    served: tuple[list[Server], Proxy], kind: str
) -> None:
    servers, proxy = served
    name = f"s205015-sync-{kind}"
    urls = [proxy.url, servers[1].url, servers[2].url]
    primitive = primitive_of(fencelock, kind, urls, name)
    try:
        primitive.acquire(wait=0).release()  # connections and scripts warm
        key = key_of(kind, name)
        arrange(servers, proxy, key)
        late = Late(proxy, servers[0], servers[2], key, lock_keys(name).fence)
        with late:
            started = time.monotonic()
            with pytest.raises(FencelockError):
                primitive.acquire(wait=0)
            end = time.monotonic() + BOUND
            while not late.settled() and time.monotonic() < end:
                time.sleep(0.02)
            late.check(started)
    finally:
        primitive.close()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_given_up_attempts_late_grant_is_released_async(
    served: tuple[list[Server], Proxy], kind: str
) -> None:
    servers, proxy = served
    name = f"s205015-async-{kind}"
    urls = [proxy.url, servers[1].url, servers[2].url]
    key = key_of(kind, name)

    async def scenario(late: Late) -> tuple[BaseException | None, float]:
        primitive = primitive_of(aio, kind, urls, name)
        try:
            await (await primitive.acquire(wait=0)).release()  # connections and scripts warm
            arrange(servers, proxy, key)
            late.__enter__()
            started = time.monotonic()
            outcome: BaseException | None = None
            try:
                await primitive.acquire(wait=0)
            except FencelockError as exc:
                outcome = exc
            # the loop keeps running: the late reply is read here
            end = time.monotonic() + BOUND
            while not late.settled() and time.monotonic() < end:
                await asyncio.sleep(0.02)
            return outcome, started
        finally:
            await primitive.aclose()

    late = Late(proxy, servers[0], servers[2], key, lock_keys(name).fence)
    try:
        outcome, started = asyncio.run(scenario(late))
        assert isinstance(outcome, FencelockError), outcome
        late.check(started)
    finally:
        late.__exit__()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_late_grant_after_the_jobs_loop_ended_is_released(
    served: tuple[list[Server], Proxy], kind: str
) -> None:
    """``asyncio.run()`` per job: the job ends as soon as its attempt failed, and its loop with
    it, before the delayed acquire landed; nobody is left to hear its reply (simulation seed
    205015 after the fix above: the job's loop was gone). The loop's shutdown hands the
    release of what the call may have taken to the background thread, after the hearing
    window: the late grant goes all the same."""
    servers, proxy = served
    name = f"s205015-run-{kind}"
    urls = [proxy.url, servers[1].url, servers[2].url]
    key = key_of(kind, name)

    async def warm() -> None:
        primitive = primitive_of(aio, kind, urls, name)
        await (await primitive.acquire(wait=0)).release()

    async def job() -> BaseException | None:
        primitive = primitive_of(aio, kind, urls, name)
        try:
            await primitive.acquire(wait=0)
        except FencelockError as exc:
            return exc  # the job ends here: asyncio.run() closes its loop
        return None

    asyncio.run(warm())  # connections and scripts warm (on a loop of its own, as jobs are)
    arrange(servers, proxy, key)
    late = Late(proxy, servers[0], servers[2], key, lock_keys(name).fence)
    with late:
        started = time.monotonic()
        outcome = asyncio.run(job())
        ended = time.monotonic()
        assert isinstance(outcome, FencelockError), outcome
        end = time.monotonic() + BOUND
        while not late.settled() and time.monotonic() < end:
            time.sleep(0.02)
        assert late.landed is not None and late.landed > ended, "it landed before the loop ended"
        late.check(started)
