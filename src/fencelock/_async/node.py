"""One server, as the asyncio front end talks to it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from .._scripts import Script
from .._servers_spec import client_kwargs, describe
from ..options import MAX_BLOCK


class AsyncNode:
    """A server: a client with short timeouts and no retries, built from a URL or from a
    user's client (whose host, auth and TLS settings are reused on new connections)."""

    def __init__(self, spec: str | aredis.Redis, timeout: float) -> None:
        if isinstance(spec, str):
            pool = aredis.ConnectionPool.from_url(spec)
        else:
            pool = spec.connection_pool
        self._kwargs = dict(pool.connection_kwargs)
        self._connection_class = pool.connection_class
        self.name = describe(self._kwargs)
        self.timeout = timeout
        self.client = self._make_client(timeout)
        # execute_command is untyped in redis-py; one typed handle, looked up once
        self._execute: Callable[..., Any] = self.client.execute_command
        # Our own connections are made directly, not by the pool (which may count them against
        # max_connections and would never learn about the ones we drop after a failure).
        pool = self.client.connection_pool
        self._new_connection: Callable[[], Any] = functools.partial(
            pool.connection_class, **pool.connection_kwargs
        )
        self._blocking: aredis.Redis | None = None
        self._idle: list[Any] = []  # connections not in use (run() takes one, gives it back)

    def _make_client(self, timeout: float) -> aredis.Redis:
        kwargs = client_kwargs(self._kwargs, timeout)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        pool = aredis.ConnectionPool(connection_class=self._connection_class, **kwargs)
        return aredis.Redis(connection_pool=pool)

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """EVALSHA, falling back to EVAL once when the server does not know the script.

        Lean path: a connection of our own from a free list (never shared by two tasks), the
        command packed once and sent in one write, the reply read under the connection's socket
        timeout; no client-side retry (the error is the caller's vote).
        """
        conn = await self._checkout()
        try:
            await conn.send_packed_command(
                conn.pack_command("EVALSHA", script.sha, script.numkeys, *keys, *args), False
            )
            try:
                reply = await conn.read_response()
            except NoScriptError:
                await conn.send_packed_command(
                    conn.pack_command("EVAL", script.source, script.numkeys, *keys, *args), False
                )
                reply = await conn.read_response()
        except BaseException:
            # timed out, failed or cancelled mid-command: the connection's state is unknown
            await asyncio.shield(conn.disconnect(nowait=True))
            raise
        self._idle.append(conn)
        return reply

    async def _checkout(self) -> Any:
        """An idle connection of ours, unless the server closed it meanwhile (restarted, a proxy
        reset): an idle connection has nothing to read, so anything readable means stale."""
        while self._idle:
            conn = self._idle.pop()
            probe = getattr(conn, "can_read", None)  # redis-py >= 8: non-blocking
            if probe is None or not conn.is_connected:
                return conn
            try:
                stale = await probe()
            except Exception:
                stale = True
            if not stale:
                return conn
            await conn.disconnect(nowait=True)
        return self._new_connection()

    async def wait_signal(self, key: str, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` (capped at MAX_BLOCK) for a wake element; True if popped."""
        timeout_s = min(timeout_s, MAX_BLOCK)
        if timeout_s < 0.001:
            return False
        if self._blocking is None:
            self._blocking = self._make_client(MAX_BLOCK + self.timeout + 0.5)
        blocking: Callable[..., Any] = self._blocking.execute_command
        return await blocking("BLPOP", key, timeout_s) is not None

    async def identity(self) -> tuple[str, str]:
        """``(run_id, role)`` from one ``INFO`` round trip."""
        info: dict[str, Any] = await self._execute("INFO")
        return str(info.get("run_id", "")), str(info.get("role", ""))

    async def aclose(self) -> None:
        while self._idle:
            await self._idle.pop().disconnect()
        await self.client.aclose()
        if self._blocking is not None:
            await self._blocking.aclose()

    def __repr__(self) -> str:
        return f"AsyncNode({self.name})"
