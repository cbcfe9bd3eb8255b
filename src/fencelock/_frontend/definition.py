"""What a lock is, whichever front end drives it: its servers, key, options and plan.

Built in microseconds and without I/O, so a Lock made per key (as request handlers do) costs
nothing the servers see: connections, health and identity live in the shared engine.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .._core.plan import LockPlan, make_plan
from .._engine.server import Server
from ..options import WAKE_LIFETIME, LockOptions, check_key
from .holder import holder_info


class _Unset:
    def __repr__(self) -> str:
        return "<lock default>"


UNSET: Any = _Unset()
"""Marks an argument left to the lock's (or the client's) default."""


class Gate:
    """Shared by the locks of one client: once closed, they acquire no more."""

    __slots__ = ("closed",)

    def __init__(self) -> None:
        self.closed = False


def _no_info() -> str:
    return ""


class Definition:
    """Servers, key, options and the derived plan of one lock (immutable once built)."""

    __slots__ = ("gate", "holder", "key", "options", "plan", "servers")

    def __init__(
        self,
        servers: tuple[Server, ...],
        key: str,
        options: LockOptions,
        gate: Gate | None = None,
    ) -> None:
        self.gate = Gate() if gate is None else gate
        self.key = check_key(key)
        self.options = options
        self.servers = servers
        self.plan: LockPlan = make_plan(
            self.key,
            tuple(server.name for server in servers),
            ttl_s=options.ttl,
            drift_factor=options.drift_factor,
            drift_min_s=options.drift_min,
            server_timeout_s=options.server_timeout,
            retry_base_s=options.retry_base,
            retry_cap_s=options.retry_cap,
            handoff_window_s=options.handoff_window,
            wake_lifetime_s=WAKE_LIFETIME,
            restart_delay=(
                len(servers) > 1 if options.restart_delay is None else options.restart_delay
            ),
            replicas=options.replicas,
            fence_retention_s=options.fence_retention,
        )
        purpose = options.purpose
        self.holder: Callable[[], str] = (
            (lambda: holder_info(purpose)) if options.holder_info else _no_info
        )
        self.warn()

    def warn(self) -> None:
        """Warn about a server count that tolerates fewer failures than it could."""
        n = len(self.servers)
        if n > 1 and (n % 2 == 0 or n < 3):
            warnings.warn(
                f"{n} servers: an odd number of at least 3 tolerates the most failures "
                f"(majority is {n // 2 + 1})",
                stacklevel=5,
            )

    def with_plan(self, plan: LockPlan) -> Definition:
        """The same lock definition driving other keys and scripts (a semaphore slot, the
        readers or the writer of a read-write lock)."""
        other = Definition.__new__(Definition)
        for name in Definition.__slots__:
            setattr(other, name, getattr(self, name))
        other.plan = plan
        return other

    @property
    def names(self) -> list[str]:
        return [server.name for server in self.servers]
