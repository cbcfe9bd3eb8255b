"""Redlock over 3 and 5 independent real servers, both front ends (see ``api.py``)."""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from api import LockFactory, front, lock_value, make_lock, our_keys  # noqa: F401

import fencelock
from fencelock import ConfigError, NotAcquired, Unavailable
from fencelock._core.effects import NotSent
from fencelock._core.keys import lock_keys
from fencelock.testing import ServerGroup

OTHER = "another-holders-token"


def _majority(n: int) -> int:
    return n // 2 + 1


def _assert_nothing_of_ours(group: ServerGroup, key: str, occupied: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    for i, server in enumerate(group.servers):
        if not server.is_running:
            continue
        client = server.client()
        keys = our_keys(client, key)
        assert ":holder" not in keys, (i, keys)
        if i in occupied:
            assert lock_value(client, key) == OTHER
        else:
            assert "<lock>" not in keys, (i, keys)


@pytest.mark.parametrize("n", [3, 5])
def test_every_occupied_subset(topologies: Any, make_lock: LockFactory, key: str, n: int) -> None:
    """For each set of servers held by another holder, acquire(wait=0) succeeds exactly when
    the free servers are a majority; failures are contention with one vote per server."""
    group = topologies.group(n)
    clients = [s.client() for s in group.servers]
    for mask in range(2**n):
        name = f"{key}:m{mask}"
        occupied = {i for i in range(n) if mask >> i & 1}
        for i in occupied:
            clients[i].set(lock_keys(name).lock, OTHER, px=10_000)
        lock = make_lock(group.urls, name, ttl=10)
        free = n - len(occupied)
        if free >= _majority(n):
            lease = lock.acquire(wait=0)
            assert lease.valid
            mine = [i for i in range(n) if lock_value(clients[i], name) == lease.token]
            assert len(mine) >= _majority(n) and not set(mine) & occupied
            lease.release()
            _assert_nothing_of_ours(group, name, occupied)
        else:
            with pytest.raises(NotAcquired) as info:
                lock.acquire(wait=0)
            err = info.value
            assert not isinstance(err, Unavailable)
            assert [v.outcome for v in err.votes] == [
                "held" if i in occupied else "granted" for i in range(n)
            ]
            assert [v.server for v in err.votes] == lock.servers
            assert f"{free}/{n} servers agreed, majority is {_majority(n)}" in str(err)
            _assert_nothing_of_ours(group, name, occupied)
        for i in occupied:
            assert lock_value(clients[i], name) == OTHER  # never touched
            clients[i].delete(lock_keys(name).lock)


#: Long enough for the background probe to see a restarted server again (probes start 50 ms
#: after a failure and back off to 0.5 s); a bound, not a speed assertion.
PROBE_WAIT = 2.0


def _is_down(vote: Any, mask: int, servers: list[str]) -> bool:
    return bool(mask >> servers.index(vote.server) & 1)


def _gray(n: int) -> list[int]:
    return [i ^ (i >> 1) for i in range(2**n)]


@pytest.mark.parametrize("n", [3, 5])
def test_every_down_subset(
    fencelock_servers: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    """For each set of killed servers: success iff the live ones are a majority; otherwise
    Unavailable (not NotAcquired), and nothing of ours is left on the live ones. Masks are
    visited in Gray-code order so each step kills or restarts exactly one server.

    A server that refused a connection is suspect until a background probe sees it again
    (first probe after 50 ms), so an acquire right after a restart is given a short wait."""
    group = fencelock_servers(n)
    for mask in _gray(n):
        for i, server in enumerate(group.servers):
            down = bool(mask >> i & 1)
            if down and server.is_running:
                server.kill()
            elif not down and not server.is_running:
                server.restart()
        name = f"{key}:d{mask}"
        alive = n - bin(mask).count("1")
        # restart_delay off: a server restarted a moment ago is to vote here (with it on it
        # would not for a ttl; tests/faults/test_restart_delay.py covers that)
        lock = make_lock(group.urls, name, ttl=10, server_timeout=0.2, restart_delay=False)
        start = time.monotonic()
        if alive >= _majority(n):
            lease = lock.acquire(wait=PROBE_WAIT)
            assert lease.valid
            lease.release()
        else:
            # a server restarted a moment ago may still be suspect (not asked): ask again
            # until the probe has seen it, within PROBE_WAIT
            until = time.monotonic() + PROBE_WAIT
            while True:
                with pytest.raises(Unavailable) as info:
                    lock.acquire(wait=0)
                suspect = [v for v in info.value.votes if isinstance(v.cause, NotSent)]
                alive_suspect = [v for v in suspect if not _is_down(v, mask, lock.servers)]
                if not alive_suspect or time.monotonic() > until:
                    break
                time.sleep(0.02)
            err = info.value
            assert not isinstance(err, NotAcquired)
            assert len(err.votes) == n
            for i, vote in enumerate(err.votes):
                assert vote.outcome == ("error" if mask >> i & 1 else "granted"), err.votes
            assert set(err.causes) == {lock.servers[i] for i in range(n) if mask >> i & 1}
            assert f"{alive}/{n} servers agreed, majority is {_majority(n)}" in str(err)
        assert time.monotonic() - start < 5.0
        _assert_nothing_of_ours(group, name)


def test_kill_two_of_five(fencelock_servers: Any, make_lock: LockFactory, key: str) -> None:
    group = fencelock_servers(5)
    group.servers[0].kill()
    group.servers[3].kill()
    live = [group.servers[i].client() for i in (1, 2, 4)]
    ttl = 0.6
    lock = make_lock(group.urls, key, ttl=ttl, server_timeout=0.1)
    lease = lock.acquire(wait=1)
    assert all(lock_value(c, key) == lease.token for c in live)
    lease.extend(5)
    assert all(4000 < c.pttl(lock_keys(key).lock) <= 5000 for c in live)
    assert lease.remaining() > 4
    lease.release()
    assert all(lock_value(c, key) is None for c in live)
    # renewal keeps it for 3 x ttl with two servers down
    with lock.hold(wait=1, renew=True) as held:
        deadline = time.monotonic() + 3 * ttl
        while time.monotonic() < deadline:
            assert held.valid and not held.lost.is_set()
            assert all(lock_value(c, key) == held.token for c in live)
            time.sleep(0.05)
    assert all(lock_value(c, key) is None for c in live)
    # a third server down: no majority can answer
    group.servers[4].kill()
    start = time.monotonic()
    with pytest.raises(Unavailable) as info:
        lock.acquire(wait=1)
    assert time.monotonic() - start < 1 + 2.0
    assert len(info.value.causes) == 3


@pytest.mark.parametrize("n", [3, 5])
def test_one_paused_server_does_not_stall(
    fencelock_servers: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    group = fencelock_servers(n)
    lock = make_lock(group.urls, key, ttl=5, server_timeout=0.2)
    lock.acquire(wait=0).release()  # connections open before the pause
    group.servers[0].pause()
    try:
        start = time.monotonic()
        lease = lock.acquire(wait=0)
        took = time.monotonic() - start
        assert lease.valid and lease.remaining() > 3
        lease.release()
        assert took < 2.0, took
    finally:
        group.servers[0].resume()


@pytest.mark.parametrize("n", [3, 5])
def test_majority_grant_fails_when_the_round_outlives_the_lease(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    """Validity = ttl - elapsed - drift: with the drift taking all but 1 ns of the lease, any
    real round is too slow, so even a full grant must fail (and be cleaned up)."""
    group = topologies.group(n)
    lock = make_lock(group.urls, key, ttl=1.0, drift_factor=0.0, drift_min=1.0 - 1e-9)
    with pytest.raises(Unavailable) as info:
        lock.acquire(wait=0)
    err = info.value
    assert sum(v.outcome == "granted" for v in err.votes) >= _majority(n)
    assert "outlived the lease" in str(err)
    _assert_nothing_of_ours(group, key)
    with pytest.raises(Unavailable):
        lock.try_acquire()


def _wait_clean(group: ServerGroup, key: str, timeout: float) -> None:
    """A server resumed after a pause may apply the SET it received while frozen (after the
    client gave up on it), leaving a key until its TTL: wait for such keys to expire."""
    deadline = time.monotonic() + timeout
    while any(lock_value(s.client(), key) for s in group.servers if s.is_running):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_fences_grow_across_different_majorities_and_wipes(
    fencelock_servers: Any, make_lock: LockFactory, key: str
) -> None:
    group = fencelock_servers(5)
    ttl = 0.5
    lock = make_lock(group.urls, key, ttl=ttl, server_timeout=0.1)
    lock.acquire(wait=0).release()
    fences: list[int] = []
    majorities: set[frozenset[int]] = set()
    for rnd in range(6):
        if rnd == 3:  # a crash without persistence in the middle
            group.servers[2].kill()
            group.servers[2].restart(wipe=True)
            assert group.servers[2].client().get(lock_keys(key).fence) is None
        paused = {rnd % 5, (rnd + 2) % 5}
        for i in paused:
            group.servers[i].pause()
        try:
            lease = lock.acquire(wait=3)
            holders = frozenset(
                i for i in range(5)
                if i not in paused and lock_value(group.servers[i].client(), key) == lease.token
            )  # fmt: skip
            assert len(holders) == 3  # exactly the three running servers granted
            majorities.add(holders)
            fences.append(lease.fence)
            lease.release()
        finally:
            for i in paused:
                group.servers[i].resume()
        _wait_clean(group, key, ttl + 2.0)
    assert len(majorities) >= 5
    assert all(a < b for a, b in itertools.pairwise(fences)), fences


def test_same_server_twice_by_run_id(
    fencelock_servers: Any, make_lock: LockFactory, key: str
) -> None:
    group = fencelock_servers(2)
    first = group.servers[0]
    urls = [first.url.replace("@127.0.0.1:", "@localhost:"), first.url, group.urls[1]]
    lock = make_lock(urls, key, ttl=5)
    for _ in range(2):  # refused every time, not only the first
        with pytest.raises(ConfigError) as info:
            lock.acquire(wait=0)
        assert "same server" in str(info.value)
    with pytest.raises(ConfigError):
        lock.try_acquire()
    for server in group.servers:
        assert our_keys(server.client(), key) == {}  # nothing was sent


def test_replica_as_a_node(fencelock_servers: Any, make_lock: LockFactory, key: str) -> None:
    group = fencelock_servers(4)
    master, replica = group.servers[0], group.servers[1]
    replica.client().config_set("masterauth", master.password)
    replica.client().replicaof(master.host, master.port)
    lock = make_lock([replica.url, group.urls[2], group.urls[3]], key, ttl=5)
    with pytest.raises(ConfigError) as info:
        lock.acquire(wait=0)
    assert "replica" in str(info.value)
    for server in group.servers[2:]:
        assert our_keys(server.client(), key) == {}


@pytest.mark.parametrize("n", [2, 4])
def test_even_or_small_n_warns(topologies: Any, n: int) -> None:
    urls = [*topologies.urls(5)][:n]
    with pytest.warns(UserWarning, match="odd number"):
        fencelock.Lock(urls, "k", ttl=5).close()


@pytest.mark.parametrize("n", [3, 5])
def test_errors_carry_evidence(topologies: Any, make_lock: LockFactory, key: str, n: int) -> None:
    group = topologies.group(n)
    holder = make_lock(group.urls, key, ttl=10)
    lease = holder.acquire(wait=0)
    with pytest.raises(NotAcquired) as info:
        make_lock(group.urls, key, ttl=10).acquire(wait=0.2)
    err = info.value
    assert err.key == key and err.attempts >= 1
    assert len(err.votes) == n and [v.server for v in err.votes] == holder.servers
    assert all(v.outcome == "held" and 0 < v.pttl_ms <= 10_000 for v in err.votes)
    text = str(err)
    assert f"'{key}': 0/{n} servers agreed, majority is {_majority(n)}" in text
    assert all(name in text for name in holder.servers)
    lease.release()


def test_independence_is_checked_once_an_unreachable_server_is_back(
    fencelock_servers: Any, make_lock: LockFactory, key: str
) -> None:
    """A server down at the first acquire cannot be checked then; it must be checked when it
    answers again, not skipped for good (else one server listed twice votes twice)."""
    group = fencelock_servers(2)
    first = group.servers[0]
    urls = [first.url.replace("@127.0.0.1:", "@localhost:"), first.url, group.urls[1]]
    lock = make_lock(urls, key, ttl=5, server_timeout=0.2)
    group.servers[0].kill()
    with pytest.raises(Unavailable):
        lock.acquire(wait=0)
    group.servers[0].restart()
    with pytest.raises(ConfigError):  # once the probe has seen it back (within PROBE_WAIT)
        lease = lock.acquire(wait=PROBE_WAIT)
        lease.release()
