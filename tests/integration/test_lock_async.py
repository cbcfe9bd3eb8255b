"""asyncio-only behaviour, written directly in async (``asyncio.run``; no pytest-asyncio):
many tasks sharing one Lock object, and cancellation of acquire at many points."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from api import lock_value, our_keys

aio = pytest.importorskip("fencelock.asyncio")


@pytest.mark.parametrize("n", [1, 3])
def test_tasks_sharing_one_lock_never_overlap(topologies: Any, key: str, n: int) -> None:
    urls = topologies.urls(n)
    seen: list[tuple[str, int]] = []
    state = {"inside": 0, "max": 0}

    async def worker(lock: Any) -> None:
        for _ in range(2):
            async with lock as lease:
                state["inside"] += 1
                state["max"] = max(state["max"], state["inside"])
                seen.append((lease.token, lease.fence))
                assert lease.valid
                await asyncio.sleep(0.002)  # let the others run while we hold it
                state["inside"] -= 1

    async def main() -> None:
        lock = aio.Lock(urls, key, ttl=30, wait=30)
        try:
            await asyncio.wait_for(asyncio.gather(*(worker(lock) for _ in range(20))), 60)
        finally:
            await lock.aclose()

    asyncio.run(main())
    assert state["max"] == 1
    assert len(seen) == 40 and len({tok for tok, _ in seen}) == 40
    fences = [f for _, f in seen]
    assert fences == sorted(fences) and len(set(fences)) == 40
    for server in topologies.group(n).servers:
        assert lock_value(server.client(), key) is None


@pytest.mark.parametrize("n", [1, 3])
def test_cancelled_acquire_leaves_no_orphan(topologies: Any, key: str, n: int) -> None:
    """Cancel ``acquire`` at many points (100 times, see below); every lease
    obtained is released. The lock's TTL is 10 s, so a key of ours that survives the 2 s grace
    below is an orphan, not a key about to expire."""
    group = topologies.group(n)
    clients = [s.client() for s in group.servers]
    outcomes = {"lease": 0, "cancelled": 0}
    orphans: list[tuple[int, list[str | None]]] = []

    async def main() -> None:
        lock = aio.Lock(group.urls, key, ttl=10, wait=1)
        try:
            for i in range(100):
                # cancel after k turns of the event loop (i < 50), or after a timeout of a few
                # hundred microseconds (i >= 50): between them every await of a round is hit
                task = asyncio.ensure_future(lock.acquire())
                if i < 50:
                    for _ in range(i):
                        await asyncio.sleep(0)
                else:
                    await asyncio.sleep((i - 50) * 0.00005)
                task.cancel()
                try:
                    lease = await task
                except asyncio.CancelledError:
                    outcomes["cancelled"] += 1
                else:
                    outcomes["lease"] += 1
                    await lease.release()
                deadline = time.monotonic() + 2.0
                values = [lock_value(c, key) for c in clients]
                while any(values) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                    values = [lock_value(c, key) for c in clients]
                if any(values):
                    orphans.append((i, values))
                    for c in clients:  # do not let one orphan cascade into the next rounds
                        c.delete(f"fencelock:{{{key}}}")
        finally:
            await lock.aclose()

    asyncio.run(main())
    assert outcomes["cancelled"] > 0 and outcomes["lease"] > 0, outcomes  # both paths ran
    assert not orphans, f"orphaned lock keys after cancelled acquires: {orphans}"
    for client in clients:
        keys = our_keys(client, key)
        assert "<lock>" not in keys and ":holder" not in keys, keys
