"""``fencelock.compat.RedisPyLock`` / ``AsyncRedisPyLock``: what fencelock adds to redis-py's
shape (fence, loss signal, renewal, wake-ups, errors), on real servers. redis-py's own tests
of the shape are run by test_compat_redispy.py."""

from __future__ import annotations

import asyncio
import pickle
import re
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot
from redis.exceptions import LockError, LockNotOwnedError

import fencelock
from fencelock import compat
from fencelock.compat import AsyncRedisPyLock, RedisPyLock, ServersUnavailable


@pytest.fixture
def r(topologies: Any) -> Any:
    client = redis.Redis.from_url(topologies.urls(1)[0])
    yield client
    client.close()


def test_a_redis_py_lock_and_a_redispylock_on_one_name_exclude_each_other(r: Any, key: str) -> None:
    plain = r.lock(key, timeout=30)
    ours = r.lock(key, timeout=30, lock_class=RedisPyLock)
    assert plain.acquire(blocking=False)
    assert not ours.acquire(blocking=False)
    plain.release()
    assert ours.acquire(blocking=False)
    assert r.get(key) == ours.local.token  # the lock is the key ``name``, as redis-py's
    assert not plain.acquire(blocking=False)
    ours.release()
    assert plain.acquire(blocking=False)
    plain.release()


def test_default_tokens_are_128_random_bits_in_hex(topologies: Any, key: str) -> None:
    """docs/migrating.md's deviation from redis-py's UUID4 tokens: 32 hex digits (128 bits), a
    new one each acquire, stored as the key's value, on both front ends."""
    url = topologies.urls(1)[0]
    tokens = []
    client = redis.Redis.from_url(url)
    try:
        for _ in range(3):
            lock = client.lock(key, timeout=30, lock_class=RedisPyLock)
            assert lock.acquire(blocking=False)
            assert client.get(key) == lock.local.token
            tokens.append(lock.local.token)
            lock.release()
    finally:
        client.close()

    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(url)
        try:
            for _ in range(3):
                lock = aclient.lock(key, timeout=30, lock_class=AsyncRedisPyLock)
                assert await lock.acquire(blocking=False)
                assert await aclient.get(key) == lock.local.token
                tokens.append(lock.local.token)
                await lock.release()
        finally:
            await aclient.aclose()

    asyncio.run(main())
    for token in tokens:
        assert re.fullmatch(rb"[0-9a-f]{32}", token), token
    assert len(set(tokens)) == 6, tokens


def test_fences_grow_from_holder_to_holder(r: Any, key: str) -> None:
    first = r.lock(key, timeout=30, lock_class=RedisPyLock)
    second = r.lock(key, timeout=30, lock_class=RedisPyLock)
    assert first.fence is None and first.lease is None and first.lost is None
    fences = []
    for lock in (first, second, first):
        assert lock.acquire(blocking=False)
        assert isinstance(lock.lease, fencelock.Lease)
        fences.append(lock.fence)
        lock.release()
    assert fences == sorted(set(fences)), fences
    assert first.fence is None


def test_a_lock_without_timeout_is_renewed_past_its_lease(
    r: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "RENEWED_TTL", 2.0)
    lock = r.lock(key, lock_class=RedisPyLock)  # timeout=None: a renewed lease, never immortal
    assert lock.acquire(blocking=False)
    assert 0 < r.pttl(key) <= 2000
    time.sleep(5.0)  # more than twice the lease (renewed every 2/3 s)
    assert lock.owned()
    assert 0 < r.pttl(key) <= 2000
    assert not lock.lost.is_set()
    lock.release()
    assert not lock.locked()


def test_the_loss_signal_is_set_when_the_key_is_taken(
    r: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "RENEWED_TTL", 2.0)
    lock = r.lock(key, lock_class=RedisPyLock)
    assert lock.acquire(blocking=False)
    lost = lock.lost
    r.set(key, "someone-else")  # the next renewal finds it is not ours
    assert lost.wait(20.0), "the loss was not signalled"
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert lock.local.token is None
    assert r.get(key) == b"someone-else"


def test_a_waiter_is_woken_by_the_release_not_by_its_sleep(r: Any, key: str) -> None:
    holder = r.lock(key, timeout=30, lock_class=RedisPyLock)
    assert holder.acquire(blocking=False)
    waiter = r.lock(
        key,
        timeout=30,
        sleep=20.0,
        blocking_timeout=60,
        thread_local=False,  # released by this thread, acquired by another
        lock_class=RedisPyLock,
    )
    got: list[float] = []
    thread = threading.Thread(
        target=lambda: got.append(time.monotonic()) if waiter.acquire() else None
    )
    thread.start()
    time.sleep(4.0)  # the waiter's backoff has grown well past a second by now
    released_at = time.monotonic()
    holder.release()
    thread.join(60.0)
    assert got, "the waiter did not get the lock"
    # not woken, it would sleep until the holder's key could expire (26 s later)
    assert got[0] - released_at < 2.5
    waiter.release()


def test_a_waiter_sees_a_plain_redis_py_release_within_its_sleep(r: Any, key: str) -> None:
    """A redis-py holder's release wakes nobody: the waiter still tries every ``sleep`` s
    (not only when the holder's key would have expired)."""
    plain = r.lock(key, timeout=30, thread_local=False)
    assert plain.acquire(blocking=False)
    waiter = r.lock(key, sleep=0.5, blocking_timeout=60, thread_local=False, lock_class=RedisPyLock)
    got: list[float] = []
    thread = threading.Thread(
        target=lambda: got.append(time.monotonic()) if waiter.acquire() else None
    )
    thread.start()
    time.sleep(2.0)
    released_at = time.monotonic()
    plain.release()
    thread.join(60.0)
    assert got, "the waiter did not get the lock"
    assert got[0] - released_at < 3.0  # 28 s if it waited for the holder's key to expire
    waiter.release()


def test_an_unreachable_server_raises_servers_unavailable_a_redis_connection_error(
    fencelock_server: Any, key: str
) -> None:
    client = redis.Redis.from_url(fencelock_server.url)
    lock = client.lock(key, timeout=5, lock_class=RedisPyLock)
    fencelock_server.stop()
    started = time.monotonic()
    with pytest.raises(ServersUnavailable) as caught:
        lock.acquire(blocking=False)
    assert time.monotonic() - started < 10.0
    assert isinstance(caught.value, redis.exceptions.ConnectionError)
    assert isinstance(caught.value, fencelock.Unavailable)
    client.close()


def test_bad_arguments_raise_config_error_before_any_io() -> None:
    nowhere = redis.Redis(host="127.0.0.1", port=1)  # nothing may be sent: no server there
    with pytest.raises(fencelock.ConfigError):
        RedisPyLock(nowhere, "k", timeout=-1)
    with pytest.raises(fencelock.ConfigError):
        RedisPyLock(nowhere, "k", sleep=0)
    with pytest.raises(fencelock.ConfigError):
        RedisPyLock(nowhere, "")
    lock = RedisPyLock(nowhere, "k", timeout=5)
    with pytest.raises(fencelock.ConfigError, match="start with 'h'"):
        lock.acquire(token="hello")  # would read as a lock handed over to a waiter
    assert isinstance(fencelock.ConfigError("x"), ValueError)


def test_extend_and_reacquire_keep_redis_pys_errors(r: Any, key: str) -> None:
    lock = r.lock(key, timeout=10, lock_class=RedisPyLock)
    with pytest.raises(LockError):
        lock.extend(1)
    assert lock.acquire(blocking=False)
    assert lock.extend(5)
    assert 13_000 < r.pttl(key) <= 15_000
    assert lock.reacquire()
    assert 8_000 < r.pttl(key) <= 10_000
    r.set(key, "someone-else")
    with pytest.raises(LockNotOwnedError) as caught:
        lock.extend(5)
    assert caught.value.lock_name == key
    r.delete(key)


def test_threads_sharing_one_redispylock_never_overlap_and_fences_grow(r: Any, key: str) -> None:
    """redis-py's pattern: one Lock object shared by threads (the token is thread-local)."""
    lock = r.lock(key, timeout=30, blocking_timeout=60, lock_class=RedisPyLock)
    state = {"inside": 0, "max": 0}
    fences: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(5):
                with lock:
                    state["inside"] += 1
                    state["max"] = max(state["max"], state["inside"])
                    assert lock.fence is not None
                    fences.append(lock.fence)
                    time.sleep(0.002)
                    state["inside"] -= 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120.0)
    assert not errors, errors
    assert state["max"] == 1
    assert len(fences) == 30 and fences == sorted(set(fences))
    assert not lock.locked()


# -- asyncio ---------------------------------------------------------------------------------


def test_asyncio_locks_exclude_redis_pys_fence_and_signal_loss(
    topologies: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "RENEWED_TTL", 2.0)

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(topologies.urls(1)[0])
        try:
            plain = client.lock(key, timeout=30)
            ours = client.lock(key, lock_class=AsyncRedisPyLock)
            assert await plain.acquire(blocking=False)
            assert not await ours.acquire(blocking=False)
            await plain.release()
            fences = []
            for _ in range(2):
                async with client.lock(key, timeout=30, lock_class=AsyncRedisPyLock) as held:
                    assert not await plain.acquire(blocking=False)
                    fences.append(held.fence)
            assert fences[0] < fences[1]
            assert await ours.acquire(blocking=False)
            assert isinstance(ours.lost, asyncio.Event)
            await asyncio.sleep(5.0)  # renewed past its lease
            assert await ours.owned()
            await client.set(key, "someone-else")
            await asyncio.wait_for(ours.lost.wait(), 20.0)
            with pytest.raises(LockNotOwnedError):
                await ours.release()
        finally:
            await client.delete(key)
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("name", ["orders:42", "a{user7}b", "{x}"])
def test_the_compat_keys_share_the_lock_keys_cluster_slot(name: str) -> None:
    keys = compat.compat_keys(name)
    assert keys.lock == name
    others = {keys.fence, keys.holder, keys.waiters, keys.wake, keys.handoff, keys.claimed}
    assert len(others) == 6 and name not in others
    assert {key_slot(k.encode()) for k in others} == {key_slot(name.encode())}


def test_servers_unavailable_pickles_with_its_evidence() -> None:
    error = ServersUnavailable("k", "'k': 0/1 servers agreed, majority is 1")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ServersUnavailable and again.key == "k" and str(again) == str(error)
