"""The fenced store of the simulation (``--store``): the storage a lock protects, guarded by
the library's real fence check.

The store is one more :class:`~tools.sim.server.SimServer` (the project's real Lua scripts
through the same lupa machinery), on true time, outside the faults and the network: it stands
for the data a lock guards, which the lock's servers' faults do not touch. Each holder writes
to it through a real :class:`fencelock.fence.RedisFence` (argument checks, ``fence_advance`` /
``fence_write`` scripts, reply decoding, :class:`~fencelock.StaleFence` /
:class:`~fencelock.fence.EqualFence`) whose client is replaced by :class:`SimStoreClient`,
which runs each EVALSHA/EVAL on the store at once, in the caller's step:

- when ``acquire()`` returns (the claim: ``advance`` or ``write``, drawn from a stream of
  the store's own), and
- when the holder's work is over, just before its release (the late write: a holder that
  overran its lease, was paused, or whose keys expired early across a broken clock bound
  still believes it holds).

The writes take no step, no message and no draw from the world's streams: a schedule with the
store runs the same steps as without it. Every attempt goes to ``history.store_writes``; the
checker :func:`guard_refuses_older_writer` reads them. Lease kinds written: a Lock's, a fair
Lock's, a MultiLock's keys (kind ``"lock"``/``"fair"``; a Semaphore's slots, an RWLock's and
an election's leases are left out: their fences are not per resource).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from .world import Grant, History, World

#: The lease kinds whose holders write to the store (see the module docstring).
STORE_KINDS = frozenset({"lock", "fair"})


@dataclass
class StoreWrite:
    """One write attempt on the store, in the order the store ran them."""

    at: float  # true time
    client: str
    resource: str
    fence: int
    token: str
    op: str  # "advance" (the claim), "write" (the claim or the late write)
    when: str  # "claim" or "late"
    accepted: bool
    current: int  # the fence the store held after it (refused: the one that refused it)


class SimStoreClient:
    """What :class:`~fencelock.fence.RedisFence` calls on its client (``evalsha``, ``eval``),
    run on a :class:`~tools.sim.server.SimServer` at once; errors as redis-py raises them."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.session = server.connect()

    def _call(self, *args: Any) -> Any:
        server = self.server
        server._now_ms = server._ms()
        reply = server._execute(self.session, [_arg(a) for a in args])
        return _reply(reply)

    def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:
        return self._call(b"EVALSHA", sha, numkeys, *args)

    def eval(self, source: bytes, numkeys: int, *args: Any) -> Any:
        return self._call(b"EVAL", source, numkeys, *args)

    def close(self) -> None:
        self.session.close()


def _arg(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


def _reply(reply: Any) -> Any:
    from .resp import Err

    if isinstance(reply, Err):
        if reply.message.startswith("NOSCRIPT"):
            raise redis.exceptions.NoScriptError(reply.message)
        raise redis.exceptions.ResponseError(reply.message)
    if isinstance(reply, list):
        return [_reply(r) for r in reply]
    return reply


class Store:
    """The world's fenced store (see the module docstring)."""

    def __init__(self, world: World) -> None:
        from fencelock.fence import RedisFence

        from .server import SimServer
        from .world import ServerClock

        self.world = world
        self.server = SimServer(clock=ServerClock(world.clock), seed=world.seed * 131 + 977)
        # (a URL only builds a pool: nothing connects; the client is then the store's)
        self.fence = RedisFence("redis://127.0.0.1:1")
        self.fence.client = SimStoreClient(self.server)  # type: ignore[assignment]
        self.rng = random.Random(world.seed * 7919 + 5)  # the store's own stream

    def claim(self, grant: Grant) -> None:
        """``acquire()`` returned ``grant``: its holder claims the resource."""
        if grant.kind in STORE_KINDS and not grant.key.startswith("sem/"):
            op = "advance" if self.rng.random() < 0.5 else "write"
            self._attempt(grant, op, "claim")

    def late_write(self, grant: Grant) -> None:
        """``grant``'s holder is done and writes its result, whatever became of its lease."""
        if grant.kind in STORE_KINDS and not grant.key.startswith("sem/"):
            self._attempt(grant, "write", "late")

    def _attempt(self, grant: Grant, op: str, when: str) -> None:
        from fencelock import StaleFence

        world = self.world
        key, fence, token = grant.key, grant.fence, grant.token
        try:
            if op == "advance":
                current = self.fence.advance(key, fence, token=token)
            else:
                self.fence.write(key, fence, f"{grant.client} {when}", token=token)
                current = fence
            accepted = True
        except StaleFence as exc:
            accepted, current = False, exc.current
        world.history.store_writes.append(
            StoreWrite(
                world.clock.now, grant.client, key, fence, token, op, when, accepted, current
            )
        )
        verdict = "accepted" if accepted else f"REFUSED (store holds {current})"
        world.note(f"store: {grant.client} {op} {key} fence {fence} ({when}): {verdict}")


def _window(grant: Grant) -> tuple[float, float]:
    end = grant.deadline if grant.ended is None else min(grant.deadline, grant.ended)
    return grant.at, end


def _store_grants(history: History) -> dict[str, list[Grant]]:
    by_key: dict[str, list[Grant]] = {}
    for g in history.grants:
        if g.kind in STORE_KINDS and not g.key.startswith("sem/"):
            by_key.setdefault(g.key, []).append(g)
    return by_key


def overlapping_pairs(history: History) -> list[tuple[Grant, Grant]]:
    """(older fence, newer fence) pairs of one resource's leases valid at the same true time
    (the cases ``mutual_exclusion`` tolerates: a broken clock bound, a wiped restart)."""
    pairs: list[tuple[Grant, Grant]] = []
    for grants in _store_grants(history).values():
        for i, a in enumerate(grants):
            a_start, a_end = _window(a)
            for b in grants[i + 1 :]:
                b_start, b_end = _window(b)
                if a.fence == b.fence or a_end <= b_start or b_end <= a_start:
                    continue
                pairs.append((a, b) if a.fence < b.fence else (b, a))
    return pairs


def guard_refuses_older_writer(history: History) -> list[str]:
    """The store's history is as if serialised by fence:

    - every verdict is the guard's rule (accepted iff the fence is newer than the one held, or
      equal and offered with the token held beside it), on the store's own log;
    - the accepted fences of a resource never go back, and an equal one is the same lease's;
    - of two leases valid at the same true time (clock bound broken, wiped restart), every
      write accepted from the older fence came before the first accepted from the newer.
    """
    found: list[str] = []
    held: dict[str, tuple[int, str]] = {}
    for w in history.store_writes:
        fence, token = held.get(w.resource, (0, ""))
        expected = w.fence > fence or (w.fence == fence and w.token == token)
        if expected != w.accepted:
            what = "accepted" if w.accepted else "refused"
            found.append(
                f"{w.resource}: the store {what} {w.client}'s {w.op} with fence {w.fence} "
                f"while it held {fence} (at {w.at - 1000:.4f})"
            )
        if w.accepted:
            if w.fence < fence or (w.fence == fence and w.token != token):
                found.append(f"{w.resource}: accepted fence {w.fence} ({w.client}) after {fence}")
            held[w.resource] = (w.fence, w.token)
    accepted: dict[str, list[tuple[int, StoreWrite]]] = {}
    for i, w in enumerate(history.store_writes):
        if w.accepted:
            accepted.setdefault(w.token, []).append((i, w))
    for older, newer in overlapping_pairs(history):
        first_newer = min((i for i, _ in accepted.get(newer.token, [])), default=None)
        if first_newer is None:
            continue
        for i, w in accepted.get(older.token, []):
            if i > first_newer:
                found.append(
                    f"{w.resource}: {older.client} (fence {older.fence}) wrote at "
                    f"{w.at - 1000:.4f} after {newer.client} (fence {newer.fence}) had, "
                    "their leases overlapping"
                )
    return found


def refused_in_overlap(history: History) -> list[StoreWrite]:
    """The refused writes of the older lease of two that overlapped in true time (the store
    doing the job the lock could not)."""
    older = {a.token for a, _ in overlapping_pairs(history)}
    return [w for w in history.store_writes if not w.accepted and w.token in older]
