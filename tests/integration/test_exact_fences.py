"""Fences are exact integers end to end, past 2^53 and up to 2^63 - 1 (issue 23, finding 1).

A fence register set by a plain ``SET`` to 2^53 + 1 (one write by anyone with access, or a long
life) made every later grant return the same fence: the scripts computed ``F + 1`` in Lua
floating point. Here every primitive that issues fences (lock, fair lock, semaphore, read-write
lock, election), on both front ends and over 1 and 3 servers, grants several times from such a
register: each fence must be exactly the one before plus one. A register near 2^63 - 1 grants
up to 2^63 - 1 exactly, then refuses with an error that says why, leaving nothing held.
"""

# ruff: noqa: F811  (fixtures imported from the api modules, then named as test parameters)

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
from api import front  # noqa: F401
from family_api import Make, make  # noqa: F401

import fencelock
import fencelock.asyncio as fasync
from fencelock import Unavailable
from fencelock._core.keys import lock_keys, rw_keys, slot_keys
from fencelock._core.plan import lock_wiring, release_keys
from fencelock._scripts import BY_NAME

TOPOLOGIES = [pytest.param(1, id="n1"), pytest.param(3, id="n3")]
PRIMITIVES = ["lock", "fair", "semaphore", "rw_read", "rw_write", "election"]
FENCE_MAX = 2**63 - 1
PAST_2_53 = 2**53 + 1
GRANTS = 4


def _set_registers(servers: list[Any], name: str, value: int) -> None:
    for server in servers:
        server.client().set(lock_keys(name).fence, str(value))


def _registers(servers: list[Any], name: str) -> list[bytes | None]:
    return [server.client().get(lock_keys(name).fence) for server in servers]


def _held_keys(servers: list[Any], name: str) -> list[str]:
    """Keys that would mean a grant is held: the lock key and each semaphore slot's."""
    names = [lock_keys(name).lock, *(slot_keys(name, i).lock for i in range(2))]
    return [k for server in servers for k in names if server.client().exists(k)]


def _granter(
    kind: str, make: Make, urls: list[str], name: str, front: str, **options: Any
) -> Callable[[], int]:
    """A function that takes one grant of ``kind`` on ``name``, releases it, returns its fence
    (``options``: more options of the primitive)."""
    if kind == "election":
        return _election_granter(urls, name, front, **options)
    if kind in ("lock", "fair"):
        lock = make("lock", urls, name, ttl=10.0, fair=kind == "fair", **options)
        take = lock.acquire
    elif kind == "semaphore":
        sem = make("semaphore", urls, name, 2, ttl=10.0, **options)
        take = sem.acquire
    else:
        rw = make("rwlock", urls, name, ttl=10.0, **options)
        take = rw.acquire_read if kind == "rw_read" else rw.acquire_write

    def grant() -> int:
        lease = take(wait=0)
        fence = int(lease.fence)
        lease.release()
        return fence

    return grant


def _election_granter(
    urls: list[str], name: str, front: str, **options: Any
) -> Callable[[], int]:
    if front == "sync":
        election = fencelock.Client(urls, ttl=10.0, **options).election(name, name="host-1")

        def campaign() -> int:
            with election.campaign(wait=0) as term:
                leader = election.leader()
                assert leader is not None and leader.fence == term.fence  # named exactly
                return int(term.fence)

        return campaign

    async def campaign_async() -> int:
        client = fasync.Client(urls, ttl=10.0, **options)
        try:
            election = client.election(name, name="host-1")
            async with election.campaign(wait=0) as term:
                leader = await election.leader()
                assert leader is not None and leader.fence == term.fence
                return int(term.fence)
        finally:
            await client.aclose()

    return lambda: asyncio.run(campaign_async())


@pytest.mark.parametrize("n", TOPOLOGIES)
@pytest.mark.parametrize("kind", PRIMITIVES)
def test_fences_grow_by_exactly_one_past_2_53(
    topologies: Any, make: Make, front: str, key: str, kind: str, n: int
) -> None:
    urls, servers = topologies.urls(n), topologies.group(n).servers
    _set_registers(servers, key, PAST_2_53)
    grant = _granter(kind, make, urls, key, front)
    fences = [grant() for _ in range(GRANTS)]
    assert fences == [PAST_2_53 + i for i in range(1, GRANTS + 1)]
    assert all(type(f) is int for f in fences)
    # each register that took part holds the last fence exactly (a majority at least)
    last = str(fences[-1]).encode()
    assert sum(r == last for r in _registers(servers, key)) >= n // 2 + 1


@pytest.mark.parametrize("n", TOPOLOGIES)
@pytest.mark.parametrize("kind", PRIMITIVES)
def test_fences_reach_2_63_minus_1_exactly_then_refuse_with_the_reason(
    topologies: Any, make: Make, front: str, key: str, kind: str, n: int
) -> None:
    urls, servers = topologies.urls(n), topologies.group(n).servers
    _set_registers(servers, key, FENCE_MAX - 3)
    grant = _granter(kind, make, urls, key, front)
    fences = [grant() for _ in range(3)]
    assert fences == [FENCE_MAX - 2, FENCE_MAX - 1, FENCE_MAX]
    with pytest.raises(Unavailable) as refused:
        grant()
    assert "2^63 - 1" in str(refused.value)
    assert _held_keys(servers, key) == []  # nothing granted, nothing left held
    assert set(_registers(servers, key)) <= {str(FENCE_MAX).encode()}


# -- the scripts themselves: the N-server commit and the hand-over compare exactly ------------


def _run(client: Any, name: str, keys: tuple[str, ...], *args: str) -> Any:
    script = BY_NAME[name]
    return client.eval(script.source, len(keys), *keys, *args)


@pytest.mark.parametrize("commit", ["fence_commit", "sem_fence_commit", "rw_read_commit"])
def test_a_commit_raises_a_register_by_one_past_2_53(
    fencelock_server: Any, key: str, commit: str
) -> None:
    # 2^53 + 3 and 2^53 + 4 are the same double: a float comparison left F one below the
    # committed fence, so a later majority could issue that fence again
    client = fencelock_server.client()
    k = lock_keys(key)
    register, fence = 2**53 + 3, 2**53 + 4
    client.set(k.fence, str(register))
    if commit == "rw_read_commit":
        readers = rw_keys(key).readers
        client.zadd(readers, {"tok": 2**45})  # a live reader (expiry far ahead)
        keys: tuple[str, ...] = (readers, k.fence)
    else:
        client.set(k.lock, "tok", px=10_000)
        keys = (k.lock, k.fence)
    reply = _run(client, commit, keys, "tok", str(fence))
    assert reply in (1, [1, str(register).encode()])
    assert client.get(k.fence) == str(fence).encode()
    # a lower fence leaves it: the comparison is exact, not by length alone
    _run(client, commit, keys, "tok", str(fence - 1))
    assert client.get(k.fence) == str(fence).encode()


def test_a_commit_of_a_fence_past_2_63_minus_1_is_an_error(fencelock_server: Any, key: str) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.lock, "tok", px=10_000)
    with pytest.raises(redis.ResponseError, match="not a fence"):
        _run(client, "fence_commit", (k.lock, k.fence), "tok", str(FENCE_MAX + 1))
    assert client.get(k.fence) is None


def _release_to_a_waiter(client: Any, key: str) -> Any:
    k = lock_keys(key)
    client.set(k.lock, "tok", px=10_000)
    client.zadd(k.waiters, {"w1": 2**45})  # a waiter registered (expiry far ahead)
    return _run(client, "release", release_keys(k), "tok", "1000", "5000", "hnext", "10000", "-")


def test_a_hand_over_past_2_53_carries_the_exact_fence(fencelock_server: Any, key: str) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, str(PAST_2_53))
    assert _release_to_a_waiter(client, key) == 1
    (element,) = client.lrange(k.wake, 0, -1)
    assert element.split(b" ")[:2] == [b"hnext", str(PAST_2_53 + 1).encode()]
    assert client.get(k.fence) == str(PAST_2_53 + 1).encode()
    assert client.get(k.lock) == b"hnext"


def test_a_release_at_2_63_minus_1_wakes_a_waiter_instead_of_handing_over(
    fencelock_server: Any, key: str
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, str(FENCE_MAX))
    assert _release_to_a_waiter(client, key) == 1  # the release itself succeeds
    assert client.lrange(k.wake, 0, -1) == [b"1"]  # a plain wake-up: no grant, no fence
    assert client.get(k.lock) == b""  # the hand-off marker: newcomers step aside
    assert client.pttl(k.lock) > 0
    assert client.get(k.fence) == str(FENCE_MAX).encode()


@pytest.mark.parametrize("bad", ["v", "-5", "1e20", "1.5", str(FENCE_MAX + 1)])
def test_a_register_that_is_not_a_fence_grants_nothing(
    fencelock_server: Any, key: str, bad: str
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, bad)
    with pytest.raises(redis.ResponseError, match="not a fence"):
        _run(client, "acquire", lock_wiring(k).acquire_keys, "tok", "10000", "", "0", "-", "0")
    assert client.get(k.lock) is None
    assert client.get(k.fence) == bad.encode()
