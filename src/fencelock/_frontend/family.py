"""What both front ends' RWLock and MultiLock share that is not I/O: construction, validation
and the flows they run. The locks they are made of are the front end's own ``Lock`` class."""

from __future__ import annotations

import random
from typing import Any, ClassVar, Generic, TypeVar

from .._core.acquire import Grant
from .._core.effects import Flow
from .._core.multi import acquire_all, check_keys, try_acquire_all
from .._core.rwlock import reader_plan, writer_plan
from ..options import DEFAULT_TTL, Seconds, seconds
from .definition import UNSET, Definition
from .fronts import LockFront, reject_fair
from .holder import new_token

L = TypeVar("L", bound=LockFront)


class RWFront(Generic[L]):
    """A read-write lock: many readers at once, or one writer and no reader.

    ``RWLock(servers, key, ttl=30.0, ...)`` takes the options of :class:`~fencelock.Lock`.
    ``read()`` / ``write()`` are ``hold()`` context managers; ``acquire_read()`` /
    ``acquire_write()`` give the leases. Every reader's lease expires on its own; a waiting
    writer stops new readers from entering; a writer's fence is larger than every fence issued
    before on the key (readers' included). No upgrade: a reader asking for the write lock
    waits like any writer, for every reader to leave (itself included), and so gets
    NotAcquired when its wait ends: release the read lease first.
    """

    _lock_class: ClassVar[type[Any]]

    def __init__(self, servers: Any, key: str, ttl: Seconds = DEFAULT_TTL, **options: Any) -> None:
        reject_fair("a read-write lock", options)
        base = self._lock_class(servers, key, ttl, **options)
        self._setup(base._definition)

    @classmethod
    def _of(cls, definition: Definition) -> Any:
        rw = cls.__new__(cls)
        rw._setup(definition)
        return rw

    def _setup(self, definition: Definition) -> None:
        self._definition = definition
        self._reader: L = self._lock_class._of(definition.with_plan(reader_plan(definition.plan)))
        self._writer: L = self._lock_class._of(definition.with_plan(writer_plan(definition.plan)))

    @property
    def key(self) -> str:
        return self._definition.key

    @property
    def servers(self) -> list[str]:
        return self._definition.names

    def __repr__(self) -> str:
        return f"RWLock({self.key!r}, servers={self.servers}, ttl={self._definition.options.ttl})"


class MultiFront(Generic[L]):
    """Several keys locked together: all or none.

    ``MultiLock(servers, ["a", "b"], ttl=30.0, ...)`` takes the options of
    :class:`~fencelock.Lock`. Keys are taken in sorted order (two multilocks over overlapping
    keys cannot deadlock) within one shared wait; if one is not granted in time, those taken
    are released before NotAcquired / Unavailable is raised. ``acquire()`` gives a tuple of
    leases in sorted key order; ``hold()`` renews them all and releases them all.
    ConfigError for an empty key list, duplicate or empty keys.
    """

    _lock_class: ClassVar[type[Any]]

    def __init__(self, servers: Any, keys: Any, ttl: Seconds = DEFAULT_TTL, **options: Any) -> None:
        names = check_keys(keys)
        reject_fair("a multi-key lock", options)
        first = self._lock_class(servers, names[0], ttl, **options)
        definition: Definition = first._definition
        self._setup(
            tuple(
                Definition(definition.servers, name, definition.options, definition.gate)
                for name in names
            )
        )

    @classmethod
    def _of(cls, definitions: tuple[Definition, ...]) -> Any:
        multi = cls.__new__(cls)
        multi._setup(definitions)
        return multi

    def _setup(self, definitions: tuple[Definition, ...]) -> None:
        self._locks: tuple[L, ...] = tuple(self._lock_class._of(d) for d in definitions)
        self._driver = self._locks[0]._driver  # type: ignore[attr-defined]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(lock.key for lock in self._locks)

    @property
    def servers(self) -> list[str]:
        return self._locks[0].servers

    def _acquire_flow(self, wait: object) -> Flow[tuple[Grant, ...]]:
        first = self._locks[0]
        wait_s = (
            first.options.wait
            if wait is UNSET
            else seconds(wait, "wait", allow_zero=True, allow_inf=True)
        )
        for lock in self._locks:
            lock._check_open()
        return acquire_all(
            [lock._definition.plan for lock in self._locks],
            wait_s,
            new_token=new_token,
            holder_info=first._definition.holder,
            rand=random.random,
        )

    def _try_flow(self) -> Flow[tuple[Grant, ...] | None]:
        for lock in self._locks:
            lock._check_open()
        return try_acquire_all(
            [lock._definition.plan for lock in self._locks],
            new_token=new_token,
            holder_info=self._locks[0]._definition.holder,
            rand=random.random,
        )

    def __repr__(self) -> str:
        return f"MultiLock({list(self.keys)!r}, servers={self.servers})"
