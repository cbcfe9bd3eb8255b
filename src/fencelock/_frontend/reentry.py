"""Reentrancy, kept in the process: a count per (lock, owner) beside the lease it shares.

Only the outermost acquire of an owner talks to the servers, and only the matching outermost
release frees the lock; acquisitions in between get the same lease (token, fence, deadline).
The owner is the thread (blocking API), the task (asyncio), or an explicit id given as
``owner=`` (then the caller promises one flow of control at a time per id). A thread or task
that ended without releasing leaves an entry that no other thread or task can match (it is
checked by identity, not only by id), and the lease itself expires by its ttl.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, FencelockError, LockLost

#: How deep one owner may re-enter one lock.
MAX_DEPTH = 1000


@dataclass(eq=False)
class Entry:
    """One owner's hold of one lock: the shared lease and how many acquisitions are open."""

    lease: Any
    depth: int
    anchor: weakref.ref[Any] | None  # the thread or task it belongs to (None: explicit id)
    slot: tuple[object, ...]
    #: The longest ``hold(at_least=...)`` of any acquisition of this entry (seconds after the
    #: shared lease's acquisition): the outermost end keeps the lock until then.
    at_least: float | None = None


_entries: dict[tuple[object, ...], Entry] = {}
_guard = threading.Lock()


class Reentry:
    """The reentrancy of one lock definition (``reentrant=True``)."""

    __slots__ = ("owner",)

    def __init__(self, owner: str | None) -> None:
        self.owner = owner

    def _where(self, lock_id: tuple[object, ...], current: object) -> tuple[object, ...]:
        if self.owner is not None:
            return (lock_id, "owner", self.owner)
        return (lock_id, "local", id(current))

    def again(self, lock_id: tuple[object, ...], current: object) -> Entry | None:
        """The owner's open entry, one deeper; None when this is its outermost acquire.

        Raises :class:`~fencelock.LockLost` when the lease the owner holds was lost or has
        run out (re-entering it would hand out a lease that protects nothing)."""
        where = self._where(lock_id, current)
        with _guard:
            entry = _entries.get(where)
            if entry is None:
                return None
            if entry.anchor is not None and entry.anchor() is not current:
                del _entries[where]  # a dead thread's or task's id, reused
                return None
            if entry.depth >= MAX_DEPTH:
                raise FencelockError(f"re-entered more than {MAX_DEPTH} times")
            if not entry.lease.valid:
                raise LockLost(
                    entry.lease.key, f"{entry.lease.key!r}: the lease this owner holds was lost"
                )
            entry.depth += 1
            return entry

    def first(self, lock_id: tuple[object, ...], current: object, lease: Any) -> Entry:
        """Record the outermost acquisition of the owner."""
        where = self._where(lock_id, current)
        anchor = None if self.owner is not None else weakref.ref(current)
        entry = Entry(lease, 1, anchor, where)
        with _guard:
            _entries[where] = entry
        return entry


def leave(entry: Entry) -> bool:
    """One release of ``entry``; True when it was the outermost (free the lock now)."""
    with _guard:
        entry.depth -= 1
        if entry.depth > 0:
            return False
        if _entries.get(entry.slot) is entry:
            del _entries[entry.slot]
        return True


def make_reentry(reentrant: object, owner: object) -> Reentry | None:
    """ConfigError for a non-bool ``reentrant`` or a bad ``owner``; None when not reentrant."""
    if not isinstance(reentrant, bool):
        raise ConfigError(f"reentrant must be a bool, not {type(reentrant).__name__}")
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise ConfigError("owner must be a non-empty str")
    if owner is not None and not reentrant:
        raise ConfigError("owner= is only meaningful with reentrant=True")
    return Reentry(owner) if reentrant else None


class HeldBase:
    """What the reentrant lease views of both front ends share: every attribute of the shared
    lease (token, fence, lost, remaining()...) except the releases, which count down."""

    __slots__ = ("_entry", "_left", "_outer")

    #: Set on the shared lease by the outermost acquisition only (the body a loss cancels).
    _OUTER_ONLY = frozenset({"_body"})

    def __init__(self, entry: Entry) -> None:
        object.__setattr__(self, "_entry", entry)
        object.__setattr__(self, "_left", False)
        object.__setattr__(self, "_outer", entry.depth == 1)

    @property
    def depth(self) -> int:
        """Acquisitions of this owner still open on the lock."""
        depth: int = self._entry.depth
        return depth

    def _leave(self) -> bool:
        """Count this view's release once; True when the lock is to be freed now."""
        if self._left:
            return False
        object.__setattr__(self, "_left", True)
        return leave(self._entry)

    def _kept_at_release(self) -> bool:
        """At the outermost release (already counted): keep the lock until the longest
        ``hold(at_least=...)`` of this owner's acquisitions, if one is still ahead (True)."""
        return self._entry.at_least is not None and bool(
            self._entry.lease._linger(self._entry.at_least)
        )

    def _linger(self, at_least: float | None) -> bool:
        """The end of a ``hold(at_least=...)`` block on this view. An inner one only records
        its ``at_least`` (the outer block still holds the lock) and returns False: the caller
        then ends it as any other (its release counts down, it frees nothing). The outermost
        one keeps the shared lease until the longest ``at_least`` of any of its acquisitions
        (True: this view's release is counted and the lock is released in the background)."""
        entry = self._entry
        with _guard:
            if at_least is not None:
                entry.at_least = max(at_least, entry.at_least or 0.0)
            longest = entry.at_least
            last = not self._left and entry.depth == 1
        if not last or not entry.lease._linger(longest):
            return False
        self._leave()
        return True

    def __getattr__(self, name: str) -> Any:
        if name in HeldBase.__slots__:  # a bare instance (being copied): nothing to follow yet
            raise AttributeError(name)
        return getattr(self._entry.lease, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in HeldBase.__slots__:  # (a copy filling in its own state)
            object.__setattr__(self, name, value)
            return
        if name in self._OUTER_ONLY and not self._outer:
            return  # an inner hold() must not take the outer one's body away
        setattr(self._entry.lease, name, value)

    def __repr__(self) -> str:
        return f"Reentered({self._entry.lease!r}, depth={self._entry.depth})"
