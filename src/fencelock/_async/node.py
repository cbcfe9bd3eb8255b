"""One server, as the asyncio front end talks to it."""

from __future__ import annotations

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
        self._blocking: aredis.Redis | None = None

    def _make_client(self, timeout: float) -> aredis.Redis:
        kwargs = client_kwargs(self._kwargs, timeout)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        pool = aredis.ConnectionPool(connection_class=self._connection_class, **kwargs)
        return aredis.Redis(connection_pool=pool)

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """EVALSHA, falling back to EVAL once when the server does not know the script."""
        try:
            return await self._execute("EVALSHA", script.sha, script.numkeys, *keys, *args)
        except NoScriptError:
            return await self._execute("EVAL", script.source, script.numkeys, *keys, *args)

    async def wait_signal(self, key: str, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` (capped at MAX_BLOCK) for a wake element; True if popped."""
        timeout_s = min(timeout_s, MAX_BLOCK)
        if timeout_s < 0.001:
            return False
        if self._blocking is None:
            self._blocking = self._make_client(MAX_BLOCK + self.timeout + 0.5)
        blocking: Callable[..., Any] = self._blocking.execute_command
        return await blocking("BLPOP", key, timeout_s) is not None

    async def run_id(self) -> str:
        info: dict[str, Any] = await self._execute("INFO", "server")
        return str(info.get("run_id", ""))

    async def role(self) -> str:
        info: dict[str, Any] = await self._execute("INFO", "replication")
        return str(info.get("role", ""))

    async def aclose(self) -> None:
        await self.client.aclose()
        if self._blocking is not None:
            await self._blocking.aclose()

    def __repr__(self) -> str:
        return f"AsyncNode({self.name})"
