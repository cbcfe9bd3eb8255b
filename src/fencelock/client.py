"""One handle per set of servers: :class:`Client` (blocking) and :class:`AsyncClient`.

A client resolves its servers once and holds the default lock options; ``client.lock(key)``
is a dictionary look-up and a small object (no I/O), so building a lock per request is cheap.
Locks built with ``Lock(servers, key)`` share the same engine anyway (it is process-wide,
keyed by server address); a client adds one place for defaults and a ``close()``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ._async.family import MultiLock as AsyncMultiLock
from ._async.family import RWLock as AsyncRWLock
from ._async.family import Semaphore as AsyncSemaphore
from ._async.lock import Lock as AsyncLock
from ._core.multi import check_keys
from ._core.semaphore import check_limit
from ._engine.registry import resolve
from ._engine.server import Server
from ._frontend.definition import Definition, Gate
from ._frontend.fronts import build_options
from ._sync.family import MultiLock, RWLock, Semaphore
from ._sync.lock import Lock
from .election import AsyncElection, Election, check_name, default_name
from .errors import FencelockError
from .options import (
    DEFAULT_TTL,
    DEFAULT_WAIT,
    DRIFT_FACTOR,
    DRIFT_MIN,
    FENCE_RETENTION,
    HANDOFF_WINDOW,
    RETRY_BASE,
    RETRY_CAP,
    LockOptions,
    Seconds,
    check_key,
)

L = TypeVar("L", Lock, AsyncLock)
C = TypeVar("C", bound="_ClientBase[Any]")
S = TypeVar("S", Semaphore, AsyncSemaphore)


class _ClientBase(Generic[L]):
    _lock_class: type[L]

    def __init__(
        self,
        servers: Any,
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
        restart_delay: bool | None = None,
        replicas: int = 0,
        fence_retention: Seconds | None = FENCE_RETENTION,
    ) -> None:
        self._raw: dict[str, Any] = {
            "server_timeout": server_timeout,
            "drift_factor": drift_factor,
            "drift_min": drift_min,
            "retry_base": retry_base,
            "retry_cap": retry_cap,
            "renew_every": renew_every,
            "handoff_window": handoff_window,
            "holder_info": holder_info,
            "purpose": purpose,
            "restart_delay": restart_delay,
            "replicas": replicas,
            "fence_retention": fence_retention,
        }
        self.options = LockOptions.build(ttl=ttl, wait=wait, **self._raw)
        self._servers: tuple[Server, ...] = resolve(servers)
        self._gate = Gate()

    @property
    def servers(self) -> list[str]:
        """Password-free names of the servers, in order."""
        return [server.name for server in self._servers]

    def lock(
        self,
        key: str,
        ttl: Seconds | None = None,
        wait: Seconds | None = None,
        *,
        reentrant: bool = False,
        owner: str | None = None,
        replicas: int | None = None,
        fair: bool = False,
    ) -> L:
        """A lock on ``key`` over this client's servers; ``ttl``/``wait``/``replicas`` default
        to the client's. No I/O. Raises :class:`~fencelock.ConfigError` for a bad key or option.
        ``reentrant``/``owner``/``replicas``/``fair``: see :class:`~fencelock.Lock`."""
        definition = self._definition(key, ttl, wait, replicas)
        return self._lock_class._of(definition, reentrant=reentrant, owner=owner, fair=fair)  # type: ignore[no-any-return]

    def _definition(
        self, key: str, ttl: Seconds | None, wait: Seconds | None, replicas: int | None = None
    ) -> Definition:
        if self._gate.closed:
            raise FencelockError("this client was closed")
        options = self._options(ttl, wait, replicas)
        return Definition(self._servers, check_key(key), options, self._gate)

    def _semaphore(
        self, cls: type[S], key: str, limit: int, ttl: Seconds | None, wait: Seconds | None
    ) -> S:
        """``Client.semaphore`` of either flavour: the limit is checked before the key and
        the options."""
        limit = check_limit(limit)
        return cls._of_limit(self._definition(key, ttl, wait), limit)  # type: ignore[no-any-return]

    def _definitions(
        self, keys: object, ttl: Seconds | None, wait: Seconds | None
    ) -> tuple[Definition, ...]:
        return tuple(self._definition(name, ttl, wait) for name in check_keys(keys))

    def _twin(self, cls: type[C]) -> C:
        """A client of the other flavour (``Client`` <-> ``AsyncClient``) on the same servers,
        with the same options, closed together with this one. No I/O."""
        twin = cls.__new__(cls)
        twin._raw = self._raw
        twin.options = self.options
        twin._servers = self._servers
        twin._gate = self._gate
        return twin

    def _election_lock(self, key: str, ttl: Seconds | None, name: str | None) -> tuple[L, str]:
        return self.lock(key, ttl=ttl), default_name() if name is None else check_name(name)

    def _options(
        self, ttl: Seconds | None, wait: Seconds | None, replicas: int | None = None
    ) -> LockOptions:
        if ttl is None and wait is None and replicas is None:
            return self.options
        raw = self._raw if replicas is None else {**self._raw, "replicas": replicas}
        return build_options(
            self.options.ttl if ttl is None else ttl,
            self.options.wait if wait is None else wait,
            raw,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(servers={self.servers}, ttl={self.options.ttl})"


class Client(_ClientBase[Lock]):
    """One handle per set of servers for the blocking API.

    ``Client(servers, ttl=30.0, wait=10.0, ...)`` takes the servers and the keyword options of
    :class:`~fencelock.Lock` as defaults. ``close()`` (or leaving ``with``) stops new locks and
    acquisitions from this client's locks; leases already handed out can still be released.
    """

    _lock_class = Lock

    def election(self, key: str, ttl: Seconds | None = None, name: str | None = None) -> Election:
        """A leader election on ``key`` (its lock's ttl: ``ttl``, default the client's);
        ``name`` says who leads in ``leader()`` and ``fencelock status`` (default
        ``host:pid``). No I/O. See :mod:`fencelock.election`."""
        return Election(*self._election_lock(key, ttl, name))

    def semaphore(
        self, key: str, limit: int = 4, ttl: Seconds | None = None, wait: Seconds | None = None
    ) -> Semaphore:
        """A semaphore of ``limit`` permits on ``key`` (see :class:`~fencelock.Semaphore`)."""
        return self._semaphore(Semaphore, key, limit, ttl, wait)

    def rwlock(self, key: str, ttl: Seconds | None = None, wait: Seconds | None = None) -> RWLock:
        """A read-write lock on ``key`` (see :class:`~fencelock.RWLock`)."""
        return RWLock._of(self._definition(key, ttl, wait))  # type: ignore[no-any-return]

    def multilock(
        self, keys: object, ttl: Seconds | None = None, wait: Seconds | None = None
    ) -> MultiLock:
        """All of ``keys`` or none (see :class:`~fencelock.MultiLock`)."""
        return MultiLock._of(self._definitions(keys, ttl, wait))  # type: ignore[no-any-return]

    def close(self) -> None:
        self._gate.closed = True

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_ClientBase[AsyncLock]):
    """The asyncio twin of :class:`Client` (``fencelock.asyncio.Client``): ``await
    client.aclose()`` or ``async with``."""

    _lock_class = AsyncLock

    def election(
        self, key: str, ttl: Seconds | None = None, name: str | None = None
    ) -> AsyncElection:
        """The asyncio twin of :meth:`Client.election` (no I/O)."""
        return AsyncElection(*self._election_lock(key, ttl, name))

    def semaphore(
        self, key: str, limit: int = 4, ttl: Seconds | None = None, wait: Seconds | None = None
    ) -> AsyncSemaphore:
        """A semaphore of ``limit`` permits on ``key`` (see :class:`~fencelock.Semaphore`)."""
        return self._semaphore(AsyncSemaphore, key, limit, ttl, wait)

    def rwlock(
        self, key: str, ttl: Seconds | None = None, wait: Seconds | None = None
    ) -> AsyncRWLock:
        """A read-write lock on ``key`` (see :class:`~fencelock.RWLock`)."""
        return AsyncRWLock._of(self._definition(key, ttl, wait))  # type: ignore[no-any-return]

    def multilock(
        self, keys: object, ttl: Seconds | None = None, wait: Seconds | None = None
    ) -> AsyncMultiLock:
        """All of ``keys`` or none (see :class:`~fencelock.MultiLock`)."""
        return AsyncMultiLock._of(self._definitions(keys, ttl, wait))  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        self._gate.closed = True

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
