"""The testing kit: real Redis/Valkey servers and the faults they meet, for your own test suites.

- :class:`Server`, :class:`ServerGroup` (``server``): real server processes on free loopback ports,
  each in its own temporary directory, with a random password by default (``url`` and
  ``client()`` carry it), stopped by PID (and at exit);
- :class:`ReplicaSet`, :class:`Sentinel` (``replicas``): a primary with replicas, and Sentinels;
- :class:`Cluster`, :class:`ClusterNode` (``cluster``): a real Cluster, with live reshards and
  failovers;
- :class:`Proxy` (``proxy``): a TCP proxy that delays, drops, holds or resets traffic;
  :class:`BlackHole`, :func:`refused_url`, :func:`delayed_proxy` (``faults``): sick addresses;
- the pytest plugin (``pytest_plugin``, entry point ``fencelock``): fixtures ``fencelock_server``,
  ``fencelock_servers(n)``, ``fencelock_session_server``, ``fencelock_replica_sets``.

Nothing here imports a command (:mod:`fencelock.cli` and the tools build on this kit, not the
other way round). ``fencelock.servers`` is the old name of this package, kept for one release.
"""

from __future__ import annotations

from .cluster import SLOTS, Cluster, ClusterNode
from .faults import (
    BLACK_HOLE_FILLERS,
    BlackHole,
    delayed_proxy,
    refused_url,
    refused_urls,
    wait_trusted,
)
from .proxy import Proxy, ProxyError, ProxyStats
from .replicas import (
    SENTINEL_DOWN_AFTER_MS,
    SENTINEL_FAILOVER_TIMEOUT_MS,
    ReplicaSet,
    Sentinel,
)
from .server import (
    ENV_SERVER_BIN,
    RANDOM_PASSWORD,
    EngineInfo,
    Persistence,
    Server,
    ServerError,
    ServerGroup,
    engine_of,
    find_server_binary,
    free_port,
    free_ports,
    new_password,
)

__all__ = [
    "BLACK_HOLE_FILLERS",
    "ENV_SERVER_BIN",
    "RANDOM_PASSWORD",
    "SENTINEL_DOWN_AFTER_MS",
    "SENTINEL_FAILOVER_TIMEOUT_MS",
    "SLOTS",
    "BlackHole",
    "Cluster",
    "ClusterNode",
    "EngineInfo",
    "Persistence",
    "Proxy",
    "ProxyError",
    "ProxyStats",
    "ReplicaSet",
    "Sentinel",
    "Server",
    "ServerError",
    "ServerGroup",
    "delayed_proxy",
    "engine_of",
    "find_server_binary",
    "free_port",
    "free_ports",
    "new_password",
    "refused_url",
    "refused_urls",
    "wait_trusted",
]
