"""The blocking :class:`Lock` and :class:`Lease`: thin I/O shells over ``fencelock._core``."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any

import redis

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
from .fanout import fan_out
from .node import Node, shared_node
from .watchdog import LateRelease, Renewal

log = logging.getLogger("fencelock.lock")

ServerSpec = str | redis.Redis
Servers = ServerSpec | Sequence[ServerSpec]
LostCallback = Callable[["Lease"], object]


class _Unset:
    def __repr__(self) -> str:
        return "<lock default>"


_UNSET: Any = _Unset()


class Lock(LockBase):
    """A lock definition: servers, key, lease length, default wait. Safe to share between threads.

    ``servers`` is a URL (``redis://host:port/db``, ``valkey://``, ``rediss://``, ``unix://``),
    a :class:`redis.Redis` client, or a sequence of them: one server is the classic
    ``SET NX PX`` lock, N > 1 independent servers make it Redlock (majority ``N // 2 + 1``).
    For a client, fencelock opens its own connections with the same address, auth and TLS,
    but short timeouts and no retries (a retried ``SET NX`` is never safe).

    Durations are seconds (int, float or :class:`datetime.timedelta`):

    - ``ttl``: lease length; ``wait``: default wait of :meth:`acquire` (``math.inf`` to wait
      forever must be asked for explicitly);
    - ``server_timeout``: per-server timeout of every call (default ``ttl/10`` within
      [0.05, 1.0]); ``drift_factor`` / ``drift_min``: clock-drift allowance
      ``ttl * factor + min`` taken off every lease's validity;
    - ``renew_every``: watchdog period (default ``ttl/3``);
    - ``holder_info``: store host/pid/``purpose`` beside the lock for ``fencelock status``.

    Raises :class:`~fencelock.ConfigError` for any bad argument, before any I/O.
    """

    _nodes: list[Node]

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
        specs = split_servers(servers, (redis.Redis,))
        self._nodes = [shared_node(spec, self.options.server_timeout) for spec in specs]
        self._configure()
        self._independence_lock = threading.Lock()

    # -- public API ---------------------------------------------------------------------------

    def acquire(self, wait: Seconds = _UNSET) -> Lease:
        """Acquire, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        ``wait=0`` makes exactly one attempt. Waiters are woken when the holder releases.
        Raises :class:`~fencelock.NotAcquired` when others still hold it at the deadline,
        :class:`~fencelock.Unavailable` when too few servers answered to reach a majority,
        :class:`~fencelock.ConfigError` for a bad ``wait``.
        """
        wait_s = (
            self.options.wait
            if wait is _UNSET
            else seconds(wait, "wait", allow_zero=True, allow_inf=True)
        )
        self._check_independence()
        deadline = time.monotonic() + wait_s
        attempt = 0
        woken = False
        waiter = new_token()[:16] if wait_s > 0 else "-"  # an id only for who will wait
        while True:
            attempt += 1
            outcome = self._attempt(woken, waiter, patience_ms(deadline, time.monotonic()))
            if isinstance(outcome, Lease):
                return outcome
            decision, tally = outcome
            remaining = deadline - time.monotonic()
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
            woken = self._pause(delay, tally)

    def try_acquire(self) -> Lease | None:
        """One attempt: a :class:`Lease`, or ``None`` when another holder has the lock.

        Raises :class:`~fencelock.Unavailable` (not ``None``) when servers did not answer.
        """
        self._check_independence()
        outcome = self._attempt(False, "-", 0)
        if isinstance(outcome, Lease):
            return outcome
        decision, tally = outcome
        if decision.status is Status.CONTENTION:
            return None
        raise failure(self.key, decision, tally, self.servers, 1)

    @contextmanager
    def hold(
        self,
        wait: Seconds = _UNSET,
        renew: bool = True,
        *,
        max_hold: Seconds | None = None,
        on_lost: LostCallback | None = None,
    ) -> Iterator[Lease]:
        """Acquire, run the block, release. With ``renew`` a watchdog keeps the lease alive.

        If the lease is lost while the block runs, ``lease.lost`` is set at once and
        ``on_lost`` is called (a thread cannot be interrupted safely: check
        ``lease.ensure_valid()`` between steps); leaving the block then raises
        :class:`~fencelock.LockLost`, unless the block raised its own exception.
        ``max_hold`` (seconds) stops renewal after that long; the lease then runs out and is
        reported lost like any other loss.
        """
        lease = self.acquire(wait)
        try:
            if on_lost is not None:
                lease.on_lost(on_lost)
            if renew:
                lease.keep_alive(max_hold=max_hold)
            yield lease
        except BaseException:
            lease._release_quietly()
            raise
        lease._finish()

    def __enter__(self) -> Lease:
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
        """Let go of this lock's connections (shared with other Locks on the same servers; they
        close when no Lock uses them). Leases already handed out stay valid on the server."""
        self._nodes = []

    # -- rounds -------------------------------------------------------------------------------

    def _check_independence(self) -> None:
        """N > 1: refuse the same server twice (by run_id) and replicas; a server that cannot
        be reached now is checked at a later acquire."""
        if self._independent:
            return
        with self._independence_lock:
            if self._independent:
                return
            for index, node in enumerate(self._nodes):
                if index in self._run_ids or time.monotonic() < self._recheck_at.get(index, 0.0):
                    continue
                try:
                    run_id, role = node.identity()
                except Exception as exc:  # unreachable now: checked again at a later acquire
                    level = logging.DEBUG if index in self._recheck_at else logging.WARNING
                    log.log(level, "identity check of %s failed: %s", node.name, exc)
                    self._recheck_at[index] = time.monotonic() + recheck_delay(exc)
                    continue
                register_server(self._run_ids, index, run_id, role, self.servers)
            self._independent = len(self._run_ids) == len(self._nodes)

    def _attempt(
        self, woken: bool, waiter: str, patience: int
    ) -> Lease | tuple[AcquireDecision, Tally]:
        token = new_token()
        info = holder_info(self.options.purpose) if self.options.holder_info else ""
        args = (token, self._ttl_ms, info, "1" if woken else "0", waiter, patience)
        nodes = self._nodes
        tally = Tally(len(nodes))
        start = time.monotonic()
        stragglers = None
        try:
            stragglers = fan_out(
                tally,
                nodes,
                range(len(nodes)),
                ACQUIRE,
                self._acquire_keys,
                args,
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
                decision = self._commit_fence(token, decision, tally, start)
        except BaseException:
            if stragglers is not None:
                stragglers.park()
            self._cleanup(token)
            raise
        if stragglers is not None:
            if decision.status is Status.GRANTED:
                stragglers.park()
            else:
                stragglers.settle()  # so the cleanup cannot overtake their SET on the server
        if decision.status is Status.GRANTED:
            log.debug("acquired %r fence=%d", self.key, decision.fence)
            return Lease(self, token, decision.fence, start + decision.validity_ms / 1000, start)
        if decision.status is not Status.CONTENTION or needs_cleanup(tally):
            self._cleanup(token)
        return decision, tally

    def _commit_fence(
        self, token: str, decision: AcquireDecision, tally: Tally, start: float
    ) -> AcquireDecision:
        granted = tally.granted_indexes()
        commit = Tally(tally.n)
        for index in range(tally.n):
            if index not in granted:
                commit.record(index, Outcome.HELD)
        keys = (self._keys.lock, self._keys.fence)
        args = (token, str(decision.fence))
        fan_out(
            commit,
            self._nodes,
            granted,
            FENCE_COMMIT,
            keys,
            args,
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

    def _cleanup(self, token: str) -> None:
        """Release ``token`` everywhere after a failed round; it may have landed anywhere."""
        try:
            self._release_round(token)
        except Exception as exc:  # best effort: the keys expire by their TTL anyway
            log.debug("cleanup of %r failed: %s", self.key, exc)

    def _release_round(self, token: str) -> Tally:
        """Release ``token`` everywhere; servers that did not answer get it again later."""
        tally = Tally(len(self._nodes))
        args = (token, *self._release_tail)
        fan_out(
            tally,
            self._nodes,
            range(len(self._nodes)),
            RELEASE,
            self._release_keys,
            args,
            classify_flag("release"),
            budget_s=self._budget,
        )
        silent = [i for i, (outcome, _) in tally.votes.items() if outcome is Outcome.ERROR]
        if silent:
            until = time.monotonic() + self.options.ttl
            for index in silent:
                LateRelease.start(self._nodes[index], RELEASE, self._release_keys, args, until)
        return tally

    def _extend_round(self, token: str, ttl_ms: int) -> tuple[Tally, float]:
        """Returns the tally and the new validity in ms (<= 0: not extended on a majority)."""
        keys = (self._keys.lock, self._keys.holder)
        tally = Tally(len(self._nodes))
        start = time.monotonic()
        fan_out(
            tally,
            self._nodes,
            range(len(self._nodes)),
            EXTEND,
            keys,
            (token, ttl_ms),
            classify_flag("extend"),
            budget_s=self._budget,
            stop=lambda t: t.decided,
        )
        drift = drift_ms(ttl_ms, self.options.drift_factor, self.options.drift_min * 1000)
        elapsed = (time.monotonic() - start) * 1000
        return tally, decide_confirm(tally, ttl_ms=ttl_ms, elapsed_ms=elapsed, drift=drift)

    def _pause(self, delay: float, tally: Tally) -> bool:
        """Sleep up to ``delay`` s, woken early by a release; True when woken by a signal."""
        held = [i for i, (outcome, _) in sorted(tally.votes.items()) if outcome is Outcome.HELD]
        if held:
            try:
                return self._nodes[held[0]].wait_signal(self._keys.wake, delay)
            except Exception as exc:
                log.debug("wake wait on %s failed: %s", self._nodes[held[0]].name, exc)
                return False
        time.sleep(delay)
        return False


class Lease(LeaseBase):
    """One acquisition: the proof of ownership (``token``), the fencing number (``fence``) and
    the validity (``remaining()``). Hand ``fence`` to storage with every write.

    ``lost`` is a :class:`threading.Event` set as soon as the lease is known lost.
    """

    lost: threading.Event

    def __init__(self, lock: Lock, token: str, fence: int, deadline: float, start: float) -> None:
        super().__init__(lock.key, token, fence, deadline, start)
        self.lock = lock
        self.lost = threading.Event()
        self._callbacks: list[LostCallback] = []
        self._state = threading.Lock()
        self._renewal: Any = None

    def extend(self, ttl: Seconds | None = None) -> None:
        """Restart the lease at ``ttl`` seconds (default: the lock's ttl) on a majority.

        Raises :class:`~fencelock.LockLost` when the lease is no longer ours (it is then
        marked lost), :class:`~fencelock.Unavailable` when too few servers answered while the
        lease was still valid.
        """
        ttl_s = self.lock.options.ttl if ttl is None else seconds(ttl, "ttl")
        self._check_usable()
        start = time.monotonic()
        tally, validity = self.lock._extend_round(self.token, seconds_to_ms(ttl_s))
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

    def release(self) -> None:
        """Delete the lock wherever it is still ours (compare-and-delete), stopping renewal first.

        Raises :class:`~fencelock.LockLost` if it had already expired or been taken,
        :class:`~fencelock.Unavailable` if too few servers confirmed (the keys then expire by
        their TTL). Releasing twice is a no-op.
        """
        self._stop_renewal()
        with self._state:
            if self._released:
                return
            self._released = True
        tally = self.lock._release_round(self.token)
        if tally.won:
            log.debug("released %r", self.key)
            return
        text = summary(self.key, tally)
        if lost_for_sure(tally) or self._deadline <= time.monotonic() or self.lost.is_set():
            raise LockLost(self.key, f"{text}: the lease had already expired or been taken")
        raise Unavailable(
            self.key, f"{text}: release not confirmed", votes(tally, self.lock.servers)
        )

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is).

        Callbacks run on the watchdog's thread: keep them short; exceptions are logged.
        """
        with self._state:
            if not self.lost.is_set():
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def keep_alive(self, *, every: Seconds | None = None, max_hold: Seconds | None = None) -> None:
        """Renew the lease in the background every ``every`` s (default ``ttl/3``) until it is
        released, lost, or ``max_hold`` seconds after it was acquired (then it is let expire
        and reported lost). One shared scheduler serves all leases; it holds them weakly."""
        every_s = self.lock.options.renew_every if every is None else seconds(every, "every")
        if every_s >= self.lock.options.ttl:
            raise ConfigError(
                f"every ({every_s} s) must be shorter than ttl ({self.lock.options.ttl} s)"
            )
        cap = None if max_hold is None else seconds(max_hold, "max_hold")
        self.ensure_valid()
        self._stop_renewal()
        self._renewal = Renewal.start(self, every_s, cap)

    # -- internals ----------------------------------------------------------------------------

    def _stop_renewal(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            renewal.stop()

    def _mark_lost(self, reason: str) -> None:
        with self._state:
            if self.lost.is_set() or self._released:
                return
            self.lost_reason = reason
            self.lost.set()
            callbacks, self._callbacks = self._callbacks, []
        log.error("lease on %r lost: %s", self.key, reason)
        for callback in callbacks:
            self._run_callback(callback)

    def _release_quietly(self) -> None:
        try:
            self.release()
        except Exception as exc:
            level = logging.DEBUG if self.lost.is_set() else logging.WARNING
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
