"""``fencelock.admin`` on real servers: status, release by token, force release.

The lock keys are written out as DESIGN.md fixes them (not taken from the library). Timing is
asserted only as a generous bound relative to the admin timeout (no client-side retries).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from fencelock import ConfigError, Lock, LockLost, admin
from fencelock._core.holder_json import lock_token
from fencelock.testing import Server, ServerGroup

BASE = 1_800_000_000_000_000  # fences look like server TIME in microseconds
STATUS_FIELDS = {"server", "held", "token_prefix", "ttl_s", "holder", "fence", "error"}


def lock_key(name: str) -> str:
    return f"fencelock:{{{name}}}"


def plant(group: ServerGroup, name: str, token: str, fences: list[int]) -> None:
    """Write a holder's keys on every server by hand (as a granted acquire leaves them), so
    these tests do not depend on where a Redlock acquire has landed by the time they look."""
    for server, fence in zip(group, fences, strict=True):
        with server.client() as c:
            c.set(lock_key(name), token, px=60_000)
            c.set(lock_key(name) + ":holder", '{"host":"h","pid":1}', px=60_000)
            c.set(lock_key(name) + ":fence", fence)


@pytest.fixture
def key() -> str:
    return f"admin-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def server(fencelock_session_server: Server) -> Server:
    return fencelock_session_server


@pytest.fixture
def client(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def closed_url(fencelock_server_binary: str) -> str:
    """A server that was started and stopped: nothing listens on its port."""
    stopped = Server(fencelock_server_binary).start()
    url = stopped.url
    stopped.stop()
    return url


@pytest.fixture
def held(server: Server, key: str) -> Iterator[Any]:
    lock = Lock(server.url, key, ttl=60.0, purpose="nightly report")
    lease = lock.acquire(wait=0)
    yield lock, lease
    with contextlib.suppress(LockLost):  # the test may have freed it through admin
        lease.release()
    lock.close()


# -- status -------------------------------------------------------------------------------------


def test_status_of_a_lock_never_taken(server: Server, key: str) -> None:
    report = admin.status(server.url, key)
    assert report == {
        "key": key,
        "servers": [
            {
                "server": f"127.0.0.1:{server.port}/0",
                "held": False,
                "token_prefix": None,
                "ttl_s": None,
                "holder": None,
                "fence": None,
                "error": None,
            }
        ],
        "fence": None,
        "leader": None,
    }


def test_status_of_a_held_lock_shows_holder_validity_and_fence(
    server: Server, key: str, held: Any
) -> None:
    _, lease = held
    report = admin.status([server.url], key)
    (row,) = report["servers"]
    assert set(row) == STATUS_FIELDS
    assert row["held"] is True and row["error"] is None
    assert row["token_prefix"] == lease.token[:8]
    assert row["ttl_s"] is not None and 0 < row["ttl_s"] <= 60.0
    assert row["fence"] == lease.fence == report["fence"]
    assert row["holder"] is not None
    assert row["holder"]["purpose"] == "nightly report"
    assert row["holder"]["pid"] == os.getpid()


def test_status_after_release_keeps_the_fence_register(server: Server, key: str) -> None:
    lock = Lock(server.url, key, ttl=10.0)
    lease = lock.acquire(wait=0)
    lease.release()
    lock.close()
    report = admin.status(server.url, key)
    assert report["servers"][0]["held"] is False
    assert report["fence"] == lease.fence


def test_status_reports_a_bad_fence_register(server: Server, client: redis.Redis, key: str) -> None:
    client.set(lock_key(key) + ":fence", "not-a-number")
    (row,) = admin.status(server.url, key)["servers"]
    assert row["fence"] is None
    assert row["error"] is not None and "not an integer" in row["error"]


def test_status_over_three_servers_with_one_down(
    fencelock_servers: Callable[..., ServerGroup], key: str
) -> None:
    group = fencelock_servers(3)
    token = uuid.uuid4().hex * 2
    plant(group, key, token, [BASE + 1, BASE + 9, BASE + 5])
    group[1].stop()
    report = admin.status(group.urls, key)
    rows = report["servers"]
    assert [row["held"] for row in rows] == [True, False, True]
    assert [row["token_prefix"] for row in rows] == [token[:8], None, token[:8]]
    assert rows[1]["error"] is not None and rows[0]["error"] is None
    assert rows[1]["server"] == f"127.0.0.1:{group[1].port}/0"
    assert report["fence"] == BASE + 5  # the highest among the servers that answered


def test_status_of_a_name_with_braces(server: Server) -> None:
    name = "}odd{name" + uuid.uuid4().hex[:6]
    lock = Lock(server.url, name, ttl=60.0)
    lease = lock.acquire(wait=0)
    try:
        (row,) = admin.status(server.url, name)["servers"]
        assert row["held"] is True and row["token_prefix"] == lease.token[:8]
    finally:
        lease.release()
        lock.close()


# -- release by token ---------------------------------------------------------------------------


def test_release_with_the_wrong_token_changes_nothing(
    server: Server, client: redis.Redis, key: str, held: Any
) -> None:
    _, lease = held
    result = admin.release(server.url, key, "0" * 40)
    assert [one.outcome for one in result.servers] == ["not-held"]
    assert (result.freed, result.failed, result.majority, result.ok) == (0, 0, 1, False)
    assert lock_token(client.get(lock_key(key))) == lease.token.encode()


def test_release_with_the_holders_token_frees_the_lock(
    server: Server, client: redis.Redis, key: str, held: Any
) -> None:
    _, lease = held
    result = admin.release(server.url, key, lease.token)
    assert result.key == key
    assert [(one.server, one.outcome) for one in result.servers] == [
        (f"127.0.0.1:{server.port}/0", "released")
    ]
    assert result.ok
    assert client.exists(lock_key(key), lock_key(key) + ":holder") == 0
    with pytest.raises(LockLost):
        lease.release()


def test_release_runs_after_a_script_flush(
    server: Server, client: redis.Redis, key: str, held: Any
) -> None:
    _, lease = held
    client.script_flush()  # EVALSHA gets NOSCRIPT: the script must be sent whole
    assert admin.release(server.url, key, lease.token).ok
    assert client.exists(lock_key(key)) == 0


def test_release_counts_a_dead_server_as_failed(
    fencelock_servers: Callable[..., ServerGroup], key: str
) -> None:
    group = fencelock_servers(3)
    token = uuid.uuid4().hex * 2
    plant(group, key, token, [BASE, BASE, BASE])
    group[2].stop()
    result = admin.release(group.urls, key, token)
    assert [one.outcome for one in result.servers][:2] == ["released", "released"]
    assert result.servers[2].outcome.startswith("error: ")
    assert (result.freed, result.failed, result.majority, result.ok) == (2, 1, 2, True)
    for server in (group[0], group[1]):
        with server.client() as c:
            assert c.exists(lock_key(key), lock_key(key) + ":holder") == 0


# -- force release ------------------------------------------------------------------------------


def test_force_release_says_what_it_deleted(
    server: Server, client: redis.Redis, key: str, held: Any
) -> None:
    _, lease = held
    result = admin.force_release(server.url, key)
    (one,) = result.servers
    assert one.outcome == "deleted"
    assert one.token_prefix == lease.token[:8]
    assert one.holder is not None and "nightly report" in one.holder
    assert result.ok
    assert client.exists(lock_key(key), lock_key(key) + ":holder") == 0
    with pytest.raises(LockLost):
        lease.release()
    again = admin.force_release(server.url, key)
    assert [(o.outcome, o.token_prefix, o.holder) for o in again.servers] == [("free", None, None)]
    assert again.ok


def test_force_release_over_three_servers_with_one_down(
    fencelock_servers: Callable[..., ServerGroup], key: str
) -> None:
    group = fencelock_servers(3)
    token = uuid.uuid4().hex * 2
    plant(group, key, token, [BASE, BASE, BASE])
    group[1].stop()
    result = admin.force_release(group.urls, key)
    assert [one.outcome.split(":")[0] for one in result.servers] == ["deleted", "error", "deleted"]
    assert [one.token_prefix for one in result.servers] == [token[:8], None, token[:8]]
    assert result.ok and result.failed == 1
    for server in (group[0], group[2]):
        with server.client() as c:
            assert c.exists(lock_key(key)) == 0


# -- no retries, bad input ----------------------------------------------------------------------


def test_a_paused_server_costs_about_one_timeout_not_retries(
    fencelock_server: Server, key: str
) -> None:
    timeout = 0.25
    fencelock_server.pause()
    try:
        for call in (
            lambda: admin.status(fencelock_server.url, key, timeout=timeout)["servers"][0]["error"],
            lambda: (
                admin.release(fencelock_server.url, key, "t" * 20, timeout=timeout)
                .servers[0]
                .outcome
            ),
            lambda: (
                admin.force_release(fencelock_server.url, key, timeout=timeout).servers[0].outcome
            ),
        ):
            start = time.monotonic()
            error = call()
            elapsed = time.monotonic() - start
            assert error is not None and "Timeout" in error
            # redis-py's default retries would take many timeouts plus backoff
            assert elapsed < 8 * timeout, elapsed
    finally:
        fencelock_server.resume()


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda url: admin.status(url, ""), id="status-empty-key"),
        pytest.param(lambda url: admin.status([], "k"), id="status-no-servers"),
        pytest.param(lambda url: admin.status("notaurl", "k"), id="status-bad-url"),
        pytest.param(lambda url: admin.status(url, "k", timeout=0), id="status-zero-timeout"),
        pytest.param(lambda url: admin.release(url, "k", ""), id="release-empty-token"),
        pytest.param(lambda url: admin.release(url, "k", "  "), id="release-blank-token"),
        pytest.param(lambda url: admin.release(url, "", "t"), id="release-empty-key"),
        pytest.param(lambda url: admin.force_release(url, ""), id="force-empty-key"),
        pytest.param(lambda url: admin.force_release([url, 1], "k"), id="force-not-a-url"),
    ],
)
def test_bad_input_raises_config_error(closed_url: str, call: Callable[[str], object]) -> None:
    # a closed URL: any I/O would show up as an error result, not as ConfigError
    with pytest.raises(ConfigError):
        call(closed_url)
