"""Normalising the ``servers`` argument (pure; no I/O)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigError
from .options import check_url, redact_url

# redis-py >= 8 names the CLIENT SETINFO metadata ``driver_info`` (``lib_name`` is deprecated)
_HAS_DRIVER_INFO = importlib.util.find_spec("redis.driver_info") is not None


def split_servers(servers: object, client_types: tuple[type, ...]) -> list[Any]:
    """One server spec (URL or client) or a sequence of them -> a non-empty list of specs.

    Raises :class:`ConfigError` for an empty list, a wrong type, a malformed URL, or the same
    URL given twice (the same server under two names is caught later, by ``run_id``).
    """
    items: list[object]
    if isinstance(servers, (str, *client_types)):
        items = [servers]
    elif isinstance(servers, Sequence):
        items = list(servers)
    else:
        raise ConfigError(
            "servers must be a URL, a redis client, or a sequence of them, "
            f"not {type(servers).__name__}"
        )
    if not items:
        raise ConfigError("at least one server is needed")
    specs: list[Any] = []
    seen: set[str] = set()
    for item in items:
        if isinstance(item, str):
            url = check_url(item)
            if url in seen:
                raise ConfigError(f"server {redact_url(item)!r} is listed twice")
            seen.add(url)
            specs.append(url)
        elif isinstance(item, client_types):
            if any(item is other for other in specs):
                raise ConfigError("the same client object is listed twice")
            specs.append(item)
        else:
            raise ConfigError(
                f"each server must be a URL or a redis client, not {type(item).__name__}"
            )
    return specs


def describe(kwargs: Mapping[str, Any]) -> str:
    """A password-free name for a server from redis-py connection kwargs."""
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


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
