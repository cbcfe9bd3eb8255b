"""The fence register is read and written in one command when a grant's fence is the server's
TIME floor (``SET ... GET``, ``fence_math.lua``'s ``fence_issue``), and in the old two when it is
not: a register at or past the floor, a register that is no fence or of another type. Each case
on a real server, counted with ``INFO commandstats`` (commands a script runs are counted), for a
register kept for the retention and one kept for ever: ``acquire.lua`` issues the floor without
building ``fence_math.lua``'s functions for both, and falls back to them for every other case."""

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


@pytest.fixture(params=[RETENTION_MS, 0], ids=["retention", "for-ever"])
def retention(request: pytest.FixtureRequest) -> int:
    """The register retention the acquire script is given (0: kept for ever)."""
    return int(request.param)


def _acquire(client: Any, name: str, retention: int = RETENTION_MS) -> Any:
    """One run of the acquire script (no holder info, a caller that will not wait), its
    commands counted; returns (reply, counts)."""
    script = BY_NAME["acquire"]
    keys = lock_wiring(lock_keys(name)).acquire_keys
    client.script_load(script.source)
    client.config_resetstat()
    reply = client.evalsha(
        script.sha, len(keys), *keys, "tok", "10000", "", "0", "-", "0", str(retention)
    )
    return reply, command_counts(client)


def test_a_fence_at_the_time_floor_is_stored_by_the_read_itself(
    fencelock_server: Any, key: str, retention: int
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, "17", px=60_000)  # a register well below TIME in microseconds
    before_us = int(time.time() * 1e6)
    (granted, fence), counts = _acquire(client, key, retention)
    assert granted == 1
    assert int(fence) >= before_us - 5_000_000  # the TIME floor, not 18
    assert client.get(k.fence) == fence
    if retention:
        assert client.pttl(k.fence) > retention - 60_000  # the retention, as fence_store keeps it
    else:
        assert client.pttl(k.fence) == -1  # kept for ever: the old TTL is not kept either
    # TIME, SET NX of the lock, SET ... GET of the register: no GET, no second SET
    assert counts.get("get", 0) == 0
    assert counts["set"] == 2
    assert counts["time"] == 1


def test_a_register_past_the_floor_is_incremented_and_kept_for_ever(
    fencelock_server: Any, key: str, retention: int
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    ahead = 10**18  # far past TIME: a register raised by hand, kept without a TTL
    client.set(k.fence, str(ahead))
    (granted, fence), counts = _acquire(client, key, retention)
    assert (granted, int(fence)) == (1, ahead + 1)
    assert client.get(k.fence) == str(ahead + 1).encode()
    assert client.pttl(k.fence) == -1
    assert counts["set"] == 3  # the register written again, with the fence it issues


def test_an_absent_register_starts_at_the_floor(
    fencelock_server: Any, key: str, retention: int
) -> None:
    client = fencelock_server.client()
    (granted, fence), counts = _acquire(client, key, retention)
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


@pytest.mark.parametrize("text", ["not-a-number", "", "12a", "-5", "0x10"])
def test_a_register_that_is_no_fence_is_put_back(
    fencelock_server: Any, key: str, retention: int, text: str
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, text, px=60_000)  # each shorter than TIME in us, so checked as text
    with pytest.raises(redis.ResponseError, match="not a fence"):
        _acquire(client, key, retention)
    assert client.get(k.fence) == text.encode()  # its TTL is not kept (documented)
    assert client.exists(k.lock) == 0


def test_a_register_with_leading_zeros_is_read_as_its_number(
    fencelock_server: Any, key: str, retention: int
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    client.set(k.fence, "00017")
    (granted, fence), _ = _acquire(client, key, retention)
    assert granted == 1 and int(fence) > 10**15  # 17, below the floor
    client.delete(k.lock)
    ahead = "0" + str(10**18)  # as long as TIME in us plus one digit, yet 10^18
    client.set(k.fence, ahead)
    (granted, fence), _ = _acquire(client, key, retention)
    assert (granted, int(fence)) == (1, 10**18 + 1)
    assert client.get(k.fence) == str(10**18 + 1).encode()
