"""``fencelock.locked`` and ``fencelock.current_lease`` against real servers, sync and asyncio."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import fencelock
import fencelock.asyncio
from fencelock import ConfigError, LockLost, NotAcquired, Unavailable, admin, current_lease, locked
from fencelock.testing import Server


@pytest.fixture(params=[1, 3], ids=["1-server", "3-servers"])
def urls(request: pytest.FixtureRequest, topologies: Any) -> list[str]:
    n: int = request.param
    return topologies.urls(n)


def held_elsewhere(urls: list[str], key: str) -> bool:
    """Whether another caller would be refused the lock ``key`` right now."""
    lease = fencelock.Lock(urls, key, ttl=5).try_acquire()
    if lease is None:
        return True
    lease.release()
    return False


def test_a_locked_function_runs_holding_its_key_and_frees_it_on_return(
    urls: list[str], key: str
) -> None:
    seen: dict[str, Any] = {}

    @locked(urls, key, ttl=5)
    def work(x: int) -> int:
        lease = current_lease()
        assert lease is not None
        seen["fence"] = lease.fence
        seen["key"] = lease.key
        seen["held"] = held_elsewhere(urls, key)
        return x * 2

    assert current_lease() is None
    assert work(21) == 42
    assert seen["key"] == key
    assert seen["held"] is True
    assert isinstance(seen["fence"], int) and seen["fence"] > 0
    assert current_lease() is None
    assert held_elsewhere(urls, key) is False
    assert work.__name__ == "work"


def test_an_async_locked_function_runs_holding_its_key_and_frees_it_on_return(
    urls: list[str], key: str
) -> None:
    seen: dict[str, Any] = {}

    @locked(urls, key, ttl=5)
    async def work(x: int) -> int:
        lease = current_lease()
        assert isinstance(lease, fencelock.asyncio.Lease)
        seen["fence"] = lease.fence
        other = await fencelock.asyncio.Lock(urls, key, ttl=5).try_acquire()
        seen["refused"] = other is None
        return x + 1

    assert asyncio.run(work(1)) == 2
    assert seen["refused"] is True
    assert seen["fence"] > 0
    assert held_elsewhere(urls, key) is False


def test_the_key_template_is_filled_from_the_call_arguments_with_defaults(
    topologies: Any, key: str
) -> None:
    urls = topologies.urls(1)
    seen: list[tuple[str, bool]] = []

    @locked(urls, key + ":{day}:{kind}", ttl=5)
    def report(day: str, kind: str = "daily") -> None:
        lease = current_lease()
        assert lease is not None
        seen.append((lease.key, held_elsewhere(urls, f"{key}:{day}:{kind}")))

    report("2024-05-01")
    report(day="2024-05-02", kind="weekly")
    assert seen == [(f"{key}:2024-05-01:daily", True), (f"{key}:2024-05-02:weekly", True)]


def test_calls_on_different_keys_run_at_once_and_calls_on_one_key_take_turns(
    topologies: Any, key: str
) -> None:
    urls = topologies.urls(1)
    inside: dict[str, int] = {}
    most: dict[str, int] = {}
    guard = threading.Lock()

    @locked(urls, key + ":{name}", ttl=5, wait=20)
    def work(name: str) -> None:
        with guard:
            inside[name] = inside.get(name, 0) + 1
            most[name] = max(most.get(name, 0), inside[name])
            most["all"] = max(most.get("all", 0), sum(inside.values()))
        time.sleep(0.15)
        with guard:
            inside[name] -= 1

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "a", "a", "b", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert most["a"] == 1 and most["b"] == 1
    assert most["all"] == 2  # an "a" and a "b" were inside together


@pytest.mark.parametrize(
    "template, problem",
    [
        ("job:{missing}", "no parameter 'missing'"),
        ("job:{}", "not its position"),
        ("job:{0}", "not its position"),
        ("job:{day", "braces"),
        ("}job", "braces"),
        ("", "empty"),
    ],
)
def test_a_bad_key_template_is_refused_when_decorating(template: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):

        @locked("redis://127.0.0.1:1/0", template)
        def job(day: str) -> None: ...


def test_bad_options_and_generators_are_refused_when_decorating() -> None:
    with pytest.raises(ConfigError, match="ttl"):
        locked("redis://127.0.0.1:1/0", "k", ttl=-1)
    with pytest.raises(ConfigError, match="wait"):
        locked(fencelock.Client("redis://127.0.0.1:1/0"), "k", wait=-1)
    with pytest.raises(ConfigError, match="generator"):

        @locked("redis://127.0.0.1:1/0", "k")
        def gen() -> Any:
            yield 1


def test_a_template_name_missing_from_the_call_is_a_config_error_before_any_io() -> None:
    # port 1 refuses: reaching the network would raise Unavailable, not ConfigError
    ran: list[bool] = []

    @locked("redis://127.0.0.1:1/0", "user:{user}", ttl=5)
    def work(**fields: Any) -> None:
        ran.append(True)

    with pytest.raises(ConfigError, match="no argument 'user'"):
        work(other=1)

    @locked("redis://127.0.0.1:1/0", "user:{user.id}", ttl=5)
    async def awork(user: object) -> None:
        ran.append(True)

    with pytest.raises(ConfigError, match="id"):
        asyncio.run(awork(object()))
    with pytest.raises(TypeError):
        work(1)  # type: ignore[call-arg]  # the call does not fit the signature
    assert ran == []


def test_skip_returns_none_without_running_while_another_holds_the_lock(
    urls: list[str], key: str
) -> None:
    ran: list[str] = []

    @locked(urls, key, ttl=5, skip=True)
    def job() -> str:
        ran.append("sync")
        return "done"

    @locked(urls, key, ttl=5, skip=True)
    async def ajob() -> str:
        ran.append("async")
        return "done"

    holder = fencelock.Lock(urls, key, ttl=5).acquire()
    try:
        began = time.monotonic()
        assert job() is None
        assert asyncio.run(ajob()) is None
        assert time.monotonic() - began < 4.0  # one attempt each, not the default 10 s wait
    finally:
        holder.release()
    assert ran == []
    assert job() == "done"
    assert asyncio.run(ajob()) == "done"
    assert ran == ["sync", "async"]


def test_without_skip_contention_raises_not_acquired_after_the_wait(
    urls: list[str], key: str
) -> None:
    ran: list[bool] = []

    @locked(urls, key, ttl=5, wait=0.2)
    def job() -> None:
        ran.append(True)

    @locked(urls, key, ttl=5, wait=0.2)
    async def ajob() -> None:
        ran.append(True)

    holder = fencelock.Lock(urls, key, ttl=5).acquire()
    try:
        with pytest.raises(NotAcquired):
            job()
        with pytest.raises(NotAcquired):
            asyncio.run(ajob())
    finally:
        holder.release()
    assert ran == []


def test_skip_does_not_hide_unavailable_servers(fencelock_server: Server) -> None:
    url = fencelock_server.url
    fencelock_server.stop()

    @locked(url, "k", ttl=1, skip=True)
    def job() -> None: ...

    with pytest.raises(Unavailable):
        job()


def test_the_lease_is_renewed_while_a_long_function_runs(topologies: Any, key: str) -> None:
    urls = topologies.urls(3)
    ttl = 0.6

    @locked(urls, key, ttl=ttl)
    def slow() -> tuple[bool, bool]:
        time.sleep(ttl * 2.5)
        lease = current_lease()
        assert lease is not None
        return lease.lost.is_set(), held_elsewhere(urls, key)

    @locked(urls, key, ttl=ttl)
    async def aslow() -> tuple[bool, bool]:
        await asyncio.sleep(ttl * 2.5)
        lease = current_lease()
        assert lease is not None
        other = await fencelock.asyncio.Lock(urls, key, ttl=5).try_acquire()
        return lease.lost.is_set(), other is None

    assert slow() == (False, True)
    assert asyncio.run(aslow()) == (False, True)


def test_an_exception_in_the_function_propagates_and_frees_the_key(
    urls: list[str], key: str
) -> None:
    @locked(urls, key, ttl=5)
    def boom() -> None:
        raise KeyError("inner")

    @locked(urls, key, ttl=5)
    async def aboom() -> None:
        raise KeyError("inner")

    with pytest.raises(KeyError, match="inner"):
        boom()
    assert held_elsewhere(urls, key) is False
    with pytest.raises(KeyError, match="inner"):
        asyncio.run(aboom())
    assert held_elsewhere(urls, key) is False
    assert current_lease() is None


def test_a_lease_taken_away_while_the_function_runs_raises_lock_lost(
    topologies: Any, key: str
) -> None:
    urls = topologies.urls(1)

    @locked(urls, key, ttl=0.9)
    def job() -> bool:
        lease = current_lease()
        assert lease is not None
        admin.force_release(urls, key)
        return lease.lost.wait(5.0)  # the next renewal (every 0.3 s) finds it gone

    @locked(urls, key, ttl=0.9)
    async def ajob() -> None:
        admin.force_release(urls, key)
        await asyncio.sleep(5.0)  # cancelled by the loss

    with pytest.raises(LockLost):
        job()
    began = time.monotonic()
    with pytest.raises(LockLost):
        asyncio.run(ajob())
    assert time.monotonic() - began < 4.0


def test_current_lease_is_per_thread_and_innermost_first(topologies: Any, key: str) -> None:
    urls = topologies.urls(1)
    seen: dict[str, Any] = {}
    both_inside = threading.Barrier(2, timeout=10)

    @locked(urls, key + ":{name}", ttl=5)
    def work(name: str) -> None:
        both_inside.wait()
        lease = current_lease()
        seen[name] = None if lease is None else lease.key
        child: list[object] = []
        t = threading.Thread(target=lambda: child.append(current_lease()))
        t.start()
        t.join(5)
        seen[name + ":child-thread"] = child

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["a"] == key + ":a" and seen["b"] == key + ":b"
    assert seen["a:child-thread"] == [None] and seen["b:child-thread"] == [None]

    @locked(urls, key + ":outer", ttl=5)
    def outer() -> tuple[str, str, str]:
        first = current_lease()
        inner_key = inner()
        again = current_lease()
        assert first is not None and again is not None
        return first.key, inner_key, again.key

    @locked(urls, key + ":inner", ttl=5)
    def inner() -> str:
        lease = current_lease()
        assert lease is not None
        return lease.key

    assert outer() == (key + ":outer", key + ":inner", key + ":outer")


def test_current_lease_is_per_task(topologies: Any, key: str) -> None:
    urls = topologies.urls(1)

    @locked(urls, key + ":{name}", ttl=5)
    async def work(name: str, started: asyncio.Event, other: asyncio.Event) -> tuple[str, int]:
        started.set()
        await other.wait()  # both tasks are inside at once
        lease = current_lease()
        assert lease is not None
        return lease.key, lease.fence

    async def main() -> list[tuple[str, int]]:
        a, b = asyncio.Event(), asyncio.Event()
        results = await asyncio.wait_for(
            asyncio.gather(work("a", a, b), work("b", b, a)), timeout=20
        )
        assert current_lease() is None
        return list(results)

    (key_a, _), (key_b, _) = asyncio.run(main())
    assert (key_a, key_b) == (key + ":a", key + ":b")


def test_either_client_flavour_serves_either_kind_of_function(topologies: Any, key: str) -> None:
    urls = topologies.urls(1)
    client = fencelock.Client(urls, ttl=5, wait=1)
    aclient = fencelock.asyncio.Client(urls, ttl=5, wait=1)

    @locked(client, key)
    async def from_sync_client() -> float:
        lease = current_lease()
        assert isinstance(lease, fencelock.asyncio.Lease)
        return lease.lock.ttl

    @locked(aclient, key, ttl=3)
    def from_async_client() -> float:
        lease = current_lease()
        assert isinstance(lease, fencelock.Lease)
        return lease.lock.ttl

    assert asyncio.run(from_sync_client()) == 5.0
    assert from_async_client() == 3.0
    client.close()
    with pytest.raises(fencelock.FencelockError, match="closed"):
        asyncio.run(from_sync_client())
