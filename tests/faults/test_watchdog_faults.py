"""Watchdog faults (F14): the holder process killed, the server restarted under a held lock,
and an asyncio acquire cancelled hundreds of times."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import pytest

from fencelock import Lock, LockLost
from fencelock.asyncio import Lock as AsyncLock
from fencelock.testing import Server, ServerGroup

HOLDER = """
import sys, time
from fencelock import Lock
lock = Lock(sys.argv[1], "killed", ttl=float(sys.argv[2]))
with lock.hold(wait=5.0) as lease:
    print("acquired", flush=True)
    time.sleep(60)
"""


def test_killed_holder_lock_expires_within_the_ttl(fencelock_server: Server) -> None:
    ttl = 1.5
    child = subprocess.Popen([sys.executable, "-c", HOLDER, fencelock_server.url, str(ttl)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "acquired"
        time.sleep(ttl)  # the watchdog renews it: still held past one TTL
        with fencelock_server.client() as c:
            assert c.exists("fencelock:{killed}")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed_at = time.monotonic()
        lock = Lock(fencelock_server.url, "killed", ttl=ttl)
        try:
            lease = lock.acquire(wait=ttl + 2.0)  # generous margin on a loaded machine
            waited = time.monotonic() - killed_at
            lease.release()
        finally:
            lock.close()
        assert waited < ttl + 2.0  # nobody renews a dead holder's lease
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)


def test_server_restarted_under_a_held_lock_reports_the_loss(fencelock_server: Server) -> None:
    ttl = 1.5
    lock = Lock(fencelock_server.url, "restarted", ttl=ttl)
    lost_seen: list[str | None] = []
    try:
        with pytest.raises(LockLost), lock.hold(wait=2.0) as lease:
            lease.on_lost(lambda lz: lost_seen.append(lz.lost_reason))
            fencelock_server.kill()
            fencelock_server.restart(wipe=True)  # comes back without our key
            restarted = time.monotonic()
            assert lease.lost.wait(ttl + 2.0)  # the next renewal finds the key gone
            assert time.monotonic() - restarted < ttl + 2.0
            assert not lease.valid
        assert lost_seen and lost_seen[0]
    finally:
        lock.close()


def test_acquire_cancelled_hundreds_of_times_leaves_no_orphan() -> None:
    ttl = 1.0

    async def scenario(urls: list[str]) -> tuple[int, int]:
        rng = random.Random(5)
        lock = AsyncLock(urls, "cancelled", ttl=ttl)
        cancelled = acquired = 0
        try:
            # the timeouts span one uncontended acquire as this machine runs it (the median
            # of 21), so that they fall all along its awaits, however fast it is
            took = []
            for _ in range(21):
                began = time.perf_counter()
                lease = await lock.acquire(wait=0.5)
                took.append(time.perf_counter() - began)
                await lease.release()
            span = statistics.median(took)
            # until 150 were cancelled mid-flight, 2,000 attempts at the most
            for _ in range(2000):
                if cancelled >= 150:
                    break
                try:
                    lease = await asyncio.wait_for(lock.acquire(wait=0.5),
                                                   timeout=rng.uniform(0.0, span))
                except asyncio.TimeoutError:
                    cancelled += 1
                    continue
                acquired += 1
                await lease.release()
        finally:
            await lock.aclose()
        return cancelled, acquired

    with ServerGroup(3) as group:
        cancelled, acquired = asyncio.run(scenario(group.urls))
        assert cancelled >= 100  # hundreds of acquires really cancelled mid-flight
        assert acquired >= 1
        time.sleep(ttl + 0.5)
        for server in group:
            with server.client() as c:
                left = [k for k in c.keys("fencelock:{cancelled}*")
                        if not k.endswith(b":fence")]
                assert left == [] or all(c.pttl(k) > 0 for k in left), left
                assert not c.exists("fencelock:{cancelled}")

        async def fresh() -> None:
            lock = AsyncLock(group.urls, "cancelled", ttl=ttl)
            try:
                lease = await lock.acquire(wait=0)  # nothing of the cancelled ones blocks it
                await lease.release()
            finally:
                await lock.aclose()

        asyncio.run(fresh())
