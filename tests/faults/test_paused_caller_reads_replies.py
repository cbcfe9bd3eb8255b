"""Issue 21 item 7 (fault F31): a caller that was itself stopped (SIGSTOP, a long GC) past a
round's deadline reads the replies that arrived meanwhile before it judges the deadline.

The stop is a stall of the calling thread inside the flow's own code (a classifier or the
flow between two effects that sleeps past the round's budget; the whole process stalls
with it, as a GC pause would), while real servers answer. Servers 1 and 2 are held back a
little (``CLIENT PAUSE ... WRITE``) so their replies arrive during the stall, not before it.
A reply that arrived must count: the drivers used to judge the deadline first and record a
TimeoutError for it (a release the servers answered was then "not confirmed").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._core.effects import NOW, SETTLE, Broadcast, Flow
from fencelock._core.quorum import Outcome, Tally
from fencelock._core.replies import classify_release
from fencelock.testing import ServerGroup
from fencelock.testing.pytest_plugin import ServerGroupFactory

aio = pytest.importorskip("fencelock.asyncio")

BUDGET_S = 0.5  # the round's budget
STALL_S = 1.0  # the caller stalls this long: past the budget
HOLD_MS = 150  # servers 1 and 2 answer this late: during the stall


@pytest.fixture
def group(fencelock_servers: ServerGroupFactory) -> Iterator[ServerGroup]:
    servers = fencelock_servers(3)
    yield servers
    for server in servers:
        server.client().execute_command("CLIENT", "UNPAUSE")


def hold_back(group: ServerGroup) -> None:
    for server in (group[1], group[2]):
        server.client().execute_command("CLIENT", "PAUSE", HOLD_MS, "WRITE")


def stalling(stall_s: float) -> Any:
    """``classify_release`` that stalls the caller on its first call (a GC pause, a SIGSTOP)."""
    stalled: list[bool] = []

    def classify(reply: object) -> Any:
        if not stalled:
            stalled.append(True)
            time.sleep(stall_s)
        return classify_release(reply)

    return classify


def round_flow(plan: Any, tally: Tally) -> Flow[Tally]:
    """One release round (of a token nobody holds: every server answers "not ours") whose
    first recorded reply stalls the caller past the round's budget."""
    yield Broadcast(
        plan.wiring.release, (0, 1, 2), plan.release_keys, ("not-ours", 1, 1),
        stalling(STALL_S), None, BUDGET_S, tally,
    )  # fmt: skip
    return tally


def settle_flow(plan: Any, tally: Tally) -> Flow[Tally]:
    """A round decided by its first answer; the caller stalls past the budget before it waits
    for the stragglers (``SETTLE``)."""
    yield Broadcast(
        plan.wiring.release, (0, 1, 2), plan.release_keys, ("not-ours", 1, 1),
        classify_release, lambda t: len(t.votes) >= 1, BUDGET_S, tally,
    )  # fmt: skip
    yield NOW
    time.sleep(STALL_S)
    yield SETTLE
    return tally


def all_answered(tally: Tally) -> None:
    assert sorted(tally.votes) == [0, 1, 2]
    outcomes = {index: (outcome, detail) for index, (outcome, detail) in tally.votes.items()}
    assert all(o is Outcome.HELD for o, _ in outcomes.values()), outcomes


@pytest.mark.parametrize("make_flow", [round_flow, settle_flow], ids=["round", "settle"])
def test_a_stalled_caller_reads_the_replies_that_arrived_sync(
    group: ServerGroup, make_flow: Any
) -> None:
    lock = fencelock.Lock(group.urls, "i7-sync", ttl=5.0, server_timeout=BUDGET_S)
    try:
        lock.acquire(wait=0).release()  # connections, identities and scripts warm
        hold_back(group)
        tally = lock._driver.run(make_flow(lock._definition.plan, Tally(3)))
    finally:
        lock.close()
    all_answered(tally)


@pytest.mark.parametrize("make_flow", [round_flow, settle_flow], ids=["round", "settle"])
def test_a_stalled_caller_reads_the_replies_that_arrived_async(
    group: ServerGroup, make_flow: Any
) -> None:
    async def scenario() -> Tally:
        lock = aio.Lock(group.urls, "i7-async", ttl=5.0, server_timeout=BUDGET_S)
        await (await lock.acquire(wait=0)).release()
        hold_back(group)
        tally: Tally = await lock._driver.run(make_flow(lock._definition.plan, Tally(3)))
        return tally

    all_answered(asyncio.run(scenario()))
