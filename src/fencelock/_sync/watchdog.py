"""Background renewal for blocking leases: one scheduler thread for all leases, a few worker
threads for the network calls, leases held weakly (a dropped lease simply stops renewing).

A renewal that fails is retried while the lease is still valid; when the validity runs out
without a confirmation, the lease is marked lost (event + callbacks) at once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from .._scripts import Script
from ..errors import LockLost

if TYPE_CHECKING:
    from .lock import Lease
    from .node import Node

log = logging.getLogger("fencelock.watchdog")

RETRY_FLOOR = 0.01  # seconds between retries of a failed renewal, at the least


class Job(Protocol):
    """Something the shared scheduler runs on its worker pool when due."""

    stopped: bool

    def tick(self) -> None: ...


class _Scheduler:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fencelock-renew")
        self._thread = threading.Thread(target=self._run, name="fencelock-watchdog", daemon=True)
        self._thread.start()

    def schedule(self, when: float, job: Job) -> None:
        with self._cv:
            heapq.heappush(self._heap, (when, next(self._seq), job))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cv.wait(timeout)
                _, _, renewal = heapq.heappop(self._heap)
            if not renewal.stopped:
                self._pool.submit(renewal.tick)

    @property
    def pending(self) -> int:
        with self._cv:
            return sum(1 for _, _, r in self._heap if not r.stopped)


_scheduler: _Scheduler | None = None
_scheduler_lock = threading.Lock()


def scheduler() -> _Scheduler:
    global _scheduler
    if _scheduler is None:
        with _scheduler_lock:
            if _scheduler is None:
                _scheduler = _Scheduler()
    return _scheduler


class Renewal:
    """The renewal of one lease. ``stop()`` waits for an in-flight renewal to finish, so a
    renewal never races the release that follows it."""

    def __init__(self, lease: Lease, every: float, max_hold: float | None) -> None:
        self._ref = weakref.ref(lease)
        self.every = every
        self.max_hold = max_hold
        self.stopped = False
        self._busy = threading.RLock()  # re-entrant: an on_lost callback may release
        self.renewals = 0

    @classmethod
    def start(cls, lease: Lease, every: float, max_hold: float | None) -> Renewal:
        renewal = cls(lease, every, max_hold)
        first = time.monotonic() + every
        if max_hold is not None:
            first = min(first, lease.acquired_at + max_hold)
        scheduler().schedule(first, renewal)
        return renewal

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True
        if self._busy.acquire(timeout=timeout):
            self._busy.release()

    def tick(self) -> None:
        lost_reason: str | None = None
        capped = False  # max_hold reached: let the lease run out before reporting it
        lease: Lease | None = None
        next_at: float | None = None
        with self._busy:
            lease = self._ref()
            if self.stopped or lease is None:
                return
            now = time.monotonic()
            if self.max_hold is not None and now - lease.acquired_at >= self.max_hold:
                self.stopped = True
                capped = True
                lost_reason = f"max_hold of {self.max_hold} s reached; renewal stopped"
            else:
                try:
                    lease.extend()
                    self.renewals += 1
                    next_at = time.monotonic() + self.every
                except LockLost as exc:
                    self.stopped = True
                    log.debug("renewal of %r: %s", lease.key, exc)
                    return  # extend() already marked the lease lost
                except Exception as exc:
                    remaining = lease.remaining()
                    log.warning(
                        "renewal of %r failed (%.3f s of validity left): %s",
                        lease.key,
                        remaining,
                        exc,
                    )
                    if remaining <= 0:
                        self.stopped = True
                        lost_reason = f"renewal not confirmed before the lease ran out: {exc}"
                    else:
                        next_at = time.monotonic() + max(
                            RETRY_FLOOR, min(self.every, remaining / 3)
                        )
        if lost_reason is not None:
            if capped:
                # let the lease run out on the servers, then report it lost
                delay = max(0.0, lease.remaining())
                timer = threading.Timer(delay, lease._mark_lost, args=(lost_reason,))
                timer.daemon = True
                timer.start()
            else:
                lease._mark_lost(lost_reason)
            return
        if next_at is not None:
            if self.max_hold is not None:
                next_at = min(next_at, lease.acquired_at + self.max_hold)
            scheduler().schedule(next_at, self)


class LateRelease:
    """Repeat a release on a server that did not answer it (or the round before it).

    A paused server applies what was in its socket buffer when it wakes, possibly a ``SET NX``
    that arrives after our release: the key would then stay until its TTL. So the release is
    repeated with backoff until the server answers, then once more (by then everything it had
    buffered is applied), or until ``until`` (monotonic; the key expires by then anyway).
    """

    FIRST_DELAY = 0.05
    MAX_DELAY = 1.0

    def __init__(
        self, node: Node, script: Script, keys: tuple[str, ...], args: tuple[Any, ...], until: float
    ) -> None:
        self.node = node
        self.script = script
        self.keys = keys
        self.args = args
        self.until = until
        self.delay = self.FIRST_DELAY
        self.answered = False
        self.stopped = False

    @classmethod
    def start(
        cls, node: Node, script: Script, keys: tuple[str, ...], args: tuple[Any, ...], until: float
    ) -> None:
        scheduler().schedule(
            time.monotonic() + cls.FIRST_DELAY, cls(node, script, keys, args, until)
        )

    def tick(self) -> None:
        if time.monotonic() > self.until:
            return
        try:
            self.node.run(self.script, self.keys, self.args)
        except Exception as exc:
            log.debug("late release on %s failed: %s", self.node.name, exc)
        else:
            if self.answered:
                return
            self.answered = True
        self.delay = min(self.MAX_DELAY, self.delay * 2)
        scheduler().schedule(time.monotonic() + self.delay, self)
