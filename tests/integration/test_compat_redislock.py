"""``fencelock.compat.RedisLock``: python-redis-lock's documented API on real servers.

These tests follow its documented behaviour (arguments, return values, exceptions, keys);
python-redis-lock's own suite runs against it in test_compat_redislock_suite.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

import fencelock
from fencelock import compat
from fencelock.compat import (
    AlreadyAcquired,
    InvalidTimeout,
    NotAcquired,
    RedisLock,
    TimeoutNotUsable,
    TimeoutTooLarge,
    reset_all,
)


@pytest.fixture
def conn(topologies: Any) -> Any:
    client = redis.Redis.from_url(topologies.urls(1)[0])
    yield client
    client.close()


def test_acquire_release_locked_and_the_owner_id(conn: Any, key: str) -> None:
    lock = RedisLock(conn, key, expire=60)
    assert not lock.locked()
    assert lock.acquire()
    assert lock.locked()
    assert lock.get_owner_id() == lock.id
    assert conn.get("lock:" + key) == lock.id.encode()  # python-redis-lock's key
    assert 55_000 < conn.pttl("lock:" + key) <= 60_000
    lock.release()
    assert not lock.locked()
    assert lock.get_owner_id() is None


def test_a_second_lock_is_refused_and_a_timeout_returns_false(conn: Any, key: str) -> None:
    holder = RedisLock(conn, key, expire=60)
    other = RedisLock(conn, key, expire=60)
    assert holder.acquire()
    assert not other.acquire(blocking=False)
    started = time.monotonic()
    assert not other.acquire(timeout=1)
    assert 0.9 <= time.monotonic() - started < 10.0
    holder.release()
    # a release that found a waiter registered (the one that just timed out may still be)
    # makes newcomers step aside for the 50 ms hand-off window: a blocking acquire gets it
    assert other.acquire(timeout=5)
    other.release()


def test_a_python_redis_lock_holder_excludes_it(conn: Any, key: str) -> None:
    conn.set("lock:" + key, "an-id-of-python-redis-lock", nx=True, ex=60)
    lock = RedisLock(conn, key, expire=60)
    assert not lock.acquire(blocking=False)
    conn.delete("lock:" + key)
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_blocked_waiter_is_woken_by_the_release(conn: Any, key: str) -> None:
    holder = RedisLock(conn, key, expire=60)
    assert holder.acquire()
    waiter = RedisLock(conn, key, expire=60)
    got: list[float] = []
    thread = threading.Thread(
        target=lambda: got.append(time.monotonic()) if waiter.acquire(timeout=50) else None
    )
    thread.start()
    time.sleep(1.0)
    released_at = time.monotonic()
    holder.release()
    thread.join(60.0)
    assert got, "the waiter did not get the lock"
    assert got[0] - released_at < 2.5  # not woken, it would wait for the 60 s key to expire
    waiter.release()


def test_python_redis_locks_argument_errors(conn: Any, key: str) -> None:
    lock = RedisLock(conn, key, expire=2)
    with pytest.raises(TimeoutNotUsable):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(InvalidTimeout):
        lock.acquire(timeout=-1)
    with pytest.raises(TimeoutTooLarge):
        lock.acquire(timeout=5)
    assert lock.acquire()
    with pytest.raises(AlreadyAcquired):
        lock.acquire()
    lock.release()
    with pytest.raises(ValueError):
        RedisLock(conn, key, auto_renewal=True)  # no expire to renew
    with pytest.raises(ValueError):
        RedisLock(conn, key, expire=-1)
    with pytest.raises(ValueError):
        RedisLock(object(), key)  # type: ignore[arg-type]  # strict: a redis.Redis
    with pytest.raises(TypeError):
        RedisLock(conn, key, id=42)  # type: ignore[arg-type]
    with pytest.raises(fencelock.ConfigError):
        RedisLock(conn, key, id="hello")  # would read as a lock handed over to a waiter


def test_release_of_a_lock_not_held_raises_not_acquired(conn: Any, key: str) -> None:
    lock = RedisLock(conn, key, expire=60)
    with pytest.raises(NotAcquired):
        lock.release()
    assert lock.acquire()
    conn.set("lock:" + key, "someone-else")
    with pytest.raises(NotAcquired):
        lock.release()
    assert conn.get("lock:" + key) == b"someone-else"
    conn.delete("lock:" + key)


def test_another_object_with_the_same_id_releases_it(conn: Any, key: str) -> None:
    first = RedisLock(conn, key, expire=60)
    assert first.acquire()
    RedisLock(conn, key, id=first.id).release()
    assert not first.locked()


def test_another_object_with_the_same_id_extends_it(conn: Any, key: str) -> None:
    first = RedisLock(conn, key, expire=5)
    assert first.acquire()
    RedisLock(conn, key, id=first.id).extend(60)
    assert 55_000 < conn.pttl("lock:" + key) <= 60_000
    with pytest.raises(NotAcquired):
        RedisLock(conn, key).extend(600)  # another id
    assert conn.pttl("lock:" + key) <= 60_000
    first.release()
    with pytest.raises(NotAcquired):
        RedisLock(conn, key, id=first.id).extend(60)  # not held any more


def test_strict_false_takes_any_client_until_the_lock_is_used(key: str) -> None:
    lock = RedisLock(object(), key, expire=1, strict=False)  # type: ignore[arg-type]
    assert lock.id and repr(lock) == f"RedisLock('lock:{key}', expire=1)"
    with pytest.raises(ValueError):
        lock.extend(-1)  # arguments are checked before any use of the client


def test_reset_all_deletes_every_lock_and_wakes_the_waiters(fencelock_server: Any) -> None:
    conn = fencelock_server.client()
    braced = RedisLock(conn, "{report}:x", expire=60)  # its fence register is a lock:* key too
    holders = [RedisLock(conn, "a", expire=60), RedisLock(conn, "b", expire=60), braced]
    assert all(lock.acquire() for lock in holders)
    first_fence = braced.fence
    waiter = RedisLock(conn, "a", expire=60)
    got: list[float] = []
    thread = threading.Thread(
        target=lambda: got.append(time.monotonic()) if waiter.acquire(timeout=50) else None
    )
    thread.start()
    time.sleep(1.0)
    reset_at = time.monotonic()
    assert reset_all(conn) >= 3
    thread.join(60.0)
    assert got and got[0] - reset_at < 2.5, "the waiter was not woken"
    for lock in holders:
        with pytest.raises(NotAcquired):
            lock.release()
    assert conn.exists("lock:b") == 0
    again = RedisLock(conn, "{report}:x", expire=60)
    assert again.acquire(blocking=False)
    assert first_fence is not None and again.fence is not None and again.fence > first_fence
    again.release()
    waiter.release()
    conn.close()


def test_extend_restarts_the_lease(conn: Any, key: str) -> None:
    lock = RedisLock(conn, key, expire=5)
    with pytest.raises(NotAcquired):
        lock.extend()
    assert lock.acquire()
    lock.extend(60)
    assert 55_000 < conn.pttl("lock:" + key) <= 60_000
    lock.extend()  # back to expire
    assert 3_000 < conn.pttl("lock:" + key) <= 5_000
    conn.set("lock:" + key, "someone-else")
    with pytest.raises(NotAcquired):
        lock.extend()
    conn.delete("lock:" + key)
    with pytest.raises(TypeError):
        RedisLock(conn, key).extend()  # no expire anywhere


def test_reset_deletes_it_whoever_holds_it(conn: Any, key: str) -> None:
    holder = RedisLock(conn, key, expire=60)
    assert holder.acquire()
    RedisLock(conn, key).reset()
    assert not holder.locked()
    with pytest.raises(NotAcquired):
        holder.release()


def test_the_context_manager(conn: Any, key: str) -> None:
    with RedisLock(conn, key, expire=60) as lock:
        assert lock.locked()
        with pytest.raises(NotAcquired), RedisLock(conn, key, expire=60, blocking=False):
            pass
    assert not lock.locked()


def test_auto_renewal_keeps_it_past_expire_and_fences_grow(conn: Any, key: str) -> None:
    lock = RedisLock(conn, key, expire=2, auto_renewal=True)
    assert lock.acquire()
    first = lock.fence
    assert first is not None and isinstance(lock.lease, fencelock.Lease)
    time.sleep(5.0)  # two and a half times expire
    assert lock.get_owner_id() == lock.id
    assert lock.lost is not None and not lock.lost.is_set()
    lock.release()
    assert lock.fence is None
    assert lock.acquire(blocking=False)
    assert lock.fence is not None and lock.fence > first
    lock.release()


def test_no_expire_is_a_renewed_lease_never_an_immortal_key(
    conn: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "RENEWED_TTL", 2.0)
    lock = RedisLock(conn, key)
    assert lock.acquire()
    assert 0 < conn.pttl("lock:" + key) <= 2000
    time.sleep(5.0)  # more than twice the lease
    assert lock.get_owner_id() == lock.id
    conn.set("lock:" + key, "someone-else")
    assert lock.lost is not None and lock.lost.wait(20.0), "the loss was not signalled"
    conn.delete("lock:" + key)
