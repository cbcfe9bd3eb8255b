"""A lease's local state, shared by both front ends: validity on the monotonic clock, loss,
release, and the callbacks to run when it is lost. No I/O here."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import _hooks
from ._core.acquire import Grant
from ._core.effects import Flow
from ._core.extend import Extension, RenewStep, extend, renew
from ._core.release import ReleaseVerdict, release
from ._core.timing import seconds_to_ms
from ._definition import Definition
from ._holder import new_token
from .errors import ConfigError, LockLost
from .options import Seconds, seconds

log = logging.getLogger("fencelock.lock")


class _Flag(Protocol):
    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...


def check_at_least(at_least: Seconds | None, max_hold: float | None) -> float | None:
    """``hold(at_least=...)`` in seconds (None: release when the block ends); ConfigError for
    a negative, NaN or infinite value, or one beyond ``max_hold`` (it could not be kept)."""
    if at_least is None:
        return None
    least = seconds(at_least, "at_least", allow_zero=True)
    if max_hold is not None and least > max_hold:
        raise ConfigError(f"at_least ({least} s) must not exceed max_hold ({max_hold} s)")
    return least


def lingers(exc_type: type[BaseException] | None) -> bool:
    """Whether a ``hold(at_least=...)`` block that ended so keeps its lock: a normal end or a
    job's own error (it ran, so it must not run again too soon elsewhere), not an
    interruption (KeyboardInterrupt, SystemExit, cancellation), which releases at once."""
    return exc_type is None or issubclass(exc_type, Exception)


class _LazyFlag:
    """A bool, and the front end's event for it, made on first use only (a lease nobody waits
    on costs no event: each is a Condition and a lock). ``set``/``clear`` are called with
    ``lock`` held; :meth:`event` takes it."""

    __slots__ = ("_event", "_lock", "_make", "is_set")

    def __init__(self, make: Callable[[], _Flag], lock: threading.Lock) -> None:
        self.is_set = False
        self._event: _Flag | None = None
        self._make = make
        self._lock = lock

    def event(self) -> _Flag:
        with self._lock:
            if self._event is None:
                self._event = self._make()
                if self.is_set:
                    self._event.set()
            return self._event

    def set(self) -> None:
        self.is_set = True
        if self._event is not None:
            self._event.set()

    def clear(self) -> None:
        self.is_set = False
        if self._event is not None:
            self._event.clear()


class LeaseState:
    """Token, fence and deadline of one acquisition; the subclass provides the type of its
    ``lost`` and ``at_risk`` events (:meth:`_new_flag`), made on first use (:class:`_LazyFlag`)."""

    def __init__(self, definition: Definition, grant: Grant) -> None:
        self._definition = definition
        self.key = definition.key
        self.token = grant.token
        self.fence = grant.fence
        self.acquired_at = grant.start  # time.monotonic() when the winning round started
        self._deadline = grant.deadline
        self._waiter = grant.waiter
        self.lost_reason: str | None = None
        self._released = False
        self._callbacks: list[Callable[[Any], object]] = []
        self._risk_callbacks: list[Callable[[Any], object]] = []
        self._state = threading.Lock()
        self._every_s = 0.0
        self._stop_at: float | None = None
        self._stop_reason: str | None = None
        self._lost = _LazyFlag(self._new_flag, self._state)
        self._risk = _LazyFlag(self._new_flag, self._state)

    @staticmethod
    def _new_flag() -> _Flag:
        """The front end's event (a static method: a bound one would tie the lease to its
        flags in a cycle, and leases are held weakly by the renewal)."""
        raise NotImplementedError

    @property
    def _is_lost(self) -> bool:
        return self._lost.is_set

    @property
    def _is_at_risk(self) -> bool:
        return self._risk.is_set

    def remaining(self) -> float:
        """Seconds of validity left, on the monotonic clock; 0.0 once released or lost."""
        if self._released or self._is_lost:
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    @property
    def valid(self) -> bool:
        return self.remaining() > 0.0

    @property
    def deadline(self) -> float:
        """The local deadline (``time.monotonic()`` seconds): ``start + ttl - drift`` of the last
        confirmed grant or extend, or earlier after an extend whose outcome is unknown."""
        return self._deadline

    def ensure_valid(self) -> None:
        """Raise :class:`~fencelock.LockLost` unless the lease is still valid (a local check)."""
        if self._is_lost:
            raise LockLost(self.key, f"{self.key!r}: lease lost ({self.lost_reason})")
        if self._released:
            raise LockLost(self.key, f"{self.key!r}: lease already released")
        if self.remaining() <= 0.0:
            raise LockLost(self.key, f"{self.key!r}: lease expired")

    def _check_usable(self) -> None:
        """Before a server round on this lease: it must not be released or known lost."""
        if self._released:
            raise LockLost(self.key, f"{self.key!r}: lease already released")
        if self._is_lost:
            raise LockLost(self.key, f"{self.key!r}: lease lost ({self.lost_reason})")

    # -- flows and what their verdicts change here ---------------------------------------------

    def _extend_flow(self, ttl: Seconds | None) -> Flow[Extension]:
        ttl_s = self._definition.options.ttl if ttl is None else seconds(ttl, "ttl")
        self._check_usable()
        return extend(self._definition.plan, self.token, seconds_to_ms(ttl_s), self._deadline)

    def _extended(self, result: Extension) -> None:
        """Apply an extend's verdict: the new deadline, a loss, the error to raise."""
        self._deadline = result.deadline
        if result.lost_reason is not None:
            self._mark_lost(result.lost_reason)
        if result.error is not None:
            raise result.error

    def _release_flow(self) -> Flow[ReleaseVerdict] | None:
        """The release flow, or None when already released (marks it released first)."""
        expired = self._deadline <= time.monotonic() or self._is_lost
        if not self._claim_release():
            return None
        flow = release(
            self._definition.plan,
            self.token,
            expired=expired,
            waiter=self._waiter,
            new_token=new_token,
        )
        if _hooks.observers:
            return _hooks.observe_release(flow, self.key, len(self._definition.servers))
        return flow

    def _renewal_plan(self, every: Seconds | None, max_hold: Seconds | None) -> float:
        """Validate keep_alive's arguments, remember them; returns the first renewal time."""
        options = self._definition.options
        every_s = options.renew_every if every is None else seconds(every, "every")
        if every_s >= options.ttl:
            raise ConfigError(f"every ({every_s} s) must be shorter than ttl ({options.ttl} s)")
        cap = None if max_hold is None else seconds(max_hold, "max_hold")
        self.ensure_valid()
        self._every_s = every_s
        self._stop_at = None if cap is None else self.acquired_at + cap
        first = time.monotonic() + every_s
        return first if self._stop_at is None else min(first, self._stop_at)

    def _renew_flow(self) -> Flow[RenewStep]:
        return renew(
            self._definition.plan,
            self.token,
            self._deadline,
            every_s=self._every_s,
            stop_at=self._stop_at,
        )

    def _renewed(self, step: RenewStep) -> float | None:
        """Apply a renewal step; returns when to renew next (None: stop)."""
        if self._released:
            return None
        self._deadline = step.deadline
        if step.failed and _hooks.observers:
            _hooks.renewal_failed(self.key, len(self._definition.servers))
        if step.lost_reason is not None:
            self._mark_lost(step.lost_reason)
        elif step.at_risk:
            self._mark_at_risk()
        elif self._is_at_risk:
            with self._state:
                self._risk.clear()
            log.warning("lease on %r renewed again: no longer at risk", self.key)
        if step.stop_reason is not None:
            self._stop_reason = step.stop_reason
        return step.next_at

    def _mark_at_risk(self) -> None:
        """A renewal missed its deadline: set ``at_risk`` and run the callbacks (once per
        warning; a confirmed renewal clears it, and the next miss warns again)."""
        with self._state:
            if self._is_at_risk or self._is_lost or self._released:
                return
            self._risk.set()
            callbacks = list(self._risk_callbacks)
        log.warning(
            "lease on %r at risk: a renewal was not confirmed (%.3f s of validity left)",
            self.key,
            self.remaining(),
        )
        for callback in callbacks:
            self._run_callback(callback)

    def on_at_risk(self, callback: Callable[[Any], object]) -> None:
        """Call ``callback(lease)`` each time ``at_risk`` becomes set (a renewal was not
        confirmed; at once if it is set now). Callbacks run on a fencelock thread (asyncio: in
        the event loop): keep them short; exceptions are logged."""
        with self._state:
            self._risk_callbacks.append(callback)
            now = self._is_at_risk
        if now:
            self._run_callback(callback)

    def _release_at(self, at_least: float | None) -> float | None:
        """At the end of a ``hold(at_least=...)`` block: when to release (monotonic s), or
        None to release now (no at_least, already past it, or the lease is not valid)."""
        if at_least is None or not self.valid:
            return None
        at = self.acquired_at + at_least
        return at if at > time.monotonic() else None

    def _deadline_passed(self) -> None:
        if time.monotonic() >= self._deadline:
            reason = self._stop_reason or "renewal not confirmed before the local deadline"
            self._mark_lost(reason)

    def _done(self) -> bool:
        return self._released or self._is_lost

    def _mark_lost(self, reason: str) -> None:
        callbacks = self._take_loss(reason)
        if callbacks is None:
            return
        if _hooks.observers:
            _hooks.lease_lost(self.key, len(self._definition.servers), reason)
        self._lost_hook()
        for callback in callbacks:
            self._run_callback(callback)

    def _lost_hook(self) -> None:
        """What the front end does at a loss besides callbacks (stop renewal, cancel a body)."""

    def _claim_release(self) -> bool:
        """Mark released; False when it already was (releasing twice is a no-op)."""
        with self._state:
            if self._released:
                return False
            self._released = True
            return True

    def _take_loss(self, reason: str) -> list[Callable[[Any], object]] | None:
        """Mark lost; the callbacks to run, or None when it was already lost or released."""
        with self._state:
            if self._is_lost or self._released:
                return None
            self.lost_reason = reason
            self._lost.set()
            callbacks, self._callbacks = self._callbacks, []
        log.error("lease on %r lost: %s", self.key, reason)
        return callbacks

    def _add_callback(self, callback: Callable[[Any], object]) -> bool:
        """Keep ``callback`` for a later loss; False when the lease is lost already."""
        with self._state:
            if self._is_lost:
                return False
            self._callbacks.append(callback)
            return True

    def _run_callback(self, callback: Callable[[Any], object]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("callback of the lease on %r failed", self.key)

    def __repr__(self) -> str:
        state = "lost" if self._is_lost else "released" if self._released else "held"
        return (
            f"Lease({self.key!r}, fence={self.fence}, token={self.token[:8]}…, {state}, "
            f"remaining={self.remaining():.3f}s)"
        )
