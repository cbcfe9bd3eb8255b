"""A lease's local state, shared by both front ends: validity on the monotonic clock, loss,
release, and the callbacks to run when it is lost. No I/O here."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from .._core.acquire import Grant
from .._core.effects import Flow
from .._core.extend import (
    DEADLINE_REASON,
    Extension,
    RenewStep,
    Validity,
    extend,
    extended_span_s,
    renew,
    settle,
    settle_renewal,
)
from .._core.release import ReleaseVerdict, release
from .._core.timing import seconds_to_ms
from .._engine.registry import on_fork
from ..errors import ConfigError, LockLost
from ..options import Seconds, seconds
from . import hooks as _hooks
from .definition import Definition
from .holder import new_token

T = TypeVar("T")

log = logging.getLogger("fencelock.lock")

#: Every lease of this process not yet garbage-collected, for the fork hook below.
_live: weakref.WeakSet[LeaseState] = weakref.WeakSet()

FORK_REASON = "fork"


class _Flag(Protocol):
    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...


def check_max_hold(max_hold: Seconds | None) -> float | None:
    """``max_hold`` of ``hold()`` / ``keep_alive()`` in seconds (None: no cap); ConfigError
    for a bad value."""
    return None if max_hold is None else seconds(max_hold, "max_hold")


def hold_limits(
    max_hold: Seconds | None, at_least: Seconds | None
) -> tuple[float | None, float | None]:
    """``hold()``'s ``max_hold`` and ``at_least`` in seconds, checked together before any
    I/O (see :func:`check_max_hold`, :func:`check_at_least`)."""
    cap = check_max_hold(max_hold)
    return cap, check_at_least(at_least, cap)


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
        self._since = grant.start  # start of the confirmed round the deadline comes from
        # per server, the shortest span of an extend whose reply it did not give (Validity)
        self._pending: tuple[float, ...] = ()
        # rounds sent whose reply is not applied yet: (taken at, deadline it may give); their
        # PEXPIRE may land after another round's, so the lease is valid no longer than any
        self._open: list[tuple[float, float]] = []
        # rounds whose reply was applied while others were still in flight: (taken at, span,
        # applied at); their PEXPIRE may have landed after those others' (another connection)
        self._overlapped: list[tuple[float, float, float]] = []
        self._waiter = grant.waiter
        self._after_wake = grant.after_wake  # rounds after the wake-up (bench: claim_rtts)
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
        self._inherited = False  # True in a forked child: the lease is the parent's
        _live.add(self)

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
        ttl_ms = seconds_to_ms(ttl_s)
        plan = self._definition.plan
        return self._bounded(
            ttl_ms,
            extend(plan, self.token, ttl_ms, self._deadline, plan.grant_tag(self.fence)),
        )

    def _validity(self) -> Validity:
        return Validity(self._deadline, self._since, self._pending)

    def _bounded(self, ttl_ms: int, flow: Flow[T]) -> Flow[T]:
        """``flow`` restarts the lease at ``ttl_ms``: from before it is sent until its reply is
        applied, the lease is valid no longer than the deadline it gives, for its PEXPIRE may
        land after another round's and shorten the key (a renewal in flight while a user's
        longer extend is confirmed). The bound is taken before the round's own start, so this
        round's confirmed reply only moves the deadline later. A round that raises (cancelled,
        interrupted) has an unknown outcome: the earlier deadline stays."""
        now = time.monotonic()
        span = extended_span_s(self._definition.plan, ttl_ms)
        entry = (now, span)
        with self._state:
            usable = not (self._released or self._is_lost)
            lowered = usable and now + span < self._deadline
            if usable:
                self._open.append(entry)
            if lowered:
                self._deadline = now + span
        if lowered:
            self._deadline_lowered()
        return self._until_applied(entry, flow)

    def _until_applied(self, entry: tuple[float, float], flow: Flow[T]) -> Flow[T]:
        try:
            result = yield from flow
        except BaseException:
            with self._state:
                if entry in self._open:
                    self._forget_round(entry, time.monotonic())
                    self._deadline = min(self._deadline, entry[0] + entry[1])
            raise
        return result

    def _close_round(self, start: float | None, span: float | None) -> None:
        """Under the state lock, once a round's reply is applied: forget its entry (the one
        of its ``span`` taken latest, no later than its ``start``), then keep the deadline
        within the rounds still open, and within those applied while this one was in flight
        (their PEXPIRE may have landed after this one's)."""
        if start is not None and span is not None:
            mine = [e for e in self._open if e[0] <= start and abs(e[1] - span) < 1e-9]
            if mine:
                self._forget_round(max(mine), time.monotonic())
        for taken, open_span in self._open:
            self._deadline = min(self._deadline, taken + open_span)

    def _forget_round(self, entry: tuple[float, float], now: float) -> None:
        """Under the state lock: ``entry``'s round is applied at ``now``. Rounds still in flight
        (on other connections) may land before it, so its bound stays on them until each is
        applied (a renewal's PEXPIRE of unknown outcome landing after a user's longer extend
        that is confirmed later: seed 9501150 of the sync front)."""
        for taken, span, applied in self._overlapped:
            if entry[0] <= applied:  # ``entry`` was in flight when that round was applied
                self._deadline = min(self._deadline, taken + span)
        self._open.remove(entry)
        if self._open:
            self._overlapped.append((entry[0], entry[1], now))
        self._overlapped = [o for o in self._overlapped if any(e[0] <= o[2] for e in self._open)]

    def _deadline_lowered(self) -> None:
        """The deadline moved earlier: the front end's deadline timer follows it."""

    def _extended(self, result: Extension) -> None:
        """Apply a user's extend to the validity as it is now (a renewal may have moved it
        meanwhile): the new deadline, a loss, the error to raise. A lease lost or released
        while the round ran stays so (LockLost): a late reply never revives it."""
        settled = None
        with self._state:
            if not (self._released or self._is_lost):
                settled = settle(self.key, self._validity(), result, time.monotonic())
                self._deadline = settled.validity.deadline
                self._since = settled.validity.since
                self._pending = settled.validity.pending
                self._close_round(result.start, result.round_deadline - result.start)
        if settled is None:
            self._check_usable()  # raises LockLost
            return
        if settled.lost_reason is not None:
            self._mark_lost(settled.lost_reason)
        if settled.error is not None:
            raise settled.error

    def _release_flow(self) -> Flow[ReleaseVerdict] | None:
        """The release flow, or None when already released (marks it released first).
        In a forked child, raises :class:`~fencelock.LockLost`: the key is the parent's."""
        if self._inherited:
            self._released = True
            raise LockLost(
                self.key, f"{self.key!r}: lease lost ({FORK_REASON}): it is the parent's"
            )
        expired = self._deadline <= time.monotonic() or self._is_lost
        if not self._claim_release():
            return None
        plan = self._definition.plan
        flow = release(
            plan,
            self.token,
            expired=expired,
            waiter=self._waiter,
            new_token=new_token,
            grant=plan.grant_tag(self.fence),
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
        cap = check_max_hold(max_hold)
        self.ensure_valid()
        self._every_s = every_s
        self._stop_at = None if cap is None else self.acquired_at + cap
        return self._next_renewal(time.monotonic(), every_s)

    def _next_renewal(self, now: float, every_s: float) -> float:
        """When to renew next: after ``every_s``, but never later than a third of the
        validity left (a renewal started late in a lease, or after an extend that shortened
        it, still comes before the deadline it protects), and not past ``max_hold``."""
        first = min(now + every_s, now + max(0.0, self._deadline - now) / 3.0)
        return first if self._stop_at is None else min(first, self._stop_at)

    def _renew_flow(self) -> Flow[RenewStep]:
        plan = self._definition.plan
        step = renew(
            plan,
            self.token,
            self._deadline,
            every_s=self._every_s,
            stop_at=self._stop_at,
            grant=plan.grant_tag(self.fence),
        )
        return self._bounded(plan.ttl_ms, step)

    def _renewed(self, step: RenewStep) -> float | None:
        """Apply a renewal step to the validity as it is when its reply arrived; returns when
        to renew next (None: stop). A lease lost or released meanwhile is left as it is: a
        late reply never revives it nor clears its ``at_risk``."""
        with self._state:
            if self._released or self._is_lost:
                return None
            renewed = settle_renewal(
                self.key,
                self._validity(),
                step,
                time.monotonic(),
                every_s=self._every_s,
                stop_at=self._stop_at,
            )
            self._deadline = renewed.validity.deadline
            self._since = renewed.validity.since
            self._pending = renewed.validity.pending
            ext = step.extension
            if ext is None:  # nothing was sent (max_hold): the renewal's entry goes
                self._close_round(
                    float("inf"),
                    extended_span_s(self._definition.plan, self._definition.plan.ttl_ms),
                )
            else:
                self._close_round(ext.start, ext.round_deadline - ext.start)
            cleared = renewed.confirmed and self._risk.is_set
            if cleared:
                self._risk.clear()
        if step.failed and _hooks.observers:
            _hooks.renewal_failed(self.key, len(self._definition.servers))
        if step.stop_reason is not None:
            self._stop_reason = step.stop_reason
        if renewed.lost_reason is not None:
            self._mark_lost(renewed.lost_reason)
        elif renewed.at_risk:
            self._mark_at_risk()
        elif cleared:
            log.warning("lease on %r renewed again: no longer at risk", self.key)
        return renewed.next_at

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
        rest = self._lose_at_deadline()
        if rest is not None:
            rest()

    def _lose_at_deadline(self) -> Callable[[], None] | None:
        """If the local deadline has passed, mark the lease lost now (cheap: ``lost`` is set
        before this returns) and return the rest of the loss (hooks, callbacks) for the caller
        to run where it may block; None when not lost by this call."""
        if time.monotonic() < self._deadline:
            return None
        reason = self._stop_reason or DEADLINE_REASON
        callbacks = self._take_loss(reason, at_deadline=True)
        if callbacks is None:
            return None
        return lambda: self._after_loss(reason, callbacks)

    def _done(self) -> bool:
        return self._released or self._is_lost

    def _after_fork_in_child(self) -> None:
        """This process is a forked child: the lease is its parent's. Lost at once (reason
        "fork"), never renewed (:meth:`_done`), never released (:meth:`_release_flow`). Only
        one thread runs in the child, and any other may have held this lease's locks at the
        fork: they are made anew. Callbacks are not run: they belong to the parent's code
        (the child sees ``lost`` and :attr:`lost_reason`)."""
        self._inherited = True
        self._state = threading.Lock()
        self._lost._lock = self._state
        self._risk._lock = self._state
        self._callbacks = []
        self._risk_callbacks = []
        if self._released or self._is_lost:
            return
        self.lost_reason = FORK_REASON
        event = self._lost._event
        reinit = getattr(event, "_at_fork_reinit", None)
        if reinit is not None:  # threading.Event: its condition may have been held at fork
            reinit()
        self._lost.set()

    def _mark_lost(self, reason: str) -> None:
        callbacks = self._take_loss(reason)
        if callbacks is not None:
            self._after_loss(reason, callbacks)

    def _after_loss(self, reason: str, callbacks: list[Callable[[Any], object]]) -> None:
        """What follows a loss once ``lost`` is set: hooks, the front end's part, callbacks."""
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

    def _take_loss(
        self, reason: str, *, at_deadline: bool = False
    ) -> list[Callable[[Any], object]] | None:
        """Mark lost; the callbacks to run, or None when it was already lost or released (or,
        ``at_deadline``, when a renewal moved the deadline past now in the meantime: the
        check and the renewal's update are serialized by ``_state``)."""
        with self._state:
            if self._is_lost or self._released:
                return None
            if at_deadline and time.monotonic() < self._deadline:
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


def _leases_after_fork_in_child() -> None:
    for lease in list(_live):
        lease._after_fork_in_child()


on_fork(_leases_after_fork_in_child)
