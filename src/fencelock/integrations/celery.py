"""At most one running instance of a Celery task per name and arguments (extra ``celery``).

::

    from fencelock.integrations.celery import SingletonTask

    app.conf.fencelock_servers = "redis://127.0.0.1:6379/0"   # or lock_servers= per task

    @app.task(base=SingletonTask, bind=True, lock_ttl=60, lock_key_args=("day",))
    def build_report(self, day, verbose=False):
        write(day, fence=self.lease.fence)        # or fencelock.current_lease().fence

The lock is taken when the task starts running (not when it is queued), renewed every
``lock_ttl / 3`` seconds while it runs, and released when it returns, raises, retries
(``self.retry`` raises out of the task) or is revoked with ``terminate=True`` (the prefork
child unwinds the task with SystemExit on SIGTERM, releasing on the way out). A worker killed
with SIGKILL cannot release anything: renewal stops with the process (a prefork child dies
with its parent), so the key is free again within ``lock_ttl`` seconds, never wedged.
The lease's ``fence`` is there for the task's writes: a task paused past its lease (a
stop-the-world GC, a frozen VM) is refused by a fenced store.

Options (task attributes, given to ``@app.task(...)`` or set on a subclass):

- ``lock_servers``: servers as for :class:`fencelock.Lock`, or a :class:`fencelock.Client`
  (its other options apply; ``lock_ttl`` and ``lock_wait`` always do); default
  ``app.conf.fencelock_servers``.
- ``lock_ttl``: lease length in seconds (default 30); it bounds how long a killed worker keeps
  others out.
- ``lock_wait``: seconds a task waits for a running twin to finish (default 0: one attempt).
- ``lock_key_args``: names of the task's parameters that form the key (default ``None``: all of
  them, defaults applied; ``()``: one instance per task name).
- ``lock_busy``: what a task does when its twin runs: ``"skip"`` (default: return ``None``
  without running), ``"raise"`` (fail with :class:`~fencelock.NotAcquired`) or ``"retry"``
  (``self.retry(countdown=lock_retry_countdown)``, a :class:`~fencelock.NotAcquired` as cause).
- ``lock_retry_countdown``: seconds before such a retry (default 5).

The key is ``celery:<task name>:<JSON of the selected arguments>`` (a SHA-256 of that JSON
when it is longer than :data:`KEY_MAX`); override :meth:`SingletonTask.lock_key` to choose.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import celery

from .._frontend.context import innermost, pop_held, push_held
from .._sync.lock import Lease
from ..client import Client
from ..errors import ConfigError, NotAcquired

__all__ = ["KEY_MAX", "SingletonTask"]

log = logging.getLogger("fencelock.celery")

#: Longest key spelled out in full; longer argument lists are hashed.
KEY_MAX = 200
_BUSY = ("skip", "raise", "retry")


class SingletonTask(celery.Task):  # type: ignore[misc]
    """A task base class: at most one running instance per task name and selected arguments.

    See the module documentation for the options. Raises, when the task runs:
    :class:`~fencelock.ConfigError` for missing servers or bad options (before any I/O),
    :class:`~fencelock.Unavailable` when too few lock servers answer,
    :class:`~fencelock.NotAcquired` with ``lock_busy="raise"``, and
    :class:`~fencelock.LockLost` when the lease was lost while the task ran (the task ran to
    its end: check ``self.lease.lost`` between steps, and fence your writes).
    """

    lock_servers: Any = None
    lock_ttl: float = 30.0
    lock_wait: float = 0.0
    lock_key_args: Sequence[str] | None = None
    lock_busy: str = "skip"
    lock_retry_countdown: float = 5.0

    _fencelock_client: Client | None = None

    @property
    def lease(self) -> Lease | None:
        """The lease of the instance running in this thread (``None`` outside one)."""
        lease: Lease | None = innermost()
        return lease

    def lock_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name for a call with ``args`` / ``kwargs``. Raises ``TypeError`` when they
        do not fit the task's signature, :class:`~fencelock.ConfigError` when
        ``lock_key_args`` names a parameter the task does not have."""
        bound = inspect.signature(self.run).bind(*args, **kwargs)
        bound.apply_defaults()
        chosen = bound.arguments
        if self.lock_key_args is not None:
            if isinstance(self.lock_key_args, str):
                raise ConfigError(f"{self.name}: lock_key_args must be a sequence of names")
            missing = [n for n in self.lock_key_args if n not in chosen]
            if missing:
                raise ConfigError(f"{self.name}: lock_key_args names no parameter {missing}")
            chosen = {name: chosen[name] for name in self.lock_key_args}
        text = json.dumps(chosen, sort_keys=True, separators=(",", ":"), default=repr)
        if len(text) > KEY_MAX:
            text = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        return f"celery:{self.name}:{text}"

    def _client(self) -> Client:
        client = self._fencelock_client
        if client is None:
            if self.lock_busy not in _BUSY:
                raise ConfigError(f"{self.name}: lock_busy must be one of {_BUSY}")
            servers = self.lock_servers
            if servers is None:
                servers = self.app.conf.get("fencelock_servers")
            if servers is None:
                raise ConfigError(
                    f"{self.name}: no lock servers (set lock_servers= on the task or "
                    "app.conf.fencelock_servers)"
                )
            if isinstance(servers, Client):
                client = servers
            else:
                client = Client(
                    servers,
                    self.lock_ttl,
                    wait=self.lock_wait,
                    purpose=f"celery task {self.name}",
                )
            self._fencelock_client = client
        return client

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self.lock_key(args, kwargs)
        lock = self._client().lock(key, self.lock_ttl, self.lock_wait)
        # Every way out is an exception through this block or a return: a retry raises
        # Retry, and revoke(terminate=True) makes the prefork child raise SystemExit (billiard's
        # SIGTERM handler), so the lease is released before the process goes.
        with ExitStack() as stack:
            try:
                lease = stack.enter_context(lock.hold(renew=True))
            except NotAcquired as exc:
                return self._busy(key, exc)
            marker = object()
            push_held(marker, lease)
            stack.callback(pop_held, marker)
            return super().__call__(*args, **kwargs)

    def _busy(self, key: str, exc: NotAcquired) -> Any:
        if self.lock_busy == "raise":
            raise exc
        if self.lock_busy == "retry":
            raise self.retry(exc=exc, countdown=self.lock_retry_countdown)
        log.info("%s: %r is running elsewhere; skipped", self.name, key)
        return None
