"""The asyncio family beside :class:`fencelock.asyncio.Lock`: Semaphore, RWLock, MultiLock
(same arguments and meaning as the blocking ones in ``fencelock``)."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any, cast

from .._core.acquire import Grant
from .._frontend.definition import UNSET
from .._frontend.family import MultiFront, RWFront
from .._frontend.fronts import SemaphoreFront
from .._frontend.lease import check_max_hold, hold_limits
from ..options import Seconds
from .lock import Lease, Lock, LostCallback, Permit, _Hold


class Semaphore(SemaphoreFront, Lock):
    __doc__ = SemaphoreFront.__doc__

    async def acquire(self, wait: Seconds = UNSET) -> Permit:
        """A permit, waiting up to ``wait`` seconds; see :meth:`fencelock.Semaphore.acquire`."""
        return self._lease(await self._driver.run(self._acquire_flow(wait)))

    async def try_acquire(self) -> Permit | None:
        """One attempt: a permit, or ``None`` when all ``limit`` are taken."""
        grant = await self._driver.run(self._try_flow())
        return None if grant is None else self._lease(grant)

    def _lease(self, grant: Grant) -> Permit:
        return Permit(self, grant)

    def hold(
        self,
        wait: Seconds = UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
        at_least: Seconds | None = None,
    ) -> _PermitHold:
        """``async with sem.hold(wait=5) as permit``: see :meth:`fencelock.asyncio.Lock.hold`
        (on loss the block is cancelled and :class:`~fencelock.LockLost` raised)."""
        cap, least = hold_limits(max_hold, at_least)
        return _PermitHold(lambda: self.acquire(wait), renew, cap, on_lost, least)


class _PermitHold(_Hold):
    """``Semaphore.hold()``: the lock's hold context, typed as giving a :class:`Permit`."""

    async def __aenter__(self) -> Permit:
        return cast(Permit, await super().__aenter__())


class RWLock(RWFront[Lock]):
    __doc__ = RWFront.__doc__
    _lock_class = Lock

    async def acquire_read(self, wait: Seconds = UNSET) -> Lease:
        return await self._reader.acquire(wait)

    async def acquire_write(self, wait: Seconds = UNSET) -> Lease:
        return await self._writer.acquire(wait)

    async def try_read(self) -> Lease | None:
        return await self._reader.try_acquire()

    async def try_write(self) -> Lease | None:
        return await self._writer.try_acquire()

    def read(self, wait: Seconds = UNSET, renew: bool = True, **kwargs: Any) -> _Hold:
        """``async with rw.read(wait=5) as lease``: a reader's ``hold()``."""
        return self._reader.hold(wait, renew, **kwargs)

    def write(self, wait: Seconds = UNSET, renew: bool = True, **kwargs: Any) -> _Hold:
        """``async with rw.write(wait=5) as lease``: the writer's ``hold()``."""
        return self._writer.hold(wait, renew, **kwargs)


class MultiLock(MultiFront[Lock]):
    __doc__ = MultiFront.__doc__
    _lock_class = Lock

    async def acquire(self, wait: Seconds = UNSET) -> tuple[Lease, ...]:
        return self._leases(await self._driver.run(self._acquire_flow(wait)))

    async def try_acquire(self) -> tuple[Lease, ...] | None:
        grants = await self._driver.run(self._try_flow())
        return None if grants is None else self._leases(grants)

    def hold(
        self,
        wait: Seconds = UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
    ) -> _MultiHold:
        """``async with multi.hold() as leases``: all renewed, all released; if any is lost
        the block is cancelled and LockLost raised."""
        cap = check_max_hold(max_hold)
        return _MultiHold(self, wait, renew, cap, on_lost)

    def _leases(self, grants: tuple[Grant, ...]) -> tuple[Lease, ...]:
        return tuple(lock._lease(g) for lock, g in zip(self._locks, grants, strict=True))


class _MultiHold:
    def __init__(
        self,
        multi: MultiLock,
        wait: Seconds,
        renew: bool,
        max_hold: float | None,
        on_lost: LostCallback | None,
    ) -> None:
        self._multi = multi
        self._wait = wait
        self._hold = (renew, max_hold, on_lost)
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> tuple[Lease, ...]:
        leases = await self._multi.acquire(self._wait)
        try:
            for lease in leases:
                await self._stack.enter_async_context(_Hold(_given(lease), *self._hold))
        except BaseException:
            for lease in leases:
                await lease._release_quietly()
            raise
        return leases

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return bool(await self._stack.__aexit__(exc_type, exc, tb))


def _given(lease: Lease) -> Any:
    async def already() -> Lease:
        return lease

    return already
