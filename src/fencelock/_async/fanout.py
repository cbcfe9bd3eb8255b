"""Ask several servers at once and tally as the answers come in (asyncio tasks)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from .._core.quorum import Outcome, Tally

Classify = Callable[[object], tuple[Outcome, object]]

# Stragglers left running after a round was decided: referenced here so they are not
# garbage-collected mid-flight, and their exceptions retrieved so none is reported as lost.
_background: set[asyncio.Future[Any]] = set()


def _forget(task: asyncio.Future[Any]) -> None:
    _background.discard(task)
    if not task.cancelled():
        task.exception()


def run_in_background(coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_forget)
    return task


class Stragglers:
    """Servers of a decided round whose replies are still on the way; :meth:`settle` waits for
    them (to the round's deadline, recording their votes) so that a cleanup sent next cannot
    overtake their command on the server (the cleanup travels on another connection)."""

    def __init__(self, round_: _Round, pending: set[asyncio.Future[Any]]) -> None:
        self._round = round_
        self._pending = pending

    async def settle(self) -> None:
        pending, self._pending = self._pending, set()
        await self._round.collect(pending, None)


class _Round:
    def __init__(
        self,
        tally: Tally,
        tasks: dict[asyncio.Future[Any], int],
        classify: Classify,
        deadline: float,
        budget_s: float,
    ) -> None:
        self.tally = tally
        self.tasks = tasks
        self.classify = classify
        self.deadline = deadline
        self.budget_s = budget_s

    async def collect(
        self, pending: set[asyncio.Future[Any]], stop: Callable[[Tally], bool] | None
    ) -> set[asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        tasks, tally = self.tasks, self.tally
        while pending and not (stop is not None and stop(tally)):
            done, pending = await asyncio.wait(
                pending,
                timeout=max(0.0, self.deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                for task in sorted(pending, key=tasks.__getitem__):
                    timeout = TimeoutError(f"no answer within {self.budget_s:.3f} s")
                    tally.record(tasks[task], Outcome.ERROR, timeout)
                return set()
            for task in sorted(done, key=tasks.__getitem__):
                exc = task.exception()
                tally.record(tasks[task], *self.classify(exc if exc is not None else task.result()))
        return pending


async def fan_out(
    tally: Tally,
    targets: Sequence[int],
    call: Callable[[int], Awaitable[object]],
    classify: Classify,
    *,
    budget_s: float,
    stop: Callable[[Tally], bool] | None = None,
    keep_stragglers: bool = False,
) -> Stragglers | None:
    """Run ``call(i)`` for every target concurrently, recording each vote in ``tally``.

    Returns as soon as ``stop(tally)`` is true, when every target answered, or when ``budget_s``
    ran out (silent targets are recorded as errors). One target is awaited inline. Calls still
    in flight after an early stop finish in the background, or are returned as
    :class:`Stragglers` with ``keep_stragglers``. If the caller is cancelled, the calls in
    flight are left to finish (the caller's shielded release cleans up after them).
    """
    if len(targets) == 1:
        index = targets[0]
        try:
            result: object = await call(index)
        except Exception as exc:
            result = exc
        tally.record(index, *classify(result))
        return None
    loop = asyncio.get_running_loop()
    tasks = {run_in_background(_as_coro(call, i)): i for i in targets}
    round_ = _Round(tally, tasks, classify, loop.time() + budget_s, budget_s)
    pending = await round_.collect(set(tasks), stop)
    if keep_stragglers and pending:
        return Stragglers(round_, pending)
    return None


async def _as_coro(call: Callable[[int], Awaitable[object]], index: int) -> object:
    return await call(index)
