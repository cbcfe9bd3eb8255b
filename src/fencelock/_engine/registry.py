"""The process-wide registry: one :class:`Server` per address, whatever names it.

A URL, a redis-py client or a valkey-py client for the same address (host, port, db, user,
password, TLS) is the same Server, so Locks built per key share everything. Servers live as
long as the process (their number is the number of distinct addresses used); after a fork the
child drops every inherited connection without touching the parent's sockets.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..errors import ConfigError
from ..options import check_url, redact_url
from .address import (
    Address,
    Sentinels,
    cluster_seed_from_client,
    cluster_seed_from_url,
    from_client,
    from_url,
    is_client,
    is_cluster_client,
    is_cluster_url,
    is_sentinel_url,
    sentinel_pool,
    sentinels_from_client,
    sentinels_from_url,
)
from .cluster import ClusterServer
from .server import Server

_servers: dict[Address, Server] = {}
_clusters: dict[Address, ClusterServer] = {}  # by seed node: a cluster is one server
_by_url: dict[str, Server] = {}
_by_sentinels: dict[Sentinels, Server] = {}
_by_client: weakref.WeakKeyDictionary[Any, Server] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
K = TypeVar("K")
V = TypeVar("V")
_fork_hooks: list[Callable[[], None]] = []


def _shared(table: dict[K, V], key: K, make: Callable[[], V]) -> V:
    """The one value of ``key`` in ``table``, made on first use (under the registry's lock)."""
    with _lock:
        value = table.get(key)
        if value is None:
            value = table[key] = make()
        return value


def server_for_address(address: Address) -> Server:
    return _shared(_servers, address, lambda: Server(address))


def server_for_sentinels(sentinels: Sentinels) -> Server:
    """The one Server of a Sentinel-managed master (one vote, whichever node leads)."""
    return _shared(_by_sentinels, sentinels, lambda: Server(sentinels.master, sentinels))


def _sentinel_server_for(spec: object) -> Server | None:
    """The Server of a Sentinel URL or ``Sentinel.master_for`` client; None for others."""
    if is_sentinel_url(spec):
        assert isinstance(spec, str)
        return server_for_sentinels(sentinels_from_url(spec))
    if not isinstance(spec, str) and sentinel_pool(spec) is not None:
        return server_for_sentinels(sentinels_from_client(spec))
    return None


def cluster_for_seed(seed: Address) -> ClusterServer:
    return _shared(_clusters, seed, lambda: ClusterServer(seed))


def _is_spec(item: object) -> bool:
    return is_client(item) or is_cluster_client(item)


def _server_for(spec: object) -> Server:
    sentinel_server = _sentinel_server_for(spec)
    if sentinel_server is not None:
        if isinstance(spec, str):
            _by_url[spec] = sentinel_server
        return sentinel_server
    if isinstance(spec, str):
        server = _by_url.get(spec)
        if server is None:
            if is_cluster_url(spec):
                server = cluster_for_seed(cluster_seed_from_url(spec))
            else:
                server = server_for_address(from_url(spec))
            _by_url[spec] = server
        return server
    try:
        server = _by_client.get(spec)
    except TypeError:  # not weak-referenceable: not a client we know
        server = None
    if server is None:
        if is_cluster_client(spec):
            server = cluster_for_seed(cluster_seed_from_client(spec))
        else:
            server = server_for_address(from_client(spec))
        with contextlib.suppress(TypeError):
            _by_client[spec] = server
    return server


def resolve(servers: object) -> tuple[Server, ...]:
    """One server spec (URL or client) or a sequence of them -> their Servers, in order.
    A cluster (``redis+cluster://`` URL or a cluster client) is one Server.

    Raises :class:`ConfigError` for an empty list, a wrong type, a malformed URL, or the same
    address given twice (the same server under two names is caught by ``run_id`` later).
    """
    if isinstance(servers, str):  # the common case, resolved before: one look-up
        known = _by_url.get(servers)
        if known is not None:
            return (known,)
    items: Sequence[object]
    if isinstance(servers, str) or _is_spec(servers):
        items = (servers,)
    elif isinstance(servers, Sequence):
        items = servers
    else:
        raise ConfigError(
            "servers must be a URL, a redis client, or a sequence of them, "
            f"not {type(servers).__name__}"
        )
    if not items:
        raise ConfigError("at least one server is needed")
    result: list[Server] = []
    for item in items:
        if isinstance(item, str):
            if item not in _by_url and not is_sentinel_url(item) and not is_cluster_url(item):
                check_url(item)
        elif not _is_spec(item):
            raise ConfigError(
                f"each server must be a URL or a redis client, not {type(item).__name__}"
            )
        server = _server_for(item)
        if server in result:
            shown = redact_url(item) if isinstance(item, str) else server.name
            raise ConfigError(f"server {shown!r} is listed twice")
        result.append(server)
    return tuple(result)


def server_started(host: str, port: int, *, new_server: bool = False) -> None:
    """A server process was (re)started at ``host:port`` (``fencelock.testing`` says so): what
    the engine knew of that address (suspect, cached scripts) was about another process; the
    next handshake reports the new identity. ``new_server``: not a restart of the same server
    but another one on a reused port, so the old identity is forgotten as well (it would make
    a replica look like the master that used the port before). Idle connections are found
    stale on use."""
    loopback = host in _LOOPBACK
    known = [*_servers.items(), *((s.last_address, s) for s in list(_by_sentinels.values()))]
    for address, server in known:
        if address.port != port or address.path is not None:
            continue
        if address.host == host or (loopback and address.host in _LOOPBACK):
            server.answered()
            server.recheck = True
            server.loaded.clear()
            if new_server:
                server.identity = None


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def _every_server() -> list[Server]:
    """Every Server of the registry, a cluster's nodes included (a snapshot)."""
    with _lock:
        found: list[Server] = [*_servers.values(), *_by_sentinels.values()]
        for cluster in list(_clusters.values()):
            found.append(cluster)
            found.extend(list(cluster.nodes.values()))
    return found


def sweep_idle() -> int:
    """Close the idle blocking connections whose server closed them (a server stopped for
    good, restarted, or that dropped idle clients): otherwise they are found stale only when
    their address is used again, and a process that used many servers once (a test session)
    kept one descriptor per connection. A connection in use is never touched: each idle one is
    taken out of its server's list first (a caller may take it meanwhile: then it is skipped)
    and put back if it is still good. Returns the number closed."""
    closed = 0
    for server in _every_server():
        for conn in list(server.idle):
            try:
                server.idle.remove(conn)
            except ValueError:  # taken by a caller meanwhile
                continue
            if conn.stale():  # closes it
                closed += 1
            else:
                server.idle.append(conn)
    return closed


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook`` in a forked child, after the registry dropped inherited connections."""
    _fork_hooks.append(hook)


class PerProcess(Generic[V]):
    """The one ``make()`` of this process, made on first call (by one thread only) and made
    anew after a fork (the threads it started did not survive it)."""

    def __init__(self, make: Callable[[], V]) -> None:
        self._make = make
        self._value: V | None = None
        self._lock = threading.Lock()
        on_fork(self._forget)

    def __call__(self) -> V:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._make()
                value = self._value
        return value

    def _forget(self) -> None:
        self._value = None  # a new one is made on first use
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for server in [*_servers.values(), *_by_sentinels.values(), *_clusters.values()]:
        for conn in server.forget_connections():
            with contextlib.suppress(Exception):
                conn.close()  # closes our fd only: the parent's socket stays open
    for hook in _fork_hooks:
        hook()


os.register_at_fork(after_in_child=_after_fork_in_child)
