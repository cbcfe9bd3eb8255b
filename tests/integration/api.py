"""One behaviour suite, two front ends: blocking facades over the asyncio API.

``make_lock(servers, key, **kw)`` (fixture, parametrized ``sync`` / ``async``) returns either a
real :class:`fencelock.Lock`, or a facade over :class:`fencelock.asyncio.Lock` whose every
coroutine runs on a dedicated event loop in a background thread. The facade exposes the same
blocking methods (acquire, try_acquire, release, extend, remaining, token, fence, hold as a
context manager, ``with lock as lease``, close), so one test body checks both front ends.

Helpers to inspect servers directly (``our_keys``, ``lock_value``) live here too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import re
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import ModuleType, TracebackType
from typing import Any, TypeVar

import pytest
import redis

import fencelock
from fencelock._core.holder_json import split_lock_value
from fencelock._core.keys import lock_keys
from fencelock.options import FENCE_RETENTION

T = TypeVar("T")
CALL_TIMEOUT = 60.0  # liveness bound for one facade call (seconds); never a speed assertion


def asyncio_module() -> ModuleType | None:
    try:
        return importlib.import_module("fencelock.asyncio")
    except ImportError:
        return None


class Runner:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="facade-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)

        with contextlib.suppress(Exception):
            self.run(drain(), timeout=10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        self.loop.close()


@contextlib.contextmanager
def bridge(runner: Runner, make_cm: Callable[[], Any], wrap: Callable[[Any], Any]) -> Iterator[Any]:
    """Enter ``async with make_cm() as value`` in one task on the loop, hand ``wrap(value)`` to
    the calling thread, and exit the async context in the same task (same contextvars) with the
    body's exception, if any, raised inside it."""
    entered: concurrent.futures.Future[Any] = concurrent.futures.Future()
    body_exc: list[BaseException | None] = [None]

    async def main() -> None:
        leave = asyncio.Event()
        async with make_cm() as value:
            entered.set_result((value, leave))
            await leave.wait()
            if body_exc[0] is not None:
                raise body_exc[0]

    task = asyncio.run_coroutine_threadsafe(main(), runner.loop)
    concurrent.futures.wait([entered, task], CALL_TIMEOUT, concurrent.futures.FIRST_COMPLETED)
    if not entered.done():
        task.result(0)  # raises the acquire's error
        raise AssertionError("async context entered nothing")
    value, leave = entered.result()
    try:
        yield wrap(value)
    except BaseException as exc:
        body_exc[0] = exc
        runner.loop.call_soon_threadsafe(leave.set)
        try:
            task.result(CALL_TIMEOUT)
        except BaseException as raised:
            if raised is exc:
                raise
            raise raised from exc
        raise
    runner.loop.call_soon_threadsafe(leave.set)
    task.result(CALL_TIMEOUT)


class AsyncLeaseFacade:
    """Blocking view of a :class:`fencelock.asyncio.Lease`."""

    def __init__(self, runner: Runner, lease: Any) -> None:
        self._runner = runner
        self.raw = lease
        self.token: str = lease.token
        self.fence: int = lease.fence
        self.key: str = lease.key
        self.acquired_at: float = lease.acquired_at

    @property
    def lost(self) -> Any:
        return self.raw.lost  # asyncio.Event: is_set() is safe to read from here

    @property
    def lost_reason(self) -> str | None:
        return self.raw.lost_reason  # type: ignore[no-any-return]

    @property
    def valid(self) -> bool:
        return bool(self.raw.valid)

    def remaining(self) -> float:
        return float(self.raw.remaining())

    def ensure_valid(self) -> None:
        self.raw.ensure_valid()

    def release(self) -> None:
        self._runner.run(self.raw.release())

    def extend(self, ttl: Any = None) -> None:
        self._runner.run(self.raw.extend(ttl))

    def __enter__(self) -> AsyncLeaseFacade:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self._runner.run(self.raw.__aexit__(et, e, tb))


class AsyncLockFacade:
    """Blocking view of a :class:`fencelock.asyncio.Lock` (made on the runner's loop)."""

    def __init__(self, runner: Runner, lock: Any) -> None:
        self._runner = runner
        self.raw = lock
        self._entered = threading.local()

    key = property(lambda self: self.raw.key)
    ttl = property(lambda self: self.raw.ttl)
    servers = property(lambda self: self.raw.servers)
    options = property(lambda self: self.raw.options)

    def _wrap(self, lease: Any) -> AsyncLeaseFacade:
        return AsyncLeaseFacade(self._runner, lease)

    def acquire(self, *args: Any, **kwargs: Any) -> AsyncLeaseFacade:
        return self._wrap(self._runner.run(self.raw.acquire(*args, **kwargs)))

    def try_acquire(self) -> AsyncLeaseFacade | None:
        lease = self._runner.run(self.raw.try_acquire())
        return None if lease is None else self._wrap(lease)

    def hold(self, *args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
        return bridge(self._runner, lambda: self.raw.hold(*args, **kwargs), self._wrap)

    def __enter__(self) -> AsyncLeaseFacade:
        stack = self._entered.__dict__.setdefault("stack", [])
        cm = bridge(self._runner, lambda: self.raw, self._wrap)
        lease = cm.__enter__()
        stack.append(cm)
        return lease  # type: ignore[no-any-return]

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        cm = self._entered.stack.pop()
        cm.__exit__(et, e, tb)

    def close(self) -> None:
        self._runner.run(self.raw.aclose())


FRONT_ENDS = [
    pytest.param("sync", id="sync"),
    pytest.param(
        "async",
        id="async",
        marks=pytest.mark.skipif(asyncio_module() is None, reason="fencelock.asyncio missing"),
    ),
]

LockFactory = Callable[..., Any]


@pytest.fixture(params=FRONT_ENDS)
def front(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_lock(front: str) -> Iterator[LockFactory]:
    """``make_lock(servers, key, **kw)``: a sync Lock, or the blocking facade of an async one."""
    made: list[Any] = []
    runner = Runner() if front == "async" else None

    def make(servers: Any, key: str, **kwargs: Any) -> Any:
        if runner is None:
            lock: Any = fencelock.Lock(servers, key, **kwargs)
        else:
            module = asyncio_module()
            assert module is not None

            async def build() -> Any:
                return module.Lock(servers, key, **kwargs)

            lock = AsyncLockFacade(runner, runner.run(build()))
        made.append(lock)
        return lock

    try:
        yield make
    finally:
        for lock in made:
            with contextlib.suppress(Exception):
                lock.close()
        if runner is not None:
            runner.close()


# -- direct inspection of servers ----------------------------------------------------------------


#: What :func:`our_keys` says of a fence register kept for the default retention (a TTL above
#: a minute and at most ``fence_retention``'s default of 7 days), instead of its PTTL.
FENCE_KEPT = "kept for the retention"


def our_keys(client: redis.Redis, name: str) -> dict[str, int | str]:
    """Every ``fencelock:{name}*`` key on one server -> its PTTL in ms (-1: no TTL), or
    :data:`FENCE_KEPT` for the fence register with the default retention's TTL.

    Keys are named by their suffix (``"<lock>"``, ``":fence"``, ``":holder"``...)."""
    base = lock_keys(name).lock
    pattern = re.sub(r"([\\*?\[\]{}])", r"\\\1", base) + "*"
    found: dict[str, int | str] = {}
    for raw in client.scan_iter(match=pattern, count=1000):
        k = raw.decode() if isinstance(raw, bytes) else str(raw)
        pttl = int(client.pttl(k))
        suffix = k[len(base) :] or "<lock>"
        if suffix == ":fence" and 60_000 < pttl <= FENCE_RETENTION * 1000:
            found[suffix] = FENCE_KEPT
        elif pttl != -2:
            found[suffix] = pttl
    return found


def lock_value(client: redis.Redis, name: str) -> str | None:
    """The token the lock key holds on one server (its value up to byte 255, after which the
    holder info goes), or None when there is no key."""
    raw = client.get(lock_keys(name).lock)
    if raw is None:
        return None
    return split_lock_value(raw)[0].decode() if isinstance(raw, bytes) else str(raw)


def command_counts(client: redis.Redis) -> dict[str, int]:
    """Calls per command on the server since its last ``CONFIG RESETSTAT`` (``INFO
    commandstats``; a script's own commands count, by name: ``set``, ``config|resetstat``)."""
    stats = client.info("commandstats")
    return {name[len("cmdstat_") :]: int(row["calls"]) for name, row in stats.items()}


def lock_holder(client: redis.Redis, name: str) -> str | None:
    """The holder info in the lock key's value on one server (after byte 255), or None."""
    raw = client.get(lock_keys(name).lock)
    info = split_lock_value(raw)[1] if isinstance(raw, bytes) else None
    return None if info is None else info.decode()
