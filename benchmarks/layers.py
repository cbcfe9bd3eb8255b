"""Where the time of one acquire + release goes, split by layer (issue 24's profiles).

Runs each path under ``cProfile`` against embedded servers (``$FENCELOCK_SERVER_BIN`` or the
test kit's default binary) and sums each function's own time (``tottime``) by the layer its
file belongs to: fencelock's ``_core`` / ``_sync`` / ``_async`` / ``_engine`` / ``_frontend``,
redis-py, asyncio, the standard library, and the C calls (socket, poll: these include the
time spent waiting for the server's reply, since cProfile measures wall time). The raw
redis-py baselines are the bench's (``SET NX PX`` + a compare-and-delete ``EVALSHA``).

Usage: ``python benchmarks/layers.py [--cycles N]``. The profiler slows Python code down, so
compare the layers with each other and with the baseline, not with ``fencelock bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import pstats
from typing import Any

import redis
import redis.asyncio as aredis

import fencelock
import fencelock.asyncio as fasync
from fencelock._frontend.holder import new_token
from fencelock.testing import ServerGroup

RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
LAYERS = (
    ("/fencelock/_core/", "fencelock._core (the algorithm)"),
    ("/fencelock/_sync/", "fencelock._sync (blocking driver)"),
    ("/fencelock/_async/", "fencelock._async (asyncio driver)"),
    ("/fencelock/_engine/", "fencelock._engine (wire, registry)"),
    ("/fencelock/_frontend/", "fencelock._frontend (lease, fronts)"),
    ("/fencelock/", "fencelock (other)"),
    ("/redis/", "redis-py"),
    ("asyncio", "asyncio"),
)
SYSCALLS = ("socket", "send", "recv", "poll", "select", "epoll")


def _layer(where: tuple[str, int, str]) -> str:
    path, _, name = where
    if path == "~":
        return (
            "C calls: socket, poll (incl. waiting)"
            if any(s in name for s in SYSCALLS)
            else "builtins"
        )
    return next((label for part, label in LAYERS if part in path), "stdlib (other)")


def _report(title: str, profile: cProfile.Profile, ops: int) -> None:
    stats: Any = pstats.Stats(profile)
    by: collections.Counter[str] = collections.Counter()
    for where, (_, _, own, _, _) in stats.stats.items():
        by[_layer(where)] += own
    total = sum(by.values())
    print(f"## {title}: {total / ops * 1e6:.0f} us per op under the profiler")
    for label, seconds in by.most_common():
        print(f"  {label:40s} {seconds / ops * 1e6:7.1f} us {seconds / total:6.1%}")


def _sync_paths(urls: list[str], cycles: int) -> None:
    one = fencelock.Lock(urls[0], "layers:one", ttl=10)
    five = fencelock.Lock(urls, "layers:five", ttl=10)
    raw = redis.Redis.from_url(urls[0])
    try:
        sha = raw.script_load(RELEASE)
        for lock, n, title in (
            (one, cycles, "one server, reused Lock"),
            (five, cycles // 4, "Redlock over 5 servers, reused Lock"),
        ):
            for _ in range(100):
                lock.acquire(wait=0).release()
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(n):
                lock.acquire(wait=0).release()
            profile.disable()
            _report(title, profile, n)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(cycles):
            token = new_token()
            raw.set("layers:raw", token, nx=True, px=10_000)
            raw.evalsha(sha, 1, "layers:raw", token)
        profile.disable()
        _report("raw redis-py, SET NX PX + EVALSHA", profile, cycles)
    finally:
        one.close()
        five.close()
        raw.close()


async def _one_task(url: str, cycles: int) -> None:
    lock = fasync.Lock(url, "layers:async", ttl=10)
    raw = aredis.Redis.from_url(url)
    try:
        for _ in range(100):
            await (await lock.acquire(wait=0)).release()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(cycles):
            await (await lock.acquire(wait=0)).release()
        profile.disable()
        _report("asyncio, one task, reused Lock", profile, cycles)
        sha = await raw.script_load(RELEASE)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(cycles):
            token = new_token()
            await raw.set("layers:raw-async", token, nx=True, px=10_000)
            await raw.evalsha(sha, 1, "layers:raw-async", token)
        profile.disable()
        _report("raw redis.asyncio, one task", profile, cycles)
    finally:
        await lock.aclose()
        await raw.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=4000, help="acquire+release cycles per path")
    args = parser.parse_args()
    with ServerGroup(5) as group:
        urls = list(group.urls)
        _sync_paths(urls, args.cycles)
        asyncio.run(_one_task(urls[0], args.cycles))


if __name__ == "__main__":
    main()
