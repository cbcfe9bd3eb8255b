"""The simulated world of one schedule: servers, a network, client processes, faults, and the
history the checkers read. Everything follows from one seed.

- **Servers**: :class:`~tools.sim.server.SimServer` (the project's real Lua scripts), each on
  its own clock (true time plus an offset); crash (data kept or wiped), restart, pause.
- **Network**: one in-memory connection per client connection; each direction keeps its
  order (it is TCP) with a seeded delay per message; faults: a reset at any moment, a reply
  dropped after the server ran the request (then a reset), a request lost (then a reset: see
  :attr:`World.cut`).
- **Clients**: the real asyncio front end (``fencelock.asyncio``) through its public API,
  each job on a new event loop (``asyncio.run()`` per job), many tasks per loop sharing its
  connections; only the transport (``create_connection``) and the clocks are replaced.
- **Scheduler**: the next event in virtual time runs; events due at the same instant run in
  an order drawn from the seed.

The history: every grant (token, fence, when it returned, its local deadline), every
release (when it started, its outcome), every error; the checkers are in
:mod:`tools.sim.checkers`.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import math
import random
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .loop import Clock, SimLoop, patched_time
from .server import SimServer, SimSession, ZSet

PORT = 7000

FAULT_KINDS = (
    "crash_wiped",
    "crash_kept",
    "pause_server",
    "reset_connection",
    "drop_reply",
    "delay_spike",
    "pause_client",
    "script_flush",
    "clock_skew",
    "clock_break",
    "slow_round",
    "crash_pair",
)

#: The library's drift allowance (the defaults: ``ttl * DRIFT_FACTOR + DRIFT_MIN_S``): server
#: clock rates and forward jumps the world draws under "clock_skew" stay inside it (a key can
#: then not expire, on true time, before the local deadline of the lease it carries);
#: "clock_break" jumps past it (the checkers then tolerate what that breaks, and only that).
DRIFT_FACTOR = 0.01
DRIFT_MIN_S = 0.002
MAX_RATE = 0.0085  # a server clock runs at most this much fast (or slow) relative to true time
GRANULARITY_S = 0.0011  # server expiry is in whole ms (and our floor of it)
# Server clocks agree within this (NTP): more, with a wiped restart in a majority's
# intersection, and a fence can go back (DESIGN.md "Where it can still fail"; restart_delay,
# a lease long, covers less than that)
MAX_OFFSET_S = 0.5
MIN_EXTEND = 0.2  # users' extends ask for 0.2-1.5 ttl (workloads.py)


@dataclass
class Grant:
    client: str
    key: str
    token: str
    fence: int
    at: float  # true time acquire() returned
    deadline: float  # the lease's local deadline (the clients' clocks are true time)
    ended: float | None = None  # true time its release started (or it was found lost)
    release: str | None = None  # "ok", "LockLost", "Unavailable", ...
    lost_reason: str | None = None
    start: float = 0.0  # true time its winning round started (the lease counts from there)
    lease: Any = field(default=None, repr=False, compare=False)  # the live Lease, while held
    extending: bool = False  # a user's extend is in flight (its new ttl may be on the keys)
    returned_deadline: float = 0.0  # the lease's local deadline when acquire() returned
    asked: float = 0.0  # true time acquire() was called (a MultiLock's refreshed keys'
    # acquired_at is their last refresh: their rounds ran between this and then)
    kind: str = "lock"  # "lock" (a Lock, a permit, a MultiLock's key), "fair", "read",
    # "write" (an RWLock's leases), "election" (a term), "compat" (fencelock.compat's
    # redis-py shape: its key is its name, see server_key)


def server_key(grant: Grant) -> bytes:
    """The key on the servers that holds ``grant``'s token: ``fencelock:{<key>}``, or for a
    compat lock (kind ``"compat"``) its name itself, where redis-py keeps it."""
    if grant.kind == "compat":
        return grant.key.encode()
    return f"fencelock:{{{grant.key}}}".encode()


@dataclass
class Loss:
    """A lease reported lost (its ``on_lost`` callbacks ran at ``at``, true time)."""

    client: str
    key: str
    token: str
    at: float
    reason: str
    deadline: float  # the lease's local deadline then (true time: the clients' clocks are)
    granted: float = 0.0  # when its acquire() returned
    # servers on which its key held its token, unexpired, at ``at``, and on which no script
    # that may write the key (any but extend or release) ran with the token after the grant:
    # so they held it since before the grant returned, and answered "ours" to any extend
    held: int = 0


@dataclass
class History:
    grants: list[Grant] = field(default_factory=list)
    refusals: int = 0  # NotAcquired
    unavailable: int = 0
    errors: list[str] = field(default_factory=list)  # unexpected exceptions
    faults: dict[str, int] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    liveness: list[str] = field(default_factory=list)  # keys not acquirable after healing
    ghosts: list[str] = field(default_factory=list)  # keys held by nobody past the window
    # waiter ids still registered past the window after their lease's confirmed release
    registrations: list[str] = field(default_factory=list)
    servers: int = 1
    wiped_at: list[float] = field(default_factory=list)  # true times of wiped crashes
    wiped: list[tuple[float, int]] = field(default_factory=list)  # (true time, server index)
    # (process, server index) -> true time the process first connected to the server (a
    # forked child's are its parent's at the fork): restart_delay knows only the restarts of
    # servers a process saw before them (docs/deploying.md)
    contacts: dict[tuple[str, int], float] = field(default_factory=dict)
    restarted_at: list[float] = field(default_factory=list)  # true times of every restart
    unapplied: list[str] = field(default_factory=list)  # confirmed releases still on a server
    # (start, end) true times of every fault that can delay, lose or break messages or
    # servers (not SCRIPT FLUSH nor in-bound clock skew: the library must absorb those)
    fault_windows: list[tuple[float, float]] = field(default_factory=list)
    clock_breaks: list[float] = field(default_factory=list)  # out-of-bound clock jumps (true t)
    client_pauses: list[tuple[float, float]] = field(default_factory=list)  # pause_client's
    landed: list[set[bytes]] = field(default_factory=list)  # per server: acquire tokens run
    outlived: list[str] = field(default_factory=list)  # valid leases without a key majority
    ttl: float = 0.0
    limit: int = 0  # the semaphore's (grants of key "sem/slot<i>")
    permits_refused: list[tuple[str, float, float]] = field(default_factory=list)  # who, from, to
    permit_attempts: list[tuple[str, float, float]] = field(default_factory=list)  # every ask
    acquire_sha: bytes = b""
    # ... and the family's acquire scripts (each takes the token as ARGV[1], as acquire does)
    acquire_shas: frozenset[bytes] = frozenset()
    plan: list[tuple[float, str, bool]] = field(default_factory=list)  # (when, kind, kept)
    # cancellations the "cancel_task" fault made: (true time, task, what it was doing, the
    # innermost frame of the await it was at)
    cancels: list[tuple[float, str, str, str]] = field(default_factory=list)
    # script calls made with a grant's token by a process other than the grant's (a forked
    # child's use of an inherited lease: tools/sim/fork.py)
    foreign: list[str] = field(default_factory=list)
    # the fenced store's write attempts, in the order it ran them (``--store``: tools/sim/store.py)
    store_writes: list[Any] = field(default_factory=list)
    # every loss a lease reported (its on_lost callbacks ran): ``honest_loss`` reads them
    losses: list[Loss] = field(default_factory=list)
    # every Lock/MultiLock acquire on a lock key: (who, key, asked, returned) true times; and
    # a Lock's acquire() that raised NotAcquired: (who, key, asked, refused) (``lock_when_free``)
    lock_attempts: list[tuple[str, str, float, float]] = field(default_factory=list)
    locks_refused: list[tuple[str, str, float, float]] = field(default_factory=list)
    # every RWLock acquire, a reader's or a writer's: (who, asked, returned) true times; and
    # each one refused (NotAcquired, or a try's None): (who, "read" or "write", one attempt,
    # asked, refused) (``rw_when_free``)
    rw_attempts: list[tuple[str, float, float]] = field(default_factory=list)
    rw_refused: list[tuple[str, str, bool, float, float]] = field(default_factory=list)

    def quiet(self, since: float, until: float) -> bool:
        """No fault window meets [since, until]."""
        return not any(s <= until and e >= since for s, e in self.fault_windows)

    def client_paused(self, since: float, until: float) -> bool:
        return any(s <= until and e >= since for s, e in self.client_pauses)

    def clock_broken(self, since: float, until: float) -> bool:
        return any(since <= t <= until for t in self.clock_breaks)


class _Ran(set[tuple[bytes, bytes]]):
    """A server's record of the scripts it ran ((sha, ARGV[1])), with when each last ran
    (true time) in ``last``, one dict per server."""

    def __init__(self, clock: Clock, every: list[dict[bytes, dict[bytes, float]]]) -> None:
        super().__init__()
        self.clock = clock
        self.last: dict[bytes, dict[bytes, float]] = {}  # ARGV[1] -> sha -> when it last ran
        every.append(self.last)

    def add(self, item: tuple[bytes, bytes]) -> None:
        super().add(item)
        self.last.setdefault(item[1], {})[item[0]] = self.clock.now


class ServerClock:
    """A server's clock: true time at ``rate`` (1 + drift) from an offset, plus jumps."""

    __slots__ = ("anchor_server", "anchor_true", "rate", "true")

    def __init__(self, true: Clock, offset: float = 0.0, rate: float = 1.0) -> None:
        self.true = true
        self.anchor_true = true.now
        self.anchor_server = true.now + offset
        self.rate = rate

    def __call__(self) -> float:
        return self.anchor_server + (self.true.now - self.anchor_true) * self.rate

    def to_true(self, server_time: float) -> float:
        """The true time at which this clock reads ``server_time`` (no jump in between)."""
        return self.anchor_true + (server_time - self.anchor_server) / self.rate

    def jump(self, seconds: float) -> None:
        self.anchor_server += seconds


class _Conn:
    """One client connection: the client's protocol on its loop, the server's session."""

    __slots__ = (
        "closed",
        "down_at",
        "draining",
        "drop_next",
        "id",
        "loop",
        "protocol",
        "server",
        "session",
        "up_at",
    )  # fmt: skip

    def __init__(
        self, cid: int, loop: SimLoop, protocol: asyncio.Protocol, server: int, session: SimSession
    ) -> None:
        self.id = cid
        self.loop = loop
        self.protocol = protocol
        self.server = server
        self.session = session
        self.closed = False
        # the client closed it, and request bytes it wrote before are still on their way:
        # they reach the server before it sees the close (Config.drain_on_close)
        self.draining = False
        self.up_at = 0.0  # when the last request byte reaches the server (order kept)
        self.down_at = 0.0  # when the last reply byte reaches the client
        self.drop_next = False  # the next reply is lost, then the connection reset


class RandomChooser:
    """Where the world makes an ordering choice, the swarm draws it from the seed's stream
    (``world.rng``), as it always did: which of the events due at one instant goes first, and
    each message's network delay. :mod:`tools.sim.enumerate` has the other chooser, which
    enumerates them (and a message's loss) instead."""

    __slots__ = ("rng",)

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def tie(self, world: World, due: list[Callable[[], None]]) -> int:
        """Which of ``due`` (two or more, due at the same instant) runs first."""
        return self.rng.randrange(len(due))

    def delay(self, top: float) -> float:
        """A network delay (a handshake's, a reset's) when delays are up to ``top``."""
        return self.rng.uniform(0.0001, top)

    def message(self, world: World, conn: _Conn, kind: str) -> float | None:
        """The delay of the next message on ``conn`` (``kind``: "request" or "reply"), or
        None: it is lost (then the connection is reset)."""
        return world._delay()


class _Transport(asyncio.Transport):
    def __init__(self, world: World, conn: _Conn) -> None:
        super().__init__()
        self._world = world
        self._conn = conn

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._conn.closed:
            self._world._send_up(self._conn, bytes(data))

    def is_closing(self) -> bool:
        return self._conn.closed

    def close(self) -> None:
        self._world._close(self._conn, by_client=True)

    def abort(self) -> None:
        self._world._close(self._conn, by_client=True)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0


@dataclass
class Config:
    servers: int = 3
    clients: int = 3  # client processes; each runs jobs one after another, a new loop each
    tasks: int = 2  # concurrent tasks per job (sharing the job's loop and connections)
    jobs: int = 4  # jobs per client process
    keys: int = 1
    ttl: float = 2.0
    server_timeout: float = 0.2
    wait: float = 1.5
    hold_max: float = 0.6
    renew: bool = False
    overrun: float = 0.0  # the share of holds that run past the lease (no renewal)
    extends: bool = False  # holds extend their lease to a new ttl now and then
    # ... also while keep_alive renews it (off: a user's extend racing a renewal leaves the
    # local deadline of whichever verdict came back last, seed 291; reported, see testing.md)
    extend_while_renewing: bool = False
    primitives: tuple[str, ...] = ("lock",)  # what the tasks take (each task draws one)
    limit: int = 2  # a Semaphore's permits
    job_gap: float = 0.0  # a client process idles up to this long (s) between two jobs
    faults: tuple[str, ...] = FAULT_KINDS
    fault_count: int = 4
    net_delay_max: float = 0.004
    duration: float = 12.0  # virtual seconds of faults and workload at the most
    max_steps: int = 200_000
    # the planned faults (by index in the seed's plan) that are injected; None: all of them
    # (a shrunk schedule keeps some: tools/sim/shrink.py)
    keep_faults: tuple[int, ...] | None = None
    # "cancel_task" faults (a client task cancelled at whatever await it is at), planned
    # after the others (their indices in the plan follow fault_count's) from a random stream
    # of their own: a schedule without them is the schedule it was before them
    cancels: int = 0
    # "fork_client" faults (a client process forks: tools/sim/fork.py), planned after the
    # cancellations from a random stream of their own
    forks: int = 0
    # "interrupt" faults (the sync front: tools/sim/sync_front.py), planned after the
    # cancellations from a stream of their own
    interrupts: int = 0
    # the fenced store (tools/sim/store.py): holders write to it through the real guard; it
    # takes no step nor draw of the world's, so the schedule is the same with it
    store: bool = False
    # a connection the client closes (a timed-out request's, a reset pool's, a cancelled
    # call's) still delivers the request bytes written before the close, as TCP does (they go
    # before the FIN): the server runs them and then sees the close. Off: they are dropped at
    # the close (every seed's schedule as it was before the option)
    drain_on_close: bool = False


#: The engine's process-wide state (module globals): each client process of the world has its
#: own, swapped in whenever one of its loops runs (one Python process hosts them all).
PROCESS_STATE = (
    ("fencelock._engine.registry", "_servers"),
    ("fencelock._engine.registry", "_clusters"),
    ("fencelock._engine.registry", "_by_url"),
    ("fencelock._engine.registry", "_by_sentinels"),
    ("fencelock._frontend.fronts", "_definitions"),
    ("fencelock._frontend.reentry", "_entries"),
)


class World:
    def __init__(self, seed: int, config: Config) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(seed)
        self.chooser: Any = RandomChooser(self.rng)  # the ordering choices (RandomChooser's)
        self.clock = Clock()
        self.history = History(servers=config.servers)
        self.history.ttl = config.ttl
        self.history.limit = config.limit
        skew = "clock_skew" in config.faults
        clock_rng = random.Random(seed * 31 + 7)
        self.clocks = [
            ServerClock(
                self.clock,
                offset=clock_rng.uniform(-MAX_OFFSET_S, MAX_OFFSET_S) if skew else 0.0,
                rate=1.0 + (clock_rng.uniform(-MAX_RATE, MAX_RATE) if skew else 0.0),
            )
            for _ in range(config.servers)
        ]
        # what in-bound forward jumps may still take from each server (see DRIFT_FACTOR),
        # for the shortest lease in use (users' extends go down to a fifth of the ttl: a
        # jump the ttl's allowance covers did not fit one of those, seed 12841)
        shortest = config.ttl * (MIN_EXTEND if config.extends else 1.0)
        allowance = shortest * DRIFT_FACTOR + DRIFT_MIN_S
        self.jump_budget = [
            max(0.0, allowance - max(0.0, c.rate - 1.0) * shortest - GRANULARITY_S)
            for c in self.clocks
        ]
        self.servers = [
            SimServer(clock=self.clocks[i], seed=seed * 131 + i) for i in range(config.servers)
        ]
        from fencelock._scripts import BY_NAME

        self.history.acquire_sha = BY_NAME["acquire"].sha.encode()
        self.history.acquire_shas = frozenset(
            BY_NAME[name].sha.encode()
            for name in ("acquire", "fair_acquire", "rw_read_acquire", "rw_write_acquire")
        )
        self._ran_at: list[dict[bytes, dict[bytes, float]]] = []
        # token -> the waiter id its acquire carried (``no_stale_registration``): a Lock's, a
        # permit's, a reader's, a writer's (a fair lock waits in a queue of its own)
        self._waiter_ids: dict[bytes, bytes] = {}
        waiter_shas = frozenset(
            BY_NAME[name].sha.encode()
            for name in ("acquire", "sem_acquire", "rw_read_acquire", "rw_write_acquire")
        )
        for server in self.servers:
            server.ran = _Ran(self.clock, self._ran_at)
            server.waiter_shas = waiter_shas
            server.waiter_ids = self._waiter_ids
            server.true_now = lambda: self.clock.now
        self.paused: list[float] = [0.0] * config.servers  # paused until (true time)
        self._pending_up: list[list[tuple[_Conn, bytes]]] = [[] for _ in self.servers]
        self.conns: list[_Conn] = []
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.loops: list[SimLoop] = []
        self.steps = 0
        self.urls = [f"redis://127.0.0.1:{PORT + i}" for i in range(config.servers)]
        self.spike_until = 0.0  # a delay spike: messages take up to spike_max until then
        self.spike_max = 0.0
        self.last_fault = 0.0  # true time the last fault ended (the key watch waits past it)
        self._seen: dict[tuple[int, bytes, bytes], float] = {}
        self._registered: set[tuple[int, bytes, bytes]] = set()  # stale ones reported
        self._reported: set[tuple[bytes, bytes]] = set()
        self.watching = False
        self.process = ""  # whose engine state the modules hold now ("": the host's)
        self._states: dict[str, list[Any]] = {}
        import importlib

        self._state_slots = [(importlib.import_module(m), a) for m, a in PROCESS_STATE]
        self.busy: dict[str, int] = {}  # lock keys a MultiLock acquire() is taking now
        self.busy_until: dict[str, float] = {}  # ... and when the last such ended
        self.slow_rounds = 0  # armed "slow_round" faults (they bite on the next reply)
        # (client process, server) pairs cut apart: a request sent on such a connection is
        # lost and the connection reset; a new connection is refused
        self.cut: set[tuple[str, int]] = set()
        self.dead: set[str] = set()  # client processes killed (kill -9): nothing of theirs runs
        # the workload's tasks running now (by name, in the order they started), what each is
        # doing ("acquire lock", "hold", "extend", "release", ...), and those a "cancel_task"
        # fault cancelled (their CancelledError is the fault's, not the job's end)
        self.running: dict[str, asyncio.Task[Any]] = {}
        self.phase: dict[str, str] = {}
        self.cancelled: set[str] = set()
        # "cancel_task": when, and which task, from a stream of its own (not self.rng)
        self.cancel_rng = random.Random(seed * 7919 + 13)
        self.workload_over = False  # every client process ran its jobs
        # called as hook(old, new) when the engine state changes process (tools/sim/fork.py),
        # and at the end of the schedule (undo what was patched for it)
        self.on_switch: list[Callable[[str, str], None]] = []
        self.cleanups: list[Callable[[], None]] = []
        self.forks: Any = None  # the schedule's fork fault (tools/sim/fork.py), if any
        self.store: Any = None  # the fenced store (tools/sim/store.py), with config.store
        if config.store:
            from .store import Store

            self.store = Store(self)

    # -- clocks and events ------------------------------------------------------------------

    def enter(self, loop: SimLoop) -> None:
        """Make ``loop``'s process the current one: its engine state in the modules."""
        self.switch(loop.process)

    def switch(self, process: str) -> None:
        if process == self.process:
            return
        slots = self._state_slots
        self._states[self.process] = [getattr(module, attr) for module, attr in slots]
        state = self._states.get(process)
        for i, (module, attr) in enumerate(slots):
            setattr(module, attr, state[i] if state is not None else type(getattr(module, attr))())
        old, self.process = self.process, process
        for hook in self.on_switch:
            hook(old, process)

    def add_loop(self, loop: SimLoop) -> None:
        loop.enter = self.enter
        self.loops.append(loop)

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, action))

    def lease_lost(self, grant: Grant, lease: Any) -> None:
        """A lease's ``on_lost`` callback: record the loss with what the servers hold now
        (``honest_loss``). Call it from the callback (each granted() of a workload does)."""
        from fencelock._scripts import BY_NAME

        names = ("extend", "rw_read_extend", "release", "fair_release", "fair_leave")
        names += ("rw_read_release", "rw_write_release")
        quiet_shas = {BY_NAME[name].sha.encode() for name in names}
        now = self.clock.now
        key = server_key(grant)
        token = grant.token.encode()
        held = 0
        for index, server in enumerate(self.servers):
            if _token_of(server.data.get(key)) != token:
                continue
            expiry = server.expires.get(key)
            if expiry is not None and expiry <= math.floor(self.clocks[index]() * 1000.0):
                continue
            ran = self._ran_at[index].get(token, {})
            if any(t >= grant.at and sha not in quiet_shas for sha, t in ran.items()):
                continue
            held += 1
        self.history.losses.append(
            Loss(
                grant.client,
                grant.key,
                grant.token,
                now,
                str(lease.lost_reason),
                float(lease.deadline),
                grant.at,
                held,
            )
        )

    def note(self, text: str) -> None:
        if len(self.history.trace) < 5000:
            self.history.trace.append(f"{self.clock.now - 1000.0:9.4f} {text}")

    def _delay(self) -> float:
        top = self.spike_max if self.clock.now < self.spike_until else self.config.net_delay_max
        return self.chooser.delay(top)  # type: ignore[no-any-return]

    # -- the network ------------------------------------------------------------------------

    async def connect(
        self, loop: SimLoop, factory: Callable[[], asyncio.Protocol], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        index = port - PORT
        await asyncio.sleep(self._delay())  # the handshake's round trip
        server = self.servers[index]
        if not server.up:
            raise ConnectionRefusedError(f"sim{index} is down")
        if (loop.process, index) in self.cut or loop.process in self.dead:
            raise ConnectionRefusedError(f"sim{index} is cut off from {loop.process}")
        protocol = factory()
        conn = _Conn(len(self.conns), loop, protocol, index, server.connect())
        self.conns.append(conn)
        self.history.contacts.setdefault((loop.process, index), self.clock.now)
        transport = _Transport(self, conn)
        protocol.connection_made(transport)
        return transport, protocol

    def _send_up(self, conn: _Conn, data: bytes) -> None:
        cut = bool(self.cut) and (conn.loop.process, conn.server) in self.cut
        delay = None if cut else self.chooser.message(self, conn, "request")
        if delay is None:
            # the request is lost on its way (it never reaches the server), then the link
            # is reset: the client cannot tell it from a reply lost after the server ran it
            why = "cut off" if cut else "lost"
            self.note(f"lose request on conn {conn.id} (sim{conn.server}, {why})")
            self._fault_until(self.clock.now)
            faults = self.history.faults
            faults["lost_request"] = faults.get("lost_request", 0) + 1
            self.at(self.clock.now + self._delay(), lambda: self._reset(conn))
            return
        conn.up_at = max(conn.up_at, self.clock.now + delay)
        self.at(conn.up_at, lambda: self._arrive_up(conn, data))

    def _arrive_up(self, conn: _Conn, data: bytes) -> None:
        if conn.closed and not conn.draining:
            return
        index = conn.server
        if self.paused[index] > self.clock.now:
            self._pending_up[index].append((conn, data))
            return
        conn.session.feed(data)
        self._flush(index)

    def _flush(self, index: int) -> None:
        for conn in self.conns:
            if conn.server != index or conn.closed:
                continue
            out = conn.session.take_output()
            if not out:
                continue
            if conn.drop_next:  # the server ran it; the reply is lost and the link reset
                conn.drop_next = False
                self.note(f"drop reply on conn {conn.id} (sim{index})")
                self._fault_until(self.clock.now + 0.5)
                self._reset(conn)
                continue
            delay = self.chooser.message(self, conn, "reply")
            if delay is None:  # (the enumeration's choice) as drop_next: the link reset
                self.note(f"drop reply on conn {conn.id} (sim{index})")
                self._fault_until(self.clock.now + 0.5)
                faults = self.history.faults
                faults["drop_reply"] = faults.get("drop_reply", 0) + 1
                self._reset(conn)
                continue
            conn.down_at = max(conn.down_at, self.clock.now + delay)
            self.at(conn.down_at, lambda c=conn, o=out: self._arrive_down(c, o))

    def _arrive_down(self, conn: _Conn, data: bytes) -> None:
        if conn.closed or conn.loop.is_closed():
            return
        if self.slow_rounds and conn.loop.paused_until <= self.clock.now:
            # the process stops (GC, SIGSTOP) just as this reply comes: whatever round it
            # ends reads it about a lease late, within the drift allowance of the lease's end
            self.slow_rounds -= 1
            ttl = self.config.ttl
            drift = ttl * DRIFT_FACTOR + DRIFT_MIN_S
            pause = ttl - drift + self.rng.uniform(0.0, drift - 0.008)
            conn.loop.paused_until = self.clock.now + pause
            self._fault_until(conn.loop.paused_until)
            self.note(f"slow round: {conn.loop.name} stops for {pause:.4f} s as a reply comes")
        conn.loop.call_soon(conn.protocol.data_received, data)

    def _close(self, conn: _Conn, *, by_client: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        if by_client:
            self._closed_by_client(conn)
        else:
            conn.session.close()
        if not conn.loop.is_closed():
            conn.loop.call_soon(conn.protocol.connection_lost, None)

    def _closed_by_client(self, conn: _Conn) -> None:
        """The server's side of a close by the client (its process may be gone: ``kill``)."""
        if self.config.drain_on_close and conn.up_at > self.clock.now:
            conn.draining = True
            self.note(f"close conn {conn.id} (sim{conn.server}) with requests on their way")
            self.at(conn.up_at, lambda: self._drained(conn))
        else:
            conn.session.close()

    def _drained(self, conn: _Conn) -> None:
        """The last request byte a closed connection had on its way has reached the server
        (it arrives first: scheduled earlier for the same time); a paused server reads the
        close after what it has not read yet (``_resume``)."""
        if not conn.draining or any(c is conn for c, _ in self._pending_up[conn.server]):
            return
        conn.draining = False
        conn.session.close()

    def _reset(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.session.close()
        if not conn.loop.is_closed():
            conn.loop.call_soon(
                conn.protocol.connection_lost, ConnectionResetError("simulated reset")
            )

    # -- servers ----------------------------------------------------------------------------

    def crash(self, index: int, *, wipe: bool, down_s: float) -> None:
        self.note(f"crash sim{index} ({'wiped' if wipe else 'kept'}), back in {down_s:.3f} s")
        if wipe:
            self.history.wiped_at.append(self.clock.now)
            self.history.wiped.append((self.clock.now, index))
        for conn in self.conns:
            if conn.server == index:
                conn.draining = False  # what was on its way to the crashed server is lost
                self._reset(conn)
        self.servers[index].crash(wipe=wipe)
        self._pending_up[index].clear()
        self.at(self.clock.now + down_s, lambda: self._restart(index))

    def _restart(self, index: int) -> None:
        self.note(f"restart sim{index}")
        self.history.restarted_at.append(self.clock.now)
        self.servers[index].restart()

    def kill(self, process: str) -> None:
        """``kill -9`` of a client process: its connections close (the servers see them go),
        its loops stop, and its background work (the repeats of releases whose answer did not
        come) dies with it: what it left on the servers stays until it expires."""
        self.note(f"kill client process {process}")
        self.dead.add(process)
        faults = self.history.faults
        faults["kill_client"] = faults.get("kill_client", 0) + 1
        for conn in self.conns:
            if conn.loop.process == process and not conn.closed:
                conn.closed = True
                self._closed_by_client(conn)
        for loop in self.loops:
            if loop.process == process and not loop.is_closed():
                _close_loop(loop)

    def pause(self, index: int, for_s: float) -> None:
        self.note(f"pause sim{index} for {for_s:.3f} s")
        self.paused[index] = self.clock.now + for_s
        self.at(self.paused[index], lambda: self._resume(index))

    def _resume(self, index: int) -> None:
        if self.paused[index] > self.clock.now:
            return
        pending, self._pending_up[index] = self._pending_up[index], []
        for conn, data in pending:
            if not conn.closed or conn.draining:
                conn.session.feed(data)
        self.servers[index].advance()
        for conn, _ in pending:
            if conn.up_at <= self.clock.now:
                self._drained(conn)
        self._flush(index)

    # -- the scheduler ----------------------------------------------------------------------

    def _candidates(self) -> tuple[float, list[Callable[[], None]]] | None:
        # the hot loop of the scheduler: candidates in a fixed order (events, loops, servers),
        # the earliest kept, ties (within 1e-12 s) all kept in that order
        best: float | None = None
        due: list[Callable[[], None]] = []
        if self._events:
            best = self._events[0][0]
            due = [self._pop_event]
        for loop in self.loops:
            when = loop.next_at()
            if when is None:
                continue
            if best is None or when < best - 1e-12:
                best, due = when, [loop.step]
            elif when - best <= 1e-12:
                due.append(loop.step)
        for index, server in enumerate(self.servers):
            if not server._waiting or not server.up or self.paused[index] > self.clock.now:
                continue  # (no blocked command: no timer)
            timer = server.next_timer_at()
            if timer is None:
                continue
            # (1 us late: the server's clock must read the timer's ms, whatever the rounding)
            when = self.clocks[index].to_true(timer + 1e-6)
            action = lambda i=index: self._server_timer(i)  # noqa: E731
            if best is None or when < best - 1e-12:
                best, due = when, [action]
            elif when - best <= 1e-12:
                due.append(action)
        if best is None:
            return None
        return best, due

    def _pop_event(self) -> None:
        _, _, action = heapq.heappop(self._events)
        action()

    def _server_timer(self, index: int) -> None:
        self.servers[index].advance()
        self._flush(index)

    def run_until(self, done: Callable[[], bool], limit: float) -> None:
        """Run events in virtual-time order until ``done()`` or true time ``limit``."""
        while not done() and self.steps < self.config.max_steps:
            found = self._candidates()
            if found is None:
                return
            when, due = found
            if when > limit:
                return
            if when > self.clock.now:
                self.clock.now = when
            action = due[0] if len(due) == 1 else due[self.chooser.tie(self, due)]
            self.steps += 1
            action()
            self.loops = [loop for loop in self.loops if not loop.is_closed()]

    # -- faults -----------------------------------------------------------------------------

    def heal(self) -> None:
        """Every fault ends: servers up and running, delays back to normal (connections a
        fault broke stay broken: clients make new ones)."""
        self.spike_until = 0.0
        self.slow_rounds = 0
        for index, server in enumerate(self.servers):
            self.paused[index] = 0.0
            self._resume(index)
            if not server.up:
                server.restart()
        self.healed_at = self.clock.now

    def plan_faults(self, start: float, end: float) -> None:
        kinds = list(self.config.faults)
        if not kinds:
            return
        chosen = [k for k in kinds if self.rng.random() < 0.6] or [self.rng.choice(kinds)]
        keep = self.config.keep_faults
        for number in range(self.config.fault_count):
            kind = self.rng.choice(chosen)
            when = self.rng.uniform(start, end)
            # (a fault left out of a shrunk schedule still takes its draws: what the seed
            # draws after the plan stays the same)
            kept = keep is None or number in keep
            self.history.plan.append((when, kind, kept))
            if not kept:
                continue
            self.history.faults[kind] = self.history.faults.get(kind, 0) + 1
            self.at(when, lambda k=kind: self._inject(k))

    def plan_cancels(self, start: float, end: float) -> None:
        """The "cancel_task" faults: ``config.cancels`` moments in [start, end], drawn from
        ``cancel_rng`` (the other faults' draws, and so every schedule without a cancellation,
        stay as they were); in the plan after the others, so a shrink can leave them out."""
        keep = self.config.keep_faults
        for number in range(self.config.fault_count, self.config.fault_count + self.config.cancels):
            when = self.cancel_rng.uniform(start, end)
            kept = keep is None or number in keep
            self.history.plan.append((when, "cancel_task", kept))
            if not kept:
                continue
            self.history.faults["cancel_task"] = self.history.faults.get("cancel_task", 0) + 1
            self.at(when, self._cancel_task)

    def _cancel_task(self) -> None:
        """``task.cancel()`` of one of the workload's running tasks, at whatever await it is
        at (acquiring, holding, extending, releasing ...): what the library promises then is
        for the checkers to judge (nothing left held by a cancelled acquire, a cancelled
        release applied all the same, never two valid leases)."""
        live = [
            name
            for name, task in self.running.items()
            if name not in self.cancelled and not task.done() and not task.get_loop().is_closed()
        ]
        if not live:
            # between jobs, or a job's loop paused: the next task running a moment later
            # (until the workload is over)
            if self.workload_over:
                self.note("cancel: no client task running")
            else:
                self.at(self.clock.now + self.cancel_rng.uniform(0.005, 0.2), self._cancel_task)
            return
        name = self.cancel_rng.choice(live)
        task = self.running[name]
        where = _innermost_await(task)
        phase = self.phase.get(name, "?")
        self.cancelled.add(name)
        self.history.cancels.append((self.clock.now, name, phase, where))
        self.note(f"cancel {name} ({phase}) at {where}")
        # (a connection the task shared may be closed by its cancellation: as a reset)
        self._fault_until(self.clock.now)
        task.cancel()

    def _fault_until(self, until: float) -> None:
        self.last_fault = max(self.last_fault, until)
        self.history.fault_windows.append((self.clock.now, until))

    def watch_keys(self, every_s: float = 0.05) -> None:
        """Every ``every_s``, read each healthy server's lock keys: a key whose token no grant
        ever had (an acquire told NotAcquired/Unavailable, or one run twice) still there past
        the cleanup window, with no fault in that window, is a ghost; so is a key of a lease
        whose release was confirmed."""
        if not self.watching:
            return
        window = 4 * self.config.server_timeout + 0.3
        now = self.clock.now
        granted = {g.token.encode(): g for g in self.history.grants}
        present: set[tuple[int, bytes, bytes]] = set()
        stale: dict[tuple[bytes, bytes], list[int]] = {}
        for index, _server, key, value, _ in self._live_keys(now, b"}"):
            if not isinstance(value, bytes):
                continue
            value = _token_of(value)
            if not value:
                continue  # the hand-off marker: nobody's, and gone after its window
            entry = (index, key, value)
            present.add(entry)
            first = self._seen.setdefault(entry, now)
            if now - first < window or now - self.last_fault < window:
                continue
            grant = granted.get(value)
            name = key[len(b"fencelock:{") : -1].decode()
            if self.busy.get(name) or now - self.busy_until.get(name, -1e9) < window:
                continue  # a MultiLock holds it while it waits for its next key
            if grant is None and not value.startswith(b"h"):
                self.history.ghosts.append(
                    f"sim{index} {key.decode()} held by {value[:8].decode()}… (no grant) "
                    f"for {now - first:.3f} s"
                )
                self._seen[entry] = now + 1e9  # reported once
            elif (
                grant is not None
                and grant.release in ("ok", "cancelled", "interrupted")
                and grant.ended is not None
                and now - grant.ended > window
            ):
                # (a release cancelled by a cancel_task fault goes on without its caller,
                # or is repeated in the background: past the window, with no fault in it,
                # it must have been applied as a confirmed one)
                stale.setdefault((key, value), []).append(index)
        self._check_registrations(now, window, granted)
        majority = len(self.servers) // 2 + 1
        self._check_leases(now, majority)
        for (key, value), where in stale.items():
            # confirmed = released on a majority; a minority may keep it until its TTL
            if len(where) >= majority and (key, value) not in self._reported:
                self._reported.add((key, value))
                grant = granted[value]
                what = "confirmed" if grant.release == "ok" else f"{grant.release} (it goes on)"
                self.history.unapplied.append(
                    f"{key.decode()} still on {len(where)}/{len(self.servers)} servers: "
                    f"{grant.client}'s release was {what} {now - (grant.ended or now):.3f} s ago"
                )
        for entry in [e for e in self._seen if e not in present]:
            del self._seen[entry]
        self.at(now + every_s, self.watch_keys)

    def _live_keys(
        self, now: float, ending: bytes
    ) -> Iterator[tuple[int, SimServer, bytes, Any, int]]:
        """(server index, server, key, value, the server's clock in ms) of every unexpired key
        ``fencelock:{...`` ending in ``ending`` on the servers up and not paused at ``now``."""
        for index, server in enumerate(self.servers):
            if not server.up or self.paused[index] > now:
                continue
            now_ms = int(self.clocks[index]() * 1000)
            for key, value in server.data.items():
                if not (key.startswith(b"fencelock:{") and key.endswith(ending)):
                    continue
                expiry = server.expires.get(key)
                if expiry is None or expiry > now_ms:
                    yield index, server, key, value, now_ms

    def _check_registrations(self, now: float, window: float, granted: dict[bytes, Grant]) -> None:
        """A waiter id still registered (unexpired) in a lock's (a semaphore's, a read-write
        lock's) waiters on a healthy server, past the cleanup window after the confirmed
        release of the lease its acquire won, with no fault in that window: the release must
        remove its own registration wherever it runs (a registration left makes that server's
        next release hand the lock to nobody, or wake nobody)."""
        if now - self.last_fault < window:
            return
        owner: dict[bytes, Grant] = {}
        for token, grant in granted.items():
            waiter = self._waiter_ids.get(token)
            if waiter is not None and grant.kind != "fair":
                owner[waiter] = grant
        for index, server, key, value, now_ms in self._live_keys(now, b"}:waiters"):
            if not isinstance(value, ZSet):
                continue
            for member, score in value.scores.items():
                grant = owner.get(member)
                if (
                    score <= now_ms
                    or grant is None
                    or grant.release != "ok"
                    or grant.ended is None
                    or now - grant.ended < window
                    or (index, key, member) in self._registered
                    # an attempt of the call refused here after the lease's release: a
                    # request a fault delayed past it (the registration expires by itself)
                    or server.refused_at.get(member, -1e9) >= grant.ended
                ):
                    continue
                self._registered.add((index, key, member))
                self.history.registrations.append(
                    f"sim{index} {key.decode()} still registers {member.decode()} "
                    f"({grant.client}'s acquire, granted at {grant.at - 1000:.4f}) "
                    f"{now - grant.ended:.3f} s after its confirmed release"
                )

    def _check_leases(self, now: float, majority: int) -> None:
        """A valid lease's local deadline never outlives its key on a majority: every lease
        held now (not released, not known lost, before its local deadline) has its token, with
        an expiry (on true time) no earlier than that deadline, on a majority of the servers,
        unless a wiped restart or a broken clock bound since its grant explains it."""
        history = self.history
        for grant in history.grants:
            lease = grant.lease
            if lease is None or grant.ended is not None or grant.extending or lease.lost.is_set():
                continue
            deadline = lease.deadline
            if now >= deadline or grant.key.startswith("sem"):
                continue
            since = grant.start or grant.at
            # (a hand-over's lease counts from its claim: its key was set up to a lease
            # before, so a clock break counts from then; and a wiped restart from the ask:
            # a hand-over granted while its process was paused is claimed only after the
            # pause, its key written long before, seed 12002425)
            wiped_since = min(since, grant.asked) if grant.asked else since
            if any(wiped_since <= t <= now for t in history.wiped_at) or history.clock_broken(
                since - self.config.ttl, now
            ):
                continue
            key = server_key(grant)
            token = grant.token.encode()
            held = 0
            if grant.kind == "read":  # a reader: its token's score (expiry, ms) in the zset
                key += b":readers"
            for index, server in enumerate(self.servers):
                value = server.data.get(key)
                expiry = server.expires.get(key)
                if grant.kind == "read":
                    score = getattr(value, "scores", {}).get(token)
                    if score is None:
                        continue
                    expiry = int(score) if expiry is None else min(expiry, int(score))
                elif _token_of(value) != token:
                    continue
                if expiry is None or self.clocks[index].to_true(expiry / 1000.0) >= deadline:
                    held += 1
            if held < majority:
                history.outlived.append(
                    f"{grant.client}'s lease on {grant.key} (fence {grant.fence}) is valid until "
                    f"{deadline - 1000:.4f} but its key outlives that on {held}/"
                    f"{len(self.servers)} servers at {now - 1000:.4f}"
                )
                grant.lease = None  # reported once

    def _inject(self, kind: str) -> None:
        rng = self.rng
        n = len(self.servers)
        if kind in ("crash_wiped", "crash_kept"):
            index = rng.randrange(n)
            if self.servers[index].up:
                down_s = rng.uniform(0.0, 1.0)
                self._fault_until(self.clock.now + down_s)
                self.crash(index, wipe=kind == "crash_wiped", down_s=down_s)
        elif kind == "pause_server":
            for_s = rng.uniform(0.05, 1.5) * self.config.server_timeout * 5
            self._fault_until(self.clock.now + for_s)
            self.pause(rng.randrange(n), for_s)
        elif kind == "reset_connection":
            live = [c for c in self.conns if not c.closed]
            if live:
                conn = rng.choice(live)
                self.note(f"reset conn {conn.id} (sim{conn.server})")
                self._fault_until(self.clock.now)
                self._reset(conn)
        elif kind == "drop_reply":
            live = [c for c in self.conns if not c.closed]
            if live:
                rng.choice(live).drop_next = True
                self._fault_until(self.clock.now + 1.0)  # when it bites is not known here
        elif kind == "delay_spike":
            self.spike_max = rng.uniform(0.05, 0.5)
            self.spike_until = self.clock.now + rng.uniform(0.2, 1.0)
            # (its effect lasts until the last message it delayed arrives: one sent as the
            # spike ends takes up to spike_max; seed 205015)
            self._fault_until(self.spike_until + self.spike_max)
            self.note(f"delay spike to {self.spike_max:.3f} s until {self.spike_until - 1000:.3f}")
        elif kind == "script_flush":  # SCRIPT FLUSH (or a failover to a cold replica)
            index = rng.randrange(n)
            self.note(f"SCRIPT FLUSH on sim{index}")
            self.servers[index].flush_scripts()
        elif kind == "clock_skew":  # a forward jump the drift allowance covers (NTP slew)
            index = rng.randrange(n)
            jump = rng.uniform(0.0, self.jump_budget[index])
            self.jump_budget[index] -= jump
            self.clocks[index].jump(jump)
            self.note(f"clock of sim{index} jumps {jump * 1000:.3f} ms (within the allowance)")
        elif kind == "clock_break":  # a jump past the allowance: a clock bound broken
            index = rng.randrange(n)
            jump = rng.uniform(0.05, 1.5) * self.config.ttl
            self.clocks[index].jump(jump)
            self.history.clock_breaks.append(self.clock.now)
            self.note(f"clock of sim{index} jumps {jump:.3f} s (a clock bound broken)")
        elif kind == "crash_pair" and n >= 3:
            # two servers fail close together (one power feed): one keeps its data and is
            # down a while (grants meanwhile land on a bare majority), the other loses its
            # data and is back at once (restart_delay is what keeps it from voting)
            first, second = rng.sample(range(n), 2)
            if self.servers[first].up and self.servers[second].up:
                down_s = rng.uniform(0.5, 1.5)
                self._fault_until(self.clock.now + down_s)
                self.crash(first, wipe=False, down_s=down_s)
                later = self.clock.now + rng.uniform(0.2, down_s)
                back_s = rng.uniform(0.0, 0.2)

                def wipe(index: int = second, back: float = back_s) -> None:
                    if self.servers[index].up:
                        self._fault_until(self.clock.now + back)
                        self.crash(index, wipe=True, down_s=back)

                self.at(later, wipe)
        elif kind == "slow_round":
            self.slow_rounds += 1
        elif kind == "pause_client":
            live = [loop for loop in self.loops if not loop.is_closed()]
            if live:
                loop = rng.choice(live)
                loop.paused_until = self.clock.now + rng.uniform(0.1, 2.0) * self.config.ttl
                self._fault_until(loop.paused_until)
                self.history.client_pauses.append((self.clock.now, loop.paused_until))
                self.note(f"pause client {loop.name} until {loop.paused_until - 1000.0:.3f}")


class SimBackground:
    """The engine's background work (probes of suspect servers, repeats of releases whose
    answer did not come) inside the world: the real one is a thread with real sockets, which
    would reach outside the simulation and run on real time."""

    PROBE_EVERY_S = 0.05

    def __init__(self, world: World) -> None:
        self.world = world

    def _index(self, server: Any) -> int | None:
        index = server.last_address.port - PORT
        return index if 0 <= index < len(self.world.servers) else None

    def watch(self, server: Any) -> None:
        index = self._index(server)
        if index is None:
            return
        world = self.world

        def probe() -> None:
            if world.servers[index].up and world.paused[index] <= world.clock.now:
                server.answered()
                server.recheck = True
            else:
                world.at(world.clock.now + self.PROBE_EVERY_S, probe)

        world.at(world.clock.now + self.PROBE_EVERY_S, probe)

    def repeat(self, servers: tuple[Any, ...], effect: Any) -> None:
        """As the real thread's ``repeat``: the script on each target, from each of the
        effect's ``at_s`` (s from now), until answered twice or ``until_s`` from then."""
        for at_s in effect.at_s:
            self._repeat_from(servers, effect, at_s)

    def _repeat_from(self, servers: tuple[Any, ...], effect: Any, after_s: float) -> None:
        from fencelock._engine.wire import full_call
        from fencelock._scripts import BY_NAME
        from fencelock._sync.background import LATE_AGAIN_S

        world = self.world
        payload = full_call(BY_NAME[effect.script], effect.keys, effect.args)
        until = world.clock.now + after_s + effect.until_s
        process = world.process  # the background thread of the process that asked

        def repeater(i: int) -> Callable[[], None]:
            # (one function per server: a retry must retry its own server; a closure shared
            # by the loop below retried the last target only, and a paused server's repeat
            # was lost: seed 807's key stayed held by a failed attempt's token)
            answered = [0]

            def again() -> None:
                if world.clock.now > until or process in world.dead:
                    return
                if (process, i) in world.cut:
                    world.at(world.clock.now + self.PROBE_EVERY_S, again)
                    return
                if world.servers[i].up and world.paused[i] <= world.clock.now:
                    session = world.servers[i].connect()
                    session.feed(payload)
                    session.take_output()
                    session.close()
                    # what the script woke (a waiter's blocked BLPOP / BLMOVE on another
                    # connection) is answered now, as a server writes it at once: unflushed,
                    # it waited for the next request to that server (seed 999001421: a fair
                    # waiter's wake-up held 200 ms, until its pause timed out and made a
                    # healthy server suspect)
                    world._flush(i)
                    world.note(f"background repeat of {effect.script} on sim{i}")
                    # as the real thread (_sync/background.py, _LateBatch): sent once more
                    # LATE_AGAIN_S after its first answer (seed 51119: a straggler's SET
                    # that a single repeat did not outlast)
                    answered[0] += 1
                    if answered[0] < 2:
                        world.at(world.clock.now + LATE_AGAIN_S, again)
                    return
                world.at(world.clock.now + self.PROBE_EVERY_S, again)

            return again

        for target in effect.targets:
            index = self._index(servers[target])
            if index is not None:
                world.at(world.clock.now + after_s + self.PROBE_EVERY_S, repeater(index))


def _innermost_await(task: asyncio.Task[Any]) -> str:
    """Where ``task`` waits now: the innermost frame of its chain of awaits (``file:line
    function``; ``Task.get_stack()`` gives the outermost coroutine's frame only)."""
    where = "?"
    coro: Any = task.get_coro()
    for _ in range(100):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        where = f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {code.co_name}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if coro is None:
            break
        if isinstance(coro, asyncio.Future):  # a future (a task: its own chain goes on)
            if isinstance(coro, asyncio.Task):
                coro = coro.get_coro()
                continue
            break
    return where


def seeded_tokens(rng: random.Random) -> Callable[[int], str]:
    def token_hex(nbytes: int | None = None) -> str:
        return rng.getrandbits(8 * (nbytes or 32)).to_bytes(nbytes or 32, "big").hex()

    return token_hex


def _token_of(value: Any) -> Any:
    """The token in a lock key's value (``lock_value.lua``: the token, then byte 255 and the
    holder info); anything else as it is."""
    from fencelock._core.holder_json import split_lock_value  # (the engine is imported late)

    return split_lock_value(value)[0] if isinstance(value, bytes) else value


def reset_engine() -> None:
    """A fresh process's engine: what one schedule's servers taught it must not reach the next
    (the registry is per process; a schedule is a new process)."""
    from fencelock._async import driver
    from fencelock._engine import registry
    from fencelock._frontend import fronts as _front
    from fencelock._frontend import reentry as _reentry

    registry._servers.clear()
    registry._by_url.clear()
    registry._clusters.clear()
    registry._by_sentinels.clear()
    _front._definitions.clear()
    _reentry._entries.clear()
    driver._background.clear()


def _creation_order(task: asyncio.Task[Any]) -> int:
    name = task.get_name()
    return int(name.rsplit("-", 1)[-1]) if name.rsplit("-", 1)[-1].isdigit() else 0


def run_schedule(
    seed: int,
    config: Config,
    workload: Callable[[World], Any],
    *,
    collect: bool = True,
    chooser: Any = None,
) -> World:
    """Run one schedule: the servers, the faults, and ``workload(world)`` (which starts the
    clients' loops); returns the world with its history. ``collect=False`` skips the garbage
    collection before it (a search collects every few schedules: garbage of earlier schedules
    is inert while the collector is off, so the schedule runs the same). ``chooser`` makes
    the world's ordering choices instead of :class:`RandomChooser` (the enumeration's)."""
    # the cyclic garbage collector runs when allocation counts say so, which depends on what
    # the process did before: with it off during a schedule, what is freed when (weakly held
    # leases, say) is the same in a search and in a replay
    if collect:
        gc.collect()
    gc_was_on = gc.isenabled()
    gc.disable()
    world = World(seed, config)
    if chooser is not None:
        world.chooser = chooser
    saved_hex = secrets.token_hex
    state = random.getstate()
    random.seed(seed)
    secrets.token_hex = seeded_tokens(random.Random(seed ^ 0x5EED))  # type: ignore[assignment]
    reset_engine()
    from fencelock._async import driver

    saved_background = driver.background
    sim_background = SimBackground(world)
    driver.background = lambda: sim_background  # type: ignore[assignment]
    try:
        with patched_time(world.clock):
            workload(world)
        shas = world.history.acquire_shas
        world.history.landed = [
            {token for digest, token in server.ran or () if digest in shas}
            for server in world.servers
        ]
    finally:
        world.switch("")  # the host's own engine state back in the modules
        for undo in reversed(world.cleanups):
            undo()
        driver.background = saved_background  # type: ignore[assignment]
        secrets.token_hex = saved_hex  # type: ignore[assignment]
        random.setstate(state)
        for loop in world.loops:
            if not loop.is_closed():
                _close_loop(loop)
        reset_engine()
        if gc_was_on:
            gc.enable()
    return world


def _close_loop(loop: SimLoop) -> None:
    # all_tasks() is a set (ordered by object address): cancel in creation order instead
    for task in sorted(asyncio.all_tasks(loop), key=_creation_order):
        task.cancel()
    try:
        for _ in range(20):
            if not asyncio.all_tasks(loop):
                break
            loop.step()
    finally:
        loop.close()
