"""Replicated topologies: a primary with replicas (:class:`ReplicaSet`) and the Sentinels
that watch it (:class:`Sentinel`), as real local processes.

All durations are in seconds. Failures are :class:`~fencelock.testing.ServerError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from ._managed import Managed
from .server import (
    _DATA_NAME,
    _LOG_NAME,
    RANDOM_PASSWORD,
    PasswordOption,
    Server,
    ServerError,
    ServerGroup,
    _write_private,
    resolve_password,
    url_userinfo,
)

__all__ = ["SENTINEL_DOWN_AFTER_MS", "SENTINEL_FAILOVER_TIMEOUT_MS", "ReplicaSet", "Sentinel"]

# --------------------------------------------------------------------------------------------
# replicated topologies: a primary with replicas, and Sentinels watching it
# --------------------------------------------------------------------------------------------

#: How long a sentinel waits (ms) before it calls a silent primary down, in the topologies here:
#: short, so that a test's failover takes a second or two, but not so short that a loaded
#: machine's scheduling makes the sentinels fail a healthy primary over.
SENTINEL_DOWN_AFTER_MS = 1000
#: A sentinel's failover timeout (ms) in the topologies here.
SENTINEL_FAILOVER_TIMEOUT_MS = 2000
_SENTINEL_CONF = "sentinel.conf"


def _info(server: Server, section: str) -> dict[str, Any]:
    conn = server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return dict(conn.info(section))
    finally:
        conn.close()


def _wait_for(what: str, check: Callable[[], bool], deadline: float) -> None:
    """Poll ``check`` (errors count as "not yet") until true; ServerError at ``deadline``."""
    last: BaseException | None = None
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            cause = f" (last error: {last})" if last is not None else ""
            raise ServerError(f"{what} not seen before the deadline{cause}")
        time.sleep(0.02)


class Sentinel(Server):
    """A ``--sentinel`` process monitoring ``service`` at ``primary_host:primary_port``.

    Its config file (``sentinel monitor``, ``down-after-milliseconds``, ``failover-timeout``,
    ``parallel-syncs 1``) is written in its temp directory at the first start; the sentinel
    rewrites it as it learns the topology. Both valkey-server and redis-server 7 have the mode.

    Args:
        primary_host / primary_port: the primary to monitor.
        service: the name clients ask for (``SENTINEL get-master-addr-by-name``).
        quorum: sentinels that must agree the primary is down before a failover.
        down_after_ms / failover_timeout_ms: the sentinel's timers (ms).
        primary_password: the monitored nodes' password (``sentinel auth-pass``; ``None``:
            they have none).
        password: the sentinel's own password; default ``None``, unlike a :class:`Server`: a
            sentinel holds no keys and binds to loopback only, and a client asks it with
            ``?sentinel_password=`` (a password given here is also the ``sentinel-pass`` it
            uses with the other sentinels, so give them all the same one).
        server_kwargs: as for :class:`Server` (``persistence`` is ignored).
    """

    def __init__(
        self,
        primary_host: str,
        primary_port: int,
        *,
        service: str = "fencelock",
        quorum: int = 1,
        down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
        failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS,
        primary_password: str | None = None,
        password: PasswordOption = None,
        **server_kwargs: Any,
    ) -> None:
        super().__init__(password=password, **server_kwargs)
        self.service = service
        self._monitor = (
            f"sentinel monitor {service} {primary_host} {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        primary_password = resolve_password(primary_password)
        if primary_password is not None:
            self._monitor += f'sentinel auth-pass {service} "{primary_password}"\n'
        if self._password is not None:
            self._monitor += (
                f'requirepass "{self._password}"\nsentinel sentinel-pass "{self._password}"\n'
            )

    def _args(self) -> list[str]:
        assert self._tmpdir is not None
        conf = self._tmpdir / _SENTINEL_CONF
        if not conf.exists():
            _write_private(conf, self._monitor)
        return [
            self._binary,
            str(conf),
            "--sentinel",
            "--port", str(self.port),
            "--bind", self._host,
            "--dir", str(self._tmpdir / _DATA_NAME),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self._tmpdir / _LOG_NAME),
            *self._extra_args,
        ]  # fmt: skip

    def primary_address(self) -> tuple[str, int] | None:
        """What this sentinel names as the primary now (None: it does not know the service)."""
        conn = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            reply = _sentinel_command(conn, "get-master-addr-by-name", self.service)
        finally:
            conn.close()
        if not reply:
            return None
        host, port = reply
        return _text(host), int(port)

    def master_state(self) -> dict[str, str]:
        """``SENTINEL master <service>``: this sentinel's view of the primary (field names
        as the sentinel gives them: ``flags``, ``num-slaves``, ``num-other-sentinels``...)."""
        conn = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            state = _sentinel_command(conn, "master", self.service)
        finally:
            conn.close()
        pairs = (
            state.items()
            if isinstance(state, dict)  # RESP3 map, else name, value, name, value...
            else zip(state[::2], state[1::2], strict=False)
        )
        return {_text(k): _text(v) for k, v in pairs}

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<Sentinel {self._host}:{self._port} {self.service} {state}>"


def _sentinel_command(conn: redis.Redis, *args: str) -> Any:
    execute: Callable[..., Any] = conn.execute_command  # untyped in redis-py
    return execute("SENTINEL", *args)


def _unsettled(flags: str) -> bool:
    """A sentinel's flags for the primary say it is down or being failed over."""
    return any(word in flags for word in ("failover", "s_down", "o_down"))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: Every node of a ReplicaSet (any may become the primary): a replica's first sync starts at
#: once (the default waits 5 s for more replicas to join the same diskless transfer).
_SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")


class ReplicaSet(Managed):
    """A primary with ``n_replicas`` replicas (``--replicaof``), optionally watched by
    ``sentinels`` Sentinels; started and stopped together, every process by its PID.

    Args:
        n_replicas: replicas of the primary (>= 0).
        sentinels: Sentinel processes (0: none); their quorum is a majority of them.
        service: the Sentinel service name (see :attr:`sentinel_url`).
        down_after_ms / failover_timeout_ms: the Sentinels' timers (ms).
        password: every data node's password (they share one: a replica authenticates to its
            primary with its own, ``masterauth``, and any node may become the primary);
            default a new random one for the set, ``None`` for none. The sentinels know it
            (``sentinel auth-pass``) and have no password of their own (see :class:`Sentinel`).
        server_kwargs: passed to every data node (:class:`Server`), e.g. ``persistence``.

    :attr:`nodes` keeps the start order (the first one is the first primary); after a failover
    :meth:`primary` tells which node leads now.

    Raises:
        ValueError: negative counts, or ``port``/``extra_args`` given (they differ per node).
    """

    def __init__(
        self,
        n_replicas: int = 1,
        *,
        sentinels: int = 0,
        service: str = "fencelock",
        down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
        failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS,
        password: PasswordOption = RANDOM_PASSWORD,
        **server_kwargs: Any,
    ) -> None:
        if n_replicas < 0 or sentinels < 0:
            raise ValueError("n_replicas and sentinels must be >= 0")
        self._password = resolve_password(password)
        if server_kwargs.get("port") is not None or server_kwargs.get("extra_args"):
            raise ValueError("ReplicaSet chooses ports and arguments; do not pass them")
        server_kwargs.pop("port", None)
        server_kwargs.pop("extra_args", None)
        self._kwargs = {**server_kwargs, "password": self._password}
        self._n_replicas = n_replicas
        self._n_sentinels = sentinels
        self.service = service
        self._timers = (down_after_ms, failover_timeout_ms)
        self.nodes: list[Server] = []
        self.sentinels: list[Sentinel] = []

    @property
    def first_primary(self) -> Server:
        """The node started as the primary (it may be a replica after a failover)."""
        return self.nodes[0]

    @property
    def replicas(self) -> list[Server]:
        """The nodes started as replicas."""
        return self.nodes[1:]

    @property
    def password(self) -> str | None:
        """The data nodes' password (``None``: they have none)."""
        return self._password

    @property
    def sentinel_url(self) -> str:
        """``redis+sentinel://:PASSWORD@host:port,host:port/service`` naming every sentinel
        (the password is the data nodes'; the sentinels need none)."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{url_userinfo(self._password)}{hosts}/{self.service}"

    def start(self, timeout: float = 20.0) -> ReplicaSet:
        """Start the primary, then the replicas and wait until each reports
        ``master_link_status:up``, then the sentinels and wait until each sees every replica
        and every other sentinel; all within ``timeout`` seconds. Returns ``self``.

        Raises:
            ServerError: something did not start or link up in time (everything is stopped).
        """
        deadline = time.monotonic() + timeout
        try:
            primary = Server(extra_args=_SYNC_AT_ONCE, **self._kwargs).start(timeout=timeout)
            self.nodes = [primary]
            for _ in range(self._n_replicas):
                replica = Server(
                    extra_args=(*_SYNC_AT_ONCE, "--replicaof", primary.host, str(primary.port)),
                    **self._kwargs,
                )
                self.nodes.append(replica)
                replica.start(timeout=max(0.1, deadline - time.monotonic()))
            for replica in self.replicas:
                self.wait_linked(replica, deadline - time.monotonic())
            quorum = self._n_sentinels // 2 + 1
            binary = self._kwargs.get("binary")
            for _ in range(self._n_sentinels):
                sentinel = Sentinel(
                    primary.host,
                    primary.port,
                    service=self.service,
                    quorum=quorum,
                    down_after_ms=self._timers[0],
                    failover_timeout_ms=self._timers[1],
                    primary_password=self._password,
                    binary=binary,
                )
                self.sentinels.append(sentinel)
                sentinel.start(timeout=max(0.1, deadline - time.monotonic()))
            for sentinel in self.sentinels:
                self._wait_sentinel(sentinel, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_linked(self, replica: Server, timeout: float) -> None:
        """Wait up to ``timeout`` s until ``replica`` reports ``master_link_status:up``.

        Raises:
            ServerError: not linked in time.
        """
        _wait_for(
            f"replica {replica.port}: master_link_status:up",
            lambda: _info(replica, "replication").get("master_link_status") == "up",
            time.monotonic() + timeout,
        )

    def _wait_sentinel(self, sentinel: Sentinel, deadline: float) -> None:
        def ready() -> bool:
            fields = sentinel.master_state()
            slaves = int(fields.get("num-slaves", 0))
            others = int(fields.get("num-other-sentinels", 0))
            return slaves >= self._n_replicas and others >= self._n_sentinels - 1

        _wait_for(f"sentinel {sentinel.port} sees the topology", ready, deadline)

    def primary(self, timeout: float = 10.0) -> Server:
        """The node that is primary now: the one the sentinels name (all of them agreeing)
        and that reports ``role:master``; without sentinels, the one reporting ``role:master``.

        Raises:
            ServerError: no single primary within ``timeout`` seconds.
        """
        found: list[Server] = []

        def settled() -> bool:
            found.clear()
            masters = [
                n
                for n in self.nodes
                if n.is_running and _info(n, "replication")["role"] == "master"
            ]
            if self.sentinels:
                running = [s for s in self.sentinels if s.is_running]
                named = {s.primary_address() for s in running}
                if len(named) != 1:
                    return False
                if any(_unsettled(s.master_state().get("flags", "")) for s in running):
                    return False  # still switching: the sentinels may yet pick another node
                address = named.pop()
                masters = [n for n in masters if (n.host, n.port) == address]
            if len(masters) != 1:
                return False
            found.append(masters[0])
            return True

        _wait_for("one primary", settled, time.monotonic() + timeout)
        return found[0]

    def failover(self, timeout: float = 15.0) -> Server:
        """``SENTINEL FAILOVER``: promote a replica; wait until the sentinels name a new
        primary that reports ``role:master`` and return it.

        Raises:
            ServerError: no sentinels, or no new primary within ``timeout`` seconds.
        """
        if not self.sentinels:
            raise ServerError("failover needs sentinels")
        deadline = time.monotonic() + timeout
        old = self.primary(timeout)
        _wait_for(
            "SENTINEL FAILOVER accepted",
            lambda: self._ask_failover(),
            deadline,
        )
        return self.wait_new_primary(old, max(0.1, deadline - time.monotonic()))

    def _ask_failover(self) -> bool:
        conn = self.sentinels[0].client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            _sentinel_command(conn, "FAILOVER", self.service)
        except redis.ResponseError:  # INPROG (the last one is finishing), NOGOODSLAVE
            return False
        finally:
            conn.close()
        return True

    def wait_new_primary(self, old: Server, timeout: float) -> Server:
        """Wait up to ``timeout`` s for a primary other than ``old``; return it.

        Raises:
            ServerError: none in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                current = self.primary(max(0.1, min(2.0, deadline - time.monotonic())))
            except ServerError:
                if time.monotonic() >= deadline:
                    raise
                continue
            if current is not old:
                return current
            if time.monotonic() >= deadline:
                raise ServerError(f"the primary is still {old.port} after {timeout} s")
            time.sleep(0.05)

    def rejoin(self, node: Server, timeout: float = 15.0) -> None:
        """Start ``node`` again (after :meth:`Server.kill`), empty, as a replica of the
        current primary, and wait until it is linked.

        Raises:
            ServerError: no primary, or the node did not link within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        primary = self.primary(timeout)
        node._extra_args = (*_SYNC_AT_ONCE, "--replicaof", primary.host, str(primary.port))
        node.restart(wipe=True, timeout=max(0.1, deadline - time.monotonic()))
        try:
            self.wait_whole(max(0.1, deadline - time.monotonic()))
        except ServerError as exc:
            raise ServerError(f"{exc}; log tail:\n{node._log_tail()}") from None

    def wait_whole(self, timeout: float = 15.0) -> Server:
        """Wait until there is one primary (the sentinels agreeing, if any) and every other
        running node is its replica with ``master_link_status:up``; return the primary.
        (The sentinels may still move the primary meanwhile: this waits for the result.)

        Raises:
            ServerError: not so within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        found: list[Server] = []

        def whole() -> bool:
            found.clear()
            try:
                primary = self.primary(max(0.1, min(2.0, deadline - time.monotonic())))
            except ServerError:
                return False  # no settled primary yet: keep waiting until our own deadline
            for node in self.nodes:
                if node is primary or not node.is_running:
                    continue
                info = _info(node, "replication")
                if (
                    info.get("master_link_status") != "up"
                    or int(info.get("master_port", -1)) != primary.port
                ):
                    return False
            found.append(primary)
            return True

        _wait_for("every node linked to one primary", whole, deadline)
        return found[0]

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every sentinel and node (by PID), even if some fail.

        Raises:
            ServerError: listing every process that could not be stopped.
        """
        everything: list[Server] = [*self.sentinels, *self.nodes]
        ServerGroup._stop_all(everything, timeout, "processes could not be stopped")

    def _started(self) -> bool:
        return bool(self.nodes)

    def __repr__(self) -> str:
        return f"<ReplicaSet nodes={self.nodes!r} sentinels={self.sentinels!r}>"
