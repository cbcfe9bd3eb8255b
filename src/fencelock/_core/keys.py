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
    fence: str  # the fence register F, no TTL (a few bytes per lock name, kept on purpose)
    holder: str  # holder metadata (host, pid, purpose), same PX as the lock
    waiters: str  # set by a refused acquire: "someone is waiting", PX = the holder's lease
    wake: str  # release pushes one element here to wake one blocked waiter
    handoff: str  # set by a release that woke a waiter: newcomers step aside briefly
    observers: str  # elections: observer id -> expiry (zset); each one's wake list is
    # ``observers + ":" + id``

    @property
    def script_keys(self) -> tuple[str, str, str, str, str, str]:
        return (self.lock, self.fence, self.holder, self.waiters, self.wake, self.handoff)


def lock_keys(name: str) -> LockKeys:
    base = f"{PREFIX}{{{hash_tag(name)}}}"
    return LockKeys(
        lock=base,
        fence=base + ":fence",
        holder=base + ":holder",
        waiters=base + ":waiters",
        wake=base + ":wake",
        handoff=base + ":handoff",
        observers=base + ":observers",
    )
