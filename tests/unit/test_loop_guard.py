"""The asyncio driver's loop guard (simulation seed 205015): a given-up attempt's calls still
out when ``asyncio.run()`` ends are shut down there, and a guard never keeps its loop alive."""

from __future__ import annotations

import asyncio
import gc
import weakref

from fencelock._async import driver


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
