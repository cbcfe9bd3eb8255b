"""One test body over both front ends for the family (Semaphore, RWLock, MultiLock, reentrant
locks): ``make(kind, ...)`` gives the blocking object, or a blocking proxy of the asyncio one
whose coroutines run on a loop in a background thread (:class:`api.Runner`)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from api import Runner, bridge

import fencelock
import fencelock.asyncio as fasync


class Blocking:
    """A blocking view of an asyncio object: coroutines are run, async context managers are
    bridged, leases and tuples of leases are wrapped in turn."""

    def __init__(self, runner: Runner, obj: Any) -> None:
        self._runner = runner
        self.raw = obj

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(self._wrap(v) for v in value)
        if isinstance(value, fasync.Lease) or hasattr(value, "_entry"):
            return Blocking(self._runner, value)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if not callable(attr) or inspect.isclass(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if inspect.iscoroutine(result):
                return self._wrap(self._runner.run(result))
            if hasattr(result, "__aenter__"):
                return bridge(self._runner, lambda: result, self._wrap)
            return result

        return call

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._runner.run(self.raw.__aexit__(*exc))


Make = Callable[..., Any]


@pytest.fixture
def make(front: str) -> Iterator[Make]:
    """``make("semaphore" | "rwlock" | "multilock" | "lock", servers, *args, **kw)``."""
    runner = Runner() if front == "async" else None

    def build(kind: str, servers: Any, *args: Any, **kwargs: Any) -> Any:
        module: Any = fencelock if runner is None else fasync
        factory = {
            "semaphore": module.Semaphore,
            "rwlock": module.RWLock,
            "multilock": module.MultiLock,
            "lock": module.Lock,
        }[kind]
        if runner is None:
            return factory(servers, *args, **kwargs)

        async def construct() -> Any:
            return factory(servers, *args, **kwargs)

        return Blocking(runner, runner.run(construct()))

    try:
        yield build
    finally:
        if runner is not None:
            with contextlib.suppress(Exception):
                runner.close()
