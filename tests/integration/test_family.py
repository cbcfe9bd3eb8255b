"""The family on real servers, both front ends, 1 and 3 servers: Semaphore, RWLock, reentrant
locks, MultiLock. Invariants are checked by the threads themselves (a shared count under a
local lock, taken between the acquire's return and the release's call), fences over the
history (if A was granted before B was asked for, fence(A) < fence(B))."""

# ruff: noqa: F811  (fixtures imported from the api modules, then named as test parameters)

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from typing import Any

import pytest
from api import FENCE_KEPT, front, our_keys  # noqa: F401
from family_api import Make, make  # noqa: F401

import fencelock
import fencelock.asyncio as fasync
from fencelock import ConfigError, FencelockError, LockLost, NotAcquired
from fencelock._core.keys import rw_keys, slot_keys
from fencelock._frontend.reentry import MAX_DEPTH

TOPOLOGIES = [pytest.param(1, id="n1"), pytest.param(3, id="n3")]
JOIN_S = 60.0  # liveness bound for worker threads (never a speed assertion)


class History:
    """Grants as (asked_at, granted_at, fence), and a live count checked on every change."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.guard = threading.Lock()
        self.live: dict[str, int] = {}
        self.grants: list[tuple[float, float, int]] = []
        self.violations: list[str] = []
        self.errors: list[BaseException] = []

    def enter(self, kind: str, asked: float, fence: int, *, alone: tuple[str, ...] = ()) -> None:
        with self.guard:
            self.grants.append((asked, time.monotonic(), fence))
            self.live[kind] = self.live.get(kind, 0) + 1
            if self.live[kind] > self.limit:
                self.violations.append(f"{self.live[kind]} {kind} at once (limit {self.limit})")
            for other in alone:
                if self.live.get(other, 0):
                    self.violations.append(f"{kind} together with {other}")

    def leave(self, kind: str) -> None:
        with self.guard:
            self.live[kind] -= 1

    def fence_order_violations(self) -> list[tuple[int, int]]:
        """Pairs where A was granted before B was asked for, yet fence(A) >= fence(B)."""
        bad = []
        by_grant = sorted(self.grants, key=lambda g: g[1])
        for i, (_, granted_a, fence_a) in enumerate(by_grant):
            for asked_b, _, fence_b in by_grant[i + 1 :]:
                if granted_a < asked_b and fence_a >= fence_b:
                    bad.append((fence_a, fence_b))
        return bad


def run_threads(count: int, body: Any, history: History) -> None:
    def guarded(worker: int) -> None:
        try:
            body(worker)
        except BaseException as exc:
            history.errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "a worker did not finish"
    assert not history.errors, history.errors[:3]


# -- Semaphore ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_never_more_than_limit_permits_and_fences_grow_in_grant_order(
    topologies: Any, make: Make, key: str, n: int
) -> None:
    sem = make("semaphore", topologies.urls(n), key, 3, ttl=10)
    history = History(3)
    slots_live: set[int] = set()

    def worker(index: int) -> None:
        rng = random.Random(index)
        for _ in range(12):
            asked = time.monotonic()
            permit = sem.acquire(wait=20)
            history.enter("permit", asked, permit.fence)
            with history.guard:
                if permit.slot in slots_live:
                    history.violations.append(f"slot {permit.slot} given twice")
                slots_live.add(permit.slot)
            time.sleep(rng.uniform(0, 0.01))
            with history.guard:
                slots_live.discard(permit.slot)
            history.leave("permit")
            permit.release()

    run_threads(8, worker, history)
    assert history.violations == []
    assert len(history.grants) == 96
    assert history.fence_order_violations() == []
    assert len({fence for _, _, fence in history.grants}) == 96


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_permit_is_a_lease_with_a_slot_and_nothing_is_left_after_release(
    topologies: Any, make: Make, key: str, n: int
) -> None:
    sem = make("semaphore", topologies.urls(n), key, 2, ttl=10)
    first, second = sem.acquire(wait=0), sem.acquire(wait=0)
    assert {first.slot, second.slot} == {0, 1}
    assert second.fence > first.fence
    assert first.token != second.token and len(first.token) >= 32
    assert sem.try_acquire() is None
    with pytest.raises(NotAcquired):
        sem.acquire(wait=0.2)
    first.extend(20)
    assert first.remaining() > 15
    first.release()
    first.release()  # twice: a no-op
    third = sem.acquire(wait=1)  # (the release woke the waiter above: a hand-off window)
    assert third.slot == first.slot and third.fence > second.fence
    second.release()
    third.release()
    for server in topologies.group(n).servers:
        left = our_keys(server.client(), key)
        assert left.pop(":fence") == FENCE_KEPT  # the register is kept for its retention
        # the limit is kept as long as the longest lease granted (a Semaphore of another
        # limit on the name is refused meanwhile)
        assert 0 < left.pop(":limit") <= 10_000
        # no slot is held (a slot may hold the hand-off marker, its empty value, for the
        # hand-off window: the releases woke the waiter the refused try registered); what is
        # left are wait signals that expire by themselves
        client = server.client()
        for slot in (0, 1):
            assert client.get(slot_keys(key, slot).lock) in (None, b""), slot
        assert not any(name.endswith(":holder") for name in left), left
        assert all(0 <= pttl <= 6000 for pttl in left.values()), left  # (0: its last ms)


def test_a_permit_held_by_hold_is_renewed_past_its_ttl(
    topologies: Any, make: Make, key: str
) -> None:
    sem = make("semaphore", topologies.urls(1), key, 1, ttl=0.6)
    with sem.hold(wait=1) as permit:
        time.sleep(1.0)
        assert permit.remaining() > 0 and not permit.lost.is_set()
        assert sem.try_acquire() is None


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, math.nan, "3", None, 10**6])
def test_a_bad_limit_is_a_config_error_before_any_io(limit: Any) -> None:
    unreachable = "redis://127.0.0.1:1/0"
    with pytest.raises(ConfigError):
        fencelock.Semaphore(unreachable, "k", limit)
    with pytest.raises(ConfigError):
        fencelock.Client(unreachable).semaphore("k", limit=limit)
    with pytest.raises(ConfigError):
        fasync.Semaphore(unreachable, "k", limit)


def test_a_permit_that_expired_cannot_release_the_next_holders_permit(
    topologies: Any, key: str
) -> None:
    sem = fencelock.Semaphore(topologies.urls(1), key, 1, ttl=0.3)
    old = sem.acquire(wait=0)
    time.sleep(0.45)
    new = sem.acquire(wait=0)
    assert new.fence > old.fence
    with pytest.raises(LockLost):
        old.release()  # owner-checked: the slot is the new holder's now
    assert sem.try_acquire() is None
    new.release()


# -- RWLock ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_never_a_writer_with_a_reader_or_two_writers(
    topologies: Any, make: Make, key: str, n: int
) -> None:
    rw = make("rwlock", topologies.urls(n), key, ttl=10)
    history = History(1)  # writers: at most 1
    readers_seen = [0]

    def worker(index: int) -> None:
        rng = random.Random(index)
        for _ in range(10):
            asked = time.monotonic()
            if rng.random() < 0.3:
                lease = rw.acquire_write(wait=30)
                history.enter("writer", asked, lease.fence, alone=("reader",))
                time.sleep(rng.uniform(0, 0.005))
                history.leave("writer")
            else:
                lease = rw.acquire_read(wait=30)
                with history.guard:
                    history.live["reader"] = history.live.get("reader", 0) + 1
                    readers_seen[0] = max(readers_seen[0], history.live["reader"])
                    if history.live.get("writer", 0):
                        history.violations.append("reader together with writer")
                    history.grants.append((asked, time.monotonic(), lease.fence))
                time.sleep(rng.uniform(0, 0.01))
                with history.guard:
                    history.live["reader"] -= 1
            lease.release()

    run_threads(6, worker, history)
    assert history.violations == []
    assert readers_seen[0] >= 2  # readers did share the lock
    assert history.fence_order_violations() == []


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_waiting_writer_stops_new_readers_and_gets_the_lock_when_they_leave(
    topologies: Any, make: Make, key: str, n: int
) -> None:
    rw = make("rwlock", topologies.urls(n), key, ttl=10)
    reader = rw.acquire_read(wait=0)
    got: list[Any] = []
    writer = threading.Thread(target=lambda: got.append(rw.acquire_write(wait=10)), daemon=True)
    writer.start()
    deadline = time.monotonic() + 5
    blocked = False
    while time.monotonic() < deadline and not blocked:
        time.sleep(0.05)
        late = rw.try_read()
        if late is None:
            blocked = True
        else:
            late.release()
    assert blocked, "a new reader entered while a writer waited"
    assert not got
    reader.release()
    writer.join(JOIN_S)
    assert got and got[0].fence > reader.fence
    assert rw.try_read() is None
    got[0].release()
    again = rw.acquire_read(wait=0)
    again.release()


def test_a_writer_granted_while_one_server_refused_it_leaves_no_intent_there(
    topologies: Any, make: Make, key: str
) -> None:
    """Simulation seed 336 (``rw_when_free``): over 5 servers, writers granted by a majority
    while the others still held the last writer's key left their intent markers there (a
    refusal sets one for up to its wait + 100 ms), and three such servers refused every
    reader for 1.5 s on a free lock. The writer's release now clears its own markers, on
    the servers that refused it too."""
    group = topologies.group(3)
    intent = rw_keys(key).intent
    stale = group.servers[2].client()
    # the last writer's key, which its release did not reach on this server
    stale.set(rw_keys(key).writer.lock, "an-earlier-writers-token", px=5000)
    rw = make("rwlock", group.urls, key, ttl=10)
    lease = rw.acquire_write(wait=3)  # granted by the other two, refused here
    assert stale.exists(intent) == 1, "the refusal set the writer's intent on the third"
    lease.release()
    assert stale.exists(intent) == 0, "the release cleared the writer's own intent"
    assert all(s.client().exists(intent) == 0 for s in group.servers)
    stale.delete(rw_keys(key).writer.lock)
    reader = rw.acquire_read(wait=0)  # every server takes a reader now
    reader.release()


@pytest.mark.parametrize("kind", ["reader", "permit"])
def test_a_waiter_granted_while_one_server_refused_it_leaves_no_registration_there(
    topologies: Any, make: Make, key: str, kind: str
) -> None:
    """The Lock's fix (tests/integration/test_waiter_registration.py) for a reader and a
    permit: granted by two servers while the third still held the last holder's key (its
    release not there yet), the acquire stays registered as a waiter there; its release
    removes that registration although it holds nothing there (simulation
    ``no_stale_registration``: a registration left makes that server's next release wake or
    hand the lock to nobody)."""
    group = topologies.group(3)
    stale = group.servers[2].client()
    if kind == "reader":
        held, waiters = rw_keys(key).writer.lock, rw_keys(key).writer.waiters
        take = make("rwlock", group.urls, key, ttl=10).acquire_read
    else:
        held, waiters = slot_keys(key, 0).lock, slot_keys(key, 0).waiters
        take = make("semaphore", group.urls, key, 1, ttl=10).acquire
    # the last holder's key, which its release did not reach on this server
    stale.set(held, "an-earlier-holders-token", px=5000)
    lease = take(wait=3)  # granted by the other two, refused here
    assert stale.zcard(waiters) == 1, "the refusal registered the waiter on the third"
    lease.release()
    assert stale.zcard(waiters) == 0, "the release removed its own registration there"
    assert all(s.client().zcard(waiters) == 0 for s in group.servers)
    stale.delete(held)


def test_a_reader_asking_for_write_waits_like_any_writer(
    topologies: Any, make: Make, key: str
) -> None:
    rw = make("rwlock", topologies.urls(1), key, ttl=10)
    with rw.read(wait=0) as lease:
        with pytest.raises(NotAcquired):
            rw.acquire_write(wait=0.3)
        assert lease.remaining() > 0
    with rw.write(wait=1) as lease:
        assert rw.try_read() is None
        assert rw.try_write() is None


def test_every_reader_expires_on_its_own(topologies: Any, key: str) -> None:
    rw = fencelock.RWLock(topologies.urls(1), key, ttl=0.4)
    short = rw.acquire_read(wait=0)
    time.sleep(0.25)
    longer = rw.acquire_read(wait=0)
    time.sleep(0.25)  # short has expired, longer has not
    with pytest.raises(LockLost):
        short.release()
    assert rw.try_write() is None
    longer.release()
    writer = rw.acquire_write(wait=0)
    assert writer.fence > longer.fence
    writer.release()


# -- Reentrant ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_the_same_thread_reenters_with_the_same_token_and_fence(
    topologies: Any, key: str, n: int
) -> None:
    client = fencelock.Client(topologies.urls(n), ttl=10)
    lock = client.lock(key, reentrant=True)
    other: list[Any] = []
    with lock.hold(wait=0) as outer:
        inner = client.lock(key, reentrant=True).acquire(wait=0)  # another object, same lock
        assert (inner.token, inner.fence, inner.depth) == (outer.token, outer.fence, 2)
        thread = threading.Thread(target=lambda: other.append(lock.try_acquire()), daemon=True)
        thread.start()
        thread.join(JOIN_S)
        assert other == [None]  # another owner is an ordinary contender
        inner.release()
        assert fencelock.Lock(topologies.urls(n), key).try_acquire() is None  # still held
    fresh = fencelock.Lock(topologies.urls(n), key).try_acquire()
    assert fresh is not None and fresh.fence > outer.fence
    fresh.release()


def test_an_explicit_owner_reenters_from_another_thread(topologies: Any, key: str) -> None:
    lock = fencelock.Lock(topologies.urls(1), key, ttl=10, reentrant=True, owner="job-7")
    outer = lock.acquire(wait=0)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(lock.acquire(wait=0)), daemon=True)
    thread.start()
    thread.join(JOIN_S)
    assert got[0].token == outer.token
    stranger = fencelock.Lock(topologies.urls(1), key, reentrant=True, owner="job-8")
    assert stranger.try_acquire() is None
    got[0].release()
    outer.release()
    assert stranger.try_acquire() is not None


def test_reentering_past_the_depth_limit_is_refused(
    topologies: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fencelock._frontend.reentry.MAX_DEPTH", 3)
    lock = fencelock.Lock(topologies.urls(1), key, reentrant=True)
    held = [lock.acquire(wait=0) for _ in range(3)]
    with pytest.raises(FencelockError, match="re-entered"):
        lock.acquire(wait=0)
    for lease in reversed(held):
        lease.release()
    assert MAX_DEPTH >= 100


def test_reentrant_owners_never_block_themselves_and_exclude_each_other(
    topologies: Any, key: str
) -> None:
    lock = fencelock.Lock(topologies.urls(3), key, ttl=10, reentrant=True)
    history = History(1)

    def worker(index: int) -> None:
        for _ in range(6):
            asked = time.monotonic()
            with lock.hold(wait=30) as outer:
                history.enter("holder", asked, outer.fence)
                with lock.hold(wait=0) as inner:  # wait=0: blocking itself would fail here
                    assert inner.fence == outer.fence
                    with lock:
                        pass
                history.leave("holder")

    run_threads(4, worker, history)
    assert history.violations == []
    assert history.fence_order_violations() == []


def test_the_same_task_reenters_and_another_task_contends(topologies: Any, key: str) -> None:
    async def main() -> None:
        client = fasync.Client(topologies.urls(3), ttl=10)
        lock = client.lock(key, reentrant=True)
        async with lock.hold(wait=0) as outer:
            async with lock.hold(wait=0) as inner:
                assert (inner.token, inner.fence) == (outer.token, outer.fence)
            assert await asyncio.create_task(lock.try_acquire()) is None
            assert not outer.lost.is_set() and outer.remaining() > 0
        lease = await asyncio.create_task(lock.acquire(wait=0))
        assert lease.fence > outer.fence
        await lease.release()

    asyncio.run(main())


# -- MultiLock ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_multilock_takes_all_keys_or_none(topologies: Any, make: Make, key: str, n: int) -> None:
    urls = topologies.urls(n)
    a, b = key + ":a", key + ":b"
    blocker = fencelock.Lock(urls, b, ttl=10).acquire(wait=0)
    multi = make("multilock", urls, [b, a], ttl=10)
    assert multi.try_acquire() is None
    with pytest.raises(NotAcquired):
        multi.acquire(wait=0.3)
    probe = fencelock.Lock(urls, a).try_acquire()
    assert probe is not None, "a key of a failed multilock was left held"
    probe.release()
    blocker.release()
    with multi.hold(wait=1) as leases:
        assert [lease.key for lease in leases] == [a, b]
        assert fencelock.Lock(urls, a).try_acquire() is None
        assert fencelock.Lock(urls, b).try_acquire() is None
    for name in (a, b):  # (wait: the release may have woken the waiter of the failed acquire)
        fencelock.Lock(urls, name).acquire(wait=1).release()


def test_overlapping_multilocks_do_not_deadlock(topologies: Any, key: str) -> None:
    client = fencelock.Client(topologies.urls(3), ttl=10)
    names = [key + s for s in [":a", ":b", ":c"]]
    orders = [[names[0], names[1]], [names[1], names[0]], [names[2], names[1]], names[::-1]]
    history = History(1)

    def worker(index: int) -> None:
        multi = client.multilock(orders[index % len(orders)])
        for _ in range(8):
            with multi.hold(wait=30) as leases:
                for lease in leases:
                    history.enter(lease.key, 0.0, lease.fence)
                for lease in leases:
                    history.leave(lease.key)

    run_threads(8, worker, history)
    assert history.violations == []


@pytest.mark.parametrize("keys", [[], ["a", "a"], "ab", [""], ["a", 3]])
def test_bad_multilock_keys_are_config_errors(keys: Any) -> None:
    with pytest.raises(ConfigError):
        fencelock.MultiLock("redis://127.0.0.1:1/0", keys)
    with pytest.raises(ConfigError):
        fencelock.Client("redis://127.0.0.1:1/0").multilock(keys)
