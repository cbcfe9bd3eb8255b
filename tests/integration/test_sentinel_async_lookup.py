"""The asyncio front end asks the sentinels for the master off the event loop: while one
sentinel (first in the URL) is paused and the look-up waits out its timeout, other tasks on
the loop keep running. Before, the look-up ran on blocking sockets on the loop's thread and
froze the loop for the whole wait (``SENTINEL_TIMEOUT_S`` per silent sentinel)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator

import pytest

import fencelock
from fencelock._engine.server import SENTINEL_TIMEOUT_S
from fencelock.testing import ReplicaSet, Server, free_ports

aio = pytest.importorskip("fencelock.asyncio")

#: No operation here may take longer than this (s): a generous bound, never a speed assertion.
BOUND_S = 20.0
#: The loop's largest lag must stay under this (s): half the one sentinel's timeout the
#: look-up waits out (a frozen loop lags the whole timeout, and more).
LAG_MAX_S = SENTINEL_TIMEOUT_S / 2
TICK_S = 0.01


@pytest.fixture(scope="module")
def watched(fencelock_server_binary: str) -> Iterator[ReplicaSet]:
    """A primary, one replica and three sentinels."""
    with ReplicaSet(1, sentinels=3, binary=fencelock_server_binary) as topology:
        yield topology


@pytest.fixture
def first_paused(watched: ReplicaSet) -> Iterator[ReplicaSet]:
    """The first sentinel paused (SIGSTOP: it accepts connections, answers nothing)."""
    watched.sentinels[0].pause()
    try:
        yield watched
    finally:
        watched.sentinels[0].resume()


def _holds(node: Server, key: str) -> bool:
    conn = node.client()
    try:
        return bool(conn.exists(f"fencelock:{{{key}}}"))
    finally:
        conn.close()


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    """Sleep TICK_S again and again, recording how late each wake-up was (s)."""
    deadline = time.monotonic() + BOUND_S
    while not stop.is_set() and time.monotonic() < deadline:
        before = time.monotonic()
        await asyncio.sleep(TICK_S)
        lags.append(time.monotonic() - before - TICK_S)


async def _while_ticking(work: Awaitable[None]) -> tuple[list[float], float]:
    """Run the coroutine ``work`` while a ticker records the loop's lag: (lags, seconds)."""
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lags, stop))
    await asyncio.sleep(5 * TICK_S)  # ticking before the work starts
    started = time.monotonic()
    try:
        await work
    finally:
        took = time.monotonic() - started
        stop.set()
        await asyncio.wait_for(ticker, BOUND_S)
    return lags, took


def test_an_asyncio_acquire_looks_the_master_up_without_freezing_the_loop(
    first_paused: ReplicaSet, key: str
) -> None:
    topology = first_paused
    url = topology.sentinel_url  # every sentinel in order: the paused one first
    held: list[bool] = []

    async def acquire_and_release() -> None:
        lock = aio.Lock(url, key, ttl=10)
        async with await lock.acquire(wait=BOUND_S) as lease:
            held.append(await asyncio.to_thread(_holds, topology.first_primary, key))
            await lease.extend()

    async def main() -> tuple[list[float], float]:
        return await _while_ticking(acquire_and_release())

    lags, took = asyncio.run(asyncio.wait_for(main(), 60))
    assert held == [True]  # it landed on the primary (no failover in this module)
    assert not _holds(topology.first_primary, key)
    # the look-up did wait out the paused sentinel, and the loop ticked all along
    assert took >= SENTINEL_TIMEOUT_S * 0.9
    assert len(lags) >= 5
    assert max(lags) < LAG_MAX_S, f"the loop froze {max(lags):.3f} s (ticks: {len(lags)})"


def test_no_sentinel_naming_the_master_is_unavailable_without_freezing_the_loop(
    first_paused: ReplicaSet, key: str
) -> None:
    topology = first_paused
    (nobody,) = free_ports(1)
    paused = topology.sentinels[0]
    url = f"redis+sentinel://{paused.host}:{paused.port},127.0.0.1:{nobody}/{topology.service}"
    errors: list[BaseException] = []

    async def acquire() -> None:
        try:
            await aio.Lock(url, key, ttl=5).acquire(wait=0)
        except fencelock.Unavailable as exc:
            errors.append(exc)

    async def main() -> tuple[list[float], float]:
        return await _while_ticking(acquire())

    lags, took = asyncio.run(asyncio.wait_for(main(), 60))
    assert len(errors) == 1
    assert "no sentinel named the master" in str(errors[0])
    assert took < BOUND_S
    assert took >= SENTINEL_TIMEOUT_S * 0.9  # the paused sentinel's timeout was waited out
    assert max(lags) < LAG_MAX_S, f"the loop froze {max(lags):.3f} s (ticks: {len(lags)})"
