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


async def fan_out(
    tally: Tally,
    targets: Sequence[int],
    call: Callable[[int], Awaitable[object]],
    classify: Classify,
    *,
    budget_s: float,
    stop: Callable[[Tally], bool] | None = None,
) -> dict[int, object]:
    """Run ``call(i)`` for every target concurrently, recording each vote in ``tally``.

    Returns as soon as ``stop(tally)`` is true (stragglers finish in the background), when every
    target answered, or when ``budget_s`` ran out (silent targets are recorded as errors). One
    target is awaited inline. If the caller is cancelled, the calls still in flight are left to
    finish in the background (their effects are cleaned up by the caller's shielded release).
    """
    results: dict[int, object] = {}
    if len(targets) == 1:
        index = targets[0]
        try:
            result: object = await call(index)
        except Exception as exc:
            result = exc
        results[index] = result
        tally.record(index, *classify(result))
        return results
    loop = asyncio.get_running_loop()
    tasks = {run_in_background(_as_coro(call, i)): i for i in targets}
    deadline = loop.time() + budget_s
    pending: set[asyncio.Future[Any]] = set(tasks)
    while pending and not (stop is not None and stop(tally)):
        done, pending = await asyncio.wait(
            pending, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            for task in sorted(pending, key=tasks.__getitem__):
                timeout = TimeoutError(f"no answer within {budget_s:.3f} s")
                results[tasks[task]] = timeout
                tally.record(tasks[task], Outcome.ERROR, timeout)
            break
        for task in sorted(done, key=tasks.__getitem__):
            outcome: object = task.exception() if task.exception() is not None else task.result()
            results[tasks[task]] = outcome
            tally.record(tasks[task], *classify(outcome))
    return results


async def _as_coro(call: Callable[[int], Awaitable[object]], index: int) -> object:
    return await call(index)
