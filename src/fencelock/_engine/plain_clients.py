"""Connection settings for plain redis-py clients that fencelock makes itself (the storage
guards and the admin module): short timeouts, no retries, and password-free server names."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import ConfigError
from .address import (
    TLS,
    Address,
    Sentinels,
    cluster_seed_from_url,
    is_cluster_url,
    is_sentinel_url,
    sentinels_from_url,
    url_tls,
)
from .sentinel import find_master

# redis-py >= 8 names the CLIENT SETINFO metadata ``driver_info`` (``lib_name`` is deprecated)
_HAS_DRIVER_INFO = importlib.util.find_spec("redis.driver_info") is not None
# redis-py < 6 counts a cluster client's retries in ``cluster_error_retry_attempts`` (later
# versions deprecate it for the ``retry`` object)
_OLD_CLUSTER_RETRY = int(redis.__version__.split(".", 1)[0]) < 6


def describe(kwargs: Mapping[str, Any]) -> str:
    """A password-free name for a server from redis-py connection kwargs."""
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


_VERIFY_OPTIONS = frozenset({"ssl_cert_reqs", "ssl_check_hostname"})


def verified(url: str) -> tuple[str, dict[str, Any]]:
    """``url`` and the keyword arguments to give redis-py's ``from_url`` with it so that a TLS
    server is authenticated as the Lock does: the host name is checked unless the URL says
    ``ssl_cert_reqs=none`` or ``ssl_check_hostname=false``. redis-py 5 does not check it by
    default, so without this a server whose certificate names another host would get the
    password. (The two options are taken out of the URL: redis-py gives a URL's options
    precedence over keyword arguments, and redis-py 5 reads ``ssl_check_hostname=false`` as
    a true string.)

    Raises:
        ConfigError: ``ssl_check_hostname`` is not a boolean word.
    """
    settings = url_tls(url)
    if settings is None:
        return url, {}
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    kept = [(k, v) for k, v in query if k not in _VERIFY_OPTIONS]
    if len(kept) != len(query):
        url = urlunsplit(parts._replace(query=urlencode(kept)))
    cert_reqs, check_hostname = settings
    return url, {"ssl_cert_reqs": cert_reqs, "ssl_check_hostname": check_hostname}


def _tls_kwargs(tls: TLS | None) -> dict[str, Any]:
    """redis-py's ``ssl*`` keyword arguments for ``tls`` (none without TLS)."""
    if tls is None:
        return {}
    kwargs: dict[str, Any] = {
        "ssl": True,
        "ssl_cert_reqs": tls.cert_reqs,
        "ssl_check_hostname": tls.check_hostname,
    }
    files = {
        "ssl_ca_certs": tls.ca_certs,
        "ssl_ca_path": tls.ca_path,
        "ssl_certfile": tls.certfile,
        "ssl_keyfile": tls.keyfile,
    }
    kwargs.update({name: value for name, value in files.items() if value is not None})
    return kwargs


def _cluster_settings(url: str, timeout: float) -> tuple[Address, dict[str, Any]]:
    """(the seed, the keyword arguments for a cluster client) of a cluster URL (no I/O)."""
    seed = cluster_seed_from_url(url)
    kwargs = client_kwargs({"username": seed.username, "password": seed.password}, timeout)
    kwargs.pop("retry_on_timeout")  # the ``retry`` object given says it
    kwargs.update(_tls_kwargs(seed.tls))
    if _OLD_CLUSTER_RETRY:  # redis-py 5: retries across the cluster are counted apart
        kwargs["cluster_error_retry_attempts"] = 0
    return seed, kwargs


def cluster_client(url: str, timeout: float) -> redis.cluster.RedisCluster:
    """A ``RedisCluster`` of our own for a ``redis+cluster://`` URL (any node as the seed):
    ``timeout`` seconds per call and per connect, no retries (neither per connection nor
    across the cluster: a dead node surfaces as an error; MOVED / ASK redirections are
    followed), TLS verified as the Lock does. Connects to the seed to learn the slots: raises
    ``redis.RedisError`` or ``redis.exceptions.RedisClusterException`` when it cannot.

    Raises:
        ConfigError: not a cluster URL, or malformed.
    """
    seed, kwargs = _cluster_settings(url, timeout)
    # ``retry``: redis-py >= 6 retries a cluster call by it (none here); redis-py 5 gives it to
    # each node's connections (no retries there either)
    return redis.cluster.RedisCluster(
        host=seed.host, port=seed.port, retry=Retry(NoBackoff(), 0), **kwargs
    )


def async_cluster_client(url: str, timeout: float) -> redis.asyncio.cluster.RedisCluster:
    """:func:`cluster_client` for asyncio; it learns the slots on its first call (no I/O
    here).

    Raises:
        ConfigError: not a cluster URL, malformed, or with ``ssl_ca_path`` (which redis-py's
            asyncio cluster client does not take).
    """
    seed, kwargs = _cluster_settings(url, timeout)
    if "ssl_ca_path" in kwargs:
        raise ConfigError(
            "ssl_ca_path: redis-py's asyncio cluster client takes no CA directory "
            "(use ssl_ca_certs)"
        )
    return redis.asyncio.cluster.RedisCluster(
        host=seed.host, port=seed.port, retry=AsyncRetry(NoBackoff(), 0), **kwargs
    )


def _sentinel_settings(
    url: str, timeout: float
) -> tuple[Sentinels, dict[str, Any], dict[str, Any]]:
    """(what the URL names, the sentinels' keyword arguments, the master's) (no I/O)."""
    found = sentinels_from_url(url)
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        **_tls_kwargs(found.tls),
    }
    if found.password is not None:
        sentinel_kwargs["username"] = found.username
        sentinel_kwargs["password"] = found.password
    master = found.master
    kwargs = client_kwargs(
        {"db": master.db, "username": master.username, "password": master.password}, timeout
    )
    return found, sentinel_kwargs, kwargs


class _MasterChecked(redis.Redis):
    """A Sentinel-managed master client that asks the sentinels for the master before every
    command: when they name another one (a failover), the pooled connections to the old
    master are dropped first. Without it a pooled connection keeps writing to the old master
    until the sentinels demote it (about 10 s measured), and those writes are lost."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.connection_pool.get_master_address()  # type: ignore[attr-defined]
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


class _AsyncMasterChecked(redis.asyncio.Redis):
    """:class:`_MasterChecked` for asyncio."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        await self.connection_pool.get_master_address()  # type: ignore[attr-defined]
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def sentinel_client(url: str, timeout: float) -> redis.Redis:
    """A client of the master a ``redis+sentinel://`` URL names: before each command it asks
    the sentinels (with the URL's sentinel credentials and TLS, verified as the Lock does)
    which node is the master, and moves to the new one after a failover; ``timeout`` seconds
    per call and per connect, no retries (no I/O here).

    Raises:
        ConfigError: not a Sentinel URL, or malformed.
    """
    found, sentinel_kwargs, kwargs = _sentinel_settings(url, timeout)
    sentinel_kwargs["retry"] = Retry(NoBackoff(), 0)
    sentinel = redis.sentinel.Sentinel(found.hosts, sentinel_kwargs=sentinel_kwargs)
    client: redis.Redis = sentinel.master_for(
        found.service, redis_class=_MasterChecked, retry=Retry(NoBackoff(), 0), **kwargs
    )
    return client


def async_sentinel_client(url: str, timeout: float) -> redis.asyncio.Redis:
    """:func:`sentinel_client` for asyncio."""
    found, sentinel_kwargs, kwargs = _sentinel_settings(url, timeout)
    sentinel_kwargs["retry"] = AsyncRetry(NoBackoff(), 0)
    sentinel = redis.asyncio.sentinel.Sentinel(found.hosts, sentinel_kwargs=sentinel_kwargs)
    client: redis.asyncio.Redis = sentinel.master_for(
        found.service, redis_class=_AsyncMasterChecked, retry=AsyncRetry(NoBackoff(), 0), **kwargs
    )
    return client


def client_name(client: redis.Redis, url: str) -> str:
    """A password-free name for the server a client of :func:`plain_client` talks to: the
    node's ``host:port/db`` (for a cluster URL, the node that owns the key), the Sentinel
    name for a Sentinel URL."""
    if is_sentinel_url(url):
        return sentinels_from_url(url).name
    return describe(client.connection_pool.connection_kwargs)


def plain_client(url: str, timeout: float, *, key: str | None = None) -> redis.Redis:
    """A redis-py client of our own for ``url``: short timeouts, no retries, no handshake
    extras (see :func:`client_kwargs`), TLS verified as the Lock does
    (:func:`verified`).

    ``url`` may also be a ``redis+cluster://`` URL: the client then talks to the primary that
    owns ``key``'s slot (asked of the cluster now; every fencelock key of one lock shares a
    hash tag, so that node holds them all), or a ``redis+sentinel://`` URL: the client talks
    to the master the sentinels name now (asked as the Lock asks them: :func:`find_master`).

    Raises:
        ConfigError: a cluster URL without ``key``.
        redis.RedisError, RedisClusterException: a cluster URL whose seed cannot tell the
            slot's owner.
        NoMaster: no sentinel named the master (a ``ConnectionError``).
    """
    if is_sentinel_url(url):
        found = sentinels_from_url(url)
        host, port = find_master(found, timeout)
        master = found.at(host, port)
        kwargs = client_kwargs(
            {
                "host": master.host,
                "port": master.port,
                "db": master.db,
                "username": master.username,
                "password": master.password,
            },
            timeout,
        )
        kwargs["retry"] = Retry(NoBackoff(), 0)
        return redis.Redis(connection_pool=redis.ConnectionPool(**kwargs))
    if is_cluster_url(url):
        if key is None:
            raise ConfigError("a cluster URL needs the key to find its node")
        cluster = cluster_client(url, timeout)
        try:
            find: Any = cluster.get_node_from_key  # untyped in redis-py
            node = find(key)
        finally:
            cluster.close()
        if node is None:
            raise redis.exceptions.ClusterError(f"no node owns the slot of {key!r}")
        scheme, _, rest = url.partition("://")
        parts = urlsplit(f"{scheme.lower().removesuffix('+cluster')}://{rest}")
        userinfo = parts.netloc.rpartition("@")[0]
        at = f"{userinfo}@" if userinfo else ""
        host = f"[{node.host}]" if ":" in node.host else node.host
        url = urlunsplit(parts._replace(netloc=f"{at}{host}:{node.port}"))
    clean, tls = verified(url)
    base = redis.ConnectionPool.from_url(clean, **tls)
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
