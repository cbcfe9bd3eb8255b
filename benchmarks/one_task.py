"""Client CPU and wall time of one asyncio task's acquire + release (issue 24).

Runs ``--cycles`` acquire + release cycles of one reused Lock in one task on an embedded server
(``$FENCELOCK_SERVER_BIN`` or the test kit's default binary), after ``--warm`` cycles, and prints
the client CPU (``time.process_time``) and wall time (``time.perf_counter``) per cycle in µs.
With ``--profile`` it also runs them under ``cProfile`` and prints the functions that took the
most time of their own.

Usage: ``python benchmarks/one_task.py [--cycles N] [--warm N] [--profile]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time

import fencelock.asyncio as fasync
from fencelock.testing import ServerGroup


async def _cycles(lock: fasync.Lock, n: int) -> None:
    for _ in range(n):
        lease = await lock.acquire()
        await lease.release()


async def _run(urls: list[str], cycles: int, warm: int, profile: bool) -> None:
    lock = fasync.Client(urls).lock("one-task", ttl=10)
    await _cycles(lock, warm)
    cpu, wall = time.process_time(), time.perf_counter()
    await _cycles(lock, cycles)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"client CPU {cpu / cycles * 1e6:.1f} us/cycle, wall {wall / cycles * 1e6:.1f} us/cycle")
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await _cycles(lock, cycles)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5000, help="timed cycles")
    parser.add_argument("--warm", type=int, default=2000, help="untimed cycles first")
    parser.add_argument("--profile", action="store_true", help="also run under cProfile")
    args = parser.parse_args()
    with ServerGroup(1) as group:
        asyncio.run(_run(list(group.urls), args.cycles, args.warm, args.profile))


if __name__ == "__main__":
    main()
