"""The fence register is read and written in one command when a grant's fence is the server's
TIME floor (``SET ... GET``, ``fence_math.lua``'s ``fence_issue``), and in the old two when it is
not: a register at or past the floor, a register that is no fence or of another type. Each case
on a real server, counted with ``INFO commandstats`` (commands a script runs are counted)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
from api import command_counts

import fencelock.asyncio as aio
from fencelock import Lock, Unavailable
from fencelock._core.keys import lock_keys
from fencelock._core.plan import lock_wiring
from fencelock._scripts import BY_NAME

RETENTION_MS = 604_800_000  # the default register retention (7 days)


def _acquire(client: Any, name: str) -> Any:
    """One run of the acquire script (no holder info, a caller that will not wait), its
    commands counted; returns (reply, counts)."""
    script = BY_NAME["acquire"]
    keys = lock_wiring(lock_keys(name)).acquire_keys
    client.script_load(script.source)
    client.config_resetstat()
    reply = client.evalsha(
        script.sha, len(keys), *keys, "tok", "10000", "", "0", "-", "0", str(RETENTION_MS)
    )
    return reply, command_counts(client)


def test_a_fence_at_the_time_floor_is_stored_by_the_read_itself(
    fencelock_server: Any, key: str
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, "17", px=60_000)  # a register well below TIME in microseconds
    before_us = int(time.time() * 1e6)
    (granted, fence), counts = _acquire(client, key)
    assert granted == 1
    assert int(fence) >= before_us - 5_000_000  # the TIME floor, not 18
    assert client.get(k.fence) == fence
    assert client.pttl(k.fence) > RETENTION_MS - 60_000  # the retention, as fence_store keeps it
    # TIME, SET NX of the lock, SET ... GET of the register: no GET, no second SET
    assert counts.get("get", 0) == 0
    assert counts["set"] == 2
    assert counts["time"] == 1


def test_a_register_past_the_floor_is_incremented_and_kept_for_ever(
    fencelock_server: Any, key: str
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    ahead = 10**18  # far past TIME: a register raised by hand, kept without a TTL
    client.set(k.fence, str(ahead))
    (granted, fence), counts = _acquire(client, key)
    assert (granted, int(fence)) == (1, ahead + 1)
    assert client.get(k.fence) == str(ahead + 1).encode()
    assert client.pttl(k.fence) == -1
    assert counts["set"] == 3  # the register written again, with the fence it issues


def test_an_absent_register_starts_at_the_floor(fencelock_server: Any, key: str) -> None:
    client = fencelock_server.client()
    (granted, fence), counts = _acquire(client, key)
    assert granted == 1 and int(fence) > 10**15
    assert client.get(lock_keys(key).fence) == fence
    assert counts["set"] == 2


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_register_of_another_type_grants_nothing_and_is_left_as_it_was(
    fencelock_server: Any, key: str, front: str
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.rpush(k.fence, "x")
    client.pexpire(k.fence, 60_000)
    if front == "sync":
        with pytest.raises(Unavailable, match="is not a string, so not a fence"):
            Lock(fencelock_server.url, key, ttl=10).acquire(wait=0)
    else:

        async def main() -> None:
            await aio.Lock(fencelock_server.url, key, ttl=10).acquire(wait=0)

        with pytest.raises(Unavailable, match="is not a string, so not a fence"):
            asyncio.run(main())
    # nothing taken (the lock key was set and is deleted again), the list untouched
    assert client.exists(k.lock) == 0
    assert client.lrange(k.fence, 0, -1) == [b"x"]
    assert 0 < client.pttl(k.fence) <= 60_000


def test_a_register_that_is_no_fence_is_put_back(fencelock_server: Any, key: str) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, "not-a-number", px=60_000)
    with pytest.raises(redis.ResponseError, match="not a fence"):
        _acquire(client, key)
    assert client.get(k.fence) == b"not-a-number"  # its TTL is not kept (documented)
    assert client.exists(k.lock) == 0
