"""Timers of blocking leases: renewals, and the deadline at which a lease is declared lost.

One scheduler thread keeps every timer in a heap (none is re-armed in a forked child).
Renewals run on a pool of their own, which nothing else uses (late releases and probes live
on the background thread), so a sick server cannot starve them; a deadline check is cheap
and runs on the scheduler thread itself, so ``lost`` is set at the local deadline, not when
some late round ends. Leases are held weakly.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from .._engine.registry import PerProcess, on_fork

#: Renewal rounds in flight at once, at the most (each bounded by one round budget).
RENEW_WORKERS = 8
#: The timers thread sleeps at most this long at a time (s), whatever the next timer.
MAX_SLEEP_S = 60.0

log = logging.getLogger("fencelock.timers")


class Renewable(Protocol):
    """What the timers need of a lease."""

    @property
    def deadline(self) -> float: ...

    def _renew_step(self) -> float | None: ...

    def _deadline_passed(self) -> None: ...

    def _lose_at_deadline(self) -> Callable[[], None] | None: ...

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
            try:
                with self._cv:
                    while not self._heap or self._heap[0][0] > time.monotonic():
                        # bounded: a wait past threading.TIMEOUT_MAX raises OverflowError
                        timeout = (
                            MAX_SLEEP_S
                            if not self._heap
                            else min(MAX_SLEEP_S, self._heap[0][0] - time.monotonic())
                        )
                        self._cv.wait(timeout)
                    _, _, action = heapq.heappop(self._heap)
                action()
            except Exception:  # one job's failure must never stop the timers of every lease
                log.exception("a fencelock timer job failed; the timers go on")


#: The process's timer thread, started on first use (and again in a forked child).
scheduler = PerProcess(_Scheduler)
_renewing: weakref.WeakSet[Renewal] = weakref.WeakSet()


def watch_deadline(lease: Renewable) -> None:
    """Declare ``lease`` lost at its local deadline unless it was extended or ended by then."""
    ref = weakref.ref(lease)

    def check() -> None:
        current = ref()
        if current is None or current._done():
            return
        if time.monotonic() >= current.deadline:
            # ``lost`` is set here, on the timer thread, at the deadline; only the callbacks
            # go to the pool, where renewal rounds of other leases may be queued before them
            rest = current._lose_at_deadline()
            if rest is not None:
                scheduler().submit(rest)
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
        try:
            next_at = lease._renew_step()
        except Exception:  # renewal of this lease stops; its deadline timer reports it lost
            log.exception("renewal of the lease on %r failed", getattr(lease, "key", "?"))
            next_at = None
        if next_at is None or self.stopped:
            self.stopped = True
            return
        self.next_at = next_at
        scheduler().at(next_at, self._due)


def _reset_after_fork() -> None:
    """In a forked child the timer thread and the pool are gone: start anew (``scheduler``
    makes a new one on first use), with nothing armed. Every lease the child inherited is the
    parent's and is lost there (reason "fork", see ``_lease``): renewing it would keep a dead
    parent's lock alive."""
    global _renewing
    for renewal in list(_renewing):
        renewal.stopped = True
    _renewing = weakref.WeakSet()


on_fork(_reset_after_fork)
