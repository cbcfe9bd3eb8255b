"""``@fencelock.locked(...)``: run a function (sync or async) while holding a lock, renewed.

Example (docs/integrations.md runs it)::

    @fencelock.locked("redis://127.0.0.1:6379/0", "report:{day}", ttl=60)
    def build_report(day: str) -> None:
        write(day, fence=fencelock.current_lease().fence)

The key is a :meth:`str.format` template over the call's arguments (defaults applied):
``"report:{day}"``, ``"user:{user.id}"``, ``"{self.name}:sync"``. Literal braces (a Cluster
hash tag) are written doubled: ``"{{orders}}:{order_id}"``.
"""

from __future__ import annotations

import functools
import inspect
import re
import string
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, overload

from ._async.lock import Lease as AsyncLease
from ._frontend.context import innermost, pop_held, push_held
from ._frontend.definition import UNSET
from ._sync.lock import Lease
from .client import AsyncClient, Client, _ClientBase
from .errors import ConfigError, NotAcquired
from .options import DEFAULT_TTL, DEFAULT_WAIT, Seconds, check_key

__all__ = ["current_lease", "locked"]

P = ParamSpec("P")
T = TypeVar("T")


def current_lease() -> Lease | AsyncLease | None:
    """The innermost lease held by the current thread (or asyncio task), or ``None``.

    Set while a :func:`locked` function runs and inside ``with lock as lease:`` /
    ``async with lock as lease:``. It lives in a context variable: another thread does not see
    it, an asyncio task sees the leases of the code that created it (a task created inside a
    locked function, and awaited there, runs under that lock).
    """
    lease: Lease | AsyncLease | None = innermost()
    return lease


class _Skipping(Protocol):
    """The decorator ``locked(..., skip=True)`` returns: the result may be ``None``."""

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, T]]
    ) -> Callable[P, Coroutine[Any, Any, T | None]]: ...

    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T | None]: ...


class _Plain(Protocol):
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]: ...


@overload
def locked(
    client_or_servers: Any,
    key: str,
    *,
    ttl: Seconds | None = None,
    wait: Seconds | None = None,
    skip: Literal[False] = False,
) -> _Plain: ...


@overload
def locked(
    client_or_servers: Any,
    key: str,
    *,
    ttl: Seconds | None = None,
    wait: Seconds | None = None,
    skip: bool,
) -> _Skipping: ...


def locked(
    client_or_servers: Any,
    key: str,
    *,
    ttl: Seconds | None = None,
    wait: Seconds | None = None,
    skip: bool = False,
) -> Any:
    """Decorate a function (``def`` or ``async def``) to run only while holding the lock ``key``.

    - ``client_or_servers``: a :class:`fencelock.Client` or :class:`fencelock.asyncio.Client`
      (either works for either kind of function: the other flavour shares its servers, options
      and ``close()``), or whatever :class:`fencelock.Lock` accepts as servers (then a client is
      built here, once).
    - ``key``: the lock name, or a :meth:`str.format` template over the call's arguments
      (``"report:{day}"``); checked against the function's signature when decorating.
    - ``ttl``: lease length in seconds (default: the client's / 30 s); the lease is renewed
      every ``ttl/3`` while the function runs (``hold(renew=True)``).
    - ``wait``: how long a call waits for the lock, in seconds (default: the client's / 10 s;
      with ``skip=True``: 0, a single attempt).
    - ``skip``: when the lock is still held by another at the end of the wait, return ``None``
      without running the function, instead of raising :class:`~fencelock.NotAcquired`.

    Inside the function, :func:`current_lease` gives the lease (``.fence`` for storage writes).

    Raises, when decorating: :class:`~fencelock.ConfigError` for a bad ttl, wait, servers or
    key template (a field that names no parameter, a positional field ``{}``/``{0}``, unbalanced
    braces), or for a generator function. When called: ``TypeError`` when the arguments do not
    fit the signature (as the function would); :class:`~fencelock.ConfigError` when the key
    cannot be formatted from them (both before any I/O); :class:`~fencelock.NotAcquired`
    (unless ``skip``) and :class:`~fencelock.Unavailable` from the acquisition;
    :class:`~fencelock.LockLost` when the lease was lost while the function ran (a sync function
    runs to its end, check ``current_lease().lost``; an async one is cancelled).
    """
    if isinstance(client_or_servers, _ClientBase):
        base: _ClientBase[Any] = client_or_servers
        base._options(ttl, wait)  # ConfigError now rather than at the first call
        lock_ttl, lock_wait = ttl, wait
    else:
        base = Client(
            client_or_servers,
            DEFAULT_TTL if ttl is None else ttl,
            wait=DEFAULT_WAIT if wait is None else wait,
        )
        lock_ttl = lock_wait = None  # the client was built with them
    hold_wait: Seconds = 0 if skip and wait is None else UNSET

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise ConfigError(
                f"@locked cannot hold a lock across a generator's yields ({fn.__qualname__})"
            )
        name_of = _KeyTemplate(key, fn)
        if inspect.iscoroutinefunction(fn):
            aclient = base if isinstance(base, AsyncClient) else base._twin(AsyncClient)

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                lock = aclient.lock(name_of(args, kwargs), lock_ttl, lock_wait)
                async with AsyncExitStack() as stack:
                    try:
                        lease = await stack.enter_async_context(lock.hold(hold_wait, renew=True))
                    except NotAcquired:
                        if skip:
                            return None
                        raise
                    stack.enter_context(_current(lease))
                    return await fn(*args, **kwargs)

            return run_async

        sclient = base if isinstance(base, Client) else base._twin(Client)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            lock = sclient.lock(name_of(args, kwargs), lock_ttl, lock_wait)
            with ExitStack() as stack:
                try:
                    lease = stack.enter_context(lock.hold(hold_wait, renew=True))
                except NotAcquired:
                    if skip:
                        return None
                    raise
                stack.enter_context(_current(lease))
                return fn(*args, **kwargs)

        return run

    return decorate


_FIELD_ROOT = re.compile(r"[.\[]")


class _KeyTemplate:
    """A key, or a ``str.format`` template over a function's arguments."""

    def __init__(self, key: str, fn: Callable[..., Any]) -> None:
        check_key(key)
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(key) if f is not None]
        except ValueError as exc:
            raise ConfigError(
                f"key template {key!r}: {exc} (write literal braces doubled: '{{{{' '}}}}')"
            ) from None
        self.key = key
        self.static: str | None = None
        if not fields:
            self.static = check_key(key.format())
            return
        self.signature = inspect.signature(fn)
        params = self.signature.parameters
        self.var_keyword = next(
            (p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )
        for field in fields:
            root = _FIELD_ROOT.split(field, maxsplit=1)[0]
            if not root or root.isdigit():
                raise ConfigError(
                    f"key template {key!r}: name the argument ('{{day}}'), not its position"
                )
            if root not in params and self.var_keyword is None:
                raise ConfigError(
                    f"key template {key!r}: {fn.__qualname__}() has no parameter {root!r}"
                )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key of one call. TypeError when the arguments do not fit the signature;
        ConfigError when the template cannot be filled from them."""
        if self.static is not None:
            return self.static
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        if self.var_keyword is not None:
            values = {**values.get(self.var_keyword, {}), **values}
        try:
            return check_key(self.key.format_map(values))
        except KeyError as exc:
            raise ConfigError(
                f"key template {self.key!r}: no argument {exc} in this call"
            ) from None
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            raise ConfigError(f"key template {self.key!r}: {exc}") from None


@contextmanager
def _current(lease: object) -> Iterator[None]:
    """``lease`` is :func:`current_lease` inside the block (both wrappers of :func:`locked`)."""
    marker = object()
    push_held(marker, lease)
    try:
        yield
    finally:
        pop_held(marker)
