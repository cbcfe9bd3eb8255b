"""Key names. All keys of one lock share the hash tag ``{name}`` so scripts stay valid on
Redis Cluster: the tag runs from the first ``{`` to the next ``}``, both inside the shared
prefix ``fencelock:{name}``.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "fencelock:"


@dataclass(frozen=True)
class LockKeys:
    lock: str  # value = the holder's token, PX = the lease
    fence: str  # the fence register F, no TTL (a few bytes per lock name, kept on purpose)
    holder: str  # holder metadata (host, pid, purpose), same PX as the lock
    waiters: str  # set by a refused acquire: "someone is waiting", PX = the holder's lease
    wake: str  # release pushes one element here to wake one blocked waiter
    handoff: str  # set by a release that woke a waiter: newcomers step aside briefly

    @property
    def script_keys(self) -> tuple[str, str, str, str, str, str]:
        return (self.lock, self.fence, self.holder, self.waiters, self.wake, self.handoff)


def lock_keys(name: str) -> LockKeys:
    base = f"{PREFIX}{{{name}}}"
    return LockKeys(
        lock=base,
        fence=base + ":fence",
        holder=base + ":holder",
        waiters=base + ":waiters",
        wake=base + ":wake",
        handoff=base + ":handoff",
    )
