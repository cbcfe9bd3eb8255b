"""Connection settings for plain redis-py clients that fencelock makes itself (the storage
guards and the admin module): short timeouts, no retries, and password-free server names."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# redis-py >= 8 names the CLIENT SETINFO metadata ``driver_info`` (``lib_name`` is deprecated)
_HAS_DRIVER_INFO = importlib.util.find_spec("redis.driver_info") is not None


def describe(kwargs: Mapping[str, Any]) -> str:
    """A password-free name for a server from redis-py connection kwargs."""
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def plain_client(url: str, timeout: float) -> redis.Redis:
    """A redis-py client of our own for ``url``: short timeouts, no retries, no handshake
    extras (see :func:`client_kwargs`)."""
    base = redis.ConnectionPool.from_url(url)
    kwargs = client_kwargs(base.connection_kwargs, timeout)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    pool = redis.ConnectionPool(connection_class=base.connection_class, **kwargs)
    base.disconnect()
    return redis.Redis(connection_pool=pool)


def client_kwargs(base: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Connection kwargs for lock traffic: short timeouts, no client-side retries.

    A timed-out SET NX may still have been applied, and a retried one blows the validity
    budget (FAULTS.md F16), so lock calls never retry inside the client.
    """
    kwargs = dict(base)
    kwargs["socket_timeout"] = timeout
    kwargs["socket_connect_timeout"] = timeout
    kwargs["retry_on_timeout"] = False
    kwargs.pop("retry_on_error", None)
    kwargs["health_check_interval"] = 0
    # no CLIENT SETINFO on connect: a new connection to a paused server must not block
    if _HAS_DRIVER_INFO:
        kwargs["driver_info"] = None
        kwargs.pop("lib_name", None)
        kwargs.pop("lib_version", None)
    else:
        kwargs["lib_name"] = None
        kwargs["lib_version"] = None
    return kwargs
