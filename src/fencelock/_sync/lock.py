"""The blocking :class:`Lock` and :class:`Lease`: the flows of ``fencelock._core`` driven by
the blocking driver. Nothing here decides anything the flows decide."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, cast

from .._core.acquire import Grant
from .._frontend.context import pop_held, push_held
from .._frontend.definition import UNSET, Definition
from .._frontend.fronts import LockFront
from .._frontend.lease import LeaseState, hold_limits, lingers, log
from .._frontend.reentry import HeldBase
from ..errors import LockLost
from ..options import Seconds
from .driver import Driver
from .renewal import Renewal, scheduler, watch_deadline

if TYPE_CHECKING:  # redis-py is not imported for a type: a URL needs none of it
    import redis

    ServerSpec = str | redis.Redis
    Servers = ServerSpec | Sequence[ServerSpec]
LostCallback = Callable[["Lease"], object]


class Cancel(Protocol):
    """What ``acquire(cancel=)`` takes: a :class:`threading.Event`, or any flag like it."""

    def is_set(self) -> bool: ...


class Lock(LockFront):
    __doc__ = LockFront.__doc__

    def _setup(self, definition: Definition) -> None:
        super()._setup(definition)
        self._driver = Driver(definition.servers, definition.options.server_timeout)

    def acquire(self, wait: Seconds = UNSET, *, cancel: Cancel | None = None) -> Lease:
        """Acquire, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        ``wait=0`` makes exactly one attempt. Waiters are woken when the holder releases.
        ``cancel``: a :class:`threading.Event` (or anything with an ``is_set()`` method; only
        that is called, so a signal handler may flip it) that ends the wait early once set:
        the call raises as at its deadline, about 50 ms later (or once the round in flight,
        if any, ended), making no attempt after it was seen; a grant that came as it was set
        is returned (release it). One call waits as one waiter, keeping its place in line,
        where calls of a short ``wait`` in a loop would each join the line anew.
        Raises :class:`~fencelock.NotAcquired` when others still hold it at the deadline,
        :class:`~fencelock.Unavailable` when too few servers answered to reach a majority,
        :class:`~fencelock.ConfigError` for a bad ``wait`` or servers that are not independent.
        """
        cancelled = None if cancel is None else cancel.is_set
        reentry = self._reentry
        if reentry is None:
            return self._lease(self._driver.run(self._acquire_flow(wait, cancelled)))
        current = threading.current_thread()
        entry = reentry.again(self._lock_id, current)
        if entry is None:
            lease = self._lease(self._driver.run(self._acquire_flow(wait, cancelled)))
            entry = reentry.first(self._lock_id, current, lease)
        return cast(Lease, Held(entry))

    def try_acquire(self) -> Lease | None:
        """One attempt: a :class:`Lease`, or ``None`` when another holder has the lock.

        Raises :class:`~fencelock.Unavailable` (not ``None``) when servers did not answer.
        """
        reentry = self._reentry
        current = threading.current_thread()
        entry = None if reentry is None else reentry.again(self._lock_id, current)
        if entry is not None:
            return cast(Lease, Held(entry))
        grant = self._driver.run(self._try_flow())
        if grant is None:
            return None
        lease = self._lease(grant)
        if reentry is None:
            return lease
        return cast(Lease, Held(reentry.first(self._lock_id, current, lease)))

    def _lease(self, grant: Grant) -> Lease:
        return Lease(self, grant)

    @contextmanager
    def hold(
        self,
        wait: Seconds = UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
        at_least: Seconds | None = None,
    ) -> Iterator[Lease]:
        """Acquire, run the block, release. With ``renew`` a watchdog keeps the lease alive.

        If the lease is lost while the block runs, ``lease.lost`` is set no later than its
        local deadline and ``on_lost`` is called (a thread cannot be interrupted safely: check
        ``lease.ensure_valid()`` between steps); leaving the block then raises
        :class:`~fencelock.LockLost`, unless the block raised its own exception.
        ``max_hold`` (seconds) stops renewal after that long; the lease then runs out and is
        reported lost like any other loss.

        ``at_least`` (seconds): when the block ends (normally or with an ``Exception``) sooner
        than that after the acquisition, the lock is kept (renewed if need be) and released in
        the background at ``acquired_at + at_least``, so a short job does not run again
        elsewhere too soon (a host whose clock is behind, say). An interruption
        (KeyboardInterrupt, SystemExit) releases at once.
        """
        cap, least = hold_limits(max_hold, at_least)
        lease = self.acquire(wait)
        with holding(lease, renew, cap, on_lost, least):
            yield lease

    def __enter__(self) -> Lease:
        """``with lock as lease``: acquire (the lock's default ``wait``), release on exit.

        This is the **un-renewed** form: nothing extends the lease while the block runs, so
        a block that outlasts ``ttl`` runs on without the lock (``lease.remaining()`` falls
        to 0; no timer sets ``lease.lost``). Use :meth:`hold` (``with lock.hold() as
        lease``) for a lease renewed until the block ends and :class:`~fencelock.LockLost`
        when it was lost. Raises as
        :meth:`acquire` does; leaving the block raises :class:`~fencelock.LockLost` if the
        release found the lock no longer ours.
        """
        lease = self.acquire()
        push_held(self, lease)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease: Lease = pop_held(self)
        if exc_type is not None:
            lease._release_quietly()
        else:
            lease.release()

    def close(self) -> None:
        """No new acquisitions from this Lock. Connections are shared process-wide and stay;
        leases already handed out can still be extended and released."""
        self._closed = True


@contextmanager
def holding(
    lease: Lease,
    renew: bool,
    max_hold: float | None,
    on_lost: LostCallback | None,
    at_least: float | None = None,
) -> Iterator[None]:
    """The body of ``hold()`` around a lease already acquired: renewal (or the deadline
    watch) while it runs, release after (or at ``acquired_at + at_least``), LockLost if it
    was lost meanwhile."""
    try:
        if on_lost is not None:
            lease.on_lost(on_lost)
        if renew:
            lease.keep_alive(max_hold=max_hold)  # also watches the deadline
        else:
            watch_deadline(lease)
        yield
    except BaseException as exc:
        if not (lingers(type(exc)) and lease._linger(at_least)):
            lease._release_quietly()
        raise
    if lease._is_lost or not lease._linger(at_least):
        lease._finish()


class Lease(LeaseState):
    """One acquisition: the proof of ownership (``token``), the fencing number (``fence``) and
    the validity (``remaining()``). Hand ``fence`` to storage with every write.

    ``lost`` is a :class:`threading.Event` set as soon as the lease is known lost;
    ``at_risk`` one set while a renewal was not confirmed (cleared by the next one that is).
    """

    def __init__(self, lock: Lock, grant: Grant) -> None:
        super().__init__(lock._grant_definition(grant), grant)
        self.lock = lock
        self._driver = lock._driver
        self._renewal: Renewal | None = None

    @property
    def lost(self) -> threading.Event:
        """Set as soon as the lease is known lost (never cleared)."""
        return cast(threading.Event, self._lost.event())

    @property
    def at_risk(self) -> threading.Event:
        """Set while a renewal was not confirmed; cleared by the next one that is."""
        return cast(threading.Event, self._risk.event())

    @staticmethod
    def _new_flag() -> threading.Event:
        return threading.Event()

    def extend(self, ttl: Seconds | None = None) -> None:
        """Restart the lease at ``ttl`` seconds (default: the lock's ttl) on a majority.

        Raises :class:`~fencelock.LockLost` when the lease is no longer ours (it is then
        marked lost), :class:`~fencelock.Unavailable` when too few servers answered while the
        lease was still valid. After an extend whose outcome is unknown, the lease keeps the
        earlier of its old and its new deadline.
        """
        try:
            self._extended(self._driver.run(self._extend_flow(ttl)))
        finally:
            self._rearm()

    def _deadline_lowered(self) -> None:
        if self._renewal is not None:
            watch_deadline(self)

    def _rearm(self) -> None:
        """After a change of deadline (a user's extend): the next renewal and the deadline
        timer follow the new deadline (a shorter lease left them at the old one's pace)."""
        if self._done() or self._renewal is None:
            return
        self._renewal.stop()
        self._renewal = Renewal(self, self._next_renewal(time.monotonic(), self._every_s))
        watch_deadline(self)

    def release(self) -> None:
        """Delete the lock wherever it is still ours (compare-and-delete); renewal stops first.

        Raises :class:`~fencelock.LockLost` if it had already expired or been taken,
        :class:`~fencelock.Unavailable` if too few servers confirmed (the keys then expire by
        their TTL, and the release is repeated in the background where no answer came).
        Releasing twice is a no-op.
        """
        self._stop_renewal()
        flow = self._release_flow()
        if flow is None:
            return
        verdict = self._driver.run(flow)
        if verdict.error is not None:
            raise verdict.error
        log.debug("released %r", self.key)

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is).

        Callbacks run on a fencelock thread: keep them short; exceptions are logged.
        """
        if not self._add_callback(callback):
            self._run_callback(callback)

    def keep_alive(self, *, every: Seconds | None = None, max_hold: Seconds | None = None) -> None:
        """Renew the lease in the background every ``every`` s (default ``ttl/3``) until it is
        released, lost, or ``max_hold`` seconds after it was acquired (then it is let expire
        and reported lost at its deadline). The lease is held weakly."""
        first = self._renewal_plan(every, max_hold)
        self._stop_renewal()
        self._renewal = Renewal(self, first)
        watch_deadline(self)

    # -- called on fencelock threads ----------------------------------------------------------

    def _renew_step(self) -> float | None:
        return self._renewed(self._driver.run(self._renew_flow()))

    def _linger(self, at_least: float | None) -> bool:
        """Keep the lock until ``acquired_at + at_least`` and release it then on the timers
        thread (renewing meanwhile if it would run out first); False: release it now."""
        at = self._release_at(at_least)
        if at is None:
            return False
        if self._renewal is None and self._deadline < at:
            self.keep_alive()
        # the timer holds the lease strongly on purpose: it must live until released
        scheduler().at(at, lambda: scheduler().submit(self._release_quietly))
        log.debug("%r kept until %.3f s after acquisition (at_least)", self.key, at_least)
        return True

    def _lost_hook(self) -> None:
        self._stop_renewal()

    def _stop_renewal(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            renewal.stop()

    def _release_quietly(self) -> None:
        try:
            self.release()
        except Exception as exc:
            level = 10 if self._is_lost else 30  # DEBUG / WARNING
            log.log(level, "release of %r after an error failed: %s", self.key, exc)

    def _finish(self) -> None:
        """End of a ``hold()`` block that did not raise: release, and report a loss."""
        if self.lost.is_set():
            reason = self.lost_reason
            self._release_quietly()
            raise LockLost(self.key, f"{self.key!r}: lease lost while the block ran ({reason})")
        self.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._release_quietly()
        else:
            self.release()


class Permit(Lease):
    """A semaphore's permit: a :class:`Lease` on one of its slots; ``slot`` is which
    (0..limit-1)."""

    def __init__(self, lock: Lock, grant: Grant) -> None:
        super().__init__(lock, grant)
        self.slot = grant.slot


class Held(HeldBase):
    """A reentrant lock's lease as one acquisition of its owner sees it: the shared lease's
    token, fence and state; ``release()`` frees the lock only at the outermost one."""

    __slots__ = ()

    def release(self) -> None:
        if self._leave() and not self._kept_at_release():
            self._entry.lease.release()

    def _release_quietly(self) -> None:
        if self._leave():
            self._entry.lease._release_quietly()

    def _finish(self) -> None:
        lease = self._entry.lease
        if self._leave():
            lease._finish()
        elif lease.lost.is_set():
            raise LockLost(lease.key, f"{lease.key!r}: lease lost while the block ran")

    def __enter__(self) -> Held:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._release_quietly()
        else:
            self.release()
