"""The lock's behaviour on real servers, run over both front ends (sync, asyncio via a blocking
facade, see ``api.py``) and over 1, 3 and 5 servers where it means something."""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from api import (  # noqa: F401
    FENCE_KEPT,
    LockFactory,
    front,
    lock_holder,
    lock_value,
    make_lock,
    our_keys,
)

from fencelock import LockLost, NotAcquired, Unavailable
from fencelock._core.keys import lock_keys
from fencelock.testing import ServerGroup, refused_urls

TOPOLOGIES = [1, 3]
ALL_TOPOLOGIES = [1, 3, 5]


def _clients(group: ServerGroup) -> list[Any]:
    return [s.client() for s in group.servers]


@pytest.mark.parametrize("n", ALL_TOPOLOGIES)
def test_contention(topologies: Any, make_lock: LockFactory, key: str, n: int) -> None:
    urls = topologies.urls(n)
    a = make_lock(urls, key, ttl=30)
    b = make_lock(urls, key, ttl=30)
    lease = a.acquire(wait=0)
    assert len(lease.token) >= 32 and lease.fence > 0 and 29 < lease.remaining() <= 30
    with pytest.raises(NotAcquired) as info:
        b.acquire(wait=0)
    err = info.value
    assert not isinstance(err, Unavailable)
    # The holder decided at its majority; a straggler of its round may still be in flight on
    # a minority, where B can win a vote (then released again): never a majority, never errors.
    assert len(err.votes) == n and not any(v.outcome == "error" for v in err.votes)
    held = sum(v.outcome == "held" for v in err.votes)
    assert held >= n // 2 + 1
    assert f"{n - held}/{n} servers agreed, majority is {n // 2 + 1}" in str(err)
    assert b.try_acquire() is None
    # a short wait still ends in NotAcquired, after about the wait
    start = time.monotonic()
    with pytest.raises(NotAcquired):
        b.acquire(wait=0.3)
    assert 0.3 <= time.monotonic() - start < 5.0
    lease.release()
    other = b.acquire(wait=2)
    assert other.token != lease.token and other.fence > lease.fence
    other.release()


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_free_lock_is_free_after_a_waiter_gave_up(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    """After B tried and gave up (try_acquire / wait=0: nobody is waiting any more), A's release
    must leave a free lock: C's single attempt succeeds. (A hand-off window is only for a waiter
    that is really blocked.)"""
    urls = topologies.urls(n)
    a = make_lock(urls, key, ttl=30)
    b = make_lock(urls, key, ttl=30)
    c = make_lock(urls, key, ttl=30)
    lease = a.acquire(wait=0)
    assert b.try_acquire() is None
    with pytest.raises(NotAcquired):
        b.acquire(wait=0)
    lease.release()
    other = c.try_acquire()
    assert other is not None, "the free lock refused a newcomer: stale waiters hint / hand-off"
    other.release()


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_expiry_then_takeover(topologies: Any, make_lock: LockFactory, key: str, n: int) -> None:
    urls = topologies.urls(n)
    a = make_lock(urls, key, ttl=0.5)
    b = make_lock(urls, key, ttl=5)
    old = a.acquire(wait=0)
    assert b.try_acquire() is None
    start = time.monotonic()
    new = b.acquire(wait=5)  # not released: it must be the expiry that frees it
    assert time.monotonic() - start < 5.0
    assert old.remaining() == 0.0 and not old.valid
    assert new.fence > old.fence and new.token != old.token
    for client in _clients(topologies.group(n)):
        assert lock_value(client, key) == new.token
    new.release()


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_stale_lease_cannot_release_or_extend(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    group = topologies.group(n)
    a = make_lock(group.urls, key, ttl=0.5)
    b = make_lock(group.urls, key, ttl=10)
    stale = a.acquire(wait=0)
    new = b.acquire(wait=5)
    with pytest.raises(LockLost):
        stale.extend(5)
    assert stale.lost.is_set()
    with pytest.raises(LockLost):
        stale.release()
    # the new holder's key is untouched: same token, TTL not shortened nor reset to 5 s
    for client in _clients(group):
        assert lock_value(client, key) == new.token
        assert 5000 < client.pttl(lock_keys(key).lock) <= 10_000
    assert new.valid
    new.release()
    for client in _clients(group):
        assert lock_value(client, key) is None


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_extend_prolongs(topologies: Any, make_lock: LockFactory, key: str, n: int) -> None:
    group = topologies.group(n)
    lock = make_lock(group.urls, key, ttl=2)
    lease = lock.acquire(wait=0)
    before = [c.pttl(lock_keys(key).lock) for c in _clients(group)]
    assert all(0 < p <= 2000 for p in before)
    lease.extend(20)
    after = [c.pttl(lock_keys(key).lock) for c in _clients(group)]
    assert all(15_000 < p <= 20_000 for p in after)
    assert 15 < lease.remaining() <= 20
    # the holder info is in the lock key's value: it follows the lease, and no other key does
    assert all(lock_holder(c, key) for c in _clients(group))
    assert all(not c.exists(lock_keys(key).holder) for c in _clients(group))
    lease.extend()  # default: the lock's ttl
    assert all(0 < c.pttl(lock_keys(key).lock) <= 2000 for c in _clients(group))
    assert 1.0 < lease.remaining() <= 2.0
    lease.release()
    with pytest.raises(LockLost):
        lease.extend()


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_context_managers_release_on_error(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    group = topologies.group(n)
    lock = make_lock(group.urls, key, ttl=30)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), lock.hold(wait=1, renew=False) as lease:
        assert lock_value(group.servers[0].client(), key) == lease.token
        raise Boom
    assert all(lock_value(c, key) is None for c in _clients(group))
    with pytest.raises(Boom), lock as lease:
        assert all(lock_value(c, key) == lease.token for c in _clients(group))
        raise Boom
    assert all(lock_value(c, key) is None for c in _clients(group))
    with lock.hold(wait=1, renew=True) as lease:
        token = lease.token
        assert lock_value(group.servers[0].client(), key) == token
    assert all(lock_value(c, key) is None for c in _clients(group))


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_with_lock_shared_by_threads(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    """Many threads share one Lock object: each gets its own lease, never two at once."""
    lock = make_lock(topologies.urls(n), key, ttl=30, wait=30)
    inside = 0
    overlap = threading.Event()
    guard = threading.Lock()
    seen: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def worker() -> None:
        nonlocal inside
        try:
            for _ in range(3):
                with lock as lease:
                    with guard:
                        inside += 1
                        if inside > 1:
                            overlap.set()
                        seen.append((lease.token, lease.fence))
                    time.sleep(0.005)
                    with guard:
                        inside -= 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert not overlap.is_set()
    assert len(seen) == 18 and len({tok for tok, _ in seen}) == 18
    fences = [f for _, f in seen]
    assert fences == sorted(fences) and len(set(fences)) == 18


@pytest.mark.parametrize("n", ALL_TOPOLOGIES)
def test_fences_strictly_increase(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    lock = make_lock(topologies.urls(n), key, ttl=10)
    fences = []
    for _ in range(50):
        lease = lock.acquire(wait=1)
        fences.append(lease.fence)
        lease.release()
    assert all(a < b for a, b in itertools.pairwise(fences))
    # the time floor: fences look like the servers' TIME in microseconds
    assert fences[0] > 1_600_000_000 * 10**6


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_fences_grow_across_restart_with_wipe(
    fencelock_servers: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    group = fencelock_servers(n)
    # restart_delay off: this is about the TIME floor of fences, not about votes (with it on,
    # servers that all restarted a moment ago would not vote for a ttl)
    lock = make_lock(group.urls, key, ttl=10, restart_delay=False)
    before = []
    for _ in range(5):
        lease = lock.acquire(wait=1)
        before.append(lease.fence)
        lease.release()
    for server in group.servers:  # every server loses its fence register
        server.kill()
        server.restart(wipe=True)
        assert server.client().get(lock_keys(key).fence) is None
    after = []
    for _ in range(5):
        lease = lock.acquire(wait=5)
        after.append(lease.fence)
        lease.release()
    assert min(after) > max(before)
    assert all(a < b for a, b in itertools.pairwise(after))


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_handoff_wakes_a_blocked_waiter(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    group = topologies.group(n)
    holder = make_lock(group.urls, key, ttl=30)
    waiter = make_lock(group.urls, key, ttl=30)
    lease = holder.acquire(wait=0)
    got: list[Any] = []
    acquired_at: list[float] = []
    errors: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            got.append(waiter.acquire(wait=5))
            acquired_at.append(time.monotonic())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    # wait until the waiter has been refused once (it leaves a "someone waits" hint), then a bit
    deadline = time.monotonic() + 5
    while not all(our_keys(c, key).get(":waiters") for c in _clients(group)[:1]):
        assert time.monotonic() < deadline, "the waiter never tried"
        time.sleep(0.01)
    time.sleep(0.3)
    assert lease.remaining() > 20  # the holder's lease is far from expiring: only a wake helps
    released_at = time.monotonic()
    lease.release()
    thread.join(10)
    assert not errors, errors
    assert got, "the waiter did not get the lock"
    assert acquired_at[0] - released_at < 1.0, "woken by the release, not by polling"
    assert got[0].fence > lease.fence
    got[0].release()
    # leftovers: the fence register (kept for its retention) and only transient hand-off keys.
    # The waiter's refused attempts leave nothing behind, but not at once: a grant of one that
    # lands after the attempt gave up (a straggler) is released by the background repeats.
    deadline = time.monotonic() + 5.0
    for client in _clients(group):
        keys = our_keys(client, key)
        while "<lock>" in keys or ":holder" in keys:
            assert time.monotonic() < deadline, keys
            time.sleep(0.05)
            keys = our_keys(client, key)
        assert keys.get(":fence") == FENCE_KEPT
        for name, pttl in keys.items():
            if name != ":fence":
                assert name in (":waiters", ":wake", ":handoff") and pttl > 0, keys


@pytest.mark.parametrize("n", ALL_TOPOLOGIES)
def test_nothing_left_after_release_but_the_fence(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    group = topologies.group(n)
    lock = make_lock(group.urls, key, ttl=30, purpose="billing")
    lease = lock.acquire(wait=0)
    for client in _clients(group):
        keys = our_keys(client, key)
        assert set(keys) == {"<lock>", ":fence"}  # the holder info is in the lock's value
        assert lock_value(client, key) == lease.token
        assert "billing" in (lock_holder(client, key) or "")
    lease.release()
    for client in _clients(group):
        assert our_keys(client, key) == {":fence": FENCE_KEPT}
    # the fence was committed to (at least) a majority before the lease was handed out
    registers = [int(c.get(lock_keys(key).fence)) for c in _clients(group)]
    assert sum(r >= lease.fence for r in registers) >= n // 2 + 1


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_closed_port_is_unavailable_within_the_wait(
    make_lock: LockFactory, key: str, n: int
) -> None:
    urls = refused_urls(n)
    lock = make_lock(urls, key, ttl=10)
    for wait in (0, 1.0):
        start = time.monotonic()
        with pytest.raises(Unavailable) as info:
            lock.acquire(wait=wait)
        assert time.monotonic() - start < wait + 2.0
        err = info.value
        assert len(err.votes) == n and all(v.outcome == "error" for v in err.votes)
        assert set(err.causes) == set(lock.servers)
        assert "servers agreed, majority is" in str(err)
    with pytest.raises(Unavailable):
        lock.try_acquire()  # not None: nobody holds it, nobody answered


@pytest.mark.parametrize("server_timeout", [None, 0.2])
def test_paused_server_is_unavailable_within_the_wait(
    fencelock_server: Any, make_lock: LockFactory, key: str, server_timeout: float | None
) -> None:
    kwargs = {} if server_timeout is None else {"server_timeout": server_timeout}
    lock = make_lock(fencelock_server.url, key, ttl=5, **kwargs)
    lock.acquire(wait=0).release()  # connected and working before the pause
    fencelock_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(Unavailable) as info:
            lock.acquire(wait=0.5)
        elapsed = time.monotonic() - start
    finally:
        fencelock_server.resume()
    assert elapsed < 0.5 + 2.0, elapsed
    causes = info.value.causes
    assert list(causes) == lock.servers
    assert str(fencelock_server.port) in lock.servers[0]


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_failed_round_leaves_nothing_of_ours(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    """A round that won some servers but failed (contention, or too slow) cleans them up."""
    group = topologies.group(n)
    clients = _clients(group)
    occupied = clients[: n // 2 + 1 if n > 1 else 1]  # enough to block a majority
    for client in occupied:
        client.set(lock_keys(key).lock, "someone-else", px=10_000)
    lock = make_lock(group.urls, key, ttl=10)
    assert lock.try_acquire() is None
    with pytest.raises(NotAcquired):
        lock.acquire(wait=0.2)
    for client in clients:
        keys = our_keys(client, key)
        if client in occupied:
            assert lock_value(client, key) == "someone-else"
        else:
            assert "<lock>" not in keys
        assert ":holder" not in keys
        client.delete(lock_keys(key).lock)
    # a majority grants, but the round cannot be valid (drift eats the whole lease)
    # (drift_min 1 ns short of the ttl: no round is that fast; 0.9999 s left 100 µs, and a
    # one-server round on the lean path can finish inside that; drift_min == ttl is refused)
    slow = make_lock(group.urls, key, ttl=1.0, drift_factor=0.0, drift_min=1.0 - 1e-9)
    with pytest.raises(Unavailable) as info:
        slow.acquire(wait=0)
    granted = [v for v in info.value.votes if v.outcome == "granted"]
    assert len(info.value.votes) == n and len(granted) >= n // 2 + 1
    assert "outlived the lease" in str(info.value)
    for client in clients:
        keys = our_keys(client, key)
        # the cleanup's release woke the waiter the refused acquire(wait=0.2) registered: the
        # lock key may hold the hand-off marker (its empty value) for the hand-off window
        assert lock_value(client, key) in (None, "") and ":holder" not in keys


def test_no_orphan_after_a_timed_out_round_on_a_paused_server(
    fencelock_server: Any, make_lock: LockFactory, key: str
) -> None:
    """Issue 2: nothing is left locked after any failure, including a timeout after which the
    SET lands. Here the server is frozen during the round; once it runs again it applies the
    SET it had received. The lock's TTL is 10 s: a key still there 2 s after the resume is an
    orphan left by a failed acquire, not a lease about to expire."""
    lock = make_lock(fencelock_server.url, key, ttl=10, server_timeout=0.2)
    lock.acquire(wait=0).release()
    fencelock_server.pause()
    try:
        with pytest.raises(Unavailable):
            lock.acquire(wait=0)
    finally:
        fencelock_server.resume()
    client = fencelock_server.client()
    deadline = time.monotonic() + 2.0
    while lock_value(client, key) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lock_value(client, key) is None, "a failed acquire left the lock held for its TTL"
    lease = lock.acquire(wait=0)  # and the lock is usable again at once
    lease.release()
