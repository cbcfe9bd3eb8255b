"""One server, as the blocking front end talks to it."""

from __future__ import annotations

import functools
import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from .._scripts import Script
from .._servers_spec import client_kwargs, describe
from ..options import MAX_BLOCK

PARKED_MAX = 16  # connections awaiting a straggler's reply, per server, at most
# a reply still missing after this long (s) was lost on the way: drop the connection, try afresh
PARKED_GIVE_UP = 1.0
# an idle connection is checked for a close by the server only after this long (s)
STALE_CHECK_AFTER = 0.05


class Node:
    """A server: a client with short timeouts and no retries, built from a URL or from a
    user's client (whose host, auth and TLS settings are reused on new connections)."""

    def __init__(self, spec: str | redis.Redis, timeout: float) -> None:
        if isinstance(spec, str):
            pool = redis.ConnectionPool.from_url(spec)
        else:
            pool = spec.connection_pool
        self._kwargs = dict(pool.connection_kwargs)
        self._connection_class = pool.connection_class
        self.name = describe(self._kwargs)
        self.timeout = timeout
        self.client = self._make_client(timeout)
        # execute_command is untyped in redis-py; one typed handle, looked up once
        self._execute: Callable[..., Any] = self.client.execute_command
        # Our own connections are made directly, not by the pool: the pool counts what it makes
        # against max_connections and never learns about the ones we drop after a failure.
        pool = self.client.connection_pool
        self._new_connection: Callable[[], Any] = functools.partial(
            pool.connection_class, **pool.connection_kwargs
        )
        self._blocking: redis.Redis | None = None
        self._idle: list[tuple[Any, float]] = []  # (connection, idle since), not in use
        self._parked: list[tuple[Any, float]] = []  # (connection, since): a reply to read
        self._park_lock = threading.Lock()

    def _make_client(self, timeout: float) -> redis.Redis:
        kwargs = client_kwargs(self._kwargs, timeout)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        pool = redis.ConnectionPool(connection_class=self._connection_class, **kwargs)
        return redis.Redis(connection_pool=pool)

    # -- connections of our own: taken, used by one thread, given back -------------------------

    def checkout(self) -> Any:
        """A connection for one command (``list.pop``/``append`` are atomic: threads never
        share one). Raises :class:`TimeoutError` while a command of an earlier round has gone
        unanswered for longer than the timeout: the server is paused or overloaded, and asking
        it again cannot help (a new connection would only queue behind the old command)."""
        if self._parked and self._park_lock.acquire(blocking=False):
            try:
                self._drain_parked()
            finally:
                self._park_lock.release()
        parked = self._parked
        if parked and time.monotonic() - parked[0][1] > self.timeout:
            raise TimeoutError(f"{self.name} has not answered an earlier command yet")
        while self._idle:
            conn, since = self._idle.pop()
            sock = conn._sock
            # an idle connection has nothing to read, unless the server closed it meanwhile
            # (restarted, a proxy reset): then it is readable (EOF) and must not be used. A
            # connection used a moment ago is taken as it is (the check costs a system call).
            if (
                sock is None
                or time.monotonic() - since < STALE_CHECK_AFTER
                or not select.select((sock,), (), (), 0)[0]
            ):
                return conn
            conn.disconnect()
        return self._new_connection()

    def _drain_parked(self) -> None:
        give_up = max(PARKED_GIVE_UP, 4 * self.timeout)
        while self._parked:
            conn, since = self._parked[0]
            try:
                if not conn.can_read(timeout=0):
                    young = time.monotonic() - since < give_up
                    if young and len(self._parked) <= PARKED_MAX:
                        return
                    ready = False  # lost on the way (blackhole, dropped reply): start afresh
                else:
                    conn.read_response()  # a straggler's reply nobody waits for any more
                    ready = True
            except Exception:
                ready = False
            self._parked.pop(0)
            if ready:
                self._idle.append((conn, time.monotonic()))
            else:
                conn.disconnect()

    def send(
        self, conn: Any, script: Script, keys: Sequence[str], args: Sequence[str | int]
    ) -> None:
        conn.send_packed_command(
            conn.pack_command("EVALSHA", script.sha, script.numkeys, *keys, *args), False
        )

    def receive(
        self, conn: Any, script: Script, keys: Sequence[str], args: Sequence[str | int]
    ) -> Any:
        """The reply to :meth:`send`; on NOSCRIPT the script is sent in full (EVAL) once."""
        try:
            return conn.read_response()
        except NoScriptError:
            conn.send_packed_command(
                conn.pack_command("EVAL", script.source, script.numkeys, *keys, *args), False
            )
            return conn.read_response()

    def checkin(self, conn: Any) -> None:
        self._idle.append((conn, time.monotonic()))

    def park(self, conn: Any) -> None:
        """A connection whose reply is still on the way (a straggler of a decided round)."""
        self._parked.append((conn, time.monotonic()))

    @staticmethod
    def discard(conn: Any) -> None:
        """A connection that failed or timed out mid-command: its state is unknown."""
        conn.disconnect()

    def run(self, script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """EVALSHA (EVAL on NOSCRIPT) on a connection of our own, under the socket timeout;
        no client-side retry: on any error the connection is dropped and the error raised."""
        conn = self.checkout()
        try:
            self.send(conn, script, keys, args)
            reply = self.receive(conn, script, keys, args)
        except BaseException:
            self.discard(conn)
            raise
        self.checkin(conn)
        return reply

    def wait_signal(self, key: str, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` (capped at MAX_BLOCK) for a wake element; True if popped."""
        timeout_s = min(timeout_s, MAX_BLOCK)
        if timeout_s < 0.001:
            return False
        if self._blocking is None:
            self._blocking = self._make_client(MAX_BLOCK + self.timeout + 0.5)
        blocking: Callable[..., Any] = self._blocking.execute_command
        return blocking("BLPOP", key, timeout_s) is not None

    def identity(self) -> tuple[str, str]:
        """``(run_id, role)`` from one ``INFO`` round trip."""
        info: dict[str, Any] = self._execute("INFO")
        return str(info.get("run_id", "")), str(info.get("role", ""))

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[0].disconnect()
        while self._parked:
            self._parked.pop()[0].disconnect()
        self.client.close()
        if self._blocking is not None:
            self._blocking.close()

    def __repr__(self) -> str:
        return f"Node({self.name})"


_shared: weakref.WeakValueDictionary[tuple[object, float], Node] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def shared_node(spec: str | redis.Redis, timeout: float) -> Node:
    """The Node for ``spec`` and ``timeout``, shared by every Lock that names the same server
    (a URL, or the same client's connection pool), so 10,000 Locks do not open 10,000
    connections. It lives as long as some Lock uses it."""
    key: tuple[object, float] = (spec if isinstance(spec, str) else spec.connection_pool, timeout)
    with _shared_lock:
        node = _shared.get(key)
        if node is None:
            node = Node(spec, timeout)
            _shared[key] = node
        return node
