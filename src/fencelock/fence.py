"""Storage-side fencing guards: storage that refuses a writer whose fence is older than one
it has already accepted.

A lease alone cannot protect an invariant: a holder that pauses (GC, swap, a slow disk) past
its lease wakes up still believing it holds the lock. Each write must carry ``lease.fence`` and
the storage must refuse a fence older than the newest it has accepted. This module ships that
check for the storage people use:

- :class:`RedisFence` / :class:`AsyncRedisFence`: a Redis or Valkey server (any server, not
  necessarily the lock's). Each resource is one hash ``<prefix><resource>`` holding ``value``,
  ``fence`` and ``token``; every check-and-write is a single Lua script, so it is atomic.
- :func:`fence_column`, :func:`fence_token_column`, :func:`fenced_update`,
  :func:`execute_fenced`, :func:`execute_fenced_delete`: SQL on SQLAlchemy Core 2 (the ``sql``
  extra; SQLAlchemy is imported only when these are called).

Rules shared by every guard:

- A fence is accepted when it is **greater** than the newest fence accepted for the resource,
  or **equal** to it and offered by the same lease: the guard stores the lease's ``token``
  beside the fence (pass ``token=lease.token``) and accepts an equal fence only with that same
  token (one holder writing several times under one lease). An older fence raises
  :class:`~fencelock.StaleFence` (with ``offered`` and ``current``), an equal fence of another
  lease :class:`EqualFence` (a ``StaleFence`` with ``offered == current``); either changes
  nothing. Without tokens on both sides an equal fence is accepted, as before tokens existed:
  the guard then relies on fences being unique per grant.
- A fence is a Python ``int`` (not ``bool``) in ``0 .. 2**63 - 1`` (it fits a SQL BIGINT) and
  is compared exactly at every size (the Redis scripts compare decimal strings, never Lua
  numbers); a token is a non-empty ``str`` of at most 255 characters; resources are non-empty
  strings. Bad input raises :class:`~fencelock.ConfigError` before any I/O.
- A resource never written has fence 0 and accepts every fence; in SQL a NULL fence (a column
  added to rows that existed before) also means "no fence yet".
- Deleting forgets nothing: :meth:`RedisFence.delete` and :func:`execute_fenced_delete` leave
  a tombstone that keeps the fence, so a stale holder cannot re-create what a newer one deleted.

Why this module is longer than 600 lines: it holds the three guards (Redis, SQL, and their
async twin) that must apply one rule — refuse an older fence, an equal one from another lease,
and remember deletes — and keeping them side by side is how that rule stays the same in each.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
import redis.asyncio as aredis
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from ._engine.address import check_any_url, is_cluster_url, is_sentinel_url, url_name
from ._engine.plain_clients import (
    async_cluster_client,
    async_sentinel_client,
    client_kwargs,
    cluster_client,
    describe,
    sentinel_client,
    verified,
)
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
    "EqualFence",
    "MissingRow",
    "RedisFence",
    "execute_fenced",
    "execute_fenced_delete",
    "fence_column",
    "fence_token_column",
    "fenced_update",
    "tombstone_column",
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
# The longest token a guard stores (lease tokens are 32 hex digits; a SQL token column is
# VARCHAR(255)).
MAX_TOKEN = 255
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


class EqualFence(StaleFence):
    """A guard refused a fence **equal** to the one it holds, because that fence was accepted
    for another lease (another token, or a token on one side only).

    A :class:`~fencelock.StaleFence` (catch that one for both kinds of refusal) with
    ``offered == current``; nothing was changed. Fences are unique per grant, so an equal fence
    from another lease means two grants shared a fence: the guard cannot tell which holder is
    the newer one and refuses the second.
    """

    def __init__(self, resource: str, offered: int, current: int) -> None:
        super().__init__(resource, offered, current)
        self.args = (
            f"{resource!r}: fence {offered} refused, the same fence was already accepted "
            "for another lease (token)",
        )


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


def _check_token(token: object) -> str | None:
    if token is None:
        return None
    if not isinstance(token, str):
        raise ConfigError(f"token must be a str (lease.token) or None, not {token!r}")
    if not token:
        raise ConfigError("token must not be empty (pass None for no token)")
    if len(token) > MAX_TOKEN:
        raise ConfigError(f"token must be at most {MAX_TOKEN} characters, got {len(token)}")
    return token


def _token_arg(token: object) -> str:
    """The token as a script argument: '' for none."""
    checked = _check_token(token)
    return "" if checked is None else checked


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
        clean, tls = verified(check_url(client_or_url))
        pool = pool_type.from_url(clean, **tls)  # parses only: no I/O
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


class _Flavour(NamedTuple):
    """What :class:`RedisFence` and :class:`AsyncRedisFence` connect with."""

    what: str
    client: Any
    pool: Any
    retry: Any
    cluster: Callable[[str, float], Any]
    sentinel: Callable[[str, float], Any]


_BLOCKING = _Flavour(
    "RedisFence", redis.Redis, redis.ConnectionPool, Retry, cluster_client, sentinel_client
)
_ASYNCIO = _Flavour(
    "AsyncRedisFence",
    aredis.Redis,
    aredis.ConnectionPool,
    AsyncRetry,
    async_cluster_client,
    async_sentinel_client,
)


def _connect(
    client_or_url: object, prefix: object, timeout: object, flavour: _Flavour
) -> tuple[str, float, str, Any]:
    """(prefix, timeout, name, client) of a fence store, arguments checked in this order: a
    Cluster or Sentinel URL gets a client of its kind; a plain URL or a client, a pool of our
    own with the same connection settings (and no client-side retries)."""
    if isinstance(client_or_url, str) and (
        is_cluster_url(client_or_url) or is_sentinel_url(client_or_url)
    ):
        url = check_any_url(client_or_url)
        checked_prefix, timeout_s = _check_prefix(prefix), seconds(timeout, "timeout")
        connect = flavour.cluster if is_cluster_url(url) else flavour.sentinel
        return checked_prefix, timeout_s, str(url_name(url)), connect(url, timeout_s)
    kwargs, connection_class = _pool_source(
        client_or_url, flavour.client, flavour.pool, flavour.what
    )
    checked_prefix, timeout_s = _check_prefix(prefix), seconds(timeout, "timeout")
    pool_kwargs = _storage_kwargs(kwargs, timeout_s)
    pool_kwargs["retry"] = flavour.retry(NoBackoff(), 0)
    pool = flavour.pool(connection_class=connection_class, **pool_kwargs)
    return checked_prefix, timeout_s, describe(kwargs), flavour.client(connection_pool=pool)


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


def _refuse(resource: str, fence: int, code: int, payload: bytes) -> None:
    """Raise the refusal a fence script's reply code says, if it says one."""
    if code == 0:
        raise StaleFence(resource, fence, _decode_int(payload))
    if code == 4:
        raise EqualFence(resource, fence, _decode_int(payload))


def _accepted(resource: str, fence: int, raw: object) -> int:
    """The fence after a write/advance; StaleFence if refused; an error for unknown codes."""
    code, payload = _decode_reply(raw)
    _refuse(resource, fence, code, payload)
    if code == 1:
        return _decode_int(payload)
    raise FencelockError(f"{resource!r}: unknown reply code {code} from a fence script")


def _applied(resource: str, fence: int, delta: int, floor: int | None, raw: object) -> int:
    code, payload = _decode_reply(raw)
    _refuse(resource, fence, code, payload)
    if code == 1:
        return int(payload)
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
    A ``redis+cluster://host:port`` URL (any node) gives a cluster client of our own, each
    resource's hash on the node owning its slot (it connects to the seed here to learn the
    slots: ``redis.RedisError`` or ``RedisClusterException`` when it cannot); a
    ``redis+sentinel://host:port[,host:port]/service`` URL writes to the master the sentinels
    name (asked before every call: a failover is followed at once, never writing on to the
    old master).

    Each resource lives in one hash ``prefix + resource`` with fields ``value``, ``fence`` and
    ``token`` (the token of the lease that set the fence; no TTL). Pass ``token=lease.token``
    to every call: an equal fence is then accepted from that lease only. Raises
    :class:`~fencelock.ConfigError` for a bad argument, before any I/O.

    Usage::

        store = RedisFence("redis://127.0.0.1:6379/0")
        with lock.hold() as lease:
            store.write("orders:42", lease.fence, b"paid", token=lease.token)
            # StaleFence if a newer holder wrote (EqualFence: another lease with this fence)
    """

    def __init__(
        self,
        client_or_url: str | redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.client: redis.Redis | redis.cluster.RedisCluster
        self.prefix, self.timeout, self.name, self.client = _connect(
            client_or_url, prefix, timeout, _BLOCKING
        )

    def key(self, resource: str) -> str:
        """The server key holding ``resource``."""
        return self.prefix + _check_resource(resource)

    def _run(self, script: Script, key: str, *args: bytes | str) -> Any:
        try:
            return self.client.evalsha(script.sha, script.numkeys, key, *args)
        except NoScriptError:
            return self.client.eval(script.source, script.numkeys, key, *args)  # type: ignore[arg-type]

    def write(
        self,
        resource: str,
        fence: int,
        value: bytes | str | int | float,
        *,
        token: str | None = None,
    ) -> None:
        """Store ``value`` for ``resource`` under ``fence``: accepted when ``fence`` is newer
        than the fence held for the resource, or equal to it and offered with the same
        ``token`` (the same lease writing again).

        Pass ``token=lease.token``: it is stored beside the fence, and an equal fence offered
        by another lease (another token, or no token) is refused with :class:`EqualFence`.
        Without a token an equal fence is accepted only while the fence held was also stored
        without one (the guard then trusts fences to be unique per grant, as fencelock's are).

        str is stored as UTF-8, int as decimal, float as ``repr``. Raises
        :class:`~fencelock.StaleFence` (``offered``, ``current``; :class:`EqualFence` for an
        equal fence of another lease) and changes nothing when refused;
        :class:`~fencelock.ConfigError` for bad input (before any I/O); redis errors (e.g.
        ``redis.ConnectionError``, ``redis.TimeoutError``) as they come.
        """
        key, fence, data = self.key(resource), _check_fence(fence), _encode_value(value)
        tok = _token_arg(token)
        _accepted(resource, fence, self._run(WRITE, key, str(fence), data, tok))

    def read(self, resource: str) -> tuple[bytes | None, int]:
        """``(value, fence)`` of ``resource``; ``(None, 0)`` if it was never written, and
        ``(None, fence)`` after :meth:`delete` (a tombstone)."""
        key = self.key(resource)
        return _read_reply(self.client.hmget(key, ["value", "fence"]))

    def advance(self, resource: str, fence: int, *, token: str | None = None) -> int:
        """Record ``fence`` for ``resource`` without writing a value; returns the fence now held.

        Use it to claim a resource for this lease before a side effect elsewhere: once advanced,
        every older holder's write is refused (and, with ``token``, every other lease's equal
        fence). The rule for equal fences and ``token`` is :meth:`write`'s. Raises
        :class:`~fencelock.StaleFence` (nothing changed) when refused.
        """
        key, fence = self.key(resource), _check_fence(fence)
        tok = _token_arg(token)
        return _accepted(resource, fence, self._run(ADVANCE, key, str(fence), tok, ""))

    def delete(self, resource: str, fence: int, *, token: str | None = None) -> None:
        """Delete the value of ``resource`` under ``fence`` and leave a tombstone: the hash keeps
        the fence (and token), so an older holder can neither write nor re-create the value.

        Accepted like :meth:`write`; afterwards :meth:`read` gives ``(None, fence)``. Deleting
        the hash itself (``DEL``) would forget the fence: do not. A tombstone has no TTL: it
        costs the hash's memory until the resource is written again or removed by hand once no
        holder of an older fence can still be running. Raises as :meth:`write`.
        """
        key, fence = self.key(resource), _check_fence(fence)
        tok = _token_arg(token)
        _accepted(resource, fence, self._run(ADVANCE, key, str(fence), tok, "1"))

    def apply(
        self,
        resource: str,
        fence: int,
        op: str,
        amount: int,
        *,
        min_value: int | None = None,
        token: str | None = None,
    ) -> int:
        """Atomically add to the integer value of ``resource`` under the fence; return the result.

        ``op`` is ``"incrby"`` (add ``amount``) or ``"decrby"`` (subtract it); a value never
        written counts as 0. With ``min_value`` the update is refused if the result would be
        below it (``apply(r, f, "decrby", 1, min_value=0)`` sells the last item only once).
        Values, ``amount`` and ``min_value`` must be within ±(2**53 - 1) (fences are exact at
        any size). On success the fence (and ``token``) is recorded like :meth:`write`, whose
        rule for equal fences applies.

        Raises (each one changing nothing): :class:`~fencelock.StaleFence` for an older fence
        (:class:`EqualFence` for an equal fence of another lease); :class:`BelowFloor` when the
        floor would be crossed; :class:`ApplyRefused` when the stored value is not such an
        integer; :class:`~fencelock.ConfigError` for bad input, before any I/O.
        """
        key, fence = self.key(resource), _check_fence(fence)
        delta, floor = _apply_args(op, amount, min_value)
        tok = _token_arg(token)
        floor_arg = "" if floor is None else str(floor)
        raw = self._run(APPLY, key, str(fence), str(delta), floor_arg, tok)
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
    coroutines and ``client_or_url`` is a URL (``redis+cluster://`` and ``redis+sentinel://``
    included; a cluster's slots are learnt on the first call) or a ``redis.asyncio.Redis``
    client. Close it with ``await fence.aclose()`` or ``async with``."""

    def __init__(
        self,
        client_or_url: str | aredis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.client: aredis.Redis | aredis.RedisCluster
        self.prefix, self.timeout, self.name, self.client = _connect(
            client_or_url, prefix, timeout, _ASYNCIO
        )

    def key(self, resource: str) -> str:
        """The server key holding ``resource``."""
        return self.prefix + _check_resource(resource)

    async def _run(self, script: Script, key: str, *args: bytes | str) -> Any:
        try:
            return await self.client.evalsha(script.sha, script.numkeys, key, *args)
        except NoScriptError:
            return await self.client.eval(script.source, script.numkeys, key, *args)  # type: ignore[arg-type]

    async def write(
        self,
        resource: str,
        fence: int,
        value: bytes | str | int | float,
        *,
        token: str | None = None,
    ) -> None:
        """See :meth:`RedisFence.write`."""
        key, fence, data = self.key(resource), _check_fence(fence), _encode_value(value)
        tok = _token_arg(token)
        _accepted(resource, fence, await self._run(WRITE, key, str(fence), data, tok))

    async def read(self, resource: str) -> tuple[bytes | None, int]:
        """See :meth:`RedisFence.read`."""
        key = self.key(resource)
        return _read_reply(await self.client.hmget(key, ["value", "fence"]))

    async def advance(self, resource: str, fence: int, *, token: str | None = None) -> int:
        """See :meth:`RedisFence.advance`."""
        key, fence = self.key(resource), _check_fence(fence)
        tok = _token_arg(token)
        return _accepted(resource, fence, await self._run(ADVANCE, key, str(fence), tok, ""))

    async def delete(self, resource: str, fence: int, *, token: str | None = None) -> None:
        """See :meth:`RedisFence.delete`."""
        key, fence = self.key(resource), _check_fence(fence)
        tok = _token_arg(token)
        _accepted(resource, fence, await self._run(ADVANCE, key, str(fence), tok, "1"))

    async def apply(
        self,
        resource: str,
        fence: int,
        op: str,
        amount: int,
        *,
        min_value: int | None = None,
        token: str | None = None,
    ) -> int:
        """See :meth:`RedisFence.apply`."""
        key, fence = self.key(resource), _check_fence(fence)
        delta, floor = _apply_args(op, amount, min_value)
        tok = _token_arg(token)
        floor_arg = "" if floor is None else str(floor)
        raw = await self._run(APPLY, key, str(fence), str(delta), floor_arg, tok)
        return _applied(resource, fence, delta, floor, raw)

    async def aclose(self) -> None:
        """Close the connection pool."""
        # redis-py 5.0.0 (our floor) has only close(); aclose() came in 5.0.1
        close = getattr(self.client, "aclose", None) or self.client.close
        await close()

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
    _check_column_name(name, "fence")
    sa = _sqlalchemy()
    column: Column[int] = sa.Column(
        name, sa.BigInteger(), nullable=False, default=0, server_default=sa.text("0")
    )
    return column


def fence_token_column(name: str = "fence_token") -> Column[str]:
    """A ``VARCHAR(255) NULL`` column for the token of the lease that set the row's fence.

    With it in the table, the guard accepts an equal fence only from that lease (pass
    ``token=lease.token``); without it, an equal fence is accepted from anyone. NULL means
    "set without a token". Raises :class:`~fencelock.ConfigError` for an empty or non-str name.
    """
    _check_column_name(name, "token")
    sa = _sqlalchemy()
    column: Column[str] = sa.Column(name, sa.String(MAX_TOKEN), nullable=True, default=None)
    return column


def tombstone_column(name: str = "deleted") -> Column[bool]:
    """A ``BOOLEAN NOT NULL DEFAULT false`` column marking a row deleted by
    :func:`execute_fenced_delete` (a tombstone: the row and its fence stay).

    Raises :class:`~fencelock.ConfigError` for an empty or non-str name.
    """
    _check_column_name(name, "tombstone")
    sa = _sqlalchemy()
    column: Column[bool] = sa.Column(
        name, sa.Boolean(), nullable=False, default=False, server_default=sa.false()
    )
    return column


def _check_column_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} column name must be a non-empty str, got {name!r}")


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


def _token_column(
    table: Table, values: Mapping[Any, Any], token_column: object, token: object
) -> Any:
    """The table's token column (None if it has none), checking the token arguments."""
    if not isinstance(token_column, str) or not token_column:
        raise ConfigError(f"token_column must be a non-empty str, got {token_column!r}")
    if token_column not in table.c:
        if token is not None:
            raise ConfigError(
                f"table {table.name!r} has no token column {token_column!r} to keep the token "
                "in (add fence_token_column())"
            )
        return None
    column = table.c[token_column]
    for name in values:
        key = name if isinstance(name, str) else getattr(name, "key", None)
        if key == column.key:
            raise ConfigError(
                f"values must not set the token column {token_column!r}: the guard sets it"
            )
    return column


def _refused_clause(sa: Any, fence_col: Any, token_col: Any, fence: int, token: str | None) -> Any:
    """Rows whose fence refuses ``(fence, token)``: newer, or equal and set by another lease.
    NULL fences refuse nothing; without a token column an equal fence is accepted."""
    limit = sa.bindparam("fencelock_refused_fence", fence, type_=sa.BigInteger())
    if token_col is None:
        return fence_col > limit
    if token is None:
        other_lease = token_col.is_not(None)
    else:
        mine = sa.bindparam("fencelock_refused_token", token, type_=token_col.type)
        other_lease = sa.or_(token_col.is_(None), token_col != mine)
    return sa.or_(fence_col > limit, sa.and_(fence_col == limit, other_lease))


def fenced_update(
    table: Table,
    fence: int,
    *where: ColumnElement[bool],
    values: Mapping[Any, Any],
    fence_column: str = "fence",
    token: str | None = None,
    token_column: str = "fence_token",
) -> Update:
    """A fenced ``UPDATE`` of the rows ``where`` names, all or none (not executed).

    ``UPDATE table SET <values>, fence = :f[, fence_token = :t] WHERE <where> AND <accepted>
    AND NOT EXISTS (a row of <where> that refuses :f)``, where a row accepts ``fence`` when its
    fence is NULL ("no fence yet"), older, or equal and set by the same lease: with a token
    column (:func:`fence_token_column`) in the table, an equal fence is accepted only with the
    token stored there (``token=lease.token``; NULL and no token count as the same "no
    token"); without one, an equal fence is accepted. If any row of ``where`` refuses the
    fence, no row is updated.

    ``where`` (at least one condition) names the guarded row(s); ``values`` maps column names or
    columns to new values. Run it and check the row count yourself (0: refused or no row), or
    use :func:`execute_fenced`. Raises :class:`~fencelock.ConfigError` for a bad fence or
    token, a missing fence column, a token without a token column, no condition, empty
    ``values`` or ``values`` touching the fence or token column.
    """
    fence, token = _check_fence(fence), _check_token(token)
    sa, column = _check_sql_args(table, where, values, fence_column)
    token_col = _token_column(table, values, token_column, token)
    new = dict(values)
    new[column.key] = sa.bindparam("fencelock_new_fence", fence, type_=sa.BigInteger())
    if token_col is not None:
        new[token_col.key] = sa.bindparam("fencelock_new_token", token, type_=token_col.type)
    # the rows of <where> again, in a subquery of its own (the inner FROM shadows the outer
    # table, so <where> means the same there, text clauses included): one refusing row
    # refuses them all
    refusing = (
        sa.select(sa.literal(1))
        .select_from(table)
        .where(*where, _refused_clause(sa, column, token_col, fence, token))
        .correlate_except(table)
    )
    accepted = sa.or_(
        column.is_(None), sa.not_(_refused_clause(sa, column, token_col, fence, token))
    )
    update: Update = table.update().where(*where, accepted, ~sa.exists(refusing)).values(new)
    return update


def _describe_rows(table: Table, where: tuple[ColumnElement[bool], ...]) -> str:
    sa = _sqlalchemy()
    clause = sa.and_(*where)
    try:
        text = str(clause.compile(compile_kwargs={"literal_binds": True}))
    except Exception:  # a type without a literal renderer: show the placeholders instead
        text = str(clause.compile())
    return f"{table.name} WHERE {text}"


def _savepoint(conn: Any) -> Any:
    """A savepoint around the write (rolled back when the block raises), or none on SQLite:
    pysqlite's SAVEPOINT before its own BEGIN commits the caller's work at RELEASE, and SQLite
    needs none (one writer at a time: the statement's NOT EXISTS sees every row)."""
    dialect = getattr(conn, "dialect", None)
    if dialect is None:  # a Session
        dialect = conn.get_bind().dialect
    if dialect.name == "sqlite":
        return contextlib.nullcontext()
    return conn.begin_nested()


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
    token: str | None = None,
    token_column: str = "fence_token",
) -> int:
    """Run :func:`fenced_update` on ``conn``: write every row ``where`` names, or none; return
    how many rows were updated (>= 1).

    Runs inside the caller's transaction and does not commit (use ``engine.begin()``). Pass
    ``token=lease.token`` when the table has a :func:`fence_token_column`: an equal fence is
    then accepted only from the lease that set it. After the UPDATE it checks, in the same
    transaction, that no row of ``where`` refused the fence, and raises (nothing of this write
    stays: on SQLite the statement itself is all-or-none, elsewhere a savepoint around it is
    rolled back):

    - :class:`~fencelock.StaleFence` when a row of ``where`` carries a newer fence
      (``resource = "<table> WHERE <condition>"``, ``offered = fence``, ``current`` = the
      highest fence among the refusing rows); :class:`EqualFence` when the refusing rows carry
      ``fence`` itself, set by another lease;
    - :class:`MissingRow` (a ``LookupError``) when no row matches ``where``. Do not DELETE
      guarded rows: a deleted row forgets its fence. Delete with
      :func:`execute_fenced_delete` (a tombstone), and create rows only with fence 0 (the
      default), never with your own fence (a stale holder would re-create what a newer
      holder deleted; a tombstone makes that INSERT fail on the primary key instead).

    A row whose fence is NULL counts as not fenced yet: it is updated and gets ``fence``.
    Under REPEATABLE READ or SERIALIZABLE, PostgreSQL refuses the later of two concurrent
    writers of a row itself, with a serialization failure (SQLSTATE 40001, raised by the
    driver, e.g. ``sqlalchemy.exc.OperationalError``): roll back and run the transaction
    again; the retry reads the newer fence and raises ``StaleFence`` (or succeeds, when the
    other writer's fence was older). Raises :class:`~fencelock.ConfigError` for bad input
    (see :func:`fenced_update`) before anything is sent.
    """
    statement = fenced_update(
        table,
        fence,
        *where,
        values=values,
        fence_column=fence_column,
        token=token,
        token_column=token_column,
    )
    sa = _sqlalchemy()
    column = table.c[fence_column]
    token_col = table.c.get(token_column, None)
    refusing = (
        sa.select(sa.func.count(), sa.func.max(column))
        .select_from(table)
        .where(*where, _refused_clause(sa, column, token_col, fence, token))
    )
    matching = sa.select(sa.func.count()).select_from(table).where(*where)
    for _ in range(_SQL_ATTEMPTS):
        with _savepoint(conn):
            result: Any = conn.execute(statement)
            updated = int(result.rowcount)
            count, current = conn.execute(refusing).one()
            if count:  # raising inside the block rolls the savepoint back
                refusal = EqualFence if int(current) == fence else StaleFence
                raise refusal(_describe_rows(table, where), fence, int(current))
        if updated:
            return updated
        if not conn.execute(matching).scalar():
            break
    raise MissingRow(_describe_rows(table, where))


def execute_fenced_delete(
    conn: Connection | Session,
    table: Table,
    fence: int,
    *where: ColumnElement[bool],
    deleted_column: str = "deleted",
    fence_column: str = "fence",
    token: str | None = None,
    token_column: str = "fence_token",
) -> int:
    """Delete the rows ``where`` names under ``fence`` by leaving tombstones: each row stays,
    with ``deleted_column`` set true and its fence (and token) set, so an older holder can
    neither update it nor INSERT it again (the row still holds the primary key).

    Exactly :func:`execute_fenced` with ``values={deleted_column: True}``: all or none, same
    errors; returns how many rows were marked. Read and count rows ``WHERE NOT deleted``; to
    bring a row back, a newer holder updates it with ``values={"deleted": False, ...}``. Add
    the column with :func:`tombstone_column`. Raises :class:`~fencelock.ConfigError` when the
    table has no ``deleted_column`` (before anything is sent).
    """
    if not isinstance(table, _sqlalchemy().Table):
        raise ConfigError(f"table must be a sqlalchemy.Table, not {type(table).__name__}")
    if not isinstance(deleted_column, str) or deleted_column not in table.c:
        raise ConfigError(
            f"table {table.name!r} has no tombstone column {deleted_column!r} "
            "(add tombstone_column())"
        )
    return execute_fenced(
        conn,
        table,
        fence,
        *where,
        values={deleted_column: True},
        fence_column=fence_column,
        token=token,
        token_column=token_column,
    )
