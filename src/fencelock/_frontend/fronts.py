"""What both front ends' Lock classes share that is not I/O: construction and validation of
the options, the flows an acquisition runs, and the lock's identity (key, servers, repr)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .._core.acquire import AttemptFn, Grant, acquire, try_acquire
from .._core.effects import Flow
from .._core.fair import acquire_fair, fair_attempt, fair_plan
from .._core.semaphore import SemaphorePlan, check_limit, make_semaphore_plan, permit_attempt
from .._engine.registry import resolve
from ..errors import ConfigError, FencelockError
from ..options import (
    DEFAULT_TTL,
    DEFAULT_WAIT,
    DRIFT_FACTOR,
    DRIFT_MIN,
    FAIR_HEARTBEAT,
    FENCE_RETENTION,
    HANDOFF_WINDOW,
    RETRY_BASE,
    RETRY_CAP,
    LockOptions,
    Seconds,
    seconds,
)
from . import hooks as _hooks
from .definition import UNSET, Definition
from .holder import new_token
from .reentry import Reentry, make_reentry

#: Validated option sets kept by their raw arguments (a Lock per key validates nothing twice).
_built: dict[tuple[object, ...], LockOptions] = {}
_BUILT_MAX = 512
_FIELDS = (
    "ttl",
    "wait",
    "server_timeout",
    "drift_factor",
    "drift_min",
    "retry_base",
    "retry_cap",
    "renew_every",
    "handoff_window",
    "holder_info",
    "purpose",
    "restart_delay",
    "replicas",
    "fence_retention",
)


def build_options(ttl: object, wait: object, rest: Mapping[str, object]) -> LockOptions:
    """:class:`LockOptions` from ``ttl``, ``wait`` and every other option by name, remembered
    like :func:`_options` (``Client.lock(key, ttl=, wait=)`` shares the cache with ``Lock``)."""
    return _options((ttl, wait, *(rest[name] for name in _FIELDS[2:])))


def _options(args: tuple[object, ...]) -> LockOptions:
    """``LockOptions.build`` of the arguments in ``_FIELDS`` order, remembered (keyed with their
    types, so that ``True`` is not taken for ``1``)."""
    try:
        cache_key = tuple((type(a), a) for a in args)
        options = _built.get(cache_key)
    except TypeError:  # unhashable: validation will say what is wrong
        cache_key, options = (), None
    if options is None:
        options = LockOptions.build(**dict(zip(_FIELDS, args, strict=False)))
        if cache_key:
            if len(_built) >= _BUILT_MAX:
                _built.clear()
            _built[cache_key] = options
    return options


#: Definitions kept by (servers, key, options): a Lock built per key for a key seen before
#: costs a dictionary look-up.
_definitions: dict[tuple[object, ...], Definition] = {}
_DEFINITIONS_MAX = 4096


def _definition(servers: Any, key: str, options: LockOptions) -> Definition:
    resolved = resolve(servers)
    cache_key = (resolved, key, options)
    try:
        definition = _definitions.get(cache_key)
    except TypeError:  # an unhashable key: validation will say what is wrong
        return Definition(resolved, key, options)
    if definition is None:
        definition = Definition(resolved, key, options)
        if len(_definitions) >= _DEFINITIONS_MAX:
            _definitions.clear()
        _definitions[cache_key] = definition
    else:
        definition.warn()
    return definition


def check_fair(fair: object) -> bool:
    """``fair`` must be a bool (ConfigError otherwise)."""
    if not isinstance(fair, bool):
        raise ConfigError(f"fair must be a bool, not {type(fair).__name__}")
    return fair


def reject_fair(kind: str, options: Mapping[str, object]) -> None:
    """ConfigError when ``fair`` is asked of a primitive that has no fair form."""
    if "fair" in options:
        raise ConfigError(f"fair= is not supported by {kind} (only by Lock)")


class LockFront:
    """A lock definition: servers, key, lease length, default wait. Safe to share.

    ``servers`` is a URL (``redis://host:port/db``, ``valkey://``, ``rediss://``, ``unix://``),
    a redis-py client, or a sequence of them: one server is the classic ``SET NX PX`` lock,
    N > 1 independent servers make it Redlock (majority ``N // 2 + 1``). Locks naming the same
    servers (by address, whether as URLs or clients) share connections, health and identity
    checks process-wide, so building a Lock per key is cheap and sends nothing. fencelock opens
    its own connections (same address, auth and TLS as a client given), with short timeouts and
    no retries: a retried ``SET NX`` is never safe.

    Durations are seconds (int, float or :class:`datetime.timedelta`):

    - ``ttl``: lease length; ``wait``: default wait of ``acquire()`` (``math.inf`` to wait
      forever must be asked for explicitly);
    - ``server_timeout``: how long a round waits for a server, connecting included (default
      ``ttl/10`` within [0.05, 1.0]); ``drift_factor`` / ``drift_min``: clock-drift allowance
      ``ttl * factor + min`` taken off every lease's validity;
    - ``renew_every``: watchdog period (default ``ttl/3``);
    - ``holder_info``: store host/pid/``purpose`` beside the lock for ``fencelock status``;
    - ``reentrant``: the same owner (the thread; in asyncio the task; or ``owner``, an id of
      your choosing) acquiring again gets the lease it holds (same token and fence) instead of
      waiting for itself; only the outermost acquire and release talk to the servers.
    - ``fair``: waiters are granted in arrival order (a queue on each server; a waiter that
      died is skipped after about ``FAIR_HEARTBEAT`` = 3 s); combines with every other option,
      ``reentrant`` included (see docs/family.md, "Fair lock", for what the order means over N
      servers and when it can be broken). Every Lock on a key should agree on ``fair``.
    - ``restart_delay``: a server seen restarting (its ``run_id`` changed) less than ``ttl`` ago
      does not vote, so a restart that lost its keys cannot let a second majority form (default
      None: on for N > 1 servers, off for one).
    - ``replicas``: a grant or extend counts on a server only once ``WAIT replicas`` confirmed
      that many of its replicas have it, within the server timeout (default 0: the primary's
      answer is enough). A server short of acknowledgements counts as unavailable, so a lock
      needing replicas that are down fails with :class:`~fencelock.Unavailable`.
    - ``fence_retention``: how long a key's fence register stays on a server after the last
      grant (default 7 days, or ``ttl`` if longer; at least ``ttl`` and 1 s; None: for
      ever). After it, the next
      fence comes from the server's clock alone (see docs/fencing.md for what that assumes).

    Raises :class:`~fencelock.ConfigError` for any bad argument, before any I/O.
    """

    def __init__(
        self,
        servers: Any,
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
        reentrant: bool = False,
        owner: str | None = None,
        restart_delay: bool | None = None,
        replicas: int = 0,
        fair: bool = False,
        fence_retention: Seconds | None = FENCE_RETENTION,
    ) -> None:
        args = (
            ttl,
            wait,
            server_timeout,
            drift_factor,
            drift_min,
            retry_base,
            retry_cap,
            renew_every,
            handoff_window,
            holder_info,
            purpose,
            restart_delay,
            replicas,
            fence_retention,
        )
        reentry = make_reentry(reentrant, owner)
        check_fair(fair)
        self._setup(_definition(servers, key, _options(args)))
        self._reentry: Reentry | None = reentry
        self._set_fair(fair)

    @classmethod
    def _of(
        cls,
        definition: Definition,
        *,
        reentrant: bool = False,
        owner: str | None = None,
        fair: bool = False,
    ) -> Any:
        """A lock from an already validated definition (``Client.lock``); no I/O."""
        reentry = make_reentry(reentrant, owner)
        check_fair(fair)
        lock = cls.__new__(cls)
        lock._setup(definition)
        lock._reentry = reentry
        lock._set_fair(fair)
        return lock

    def _setup(self, definition: Definition) -> None:
        self._definition = definition
        self._closed = False
        self._reentry = None
        self._fair = False

    def _set_fair(self, fair: bool) -> None:
        """Make this lock fair: the same definition driving the fair scripts."""
        self._fair = fair
        if fair:
            self._definition = self._definition.with_plan(fair_plan(self._definition.plan))

    def _attempt_with(self) -> AttemptFn | None:
        """The attempt the acquire flows repeat (None: the plain lock's)."""
        if self._fair:
            return fair_attempt(self._definition.plan)
        return None

    def _grant_definition(self, grant: Grant) -> Definition:
        """The definition a lease of ``grant`` extends and releases on."""
        return self._definition

    @property
    def key(self) -> str:
        return self._definition.key

    @property
    def options(self) -> LockOptions:
        return self._definition.options

    @property
    def ttl(self) -> float:
        return self._definition.options.ttl

    @property
    def servers(self) -> list[str]:
        """Password-free names of the servers, in order."""
        return self._definition.names

    @property
    def _lock_id(self) -> tuple[object, ...]:
        """What makes two lock objects the same lock (for reentrancy)."""
        definition = self._definition
        return (tuple(definition.names), definition.plan.keys.lock)

    def _acquire_flow(
        self, wait: object, cancelled: Callable[[], bool] | None = None
    ) -> Flow[Grant]:
        """The acquire flow for ``wait`` (UNSET: the lock's default), ended early once
        ``cancelled()`` is true; ConfigError before I/O."""
        wait_s = (
            self.options.wait
            if wait is UNSET
            else seconds(wait, "wait", allow_zero=True, allow_inf=True)
        )
        self._check_open()
        definition = self._definition
        # a fair lock waits in its queue (kept by heartbeats), any other repeats its attempt
        flow_for = (
            partial(acquire_fair, heartbeat_s=FAIR_HEARTBEAT)
            if self._fair
            else partial(acquire, attempt_with=self._attempt_with())
        )
        flow = flow_for(
            definition.plan,
            wait_s,
            new_token=new_token,
            holder_info=definition.holder,
            rand=random.random,
            cancelled=cancelled,
        )
        return self._observed(flow)

    def _try_flow(self) -> Flow[Grant | None]:
        self._check_open()
        definition = self._definition
        flow = try_acquire(definition.plan, new_token(), definition.holder(), self._attempt_with())
        return self._observed(flow)

    def _observed(self, flow: Flow[Any]) -> Flow[Any]:
        """``flow``, seen by the observers if there are any."""
        if not _hooks.observers:
            return flow
        return _hooks.observe_acquire(flow, self.key, len(self._definition.servers))

    def _check_open(self) -> None:
        if self._closed or self._definition.gate.closed:
            raise FencelockError(f"{self.key!r}: this Lock (or its client) was closed")

    def __repr__(self) -> str:
        fair = ", fair=True" if self._fair else ""
        return f"Lock({self.key!r}, servers={self.servers}, ttl={self.options.ttl}{fair})"


class SemaphoreFront(LockFront):
    """A leased semaphore: at most ``limit`` permits valid at once, each a lease of its own
    (token, fence, ttl, renewal and loss as for a lock) on one of ``limit`` slots.

    ``Semaphore(servers, key, limit, ttl=30.0, ...)`` takes the options of
    :class:`~fencelock.Lock`; ``limit`` is an ``int`` >= 1 (:class:`~fencelock.ConfigError`
    otherwise, before any I/O). ``acquire()``/``try_acquire()``/``hold()`` give a ``Permit``:
    a lease plus ``.slot`` (0..limit-1). Fences grow per semaphore, across its slots. A holder
    that crashed frees its permit when its ttl runs out; release is checked by token.
    """

    _limit: int
    _sem: SemaphorePlan

    def __init__(
        self, servers: Any, key: str, limit: int, ttl: Seconds = DEFAULT_TTL, **options: Any
    ) -> None:
        if "reentrant" in options or "owner" in options:
            raise FencelockError("a semaphore is not reentrant")
        reject_fair("a semaphore", options)
        self._limit = check_limit(limit)
        super().__init__(servers, key, ttl, **options)

    @classmethod
    def _of_limit(cls, definition: Definition, limit: int) -> Any:
        semaphore = cls.__new__(cls)
        semaphore._limit = check_limit(limit)
        semaphore._setup(definition)
        return semaphore

    def _setup(self, definition: Definition) -> None:
        super()._setup(definition)
        self._sem = make_semaphore_plan(definition.plan, self._limit)
        self._slots = tuple(definition.with_plan(plan) for plan in self._sem.slots)

    @property
    def limit(self) -> int:
        return self._limit

    def _attempt_with(self) -> AttemptFn | None:
        return permit_attempt(self._sem)

    def _grant_definition(self, grant: Grant) -> Definition:
        return self._slots[grant.slot]

    def __repr__(self) -> str:
        return (
            f"Semaphore({self.key!r}, limit={self._limit}, servers={self.servers}, "
            f"ttl={self.options.ttl})"
        )
