"""Virtual time for the simulation: one clock, and asyncio event loops that never block.

The code under test reads ``time.monotonic()`` directly and schedules with ``loop.call_at``;
both must be the same virtual clock. :func:`patched_time` swaps ``time.monotonic`` (and
``time.time``, for holder info) for the world's clock while a schedule runs; :class:`SimLoop`
is a real ``asyncio`` selector loop whose ``time()`` is that clock, whose selector never waits,
and whose ``create_connection`` asks the world for an in-memory connection. The world steps
loops one iteration at a time (:meth:`SimLoop.step`), so it decides which process runs next:
that choice, drawn from the seed, is where hostile interleavings come from. One loop per
client job gives "a new event loop per job" (``asyncio.run()`` per job) for free.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import threading
import time
from asyncio import events
from collections.abc import Callable, Iterator
from typing import Any

EPOCH = 1_800_000_000.0  # the wall clock the simulation starts at (s since 1970)


class Clock:
    """True time of the world, in seconds from its start (monotonic, only moved forward)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 1000.0  # > 0: some code treats 0.0 as "never"

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return EPOCH + self.now


@contextlib.contextmanager
def patched_time(clock: Clock) -> Iterator[None]:
    """``time.monotonic`` and ``time.time`` read ``clock`` inside the block."""
    saved = time.monotonic, time.time, time.perf_counter
    time.monotonic = clock.monotonic  # type: ignore[assignment]
    time.time = clock.wall  # type: ignore[assignment]
    time.perf_counter = clock.monotonic  # type: ignore[assignment]
    try:
        yield
    finally:
        time.monotonic, time.time, time.perf_counter = saved  # type: ignore[assignment]


class _NeverWaits(selectors.BaseSelector):
    """A selector with nothing to select: the loop's self-pipe is registered and never read."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return []

    def close(self) -> None:
        self._map.clear()

    def get_map(self) -> Any:
        return self._map


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()


Connector = Callable[["SimLoop", Callable[[], asyncio.Protocol], str, int], Any]


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on the world's clock, stepped by the world."""

    def __init__(self, clock: Clock, connect: Connector, name: str) -> None:
        super().__init__(_NeverWaits())
        self._sim_clock = clock
        self._sim_connect = connect
        self.name = name
        self.paused_until = 0.0  # a paused process (GC, SIGSTOP) runs nothing before this
        self.process = name.split("/", 1)[0]  # the client process this loop runs in
        self.enter: Callable[[SimLoop], None] | None = None  # switch to its process's state

    def time(self) -> float:
        return self._sim_clock.now

    async def create_connection(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str | None = None,
        port: int | None = None, **kwargs: Any,
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:  # fmt: skip
        assert host is not None and port is not None
        result: tuple[asyncio.Transport, asyncio.Protocol] = await self._sim_connect(
            self, protocol_factory, host, port
        )
        return result

    def next_at(self) -> float | None:
        """When this loop has something to do (now if callbacks are ready), or None."""
        if self.is_closed():
            return None
        if self._ready:  # type: ignore[attr-defined]
            return max(self._sim_clock.now, self.paused_until)
        scheduled = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            scheduled[0]._scheduled = False
            import heapq

            heapq.heappop(scheduled)
            self._timer_cancelled_count = max(0, self._timer_cancelled_count - 1)  # type: ignore[attr-defined]
        if not scheduled:
            return None
        return max(scheduled[0]._when, self.paused_until)

    def step(self) -> None:
        """One iteration of the loop (the ready callbacks and the timers due), as if it were
        running in this thread."""
        if self.enter is not None:
            self.enter(self)
        events._set_running_loop(self)
        self._thread_id = threading.get_ident()  # type: ignore[attr-defined]
        try:
            self._run_once()  # type: ignore[attr-defined]
        finally:
            self._thread_id = None  # type: ignore[attr-defined]
            events._set_running_loop(None)
