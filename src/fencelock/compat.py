"""The shapes of the two most used Python Redis locks, on fencelock's engine.

Existing code ports in one line (see ``docs/migrating.md``):

- :class:`RedisPyLock` / :class:`AsyncRedisPyLock`: redis-py's own extension point,
  ``r.lock("k", timeout=10, lock_class=RedisPyLock)`` (``redis.Redis`` /
  ``redis.asyncio.Redis``). The whole ``redis.lock.Lock`` surface (``acquire``, ``release``,
  ``extend``, ``reacquire``, ``locked``, ``owned``, the context manager, ``local.token``),
  raising redis-py's own :class:`~redis.exceptions.LockError` and
  :class:`~redis.exceptions.LockNotOwnedError`, plus ``.fence``, ``.lease`` and ``.lost``.
- :class:`RedisLock`: python-redis-lock's ``redis_lock.Lock(conn, name, expire=...,
  auto_renewal=...)``, with exceptions of the same names and bases as its own, and its
  :func:`reset_all`.

What differs from the originals, and why (each one is listed in ``docs/migrating.md``):

- No timeout (``timeout=None`` / ``expire=None``) is a lease of :data:`RENEWED_TTL`
  seconds renewed in the background until released, never an immortal key: a crashed holder
  frees the lock within that time instead of never.
- The lock key is the one the original uses (``name`` for redis-py, ``lock:<name>`` for
  python-redis-lock) so a lock taken by either side excludes the other during a migration;
  the fence register and the waiters' keys sit beside it (``fencelock:{<name>}:compat:*``).
- A waiter is woken by a fencelock release at once, and besides tries again at least every
  ``sleep`` seconds (so a plain redis-py holder's release, which wakes nobody, is seen within
  that time); it does not sleep ``sleep`` through ``redis.lock``'s clock.
- Tokens are 128 random bits (32 hex digits), not a UUID4 (122). A token chosen by the caller
  must not start with ``h`` (fencelock reads such a value as a lock handed over to a waiter):
  :class:`~fencelock.ConfigError`.
- Servers that do not answer raise :class:`ServersUnavailable`, both a
  :class:`~fencelock.Unavailable` and a :class:`redis.exceptions.ConnectionError`.

One server only (the client given), as the originals; for Redlock over N servers use
:class:`fencelock.Lock`.

Why this module is longer than 600 lines: it is three foreign surfaces (redis-py's sync and
asyncio ``Lock`` and python-redis-lock's), each of which must be whole to be a drop-in; they
share one acquire loop and one key layout, kept here so a port is read in one place.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Literal

import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError, LockNotOwnedError

from ._async.lock import Lease as AsyncLease
from ._async.lock import Lock as AsyncLock
from ._core.acquire import Attempt, Grant, acquire, attempt, try_acquire
from ._core.effects import NOW, Flow
from ._core.extend import ExtendOutcome
from ._core.extend import extend as extend_flow
from ._core.keys import LockKeys
from ._core.plan import LockPlan, lock_wiring
from ._core.release import ReleaseVerdict, release
from ._frontend.definition import Definition
from ._frontend.holder import new_token
from ._frontend.lease import log
from ._sync.lock import Lease, Lock
from .errors import ConfigError, LockLost, Unavailable
from .errors import NotAcquired as Contention
from .options import DEFAULT_TTL, RETRY_BASE, seconds

__all__ = [
    "RENEWED_TTL",
    "AlreadyAcquired",
    "AlreadyStarted",
    "AsyncRedisPyLock",
    "InvalidTimeout",
    "NotAcquired",
    "NotExpirable",
    "RedisLock",
    "RedisPyLock",
    "ServersUnavailable",
    "TimeoutNotUsable",
    "TimeoutTooLarge",
    "reset_all",
]

#: The lease (seconds) of a lock made without a timeout: renewed every third of it until
#: released, so a crashed holder frees the lock within this long.
RENEWED_TTL = DEFAULT_TTL

#: python-redis-lock's key prefixes (kept, so both libraries see the same lock).
REDIS_LOCK_PREFIX = "lock:"
REDIS_LOCK_SIGNAL_PREFIX = "lock-signal:"


class ServersUnavailable(Unavailable, RedisConnectionError):
    """The server did not answer in time: a :class:`~fencelock.Unavailable` that existing
    ``except redis.exceptions.ConnectionError`` clauses also catch."""


def _unavailable(exc: Unavailable) -> ServersUnavailable:
    return ServersUnavailable(exc.key, Exception.__str__(exc), exc.votes, exc.attempts)


# -- python-redis-lock's exceptions: same names, same bases --------------------------------


class AlreadyAcquired(RuntimeError):
    """:meth:`RedisLock.acquire` on a lock this object already holds."""


class NotAcquired(RuntimeError):
    """:meth:`RedisLock.release` / ``extend`` of a lock not held (or expired); a non-blocking
    ``with`` that did not get it."""


class AlreadyStarted(RuntimeError):
    """Kept for python-redis-lock's ``except`` clauses; fencelock never raises it."""


class TimeoutNotUsable(RuntimeError):
    """``acquire(blocking=False, timeout=...)``."""


class InvalidTimeout(RuntimeError):
    """A negative acquire timeout."""


class TimeoutTooLarge(RuntimeError):
    """An acquire timeout longer than the lock's ``expire`` (without auto-renewal)."""


class NotExpirable(RuntimeError):
    """Kept for python-redis-lock's ``except`` clauses; fencelock never raises it (every
    fencelock lock expires)."""


# -- keys, plans and flows (no I/O) ---------------------------------------------------------


def compat_keys(lock_key: str, wake: str | None = None) -> LockKeys:
    """The lock at ``lock_key`` itself (where the original library keeps it), its fence
    register and waiters' keys beside it, in the same Cluster slot when ``lock_key`` has no
    brace or a valid hash tag of its own."""
    if "{" in lock_key or "}" in lock_key:
        base = lock_key + ":fencelock"  # keeps lock_key's own hash tag, if it has one
    else:
        base = f"fencelock:{{{lock_key}}}:compat"
    beside = {name: f"{base}:{name}" for name in _BESIDE}
    return LockKeys(lock=lock_key, wake=f"{base}:wake" if wake is None else wake, **beside)


#: The keys a compat lock keeps beside its lock key, each named ``<base>:<field>``.
_BESIDE = ("fence", "holder", "waiters", "handoff", "claimed", "observers")


def _definition(base: Definition, keys: LockKeys) -> Definition:
    """``base`` re-keyed: no hand-over (a release wakes a waiter, which then takes the lock
    under its own token, the one the caller chose), and tokens that are granted again
    (``LockPlan.tokens_reused``: no release of one is sent after its round)."""
    plan = replace(base.plan.rewired(keys, lock_wiring(keys)), tokens_reused=True)
    return base.with_plan(plan)


def _with_sleep(plan: LockPlan, sleep_s: float) -> LockPlan:
    """The plan whose backoff between attempts is capped at ``sleep_s``."""
    return replace(plan, retry_base_s=min(RETRY_BASE, sleep_s), retry_cap_s=sleep_s)


def acquire_flow(
    plan: LockPlan, chosen: str, wait_s: float, sleep_s: float = math.inf
) -> Flow[Grant | None]:
    """Take the lock under the token ``chosen`` (every attempt uses it), waiting up to
    ``wait_s`` seconds (0: one attempt); None when others still hold it at the end.

    A waiter is woken by a fencelock release; besides, it tries again at least every
    ``sleep_s`` seconds (redis-py's ``sleep``), so that the release of a holder that wakes
    nobody (a plain redis-py or python-redis-lock process sharing the key during a migration)
    is seen within that time, not only when the holder's key would have expired."""

    def fixed(token: str, info: str, *, woken: bool, waiter: str, patience: int) -> Flow[Attempt]:
        return attempt(plan, chosen, info, woken=woken, waiter=waiter, patience=patience)

    if wait_s <= 0:
        return (yield from try_acquire(plan, chosen, "", fixed))
    begin: float = yield NOW
    end = begin + wait_s
    while True:
        now: float = yield NOW
        try:
            return (
                yield from acquire(
                    plan,
                    max(0.0, min(sleep_s, end - now)),
                    new_token=new_token,
                    holder_info=str,
                    rand=random.random,
                    attempt_with=fixed,
                )
            )
        except Contention:
            now = yield NOW
            if now >= end:
                return None


def release_by_token(plan: LockPlan, token: str) -> Flow[ReleaseVerdict]:
    """Compare-and-delete of ``token`` without a lease (python-redis-lock's
    ``Lock(name, id=...).release()`` from another place)."""
    return release(plan, token, expired=False, waiter="-", new_token=None)


def _check_token(token: str | bytes, encode: Callable[[str | bytes], bytes]) -> bytes:
    raw = encode(token)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"a token must be UTF-8 text, not {raw!r}") from None
    if not text or text.startswith("h"):
        raise ConfigError(
            f"a token must be non-empty and not start with 'h' (fencelock reads such a value "
            f"as a lock handed over to a waiter): {text!r}"
        )
    return raw


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"{name} must be a number of seconds, not {value!r}")
    return float(value)


def _name(name: object) -> str:
    if isinstance(name, bytes):
        name = name.decode()
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a lock name must be a non-empty str, not {name!r}")
    return name


# -- redis-py's shape -----------------------------------------------------------------------


class _RedisPyShape:
    """What :class:`RedisPyLock` and :class:`AsyncRedisPyLock` share: arguments, checks,
    the token bookkeeping of ``local.token`` and the leases by token."""

    _lock: Any
    _leases: dict[bytes, Any]

    def __init__(
        self,
        redis: Any,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        self.redis = redis
        self.name = _name(name)
        if timeout is not None:
            timeout_s = _number(timeout, "timeout")
            if timeout_s < 0 or math.isinf(timeout_s):
                raise ConfigError(f"timeout must be None or >= 0 seconds, not {timeout!r}")
        self.timeout = timeout
        self.sleep = seconds(sleep, "sleep")
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        if blocking_timeout is not None:
            seconds(blocking_timeout, "blocking_timeout", allow_zero=True, allow_inf=True)
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local: Any = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None
        self._leases = {}
        #: ``timeout`` None or 0 (redis-py: no expiry): a lease renewed until released
        self._renewed = not timeout
        self._ttl_s = RENEWED_TTL if not timeout else float(timeout)

    def _plan(self, sleep: float | None) -> LockPlan:
        plan: LockPlan = self._lock._definition.plan
        if sleep is None or sleep == self.sleep:
            return plan
        return _with_sleep(plan, seconds(sleep, "sleep"))

    def _sleep_s(self, sleep: float | None) -> float:
        return self.sleep if sleep is None else seconds(sleep, "sleep")

    def _base_definition(self, lock_class: Any) -> Definition:
        base = lock_class(
            self.redis,
            self.name,
            ttl=self._ttl_s,
            retry_base=min(RETRY_BASE, self.sleep),
            retry_cap=self.sleep,
            holder_info=False,
        )
        return _definition(base._definition, compat_keys(self.name))

    def _token(self, token: str | bytes | None) -> bytes:
        if token is None:
            return new_token().encode()
        encoder = self.redis.get_encoder()
        return _check_token(token, encoder.encode)

    def _wait_s(self, blocking: bool | None, blocking_timeout: float | None) -> float:
        if not (self.blocking if blocking is None else blocking):
            return 0.0
        limit = self.blocking_timeout if blocking_timeout is None else blocking_timeout
        if limit is None:
            return math.inf
        return seconds(limit, "blocking_timeout", allow_zero=True, allow_inf=True)

    def _acquire_flow(
        self,
        sleep: float | None,
        blocking: bool | None,
        blocking_timeout: float | None,
        token: str | bytes | None,
    ) -> tuple[bytes, Flow[Grant | None]]:
        """The token an ``acquire`` takes the lock under, and its flow (arguments checked)."""
        raw = self._token(token)
        wait_s = self._wait_s(blocking, blocking_timeout)
        return raw, acquire_flow(self._plan(sleep), raw.decode(), wait_s, self._sleep_s(sleep))

    def _took(self, raw: bytes, grant: Grant | None) -> bool:
        """What an ``acquire`` returns: with a grant, its lease is kept under ``raw`` (renewed
        when the lock has no timeout) and ``raw`` becomes this thread's token."""
        if grant is None:
            return False
        lease = self._lock._lease(grant)
        if self._renewed:
            lease.keep_alive()
        self._leases[raw] = lease
        self.local.token = raw
        return True

    def _held_token(self) -> bytes:
        """This thread's token, or redis-py's LockError for a release of a lock not held."""
        expected: bytes | None = self.local.token
        if expected is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        return expected

    @contextlib.contextmanager
    def _server_errors(self, what: str, *, forget: bytes | None = None) -> Iterator[None]:
        """fencelock's errors as redis-py's: LockLost as LockNotOwnedError (the lease of
        ``forget`` dropped), Unavailable as :class:`ServersUnavailable`."""
        try:
            yield
        except LockLost as exc:
            if forget is not None:
                self._leases.pop(forget, None)
            raise self._not_owned(what) from exc
        except Unavailable as exc:
            raise _unavailable(exc) from exc

    @contextlib.contextmanager
    def _release_errors(self) -> Iterator[None]:
        """Leaving a ``with`` block: a LockError of the release is raised only with
        ``raise_on_release_error``, else logged."""
        try:
            yield
        except LockError:
            if self.raise_on_release_error:
                raise
            log_release_error(self.name)

    def _stored(self, value: object) -> bool:
        """Whether ``value`` (a GET of the lock key) is this thread's token."""
        if isinstance(value, str):
            value = self.redis.get_encoder().encode(value)
        return self.local.token is not None and value == self.local.token

    def _check_extend(self, name: str) -> Any:
        if self.local.token is None:
            raise LockError(f"Cannot {name} an unlocked lock", lock_name=self.name)
        if self._renewed:
            raise LockError(
                f"Cannot {name} a lock with no timeout (it is renewed until released)",
                lock_name=self.name,
            )
        return self._leases.get(self.local.token)

    def _cleared(self, expected: bytes) -> None:
        """The token is cleared only if it is still ours (with ``thread_local=False``
        another acquirer may have put its own there meanwhile)."""
        if self.local.token == expected:
            self.local.token = None

    def _not_owned(self, what: str) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"Cannot {what} a lock that's no longer owned", lock_name=self.name
        )

    def _new_ttl(self, lease: Any, additional_time: float, replace_ttl: bool) -> float:
        additional = _number(additional_time, "additional_time")
        if math.isinf(additional):
            raise ConfigError("additional_time must be finite")
        return additional if replace_ttl else lease.remaining() + additional

    # -- what fencelock adds ----------------------------------------------------------------

    @property
    def lease(self) -> Any:
        """This thread's lease (a :class:`fencelock.Lease`), or None when not held."""
        token = self.local.token
        return None if token is None else self._leases.get(token)

    @property
    def fence(self) -> int | None:
        """The fencing token of this thread's lease (hand it to storage with every write), or
        None when not held."""
        lease = self.lease
        return None if lease is None else int(lease.fence)

    @property
    def lost(self) -> Any:
        """The loss signal of this thread's lease (an Event set when it is known lost; a
        :class:`threading.Event`, or an :class:`asyncio.Event` for the asyncio class), or
        None when not held."""
        lease = self.lease
        return None if lease is None else lease.lost

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, timeout={self.timeout})"


class RedisPyLock(_RedisPyShape):
    """redis-py's ``Lock`` on fencelock: ``r.lock(name, timeout=..., sleep=..., blocking=...,
    blocking_timeout=..., lock_class=RedisPyLock)`` with ``r`` a :class:`redis.Redis`.

    Same arguments and methods as :class:`redis.lock.Lock`; ``timeout`` and the other
    durations are seconds. Differences (see the module's docstring): ``timeout=None`` is a
    renewed lease, waiting is woken by releases, tokens are 128 random bits. Adds
    :attr:`fence`, :attr:`lease` and :attr:`lost`. Bad arguments raise
    :class:`~fencelock.ConfigError` (a ``ValueError``) before any I/O.
    """

    def __init__(
        self,
        redis: redis.Redis,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        super().__init__(
            redis,
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
        )
        self._lock: Lock = Lock._of(self._base_definition(Lock))
        self._leases: dict[bytes, Lease] = {}

    def __enter__(self) -> RedisPyLock:
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def __exit__(self, *exc: object) -> None:
        with self._release_errors():
            self.release()

    def acquire(
        self,
        sleep: float | None = None,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """Take the lock; True once held. ``blocking=False``: one attempt. Otherwise waits up to
        ``blocking_timeout`` seconds (None: until it is free), woken by the release, retrying
        at most every ``sleep`` seconds; False when the wait ran out. Raises
        :class:`ServersUnavailable` when the server does not answer."""
        raw, flow = self._acquire_flow(sleep, blocking, blocking_timeout, token)
        try:
            grant = self._lock._driver.run(flow)
        except Unavailable as exc:
            raise _unavailable(exc) from exc
        return self._took(raw, grant)

    def locked(self) -> bool:
        """Whether anyone holds the lock (read on the server)."""
        return bool(self.redis.exists(self.name))

    def owned(self) -> bool:
        """Whether this thread holds the lock (read on the server)."""
        return self._stored(self.redis.get(self.name))

    def release(self) -> None:
        """Release this thread's lock. Raises :class:`~redis.exceptions.LockError` when not
        held, :class:`~redis.exceptions.LockNotOwnedError` when it expired or was taken (the
        token is then cleared). A release the server did not confirm
        (:class:`ServersUnavailable`) keeps the token: calling it again is safe."""
        expected = self._held_token()
        try:
            self.do_release(expected)
        except LockNotOwnedError:
            self._cleared(expected)
            raise
        self._cleared(expected)

    def do_release(self, expected_token: bytes) -> None:
        """Release the lease of ``expected_token`` (redis-py's hook of the same name)."""
        lease = self._leases.get(expected_token)
        if lease is None:
            raise self._not_owned("release")
        with self._server_errors("release", forget=expected_token):
            lease.release()
        self._leases.pop(expected_token, None)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to what is left of the lease (``replace_ttl``:
        restart it at ``additional_time``). A result <= 0 leaves the lease as it is (the lock
        must still be ours). Raises :class:`~redis.exceptions.LockError` when not held or made
        without a timeout, :class:`~redis.exceptions.LockNotOwnedError` when no longer ours."""
        lease = self._check_extend("extend")
        if lease is None:
            raise self._not_owned("extend")
        ttl = self._new_ttl(lease, additional_time, replace_ttl)
        if ttl <= 0:
            if not self.owned():
                raise self._not_owned("extend")
            return True
        self._extend(lease, ttl, "extend")
        return True

    def reacquire(self) -> Literal[True]:
        """Restart the lease at ``timeout`` seconds. Raises as :meth:`extend`."""
        lease = self._check_extend("reacquire")
        if lease is None:
            raise self._not_owned("reacquire")
        self._extend(lease, self._ttl_s, "reacquire")
        return True

    def _extend(self, lease: Lease, ttl: float, what: str) -> None:
        with self._server_errors(what):
            lease.extend(ttl)


class AsyncRedisPyLock(_RedisPyShape):
    """The asyncio twin of :class:`RedisPyLock`, for :class:`redis.asyncio.Redis`:
    ``r.lock(name, ..., lock_class=AsyncRedisPyLock)``; ``async with``, and every method
    awaited as in :class:`redis.asyncio.lock.Lock`. ``lost`` is an :class:`asyncio.Event`."""

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        super().__init__(
            redis,
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
        )
        self._lock: AsyncLock = AsyncLock._of(self._base_definition(AsyncLock))
        self._leases: dict[bytes, AsyncLease] = {}

    async def __aenter__(self) -> AsyncRedisPyLock:
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    async def __aexit__(self, *exc: object) -> None:
        with self._release_errors():
            await self.release()

    async def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
        *,
        sleep: float | None = None,
    ) -> bool:
        """See :meth:`RedisPyLock.acquire` (here ``blocking`` comes first, as in
        :meth:`redis.asyncio.lock.Lock.acquire`)."""
        raw, flow = self._acquire_flow(sleep, blocking, blocking_timeout, token)
        try:
            grant = await self._lock._driver.run(flow)
        except Unavailable as exc:
            raise _unavailable(exc) from exc
        return self._took(raw, grant)

    async def locked(self) -> bool:
        """Whether anyone holds the lock (read on the server)."""
        return bool(await self.redis.exists(self.name))

    async def owned(self) -> bool:
        """Whether this task's thread holds the lock (read on the server)."""
        return self._stored(await self.redis.get(self.name))

    async def release(self) -> None:
        """See :meth:`RedisPyLock.release`."""
        expected = self._held_token()
        try:
            await self.do_release(expected)
        except LockNotOwnedError:
            self._cleared(expected)
            raise
        self._cleared(expected)

    async def do_release(self, expected_token: bytes) -> None:
        """Release the lease of ``expected_token`` (redis-py's hook of the same name)."""
        lease = self._leases.get(expected_token)
        if lease is None:
            raise self._not_owned("release")
        with self._server_errors("release", forget=expected_token):
            await lease.release()
        self._leases.pop(expected_token, None)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Awaitable[Literal[True]]:
        """See :meth:`RedisPyLock.extend`; :class:`~redis.exceptions.LockError` for a lock
        not held is raised at the call, as redis-py does."""
        lease = self._check_extend("extend")
        return self._do_extend(lease, additional_time, replace_ttl)

    async def _do_extend(
        self, lease: AsyncLease | None, additional_time: float, replace_ttl: bool
    ) -> Literal[True]:
        if lease is None:
            raise self._not_owned("extend")
        ttl = self._new_ttl(lease, additional_time, replace_ttl)
        if ttl <= 0:
            if not await self.owned():
                raise self._not_owned("extend")
            return True
        await self._extend(lease, ttl, "extend")
        return True

    def reacquire(self) -> Awaitable[Literal[True]]:
        """See :meth:`RedisPyLock.reacquire`."""
        lease = self._check_extend("reacquire")
        return self._do_reacquire(lease)

    async def _do_reacquire(self, lease: AsyncLease | None) -> Literal[True]:
        if lease is None:
            raise self._not_owned("reacquire")
        await self._extend(lease, self._ttl_s, "reacquire")
        return True

    async def _extend(self, lease: AsyncLease, ttl: float, what: str) -> None:
        with self._server_errors(what):
            await lease.extend(ttl)


def log_release_error(name: str) -> None:
    log.warning("%r: lock was unlocked or no longer owned when leaving its block", name)


# -- python-redis-lock's shape --------------------------------------------------------------


class RedisLock:
    """python-redis-lock's ``Lock`` on fencelock: ``RedisLock(conn, name, expire=60,
    auto_renewal=True)``, with ``conn`` a :class:`redis.Redis`.

    Same arguments, methods and exceptions (:class:`NotAcquired` and the others of this
    module, with python-redis-lock's names and bases). ``expire`` and ``timeout`` are whole
    seconds, as there. The lock lives at ``lock:<name>`` and releases push to
    ``lock-signal:<name>``, as python-redis-lock's do. Differences: ``expire=None`` is a
    renewed lease of :data:`RENEWED_TTL` s, never an immortal key; renewal runs on
    fencelock's timers at a third of the lease (not ``expire*2/3``) and a renewal that fails
    sets :attr:`lost` instead of dying silently; ids must not start with ``h``. Adds
    :attr:`fence`, :attr:`lease` and :attr:`lost`. Bad arguments raise ``ValueError``
    (:class:`~fencelock.ConfigError`) or ``TypeError`` before any I/O; with ``strict=False``
    the client is not looked at until the lock is used. As there, another object with the
    same ``id`` may :meth:`extend` or :meth:`release` the lock.
    """

    def __init__(
        self,
        redis_client: redis.Redis,
        name: str,
        expire: int | None = None,
        id: str | bytes | None = None,
        auto_renewal: bool = False,
        strict: bool = True,
        signal_expire: int = 1000,
        blocking: bool = True,
    ) -> None:
        if strict and not isinstance(redis_client, redis.Redis):
            raise ConfigError(
                "redis_client must be a redis.Redis; use strict=False if you know what you're doing"
            )
        if auto_renewal and expire is None:
            raise ConfigError("expire may not be None when auto_renewal is set")
        if expire:
            expire = int(expire)
            if expire < 0:
                raise ConfigError("a negative expire is not acceptable")
        else:
            expire = None
        self._client = redis_client
        self._expire = expire
        self._signal_expire = signal_expire
        if id is None:
            self._id = new_token()
        else:
            if not isinstance(id, str | bytes):
                raise TypeError(f"Incorrect type for `id`. Must be bytes/str not {type(id)}.")
            self._id = _check_token(id, _utf8).decode()
        name = _name(name)
        self._name = REDIS_LOCK_PREFIX + name
        self._signal = REDIS_LOCK_SIGNAL_PREFIX + name
        self._renewed = expire is None or auto_renewal
        self.blocking = blocking
        self._lease: Lease | None = None

    @functools.cached_property
    def _lock(self) -> Lock:
        # built at first use, so that ``strict=False`` with a client of another type is taken
        # (as python-redis-lock takes it) until the lock is used
        ttl = RENEWED_TTL if self._expire is None else float(self._expire)
        base = Lock(self._client, self._name, ttl=ttl, holder_info=False)
        definition = _definition(base._definition, compat_keys(self._name, wake=self._signal))
        lock: Lock = Lock._of(definition)
        return lock

    @property
    def id(self) -> str:
        """This lock's token (what the server stores while it holds it)."""
        return self._id

    @property
    def lease(self) -> Lease | None:
        """The current lease (a :class:`fencelock.Lease`), or None when not held."""
        return self._lease

    @property
    def fence(self) -> int | None:
        """The current lease's fencing token, or None when not held."""
        return None if self._lease is None else self._lease.fence

    @property
    def lost(self) -> threading.Event | None:
        """The current lease's loss signal (set when it is known lost), or None."""
        return None if self._lease is None else self._lease.lost

    def get_owner_id(self) -> str | None:
        """The id of whoever holds the lock (read on the server), or None."""
        owner = self._client.get(self._name)
        if isinstance(owner, bytes):
            return owner.decode("utf-8", "replace")
        return None if owner is None else str(owner)

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; True once held. ``blocking=False``: one attempt. ``timeout``: wait
        at most that many seconds (None: until free). Raises :class:`AlreadyAcquired`,
        :class:`TimeoutNotUsable`, :class:`InvalidTimeout`, :class:`TimeoutTooLarge` as
        python-redis-lock does, :class:`ServersUnavailable` when the server does not answer."""
        if not blocking and timeout is not None:
            raise TimeoutNotUsable("Timeout cannot be used if blocking=False")
        wait_s = math.inf if blocking else 0.0
        if timeout:
            timeout = int(timeout)
            if timeout < 0:
                raise InvalidTimeout(f"Timeout ({timeout}) cannot be less than or equal to 0")
            if self._expire and not self._renewed and timeout > self._expire:
                raise TimeoutTooLarge(
                    f"Timeout ({timeout}) cannot be greater than expire ({self._expire})"
                )
            wait_s = float(timeout)
        if self.get_owner_id() == self._id:
            raise AlreadyAcquired("Already acquired from this Lock instance.")
        try:
            grant = self._lock._driver.run(
                acquire_flow(self._lock._definition.plan, self._id, wait_s)
            )
        except Unavailable as exc:
            raise _unavailable(exc) from exc
        if grant is None:
            return False
        lease = self._lock._lease(grant)
        if self._renewed:
            lease.keep_alive()
        self._lease = lease
        return True

    def locked(self) -> bool:
        """Whether anyone holds the lock (read on the server)."""
        return bool(self._client.exists(self._name))

    def extend(self, expire: int | None = None) -> None:
        """Restart the lease at ``expire`` seconds (default: the lock's). Raises
        :class:`NotAcquired` when not held or expired, ``TypeError`` with no expire at all."""
        if expire:
            expire = int(expire)
            if expire < 0:
                raise ConfigError("a negative expire is not acceptable")
        elif self._expire is not None:
            expire = self._expire
        else:
            raise TypeError(
                "To extend a lock 'expire' must be provided as an argument to extend() method "
                "or at initialization time."
            )
        lease = self._lease
        try:
            if lease is not None:
                lease.extend(float(expire))
                return
            # another object with the same id (python-redis-lock's ``Lock(conn, name,
            # id=...).extend()``): restart the lease on the server if it still holds that id
            plan = self._lock._definition.plan
            result = self._lock._driver.run(
                extend_flow(plan, self._id, round(expire * 1000), math.inf)
            )
        except LockLost as exc:
            raise NotAcquired(f"Lock {self._name} is not acquired or it already expired.") from exc
        except Unavailable as exc:
            raise _unavailable(exc) from exc
        if result.outcome is ExtendOutcome.REFUSED:
            raise NotAcquired(f"Lock {self._name} is not acquired or it already expired.")
        if result.outcome is ExtendOutcome.UNKNOWN:
            assert result.unavailable is not None
            raise _unavailable(result.unavailable)

    def release(self) -> None:
        """Release the lock this object (or another with the same ``id``) holds. Raises
        :class:`NotAcquired` when it is not held under this id (expired or taken)."""
        lease, self._lease = self._lease, None
        try:
            if lease is not None:
                lease.release()
                return
            verdict = self._lock._driver.run(
                release_by_token(self._lock._definition.plan, self._id)
            )
        except LockLost as exc:
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.") from exc
        except Unavailable as exc:
            raise _unavailable(exc) from exc
        if isinstance(verdict.error, Unavailable):
            raise _unavailable(verdict.error) from verdict.error
        if verdict.error is not None:
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.")

    def reset(self) -> None:
        """Delete the lock whoever holds it, and wake a waiter. Use with care: the holder is
        not told (its fence is still older than the next holder's)."""
        with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self._name, self._signal)
            pipe.lpush(self._signal, 1)
            pipe.pexpire(self._signal, self._signal_expire)
            pipe.execute()

    def __enter__(self) -> RedisLock:
        if not self.acquire(blocking=self.blocking):
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RedisLock({self._name!r}, expire={self._expire})"


def reset_all(redis_client: redis.Redis, signal_expire: int = 1000) -> int:
    """python-redis-lock's ``reset_all``: delete every lock at ``lock:*`` whoever holds it,
    and wake its waiters (``lock-signal:<name>``, kept ``signal_expire`` ms). Use with care,
    as :meth:`RedisLock.reset`: the holders are not told. Keys are found with ``SCAN`` (not
    in one script, as there): a lock taken meanwhile may be left. fencelock's own keys beside
    a lock (its fence register above all) are kept. Returns how many locks were deleted."""
    deleted = 0
    for raw in redis_client.scan_iter(match=REDIS_LOCK_PREFIX + "*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        if _beside_key(key):
            continue
        signal = REDIS_LOCK_SIGNAL_PREFIX + key.removeprefix(REDIS_LOCK_PREFIX)
        with redis_client.pipeline(transaction=True) as pipe:
            pipe.delete(key, signal)
            pipe.lpush(signal, 1)
            pipe.pexpire(signal, signal_expire)
            pipe.execute()
        deleted += 1
    return deleted


def _beside_key(key: str) -> bool:
    """Whether ``key`` is one fencelock keeps beside a compat lock (see :func:`compat_keys`:
    a lock key with a brace keeps them at ``<lock key>:fencelock:<field>``)."""
    base, sep, field = key.rpartition(":fencelock:")
    return bool(sep) and ("{" in base or "}" in base) and field in (*_BESIDE, "wake")


def _utf8(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
