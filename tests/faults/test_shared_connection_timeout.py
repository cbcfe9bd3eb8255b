"""F27: one task's round times out on the connection every task of the loop pipelines on.

50 tasks of one loop, a Lock (or a Semaphore) each, start their acquires while the server is
SIGSTOPped, spread over one server timeout; the server is resumed just after the first
task's deadline. The tasks whose deadline passed get Unavailable (the outcome unknown), the
others their answer. Nothing may run twice: a call another task's timeout cut off is never
sent again, so no key is held by nobody (a "held by ourselves" NotAcquired left uncleaned),
no release reports LockLost, and no second semaphore slot is taken.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from fencelock import LockLost, NotAcquired, Unavailable
from fencelock.testing import Server

aio = pytest.importorskip("fencelock.asyncio")

TIMEOUT = 0.4  # the server timeout
TTL = 20.0  # a ghost key would outlive the test
TASKS = 50


async def run_all(server: Server, start: object) -> list[object]:
    """Pause the server, start TASKS tasks (``start(i)``) spread over one server timeout,
    resume it a little after the first task's deadline."""
    loop = asyncio.get_running_loop()
    server.pause()
    try:
        tasks = []
        for i in range(TASKS):
            tasks.append(loop.create_task(start(i)))  # type: ignore[operator]
            await asyncio.sleep(TIMEOUT / TASKS)
        await asyncio.sleep(0.1)
    finally:
        server.resume()
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def held_keys(server: Server, pattern: str) -> list[bytes]:
    """Keys matching ``pattern`` other than the fence counters and a semaphore's kept limit
    (those stay by design: the limit as long as a permit granted may be valid)."""
    client = server.client()
    try:
        return [k for k in client.keys(pattern) if not k.endswith((b":fence", b":limit"))]
    finally:
        client.close()


def wait_for(check: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(check())  # type: ignore[operator]


def test_a_timeout_on_the_shared_connection_runs_no_acquire_twice(fencelock_server: Server) -> None:
    server = fencelock_server
    url = server.url

    async def scenario() -> list[object]:
        async def one(i: int) -> object:
            lock = aio.Lock(url, f"f27-{i}", ttl=TTL, server_timeout=TIMEOUT)
            return await lock.acquire(wait=0)

        # the connection is established first (the common case: a process already at work)
        warm = await aio.Lock(url, "f27-warm", ttl=TTL, server_timeout=TIMEOUT).acquire()
        await warm.release()
        outcomes = await run_all(server, one)
        for outcome in outcomes:
            if not isinstance(outcome, BaseException):
                await outcome.release()  # type: ignore[attr-defined]  # LockLost is a failure
        return outcomes

    outcomes = asyncio.run(scenario())
    kinds = {type(o).__name__ for o in outcomes}
    assert not any(isinstance(o, LockLost) for o in outcomes), outcomes
    assert not any(isinstance(o, NotAcquired) for o in outcomes), outcomes  # nobody else holds
    assert all(isinstance(o, Unavailable) or not isinstance(o, BaseException) for o in outcomes)
    assert any(isinstance(o, Unavailable) for o in outcomes), kinds  # the fault happened
    assert held_keys(server, "*{f27-warm}*") == []  # the pattern matches the keys used
    assert server.client().exists("fencelock:{f27-warm}:fence")
    # an unknown outcome is cleaned up by token (repeated once the server answers)
    pattern = "*{f27-[0-9]*}*"
    assert wait_for(lambda: not held_keys(server, pattern), 10 * TIMEOUT), held_keys(
        server, pattern
    )


def test_a_timeout_on_the_shared_connection_takes_no_second_semaphore_slot(
    fencelock_server: Server,
) -> None:
    server = fencelock_server
    url = server.url

    async def scenario() -> list[object]:
        async def one(i: int) -> object:
            sem = aio.Semaphore(url, f"f27-sem-{i}", limit=2, ttl=TTL, server_timeout=TIMEOUT)
            return await sem.acquire(wait=0)

        warm = aio.Lock(url, "f27-warm", ttl=TTL, server_timeout=TIMEOUT)
        await (await warm.acquire()).release()
        outcomes = await run_all(server, one)
        for outcome in outcomes:
            if not isinstance(outcome, BaseException):
                await outcome.release()  # type: ignore[attr-defined]
        return outcomes

    outcomes = asyncio.run(scenario())
    assert not any(isinstance(o, LockLost | NotAcquired) for o in outcomes), outcomes
    assert any(isinstance(o, Unavailable) for o in outcomes)
    # every permit released or cleaned up: no slot taken twice, none left behind
    pattern = "*{f27-sem-*}*"
    assert wait_for(lambda: not held_keys(server, pattern), 10 * TIMEOUT), held_keys(
        server, pattern
    )
