"""Leader election on the lock: ``client.election(key, ttl=10.0, name="host-1")``.

The leader is whoever holds the election's lock; its **term** is the lease (``term.fence`` is
the term number, strictly larger for each new leader, over 1 or N servers and restarts, so
storage can refuse a deposed leader's writes with it). The flows live in
``fencelock._core.election``; this module holds what both front ends share and the two thin
classes, :class:`Election` (blocking) and :class:`AsyncElection`.

- ``campaign(wait=math.inf)``: a context manager that blocks until this process leads and
  yields the term, renewed while the block runs; on loss it behaves as ``hold()`` does (asyncio:
  the body is cancelled and :class:`~fencelock.LockLost` raised; blocking: ``term.lost`` is set
  and ``LockLost`` raised when the block ends). Leaving the block hands leadership on at once
  (the release wakes the next campaigner).
- ``leader()``: ``Leader(name, fence, remaining)`` or ``None``, read without campaigning.
- ``observe(timeout=...)``: the leader each time it changes (first: the current one), woken by
  announcements and resignations (each observer blocks on a wake list of its own) and, when a
  leader just stops (killed, paused, cut off), at the moment its term runs out.
- ``resign()``: end the current term now (the campaign block then ends without error).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Generic, TypeVar

from ._async.driver import AsyncDriver
from ._async.lock import Lease as AsyncLease
from ._async.lock import Lock as AsyncLock
from ._core.effects import Flow
from ._core.election import Change, Leader, announce, leader_info, next_change, read_leader
from ._core.election import term_ended as term_ended_flow
from ._frontend.holder import new_token
from ._frontend.lease import LeaseState, log
from ._sync.driver import Driver
from ._sync.lock import Lease, Lock
from .errors import ConfigError
from .options import Seconds, seconds

__all__ = ["AsyncElection", "Election", "Leader", "default_name"]

L = TypeVar("L", Lock, AsyncLock)

#: An observer re-reads at least this often (s) even when nothing woke it, in case a wake-up
#: was lost (its wake server was down when the change was announced).
OBSERVE_POLL_MAX_S = 2.0


def default_name() -> str:
    """A campaigner's name when none is given: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"an election name must be a non-empty str, not {name!r}")
    return name


class _ElectionBase(Generic[L]):
    """What both front ends share: the lock, the name, and the flows with their arguments."""

    def __init__(self, lock: L, name: str) -> None:
        self._lock: L = lock
        self.name = check_name(name)
        definition = lock._definition
        self._definition = definition
        self._term: LeaseState | None = None

    @property
    def key(self) -> str:
        return self._lock.key

    @property
    def ttl(self) -> float:
        return self._lock.ttl

    @property
    def lock(self) -> L:
        """The election's lock (its holder is the leader)."""
        return self._lock

    def _wait(self, wait: Seconds) -> float:
        return seconds(wait, "wait", allow_zero=True, allow_inf=True)

    def _announce_flow(self, term: LeaseState) -> Flow[bool]:
        info = leader_info(self._definition.holder(), self.name, term.fence)
        return announce(self._definition.plan, term.token, info)

    def _announced(self, term: LeaseState, ok: bool) -> None:
        self._term = term
        if ok:
            log.info("%r: %s leads, term %d", self.key, self.name, term.fence)
        else:
            log.warning(
                "%r: %s leads (term %d) but too few servers took its name: leader() may "
                "not show it",
                self.key,
                self.name,
                term.fence,
            )

    def _ended_flow(self) -> Flow[None]:
        return term_ended_flow(self._definition.plan)

    def _read_flow(self) -> Flow[Any]:
        return read_leader(self._definition.plan)

    def _observer(self, timeout: Seconds) -> tuple[str, float, float]:
        """(observer id, until (monotonic s), poll period) of a new observation."""
        limit = seconds(timeout, "timeout", allow_zero=True, allow_inf=True)
        until = time.monotonic() + limit if math.isfinite(limit) else math.inf
        return new_token()[:16], until, min(OBSERVE_POLL_MAX_S, self.ttl)

    def _next_flow(
        self, observer: str, last: tuple[str, int] | bool | None, until: float, poll_s: float
    ) -> Flow[Change]:
        return next_change(self._definition.plan, observer, last, until, poll_s=poll_s)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, name={self.name!r}, ttl={self.ttl})"


def _seen(change: Change) -> tuple[str, int] | None:
    return None if change.leader is None else change.leader.term


class Election(_ElectionBase[Lock]):
    """A leader election (blocking); made by :meth:`fencelock.Client.election`."""

    def __init__(self, lock: Lock, name: str) -> None:
        super().__init__(lock, name)
        self._driver = Driver(lock._definition.servers, lock.options.server_timeout)

    @contextmanager
    def campaign(
        self,
        wait: Seconds = math.inf,
        *,
        on_lost: Callable[[Lease], object] | None = None,
    ) -> Iterator[Lease]:
        """Block until this process leads (up to ``wait`` s: :class:`~fencelock.NotAcquired`
        after that), then run the block as leader; the term (a :class:`~fencelock.Lease`) is
        renewed meanwhile. On loss ``term.lost`` is set and leaving the block raises
        :class:`~fencelock.LockLost`. Leaving the block hands leadership on at once."""
        leading = False
        try:
            with self._lock.hold(self._wait(wait), renew=True, on_lost=on_lost) as term:
                leading = True
                self._announced(term, self._driver.run(self._announce_flow(term)))
                yield term
        finally:
            self._term = None
            if leading:
                self._wake_observers()

    def resign(self) -> None:
        """End the current term now (no-op when not leading); observers are woken."""
        term, self._term = self._term, None
        if not isinstance(term, Lease):
            return
        term._release_quietly()
        self._wake_observers()

    def leader(self) -> Leader | None:
        """The current leader, read on every server (no campaign needed); ``None`` when
        nobody leads. Raises :class:`~fencelock.Unavailable` when the answers cannot tell:
        too few servers answered, or a holder could have a majority with the silent ones."""
        view = self._driver.run(self._read_flow())
        leader: Leader | None = view.leader
        return leader

    def observe(self, timeout: Seconds = math.inf) -> Iterator[Leader | None]:
        """Yield the leader (``None``: nobody leads) now and each time it changes, for up to
        ``timeout`` seconds (default: until the loop is left). Terms shorter than a round
        trip may be skipped; terms come in order (fences strictly grow). Raises
        :class:`~fencelock.Unavailable` (as :meth:`leader` does) as soon as a read cannot tell
        who leads: the last value yielded no longer stands; observe again to go on."""
        observer, until, poll_s = self._observer(timeout)
        last: tuple[str, int] | bool | None = False
        while True:
            change = self._driver.run(self._next_flow(observer, last, until, poll_s))
            if change.timed_out:
                return
            last = _seen(change)
            yield change.leader

    def _wake_observers(self) -> None:
        try:
            self._driver.run(self._ended_flow())
        except Exception as exc:  # observers also wake by their own poll
            log.debug("%r: waking observers failed: %s", self.key, exc)


class AsyncElection(_ElectionBase[AsyncLock]):
    """The asyncio twin of :class:`Election` (``fencelock.asyncio.Client.election``)."""

    def __init__(self, lock: AsyncLock, name: str) -> None:
        super().__init__(lock, name)
        self._driver = AsyncDriver(lock._definition.servers, lock.options.server_timeout)

    @asynccontextmanager
    async def campaign(
        self,
        wait: Seconds = math.inf,
        *,
        on_lost: Callable[[AsyncLease], object] | None = None,
    ) -> AsyncIterator[AsyncLease]:
        """``async with election.campaign() as term``: see :meth:`Election.campaign`; on loss
        the body is cancelled and :class:`~fencelock.LockLost` raised."""
        leading = False
        try:
            async with self._lock.hold(self._wait(wait), renew=True, on_lost=on_lost) as term:
                leading = True
                self._announced(term, await self._driver.run(self._announce_flow(term)))
                yield term
        finally:
            self._term = None
            if leading:
                await self._wake_observers()

    async def resign(self) -> None:
        """End the current term now (no-op when not leading); observers are woken."""
        term, self._term = self._term, None
        if not isinstance(term, AsyncLease):
            return
        await term._release_quietly()
        await self._wake_observers()

    async def leader(self) -> Leader | None:
        """See :meth:`Election.leader`."""
        view = await self._driver.run(self._read_flow())
        leader: Leader | None = view.leader
        return leader

    async def observe(self, timeout: Seconds = math.inf) -> AsyncIterator[Leader | None]:
        """``async for leader in election.observe()``: see :meth:`Election.observe`."""
        observer, until, poll_s = self._observer(timeout)
        last: tuple[str, int] | bool | None = False
        while True:
            change = await self._driver.run(self._next_flow(observer, last, until, poll_s))
            if change.timed_out:
                return
            last = _seen(change)
            yield change.leader

    async def _wake_observers(self) -> None:
        try:
            await self._driver.run(self._ended_flow())
        except Exception as exc:  # observers also wake by their own poll
            log.debug("%r: waking observers failed: %s", self.key, exc)
