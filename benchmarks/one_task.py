"""Client CPU and wall time of one asyncio task's acquire + release (issue 24).

Runs ``--cycles`` acquire + release cycles of one reused Lock in one task on an embedded server
(``$FENCELOCK_SERVER_BIN`` or the test kit's default binary), after ``--warm`` cycles, and
prints per cycle: the client CPU (``time.process_time``), the wall time (``time.perf_counter``),
the server's CPU (``INFO cpu``), the wall time less both CPU times (the time both slept, waiting
to be woken, less any time they ran at once: negative when they overlapped more) in µs, and the
client's voluntary context switches (``getrusage``: how often it blocked waiting for a reply).
``--raw`` runs the raw ``redis.asyncio`` baseline instead (``SET NX PX`` + a compare-and-delete
``EVALSHA``, as ``fencelock bench``). With ``--profile`` it also runs the cycles under
``cProfile`` and prints the functions that took the most time of their own.

Usage: ``python benchmarks/one_task.py [--raw] [--cycles N] [--warm N] [--profile]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import resource
import time
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio as aredis

import fencelock.asyncio as fasync
from fencelock._frontend.holder import new_token
from fencelock.cli.bench import BASELINE_RELEASE, _server_cpu_s
from fencelock.testing import ServerGroup


async def _cycles(lock: fasync.Lock, n: int) -> None:
    for _ in range(n):
        lease = await lock.acquire()
        await lease.release()


async def _run(urls: list[str], cycles: int, warm: int, profile: bool, raw: bool) -> None:
    admin = redis.Redis.from_url(urls[0], socket_timeout=10.0)
    lock = fasync.Client(urls).lock("one-task", ttl=10)
    base = aredis.Redis.from_url(urls[0], single_connection_client=True, socket_timeout=10.0)
    sha = await base.script_load(BASELINE_RELEASE)

    async def raw_cycles(n: int) -> None:
        for _ in range(n):
            token = new_token()
            if not await base.set("one-task:raw", token, nx=True, px=10_000):
                raise RuntimeError("the raw baseline's key is held")
            await base.evalsha(sha, 1, "one-task:raw", token)

    async def ours(n: int) -> None:
        await _cycles(lock, n)

    run: Callable[[int], Awaitable[None]] = raw_cycles if raw else ours
    try:
        await run(warm)
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        server = _server_cpu_s(admin)
        cpu, wall = time.process_time(), time.perf_counter()
        await run(cycles)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        server = _server_cpu_s(admin) - server
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches
        us = 1e6 / cycles
        print(
            f"{'raw redis.asyncio' if raw else 'fencelock'}, per cycle: client CPU "
            f"{cpu * us:.1f} us, wall {wall * us:.1f} us, server CPU {server * us:.1f} us, "
            f"wall less both {(wall - cpu - server) * us:.1f} us, "
            f"{switches / cycles:.2f} client waits"
        )
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            await run(cycles)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    finally:
        await lock.aclose()
        await base.aclose()
        admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5000, help="timed cycles")
    parser.add_argument("--warm", type=int, default=2000, help="untimed cycles first")
    parser.add_argument("--profile", action="store_true", help="also run under cProfile")
    parser.add_argument("--raw", action="store_true", help="the raw redis.asyncio baseline")
    args = parser.parse_args()
    with ServerGroup(1) as group:
        asyncio.run(_run(list(group.urls), args.cycles, args.warm, args.profile, args.raw))


if __name__ == "__main__":
    main()
