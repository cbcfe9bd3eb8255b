"""leader() and observe() never guess (issue 21, item 19), on real servers, both front ends.

Three servers; the leader's client cannot reach server 2, so its term is held on {0, 1}.
With server 1 paused (SIGSTOP) a reader hears server 0 (the leader's token) and server 2
(free): a bare majority that misses the leader's. "Nobody leads" would be wrong (the term is
valid); so would the last value standing while two servers are paused. Both must raise
Unavailable ("leader unknown").
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import pytest

import fencelock
import fencelock.asyncio as flasync
from fencelock import Leader, Unavailable
from fencelock.testing import refused_url

BOUND = 10.0  # liveness bound (s) of every wait below, never a speed assertion
TTL = 20.0  # the leader's term outlives the test's reads by far


def _observe(front: str, urls: list[str], key: str, out: queue.Queue[Any]) -> None:
    """Put every value observed, then the exception that ended the observation (or None)."""

    async def async_main() -> None:
        election = flasync.Client(urls, ttl=TTL, server_timeout=0.2).election(key)
        async for leader in election.observe(timeout=BOUND):
            out.put(leader)

    try:
        if front == "sync":
            election = fencelock.Client(urls, ttl=TTL, server_timeout=0.2).election(key)
            for leader in election.observe(timeout=BOUND):
                out.put(leader)
        else:
            asyncio.run(async_main())
    except Exception as exc:
        out.put(exc)
    else:
        out.put(None)


def _leader(front: str, urls: list[str], key: str) -> Leader | None:
    if front == "sync":
        return fencelock.Client(urls, ttl=TTL, server_timeout=0.2).election(key).leader()

    async def read() -> Leader | None:
        return await flasync.Client(urls, ttl=TTL, server_timeout=0.2).election(key).leader()

    return asyncio.run(read())


def _next(out: queue.Queue[Any]) -> Any:
    return out.get(timeout=BOUND)


@pytest.mark.parametrize("front", ["sync", "async"])
def test_a_bare_majority_that_misses_the_leaders_says_unknown(
    fencelock_servers: Any, front: str
) -> None:
    group = fencelock_servers(3)
    s0, s1, _ = group.servers
    key = f"unknown-{front}-{time.monotonic_ns()}"
    leader_client = fencelock.Client([s0.url, s1.url, refused_url()], ttl=TTL)
    out: queue.Queue[Any] = queue.Queue()
    with leader_client.election(key, name="the-leader").campaign(wait=BOUND) as term:
        assert _leader(front, group.urls, key) == Leader(
            "the-leader", term.fence, pytest.approx(TTL, abs=2.0)
        )
        observer = threading.Thread(target=_observe, args=(front, group.urls, key, out))
        observer.start()
        first = _next(out)
        assert isinstance(first, Leader) and first.name == "the-leader"
        s1.pause()
        try:
            with pytest.raises(Unavailable, match="leader unknown"):
                _leader(front, group.urls, key)
            ended = _next(out)  # woken at the latest by its 2 s poll
            assert isinstance(ended, Unavailable), f"observe() said {ended!r}"
            assert term.valid  # the leader still led all along
        finally:
            s1.resume()
        observer.join(BOUND)
        assert not observer.is_alive()
    assert _leader(front, group.urls, key) is None  # every server answers: a sure "nobody"


@pytest.mark.parametrize("front", ["sync", "async"])
def test_observe_does_not_go_silent_while_a_majority_cannot_be_read(
    fencelock_servers: Any, front: str
) -> None:
    group = fencelock_servers(3)
    _, s1, s2 = group.servers
    key = f"silent-{front}-{time.monotonic_ns()}"
    out: queue.Queue[Any] = queue.Queue()
    observer = threading.Thread(target=_observe, args=(front, group.urls, key, out))
    observer.start()
    assert _next(out) is None  # nobody leads yet
    s1.pause()
    s2.pause()
    try:
        ended = _next(out)  # at the latest at its next poll (2 s)
        assert isinstance(ended, Unavailable), f"observe() said {ended!r}"
    finally:
        s1.resume()
        s2.resume()
    observer.join(BOUND)
    assert not observer.is_alive()
