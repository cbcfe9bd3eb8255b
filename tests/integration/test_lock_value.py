"""What a held lock's key holds, on a real server: the token, then byte 255 and the holder
info (``_scripts/lock_value.lua``), so that a held lock is one key; and the layout of
fencelock 0.3 and older (the bare token, the holder info in a ``:holder`` key of its own) is
still read, extended and released, so that a rolling upgrade strands no lock.

The keys are written out by hand where a test plants a lock, as DESIGN.md names them.
"""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from api import LockFactory, front, lock_holder, lock_value, make_lock, our_keys  # noqa: F401

import fencelock
from fencelock import admin
from fencelock._core.holder_json import LOCK_VALUE_SEPARATOR, split_lock_value
from fencelock._core.keys import lock_keys
from fencelock._scripts import EXTEND
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
