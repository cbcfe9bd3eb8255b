"""The asyncio :class:`Lock` and :class:`Lease`: the flows of ``fencelock._core`` driven by the
asyncio driver. Same arguments and meaning as the blocking front end."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

import redis.asyncio as aredis

from .._core.acquire import Grant
from .._frontend.context import pop_held, push_held
from .._frontend.definition import UNSET, Definition
from .._frontend.fronts import LockFront
from .._frontend.lease import LeaseState, hold_limits, lingers, log
from .._frontend.reentry import HeldBase
from ..errors import LockLost
from ..options import Seconds
from .driver import AsyncDriver, keep

ServerSpec = str | aredis.Redis
Servers = ServerSpec | Sequence[ServerSpec]
LostCallback = Callable[["Lease"], object]


class Lock(LockFront):
    __doc__ = LockFront.__doc__

    def _setup(self, definition: Definition) -> None:
        super()._setup(definition)
        self._driver = AsyncDriver(definition.servers, definition.options.server_timeout)

    async def acquire(self, wait: Seconds = UNSET) -> Lease:
        """Acquire, waiting up to ``wait`` seconds; see :meth:`fencelock.Lock.acquire`.

        Cancelling the caller cancels the wait; a grant that may have landed is released in
        a task of its own that the cancellation cannot stop.
        """
        reentry = self._reentry
        if reentry is None:
            return self._lease(await self._driver.run(self._acquire_flow(wait)))
        current = asyncio.current_task()
        entry = reentry.again(self._lock_id, current)
        if entry is None:
            lease = self._lease(await self._driver.run(self._acquire_flow(wait)))
            entry = reentry.first(self._lock_id, current, lease)
        return cast(Lease, Held(entry))

    async def try_acquire(self) -> Lease | None:
        """One attempt: a :class:`Lease`, or ``None`` when another holder has the lock."""
        reentry = self._reentry
        current = asyncio.current_task()
        entry = None if reentry is None else reentry.again(self._lock_id, current)
        if entry is not None:
            return cast(Lease, Held(entry))
        grant = await self._driver.run(self._try_flow())
        if grant is None:
            return None
        lease = self._lease(grant)
        if reentry is None:
            return lease
        return cast(Lease, Held(reentry.first(self._lock_id, current, lease)))

    def _lease(self, grant: Grant) -> Lease:
        return Lease(self, grant)

    def hold(
        self,
        wait: Seconds = UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
        at_least: Seconds | None = None,
    ) -> _Hold:
        """``async with lock.hold() as lease``: acquire, renew, release. If the lease is lost
        while the block runs, the block is cancelled and :class:`~fencelock.LockLost` raised.
        ``at_least``: see :meth:`fencelock.Lock.hold` (the release then runs in a task of
        its own, kept until done)."""
        cap, least = hold_limits(max_hold, at_least)
        return _Hold(lambda: self.acquire(wait), renew, cap, on_lost, least)

    async def __aenter__(self) -> Lease:
        """``async with lock as lease``: acquire (the lock's default ``wait``), release on
        exit. The **un-renewed** form: nothing extends the lease and nothing cancels the body
        when it runs out; use :meth:`hold` for a renewed lease whose loss cancels the body and
        raises :class:`~fencelock.LockLost`."""
        lease = await self.acquire()
        push_held(self, lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease: Lease = pop_held(self)
        if exc_type is not None:
            await lease._release_quietly()
        else:
            await lease.release()

    async def aclose(self) -> None:
        """No new acquisitions from this Lock; leases handed out can still be released."""
        self._closed = True


class Lease(LeaseState):
    """One acquisition (see :class:`fencelock.Lease`); ``lost`` and ``at_risk`` are
    :class:`asyncio.Event` objects."""

    def __init__(self, lock: Lock, grant: Grant) -> None:
        super().__init__(lock._grant_definition(grant), grant)
        self.lock = lock
        self._driver = lock._driver
        self._renewal: asyncio.Future[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._body: asyncio.Task[Any] | None = None
        self._cancelled_body = False

    @property
    def lost(self) -> asyncio.Event:
        """Set as soon as the lease is known lost (never cleared)."""
        return cast(asyncio.Event, self._lost.event())

    @property
    def at_risk(self) -> asyncio.Event:
        """Set while a renewal was not confirmed; cleared by the next one that is."""
        return cast(asyncio.Event, self._risk.event())

    @staticmethod
    def _new_flag() -> asyncio.Event:
        return asyncio.Event()

    async def extend(self, ttl: Seconds | None = None) -> None:
        """Restart the lease at ``ttl`` seconds on a majority (see
        :meth:`fencelock.Lease.extend`)."""
        try:
            self._extended(await self._driver.run(self._extend_flow(ttl)))
        finally:
            self._rearm()

    def _deadline_lowered(self) -> None:
        if self._timer is not None:
            self._watch_deadline()

    def _rearm(self) -> None:
        """After a change of deadline (a user's extend): the next renewal and the deadline
        timer follow the new deadline (a shorter lease left them at the old one's pace)."""
        if self._done():
            return
        if self._renewal is not None:
            self._stop_renewal()
            first = self._next_renewal(time.monotonic(), self._every_s)
            self._renewal = keep(asyncio.ensure_future(_renew(weakref.ref(self), first)))
        if self._timer is not None:
            self._watch_deadline()

    async def release(self) -> None:
        """Compare-and-delete everywhere; see :meth:`fencelock.Lease.release`. The release runs
        in a task of its own: cancelling the caller does not stop it. Twice is a no-op."""
        self._stop_renewal()
        flow = self._release_flow()
        if flow is None:
            return
        verdict = await self._driver.run(flow, shielded=True)
        if verdict.error is not None:
            raise verdict.error

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is)."""
        if not self._add_callback(callback):
            self._run_callback(callback)

    def keep_alive(self, *, every: Seconds | None = None, max_hold: Seconds | None = None) -> None:
        """Renew in the background every ``every`` s (default ``ttl/3``) until released, lost,
        or ``max_hold`` s after acquisition (then it runs out and is reported lost at its
        deadline). The renewal task holds the lease weakly."""
        first = self._renewal_plan(every, max_hold)
        self._stop_renewal()
        self._renewal = keep(asyncio.ensure_future(_renew(weakref.ref(self), first)))
        self._watch_deadline()

    # -- internals ----------------------------------------------------------------------------

    def _watch_deadline(self) -> None:
        """Declare the lease lost at its local deadline unless it was extended or ended."""
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        ref = weakref.ref(self)

        def check() -> None:
            lease = ref()
            if lease is None or lease._done():
                return
            if time.monotonic() >= lease._deadline:
                lease._deadline_passed()
            else:
                lease._timer = loop.call_later(lease._deadline - time.monotonic(), check)

        self._timer = loop.call_later(max(0.0, self._deadline - time.monotonic()), check)

    def _linger(self, at_least: float | None) -> bool:
        """Keep the lock until ``acquired_at + at_least``, then release it in a kept task
        (renewing meanwhile if it would run out first); False: release it now."""
        at = self._release_at(at_least)
        if at is None:
            return False
        if self._renewal is None and self._deadline < at:
            self.keep_alive()
        keep(asyncio.ensure_future(self._release_later(at)))
        return True

    async def _release_later(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        await self._release_quietly()

    def _lost_hook(self) -> None:
        self._stop_renewal()
        body = self._body
        if body is not None and not body.done():
            self._cancelled_body = True
            body.cancel()

    def _stop_renewal(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None and not renewal.done():
            renewal.cancel()

    async def _release_quietly(self) -> None:
        try:
            await self.release()
        except Exception as exc:
            level = 10 if self._is_lost else 30  # DEBUG / WARNING
            log.log(level, "release of %r after an error failed: %s", self.key, exc)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            await self._release_quietly()
        else:
            await self.release()


async def _renew(ref: weakref.ref[Lease], first_at: float) -> None:
    """The renewal loop of one lease; holds it only while a step runs."""
    next_at: float | None = first_at
    while next_at is not None:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        lease = ref()
        if lease is None or lease._done():
            return
        step = await lease._driver.run(lease._renew_flow())
        next_at = lease._renewed(step)
        del lease


@dataclass(eq=False)
class _Hold:
    """The ``async with lock.hold(...)`` context: cancel-scope semantics on loss."""

    acquire: Callable[[], Awaitable[Lease]]
    renew: bool
    max_hold: float | None
    on_lost: LostCallback | None
    at_least: float | None = None
    lease: Lease | None = field(default=None, init=False)

    async def __aenter__(self) -> Lease:
        lease = await self.acquire()
        self.lease = lease
        if self.on_lost is not None:
            lease.on_lost(self.on_lost)
        lease._body = asyncio.current_task()
        if self.renew:
            lease.keep_alive(max_hold=self.max_hold)
        else:
            lease._watch_deadline()
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        lease = self.lease
        assert lease is not None
        lease._body = None
        ours = lease._cancelled_body
        task = asyncio.current_task()
        if ours and task is not None and hasattr(task, "uncancel"):
            task.uncancel()
        if not lease._is_lost and lingers(exc_type) and lease._linger(self.at_least):
            return False
        if exc_type is not None and not (ours and exc_type is asyncio.CancelledError):
            await lease._release_quietly()
            return False
        reason = lease.lost_reason
        try:
            if lease.lost.is_set():
                await lease._release_quietly()
            else:
                await lease.release()
                return False
        except asyncio.CancelledError:
            if not ours:
                raise
            # our own cancellation arrived after the body had finished: it is consumed here
        raise LockLost(
            lease.key, f"{lease.key!r}: lease lost while the block ran ({reason})"
        ) from (exc if ours else None)


class Permit(Lease):
    """A semaphore's permit (see :class:`fencelock.Permit`): a lease plus its ``slot``."""

    def __init__(self, lock: Lock, grant: Grant) -> None:
        super().__init__(lock, grant)
        self.slot = grant.slot


class Held(HeldBase):
    """A reentrant lock's lease as one acquisition of its owner task sees it: the shared
    lease's token, fence and state; ``release()`` frees the lock only at the outermost one."""

    __slots__ = ()

    async def release(self) -> None:
        if self._leave() and not self._kept_at_release():
            await self._entry.lease.release()

    async def _release_quietly(self) -> None:
        if self._leave():
            await self._entry.lease._release_quietly()

    async def __aenter__(self) -> Held:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            await self._release_quietly()
        else:
            await self.release()
