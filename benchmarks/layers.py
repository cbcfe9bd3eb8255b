"""Where the time of one acquire + release goes, split by layer (issue 24's profiles).

Runs each path under ``cProfile`` against embedded servers (``$FENCELOCK_SERVER_BIN`` or the
test kit's default binary) and sums each function's own time (``tottime``) by the layer its
file belongs to: fencelock's ``_core`` / ``_sync`` / ``_async`` / ``_engine`` / ``_frontend``,
redis-py, asyncio, the standard library, and the C calls (socket, poll: these include the
time spent waiting for the server's reply, since cProfile measures wall time). The raw
redis-py baselines are the bench's (``SET NX PX`` + a compare-and-delete ``EVALSHA``).

The hand-off cases run the bench's hand-off (8 workers on one key, 1 ms of work per lease,
``--handoff-s`` seconds each): first as the bench does, in processes and unprofiled, reporting
each worker's CPU time (``time.thread_time``) in ``acquire()`` and in ``release()`` per
acquisition; then the same in threads without and with a profiler per thread, whose report
leaves out the time a thread sleeps (the work) or waits in ``poll`` for the lock.

Usage: ``python benchmarks/layers.py [--cycles N] [--handoff-s S] [--only-handoff]``. The
profiler slows Python code down, so compare the layers with each other and with the
baseline, not with ``fencelock bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import multiprocessing
import pstats
import threading
import time
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


def _handoff_loop(
    lock: fencelock.Lock, start_at: float, seconds: float, profile: cProfile.Profile | None = None
) -> tuple[int, float, float]:
    """One worker from ``start_at`` for ``seconds``: acquire, 1 ms of work, release; returns
    (acquisitions, s of this thread's CPU in acquire(), s in release())."""
    time.sleep(max(0.0, start_at - time.monotonic()))
    n, in_acquire, in_release = 0, 0.0, 0.0
    if profile is not None:
        profile.enable()
    try:
        while time.monotonic() < start_at + seconds:
            c0 = time.thread_time()
            lease = lock.acquire()
            c1 = time.thread_time()
            time.sleep(0.001)
            c2 = time.thread_time()
            lease.release()
            in_acquire += c1 - c0
            in_release += time.thread_time() - c2
            n += 1
    finally:
        if profile is not None:
            profile.disable()
    return n, in_acquire, in_release


def _handoff_worker(url: str, start_at: float, seconds: float, out: Any) -> None:
    """One hand-off process; puts what :func:`_handoff_loop` returns on ``out``."""
    lock = fencelock.Lock(url, "layers:handoff-p", ttl=10, wait=10.0)
    try:
        lock.acquire(wait=10.0).release()  # connect and load the scripts before the clock
        out.put(_handoff_loop(lock, start_at, seconds))
    finally:
        lock.close()


def _handoff_processes(url: str, seconds: float, workers: int = 8) -> None:
    """The bench's hand-off in processes, unprofiled: CPU per acquisition by phase."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.monotonic() + 3.0  # spawned interpreters import fencelock first
    procs = [
        context.Process(target=_handoff_worker, args=(url, start_at, seconds, out))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        results = [out.get(timeout=seconds + 60) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
    ops = sum(r[0] for r in results)
    print(
        f"## hand-off, {workers} processes, no profiler: {ops / seconds:.0f} acquisitions/s; "
        f"CPU per acquisition: acquire() {sum(r[1] for r in results) / ops * 1e6:.1f} us, "
        f"release() {sum(r[2] for r in results) / ops * 1e6:.1f} us"
    )


def _handoff(url: str, seconds: float, workers: int = 8, profiled: bool = True) -> None:
    """The bench's hand-off in threads (each with a profiler of its own when ``profiled``)."""
    profiles = [cProfile.Profile() for _ in range(workers)]
    results: list[tuple[int, float, float]] = [(0, 0.0, 0.0)] * workers
    start_at = time.monotonic() + 0.5
    errors: list[BaseException] = []

    def work(index: int) -> None:
        lock = fencelock.Lock(url, "layers:handoff", ttl=10, wait=10.0)
        try:
            lock.acquire(wait=10.0).release()  # connect and load the scripts before the clock
            profile = profiles[index] if profiled else None
            results[index] = _handoff_loop(lock, start_at, seconds, profile)
        except BaseException as exc:
            errors.append(exc)
        finally:
            lock.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 30)
    if errors:
        raise errors[0]
    ops = sum(r[0] for r in results)
    acquire_cpu = sum(r[1] for r in results) / ops * 1e6
    release_cpu = sum(r[2] for r in results) / ops * 1e6
    if not profiled:
        print(
            f"## hand-off, {workers} threads, no profiler: {ops / seconds:.0f} acquisitions/s; "
            f"thread CPU per acquisition: acquire() {acquire_cpu:.1f} us, "
            f"release() {release_cpu:.1f} us"
        )
        return
    merged: Any = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        merged.add(profile)
    by: collections.Counter[str] = collections.Counter()
    waited = 0.0
    for where, (_, _, own, _, _) in merged.stats.items():
        if where[0] == "~" and ("sleep" in where[2] or "poll" in where[2]):
            waited += own
            continue
        by[_layer(where)] += own
    total = sum(by.values())
    print(
        f"## hand-off, {workers} threads, 1 ms of work: {ops / seconds:.0f} acquisitions/s "
        f"under the profiler; {total / ops * 1e6:.0f} us per acquisition of profiled time "
        f"besides sleeping and waiting in poll ({waited / ops * 1e6:.0f} us)"
    )
    for label, spent in by.most_common():
        print(f"  {label:40s} {spent / ops * 1e6:7.1f} us {spent / total:6.1%}")
    print(
        f"  thread CPU per acquisition: acquire() {acquire_cpu:.1f} us, "
        f"release() {release_cpu:.1f} us (under the profiler)"
    )


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
    parser.add_argument("--handoff-s", type=float, default=5.0, help="seconds of hand-off")
    parser.add_argument("--only-handoff", action="store_true", help="run the hand-off case only")
    args = parser.parse_args()
    with ServerGroup(5) as group:
        urls = list(group.urls)
        if not args.only_handoff:
            _sync_paths(urls, args.cycles)
            asyncio.run(_one_task(urls[0], args.cycles))
        _handoff_processes(urls[0], args.handoff_s)
        _handoff(urls[0], args.handoff_s, profiled=False)
        _handoff(urls[0], args.handoff_s)


if __name__ == "__main__":
    main()
