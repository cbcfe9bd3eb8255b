"""The asyncio :class:`Lock` and :class:`Lease`: thin I/O shells over ``fencelock._core``.

Same algorithm and decisions as the blocking front end (both call the same pure functions).
Differences that asyncio allows: ``async with lock.hold(renew=True)`` *cancels* its body when
the lease is lost and raises :class:`~fencelock.LockLost` from the block; every cleanup after a
failure or a cancellation runs shielded, so a cancelled acquire never leaves a lock behind.
A Lock belongs to the event loop that first uses it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

import redis.asyncio as aredis

from .._common import (
    acquire_replies,
    classify_acquire,
    classify_flag,
    failure,
    holder_info,
    needs_cleanup,
    new_token,
    patience_ms,
    pop_held,
    push_held,
    recheck_delay,
    register_server,
    votes,
)
from .._core.backoff import retry_delay_s
from .._core.fencing import needs_commit
from .._core.quorum import Outcome, Tally, summary
from .._core.rounds import AcquireDecision, Status, decide_acquire, decide_confirm, lost_for_sure
from .._core.timing import drift_ms, seconds_to_ms
from .._scripts import ACQUIRE, EXTEND, FENCE_COMMIT, RELEASE
from .._servers_spec import split_servers
from .._shells import LeaseBase, LockBase
from ..errors import ConfigError, LockLost, Unavailable
from ..options import (
    DEFAULT_TTL,
    DEFAULT_WAIT,
    DRIFT_FACTOR,
    DRIFT_MIN,
    HANDOFF_WINDOW,
    RETRY_BASE,
    RETRY_CAP,
    LockOptions,
    Seconds,
    check_key,
    seconds,
)
from .fanout import Stragglers, fan_out, run_in_background
from .node import AsyncNode

log = logging.getLogger("fencelock.lock")
wlog = logging.getLogger("fencelock.watchdog")

ServerSpec = str | aredis.Redis
Servers = ServerSpec | Sequence[ServerSpec]
LostCallback = Callable[["Lease"], object]
RETRY_FLOOR = 0.01
LATE_RELEASE_FIRST = 0.05  # seconds; doubled up to LATE_RELEASE_MAX
LATE_RELEASE_MAX = 1.0


class _Unset:
    def __repr__(self) -> str:
        return "<lock default>"


_UNSET: Any = _Unset()


def _cancel_requests() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None and hasattr(task, "cancelling") else 0


async def _shielded(coro: Awaitable[Any]) -> Any:
    """Run a cleanup to completion even if the caller is cancelled meanwhile."""
    task = run_in_background(_wrap(coro))
    return await asyncio.shield(task)


async def _wrap(coro: Awaitable[Any]) -> Any:
    return await coro


class Lock(LockBase):
    """The asyncio twin of :class:`fencelock.Lock`; same arguments, same meaning (seconds).

    Raises :class:`~fencelock.ConfigError` for any bad argument, before any I/O.
    """

    _nodes: list[AsyncNode]

    def __init__(
        self,
        servers: Servers,
        key: str,
        ttl: Seconds = DEFAULT_TTL,
        *,
        wait: Seconds = DEFAULT_WAIT,
        server_timeout: Seconds | None = None,
        drift_factor: float = DRIFT_FACTOR,
        drift_min: Seconds = DRIFT_MIN,
        retry_base: Seconds = RETRY_BASE,
        retry_cap: Seconds = RETRY_CAP,
        renew_every: Seconds | None = None,
        handoff_window: Seconds = HANDOFF_WINDOW,
        holder_info: bool = True,
        purpose: str | None = None,
    ) -> None:
        self.key = check_key(key)
        self.options = LockOptions.build(
            ttl=ttl,
            wait=wait,
            server_timeout=server_timeout,
            drift_factor=drift_factor,
            drift_min=drift_min,
            retry_base=retry_base,
            retry_cap=retry_cap,
            renew_every=renew_every,
            handoff_window=handoff_window,
            holder_info=holder_info,
            purpose=purpose,
        )
        specs = split_servers(servers, (aredis.Redis,))
        self._nodes = [AsyncNode(spec, self.options.server_timeout) for spec in specs]
        self._configure()
        self._independence_lock: asyncio.Lock | None = None

    async def acquire(self, wait: Seconds = _UNSET) -> Lease:
        """Acquire, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        ``wait=0`` makes exactly one attempt. Raises :class:`~fencelock.NotAcquired`
        (contention), :class:`~fencelock.Unavailable` (too few servers answered),
        :class:`~fencelock.ConfigError` (bad ``wait``). Safe to cancel at any point: whatever
        may have landed on a server is released in a shielded cleanup.
        """
        wait_s = (
            self.options.wait
            if wait is _UNSET
            else seconds(wait, "wait", allow_zero=True, allow_inf=True)
        )
        await self._check_independence()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        attempt = 0
        woken = False
        waiter = new_token()[:16] if wait_s > 0 else "-"  # an id only for who will wait
        while True:
            attempt += 1
            outcome = await self._attempt(woken, waiter, patience_ms(deadline, loop.time()))
            if isinstance(outcome, Lease):
                return outcome
            decision, tally = outcome
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise failure(self.key, decision, tally, self.servers, attempt)
            delay = retry_delay_s(
                attempt=attempt - 1,
                remaining_s=remaining,
                holder_pttl_ms=decision.holder_pttl_ms,
                base_s=self.options.retry_base,
                cap_s=self.options.retry_cap,
                rand=random.random(),
            )
            woken = await self._pause(delay, tally)

    async def try_acquire(self) -> Lease | None:
        """One attempt: a :class:`Lease`, or ``None`` when another holder has the lock.

        Raises :class:`~fencelock.Unavailable` (not ``None``) when servers did not answer.
        """
        await self._check_independence()
        outcome = await self._attempt(False, "-", 0)
        if isinstance(outcome, Lease):
            return outcome
        decision, tally = outcome
        if decision.status is Status.CONTENTION:
            return None
        raise failure(self.key, decision, tally, self.servers, 1)

    def hold(
        self,
        wait: Seconds = _UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
    ) -> _Hold:
        """``async with lock.hold(...) as lease``: acquire, run the body, release.

        With ``renew`` a watchdog keeps the lease alive. If the lease is lost, the body is
        cancelled and the block raises :class:`~fencelock.LockLost` (no ``CancelledError``
        leaks out). ``max_hold`` (seconds) stops renewal after that long.
        """
        cap = None if max_hold is None else seconds(max_hold, "max_hold")
        return _Hold(self, wait, renew, cap, on_lost)

    async def __aenter__(self) -> Lease:
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
        """Close this lock's connections."""
        for node in self._nodes:
            await node.aclose()

    # -- rounds -------------------------------------------------------------------------------

    async def _check_independence(self) -> None:
        if self._independent:
            return
        if self._independence_lock is None:
            self._independence_lock = asyncio.Lock()
        async with self._independence_lock:
            if self._independent:
                return
            for index, node in enumerate(self._nodes):
                if index in self._run_ids or time.monotonic() < self._recheck_at.get(index, 0.0):
                    continue
                try:
                    run_id, role = await node.identity()
                except Exception as exc:  # unreachable now: checked again at a later acquire
                    level = logging.DEBUG if index in self._recheck_at else logging.WARNING
                    log.log(level, "identity check of %s failed: %s", node.name, exc)
                    self._recheck_at[index] = time.monotonic() + recheck_delay(exc)
                    continue
                register_server(self._run_ids, index, run_id, role, self.servers)
            self._independent = len(self._run_ids) == len(self._nodes)

    async def _attempt(
        self, woken: bool, waiter: str, patience: int
    ) -> Lease | tuple[AcquireDecision, Tally]:
        token = new_token()
        info = holder_info(self.options.purpose) if self.options.holder_info else ""
        args = (token, self._ttl_ms, info, "1" if woken else "0", waiter, patience)
        nodes = self._nodes
        tally = Tally(len(nodes))
        cancels_before = _cancel_requests()
        start = time.monotonic()
        stragglers = None
        try:
            stragglers = await fan_out(
                tally,
                range(len(nodes)),
                lambda i: nodes[i].run(ACQUIRE, self._acquire_keys, args),
                classify_acquire,
                budget_s=self._budget,
                stop=lambda t: t.won,
                keep_stragglers=True,
            )
            decision = decide_acquire(
                tally,
                acquire_replies(tally),
                ttl_ms=self._ttl_ms,
                elapsed_ms=(time.monotonic() - start) * 1000,
                drift=self._drift_ms,
            )
            if decision.status is Status.GRANTED and needs_commit(len(nodes)):
                decision = await self._commit_fence(token, decision, tally, start)
            if stragglers is not None and decision.status is not Status.GRANTED:
                await stragglers.settle()  # so the cleanup cannot overtake their SET
            if _cancel_requests() > cancels_before:
                # Python <= 3.11: redis-py's wait_for can swallow a cancellation that lands as a
                # command completes. The caller asked to stop: honour it, leave nothing behind.
                raise asyncio.CancelledError()
        except BaseException:
            await _shielded(self._cleanup(token, stragglers))
            raise
        if decision.status is Status.GRANTED:
            log.debug("acquired %r fence=%d", self.key, decision.fence)
            return Lease(self, token, decision.fence, start + decision.validity_ms / 1000, start)
        if decision.status is not Status.CONTENTION or needs_cleanup(tally):
            await _shielded(self._cleanup(token))
        return decision, tally

    async def _commit_fence(
        self, token: str, decision: AcquireDecision, tally: Tally, start: float
    ) -> AcquireDecision:
        granted = tally.granted_indexes()
        commit = Tally(tally.n)
        for index in range(tally.n):
            if index not in granted:
                commit.record(index, Outcome.HELD)
        keys = (self._keys.lock, self._keys.fence)
        args = (token, str(decision.fence))
        await fan_out(
            commit,
            granted,
            lambda i: self._nodes[i].run(FENCE_COMMIT, keys, args),
            classify_flag("fence_commit"),
            budget_s=self._budget,
            stop=lambda t: t.won,
        )
        validity = decide_confirm(
            commit,
            ttl_ms=self._ttl_ms,
            elapsed_ms=(time.monotonic() - start) * 1000,
            drift=self._drift_ms,
        )
        if validity <= 0:
            return AcquireDecision(Status.UNAVAILABLE if not commit.won else Status.TOO_SLOW)
        return replace(decision, validity_ms=validity)

    async def _cleanup(self, token: str, stragglers: Stragglers | None = None) -> None:
        """Release ``token`` everywhere after a failed or cancelled round (after waiting for the
        round's stragglers, whose SET could otherwise land after the release)."""
        try:
            if stragglers is not None:
                await stragglers.settle()
            await self._release_round(token)
        except Exception as exc:
            log.debug("cleanup of %r failed: %s", self.key, exc)

    async def _release_round(self, token: str) -> Tally:
        tally = Tally(len(self._nodes))
        args = (token, *self._release_tail)
        await fan_out(
            tally,
            range(len(self._nodes)),
            lambda i: self._nodes[i].run(RELEASE, self._release_keys, args),
            classify_flag("release"),
            budget_s=self._budget,
        )
        silent = [i for i, (outcome, _) in tally.votes.items() if outcome is Outcome.ERROR]
        if silent:
            until = time.monotonic() + self.options.ttl
            for index in silent:
                run_in_background(
                    _late_release(self._nodes[index], self._release_keys, args, until)
                )
        return tally

    async def _extend_round(self, token: str, ttl_ms: int) -> tuple[Tally, float]:
        keys = (self._keys.lock, self._keys.holder)
        tally = Tally(len(self._nodes))
        start = time.monotonic()
        await fan_out(
            tally,
            range(len(self._nodes)),
            lambda i: self._nodes[i].run(EXTEND, keys, (token, ttl_ms)),
            classify_flag("extend"),
            budget_s=self._budget,
            stop=lambda t: t.decided,
        )
        drift = drift_ms(ttl_ms, self.options.drift_factor, self.options.drift_min * 1000)
        elapsed = (time.monotonic() - start) * 1000
        return tally, decide_confirm(tally, ttl_ms=ttl_ms, elapsed_ms=elapsed, drift=drift)

    async def _pause(self, delay: float, tally: Tally) -> bool:
        held = [i for i, (outcome, _) in sorted(tally.votes.items()) if outcome is Outcome.HELD]
        if held:
            try:
                return await self._nodes[held[0]].wait_signal(self._keys.wake, delay)
            except Exception as exc:
                log.debug("wake wait on %s failed: %s", self._nodes[held[0]].name, exc)
                return False
        await asyncio.sleep(delay)
        return False


class Lease(LeaseBase):
    """One acquisition (asyncio): ``token``, ``fence``, ``remaining()``; ``lost`` is an
    :class:`asyncio.Event` set as soon as the lease is known lost."""

    lost: asyncio.Event

    def __init__(self, lock: Lock, token: str, fence: int, deadline: float, start: float) -> None:
        super().__init__(lock.key, token, fence, deadline, start)
        self.lock = lock
        self.lost = asyncio.Event()
        self._callbacks: list[LostCallback] = []
        self._renewal: asyncio.Future[Any] | None = None
        self._body: asyncio.Task[Any] | None = None
        self._cancelled_body = False

    async def extend(self, ttl: Seconds | None = None) -> None:
        """Restart the lease at ``ttl`` seconds (default: the lock's ttl) on a majority.

        Raises :class:`~fencelock.LockLost` (no longer ours; the lease is marked lost) or
        :class:`~fencelock.Unavailable` (too few answers while still valid).
        """
        ttl_s = self.lock.options.ttl if ttl is None else seconds(ttl, "ttl")
        self._check_usable()
        start = time.monotonic()
        tally, validity = await self.lock._extend_round(self.token, seconds_to_ms(ttl_s))
        if validity > 0:
            self._deadline = start + validity / 1000
            return
        text = summary(self.key, tally)
        if lost_for_sure(tally):
            self._mark_lost(f"extend refused: {text}")
            raise LockLost(self.key, f"{text}: the lease is no longer ours")
        if self.remaining() <= 0.0:
            self._mark_lost(f"renewal not confirmed before the lease ran out: {text}")
            raise LockLost(self.key, f"{text}: the lease ran out before a majority confirmed")
        raise Unavailable(
            self.key, f"{text}: extend not confirmed", votes(tally, self.lock.servers)
        )

    async def release(self) -> None:
        """Compare-and-delete everywhere, after stopping (and awaiting) the renewal.

        Raises :class:`~fencelock.LockLost` if it had already expired or been taken,
        :class:`~fencelock.Unavailable` if too few servers confirmed. Twice is a no-op.
        The server round runs shielded: cancelling the caller does not cancel the release.
        """
        await self._stop_renewal()
        if self._released:
            return
        self._released = True
        tally: Tally = await _shielded(self.lock._release_round(self.token))
        if tally.won:
            return
        text = summary(self.key, tally)
        if lost_for_sure(tally) or self._deadline <= time.monotonic() or self.lost.is_set():
            raise LockLost(self.key, f"{text}: the lease had already expired or been taken")
        raise Unavailable(
            self.key, f"{text}: release not confirmed", votes(tally, self.lock.servers)
        )

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is)."""
        if self.lost.is_set():
            self._run_callback(callback)
        else:
            self._callbacks.append(callback)

    def keep_alive(self, *, every: Seconds | None = None, max_hold: Seconds | None = None) -> None:
        """Renew in the background every ``every`` s (default ``ttl/3``) until released, lost, or
        ``max_hold`` s after acquisition (then it runs out and is reported lost). The renewal
        task holds the lease weakly."""
        every_s = self.lock.options.renew_every if every is None else seconds(every, "every")
        if every_s >= self.lock.options.ttl:
            raise ConfigError(
                f"every ({every_s} s) must be shorter than ttl ({self.lock.options.ttl} s)"
            )
        cap = None if max_hold is None else seconds(max_hold, "max_hold")
        self.ensure_valid()
        if self._renewal is not None:
            self._renewal.cancel()
        self._renewal = run_in_background(_renew(weakref.ref(self), every_s, cap))

    # -- internals ----------------------------------------------------------------------------

    async def _stop_renewal(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None and not renewal.done():
            renewal.cancel()
            await asyncio.wait({renewal}, timeout=self.lock._budget + 1.0)

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set() or self._released:
            return
        self.lost_reason = reason
        self.lost.set()
        log.error("lease on %r lost: %s", self.key, reason)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self._run_callback(callback)
        body = self._body
        if body is not None and not body.done():
            self._cancelled_body = True
            body.cancel()

    async def _release_quietly(self) -> None:
        try:
            await self.release()
        except Exception as exc:
            level = logging.DEBUG if self.lost.is_set() else logging.WARNING
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


async def _late_release(
    node: AsyncNode, keys: tuple[str, ...], args: tuple[Any, ...], until: float
) -> None:
    """Repeat a release on a server that did not answer it, until it answers and once more
    (a paused server applies its buffered ``SET NX`` when it wakes, maybe after our release),
    or until ``until`` (monotonic), when the key has expired anyway."""
    delay = LATE_RELEASE_FIRST
    answered = False
    while True:
        await asyncio.sleep(delay)
        if time.monotonic() > until:
            return
        try:
            await node.run(RELEASE, keys, args)
        except Exception as exc:
            log.debug("late release on %s failed: %s", node.name, exc)
        else:
            if answered:
                return
            answered = True
        delay = min(LATE_RELEASE_MAX, delay * 2)


async def _renew(ref: weakref.ref[Lease], every: float, max_hold: float | None) -> None:
    """The renewal loop of one lease; holds it only between sleeps."""
    delay = every
    while True:
        lease = ref()
        if lease is None:
            return
        if max_hold is not None:
            delay = min(delay, max(0.0, lease.acquired_at + max_hold - time.monotonic()))
        del lease
        await asyncio.sleep(delay)
        lease = ref()
        if lease is None or lease._released or lease.lost.is_set():
            return
        if max_hold is not None and time.monotonic() - lease.acquired_at >= max_hold:
            reason = f"max_hold of {max_hold} s reached; renewal stopped"
            remaining = lease.remaining()
            del lease
            await asyncio.sleep(remaining)
            lease = ref()
            if lease is not None:
                lease._mark_lost(reason)
            return
        try:
            await lease.extend()
            delay = every
        except LockLost:
            return
        except Exception as exc:
            remaining = lease.remaining()
            wlog.warning(
                "renewal of %r failed (%.3f s of validity left): %s", lease.key, remaining, exc
            )
            if remaining <= 0:
                lease._mark_lost(f"renewal not confirmed before the lease ran out: {exc}")
                return
            delay = max(RETRY_FLOOR, min(every, remaining / 3))


class _Hold:
    """The ``async with lock.hold(...)`` context: cancel-scope semantics on loss."""

    def __init__(
        self,
        lock: Lock,
        wait: Seconds,
        renew: bool,
        max_hold: float | None,
        on_lost: LostCallback | None,
    ) -> None:
        self._lock = lock
        self._wait = wait
        self._renew = renew
        self._max_hold = max_hold
        self._on_lost = on_lost
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        lease = await self._lock.acquire(self._wait)
        self._lease = lease
        if self._on_lost is not None:
            lease.on_lost(self._on_lost)
        lease._body = asyncio.current_task()
        if self._renew:
            lease.keep_alive(max_hold=self._max_hold)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        lease = self._lease
        assert lease is not None
        lease._body = None
        ours = lease._cancelled_body
        task = asyncio.current_task()
        if ours and task is not None and hasattr(task, "uncancel"):
            task.uncancel()
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
