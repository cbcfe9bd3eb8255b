"""RedisFence / AsyncRedisFence against real servers: the storage refuses stale writers."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import pickle
import random
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from fencelock import ConfigError, Lock, StaleFence
from fencelock.fence import (
    ADVANCE,
    APPLY,
    SCRIPTS,
    WRITE,
    ApplyRefused,
    AsyncRedisFence,
    BelowFloor,
    EqualFence,
    RedisFence,
)
from fencelock.testing import Server, free_port

BASE = 1_800_000_000_000_000  # fences look like server TIME in microseconds


@pytest.fixture
def store(fencelock_session_server: Server) -> Iterator[RedisFence]:
    fence = RedisFence(fencelock_session_server.url)
    yield fence
    fence.close()


def rid() -> str:
    return f"res:{uuid.uuid4().hex}"


def raw_hash(store: RedisFence, resource: str) -> dict[bytes, bytes]:
    result: dict[Any, Any] = store.client.hgetall(store.key(resource))
    return result


# --- single-writer behaviour ------------------------------------------------------------------


def test_never_written_reads_none_and_zero(store: RedisFence) -> None:
    assert store.read(rid()) == (None, 0)


def test_equal_and_greater_fences_are_accepted(store: RedisFence) -> None:
    r = rid()
    store.write(r, BASE, b"first")
    assert store.read(r) == (b"first", BASE)
    store.write(r, BASE, b"again, same lease")
    assert store.read(r) == (b"again, same lease", BASE)
    store.write(r, BASE + 1, "newer")
    assert store.read(r) == (b"newer", BASE + 1)


def test_older_fence_is_refused_and_changes_nothing(store: RedisFence) -> None:
    r = rid()
    store.write(r, BASE + 34, b"new holder")
    before = raw_hash(store, r)
    with pytest.raises(StaleFence) as info:
        store.write(r, BASE + 33, b"paused holder")
    assert (info.value.resource, info.value.offered, info.value.current) == (
        r,
        BASE + 33,
        BASE + 34,
    )
    assert store.read(r) == (b"new holder", BASE + 34)
    assert raw_hash(store, r) == before


def test_an_equal_fence_from_another_lease_is_refused(store: RedisFence) -> None:
    """Two grants that shared a fence: the second lease to write is refused, not accepted
    after the first (issue 23, finding 1); the same lease may write again."""
    r, new, stale = rid(), "new-holder-token", "stale-holder-token"
    store.write(r, BASE, b"new holder", token=new)
    before = raw_hash(store, r)
    for call in (
        lambda: store.write(r, BASE, b"stale holder", token=stale),
        lambda: store.write(r, BASE, b"stale holder, no token"),
        lambda: store.advance(r, BASE, token=stale),
        lambda: store.advance(r, BASE),
        lambda: store.apply(r, BASE, "incrby", 1, token=stale),
        lambda: store.delete(r, BASE, token=stale),
    ):
        with pytest.raises(EqualFence) as info:
            call()
        assert isinstance(info.value, StaleFence)
        assert (info.value.resource, info.value.offered, info.value.current) == (r, BASE, BASE)
        assert "another lease" in str(info.value)
        assert raw_hash(store, r) == before  # nothing changed
    store.write(r, BASE, b"new holder again", token=new)  # the same lease: accepted
    assert store.advance(r, BASE, token=new) == BASE
    assert store.read(r) == (b"new holder again", BASE)
    store.write(r, BASE + 1, b"next lease", token=stale)  # a newer fence: any token
    assert store.read(r) == (b"next lease", BASE + 1)


def test_equal_fence_is_a_stale_fence_that_survives_pickling() -> None:
    exc = EqualFence("orders:42", BASE, BASE)
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is EqualFence and isinstance(copy, StaleFence)
    assert (copy.resource, copy.offered, copy.current) == ("orders:42", BASE, BASE)
    assert str(copy) == str(exc) and "another lease" in str(copy)


def test_a_fence_stored_without_a_token_refuses_a_token_and_vice_versa(store: RedisFence) -> None:
    untokened, tokened = rid(), rid()
    store.write(untokened, BASE, b"no token")
    store.write(untokened, BASE, b"no token, again")  # both sides without: the old rule
    with pytest.raises(EqualFence):
        store.write(untokened, BASE, b"a lease with a token", token="t")
    store.write(tokened, BASE, b"with a token", token="t")
    with pytest.raises(EqualFence):
        store.write(tokened, BASE, b"no token")
    store.write(tokened, BASE + 1, b"newer, no token")  # the token is cleared
    assert b"token" not in raw_hash(store, tokened)
    store.write(tokened, BASE + 1, b"newer, no token, again")
    assert store.read(tokened) == (b"newer, no token, again", BASE + 1)


def test_racing_leases_with_shared_fences_one_lease_per_fence(store: RedisFence) -> None:
    """8 threads, each a lease of its own (token), offering fences from a small range so that
    several leases offer the same fence: for every fence, the guard accepted one lease only,
    and the final state is the last write of the highest fence's lease."""
    r, writers, per_writer = rid(), 8, 120
    accepted: list[list[tuple[int, str]]] = [[] for _ in range(writers)]
    refused: list[list[tuple[int, int, bool]]] = [[] for _ in range(writers)]
    start = threading.Barrier(writers, timeout=30)

    def run(w: int) -> None:
        rng, token = random.Random(300 + w), f"lease-{w}"
        start.wait()
        for i in range(per_writer):
            offered = BASE + rng.randrange(40)
            try:
                store.write(r, offered, f"{token}:{i}", token=token)
            except StaleFence as exc:
                refused[w].append((offered, exc.current, isinstance(exc, EqualFence)))
            else:
                accepted[w].append((offered, token))

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    leases_per_fence: dict[int, set[str]] = {}
    for chunk in accepted:
        for offered, token in chunk:
            leases_per_fence.setdefault(offered, set()).add(token)
    assert leases_per_fence and all(len(t) == 1 for t in leases_per_fence.values())
    equal_refusals = [x for chunk in refused for x in chunk if x[2]]
    assert equal_refusals, "the small fence range should have made leases share fences"
    assert all(offered == current for offered, current, _ in equal_refusals)
    assert all(offered < current for chunk in refused for offered, current, eq in chunk if not eq)
    value, fence = store.read(r)
    assert fence == max(leases_per_fence)
    (winner,) = leases_per_fence[fence]
    assert value is not None and value.decode().startswith(winner + ":")


def test_fences_near_2_pow_53_and_2_pow_63_are_exact_everywhere(store: RedisFence) -> None:
    """Around 2^53 neighbouring integers are one double: a float comparison would call them
    equal (and accept or refuse the wrong one). Every script compares them exactly."""
    for low, high in ((2**53, 2**53 + 1), (2**53 - 1, 2**53), (2**63 - 2, 2**63 - 1)):
        w, a, p, d = rid(), rid(), rid(), rid()
        store.write(w, high, b"high", token="x")
        with pytest.raises(StaleFence) as info:
            store.write(w, low, b"low", token="x")
        assert not isinstance(info.value, EqualFence)
        assert (info.value.offered, info.value.current) == (low, high)
        assert store.read(w) == (b"high", high)
        assert store.advance(a, low, token="x") == low
        assert store.advance(a, high, token="y") == high
        with pytest.raises(StaleFence):
            store.advance(a, low, token="y")
        assert store.read(a) == (None, high)
        assert store.apply(p, low, "incrby", 1, token="x") == 1
        assert store.apply(p, high, "incrby", 1, token="y") == 2
        with pytest.raises(StaleFence):
            store.apply(p, low, "incrby", 1, token="y")
        assert store.read(p) == (b"2", high)
        store.delete(d, high, token="x")
        with pytest.raises(StaleFence):
            store.delete(d, low, token="x")
        assert store.read(d) == (None, high)
        assert raw_hash(store, w)[b"fence"] == str(high).encode()


def test_delete_leaves_a_tombstone_that_refuses_older_fences(store: RedisFence) -> None:
    """The newer holder deletes; the stale holder can neither write the value back nor
    re-create it (issue 21, item 24)."""
    r = rid()
    store.write(r, BASE + 1, b"stale holder's write", token="a")
    store.delete(r, BASE + 2, token="b")  # the newer holder deletes
    assert store.read(r) == (None, BASE + 2)
    assert raw_hash(store, r) == {b"fence": str(BASE + 2).encode(), b"token": b"b"}
    with pytest.raises(StaleFence) as info:
        store.write(r, BASE + 1, b"re-created by the stale holder", token="a")
    assert (info.value.offered, info.value.current) == (BASE + 1, BASE + 2)
    with pytest.raises(StaleFence):
        store.apply(r, BASE + 1, "incrby", 1, token="a")
    assert store.read(r) == (None, BASE + 2)
    store.delete(r, BASE + 2, token="b")  # deleting again: the same lease, no change
    with pytest.raises(StaleFence):
        store.delete(r, BASE + 1, token="a")  # a stale delete changes nothing either
    store.write(r, BASE + 3, b"a newer holder re-creates it", token="c")
    assert store.read(r) == (b"a newer holder re-creates it", BASE + 3)
    with pytest.raises(StaleFence):
        store.delete(r, BASE + 2, token="b")
    assert store.read(r) == (b"a newer holder re-creates it", BASE + 3)
    never = rid()
    store.delete(never, BASE, token="a")  # deleting what was never written records the fence
    assert store.read(never) == (None, BASE)


def test_values_are_stored_as_bytes(store: RedisFence) -> None:
    r = rid()
    cases: list[tuple[Any, bytes]] = [
        (b"\xff\x00raw", b"\xff\x00raw"),
        ("héllo", "héllo".encode()),
        (-42, b"-42"),
        (2.5, b"2.5"),
    ]
    for offset, (value, stored) in enumerate(cases):
        store.write(r, BASE + offset, value)
        assert store.read(r) == (stored, BASE + offset)


def test_fences_compare_exactly_above_2_pow_53(store: RedisFence) -> None:
    # Lua numbers are doubles: 2^53 and 2^53 + 1 are the same double. The scripts compare
    # decimal strings, so the older one is still refused.
    r = rid()
    store.write(r, 2**53 + 1, b"newer")
    with pytest.raises(StaleFence):
        store.write(r, 2**53, b"older by one")
    store.write(r, 2**63 - 1, b"max")
    assert store.read(r) == (b"max", 2**63 - 1)


def test_fences_of_different_lengths_compare_as_numbers(store: RedisFence) -> None:
    # "10" < "9" as text: each script must compare numbers, not strings
    w, a, p = rid(), rid(), rid()
    store.write(w, 9, b"nine")
    store.write(w, 10, b"ten")
    with pytest.raises(StaleFence):
        store.write(w, 9, b"nine again")
    assert store.read(w) == (b"ten", 10)
    assert store.advance(a, 9) == 9
    assert store.advance(a, 10) == 10
    with pytest.raises(StaleFence):
        store.advance(a, 9)
    assert store.apply(p, 9, "incrby", 1) == 1
    assert store.apply(p, 10, "incrby", 1) == 2
    with pytest.raises(StaleFence):
        store.apply(p, 9, "incrby", 1)
    assert store.read(p) == (b"2", 10)


def test_advance_claims_without_a_value(store: RedisFence) -> None:
    r = rid()
    assert store.advance(r, BASE + 5) == BASE + 5
    assert store.read(r) == (None, BASE + 5)
    store.write(r, BASE + 5, b"v")
    assert store.advance(r, BASE + 5) == BASE + 5  # equal: accepted, unchanged
    assert store.advance(r, BASE + 9) == BASE + 9
    assert store.read(r) == (b"v", BASE + 9)
    with pytest.raises(StaleFence) as info:
        store.advance(r, BASE + 8)
    assert (info.value.offered, info.value.current) == (BASE + 8, BASE + 9)
    with pytest.raises(StaleFence):
        store.write(r, BASE + 8, b"stale")
    assert store.read(r) == (b"v", BASE + 9)


def test_apply_decrements_stock_with_a_floor(store: RedisFence) -> None:
    r = rid()
    assert store.apply(r, BASE, "incrby", 1) == 1  # never written counts as 0
    assert store.read(r) == (b"1", BASE)
    assert store.apply(r, BASE + 1, "decrby", 1, min_value=0) == 0  # the last item: sold once
    before = raw_hash(store, r)
    with pytest.raises(BelowFloor) as info:
        store.apply(r, BASE + 2, "incrby", -1, min_value=0)
    assert isinstance(info.value, ValueError)
    assert (info.value.current, info.value.amount, info.value.min_value) == (0, -1, 0)
    assert raw_hash(store, r) == before  # neither value nor fence moved
    with pytest.raises(StaleFence):
        store.apply(r, BASE, "incrby", 5)  # stale: refused before the arithmetic
    assert raw_hash(store, r) == before
    assert store.apply(r, BASE + 3, "incrby", 10, min_value=0) == 10
    assert store.read(r) == (b"10", BASE + 3)


def test_apply_refuses_a_value_that_is_not_an_integer(store: RedisFence) -> None:
    r = rid()
    store.write(r, BASE, b"ten")
    with pytest.raises(ApplyRefused) as info:
        store.apply(r, BASE + 1, "incrby", 1)
    assert info.value.reason == "not_integer"
    assert info.value.value == b"ten"
    assert store.read(r) == (b"ten", BASE)
    store.write(r, BASE + 1, 2**53 - 1)
    with pytest.raises(ApplyRefused):
        store.apply(r, BASE + 1, "incrby", 1)  # would leave the exact range
    assert store.read(r) == (str(2**53 - 1).encode(), BASE + 1)


def test_separate_storage_server_refuses_the_paused_holder(fencelock_servers: Any) -> None:
    """The lock lives on one server, the data on another. Holder A loses its lease behind its
    back (as if it had paused past its TTL), B takes the lock and writes; A's late write is
    refused although A still believes it holds the lock."""
    lock_server, storage_server = fencelock_servers(2).servers
    key, r = f"k:{uuid.uuid4().hex}", rid()
    lock = Lock(lock_server.url, key, ttl=30.0, wait=5.0)
    try:
        with RedisFence(storage_server.url) as fence:
            lease_a = lock.acquire()
            fence.write(r, lease_a.fence, b"A before the pause")
            assert lock_server.client().delete(f"fencelock:{{{key}}}") == 1  # lease expired
            lease_b = lock.acquire()
            assert lease_b.fence > lease_a.fence
            fence.write(r, lease_b.fence, b"B")
            assert lease_a.valid  # A's local clock says it still holds the lock
            with pytest.raises(StaleFence) as info:
                fence.write(r, lease_a.fence, b"A after the pause")
            assert (info.value.offered, info.value.current) == (lease_a.fence, lease_b.fence)
            assert fence.read(r) == (b"B", lease_b.fence)
            assert lock_server.client().exists(fence.key(r)) == 0  # nothing on the lock server
            lease_b.release()
    finally:
        lock.close()


def test_custom_prefix_and_a_decoding_client(fencelock_session_server: Server) -> None:
    """A user's client with decode_responses=True: values still come back as bytes."""
    user_client = fencelock_session_server.client(decode_responses=True)
    prefix = f"app:{uuid.uuid4().hex}:"
    with RedisFence(user_client, prefix=prefix) as fence:
        fence.write("r", BASE, b"\xff\xfe")
        assert fence.read("r") == (b"\xff\xfe", BASE)
        assert fence.key("r") == prefix + "r"
        assert user_client.hget(prefix + "r", "fence") == str(BASE)
    user_client.close()


def test_calls_without_a_token_need_no_command_the_guard_did_not_need_before(
    fencelock_server: Server,
) -> None:
    """A data-server user limited to what the guard's scripts called before tokens (HGET, HSET;
    HMGET for read) can still write, advance and apply without a token; only ``delete`` and
    replacing a stored token need HDEL."""
    name, password = f"guard-{uuid.uuid4().hex[:8]}", "pw-guard"
    admin = fencelock_server.client()
    admin.execute_command(
        "ACL", "SETUSER", name, "on", f">{password}", "resetkeys", "~fencelock:res:*",
        "-@all", "+eval", "+evalsha", "+hget", "+hset", "+hmget",
    )  # fmt: skip
    url = f"redis://{name}:{password}@{fencelock_server.host}:{fencelock_server.port}/0"
    r = rid()
    try:
        with RedisFence(url) as limited:
            limited.write(r, BASE, b"a")
            limited.write(r, BASE, b"b")
            assert limited.advance(r, BASE + 1) == BASE + 1
            assert limited.apply(f"{r}:n", BASE, "incrby", 2) == 2
            limited.write(r, BASE + 2, b"c", token="t")
            limited.write(r, BASE + 2, b"d", token="t")
            assert limited.read(r) == (b"d", BASE + 2)
            with pytest.raises(redis.exceptions.ResponseError) as info:  # the ACL, in a script
                limited.delete(r, BASE + 3, token="t")
            assert "hdel" in str(info.value).lower() or "can't run" in str(info.value)
            assert limited.read(r) == (b"d", BASE + 2)
    finally:
        admin.execute_command("ACL", "DELUSER", name)
        admin.close()


# --- concurrency -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    writer: int
    offered: int
    value: str
    accepted: bool
    current: int  # after an accepted write: the offered fence; after a refusal: the newer one


def _writes(fence: RedisFence, resource: str, writer: int, seed: int, n: int) -> list[Attempt]:
    rng = random.Random(seed)
    attempts = []
    for i in range(n):
        offered = BASE + rng.randrange(400)
        value = f"{writer}:{i}:{offered}"
        try:
            fence.write(resource, offered, value)
        except StaleFence as exc:
            attempts.append(Attempt(writer, offered, value, False, exc.current))
        else:
            attempts.append(Attempt(writer, offered, value, True, offered))
    return attempts


def check_history(final: tuple[bytes | None, int], attempts: list[Attempt]) -> None:
    """The final state is the highest accepted write; each refusal was really older, named a
    fence somebody had offered, and the register never went backwards for any one writer."""
    offered = {a.offered for a in attempts}
    top = max(offered)
    value, current = final
    assert current == top
    assert value is not None
    winners = {a.value for a in attempts if a.accepted and a.offered == top}
    assert value.decode() in winners
    assert all(a.accepted for a in attempts if a.offered == top)  # nothing newer ever existed
    refusals = [a for a in attempts if not a.accepted]
    assert refusals, "the random fences should have produced stale writers"
    for a in refusals:
        assert a.offered < a.current
        assert a.current in offered
    for writer in {a.writer for a in attempts}:
        seen = 0
        for a in (x for x in attempts if x.writer == writer):  # in that writer's order
            if not a.accepted:
                assert a.current >= seen, "the fence register went backwards"
            seen = max(seen, a.current if not a.accepted else a.offered)


def test_concurrent_threads_random_fences(store: RedisFence) -> None:
    r = rid()
    results: list[list[Attempt]] = [[] for _ in range(8)]
    start = threading.Barrier(8, timeout=30)

    def run(writer: int) -> None:
        start.wait()
        results[writer] = _writes(store, r, writer, seed=writer, n=150)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    attempts = [a for chunk in results for a in chunk]
    assert len(attempts) == 8 * 150
    check_history(store.read(r), attempts)


def _process_writer(url: str, resource: str, go: str, writer: int) -> list[Attempt]:
    """Runs in a spawned process; it meets the others only through the server."""
    with RedisFence(url) as fence:
        if fence.client.blpop([go], timeout=30) is None:
            raise RuntimeError("no start signal within 30 s")
        return _writes(fence, resource, writer, seed=100 + writer, n=150)


def test_concurrent_processes_random_fences(
    store: RedisFence, fencelock_session_server: Server
) -> None:
    r, go = rid(), f"go:{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        pending = [
            pool.apply_async(_process_writer, (fencelock_session_server.url, r, go, w))
            for w in range(4)
        ]
        store.client.rpush(go, *["go"] * 4)  # every worker blocks on this list: a start line
        attempts = [a for p in pending for a in p.get(timeout=120)]
    assert len(attempts) == 4 * 150
    assert {a.writer for a in attempts} == {0, 1, 2, 3}
    check_history(store.read(r), attempts)


# --- asyncio -----------------------------------------------------------------------------------


def test_async_main_cases(fencelock_session_server: Server) -> None:
    async def main() -> None:
        r, stock = rid(), rid()
        async with AsyncRedisFence(fencelock_session_server.url) as fence:
            assert await fence.read(r) == (None, 0)
            await fence.write(r, BASE, b"a")
            await fence.write(r, BASE, b"b")  # equal
            await fence.write(r, BASE + 2, b"c")  # greater
            with pytest.raises(StaleFence) as info:
                await fence.write(r, BASE + 1, b"stale")
            assert (info.value.offered, info.value.current) == (BASE + 1, BASE + 2)
            assert await fence.read(r) == (b"c", BASE + 2)
            assert await fence.advance(r, BASE + 3) == BASE + 3
            with pytest.raises(StaleFence):
                await fence.advance(r, BASE + 2)
            assert await fence.read(r) == (b"c", BASE + 3)
            assert await fence.apply(stock, BASE, "incrby", 1) == 1
            assert await fence.apply(stock, BASE, "decrby", 1, min_value=0) == 0
            with pytest.raises(BelowFloor):
                await fence.apply(stock, BASE + 1, "decrby", 1, min_value=0)
            assert await fence.read(stock) == (b"0", BASE)
            t = rid()
            await fence.write(t, BASE, b"new", token="b")
            with pytest.raises(EqualFence):
                await fence.write(t, BASE, b"stale", token="a")
            with pytest.raises(EqualFence):
                await fence.advance(t, BASE, token="a")
            with pytest.raises(EqualFence):
                await fence.apply(t, BASE, "incrby", 1, token="a")
            with pytest.raises(EqualFence):
                await fence.delete(t, BASE, token="a")
            await fence.write(t, BASE, b"new again", token="b")
            await fence.delete(t, BASE + 1, token="c")
            assert await fence.read(t) == (None, BASE + 1)
            with pytest.raises(StaleFence):
                await fence.write(t, BASE, b"re-created", token="b")
            await fence.write(t, 2**63 - 1, b"top", token="d")
            with pytest.raises(StaleFence):
                await fence.write(t, 2**63 - 2, b"one below", token="d")
            assert await fence.read(t) == (b"top", 2**63 - 1)

    asyncio.run(main())


def test_async_concurrent_tasks_random_fences(fencelock_session_server: Server) -> None:
    async def main() -> tuple[tuple[bytes | None, int], list[Attempt]]:
        r = rid()
        async with AsyncRedisFence(fencelock_session_server.url) as fence:

            async def writer(w: int) -> list[Attempt]:
                rng, out = random.Random(200 + w), []
                for i in range(100):
                    offered = BASE + rng.randrange(300)
                    value = f"{w}:{i}:{offered}"
                    try:
                        await fence.write(r, offered, value)
                    except StaleFence as exc:
                        out.append(Attempt(w, offered, value, False, exc.current))
                    else:
                        out.append(Attempt(w, offered, value, True, offered))
                return out

            chunks = await asyncio.gather(*(writer(w) for w in range(8)))
            return await fence.read(r), [a for chunk in chunks for a in chunk]

    final, attempts = asyncio.run(main())
    assert len(attempts) == 800
    check_history(final, attempts)


# --- bad input: ConfigError before any I/O -------------------------------------------------------


@pytest.fixture(scope="module")
def closed_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: any I/O would fail to connect


BAD_CALLS: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
    ("fence bool", "write", ("r", True, b"v"), {}),
    ("fence float", "write", ("r", 1.0, b"v"), {}),
    ("fence str", "write", ("r", "5", b"v"), {}),
    ("fence None", "write", ("r", None, b"v"), {}),
    ("fence negative", "write", ("r", -1, b"v"), {}),
    ("fence over int64", "write", ("r", 2**63, b"v"), {}),
    ("empty resource", "write", ("", 1, b"v"), {}),
    ("bytes resource", "write", (b"r", 1, b"v"), {}),
    ("int resource", "read", (5,), {}),
    ("value None", "write", ("r", 1, None), {}),
    ("value bool", "write", ("r", 1, True), {}),
    ("value list", "write", ("r", 1, [1]), {}),
    ("value NaN", "write", ("r", 1, math.nan), {}),
    ("value inf", "write", ("r", 1, math.inf), {}),
    ("advance negative", "advance", ("r", -5), {}),
    ("advance empty", "advance", ("", 5), {}),
    ("apply unknown op", "apply", ("r", 1, "set", 1), {}),
    ("apply float amount", "apply", ("r", 1, "incrby", 1.5), {}),
    ("apply bool amount", "apply", ("r", 1, "incrby", True), {}),
    ("apply huge amount", "apply", ("r", 1, "incrby", 2**53), {}),
    ("apply str floor", "apply", ("r", 1, "decrby", 1), {"min_value": "0"}),
    ("apply bad fence", "apply", ("r", -1, "decrby", 1), {}),
    ("token empty", "write", ("r", 1, b"v"), {"token": ""}),
    ("token bytes", "write", ("r", 1, b"v"), {"token": b"t"}),
    ("token int", "advance", ("r", 1), {"token": 5}),
    ("token too long", "apply", ("r", 1, "incrby", 1), {"token": "t" * 256}),
    ("delete negative", "delete", ("r", -1), {}),
    ("delete empty", "delete", ("", 1), {}),
    ("delete bad token", "delete", ("r", 1), {"token": ""}),
]


@pytest.mark.parametrize(
    ("method", "args", "kwargs"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_input_raises_config_error_before_io(
    closed_url: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with RedisFence(closed_url, timeout=2.0) as fence, pytest.raises(ConfigError):
        getattr(fence, method)(*args, **kwargs)

    async def run_async() -> None:
        async with AsyncRedisFence(closed_url, timeout=2.0) as fence:
            with pytest.raises(ConfigError):
                await getattr(fence, method)(*args, **kwargs)

    asyncio.run(run_async())


def test_closed_port_does_fail_on_io(closed_url: str) -> None:
    """The control for the test above: a valid call on the closed port is a connection error,
    so a ConfigError there proves the check came before any I/O."""
    with RedisFence(closed_url, timeout=2.0) as fence, pytest.raises(redis.ConnectionError):
        fence.write("r", 1, b"v")


@pytest.mark.parametrize(
    "make",
    [
        lambda url: RedisFence("http://127.0.0.1:1/"),
        lambda url: RedisFence(url, timeout=0),
        lambda url: RedisFence(url, timeout=math.nan),
        lambda url: RedisFence(url, prefix=None),  # type: ignore[arg-type]
        lambda url: RedisFence(aredis.Redis.from_url(url)),  # type: ignore[arg-type]
        lambda url: RedisFence(42),  # type: ignore[arg-type]
        lambda url: AsyncRedisFence(redis.Redis.from_url(url)),  # type: ignore[arg-type]
        lambda url: AsyncRedisFence(url, timeout=-1),
    ],
    ids=[
        "scheme",
        "zero timeout",
        "nan timeout",
        "prefix",
        "async client",
        "int",
        "sync client to async",
        "negative timeout",
    ],
)
def test_bad_construction_raises_config_error(closed_url: str, make: Any) -> None:
    with pytest.raises(ConfigError):
        make(closed_url)


# --- scripts -------------------------------------------------------------------------------------


def test_script_shas_pinned_against_the_server(store: RedisFence) -> None:
    assert {s.name for s in SCRIPTS} == {"fence_write", "fence_advance", "fence_apply"}
    for script in (WRITE, ADVANCE, APPLY):
        assert store.client.script_load(script.source) == script.sha
        assert script.numkeys == 1
        assert script.source.startswith(f"-- {script.name}:".encode())


def test_noscript_falls_back_to_eval(fencelock_server: Server) -> None:
    with RedisFence(fencelock_server.url) as fence:
        fence.client.script_flush()
        assert fence.client.script_exists(WRITE.sha) == [False]
        fence.write("r", BASE, b"v")  # EVALSHA -> NOSCRIPT -> EVAL
        assert fence.read("r") == (b"v", BASE)
        fence.client.script_flush()
        assert fence.advance("r", BASE + 1) == BASE + 1
        fence.client.script_flush()
        assert fence.apply("s", BASE, "incrby", 3) == 3
