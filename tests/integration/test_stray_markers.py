"""A hand-off marker (or a writer's intent) without a TTL does not block a lock for ever (issue
23, finding 4).

release.lua sets the hand-off marker with a PX of the hand-off window, so newcomers step aside
while a woken waiter takes the lock: since 0.4 the marker is the lock key's own empty value
(``_scripts/lock_value.lua``), before it the ``:handoff`` key. One without a TTL (restored from
a dump, persisted, written by hand) turned every newcomer away for ever while ``status`` said
the lock was free, and ``release --force`` left it. Now the acquire scripts take a marker with
no TTL like a free lock instead of obeying it, ``force_release`` deletes it, and ``status``
shows it. The same for a read-write lock's writer-intent marker, which keeps readers out. A
0.3 ``:handoff`` key is no longer obeyed (a newcomer may then take the lock before the waiter
a 0.3 release woke: its turn, not its safety); ``status`` still shows it and
``force_release`` still deletes it.
"""

# ruff: noqa: F811  (fixtures imported from the api modules, then named as test parameters)

from __future__ import annotations

from typing import Any

import pytest
from api import front  # noqa: F401
from family_api import Make, make  # noqa: F401

import fencelock
from fencelock import admin
from fencelock._core.keys import lock_keys, rw_keys, slot_keys

TOPOLOGIES = [pytest.param(1, id="n1"), pytest.param(3, id="n3")]


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_lock_with_a_handoff_marker_without_ttl_is_granted(
    topologies: Any, make: Make, front: str, key: str, n: int
) -> None:
    servers = topologies.group(n).servers
    for server in servers:
        server.client().set(lock_keys(key).lock, "")  # the marker, with no TTL
    lock = make("lock", topologies.urls(n), key, ttl=10.0)
    lease = lock.acquire(wait=0)
    assert lease.fence > 0
    lease.release()
    assert not any(s.client().exists(lock_keys(key).lock) for s in servers)


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_semaphore_slot_with_a_handoff_marker_without_ttl_is_granted(
    topologies: Any, make: Make, front: str, key: str, n: int
) -> None:
    servers = topologies.group(n).servers
    for server in servers:
        server.client().set(slot_keys(key, 0).lock, "")  # no TTL, on the only slot
    sem = make("semaphore", topologies.urls(n), key, 1, ttl=10.0)
    permit = sem.acquire(wait=0)
    assert permit.slot == 0
    permit.release()
    assert not any(s.client().exists(slot_keys(key, 0).lock) for s in servers)


def test_a_live_semaphore_marker_keeps_its_slot_for_a_woken_waiter(
    fencelock_server: Any, key: str
) -> None:
    client = fencelock_server.client()
    client.set(slot_keys(key, 0).lock, "", px=30_000)
    sem = fencelock.Client(fencelock_server.url, ttl=10.0).semaphore(key, limit=2)
    permit = sem.acquire(wait=0)
    assert permit.slot == 1  # slot 0 is kept for the waiter the release woke
    assert sem.try_acquire() is None
    assert client.get(slot_keys(key, 0).lock) == b""
    permit.release()


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_reader_enters_past_a_writer_intent_without_ttl(
    topologies: Any, make: Make, front: str, key: str, n: int
) -> None:
    servers = topologies.group(n).servers
    for server in servers:
        server.client().set(rw_keys(key).intent, "w-gone")  # no TTL, no writer waiting
    rw = make("rwlock", topologies.urls(n), key, ttl=10.0)
    lease = rw.acquire_read(wait=0)
    lease.release()
    assert not any(s.client().exists(rw_keys(key).intent) for s in servers)


def test_a_live_handoff_marker_is_still_obeyed(fencelock_server: Any, key: str) -> None:
    """The repair does not touch a marker with a TTL: a newcomer steps aside for it."""
    client = fencelock_server.client()
    client.set(lock_keys(key).lock, "", px=30_000)
    lock = fencelock.Lock(fencelock_server.url, key, ttl=10.0)
    assert lock.try_acquire() is None
    assert client.get(lock_keys(key).lock) == b"" and client.pttl(lock_keys(key).lock) > 0


@pytest.mark.parametrize("where", ["value", "0.3 key"])
def test_status_shows_a_handoff_marker_and_force_release_removes_it(
    fencelock_server: Any, key: str, where: str
) -> None:
    client = fencelock_server.client()
    marker = lock_keys(key).lock if where == "value" else lock_keys(key).handoff
    client.set(marker, "" if where == "value" else "1")  # no TTL
    (row,) = admin.status(fencelock_server.url, key)["servers"]
    assert row["held"] is False and row["token_prefix"] is None
    assert "handoff_ttl_s" in row and row["handoff_ttl_s"] is None
    result = admin.force_release(fencelock_server.url, key)
    assert result.ok
    assert client.exists(marker) == 0
    (row,) = admin.status(fencelock_server.url, key)["servers"]
    assert "handoff_ttl_s" not in row
    # with a TTL: the seconds left
    client.set(marker, "" if where == "value" else "1", px=30_000)
    (row,) = admin.status(fencelock_server.url, key)["servers"]
    assert row["held"] is False and 0 < row["handoff_ttl_s"] <= 30.0
    client.delete(marker)
    # a held lock, force-released, takes a 0.3 marker with it
    client.set(lock_keys(key).lock, "someone", px=30_000)
    client.set(lock_keys(key).handoff, "1", px=30_000)
    result = admin.force_release(fencelock_server.url, key)
    assert [o.outcome for o in result.servers] == ["deleted"]
    assert client.exists(lock_keys(key).lock, lock_keys(key).handoff) == 0


def test_a_handoff_marker_is_nobodys_lock(fencelock_server: Any, key: str) -> None:
    """No token releases, extends or fences with the marker (a token is never empty), and an
    election reads it as nobody leading."""
    client = fencelock_server.client()
    client.set(lock_keys(key).lock, "", px=30_000)
    assert [o.outcome for o in admin.release(fencelock_server.url, key, "x").servers] == [
        "not-held"
    ]
    election = fencelock.Client(fencelock_server.url, ttl=10.0).election(key, name="n")
    assert election.leader() is None
    assert client.get(lock_keys(key).lock) == b""
