"""Issue 21 item 12: a reply that arrives after the lease's local deadline never revives the
lost lease nor clears its ``at_risk`` (DESIGN.md v0.3). The server is paused (SIGSTOP) while a
round is in flight and resumed once the deadline timer declared the lease lost; the round's
budget (``server_timeout``) is long enough that its reply then still arrives. Both front ends,
one real server.

Each test also checks that the late reply really was processed (the server's key got the
round's fresh TTL) and that the server was resumed while the round was still open, so it
cannot pass by a round that merely timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

import fencelock.asyncio as fasync
from fencelock import Lock, LockLost
from fencelock._core.keys import lock_keys
from fencelock.testing import Server

BOUND = 15.0  # liveness bound of every wait (s), never a speed assertion
SETTLE_S = 1.5  # how long a late reply is given to reach the lease after the server resumed

# extend: ttl 4 s; the round starts 0.8 s before the deadline and may last 3.5 s, so it is
# still open 2.7 s after the deadline
EXTEND_TTL = 4.0
EXTEND_TIMEOUT = 3.5
EXTEND_EARLY = 0.8

# renewal: ttl 6 s renewed every 2 s; the round at 2 s waits 2.5 s and fails (at_risk at
# ~4.5 s); the retry, a third of the time left later (~5 s), is open until ~7.5 s, past the
# deadline (~5.94 s)
RENEW_TTL = 6.0
RENEW_TIMEOUT = 2.5


def _pttl_ms(server: Server, name: str) -> int:
    with server.client() as client:
        return int(client.pttl(lock_keys(name).lock))


def _wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def test_an_extend_confirmed_after_the_deadline_raises_lock_lost_and_keeps_the_loss(
    fencelock_server: Server, key: str
) -> None:
    lock = Lock(fencelock_server.url, key, ttl=EXTEND_TTL, server_timeout=EXTEND_TIMEOUT)
    outcome: list[BaseException | None] = []
    done_at: list[float] = []
    with pytest.raises(LockLost), lock.hold(wait=1, renew=False) as lease:
        time.sleep(max(0.0, lease.deadline - EXTEND_EARLY - time.monotonic()))
        fencelock_server.pause()
        started = time.monotonic()

        def user_extend() -> None:
            try:
                lease.extend(EXTEND_TTL)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
            done_at.append(time.monotonic())

        thread = threading.Thread(target=user_extend, daemon=True)
        thread.start()
        try:
            assert lease.lost.wait(BOUND)  # the deadline timer, while the round is open
            deadline_at_loss = lease.deadline
        finally:
            fencelock_server.resume()
        resumed = time.monotonic()
        assert resumed < started + EXTEND_TIMEOUT - 0.5, "resumed after the round closed"
        thread.join(BOUND)
        assert not thread.is_alive()
        assert _pttl_ms(fencelock_server, key) > (EXTEND_TTL - 2.0) * 1000  # it landed late
        assert len(outcome) == 1 and isinstance(outcome[0], LockLost)
        assert done_at[0] < started + EXTEND_TIMEOUT - 0.3  # on the reply, not a timeout
        assert lease.lost.is_set() and lease.remaining() == 0.0
        assert lease.deadline == deadline_at_loss


def test_an_asyncio_extend_confirmed_after_the_deadline_raises_lock_lost(
    fencelock_server: Server, key: str
) -> None:
    async def main() -> None:
        lock = fasync.Lock(fencelock_server.url, key, ttl=EXTEND_TTL, server_timeout=EXTEND_TIMEOUT)
        extending: asyncio.Task[None] | None = None
        started = resumed = 0.0
        deadline_at_loss = 0.0
        done_at: list[float] = []
        with pytest.raises(LockLost):
            async with lock.hold(wait=1, renew=False) as lease:
                await asyncio.sleep(max(0.0, lease.deadline - EXTEND_EARLY - time.monotonic()))
                fencelock_server.pause()
                started = time.monotonic()
                # a task of its own: the loss cancels the body, not the user's extend
                extending = asyncio.ensure_future(lease.extend(EXTEND_TTL))
                extending.add_done_callback(lambda _task: done_at.append(time.monotonic()))
                try:
                    # polled, not wait_for(): on Python 3.11 wait_for may swallow the
                    # cancellation the loss sends the body when both land together
                    for _ in range(int(BOUND / 0.01)):
                        if lease.lost.is_set():
                            break
                        await asyncio.sleep(0.01)
                finally:
                    deadline_at_loss = lease.deadline
                    fencelock_server.resume()
                    resumed = time.monotonic()
                await asyncio.sleep(BOUND)  # cancelled by the loss
        assert extending is not None
        assert resumed < started + EXTEND_TIMEOUT - 0.5, "resumed after the round closed"
        with pytest.raises(LockLost):
            await asyncio.wait_for(extending, BOUND)
        # the round ended on the late reply, well before its budget (not by a timeout)
        assert done_at and done_at[0] < started + EXTEND_TIMEOUT - 0.3
        assert lease.lost.is_set() and lease.remaining() == 0.0
        assert lease.deadline == deadline_at_loss

    asyncio.run(main())


def _renewal_round_end(at_risk_at: float, deadline: float) -> float:
    """When the retry after the failed round closes: it starts a third of the time left
    after the failure and lasts the round budget at most."""
    return at_risk_at + (deadline - at_risk_at) / 3.0 + RENEW_TIMEOUT


def test_a_renewal_confirmed_after_the_deadline_leaves_at_risk_and_lost_set(
    fencelock_server: Server, key: str
) -> None:
    lock = Lock(fencelock_server.url, key, ttl=RENEW_TTL, server_timeout=RENEW_TIMEOUT)
    lease = lock.acquire(wait=1)
    at_risk_at: list[float] = []
    lease.on_at_risk(lambda _lease: at_risk_at.append(time.monotonic()))
    try:
        fencelock_server.pause()
        try:
            lease.keep_alive()
            assert lease.at_risk.wait(BOUND)
            first_deadline = lease.deadline
            assert lease.lost.wait(BOUND)
            deadline_at_loss = lease.deadline
        finally:
            fencelock_server.resume()
        resumed = time.monotonic()
        assert at_risk_at and resumed < _renewal_round_end(at_risk_at[0], first_deadline) - 0.3
        assert _wait_until(lambda: _pttl_ms(fencelock_server, key) > 4000, BOUND)  # it landed
        # the reply reaches the lease right after the server answered; it must change nothing
        _wait_until(lambda: not lease.at_risk.is_set() or lease.deadline != deadline_at_loss,
                    SETTLE_S)  # fmt: skip
        assert lease.at_risk.is_set()
        assert lease.lost.is_set() and lease.remaining() == 0.0
        assert lease.deadline == deadline_at_loss
        assert len(at_risk_at) == 1
    finally:
        with contextlib.suppress(LockLost):
            lease.release()  # deletes the key the late reply refreshed


def test_an_asyncio_renewal_confirmed_after_the_deadline_leaves_at_risk_and_lost_set(
    fencelock_server: Server, key: str
) -> None:
    async def main() -> None:
        lock = fasync.Lock(fencelock_server.url, key, ttl=RENEW_TTL, server_timeout=RENEW_TIMEOUT)
        lease = await lock.acquire(wait=1)
        at_risk_at: list[float] = []
        lease.on_at_risk(lambda _lease: at_risk_at.append(time.monotonic()))
        fencelock_server.pause()
        try:
            lease.keep_alive()
            await asyncio.wait_for(lease.at_risk.wait(), BOUND)
            first_deadline = lease.deadline
            await asyncio.wait_for(lease.lost.wait(), BOUND)
            deadline_at_loss = lease.deadline
        finally:
            fencelock_server.resume()
        resumed = time.monotonic()
        assert at_risk_at and resumed < _renewal_round_end(at_risk_at[0], first_deadline) - 0.3
        for _ in range(int(BOUND / 0.01)):
            if await asyncio.to_thread(_pttl_ms, fencelock_server, key) > 4000:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the late PEXPIRE never landed")
        for _ in range(int(SETTLE_S / 0.01)):
            if not lease.at_risk.is_set() or lease.deadline != deadline_at_loss:
                break
            await asyncio.sleep(0.01)
        assert lease.at_risk.is_set()
        assert lease.lost.is_set() and lease.remaining() == 0.0
        assert lease.deadline == deadline_at_loss
        with contextlib.suppress(LockLost):
            await lease.release()

    asyncio.run(main())


def test_a_users_longer_extend_confirmed_while_a_shorter_renewal_is_in_flight(
    fencelock_server: Any,
) -> None:
    """The simulation's seeds 13252 and 13782: a renewal (the lock's ttl) is sent, a user's
    longer extend is confirmed before the renewal's reply is applied. The renewal's PEXPIRE may
    run after the extend's on the server, so until its reply the lease may not claim more than
    the renewal's deadline; once applied, the renewal's own deadline stands."""
    lock = Lock(fencelock_server.url, "t:extend-vs-renewal", ttl=2.0)
    lease = lock.acquire(wait=2)
    try:
        renewal = lease._renew_flow()  # the renewal is sent: its round is open
        lease.extend(5.0)  # a user's longer extend, confirmed meanwhile
        assert lease.remaining() <= 2.0, "the open renewal may still shorten the key"
        lease._renewed(lease._driver.run(renewal))  # the renewal's reply is applied
        assert 1.5 < lease.remaining() <= 2.0
        pttl = fencelock_server.client().pttl(lock_keys("t:extend-vs-renewal").lock)
        assert pttl <= 2000  # the server's key agrees: the renewal's PEXPIRE ran last
    finally:
        lease.release()
