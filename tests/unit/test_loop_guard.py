"""The asyncio driver's loop guard (simulation seed 205015): a given-up attempt's calls still
out when ``asyncio.run()`` ends are shut down there, and a guard never keeps its loop alive."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from fencelock._async import driver
from fencelock._core.effects import UNHEARD, Broadcast
from fencelock._core.quorum import Tally
from fencelock._core.replies import classify_acquire


class _Round:
    """Just what the guard reads of a round: its calls still out, and ``shut_down``."""

    def __init__(self) -> None:
        self.open: dict[object, None] = {object(): None}
        self.expired: dict[object, None] = {}
        self.shut = 0

    def shut_down(self) -> None:
        self.shut += 1
        self.open.clear()


def test_asyncio_runs_end_shuts_a_watched_round_down() -> None:
    round_ = _Round()

    async def job() -> None:
        driver._guard(round_, asyncio.get_running_loop())  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the guard's task starts

    asyncio.run(job())  # cancels every task at its end: the guard's among them
    assert round_.shut == 1


def test_a_guard_ends_by_itself_once_no_call_is_out() -> None:
    round_ = _Round()

    async def job() -> bool:
        loop = asyncio.get_running_loop()
        driver._guard(round_, loop)  # type: ignore[arg-type]
        round_.open.clear()  # every call answered
        await asyncio.sleep(driver.GIVE_UP_S * 1.5)
        return driver._guards[loop].running()

    assert asyncio.run(job()) is False
    assert round_.shut == 0


def test_a_guard_does_not_keep_its_loop_alive() -> None:
    round_ = _Round()
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def job() -> None:
        loop = asyncio.get_running_loop()
        loops.append(weakref.ref(loop))
        driver._guard(round_, loop)  # type: ignore[arg-type]
        await asyncio.sleep(0)

    asyncio.run(job())
    gc.collect()
    # (the guard's task referred to its loop, the key of the guards' table: held strongly,
    # every job's loop stayed alive with all it held, and a simulation run slowed to a crawl)
    assert loops[0]() is None


class _Conn:
    def close(self) -> None:
        pass


class _Call:
    """Just what a round reads of a call that ended."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.suspect = self.give_up = None
        self.conn = _Conn()


@pytest.mark.parametrize(
    "exc",
    [
        None,  # a late grant heard: released
        asyncio.CancelledError(),  # asyncio.run() cancelled it: unheard
        ConnectionResetError(),  # its connection was lost: unheard
    ],
    ids=["heard", "cancelled", "reset"],
)
def test_a_given_up_rounds_call_that_ends_late_has_its_grant_released(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException | None
) -> None:
    # simulation seed 742338133: asyncio.run() cancelled a straggler's task before the loop
    # guard's, so the guard no longer saw the call, and its grant stayed until its TTL. What
    # the round's late asks for goes to the background as it is (when to repeat an unheard
    # call's release is the flow's: test_flows.py, unheard_repeats)
    asked: list[object] = []

    class _Background:
        def repeat(self, servers: object, effect: object) -> None:
            asked.append(effect)

    monkeypatch.setattr(driver, "background", _Background)
    seen: list[object] = []

    def late(index: int, reply: object) -> str:
        seen.append(reply)
        return f"release on {index}"

    effect = Broadcast("acquire", (0, 1), ("k",), (), classify_acquire, None, 1.0, Tally(2))
    effect.late = late  # type: ignore[assignment]
    round_ = driver._Round(effect, 0.0, None, 1.0)  # type: ignore[arg-type]
    round_.collecting = False  # parked: its calls are stragglers
    call = _Call(1)
    round_.open[call] = None  # type: ignore[index]
    round_.done(call, [1, b"7"], exc)  # type: ignore[arg-type]
    assert seen == [[1, b"7"] if exc is None else UNHEARD]
    assert asked == ["release on 1"]
    assert not round_.open
