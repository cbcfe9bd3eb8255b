"""The fence register's retention (issue 26 §4): a key used once costs its server nothing after
``fence_retention``, and fences keep growing across the register's expiry.

Every grant (and every N-server commit that raises a register) stores the register with a
``PX`` of the retention, but only while its fence is at most half the retention ahead of the
server's clock: after the expiry the ``TIME`` floor alone is then larger. A register further
ahead (set by hand) is kept for ever.
"""

# ruff: noqa: F811  (fixtures imported from the api modules, then named as test parameters)

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from api import front  # noqa: F401
from family_api import Make, make  # noqa: F401
from test_exact_fences import PRIMITIVES, TOPOLOGIES, _granter

import fencelock
from fencelock import ConfigError
from fencelock._core.keys import lock_keys
from fencelock._scripts import BY_NAME
from fencelock.options import FENCE_RETENTION

BOUND_S = 20.0  # liveness bound of a wait for an expiry (never a speed assertion)


def _pttls(servers: list[Any], name: str) -> list[int]:
    return [int(server.client().pttl(lock_keys(name).fence)) for server in servers]


@pytest.mark.parametrize("n", TOPOLOGIES)
@pytest.mark.parametrize("kind", PRIMITIVES)
def test_every_grant_keeps_the_register_for_the_retention(
    topologies: Any, make: Make, front: str, key: str, kind: str, n: int
) -> None:
    urls, servers = topologies.urls(n), topologies.group(n).servers
    grant = _granter(kind, make, urls, key, front, fence_retention=60.0)
    grant()
    kept = [p for p in _pttls(servers, key) if p != -2]  # -2: a server the round did not reach
    assert len(kept) >= n // 2 + 1
    assert all(0 < p <= 60_000 for p in kept), kept


def test_the_default_retention_is_seven_days(topologies: Any, key: str) -> None:
    (server,) = topologies.group(1).servers
    lock = fencelock.Lock(topologies.urls(1), key, ttl=10.0)
    lock.acquire(wait=0).release()
    assert FENCE_RETENTION == 7 * 24 * 3600.0
    (pttl,) = _pttls([server], key)
    assert FENCE_RETENTION * 1000 - 60_000 < pttl <= FENCE_RETENTION * 1000


def test_no_retention_keeps_the_register_for_ever(topologies: Any, key: str) -> None:
    (server,) = topologies.group(1).servers
    lock = fencelock.Lock(topologies.urls(1), key, ttl=10.0, fence_retention=None)
    lock.acquire(wait=0).release()
    assert _pttls([server], key) == [-1]


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_after_the_retention_the_register_is_gone_and_fences_still_grow(
    topologies: Any, key: str, n: int
) -> None:
    urls, servers = topologies.urls(n), topologies.group(n).servers
    lock = fencelock.Lock(urls, key, ttl=1.0, fence_retention=1.0)
    first = lock.acquire(wait=0)
    first.release()
    deadline = time.monotonic() + BOUND_S
    while any(server.client().exists(lock_keys(key).fence) for server in servers):
        assert time.monotonic() < deadline, "the fence register outlived its retention"
        time.sleep(0.1)
    second = lock.acquire(wait=0)
    second.release()
    assert second.fence > first.fence  # the TIME floor alone


def test_a_register_far_ahead_of_the_clock_is_kept_for_ever(topologies: Any, key: str) -> None:
    # 10 s ahead of the server's clock, with a retention of 4 s: if it expired, the TIME floor
    # would issue fences below it for another 6 s
    (server,) = topologies.group(1).servers
    seconds, micros = server.client().time()
    ahead = seconds * 1_000_000 + micros + 10_000_000
    server.client().set(lock_keys(key).fence, str(ahead))
    lock = fencelock.Lock(topologies.urls(1), key, ttl=1.0, fence_retention=4.0)
    lease = lock.acquire(wait=0)
    lease.release()
    assert lease.fence == ahead + 1
    assert _pttls([server], key) == [-1]


def test_a_register_within_half_the_retention_gets_it(topologies: Any, key: str) -> None:
    (server,) = topologies.group(1).servers
    seconds, micros = server.client().time()
    ahead = seconds * 1_000_000 + micros + 1_000_000  # 1 s ahead; half the retention is 30 s
    server.client().set(lock_keys(key).fence, str(ahead))
    lock = fencelock.Lock(topologies.urls(1), key, ttl=1.0, fence_retention=60.0)
    lease = lock.acquire(wait=0)
    lease.release()
    assert lease.fence == ahead + 1
    (pttl,) = _pttls([server], key)
    assert 0 < pttl <= 60_000


@pytest.mark.parametrize("commit", ["fence_commit", "sem_fence_commit"])
def test_a_commit_that_raises_a_register_keeps_it_for_the_retention(
    fencelock_server: Any, key: str, commit: str
) -> None:
    client = fencelock_server.client()
    k = lock_keys(key)
    seconds, micros = client.time()
    fence = seconds * 1_000_000 + micros
    client.set(k.lock, "tok", px=10_000)
    script = BY_NAME[commit]
    client.eval(script.source, 2, k.lock, k.fence, "tok", str(fence), "60000")
    assert client.get(k.fence) == str(fence).encode()
    assert 0 < int(client.pttl(k.fence)) <= 60_000


@pytest.mark.parametrize(
    ("retention", "ttl", "match"),
    [
        (0.5, 0.1, "at least the ttl"),  # below the 1 s minimum
        (5.0, 10.0, "at least the ttl"),  # below the ttl
        (-1.0, 1.0, "fence_retention"),
        (0, 1.0, "fence_retention"),
        ("7d", 1.0, "fence_retention"),
        (float("inf"), 1.0, "fence_retention"),
    ],
)
def test_a_bad_retention_is_a_config_error(retention: Any, ttl: float, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fencelock.Lock("redis://127.0.0.1:1", "k", ttl=ttl, fence_retention=retention)
    with pytest.raises(ConfigError, match=match):
        fencelock.Client("redis://127.0.0.1:1", ttl=ttl, fence_retention=retention)


def test_the_default_retention_grows_to_a_longer_ttl() -> None:
    lock = fencelock.Lock("redis://127.0.0.1:1", "k", ttl=30 * 24 * 3600.0)
    assert lock.options.fence_retention == 30 * 24 * 3600.0


def test_a_retention_may_be_a_timedelta() -> None:
    lock = fencelock.Lock("redis://127.0.0.1:1", "k", ttl=1.0, fence_retention=timedelta(hours=1))
    assert lock.options.fence_retention == 3600.0
