"""Ask several servers at once and tally as the answers come in (threads)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import TypeVar

from .._core.quorum import Outcome, Tally

T = TypeVar("T")
Classify = Callable[[object], tuple[Outcome, object]]

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fencelock-io")
    return _executor


def _call(queue: SimpleQueue[tuple[int, object]], index: int, call: Callable[[int], T]) -> None:
    try:
        result: object = call(index)
    except Exception as exc:  # every failure is a vote, never a crash of the round
        result = exc
    queue.put((index, result))


def fan_out(
    tally: Tally,
    targets: Sequence[int],
    call: Callable[[int], T],
    classify: Classify,
    *,
    budget_s: float,
    stop: Callable[[Tally], bool] | None = None,
) -> dict[int, object]:
    """Run ``call(i)`` for every target in parallel, recording each vote in ``tally``.

    Returns as soon as ``stop(tally)`` is true (stragglers finish in the background and are
    ignored), when every target answered, or when ``budget_s`` ran out (silent targets are
    recorded as errors). One target is called inline, with no thread hop.
    """
    results: dict[int, object] = {}
    if len(targets) == 1:
        index = targets[0]
        try:
            result: object = call(index)
        except Exception as exc:
            result = exc
        results[index] = result
        tally.record(index, *classify(result))
        return results
    queue: SimpleQueue[tuple[int, object]] = SimpleQueue()
    pool = _pool()
    for index in targets:
        pool.submit(_call, queue, index, call)
    deadline = time.monotonic() + budget_s
    pending = set(targets)
    while pending and not (stop is not None and stop(tally)):
        try:
            index, result = queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except Empty:
            for index in sorted(pending):
                timeout = TimeoutError(f"no answer within {budget_s:.3f} s")
                results[index] = timeout
                tally.record(index, Outcome.ERROR, timeout)
            break
        pending.discard(index)
        results[index] = result
        tally.record(index, *classify(result))
    return results
