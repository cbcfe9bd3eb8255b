"""Storage-side fencing guards: storage that refuses a writer whose fence is older than one
it has already accepted.

A lease alone cannot protect an invariant: a holder that pauses (GC, swap, a slow disk) past
its lease wakes up still believing it holds the lock. Each write must carry ``lease.fence`` and
the storage must refuse a fence older than the newest it has accepted. This module ships that
check for the storage people use:

- :class:`RedisFence` / :class:`AsyncRedisFence`: a Redis or Valkey server (any server, not
  necessarily the lock's). Each resource is one hash ``<prefix><resource>`` holding ``value``
  and ``fence``; every check-and-write is a single Lua script, so it is atomic.
- :func:`fence_column`, :func:`fenced_update`, :func:`execute_fenced`: SQL on SQLAlchemy Core 2
  (the ``sql`` extra; SQLAlchemy is imported only when these are called). The fenced UPDATE is
  ``UPDATE t SET <values>, fence = :f WHERE <where> AND (fence IS NULL OR fence <= :f)``.

Rules shared by every guard:

- A fence is accepted when it is **greater than or equal to** the newest fence accepted for the
  resource (equal is allowed: one holder writes several times under one lease). An older fence
  raises :class:`~fencelock.StaleFence` (with ``offered`` and ``current``) and changes nothing.
- A fence is a Python ``int`` (not ``bool``) in ``0 .. 2**63 - 1`` (it fits a SQL BIGINT);
  resources are non-empty strings. Bad input raises :class:`~fencelock.ConfigError` before any
  I/O.
- A resource never written has fence 0; in SQL a NULL fence (a column added to rows that
  existed before) also means "no fence yet": every fence is accepted and the write sets it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from ._plain_clients import client_kwargs, describe
from ._scripts import Script, _load
from .errors import ConfigError, FencelockError, StaleFence
from .options import check_url, seconds

if TYPE_CHECKING:
    from sqlalchemy import Column, Table, Update
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session
    from sqlalchemy.sql.expression import ColumnElement

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_TIMEOUT",
    "MAX_FENCE",
    "MAX_SAFE_INT",
    "ApplyRefused",
    "AsyncRedisFence",
    "BelowFloor",
    "MissingRow",
    "RedisFence",
    "execute_fenced",
    "fence_column",
    "fenced_update",
]

WRITE = _load("fence_write", 1)
ADVANCE = _load("fence_advance", 1)
APPLY = _load("fence_apply", 1)
SCRIPTS = (WRITE, ADVANCE, APPLY)

DEFAULT_PREFIX = "fencelock:res:"
# Storage calls are ordinary reads and writes, not lock rounds: a few seconds is generous on a
# healthy server and still bounds a call to a dead one.
DEFAULT_TIMEOUT = 5.0
# The largest fence: a signed 64-bit integer, so the same fence fits a SQL BIGINT column.
MAX_FENCE = 2**63 - 1
# apply() does its arithmetic in Lua numbers (doubles): exact for integers up to 2^53 - 1.
MAX_SAFE_INT = 2**53 - 1
# ``apply`` operations and the sign they give to ``amount``.
_OPS = {"incrby": 1, "decrby": -1}


class ApplyRefused(FencelockError, ValueError):
    """:meth:`RedisFence.apply` refused the update; nothing was changed.

    ``reason`` is ``"not_integer"`` when the stored value is not an integer within
    ``±(2**53 - 1)`` or the result would leave that range, ``"below_floor"`` for
    :class:`BelowFloor`. ``value`` is the stored value (bytes, or None when never written).
    """

    def __init__(self, resource: str, reason: str, value: bytes | None, message: str) -> None:
        super().__init__(message)
        self.resource = resource
        self.reason = reason
        self.value = value


class BelowFloor(ApplyRefused):
    """The update would take the value below ``min_value`` (e.g. stock below 0)."""

    def __init__(self, resource: str, current: int, amount: int, min_value: int) -> None:
        super().__init__(
            resource,
            "below_floor",
            str(current).encode(),
            f"{resource!r}: {current} {'+' if amount >= 0 else '-'} {abs(amount)} would go "
            f"below the floor {min_value}; nothing changed",
        )
        self.current = current
        self.amount = amount
        self.min_value = min_value


class MissingRow(FencelockError, LookupError):
    """:func:`execute_fenced` found no row matching the WHERE clause; nothing was changed."""

    def __init__(self, resource: str) -> None:
        super().__init__(f"{resource!r}: no such row; nothing was updated")
        self.resource = resource


# ---------------------------------------------------------------------------------------------
# Input checks (pure, before any I/O)


def _check_fence(fence: object) -> int:
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise ConfigError(f"fence must be an int (lease.fence), not {fence!r}")
    if fence < 0:
        raise ConfigError(f"fence must be >= 0, got {fence}")
    if fence > MAX_FENCE:
        raise ConfigError(f"fence must be <= 2**63 - 1, got {fence}")
    return int(fence)


def _check_resource(resource: object) -> str:
    if not isinstance(resource, str):
        raise ConfigError(f"resource must be a str, not {type(resource).__name__}")
    if not resource:
        raise ConfigError("resource must not be empty")
    return resource


def _encode_value(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        raise ConfigError("value must be bytes, str, int or float, not bool")
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"value must be a finite float, got {value!r}")
        return repr(value).encode()
    raise ConfigError(f"value must be bytes, str, int or float, not {type(value).__name__}")


def _check_int(value: object, name: str, limit: int = MAX_SAFE_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, not {value!r}")
    if abs(value) > limit:
        raise ConfigError(f"{name} must be within ±(2**53 - 1), got {value}")
    return int(value)


def _apply_args(op: object, amount: object, min_value: object) -> tuple[int, int | None]:
    if not isinstance(op, str) or op not in _OPS:
        raise ConfigError(f"op must be one of {sorted(_OPS)}, got {op!r}")
    delta = _OPS[op] * _check_int(amount, "amount")
    floor = None if min_value is None else _check_int(min_value, "min_value")
    return delta, floor


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise ConfigError(f"prefix must be a str, not {type(prefix).__name__}")
    return prefix


def _pool_source(
    client_or_url: object, client_type: type, pool_type: Any, what: str
) -> tuple[dict[str, Any], Any]:
    """(connection kwargs, connection class) to build our own pool from, or ConfigError."""
    if isinstance(client_or_url, str):
        pool = pool_type.from_url(check_url(client_or_url))  # parses only: no I/O
    elif isinstance(client_or_url, client_type):
        pool = client_or_url.connection_pool  # type: ignore[attr-defined]
    else:
        raise ConfigError(
            f"{what} needs a URL or a {client_type.__module__}.Redis client, "
            f"not {type(client_or_url).__name__}"
        )
    return dict(pool.connection_kwargs), pool.connection_class


def _storage_kwargs(kwargs: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    # No client-side retries: apply() is not idempotent, so a timed-out call must surface.
    # Raw bytes: read() returns the value exactly as stored.
    result = client_kwargs(kwargs, timeout)
    result["decode_responses"] = False
    return result


def _decode_int(raw: object) -> int:
    if isinstance(raw, bytes | str):
        return int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    raise FencelockError(f"unexpected reply from a fence script: {raw!r}")


def _decode_reply(raw: object) -> tuple[int, bytes]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise FencelockError(f"unexpected reply from a fence script: {raw!r}")
    code, payload = raw
    if not isinstance(code, int) or isinstance(code, bool):
        raise FencelockError(f"unexpected reply from a fence script: {raw!r}")
    if isinstance(payload, int):
        payload = str(payload).encode()
    if not isinstance(payload, bytes):
        raise FencelockError(f"unexpected reply from a fence script: {raw!r}")
    return code, payload


def _accepted(resource: str, fence: int, raw: object) -> int:
    """The fence after a write/advance; StaleFence if refused; an error for unknown codes."""
    code, payload = _decode_reply(raw)
    if code == 0:
        raise StaleFence(resource, fence, int(payload))
    if code == 1:
        return int(payload)
    raise FencelockError(f"{resource!r}: unknown reply code {code} from a fence script")


def _applied(resource: str, fence: int, delta: int, floor: int | None, raw: object) -> int:
    code, payload = _decode_reply(raw)
    if code == 1:
        return int(payload)
    if code == 0:
        raise StaleFence(resource, fence, int(payload))
    if code == 2 and floor is not None:
        raise BelowFloor(resource, int(payload), delta, floor)
    if code == 3:
        value = payload or None
        raise ApplyRefused(
            resource,
            "not_integer",
            value,
            f"{resource!r}: value {value!r} + {delta} is not an integer within ±(2**53 - 1); "
            "nothing changed",
        )
    raise FencelockError(f"{resource!r}: unknown reply code {code} from a fence script")


def _read_reply(raw: object) -> tuple[bytes | None, int]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise FencelockError(f"unexpected HMGET reply: {raw!r}")
    value, fence = raw
    if value is not None and not isinstance(value, bytes):
        raise FencelockError(f"unexpected HMGET reply: {raw!r}")
    return value, 0 if fence is None else _decode_int(fence)


# ---------------------------------------------------------------------------------------------
# Redis / Valkey


class RedisFence:
    """Fenced storage on a Redis or Valkey server (blocking).

    ``RedisFence(client_or_url, *, prefix="fencelock:res:", timeout=5.0)``: ``client_or_url`` is
    a ``redis://`` / ``rediss://`` / ``valkey://`` / ``unix://`` URL or a ``redis.Redis`` client
    (its host, auth, TLS and db are reused on a connection pool of our own with ``timeout``
    seconds per call and no client-side retries). The server does not need to be the lock's.

    Each resource lives in one hash ``prefix + resource`` with fields ``value`` and ``fence``
    (no TTL). Raises :class:`~fencelock.ConfigError` for a bad argument, before any I/O.

    Usage::

        store = RedisFence("redis://127.0.0.1:6379/0")
        with lock.hold() as lease:
            store.write("orders:42", lease.fence, b"paid")   # StaleFence if a newer holder wrote
    """

    def __init__(
        self,
        client_or_url: str | redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        kwargs, connection_class = _pool_source(
            client_or_url, redis.Redis, redis.ConnectionPool, "RedisFence"
        )
        self.prefix = _check_prefix(prefix)
        self.timeout = seconds(timeout, "timeout")
        self.name = describe(kwargs)
        pool_kwargs = _storage_kwargs(kwargs, self.timeout)
        pool_kwargs["retry"] = Retry(NoBackoff(), 0)
        pool = redis.ConnectionPool(connection_class=connection_class, **pool_kwargs)
        self.client = redis.Redis(connection_pool=pool)

    def key(self, resource: str) -> str:
        """The server key holding ``resource``."""
        return self.prefix + _check_resource(resource)

    def _run(self, script: Script, key: str, *args: bytes | str) -> Any:
        try:
            return self.client.evalsha(script.sha, script.numkeys, key, *args)
        except NoScriptError:
            return self.client.eval(script.source, script.numkeys, key, *args)  # type: ignore[arg-type]

    def write(self, resource: str, fence: int, value: bytes | str | int | float) -> None:
        """Store ``value`` for ``resource`` if ``fence`` >= the newest fence accepted for it.

        str is stored as UTF-8, int as decimal, float as ``repr``. Raises
        :class:`~fencelock.StaleFence` (``offered``, ``current``) and changes nothing when
        ``fence`` is older; :class:`~fencelock.ConfigError` for bad input (before any I/O);
        redis errors (e.g. ``redis.ConnectionError``, ``redis.TimeoutError``) as they come.
        """
        key, fence, data = self.key(resource), _check_fence(fence), _encode_value(value)
        _accepted(resource, fence, self._run(WRITE, key, str(fence), data))

    def read(self, resource: str) -> tuple[bytes | None, int]:
        """``(value, fence)`` of ``resource``; ``(None, 0)`` if it was never written."""
        key = self.key(resource)
        return _read_reply(self.client.hmget(key, ["value", "fence"]))

    def advance(self, resource: str, fence: int) -> int:
        """Record ``fence`` for ``resource`` without writing a value; returns the fence now held.

        Use it to claim a resource for this lease before a side effect elsewhere: once advanced,
        every older holder's write is refused. Raises :class:`~fencelock.StaleFence` (nothing
        changed) when ``fence`` is older than the current one.
        """
        key, fence = self.key(resource), _check_fence(fence)
        return _accepted(resource, fence, self._run(ADVANCE, key, str(fence)))

    def apply(
        self,
        resource: str,
        fence: int,
        op: str,
        amount: int,
        *,
        min_value: int | None = None,
    ) -> int:
        """Atomically add to the integer value of ``resource`` under the fence; return the result.

        ``op`` is ``"incrby"`` (add ``amount``) or ``"decrby"`` (subtract it); a value never
        written counts as 0. With ``min_value`` the update is refused if the result would be
        below it (``apply(r, f, "decrby", 1, min_value=0)`` sells the last item only once).
        Values, ``amount`` and ``min_value`` must be within ±(2**53 - 1). On success the fence is
        recorded like :meth:`write`.

        Raises (each one changing nothing): :class:`~fencelock.StaleFence` for an older fence;
        :class:`BelowFloor` when the floor would be crossed; :class:`ApplyRefused` when the
        stored value is not such an integer; :class:`~fencelock.ConfigError` for bad input,
        before any I/O.
        """
        key, fence = self.key(resource), _check_fence(fence)
        delta, floor = _apply_args(op, amount, min_value)
        floor_arg = "" if floor is None else str(floor)
        raw = self._run(APPLY, key, str(fence), str(delta), floor_arg)
        return _applied(resource, fence, delta, floor, raw)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()

    def __enter__(self) -> RedisFence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisFence({self.name}, prefix={self.prefix!r})"


class AsyncRedisFence:
    """:class:`RedisFence` for asyncio: the same arguments, checks and errors; the methods are
    coroutines and ``client_or_url`` is a URL or a ``redis.asyncio.Redis`` client. Close it with
    ``await fence.aclose()`` or ``async with``."""

    def __init__(
        self,
        client_or_url: str | aredis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        kwargs, connection_class = _pool_source(
            client_or_url, aredis.Redis, aredis.ConnectionPool, "AsyncRedisFence"
        )
        self.prefix = _check_prefix(prefix)
        self.timeout = seconds(timeout, "timeout")
        self.name = describe(kwargs)
        pool_kwargs = _storage_kwargs(kwargs, self.timeout)
        pool_kwargs["retry"] = AsyncRetry(NoBackoff(), 0)
        pool = aredis.ConnectionPool(connection_class=connection_class, **pool_kwargs)
        self.client = aredis.Redis(connection_pool=pool)

    def key(self, resource: str) -> str:
        """The server key holding ``resource``."""
        return self.prefix + _check_resource(resource)

    async def _run(self, script: Script, key: str, *args: bytes | str) -> Any:
        try:
            return await self.client.evalsha(script.sha, script.numkeys, key, *args)
        except NoScriptError:
            return await self.client.eval(script.source, script.numkeys, key, *args)  # type: ignore[arg-type]

    async def write(self, resource: str, fence: int, value: bytes | str | int | float) -> None:
        """See :meth:`RedisFence.write`."""
        key, fence, data = self.key(resource), _check_fence(fence), _encode_value(value)
        _accepted(resource, fence, await self._run(WRITE, key, str(fence), data))

    async def read(self, resource: str) -> tuple[bytes | None, int]:
        """See :meth:`RedisFence.read`."""
        key = self.key(resource)
        return _read_reply(await self.client.hmget(key, ["value", "fence"]))

    async def advance(self, resource: str, fence: int) -> int:
        """See :meth:`RedisFence.advance`."""
        key, fence = self.key(resource), _check_fence(fence)
        return _accepted(resource, fence, await self._run(ADVANCE, key, str(fence)))

    async def apply(
        self,
        resource: str,
        fence: int,
        op: str,
        amount: int,
        *,
        min_value: int | None = None,
    ) -> int:
        """See :meth:`RedisFence.apply`."""
        key, fence = self.key(resource), _check_fence(fence)
        delta, floor = _apply_args(op, amount, min_value)
        floor_arg = "" if floor is None else str(floor)
        raw = await self._run(APPLY, key, str(fence), str(delta), floor_arg)
        return _applied(resource, fence, delta, floor, raw)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()

    async def __aenter__(self) -> AsyncRedisFence:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncRedisFence({self.name}, prefix={self.prefix!r})"


# ---------------------------------------------------------------------------------------------
# SQL (SQLAlchemy Core 2; imported lazily so the base install does not need it)


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "the SQL fencing guard needs SQLAlchemy 2: pip install 'fencelock[sql]'"
        ) from exc
    return sqlalchemy


def fence_column(name: str = "fence") -> Column[int]:
    """A ``BIGINT NOT NULL DEFAULT 0`` column to hold the newest accepted fence of a row.

    Add it to your ``Table(...)``; fences (about 1.8e15, server microseconds) do not fit a
    32-bit INTEGER. Raises :class:`~fencelock.ConfigError` for an empty or non-str name.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"fence column name must be a non-empty str, got {name!r}")
    sa = _sqlalchemy()
    column: Column[int] = sa.Column(
        name, sa.BigInteger(), nullable=False, default=0, server_default=sa.text("0")
    )
    return column


def _check_sql_args(
    table: object, where: tuple[object, ...], values: object, fence_column: object
) -> tuple[Any, Any]:
    sa = _sqlalchemy()
    if not isinstance(table, sa.Table):
        raise ConfigError(f"table must be a sqlalchemy.Table, not {type(table).__name__}")
    if not isinstance(fence_column, str) or fence_column not in table.c:
        raise ConfigError(f"table {table.name!r} has no fence column {fence_column!r}")
    if not where:
        raise ConfigError("a fenced UPDATE needs a WHERE condition naming the row(s) it guards")
    if not isinstance(values, Mapping) or not values:
        raise ConfigError("values must be a non-empty dict of column -> new value")
    column = table.c[fence_column]
    for name in values:
        key = name if isinstance(name, str) else getattr(name, "key", None)
        if not isinstance(key, str) or key not in table.c:
            raise ConfigError(f"table {table.name!r} has no column {name!r}")
        if key == column.key:
            raise ConfigError(
                f"values must not set the fence column {fence_column!r}: the guard sets it"
            )
    return sa, column


def fenced_update(
    table: Table,
    fence: int,
    *where: ColumnElement[bool],
    values: Mapping[Any, Any],
    fence_column: str = "fence",
) -> Update:
    """``UPDATE table SET <values>, fence = :f WHERE <where> AND (fence IS NULL OR fence <= :f)``
    (not executed). A NULL fence is "no fence yet", lower than every fence.

    ``where`` (at least one condition) names the guarded row(s); ``values`` maps column names or
    columns to new values. Run it and check the row count yourself, or use
    :func:`execute_fenced`. Raises :class:`~fencelock.ConfigError` for a bad fence, a missing
    fence column, no condition, empty ``values`` or ``values`` touching the fence column.
    """
    fence = _check_fence(fence)
    sa, column = _check_sql_args(table, where, values, fence_column)
    new = dict(values)
    new[column.key] = sa.bindparam("fencelock_new_fence", fence, type_=sa.BigInteger())
    limit = sa.bindparam("fencelock_max_fence", fence, type_=sa.BigInteger())
    # NULL <= :f is NULL (not true): without IS NULL a row never fenced could never be written
    unfenced_or_older = sa.or_(column.is_(None), column <= limit)
    update: Update = table.update().where(*where, unfenced_or_older).values(new)
    return update


def _describe_rows(table: Table, where: tuple[ColumnElement[bool], ...]) -> str:
    sa = _sqlalchemy()
    clause = sa.and_(*where)
    try:
        text = str(clause.compile(compile_kwargs={"literal_binds": True}))
    except Exception:  # a type without a literal renderer: show the placeholders instead
        text = str(clause.compile())
    return f"{table.name} WHERE {text}"


# A row can appear between the UPDATE and the check (another transaction inserted it): try again
# a few times, then report it as missing (the row the caller meant was not there at the UPDATE).
_SQL_ATTEMPTS = 3


def execute_fenced(
    conn: Connection | Session,
    table: Table,
    fence: int,
    *where: ColumnElement[bool],
    values: Mapping[Any, Any],
    fence_column: str = "fence",
) -> int:
    """Run :func:`fenced_update` on ``conn``; return how many rows were updated (>= 1).

    Runs inside the caller's transaction and does not commit (use ``engine.begin()``). When no
    row qualified it looks again, in the same transaction, to say why:

    - a row whose fence is NULL counts as not fenced yet: it is updated and gets ``fence``;
    - rows match ``where`` but carry a newer fence: raises :class:`~fencelock.StaleFence` with
      ``resource = "<table> WHERE <condition>"``, ``offered = fence`` and ``current`` = the
      highest fence among those rows;
    - no row matches ``where``: raises :class:`MissingRow` (a ``LookupError``). Insert the row
      first (with ``fence`` 0 or your own fence) if a missing row is normal for you.

    If ``where`` matches several rows, those with a newer fence are left alone and the others
    updated; the return value says how many. Raises :class:`~fencelock.ConfigError` for bad
    input (see :func:`fenced_update`) before anything is sent.
    """
    statement = fenced_update(table, fence, *where, values=values, fence_column=fence_column)
    sa = _sqlalchemy()
    column = table.c[fence_column]
    probe = sa.select(sa.func.count(), sa.func.max(column)).select_from(table).where(*where)
    for _ in range(_SQL_ATTEMPTS):
        result: Any = conn.execute(statement)
        if result.rowcount:
            return int(result.rowcount)
        count, current = conn.execute(probe).one()
        if not count:
            break
        if current is not None and int(current) > fence:
            raise StaleFence(_describe_rows(table, where), fence, int(current))
    raise MissingRow(_describe_rows(table, where))
