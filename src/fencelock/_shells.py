"""What the blocking and the asyncio shells share that is not I/O: the configuration a Lock
derives from its arguments, and a lease's local state (validity, loss, representation)."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

from ._core.keys import lock_keys
from ._core.timing import drift_ms, seconds_to_ms
from .errors import LockLost
from .options import WAKE_LIFETIME, LockOptions

log = logging.getLogger("fencelock.lock")


class _Named(Protocol):
    name: str


class LockBase:
    """Key names, wire units and the round budget of one lock, computed once."""

    key: str
    options: LockOptions
    _nodes: Sequence[_Named]

    def _configure(self) -> None:
        """Derive everything from ``key``, ``options`` and ``_nodes`` (set by the subclass)."""
        options = self.options
        self._keys = k = lock_keys(self.key)
        self._ttl_ms = seconds_to_ms(options.ttl)
        self._drift_ms = drift_ms(self._ttl_ms, options.drift_factor, options.drift_min * 1000)
        # a call may take a connect plus a read timeout; the margin covers scheduling
        self._budget = 2 * options.server_timeout + 0.05
        self._independent = len(self._nodes) == 1
        self._run_ids: dict[int, str] = {}
        self._recheck_at: dict[int, float] = {}
        self._acquire_keys = (k.lock, k.fence, k.holder, k.waiters, k.handoff)
        self._release_keys = (k.lock, k.holder, k.waiters, k.wake, k.handoff)
        self._release_tail = (
            seconds_to_ms(options.handoff_window) if options.handoff_window else 1,
            seconds_to_ms(WAKE_LIFETIME),
        )
        n = len(self._nodes)
        if n > 1 and (n % 2 == 0 or n < 3):
            warnings.warn(
                f"{n} servers: an odd number of at least 3 tolerates the most failures "
                f"(majority is {n // 2 + 1})",
                stacklevel=3,
            )

    @property
    def servers(self) -> list[str]:
        """Password-free names of the servers, in order."""
        return [node.name for node in self._nodes]

    @property
    def ttl(self) -> float:
        return self.options.ttl

    def __repr__(self) -> str:
        return f"Lock({self.key!r}, servers={self.servers}, ttl={self.options.ttl})"


class _Flag(Protocol):
    def is_set(self) -> bool: ...


class LeaseBase:
    """A lease's local state; the subclass sets ``lost`` (an event of its front end)."""

    lost: _Flag

    def __init__(self, key: str, token: str, fence: int, deadline: float, start: float) -> None:
        self.key = key
        self.token = token
        self.fence = fence
        self.acquired_at = start  # time.monotonic() when the winning round started
        self._deadline = deadline
        self.lost_reason: str | None = None
        self._released = False
        self._callbacks: list[Any] = []

    def remaining(self) -> float:
        """Seconds of validity left, on the monotonic clock; 0.0 once released or lost."""
        if self._released or self.lost.is_set():
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    @property
    def valid(self) -> bool:
        return self.remaining() > 0.0

    def ensure_valid(self) -> None:
        """Raise :class:`~fencelock.LockLost` unless the lease is still valid (a local check)."""
        if self.lost.is_set():
            raise LockLost(self.key, f"{self.key!r}: lease lost ({self.lost_reason})")
        if self._released:
            raise LockLost(self.key, f"{self.key!r}: lease already released")
        if self.remaining() <= 0.0:
            raise LockLost(self.key, f"{self.key!r}: lease expired")

    def _check_usable(self) -> None:
        """Before a server round on this lease: it must not be released or known lost."""
        if self._released:
            raise LockLost(self.key, f"{self.key!r}: lease already released")
        if self.lost.is_set():
            raise LockLost(self.key, f"{self.key!r}: lease lost ({self.lost_reason})")

    def _run_callback(self, callback: Any) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("on_lost callback for %r failed", self.key)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "released" if self._released else "held"
        return (
            f"Lease({self.key!r}, fence={self.fence}, token={self.token[:8]}…, {state}, "
            f"remaining={self.remaining():.3f}s)"
        )
