"""One server as every lock of this process sees it: health, identity, script cache, idle
connections of each front end, and the work left for the background (stragglers, repeats).

Shared by every Lock, Client and front end naming the same address (see ``registry``), so a
Lock built per key costs no connection, no identity check and no script upload of its own.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from .._core.health import Health
from .address import Address, Sentinels
from .handshake import HandshakeError, Identity
from .sentinel import find_master

#: A sentinel gets at most this long (s) to name the master (and the server timeout if shorter).
SENTINEL_TIMEOUT_S = 0.5
#: A Sentinel-managed master's address is asked again after this long (s) at the latest.
SENTINEL_RECHECK_S = 1.0
#: Late repeats queued per server at the most (older ones are dropped: their keys expire).
LATE_MAX = 10_000


@dataclass(slots=True)
class LateCall:
    """A script to repeat on this server (``Repeat`` effect): sent again once after the first
    answer, or dropped at ``until`` (monotonic s)."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    until: float
    answered: int = 0
    due: float = 0.0


def makes_suspect(exc: BaseException) -> bool:
    """Timeouts and connection failures (refused, reset) make a server suspect: asking it
    again in every round would cost every caller the same wait or the same failed connect. A
    refused handshake (a wrong password) does not, so that its error keeps showing."""
    return isinstance(exc, TimeoutError | ConnectionError) and not isinstance(exc, HandshakeError)


class Server:
    """Per-address state. Connection objects are opaque here: each driver keeps its own kind.

    - ``health``: suspect servers are skipped by rounds and probed in the background;
    - ``identity``: the last handshake's ``run_id``/role/version (None until one completed),
      with ``restarted_at`` set once a changed ``run_id`` was seen (``restart_delay``);
    - ``loaded``: SHAs of scripts known to be in the server's cache (cleared when its
      ``run_id`` changes or it answers NOSCRIPT), so a fresh server gets the full script at once.

    A Sentinel-managed master (``sentinels``) is one server whatever node leads: its
    :attr:`address` is asked of the sentinels at the first connection, and again after a
    connection failed, a READONLY reply or a handshake that found a replica (a failover).
    """

    #: True for a cluster (one vote over many nodes: a call may go to another node).
    is_cluster = False

    def __init__(self, address: Address, sentinels: Sentinels | None = None) -> None:
        self._address = address
        self.sentinels = sentinels
        # a Sentinel-managed master's address is used without asking until then (monotonic s)
        self._trusted_until = 0.0 if sentinels is not None else math.inf
        self._found_once = False
        self._doubted = False  # a connection failed since the sentinels were last asked
        self._find_lock = threading.Lock()
        self.name = address.name if sentinels is None else sentinels.name
        self.health = Health()
        self.identity: Identity | None = None
        self.loaded: set[str] = set()
        self.idle: list[Any] = []  # blocking connections not in use (list ops are atomic)
        self.async_idle: dict[int, tuple[Any, list[Any]]] = {}  # id(loop) -> (loop ref, conns)
        self.late: deque[LateCall] = deque(maxlen=LATE_MAX)
        self.lock = threading.Lock()
        self.timeout_s = 1.0  # the server timeout of the last round that found it failing
        self.recheck = True  # a new connection asks INFO/ROLE (unknown, or a failure since)

    @property
    def address(self) -> Address:
        """Where to connect now. A Sentinel-managed master is asked of the sentinels (each
        within ``min(timeout_s, 0.5)`` s) at first, after :meth:`moved`, and at most every
        ``SENTINEL_RECHECK_S`` otherwise (a failover leaves the old primary reachable, and
        a master until the sentinels reconfigure it: its connections would not fail).

        Raises:
            NoMaster: (a ConnectionError) no sentinel named the master, and the last known
                one is unknown or was found failing.
        """
        if self.sentinels is None or time.monotonic() < self._trusted_until:
            return self._address
        return self._find()

    @property
    def settled(self) -> bool:
        """False when reading :attr:`address` now would ask the sentinels (a blocking look-up
        of up to ``len(sentinels) * min(timeout_s, 0.5)`` s; the asyncio driver does it on a
        worker thread)."""
        return self.sentinels is None or time.monotonic() < self._trusted_until

    @property
    def last_address(self) -> Address:
        """The address last used (no look-up; for a Sentinel-managed master not yet found,
        a placeholder)."""
        return self._address

    def _find(self) -> Address:
        sentinels = self.sentinels
        assert sentinels is not None
        with self._find_lock:
            now = time.monotonic()
            if now < self._trusted_until:
                return self._address
            try:
                host, port = find_master(sentinels, min(self.timeout_s, SENTINEL_TIMEOUT_S))
            except ConnectionError:
                if self._doubted or not self._found_once:
                    raise
                # the sentinels are away but the master answered: keep it for now
                self._trusted_until = now + SENTINEL_RECHECK_S
                return self._address
            address = sentinels.at(host, port)
            if address != self._address:
                # another node leads: nothing known of the old one holds for it
                self._address = address
                self.identity = None
                self.loaded.clear()
                idle, self.idle = self.idle, []
                for conn in idle:  # blocking connections not in use; asyncio ones are
                    conn.close()  # replaced on their loop (their address differs)
            self._found_once = True
            self._doubted = False
            self._trusted_until = time.monotonic() + SENTINEL_RECHECK_S
            return address

    def moved(self) -> None:
        """The node we talk to may no longer lead (Sentinel-managed masters only): the next
        connection asks the sentinels again."""
        if self.sentinels is not None:
            self._trusted_until = 0.0
            self._doubted = True
            self.recheck = True

    def learned(self, identity: Identity | None) -> None:
        """A connection finished its handshake (``identity`` None when an ACL hides INFO)."""
        if identity is None:
            return
        if identity is self.identity:  # the same handshake's, learned before
            self.recheck = False
            return
        if self.sentinels is not None and identity.role != "master":
            self.moved()  # a demoted primary: not a vote of a replica, a stale address
            return
        self.recheck = False
        previous = self.identity
        if previous is not None and previous.run_id != identity.run_id:
            self.loaded.clear()  # restarted: its script cache is empty
            # when it restarted (uptime is whole seconds, so this errs late: a longer delay)
            identity = replace(identity, restarted_at=time.monotonic() - identity.uptime_s)
        elif previous is not None and previous.restarted_at is not None:
            identity = replace(identity, restarted_at=previous.restarted_at)
        self.identity = identity

    def failed(self, reason: str, timeout_s: float | None = None) -> bool:
        """A call timed out or could not connect; True when the server just became suspect.
        ``timeout_s``: the caller's server timeout (background probes wait that long)."""
        if timeout_s is not None:
            self.timeout_s = timeout_s
        self.recheck = True  # it may come back restarted: the next handshake says
        self.moved()
        with self.lock:
            return self.health.failed(time.monotonic(), reason)

    def connection_failed(self) -> None:
        """A connection broke (refused, reset): the next one checks the identity again."""
        self.recheck = True
        self.moved()

    def answered(self) -> None:
        if self.health.suspect:
            with self.lock:
                self.health.answered()

    # -- where calls go: a standalone server is its own node (a cluster overrides these) -----

    def route(self, keys: tuple[str, ...]) -> Server:
        """The Server whose connections carry a call on ``keys`` (here: this one)."""
        return self

    def probe_target(self) -> Server:
        """The Server a background probe of this one connects to (here: this one)."""
        return self

    def redirected(self, reply: object) -> tuple[Server, bool] | None:
        """Where a reply sends the call instead (a cluster's MOVED/ASK); None: nowhere."""
        return None

    def wants_map(self) -> bool:
        """True when the call should also ask for a cluster's slot map (never here)."""
        return False

    def learn_map(self, reply: object) -> None:
        """The answer to the slot map request (unused here)."""

    def node_failed(self, node: Server) -> None:
        """A node of this server failed a call (a cluster then avoids it for a while)."""

    def node_answered(self, node: Server) -> None:
        """A node of this server answered."""

    def forget_connections(self) -> list[Any]:
        """After a fork, in the child: drop every connection (returned, to be closed) and
        what the parent's background thread tended, which did not survive the fork: a
        suspicion (nothing would probe the server again here, so every round would skip it
        for good; a server still sick costs one timeout to suspect again) and the parent's
        late calls (its given-up grants, released by the parent)."""
        conns = list(self.idle)
        self.idle = []
        for _, pool in self.async_idle.values():
            conns.extend(pool)
        self.async_idle = {}
        self.lock = threading.Lock()
        self.health = Health()
        self.late.clear()
        self.recheck = True
        return conns

    def __repr__(self) -> str:
        state = f"suspect ({self.health.reason})" if self.health.suspect else "healthy"
        return f"Server({self.name}, {state})"


def unidentified(servers: tuple[Server, ...]) -> tuple[int, ...]:
    """Indexes of the servers whose identity is unknown and that are not suspect (an
    ``Identify`` effect handshakes with these)."""
    return tuple(
        index
        for index, server in enumerate(servers)
        if server.identity is None and not server.health.suspect
    )
