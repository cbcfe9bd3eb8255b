"""Timers of blocking leases: renewals, and the deadline at which a lease is declared lost.

One scheduler thread keeps every timer in a heap. Renewals run on a pool of their own, which
nothing else uses (late releases and probes live on the background thread), so a sick server
cannot starve them; a deadline check is cheap and runs on the scheduler thread itself, so
``lost`` is set at the local deadline, not when some late round ends. Leases are held weakly.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from .._engine.registry import on_fork

#: Renewal rounds in flight at once, at the most (each bounded by one round budget).
RENEW_WORKERS = 8


class Renewable(Protocol):
    """What the timers need of a lease."""

    @property
    def deadline(self) -> float: ...

    def _renew_step(self) -> float | None: ...

    def _deadline_passed(self) -> None: ...

    def _done(self) -> bool: ...


class _Scheduler:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._pool = ThreadPoolExecutor(RENEW_WORKERS, thread_name_prefix="fencelock-renew")
        self._thread = threading.Thread(target=self._run, name="fencelock-timers", daemon=True)
        self._thread.start()

    def at(self, when: float, action: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (when, next(self._seq), action))
            self._cv.notify()

    def submit(self, action: Callable[[], None]) -> None:
        self._pool.submit(action)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cv.wait(timeout)
                _, _, action = heapq.heappop(self._heap)
            with contextlib.suppress(Exception):  # an action must never stop the timers
                action()


_scheduler: _Scheduler | None = None
_scheduler_lock = threading.Lock()
_renewing: weakref.WeakSet[Renewal] = weakref.WeakSet()


def scheduler() -> _Scheduler:
    global _scheduler
    if _scheduler is None:
        with _scheduler_lock:
            if _scheduler is None:
                _scheduler = _Scheduler()
    return _scheduler


def watch_deadline(lease: Renewable) -> None:
    """Declare ``lease`` lost at its local deadline unless it was extended or ended by then."""
    ref = weakref.ref(lease)

    def check() -> None:
        current = ref()
        if current is None or current._done():
            return
        if time.monotonic() >= current.deadline:
            scheduler().submit(current._deadline_passed)  # callbacks off the timer thread
        else:
            scheduler().at(current.deadline, check)

    scheduler().at(lease.deadline, check)


class Renewal:
    """The renewal of one lease, every ``every_s`` while it is held."""

    def __init__(self, lease: Renewable, first_at: float) -> None:
        self._ref = weakref.ref(lease)
        self.stopped = False
        self.next_at = first_at
        _renewing.add(self)
        scheduler().at(first_at, self._due)

    def stop(self) -> None:
        self.stopped = True

    def _due(self) -> None:
        if not self.stopped:
            scheduler().submit(self._tick)

    def _tick(self) -> None:
        lease = self._ref()
        if self.stopped or lease is None or lease._done():
            return
        next_at = lease._renew_step()
        if next_at is None or self.stopped:
            self.stopped = True
            return
        self.next_at = next_at
        scheduler().at(next_at, self._due)


def _reset_after_fork() -> None:
    """In a forked child the timer thread and the pool are gone: start anew and re-arm the
    renewals the child inherited (its leases keep renewing, and their deadlines are watched)."""
    global _scheduler, _scheduler_lock
    _scheduler = None
    _scheduler_lock = threading.Lock()
    for renewal in list(_renewing):
        lease = renewal._ref()
        if renewal.stopped or lease is None:
            continue
        scheduler().at(time.monotonic(), renewal._due)
        watch_deadline(lease)


on_fork(_reset_after_fork)
