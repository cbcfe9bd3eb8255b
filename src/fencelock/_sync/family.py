"""The blocking family beside :class:`~fencelock.Lock`: Semaphore, RWLock, MultiLock.

Each is the ordinary lock machinery on other flows or other keys (see ``fencelock._core``);
this module only drives them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, cast

from .._core.acquire import Grant
from .._frontend.definition import UNSET
from .._frontend.family import MultiFront, RWFront
from .._frontend.fronts import SemaphoreFront
from .._frontend.lease import check_max_hold
from ..options import Seconds
from .lock import Cancel, Lease, Lock, LostCallback, Permit, holding


class Semaphore(SemaphoreFront, Lock):
    __doc__ = SemaphoreFront.__doc__

    def acquire(self, wait: Seconds = UNSET, *, cancel: Cancel | None = None) -> Permit:
        """A permit, waiting up to ``wait`` seconds (ended early by ``cancel``); see
        :meth:`fencelock.Lock.acquire`."""
        cancelled = None if cancel is None else cancel.is_set
        return self._lease(self._driver.run(self._acquire_flow(wait, cancelled)))

    def try_acquire(self) -> Permit | None:
        """One attempt: a permit, or ``None`` when all ``limit`` are taken."""
        grant = self._driver.run(self._try_flow())
        return None if grant is None else self._lease(grant)

    def _lease(self, grant: Grant) -> Permit:
        return Permit(self, grant)

    @contextmanager
    def hold(
        self,
        wait: Seconds = UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
        at_least: Seconds | None = None,
    ) -> Iterator[Permit]:
        """``with sem.hold(wait=5) as permit``: a permit held (renewed with ``renew``) while
        the block runs, released after; see :meth:`fencelock.Lock.hold` for the arguments,
        the loss and what is raised."""
        with super().hold(
            wait, renew, max_hold=max_hold, on_lost=on_lost, at_least=at_least
        ) as permit:
            yield cast(Permit, permit)


class RWLock(RWFront[Lock]):
    __doc__ = RWFront.__doc__
    _lock_class = Lock

    def acquire_read(self, wait: Seconds = UNSET) -> Lease:
        """A reader's lease (many at once), waiting up to ``wait`` seconds."""
        return self._reader.acquire(wait)

    def acquire_write(self, wait: Seconds = UNSET) -> Lease:
        """The writer's lease (no reader, no other writer), waiting up to ``wait`` seconds."""
        return self._writer.acquire(wait)

    def try_read(self) -> Lease | None:
        return self._reader.try_acquire()

    def try_write(self) -> Lease | None:
        return self._writer.try_acquire()

    def read(self, wait: Seconds = UNSET, renew: bool = True, **kwargs: Any) -> Any:
        """``with rw.read(wait=5) as lease``: a reader's ``hold()``."""
        return self._reader.hold(wait, renew, **kwargs)

    def write(self, wait: Seconds = UNSET, renew: bool = True, **kwargs: Any) -> Any:
        """``with rw.write(wait=5) as lease``: the writer's ``hold()``."""
        return self._writer.hold(wait, renew, **kwargs)


class MultiLock(MultiFront[Lock]):
    __doc__ = MultiFront.__doc__
    _lock_class = Lock

    def acquire(self, wait: Seconds = UNSET) -> tuple[Lease, ...]:
        """Every key's lease (in sorted key order), or NotAcquired/Unavailable with none held."""
        return self._leases(self._driver.run(self._acquire_flow(wait)))

    def try_acquire(self) -> tuple[Lease, ...] | None:
        """One attempt per key: every lease, or ``None`` (nothing held) when one is taken."""
        grants = self._driver.run(self._try_flow())
        return None if grants is None else self._leases(grants)

    @contextmanager
    def hold(
        self,
        wait: Seconds = UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
    ) -> Iterator[tuple[Lease, ...]]:
        """``with multi.hold() as leases``: all keys held and renewed while the block runs,
        all released after; LockLost on leaving when any of them was lost."""
        cap = check_max_hold(max_hold)
        leases = self.acquire(wait)
        with ExitStack() as stack:
            try:
                for lease in leases:
                    stack.enter_context(holding(lease, renew, cap, on_lost))
            except BaseException:
                for lease in leases:
                    lease._release_quietly()
                raise
            yield leases

    def _leases(self, grants: tuple[Grant, ...]) -> tuple[Lease, ...]:
        return tuple(lock._lease(g) for lock, g in zip(self._locks, grants, strict=True))
