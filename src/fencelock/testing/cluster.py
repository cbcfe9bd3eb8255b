"""A real local Redis/Valkey Cluster for tests and the demo: :class:`Cluster`.

``Cluster(primaries=3, replicas_per_primary=1)`` starts ``primaries * (1 + replicas)``
cluster-enabled :class:`~fencelock.testing.Server` processes on free loopback ports, splits
the 16384 slots evenly over the primaries (``CLUSTER ADDSLOTSRANGE``), joins them
(``CLUSTER MEET``), attaches the replicas (``CLUSTER REPLICATE``) and waits, bounded, until
every node reports ``cluster_state:ok`` and agrees on the slot map. Works with valkey-server
and redis-server (7 or later). Every process is stopped by PID (:meth:`Cluster.stop`).

Helpers for the faults a cluster meets: :meth:`Cluster.move_slot` (a live reshard of one slot,
``MIGRATING``/``IMPORTING`` + ``MIGRATE`` + ``SETSLOT NODE``) and :meth:`Cluster.promote`
(``CLUSTER FAILOVER TAKEOVER`` on a replica, e.g. after its primary was killed).

All durations are in seconds. Failures are :class:`~fencelock.testing.ServerError`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import redis

from ._managed import Managed
from .server import (
    RANDOM_PASSWORD,
    PasswordOption,
    Server,
    ServerError,
    ServerGroup,
    free_port,
    resolve_password,
    url_userinfo,
)

__all__ = ["SLOTS", "Cluster", "ClusterNode"]

#: Slots of a Redis/Valkey Cluster.
SLOTS = 16384


def _untaken_port(host: str, taken: set[int]) -> int:
    """A free port of ``host`` not in ``taken`` (ports chosen but not bound yet), added to it."""
    port = free_port(host)
    for _ in range(100):
        if port not in taken:
            break
        port = free_port(host)
    taken.add(port)
    return port


class ClusterNode(Server):
    """One node of a :class:`Cluster`: a :class:`~fencelock.testing.Server` started with
    ``--cluster-enabled yes`` and its own ``nodes.conf``; ``node_id`` once the cluster formed.
    With ``tls_files`` (certificate, key, CA certificate: paths) it also listens with TLS on
    ``tls_port`` and speaks TLS on the cluster bus and to its primary (the plain port stays,
    for the kit's own administration)."""

    def __init__(
        self,
        binary: str | None = None,
        *,
        node_timeout_ms: int,
        taken: set[int] | None = None,
        tls_files: tuple[str, str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        # the bus port is given explicitly, so the client port may be any (and, left to the
        # Server, is chosen again if it turns out to be in use); ``taken``: ports of the
        # other nodes, which are not bound yet
        host = kwargs.get("host", "127.0.0.1")
        taken = set() if taken is None else taken
        bus = _untaken_port(host, taken)
        self.tls_port: int | None = None
        tls: tuple[str, ...] = ()
        if tls_files is not None:
            cert, key, ca = tls_files
            tls_port = _untaken_port(host, taken)
            self.tls_port = tls_port
            # a TLS client is told the TLS ports (CLUSTER SLOTS, MOVED), a plain one the plain
            tls = (
                "--tls-port", str(tls_port),
                "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca,
                "--tls-auth-clients", "no",
                "--tls-cluster", "yes", "--tls-replication", "yes",
            )  # fmt: skip
        extra = (
            "--cluster-enabled", "yes",
            "--cluster-port", str(bus),
            "--cluster-node-timeout", str(node_timeout_ms),
            "--cluster-config-file", "nodes.conf",  # in the node's own directory
            "--cluster-require-full-coverage", "no",
            "--repl-diskless-sync-delay", "0",  # a new replica syncs at once, not after 5 s
            # a replica with replication offset 0 is left out of CLUSTER SLOTS: the primary's
            # PING every second (default 10 s) moves the offset, so replicas are listed soon
            "--repl-ping-replica-period", "1",
            *tls,
            *kwargs.pop("extra_args", ()),
        )  # fmt: skip
        kwargs.pop("port", None)
        super().__init__(binary, extra_args=extra, **kwargs)
        self.bus_port = bus
        self._taken = taken
        self.node_id = ""

    def _reselect_port(self, log_tail: str) -> bool:
        """The bus port was taken between choosing it and the node's start (by a process of
        another test): choose another one (the log names a bus port's failure "(cluster)")."""
        if "(cluster)" not in log_tail:
            return super()._reselect_port(log_tail)
        bus = free_port(self._host)
        for _ in range(100):
            if bus not in self._taken and bus != self.bus_port:
                break
            bus = free_port(self._host)
        self._taken.add(bus)
        args = list(self._extra_args)
        args[args.index("--cluster-port") + 1] = str(bus)
        self._extra_args = tuple(args)
        self.bus_port = bus
        return True


#: How long (s) :meth:`Cluster.promote` waits for the cluster to agree before it bumps the
#: new primary's epoch again.
PROMOTE_SETTLE_S = 5.0


class Cluster(Managed):
    """``primaries`` primaries with ``replicas_per_primary`` replicas each, on loopback.

    Args:
        primaries: number of primaries (>= 1); slots are split evenly, in order.
        replicas_per_primary: replicas of each primary (>= 0).
        binary: server executable (default :func:`~fencelock.testing.find_server_binary`).
        node_timeout_ms: ``cluster-node-timeout``; short, so that a killed primary is failed
            over automatically within a few seconds.
        tls_files: (certificate, key, CA certificate) paths: every node also listens with TLS
            (see :class:`ClusterNode`; needs a server built with TLS) and :attr:`tls_url`
            names the first node's TLS port.
        password: every node's password (they share one: a replica authenticates to its
            primary with its own, ``masterauth``, and ``MIGRATE`` with it); default a new
            random one for the cluster, ``None`` for none. :attr:`url` and :meth:`client`
            carry it.
        server_kwargs: passed to every node (e.g. ``env``).

    ``nodes`` lists the primaries first, then the replicas (replica ``r`` of primary ``p`` is
    ``nodes[primaries + p * replicas_per_primary + r]``); :meth:`owner` tells which node owns
    a slot now. Use as a context manager or call :meth:`start` / :meth:`stop`.

    Raises:
        ValueError: ``primaries < 1`` or ``replicas_per_primary < 0``.
    """

    def __init__(
        self,
        primaries: int = 3,
        replicas_per_primary: int = 1,
        *,
        binary: str | None = None,
        node_timeout_ms: int = 1000,
        tls_files: tuple[str, str, str] | None = None,
        password: PasswordOption = RANDOM_PASSWORD,
        **server_kwargs: Any,
    ) -> None:
        if primaries < 1:
            raise ValueError("a Cluster needs at least one primary")
        self._password = resolve_password(password)
        if replicas_per_primary < 0:
            raise ValueError("replicas_per_primary must be >= 0")
        self.primaries = primaries
        self.replicas_per_primary = replicas_per_primary
        total = primaries * (1 + replicas_per_primary)
        taken: set[int] = set()
        self.nodes = [
            ClusterNode(
                binary,
                node_timeout_ms=node_timeout_ms,
                taken=taken,
                tls_files=tls_files,
                password=self._password,
                **server_kwargs,
            )
            for _ in range(total)
        ]

    # ---- addresses --------------------------------------------------------------------------

    @property
    def password(self) -> str | None:
        """The nodes' password (``None``: they have none)."""
        return self._password

    @property
    def url(self) -> str:
        """``redis+cluster://:PASSWORD@HOST:PORT`` of the first node (any node would do)."""
        node = self.nodes[0]
        return f"redis+cluster://{url_userinfo(self._password)}{node.host}:{node.port}"

    @property
    def tls_url(self) -> str:
        """``rediss+cluster://:PASSWORD@HOST:TLS_PORT`` of the first node (add the ``ssl_*``
        options).

        Raises:
            ValueError: the cluster was made without ``tls_files``.
        """
        node = self.nodes[0]
        if node.tls_port is None:
            raise ValueError("this Cluster was made without tls_files")
        return f"rediss+cluster://{url_userinfo(self._password)}{node.host}:{node.tls_port}"

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(node.host, node.port) for node in self.nodes]

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """A redis-py ``RedisCluster`` client of this cluster, with its password (the caller
        closes it)."""
        from redis.cluster import ClusterNode as PyNode
        from redis.cluster import RedisCluster

        make: Any = PyNode
        nodes = [make(host, port) for host, port in self.startup_nodes]
        kwargs.setdefault("password", self._password)
        return RedisCluster(startup_nodes=nodes, **kwargs)

    def primary_of(self, replica: ClusterNode) -> ClusterNode:
        index = self.nodes.index(replica)
        if index < self.primaries:
            raise ValueError(f"{replica!r} was started as a primary")
        return self.nodes[(index - self.primaries) // self.replicas_per_primary]

    def replicas_of(self, primary: ClusterNode) -> list[ClusterNode]:
        index = self.nodes.index(primary)
        first = self.primaries + index * self.replicas_per_primary
        return self.nodes[first : first + self.replicas_per_primary]

    def by_id(self, node_id: str) -> ClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(node_id)

    # ---- state ------------------------------------------------------------------------------

    def _slot_owners(self, node: ClusterNode) -> dict[int, str]:
        """First slot of each range -> owner node id, as ``node`` sees it."""
        with contextlib.closing(_client(node)) as client:
            ranges = client.execute_command("CLUSTER", "SLOTS")
        owners: dict[int, str] = {}
        for entry in ranges:
            owners[int(entry[0])] = _text(entry[2][2]) if len(entry[2]) > 2 else ""
        return owners

    def owner(self, slot: int) -> ClusterNode:
        """The primary that serves ``slot``, as the first running node sees it.

        Raises:
            ServerError: no running node knows an owner.
        """
        for node in self.nodes:
            if not node.is_running:
                continue
            with contextlib.closing(_client(node)) as client:
                for entry in client.execute_command("CLUSTER", "SLOTS"):
                    if int(entry[0]) <= slot <= int(entry[1]):
                        return self._node_at(int(entry[2][1]))
        raise ServerError(f"no running node knows the owner of slot {slot}")

    def _node_at(self, port: int) -> ClusterNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise ServerError(f"no node of this cluster on port {port}")

    def wait_ok(
        self, timeout: float = 30.0, *, replicas: int = 0, owner: ClusterNode | None = None
    ) -> None:
        """Wait until every running node says ``cluster_state:ok`` with the same current
        epoch, all of them see the same slot owners and every slot covered, and every
        replica's link to its primary is up (its first sync done: writes from now on reach
        it); with ``replicas``, also that every node lists at least that many replicas of
        each slot range; with ``owner``, also that the nodes name ``owner`` as the owner of
        some slots (a promoted replica: until then they may still agree on its dead primary).

        Raises:
            ServerError: not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                views = []
                seen_by: list[int] = []
                epochs: set[str] = set()
                for node in self.nodes:
                    if not node.is_running:
                        continue
                    with contextlib.closing(_client(node)) as client:
                        info = client.execute_command("CLUSTER", "INFO")
                        text = _text(info)
                        if "cluster_state:ok" not in text:
                            raise ServerError(f"{node.port}: not ok yet")
                        epochs.add(text.split("cluster_current_epoch:")[1].split()[0])
                        ranges = client.execute_command("CLUSTER", "SLOTS")
                        replication = _text(client.execute_command("INFO", "replication"))
                    if "role:slave" in replication and "master_link_status:up" not in replication:
                        raise ServerError(f"{node.port}: the replica is not in sync yet")
                    if any(len(e) - 3 < replicas for e in ranges):
                        raise ServerError(f"{node.port}: does not list every replica yet")
                    covered = sum(int(e[1]) - int(e[0]) + 1 for e in ranges)
                    if covered != SLOTS:
                        raise ServerError(f"{node.port}: {covered} slots covered")
                    views.append(sorted((int(e[0]), int(e[1]), int(e[2][1])) for e in ranges))
                    seen_by.append(node.port)
                if len(epochs) > 1:
                    # a replica promoted now takes its own current epoch + 1: one behind the
                    # others' could tie with its primary's (see _start)
                    raise ServerError(f"the nodes' current epochs differ: {sorted(epochs)}")
                if views and all(view == views[0] for view in views):
                    if owner is None or any(port == owner.port for *_, port in views[0]):
                        return
                    raise ServerError(f"the nodes do not name {owner.port} as an owner yet")
                last = "nodes disagree on the slot map: " + "; ".join(
                    f"{port} sees {view}" for port, view in zip(seen_by, views, strict=True)
                )
            except (ServerError, redis.RedisError, OSError) as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise ServerError(f"the cluster did not settle within {timeout} s: {last}")
            time.sleep(0.05)

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Cluster:
        """Start every node, form the cluster, wait until it is ok; return ``self``.

        Raises:
            ServerError: a node did not start, or the cluster did not form within ``timeout``
                seconds (every node is stopped then).
        """
        try:
            self._start(timeout)
        except BaseException:
            with contextlib.suppress(ServerError):
                self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        errors = ServerGroup._parallel(lambda s: s.start(timeout=timeout), self.nodes)
        if errors:
            raise ServerError(f"{len(errors)} cluster nodes failed to start: {errors}")
        clients = [_client(node) for node in self.nodes]
        try:
            for node, client in zip(self.nodes, clients, strict=True):
                node.node_id = _text(client.execute_command("CLUSTER", "MYID"))
            # distinct config epochs from the start, as ``--cluster create`` gives them: left
            # at 0 the nodes settle their collisions over a few pings, and a replica promoted
            # before that could take the same epoch as its dead primary; nodes that still name
            # the dead one keep it then (a tie is not newer), seen on Redis 7
            for epoch, client in enumerate(clients, start=1):
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
            per = SLOTS // self.primaries
            for index, client in enumerate(clients[: self.primaries]):
                first = index * per
                last = SLOTS - 1 if index == self.primaries - 1 else first + per - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            first_node = self.nodes[0]
            for client in clients[1:]:
                client.execute_command(
                    "CLUSTER", "MEET", first_node.host, first_node.port, first_node.bus_port
                )
            # a replica can only attach once it knows its primary
            for index, node in enumerate(self.nodes[self.primaries :]):
                primary = self.primary_of(node)
                client = clients[self.primaries + index]
                while True:
                    try:
                        client.execute_command("CLUSTER", "REPLICATE", primary.node_id)
                        break
                    except redis.ResponseError as exc:
                        if time.monotonic() >= deadline:
                            raise ServerError(
                                f"{node.port} could not replicate {primary.port}: {exc}"
                            ) from exc
                        time.sleep(0.05)
        finally:
            for client in clients:
                client.close()
        self.wait_ok(max(0.1, deadline - time.monotonic()), replicas=self.replicas_per_primary)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every node (by PID), even if some fail.

        Raises:
            ServerError: listing the nodes that could not be stopped.
        """
        ServerGroup._stop_all(self.nodes, timeout, "cluster nodes failed to stop")

    # ---- faults -----------------------------------------------------------------------------

    def move_slot(self, slot: int, target: ClusterNode, *, keys_per_batch: int = 100) -> None:
        """Move ``slot`` (and its keys) from its owner to the primary ``target``, the way a
        live reshard does: ``SETSLOT IMPORTING`` on the target, ``MIGRATING`` on the source,
        ``MIGRATE`` of every key, then ``SETSLOT NODE`` on both and the other primaries.

        Raises:
            ServerError: ``target`` already owns the slot, or a step failed.
        """
        source = self.owner(slot)
        if source is target:
            raise ServerError(f"{target.port} already owns slot {slot}")
        with (
            contextlib.closing(_client(source)) as src,
            contextlib.closing(_client(target)) as dst,
        ):
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
            self.migrate_keys(slot, source, target, keys_per_batch=keys_per_batch)
            self.finish_move(slot, target)

    def migrate_keys(
        self, slot: int, source: ClusterNode, target: ClusterNode, *, keys_per_batch: int = 100
    ) -> int:
        """``MIGRATE`` every key of ``slot`` from ``source`` to ``target``; returns the count."""
        moved = 0
        with contextlib.closing(_client(source)) as src:
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, keys_per_batch)
                if not keys:
                    return moved
                auth = () if target.password is None else ("AUTH", target.password)
                src.execute_command(
                    "MIGRATE", target.host, target.port, "", 0, 5000, *auth, "KEYS", *keys
                )
                moved += len(keys)

    def finish_move(self, slot: int, target: ClusterNode) -> None:
        """``SETSLOT slot NODE target`` on the target first, then on every other running
        primary, and wait (bounded) until every node agrees."""
        order = [target] + [n for n in self.nodes if n is not target and n.is_running]
        for node in order:
            with contextlib.closing(_client(node)) as client:
                role = _text(client.execute_command("ROLE")[0])
                if role != "master":
                    continue
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        self.wait_ok()

    def promote(self, replica: ClusterNode, timeout: float = 30.0) -> None:
        """``CLUSTER FAILOVER TAKEOVER`` on ``replica`` (its primary may be dead) and wait
        until the cluster is ok with it owning the slots.

        Raises:
            ServerError: the replica did not become a primary within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with contextlib.closing(_client(replica)) as client:
            client.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            while _text(client.execute_command("ROLE")[0]) != "master":
                if time.monotonic() >= deadline:
                    raise ServerError(f"{replica.port} did not become a primary in {timeout} s")
                time.sleep(0.05)
            while True:
                try:
                    left = max(0.1, min(PROMOTE_SETTLE_S, deadline - time.monotonic()))
                    self.wait_ok(left, owner=replica)
                    return
                except ServerError as exc:
                    if time.monotonic() >= deadline:
                        raise ServerError(f"{exc}\n{self._views()}") from exc
                # a node kept the dead primary as the owner (its epoch was not seen as newer,
                # seen once on Redis 7): a fresh epoch for the new owner settles it, and a
                # node that still names another owner is told, as an operator would (seen once
                # on Valkey 8.1: every other node kept the dead primary for 30 s)
                client.execute_command("CLUSTER", "BUMPEPOCH")
                self._tell_owner(replica)

    def _views(self) -> str:
        """Every running node's ``CLUSTER NODES``, for an error message."""
        lines = []
        for node in self.nodes:
            if not node.is_running:
                continue
            try:
                with contextlib.closing(_client(node)) as client:
                    text = _text(client.execute_command("CLUSTER", "NODES"))
            except (redis.RedisError, OSError) as exc:
                text = f"unreachable: {exc}"
            lines.append(f"{node.port} sees:\n{text.strip()}")
        return "\n".join(lines)

    def _tell_owner(self, owner: ClusterNode) -> None:
        """``CLUSTER SETSLOT slot NODE id`` for ``owner``'s slots on every running node that
        names another owner for them; errors are left to the next :meth:`wait_ok` to see."""
        if not owner.node_id:
            return
        with contextlib.closing(_client(owner)) as client:
            mine = [
                (int(e[0]), int(e[1]))
                for e in client.execute_command("CLUSTER", "SLOTS")
                if int(e[2][1]) == owner.port
            ]
        for node in self.nodes:
            if node is owner or not node.is_running:
                continue
            with (
                contextlib.suppress(redis.RedisError, OSError),
                contextlib.closing(_client(node)) as client,
            ):
                owners = {
                    (int(e[0]), int(e[1])): int(e[2][1])
                    for e in client.execute_command("CLUSTER", "SLOTS")
                }
                if all(owners.get(span) == owner.port for span in mine):
                    continue
                pipe = client.pipeline(transaction=False)
                for first, last in mine:
                    for slot in range(first, last + 1):
                        pipe.execute_command("CLUSTER", "SETSLOT", slot, "NODE", owner.node_id)
                pipe.execute(raise_on_error=False)

    def __iter__(self) -> Iterator[ClusterNode]:
        return iter(self.nodes)

    def __repr__(self) -> str:
        ports = ",".join(str(node.port) for node in self.nodes)
        return f"Cluster({self.primaries}x{1 + self.replicas_per_primary}, ports={ports})"


def _client(node: Server) -> Any:
    """A redis-py client of one node, typed loosely (its commands are untyped)."""
    return node.client()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
