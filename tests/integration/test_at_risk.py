"""Two-stage loss: ``at_risk`` is set when a renewal misses its deadline, before ``lost``; it
clears when a later renewal confirms. Real servers paused with SIGSTOP, both front ends."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import fencelock.asyncio as flasync
from fencelock import Lock, LockLost
from fencelock.testing import ServerGroup

TTL = 1.5  # renewed every 0.5 s; a paused majority is noticed by the next round (0.16 s)
BOUND = 10.0  # liveness bound of every wait below (seconds), never a speed assertion
# at_risk before lost on a loaded machine: the first renewal (at 1 s) fails by 1.3 s, the
# deadline is at ~2.97 s; 1.6 s of margin for a late renewal thread
RISK_TTL = 3.0
RISK_TIMEOUT = 0.3


def _wait_for(predicate: Any, timeout: float = BOUND) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def _pause_majority(group: ServerGroup) -> list[Any]:
    paused = list(group.servers)[: len(group) // 2 + 1]
    for server in paused:
        server.pause()
    return paused


@pytest.mark.parametrize("n", [1, 3])
def test_at_risk_is_set_before_lost_when_a_majority_stays_paused(
    fencelock_servers: Any, key: str, n: int
) -> None:
    group = fencelock_servers(n)
    events: list[tuple[str, float]] = []
    lock = Lock(group.urls, key, ttl=RISK_TTL, server_timeout=RISK_TIMEOUT)
    with pytest.raises(LockLost), lock.hold(wait=1, renew=True) as lease:
        lease.on_at_risk(lambda _lease: events.append(("at_risk", time.monotonic())))
        lease.on_lost(lambda _lease: events.append(("lost", time.monotonic())))
        assert not lease.at_risk.is_set()
        paused = _pause_majority(group)
        try:
            assert lease.lost.wait(BOUND)
        finally:
            for server in paused:
                server.resume()
        # a renewal round open at the deadline now gets its replies: they must change nothing
        # (issue 21 item 12: it used to clear at_risk on the lost lease)
        time.sleep(RISK_TIMEOUT * 2)
        assert lease.at_risk.is_set()
        assert lease.lost.is_set()
    assert _wait_for(lambda: len(events) == 2)  # callbacks run just after the event is set
    assert [name for name, _ in events] == ["at_risk", "lost"]
    assert events[0][1] < events[1][1]


@pytest.mark.parametrize("n", [1, 3])
def test_at_risk_clears_and_the_lease_is_kept_when_the_servers_come_back_in_time(
    fencelock_servers: Any, key: str, n: int
) -> None:
    group = fencelock_servers(n)
    warned: list[float] = []
    lock = Lock(group.urls, key, ttl=TTL * 2)
    with lock.hold(wait=1, renew=True) as lease:
        lease.on_at_risk(lambda _lease: warned.append(time.monotonic()))
        paused = _pause_majority(group)
        try:
            assert lease.at_risk.wait(BOUND)
        finally:
            for server in paused:
                server.resume()
        assert _wait_for(lambda: not lease.at_risk.is_set())
        assert not lease.lost.is_set() and lease.remaining() > 0
        rival = Lock(group.urls, key, ttl=TTL)
        assert rival.try_acquire() is None  # still ours on a majority
    assert len(warned) == 1


@pytest.mark.parametrize("n", [1, 3])
def test_asyncio_at_risk_comes_before_the_cancellation_and_clears_on_recovery(
    fencelock_servers: Any, key: str, n: int
) -> None:
    group = fencelock_servers(n)

    async def main() -> None:
        order: list[str] = []
        lock = flasync.Lock(group.urls, key, ttl=TTL)
        with pytest.raises(LockLost):
            async with lock.hold(wait=1, renew=True) as lease:
                lease.on_at_risk(lambda _lease: order.append("at_risk"))
                lease.on_lost(lambda _lease: order.append("lost"))
                paused = await asyncio.to_thread(_pause_majority, group)
                try:
                    await asyncio.wait_for(asyncio.Event().wait(), BOUND)  # cancelled by the loss
                finally:
                    for server in paused:
                        server.resume()
        assert order == ["at_risk", "lost"]

        kept = flasync.Lock(group.urls, key + ":kept", ttl=TTL * 2)
        async with kept.hold(wait=5, renew=True) as lease:
            paused = await asyncio.to_thread(_pause_majority, group)
            try:
                await asyncio.wait_for(lease.at_risk.wait(), BOUND)
            finally:
                for server in paused:
                    server.resume()
            for _ in range(int(BOUND / 0.01)):
                if not lease.at_risk.is_set():
                    break
                await asyncio.sleep(0.01)
            assert not lease.at_risk.is_set() and not lease.lost.is_set()

    asyncio.run(main())
