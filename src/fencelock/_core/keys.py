"""Key names. All keys of one lock share one Redis Cluster hash tag so scripts stay valid on
Cluster: the tag runs from the first ``{`` to the next ``}`` and both sit in the shared prefix
``fencelock:{<tag>}``.

The tag is the lock name itself when the name has no brace (the keys of v0.1, unchanged). A
name with a ``{`` or a ``}`` would cut the tag short (``"}abc"`` gave the empty tag ``{}``, so
every key hashed on its own), so such a name is written as ``{`` followed by the name with
``%``, ``{`` and ``}`` percent-escaped (``"}abc"`` -> tag ``{%7Dabc``). The escaped part has no
``}``, so the tag is the whole encoded name; it is never empty; and it is unique per name: an
unchanged name has no brace at all while an escaped one starts with ``{``, and the escaping is
reversible. (Names with a ``{`` but no ``}`` worked before and now change keys: keeping
them would leave no ``}``-free tag for the names with a ``}``.)
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "fencelock:"

_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def hash_tag(name: str) -> str:
    """The Cluster hash tag (the text between the braces) shared by every key of ``name``."""
    if "{" not in name and "}" not in name:
        return name
    return "{" + name.translate(_ESCAPES)


def keys_glob(name_prefix: str) -> str:
    """A ``SCAN MATCH`` pattern for the keys of every lock whose name starts with
    ``name_prefix`` and has no brace (``name_prefix`` must be brace-free and glob-free)."""
    if any(char in name_prefix for char in "{}*?[]\\"):
        raise ValueError(f"name prefix must not contain braces or glob characters: {name_prefix!r}")
    return f"{PREFIX}{{{name_prefix}*"


@dataclass(frozen=True)
class LockKeys:
    lock: str  # value = the holder's token, PX = the lease
    fence: str  # the fence register F (kept ``fence_retention`` after its last write)
    holder: str  # holder metadata (host, pid, purpose), same PX as the lock
    waiters: str  # set by a refused acquire: "someone is waiting", PX = the holder's lease
    wake: str  # release pushes one element here to wake one blocked waiter
    handoff: str  # set by a release that woke a waiter: newcomers step aside briefly
    claimed: str  # a waiter that claims a grant a release handed over moves it here (BLMOVE)
    observers: str  # elections: observer id -> expiry (zset); each one's wake list is
    # ``observers + ":" + id``

    @property
    def script_keys(self) -> tuple[str, str, str, str, str, str, str]:
        return (
            self.lock,
            self.fence,
            self.holder,
            self.waiters,
            self.wake,
            self.handoff,
            self.claimed,
        )


def lock_keys(name: str) -> LockKeys:
    base = f"{PREFIX}{{{hash_tag(name)}}}"
    return LockKeys(
        lock=base,
        fence=base + ":fence",
        holder=base + ":holder",
        waiters=base + ":waiters",
        wake=base + ":wake",
        handoff=base + ":handoff",
        claimed=base + ":claimed",
        observers=base + ":observers",
    )


def fair_queue_key(keys: LockKeys) -> str:
    """A fair lock's line (zset: waiter id -> arrival ticket)."""
    return keys.lock + ":fair"


def limit_key(name: str) -> str:
    """Where a semaphore's servers keep its ``limit`` while permits of it may be valid: a
    Semaphore of another limit on the same name is refused (its permits would not count)."""
    return f"{lock_keys(name).lock}:limit"


def slot_keys(name: str, slot: int) -> LockKeys:
    """Slot ``slot`` of the semaphore ``name``: a lock key of its own, sharing the semaphore's
    hash tag, ONE fence register (fences grow per semaphore, not per slot), and one waiter
    set and wake list (a release of any slot wakes a waiter)."""
    shared = lock_keys(name)
    own = f"{shared.lock}:slot:{slot}"
    return LockKeys(
        lock=own,
        fence=shared.fence,
        holder=own + ":holder",
        waiters=shared.waiters,
        wake=shared.wake,
        handoff=own + ":handoff",
        claimed=own + ":claimed",
        observers=shared.observers,
    )


@dataclass(frozen=True)
class RWKeys:
    """Keys of the read-write lock ``name``: the writer holds the lock key itself (so
    ``fencelock status`` shows it), readers are members of a zset (token -> expiry in server
    ms), and a waiting writer's intent key stops new readers."""

    writer: LockKeys
    readers: str
    intent: str


def rw_keys(name: str) -> RWKeys:
    writer = lock_keys(name)
    return RWKeys(writer=writer, readers=writer.lock + ":readers", intent=writer.lock + ":intent")
