"""A Redis/Valkey Cluster as ONE server (one vote): which node a call goes to, and what a
``MOVED`` / ``ASK`` / a failed node changes (pure bookkeeping; the drivers do the I/O).

A :class:`ClusterServer` is a :class:`~fencelock._engine.server.Server` to everything that
counts votes (health, suspicion, the tally); connections go to its nodes, each a plain
:class:`Server` of its own (idle connections, script cache, identity), chosen per call by the
slot of the call's first key (all keys of one lock share a hash tag, so one slot). The slot map
is learned without a round trip of its own: a call made while the map is unknown or stale asks
``CLUSTER SLOTS`` in the same write (:attr:`MAP_REQUEST`), and a ``MOVED`` updates the slot it
names at once. A node that cannot be reached is avoided for :data:`DOWN_S` seconds: its slots
go to another node, which answers ``MOVED`` with the current owner (and the fresh map).
Every redirect costs a hop; a call takes :data:`MAX_HOPS` at the most, within its round's
budget, so nothing here can loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Final

from .address import Address
from .handshake import Identity
from .resp import ReplyError, command
from .server import Server

__all__ = [
    "ASKING",
    "BUSY_RETRY_S",
    "DOWN_S",
    "MAP_REQUEST",
    "MAX_HOPS",
    "SLOTS",
    "ClusterServer",
    "Redirect",
    "busy_slot",
    "key_slot",
    "parse_redirect",
    "parse_slots",
]

SLOTS: Final = 16384
#: Redirects (MOVED, ASK, another node after a failure) one call follows at the most.
MAX_HOPS: Final = 5
#: A node that could not be reached is not chosen for its slots for this long (s).
DOWN_S: Final = 1.0
#: A call answered ``TRYAGAIN`` / ``CLUSTERDOWN`` is sent again this long (s) later, within
#: its round's budget.
BUSY_RETRY_S: Final = 0.02
#: Sent before a call while the slot map is unknown or stale; its reply is the map.
MAP_REQUEST: Final = command("CLUSTER", "SLOTS")
#: Sent before a call redirected by ``ASK`` (its reply is ``OK``).
ASKING: Final = command("ASKING")


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str | bytes) -> int:
    """The cluster slot of ``key`` (0..16383): the CRC16 of its hash tag (the text between the
    first ``{`` and the next ``}``, when not empty) or of the whole key.

    >>> key_slot("foo"), key_slot("{foo}:bar") == key_slot("foo")
    (12182, True)
    """
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % SLOTS


@dataclass(frozen=True, slots=True)
class Redirect:
    """A ``MOVED slot host:port`` (the slot lives there now) or an ``ASK`` (this one call
    goes there, after ``ASKING``; the slot is being migrated)."""

    ask: bool
    slot: int
    host: str
    port: int


def parse_redirect(reply: object) -> Redirect | None:
    """The redirect an error reply asks for, or None (not a ``MOVED``/``ASK``, or garbled).
    An empty host (a node that does not know its own address) is returned empty."""
    if not isinstance(reply, ReplyError) or reply.kind not in ("MOVED", "ASK"):
        return None
    parts = reply.message.split()
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    host, sep, port = parts[2].rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    slot = int(parts[1])
    if slot >= SLOTS:
        return None
    return Redirect(reply.kind == "ASK", slot, host.strip("[]"), int(port))


def busy_slot(reply: object) -> bool:
    """True for a reply that says the node did not run the call because its slot cannot be
    served right now and will be soon: ``TRYAGAIN`` (a multi-key call while the slot is
    being migrated and only some of the keys have moved) or ``CLUSTERDOWN`` (the slot is
    unbound for a moment: a failover, a reshard). Such a call may be sent again: nothing of
    it ran (a reply that counted it as an answer left a released lock held)."""
    return isinstance(reply, ReplyError) and reply.kind in ("TRYAGAIN", "CLUSTERDOWN")


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def parse_slots(reply: object) -> list[tuple[int, int, str, int]] | None:
    """``CLUSTER SLOTS`` -> ``[(first, last, host, port) of the primary]``, or None when the
    reply is an error or not understood (the map is then left as it was)."""
    if not isinstance(reply, list):
        return None
    ranges: list[tuple[int, int, str, int]] = []
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3:
            return None
        first, last, primary = entry[0], entry[1], entry[2]
        if not (isinstance(first, int) and isinstance(last, int) and isinstance(primary, list)):
            return None
        if len(primary) < 2 or not isinstance(primary[1], int):
            return None
        if not 0 <= first <= last < SLOTS:
            return None
        ranges.append((first, last, _text(primary[0]), primary[1]))
    return ranges


class ClusterServer(Server):
    """A whole cluster, reached through ``seed`` (any node) with its credentials and TLS.

    - :meth:`route`: the node Server a call with these keys goes to now;
    - :meth:`redirected`: a ``MOVED``/``ASK`` reply -> the node to go to (a ``MOVED`` updates
      the map and marks it stale, so the next call also asks for the whole map);
    - :meth:`node_failed`: a node could not be reached -> avoided for a while, map stale;
    - :meth:`wants_map` / :meth:`learn_map`: whether a call should ask ``CLUSTER SLOTS``
      first, and what its reply says.

    Its ``identity`` (what independence and restart checks see) is the first node identity it
    learned, as a primary: nodes come and go by design (failover), which is neither a
    restart of the cluster nor a replica given as a Redlock node.
    """

    is_cluster = True

    def __init__(self, seed: Address) -> None:
        super().__init__(seed)
        self.name = f"cluster:{seed.host}:{seed.port}"
        self.seed = seed
        self.nodes: dict[tuple[str, int], Server] = {}
        self.slots: list[tuple[str, int] | None] = [None] * SLOTS
        self.known: list[tuple[str, int]] = [(seed.host, seed.port)]  # every node seen
        self.down: dict[tuple[str, int], float] = {}
        self.stale = True  # the next call asks for the map
        self._turn = 0
        self._map_lock = threading.Lock()
        self._seen: Identity | None = None  # the last connection identity learned

    # ---- nodes ------------------------------------------------------------------------------

    def node(self, host: str, port: int) -> Server:
        """The Server of the node at ``host:port`` (created on first use)."""
        where = (host or self.seed.host, port)
        node = self.nodes.get(where)
        if node is None:
            with self._map_lock:
                node = self.nodes.get(where)
                if node is None:
                    node = Server(replace(self.seed, host=where[0], port=where[1]))
                    self.nodes[where] = node
                    if where not in self.known:
                        self.known.append(where)
        return node

    def _usable(self, where: tuple[str, int], now: float) -> bool:
        since = self.down.get(where)
        return since is None or now - since >= DOWN_S

    def _any(self, now: float, avoid: tuple[str, int] | None = None) -> tuple[str, int]:
        """Another node, in turn, preferring those not down (all down: the next in turn)."""
        known = list(self.known)
        for step in range(len(known)):
            where = known[(self._turn + step) % len(known)]
            if where != avoid and self._usable(where, now):
                self._turn = (self._turn + step + 1) % len(known)
                return where
        self._turn = (self._turn + 1) % len(known)
        return known[self._turn % len(known)]

    def route(self, keys: tuple[str, ...]) -> Server:
        """The node a call on ``keys`` goes to: the owner of the first key's slot when known
        and not down, else another node (which redirects). No keys: any node."""
        now = time.monotonic()
        owner = self.slots[key_slot(keys[0])] if keys else None
        if owner is not None and self._usable(owner, now):
            return self.node(*owner)
        return self.node(*self._any(now, avoid=owner))

    def probe_target(self) -> Server:
        """Probes of a suspect cluster go to its nodes in turn (one of them is enough)."""
        return self.node(*self._any(time.monotonic()))

    def redirected(self, reply: object) -> tuple[Server, bool] | None:
        """For a ``MOVED`` / ``ASK`` reply: (the node to send the call to, whether ``ASKING``
        goes first); None for any other reply."""
        redirect = parse_redirect(reply)
        if redirect is None:
            return None
        node = self.node(redirect.host, redirect.port)
        if not redirect.ask:
            self.slots[redirect.slot] = (node.address.host, node.address.port)
            self.down.pop((node.address.host, node.address.port), None)
            self.stale = True
        return node, redirect.ask

    def node_failed(self, node: Server) -> None:
        """``node`` did not answer or refused: its slots go to another node for a while (which
        redirects to the current owner), and the map is asked for again."""
        self.down[(node.address.host, node.address.port)] = time.monotonic()
        self.stale = True

    def node_answered(self, node: Server) -> None:
        self.down.pop((node.address.host, node.address.port), None)

    def wants_map(self) -> bool:
        """True once per staleness: the caller asks ``CLUSTER SLOTS`` with its call."""
        if not self.stale:
            return False
        with self._map_lock:
            if not self.stale:
                return False
            self.stale = False
            return True

    def learn_map(self, reply: object) -> None:
        """A ``CLUSTER SLOTS`` reply: the whole map (an error or garbage: stale again)."""
        ranges = parse_slots(reply)
        if ranges is None:
            self.stale = True
            return
        slots: list[tuple[str, int] | None] = [None] * SLOTS
        for first, last, host, port in ranges:
            where = (host or self.seed.host, port)
            self.node(*where)
            slots[first : last + 1] = [where] * (last - first + 1)
        self.slots = slots

    # ---- one vote ---------------------------------------------------------------------------

    def learned(self, identity: Identity | None) -> None:
        if identity is None:
            return
        self.recheck = False
        if identity is self._seen:
            return
        self._seen = identity  # a connection's identity: checked once per connection
        if self.identity is not None:
            # restart_delay: a primary seen restarting (its run_id changed at its address,
            # e.g. restarted empty before a failover) may have forgotten leases of its slots;
            # the cluster is one vote, so it does not vote until that node's uptime > ttl
            restarted = [
                node.identity.restarted_at
                for node in list(self.nodes.values())
                if node.identity is not None
                and node.identity.restarted_at is not None
                and node.identity.role == "master"
            ]
            latest = max(restarted, default=None)
            known = self.identity.restarted_at
            if latest is not None and (known is None or latest > known):
                self.identity = replace(self.identity, restarted_at=latest)
            return
        # the cluster's id when the node gave it: the same cluster through two seeds is then
        # one server twice to the independence check (a ConfigError)
        who = identity.cluster_id or f"{self.name}:{identity.run_id}"
        self.identity = replace(identity, run_id=f"cluster:{who}", role="master")

    def forget_connections(self) -> list[object]:
        conns = super().forget_connections()
        for node in list(self.nodes.values()):
            conns.extend(node.forget_connections())
        return conns

    def __repr__(self) -> str:
        state = f"suspect ({self.health.reason})" if self.health.suspect else "healthy"
        return f"ClusterServer({self.name}, {len(self.known)} nodes, {state})"
