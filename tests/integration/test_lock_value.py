"""What a held lock's key holds, on a real server: the token, then byte 255 and the holder
info (``_scripts/lock_value.lua``), so that a held lock is one key; and the layout of
fencelock 0.3 and older (the bare token, the holder info in a ``:holder`` key of its own) is
still read, extended and released, so that a rolling upgrade strands no lock.

The keys are written out by hand where a test plants a lock, as DESIGN.md names them.
"""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from api import LockFactory, command_counts, front, lock_holder, lock_value, make_lock, our_keys  # noqa: F401

import fencelock
from fencelock import admin
from fencelock._core.holder_json import (
    LOCK_VALUE_SEPARATOR,
    LOCK_VALUE_WAITERS_SEPARATOR,
    split_lock_value,
)
from fencelock._core.keys import lock_keys, slot_keys
from fencelock._scripts import BY_NAME, EXTEND
from fencelock.testing import Server


@pytest.fixture
def server(fencelock_session_server: Server) -> Server:
    return fencelock_session_server


@pytest.fixture
def client(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


def _extend(client: redis.Redis, name: str, token: str, ms: int) -> Any:
    """extend.lua once, as the library runs it."""
    return client.eval(EXTEND.source, 1, lock_keys(name).lock, token, ms)


def test_a_held_lock_is_one_key_holding_its_token_and_holder_info(
    server: Server, client: redis.Redis, make_lock: LockFactory, key: str
) -> None:
    lease = make_lock(server.url, key, ttl=30, purpose="nightly report").acquire(wait=0)
    raw = client.get(lock_keys(key).lock)
    assert raw is not None and raw.count(LOCK_VALUE_SEPARATOR) == 1
    token, info = split_lock_value(raw)
    assert info is not None
    assert token == lease.token.encode()
    holder = json.loads(info)
    assert holder["pid"] == os.getpid() and holder["purpose"] == "nightly report"
    assert set(our_keys(client, key)) == {"<lock>", ":fence"}
    row = admin.status(server.url, key)["servers"][0]
    assert row["token_prefix"] == lease.token[:8]
    assert row["holder"] is not None and row["holder"]["pid"] == os.getpid()
    lease.extend(20)
    assert 15_000 < client.pttl(lock_keys(key).lock) <= 20_000
    assert client.get(lock_keys(key).lock) == raw  # an extend keeps the value as it is
    lease.release()
    assert set(our_keys(client, key)) == {":fence"}


def test_without_holder_info_the_value_is_the_bare_token(
    server: Server, client: redis.Redis, key: str
) -> None:
    lease = fencelock.Lock(server.url, key, ttl=30, holder_info=False).acquire(wait=0)
    assert client.get(lock_keys(key).lock) == lease.token.encode()
    assert admin.status(server.url, key)["servers"][0]["holder"] is None
    lease.release()
    assert lock_value(client, key) is None


def test_a_lock_written_by_fencelock_0_3_is_read_extended_and_released(
    server: Server, client: redis.Redis, key: str
) -> None:
    """0.3 kept the bare token in the lock key and the holder info in ``:holder``: a newer
    process can still see who holds it, and its holder (or an operator) can still end it."""
    token = "ab" * 20
    client.set(lock_keys(key).lock, token, px=60_000)
    client.set(lock_keys(key).holder, '{"host":"old","pid":7}', px=60_000)
    row = admin.status(server.url, key)["servers"][0]
    assert row["token_prefix"] == token[:8] and row["holder"] == {"host": "old", "pid": 7}
    assert _extend(client, key, token, 45_000) == 1
    assert 40_000 < client.pttl(lock_keys(key).lock) <= 45_000
    assert fencelock.Lock(server.url, key, ttl=5).try_acquire() is None  # still held
    result = admin.release(server.url, key, token)
    assert [one.outcome for one in result.servers] == ["released"]
    assert client.exists(lock_keys(key).lock, lock_keys(key).holder) == 0  # both keys go


def test_a_prefix_of_the_holders_token_is_not_its_token(
    server: Server, client: redis.Redis, key: str
) -> None:
    lease = fencelock.Lock(server.url, key, ttl=30).acquire(wait=0)
    for wrong in (lease.token[:-1], lease.token[:8], lease.token + "0"):
        assert _extend(client, key, wrong, 45_000) == 0
        assert [o.outcome for o in admin.release(server.url, key, wrong).servers] == ["not-held"]
    assert lock_value(client, key) == lease.token
    lease.release()


def test_force_release_reports_the_holder_info_from_the_value(
    server: Server, client: redis.Redis, key: str
) -> None:
    lease = fencelock.Lock(server.url, key, ttl=30, purpose="stuck job").acquire(wait=0)
    result = admin.force_release(server.url, key)
    [one] = result.servers
    assert one.outcome == "deleted" and one.token_prefix == lease.token[:8]
    assert one.holder is not None and "stuck job" in one.holder
    assert set(our_keys(client, key)) == {":fence"}


def test_a_leaders_name_and_term_go_into_its_lock_value(
    server: Server, client: redis.Redis, key: str
) -> None:
    election = fencelock.Client(server.url, ttl=30.0).election(key, name="scheduler-1")
    with election.campaign(wait=2) as term:
        info = json.loads(lock_holder(client, key) or "{}")
        assert info["leader"] == "scheduler-1" and info["term"] == term.fence
        assert lock_value(client, key) == term.token
        assert 0 < client.pttl(lock_keys(key).lock) <= 30_000  # the announcement kept the lease
        leader = election.leader()
        assert leader is not None and leader.term == ("scheduler-1", term.fence)
    assert election.leader() is None


# -- the waiters' mark: byte 254 in place of 255 (lock_value.lua) ----------------------------

WAIT_S = 10.0  # a waiter's patience: unwoken, it would sleep until about then
WOKEN_S = 4.0  # well under WAIT_S: only a wake gets a waiter the lock this soon


def test_an_uncontended_release_does_not_look_for_waiters(
    server: Server, client: redis.Redis, make_lock: LockFactory, key: str
) -> None:
    lock = make_lock(server.url, key, ttl=30)
    lock.acquire(wait=0).release()  # scripts loaded, connection made
    client.config_resetstat()
    lock.acquire(wait=0).release()
    calls = command_counts(client)
    assert "exists" not in calls, calls  # the value carried no mark: nobody to wake
    # TIME, SET NX, SET ... GET of the register; GET, DEL; the two EVALSHAs (and our own
    # CONFIG RESETSTAT and INFO)
    ours = {"info", "config", "config|resetstat"}
    assert sum(n for name, n in calls.items() if name not in ours) == 7, calls


def _wait_in_thread(lock: Any, results: dict[str, float]) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        lease = lock.acquire(wait=WAIT_S)
        results[lease.token] = time.monotonic() - started
        time.sleep(0.05)
        lease.release()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _on_all(servers: list[Server], key: str) -> list[bytes | None]:
    values = []
    for one in servers:
        with contextlib.closing(one.client()) as c:
            values.append(c.get(lock_keys(key).lock))
    return values


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("holder_info", [True, False])
def test_waiters_mark_the_holders_value_and_each_release_wakes_the_next(
    topologies: Any, key: str, holder_info: bool, n: int
) -> None:
    """Two callers wait on a held lock: each marks the value (a bare token carries no mark:
    its release looks for waiters anyway). The holder's release wakes one: on one server it
    hands the lock over (the claimer's value is a bare token), on three it wakes a waiter who
    takes the lock with its own acquire and, the other one still waiting, marks its value, so
    that its release wakes the other. Unwoken, a waiter would sleep until its patience ends
    (WAIT_S)."""
    urls, servers = topologies.urls(n), topologies.group(n).servers

    def lock() -> fencelock.Lock:
        return fencelock.Lock(urls, key, ttl=30, holder_info=holder_info)

    holder = lock().acquire(wait=0)
    results: dict[str, float] = {}
    waiters = [_wait_in_thread(lock(), results) for _ in range(2)]
    deadline = time.monotonic() + WOKEN_S
    with contextlib.closing(servers[0].client()) as client:
        while client.zcard(lock_keys(key).waiters) < 2:
            assert time.monotonic() < deadline, "the waiters never registered"
            time.sleep(0.01)
    for raw in _on_all(servers, key):
        if holder_info:
            assert raw is not None
            assert raw.startswith(holder.token.encode() + LOCK_VALUE_WAITERS_SEPARATOR), raw
        else:
            assert raw == holder.token.encode()  # a bare token is not marked
    if holder_info:
        row = admin.status(urls, key)["servers"][0]  # the holder info still reads
        assert row["holder"] is not None and row["holder"]["pid"] == os.getpid()
    holder.release()
    for thread in waiters:
        thread.join(WAIT_S + 5)
    assert len(results) == 2 and max(results.values()) < WOKEN_S, results
    # nothing stays held: a server where a waiter's registration outlived its grant elsewhere
    # may hold the hand-off marker (the empty value) for its window, then nothing
    deadline = time.monotonic() + WOKEN_S
    while (left := _on_all(servers, key)) != [None] * n:
        assert set(left) <= {None, b""} and time.monotonic() < deadline, left
        time.sleep(0.02)


@pytest.mark.parametrize("n", [1, 3])
def test_a_permits_release_wakes_a_semaphore_waiter(topologies: Any, key: str, n: int) -> None:
    """The semaphore registers its waiters without marking a slot, so a permit's value is
    marked from its grant: a permit's release (release.lua, on its slot) always looks for
    them. Unwoken, the waiter would sleep until its patience ends (WAIT_S)."""
    urls, servers = topologies.urls(n), topologies.group(n).servers

    def semaphore() -> fencelock.Semaphore:
        return fencelock.Semaphore(urls, key, 1, ttl=30)

    held = semaphore().acquire(wait=0)
    results: dict[str, float] = {}
    waiter = _wait_in_thread(semaphore(), results)
    deadline = time.monotonic() + WOKEN_S
    with contextlib.closing(servers[0].client()) as client:
        while client.zcard(lock_keys(key).waiters) < 1:
            assert time.monotonic() < deadline, "the waiter never registered"
            time.sleep(0.01)
        raw = client.get(slot_keys(key, held.slot).lock)
    held.release()
    waiter.join(WAIT_S + 5)
    assert len(results) == 1 and max(results.values()) < WOKEN_S, results
    assert raw is not None and raw.startswith(held.token.encode() + LOCK_VALUE_WAITERS_SEPARATOR)


def test_a_leaders_announcement_keeps_the_waiters_mark(
    server: Server, client: redis.Redis, key: str
) -> None:
    k = lock_keys(key)
    script = BY_NAME["elect_announce"]
    info = '{"leader":"a","term":1}'
    for planted, expected_separator in (
        (b"tok\xfe{}", LOCK_VALUE_WAITERS_SEPARATOR),  # marked: kept
        (b"tok", LOCK_VALUE_WAITERS_SEPARATOR),  # bare: could not carry one, so marked
        (b"tok\xff{}", LOCK_VALUE_SEPARATOR),  # unmarked: stays so
    ):
        client.set(k.lock, planted, px=30_000)
        assert client.eval(script.source, 3, k.lock, k.holder, k.observers, "tok", info, 1000) == 1
        assert client.get(k.lock) == b"tok" + expected_separator + info.encode()
        assert client.eval(EXTEND.source, 1, k.lock, "tok", 20_000) == 1  # still the holder's
    client.delete(k.lock)
