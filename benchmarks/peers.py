"""Peers side by side: fencelock, raw redis-py and every Python Redis lock library that installs.

Dev tool (not part of the package). One run, interleaved (each round runs every library once, in
a rotating order), on embedded servers; prints a markdown table. Ratios within the run are the
figures to compare; absolute numbers move with the machine's load.

    .venv/bin/python benchmarks/peers.py [--quick] [--json FILE]

A peer that does not support a case (no Redlock, no asyncio, ...) shows ``n/a``; one that fails
shows ``error`` and the error is printed below the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import secrets
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aredis

from fencelock import Lock
from fencelock._frontend.holder import new_token
from fencelock.asyncio import Lock as AsyncLock
from fencelock.cli.bench import BASELINE_RELEASE, _handoff_figures, _pct, _timed
from fencelock.testing import ServerGroup

TTL_S = 10
WORKERS = 8
TASKS = 50

Cycle = Callable[[], None]
AsyncCycle = Callable[[], Awaitable[None]]
# handoff worker factory: (url, key) -> (acquire blocking, release)
Handoff = Callable[[str, str], tuple[Callable[[], Any], Callable[[Any], None]]]


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)


@dataclass
class Peer:
    name: str
    dist: str  # distribution name for the version
    single: Callable[[str, str], Cycle] | None = None
    redlock: Callable[[list[str], str], Cycle] | None = None
    handoff: Handoff | None = None
    aio: Callable[[str, str], Awaitable[AsyncCycle]] | None = None
    errors: dict[str, str] = field(default_factory=dict)


# ---- fencelock and the raw baseline ---------------------------------------------------------


def fl_single(url: str, key: str) -> Cycle:
    lock = Lock(url, key, ttl=TTL_S)
    return lambda: lock.acquire(wait=0).release()


def fl_redlock(urls: list[str], key: str) -> Cycle:
    lock = Lock(urls, key, ttl=TTL_S)
    return lambda: lock.acquire(wait=0).release()


def fl_handoff(url: str, key: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    lock = Lock(url, key, ttl=TTL_S, wait=10)
    return lock.acquire, lambda lease: lease.release()


async def fl_async(url: str, key: str) -> AsyncCycle:
    lock = AsyncLock(url, key, ttl=TTL_S)

    async def cycle() -> None:
        await (await lock.acquire(wait=0)).release()

    return cycle


def raw_single(url: str, key: str) -> Cycle:
    client = redis.Redis.from_url(url, single_connection_client=True, socket_timeout=5.0)
    sha = client.script_load(BASELINE_RELEASE)

    def cycle() -> None:
        token = new_token()
        assert client.set(key, token, nx=True, px=TTL_S * 1000)
        client.evalsha(sha, 1, key, token)

    return cycle


_raw_async_clients: dict[str, aredis.Redis] = {}


async def raw_async(url: str, key: str) -> AsyncCycle:
    client = _raw_async_clients.get(url)
    if client is None:
        client = _raw_async_clients[url] = aredis.Redis.from_url(url, socket_timeout=5.0)
    sha = await client.script_load(BASELINE_RELEASE)

    async def cycle() -> None:
        token = new_token()
        assert await client.set(key, token, nx=True, px=TTL_S * 1000)
        await client.evalsha(sha, 1, key, token)

    return cycle


# ---- redis-py Lock -------------------------------------------------------------------------


def rp_single(url: str, key: str) -> Cycle:
    client = _client(url)

    def cycle() -> None:
        lock = client.lock(key, timeout=TTL_S)
        assert lock.acquire(blocking=False)
        lock.release()

    return cycle


def rp_handoff(url: str, key: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    client = _client(url)

    def acquire() -> Any:
        lock = client.lock(key, timeout=TTL_S, blocking_timeout=10)
        assert lock.acquire()
        return lock

    return acquire, lambda lock: lock.release()


async def rp_async(url: str, key: str) -> AsyncCycle:
    client = aredis.Redis.from_url(url, socket_timeout=5.0)

    async def cycle() -> None:
        lock = client.lock(key, timeout=TTL_S)
        assert await lock.acquire(blocking=False)
        await lock.release()

    return cycle


# ---- pottery ---------------------------------------------------------------------------------


def pottery_redlock(urls: list[str], key: str) -> Cycle:
    from pottery import Redlock

    masters = {_client(u) for u in urls}

    def cycle() -> None:
        lock = Redlock(key=key, masters=masters, auto_release_time=TTL_S)
        assert lock.acquire(blocking=False)
        lock.release()

    return cycle


def pottery_single(url: str, key: str) -> Cycle:
    return pottery_redlock([url], key)


def pottery_handoff(url: str, key: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    from pottery import Redlock

    masters = {_client(url)}

    def acquire() -> Any:
        lock = Redlock(key=key, masters=masters, auto_release_time=TTL_S)
        assert lock.acquire(timeout=10)
        return lock

    return acquire, lambda lock: lock.release()


# ---- python-redis-lock -------------------------------------------------------------------------


def prl_single(url: str, key: str) -> Cycle:
    import redis_lock  # type: ignore[import-untyped]

    client = _client(url)

    def cycle() -> None:
        lock = redis_lock.Lock(client, key, expire=TTL_S)
        assert lock.acquire(blocking=False)
        lock.release()

    return cycle


def prl_handoff(url: str, key: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    import redis_lock

    client = _client(url)

    def acquire() -> Any:
        lock = redis_lock.Lock(client, key, expire=TTL_S)
        assert lock.acquire(blocking=True, timeout=10)
        return lock

    return acquire, lambda lock: lock.release()


# ---- portalocker -----------------------------------------------------------------------------


def portalocker_single(url: str, key: str) -> Cycle:
    from portalocker.redis import RedisLock

    client = _client(url)

    def cycle() -> None:
        lock = RedisLock(key, connection=client, fail_when_locked=True)
        lock.acquire()
        lock.release()

    return cycle


def portalocker_handoff(url: str, key: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    from portalocker.redis import RedisLock

    client = _client(url)

    def acquire() -> Any:
        lock = RedisLock(key, connection=client, timeout=10)
        lock.acquire()
        return lock

    return acquire, lambda lock: lock.release()


# ---- redlock-ng --------------------------------------------------------------------------------


def rng_redlock(urls: list[str], key: str) -> Cycle:
    from redlock import Redlock  # type: ignore[import-untyped]

    manager = Redlock(list(urls))

    def cycle() -> None:
        lock = manager.acquire(key, TTL_S * 1000)
        assert lock is not None
        manager.release(lock)

    return cycle


def rng_single(url: str, key: str) -> Cycle:
    return rng_redlock([url], key)


def rng_handoff(url: str, key: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    from redlock import Redlock

    manager = Redlock([url])

    def acquire() -> Any:
        lock = manager.acquire(key, TTL_S * 1000, blocking=True)
        assert lock is not None
        return lock

    return acquire, manager.release


async def rng_async(url: str, key: str) -> AsyncCycle:
    from redlock import AsyncRedlock

    manager = AsyncRedlock([url])

    async def cycle() -> None:
        lock = await manager.acquire(key, TTL_S * 1000)
        assert lock is not None
        await manager.release(lock)

    return cycle


# ---- aioredlock --------------------------------------------------------------------------------


def _aio_manager(urls: list[str]) -> Any:
    from aioredlock import Aioredlock  # type: ignore[import-untyped]

    conns = [
        {"host": p.hostname, "port": p.port, "password": p.password}
        for p in (urlsplit(u) for u in urls)
    ]
    return Aioredlock(conns, retry_count=1)


async def aio_async(url: str, key: str) -> AsyncCycle:
    manager = _aio_manager([url])

    async def cycle() -> None:
        lock = await manager.lock(key, lock_timeout=TTL_S)
        await manager.unlock(lock)

    return cycle


def _aio_sync(urls: list[str], key: str) -> Cycle:
    """aioredlock is asyncio-only: one task, one loop kept for the whole run."""
    loop = asyncio.new_event_loop()
    manager = loop.run_until_complete(_make_aio(urls))

    async def once() -> None:
        lock = await manager.lock(key, lock_timeout=TTL_S)
        await manager.unlock(lock)

    return lambda: loop.run_until_complete(once())


async def _make_aio(urls: list[str]) -> Any:
    return _aio_manager(urls)


# ---- sherlock ----------------------------------------------------------------------------------


def sherlock_single(url: str, key: str) -> Cycle:
    from sherlock import RedisLock  # type: ignore[import-untyped]

    client = _client(url)

    def cycle() -> None:
        lock = RedisLock(key, client=client, expire=TTL_S)
        assert lock.acquire(blocking=False)
        lock.release()

    return cycle


def sherlock_handoff(url: str, key: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    from sherlock import RedisLock

    client = _client(url)

    def acquire() -> Any:
        lock = RedisLock(key, client=client, expire=TTL_S, timeout=10, retry_interval=0.001)
        assert lock.acquire()
        return lock

    return acquire, lambda lock: lock.release()


PEERS = [
    Peer("fencelock", "fencelock", fl_single, fl_redlock, fl_handoff, fl_async),
    Peer("raw redis-py (SET NX PX + EVALSHA)", "redis", raw_single, None, None, raw_async),
    Peer("redis-py Lock", "redis", rp_single, None, rp_handoff, rp_async),
    Peer("pottery Redlock", "pottery", pottery_single, pottery_redlock, pottery_handoff, None),
    Peer("python-redis-lock", "python-redis-lock", prl_single, None, prl_handoff, None),
    Peer("portalocker RedisLock", "portalocker", portalocker_single, None, portalocker_handoff),
    Peer("redlock-ng", "redlock-ng", rng_single, rng_redlock, rng_handoff, rng_async),
    Peer("aioredlock", "aioredlock", lambda u, k: _aio_sync([u], k), _aio_sync, None, aio_async),
    Peer("sherlock RedisLock", "sherlock", sherlock_single, None, sherlock_handoff, None),
]


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _interleaved(
    makers: dict[str, Callable[[], Cycle]],
    rounds: int,
    batch_s: float,
    peers: list[Peer],
    case: str,
) -> dict[str, dict[str, float]]:
    """Build each peer's cycle, warm it, then run ``rounds`` rotating rounds of batches."""
    cycles: dict[str, Cycle] = {}
    for name, make in makers.items():
        try:
            cycle = make()
            for _ in range(30):
                cycle()
            cycles[name] = cycle
        except Exception as exc:
            next(p for p in peers if p.name == name).errors[case] = _err(exc)
    batches: dict[str, list[Any]] = {name: [] for name in cycles}
    names = list(cycles)
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            if name not in cycles:
                continue
            try:
                batches[name].append(_timed(cycles[name], batch_s))
            except Exception as exc:
                next(p for p in peers if p.name == name).errors[case] = _err(exc)
                del cycles[name]
    out = {}
    for name, done in batches.items():
        if name not in cycles or not done:
            continue
        lat = [x for b in done for x in b.latencies]
        out[name] = {
            "ops_per_s": statistics.median(b.ops_per_s for b in done),
            "p50_us": _pct(lat, 0.5) * 1e6,
            "p99_us": _pct(lat, 0.99) * 1e6,
            "cpu_us_per_op": statistics.median(b.cpu_us_per_op for b in done),
        }
    return out


def _handoff(peer: Peer, url: str, duration_s: float) -> dict[str, Any]:
    assert peer.handoff is not None
    key = f"peers:handoff:{secrets.token_hex(4)}"
    pairs = [peer.handoff(url, key) for _ in range(WORKERS)]
    # the bench's record shape: (called, acquired, releasing, claim round trips; -1: unknown)
    results: list[list[tuple[float, float, float, int]]] = [[] for _ in range(WORKERS)]
    errors: list[BaseException] = []
    start_at = time.monotonic() + 0.2

    def work(index: int) -> None:
        acquire, release = pairs[index]
        time.sleep(max(0.0, start_at - time.monotonic()))
        try:
            while time.monotonic() < start_at + duration_s:
                called = time.monotonic()
                held = acquire()
                got = time.monotonic()
                time.sleep(0.001)
                releasing = time.monotonic()  # stamped before the release, as the bench does
                release(held)
                results[index].append((called, got, releasing, -1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=duration_s + 20)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError("workers did not finish")
    return _handoff_figures(results, duration_s)


async def _async_case(peer: Peer, url: str, rounds: int, batch_s: float) -> float:
    assert peer.aio is not None
    tag = secrets.token_hex(3)
    cycles = [await peer.aio(url, f"peers:async:{tag}:{i}") for i in range(TASKS)]

    async def loop(cycle: AsyncCycle, end: float) -> int:
        count = 0
        while time.perf_counter() < end:
            await cycle()
            count += 1
        return count

    rates = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        counts = await asyncio.gather(*(loop(c, start + batch_s) for c in cycles))
        rates.append(sum(counts) / (time.perf_counter() - start))
    return statistics.median(rates[1:])  # the first round opens connections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rounds, batch_s, hand_s, arounds, abatch = (
        (3, 0.05, 0.7, 2, 0.1) if args.quick else (8, 0.2, 2.5, 4, 0.3)
    )
    warnings.simplefilter("ignore")
    result: dict[str, Any] = {}
    with ServerGroup(5) as group:
        urls = group.urls
        info = group.servers[0].client().info("server")
        result["env"] = {
            "python": sys.version.split()[0],
            "server": info.get("valkey_version") or info.get("redis_version"),
            "engine": "valkey" if "valkey_version" in info else "redis",
            "versions": {p.name: _version(p.dist) for p in PEERS},
        }
        tag = secrets.token_hex(3)
        print("single ...", file=sys.stderr)
        single = _interleaved(
            {
                p.name: (lambda p=p: p.single(urls[0], f"peers:s:{tag}:{_slug(p.name)}"))  # type: ignore[misc]
                for p in PEERS
                if p.single
            },
            rounds,
            batch_s,
            PEERS,
            "single",
        )
        print("redlock ...", file=sys.stderr)
        red = _interleaved(
            {
                p.name: (lambda p=p: p.redlock(urls, f"peers:r:{tag}:{_slug(p.name)}"))  # type: ignore[misc]
                for p in PEERS
                if p.redlock
            },
            rounds,
            batch_s,
            PEERS,
            "redlock",
        )
        handoff: dict[str, Any] = {}
        for peer in PEERS:
            if peer.handoff is None:
                continue
            print(f"handoff {peer.name} ...", file=sys.stderr)
            try:
                handoff[peer.name] = _handoff(peer, urls[0], hand_s)
            except Exception as exc:
                peer.errors["handoff"] = _err(exc)
        aio: dict[str, float] = {}
        for peer in PEERS:
            if peer.aio is None:
                continue
            print(f"async {peer.name} ...", file=sys.stderr)
            try:
                aio[peer.name] = asyncio.run(_async_case(peer, urls[0], arounds, abatch))
            except Exception as exc:
                peer.errors["async"] = _err(exc)
    _raw_async_clients.clear()
    result.update(single=single, redlock=red, handoff=handoff, aio=aio)
    result["errors"] = {p.name: p.errors for p in PEERS if p.errors}
    print(_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


def _table(result: dict[str, Any]) -> str:
    raw = "raw redis-py (SET NX PX + EVALSHA)"
    single, red, hand, aio = result["single"], result["redlock"], result["handoff"], result["aio"]
    base_ops = single.get(raw, {}).get("ops_per_s", 0.0)
    base_p50 = single.get(raw, {}).get("p50_us", 0.0)
    base_aio = aio.get(raw, 0.0)
    lines = [
        "| library | version | 1 server ops/s | x raw | p50 us | CPU us/op | "
        "5-server p50 us | x raw 1-server p50 | hand-off acq/s | max/median wait | "
        "least served / mean | async 50 tasks ops/s | x raw async |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(value: float | None, fmt: str, name: str, case: str) -> str:
        if value is None:
            errors = result["errors"].get(name, {})
            return "error" if case in errors else "n/a"
        return fmt.format(value)

    for peer in PEERS:
        n = peer.name
        s = single.get(n)
        r = red.get(n)
        h = hand.get(n)
        a = aio.get(n)
        lines.append(
            "| "
            + " | ".join(
                [
                    n,
                    result["env"]["versions"][n],
                    cell(s and s["ops_per_s"], "{:,.0f}", n, "single"),
                    cell(s and s["ops_per_s"] / base_ops, "{:.2f}", n, "single"),
                    cell(s and s["p50_us"], "{:.0f}", n, "single"),
                    cell(s and s["cpu_us_per_op"], "{:.0f}", n, "single"),
                    cell(r and r["p50_us"], "{:,.0f}", n, "redlock"),
                    cell(r and r["p50_us"] / base_p50, "{:.2f}", n, "redlock"),
                    cell(h and h["acquisitions_per_s"], "{:,.0f}", n, "handoff"),
                    cell(h and h["max_wait_ratio"], "{:.1f}", n, "handoff"),
                    cell(h and h["min_worker_share"], "{:.2f}", n, "handoff"),
                    cell(a, "{:,.0f}", n, "async"),
                    cell(a and a / base_aio, "{:.2f}", n, "async"),
                ]
            )
            + " |"
        )
    for name, errors in result["errors"].items():
        for case, text in errors.items():
            lines.append(f"\n- {name} / {case}: `{text}`")
    return "\n".join(lines)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
