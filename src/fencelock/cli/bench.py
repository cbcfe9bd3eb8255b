"""``fencelock bench``: this library measured against raw redis-py doing the same commands.

Everything is measured in one run and interleaved (ours, baseline, ours, baseline, ...), and the
figures that matter are *ratios* within that run: shared machines are noisy, absolute times are
not stable, ratios of interleaved batches are.

Cases (see ``docs/benchmarks.md`` for the targets):

- ``single``: uncontended acquire + release on one server vs raw redis-py on one connection
  (``SET key token NX PX ttl`` then ``EVALSHA`` of a compare-and-delete script).
- ``redlock``: acquire + release over 5 servers, p50 against our own one-server p50.
- ``handoff``: 8 workers (processes; threads reported too) on one key, ~1 ms of work each.
- ``async``: 50 asyncio tasks on distinct keys vs raw ``redis.asyncio``.
- ``single`` and ``async`` also time a NEW Lock object per acquire+release cycle (a Lock built
  per key, as web handlers do) against the same baseline, and ``single`` reads the server's CPU
  (``INFO cpu``) around every batch: server CPU per cycle, ours vs raw; then counts the
  server's commands per cycle (``INFO commandstats``, a script's own calls included), ours vs
  raw.
- ``faults``: acquire + release p50 over 5 servers the bench starts itself, healthy and with a
  sick minority (one SIGSTOPped, two black-holed addresses, two refused ports), server
  timeout 0.25 s.
- ``family``: uncontended acquire + release of a semaphore permit, a read lease and a write
  lease on one server, interleaved with the plain Lock's in the same rounds; each as ops/s and
  as a ratio to the Lock's.

Also reported: client CPU per operation (``time.process_time`` per op), server memory per held
lock, per held semaphore permit and per read lease (``MEMORY USAGE`` of their keys) and whether
anything but the fence register is left after a release; and the server memory per key locked
once (``INFO memory`` ``used_memory`` over many keys, each acquired and released once), then
again once their fence registers' retention (a short one: ``RETENTION_S``) has run out.
Set ``FENCELOCK_BENCH_QUICK=1`` (or ``quick=True``) for a short CI smoke run.

Why this module is longer than 600 lines: each figure of ``fencelock bench --json`` is measured
against its raw baseline in the same run, and the measurements share their timers, servers and
workers; the HTML page is in :mod:`._html`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import os
import platform
import secrets
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from .._core.keys import keys_glob, lock_keys, rw_keys, slot_keys
from .._engine.plain_clients import verified
from .._frontend.holder import new_token

QUICK_ENV = "FENCELOCK_BENCH_QUICK"

#: Compare-and-delete of the raw baseline: the one script a raw redis-py user needs.
BASELINE_RELEASE = (
    b"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    b"else return 0 end"
)
BASELINE_TTL_MS = 10_000
LOCK_TTL_S = 10.0
CALL_TIMEOUT_S = 5.0  # socket timeout of the bench's own admin / baseline clients
HANDOFF_WORKERS = 8
HANDOFF_WORK_S = 0.001
ASYNC_TASKS = 50
FAULT_SERVERS = 5
FAULT_SERVER_TIMEOUT_S = 0.25  # the faults case's server_timeout: a sick server costs <= this
FAMILY_LIMIT = 4  # the family case's semaphore (client.semaphore's default limit)
#: The retention case: keys each locked once (many, so that one key's share of the server's
#: allocator noise is small), with the shortest retention allowed and a lease as short.
RETENTION_S = 1.0
RETENTION_KEYS = 2000
RETENTION_WAIT_S = 30.0  # liveness bound of the wait for the registers to expire
RETENTION_SETTLE_S = 2.0
#: The family case's members, each against the plain Lock (``multilock_2``: two keys, the
#: cycle releases both leases).
FAMILY_CASES = ("semaphore", "rw_read", "rw_write", "fair", "reentrant", "multilock_2")


@dataclass(frozen=True)
class Plan:
    """How long each phase runs (seconds) and how many interleaved rounds it has."""

    rounds: int
    batch_s: float
    redlock_rounds: int
    redlock_batch_s: float
    handoff_s: float
    async_rounds: int
    async_batch_s: float
    warmup_ops: int
    faults_s: float
    faults_min_cycles: int


#: Each field of :class:`Plan`: (its value in a full run, in a quick one).
_PLANS: dict[str, tuple[Any, Any]] = {
    "rounds": (10, 4),
    "batch_s": (0.25, 0.06),
    "redlock_rounds": (8, 3),
    "redlock_batch_s": (0.25, 0.06),
    "handoff_s": (4.0, 1.0),
    "async_rounds": (6, 3),
    "async_batch_s": (0.4, 0.1),
    "warmup_ops": (300, 50),
    "faults_s": (1.0, 0.2),
    "faults_min_cycles": (5, 3),
}
FULL = Plan(**{field: full for field, (full, _) in _PLANS.items()})
QUICK = Plan(**{field: quick for field, (_, quick) in _PLANS.items()})


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


HISTOGRAM_BINS = 30


def _histogram(series: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Latency histograms (seconds in) over shared log-spaced edges: ``{"edges_us": [...],
    "counts": {name: [...]}}``, what ``--html`` draws."""
    from ._html import bin_counts, log_edges

    edges = log_edges((v * 1e6 for values in series.values() for v in values), HISTOGRAM_BINS)
    return {
        "edges_us": [round(e, 2) for e in edges],
        "counts": {
            name: bin_counts((v * 1e6 for v in values), edges) for name, values in series.items()
        },
    }


@dataclass
class Batch:
    """One timed batch: operation count, wall seconds, CPU seconds, per-op latencies (s)."""

    ops: int
    wall_s: float
    cpu_s: float
    latencies: list[float]

    @property
    def ops_per_s(self) -> float:
        return _ratio(self.ops, self.wall_s)

    @property
    def cpu_us_per_op(self) -> float:
        return _ratio(self.cpu_s * 1e6, self.ops)


def _rotated(cases: Sequence[str], index: int) -> list[str]:
    """``cases`` in round ``index``'s order: rotated, so that none always follows another."""
    shift = index % len(cases)
    return [*cases[shift:], *cases[:shift]]


def _timed(op: Callable[[], object], duration_s: float, min_ops: int = 1) -> Batch:
    """Run ``op`` back to back for ``duration_s`` seconds (at least ``min_ops`` times)."""
    clock = time.perf_counter
    latencies: list[float] = []
    cpu0 = time.process_time()
    start = clock()
    end = start + duration_s
    now = start
    while True:
        op()
        after = clock()
        latencies.append(after - now)
        now = after
        if now >= end and len(latencies) >= min_ops:
            break
    return Batch(len(latencies), now - start, time.process_time() - cpu0, latencies)


def _admin(url: str) -> redis.Redis:
    clean, tls = verified(url)
    return redis.Redis.from_url(
        clean, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S, **tls
    )


def _progress(enabled: bool, text: str) -> None:
    if enabled:
        print(f"fencelock bench: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# single
# ---------------------------------------------------------------------------------------------


class _RawLock:
    """The raw redis-py baseline on ONE connection: SET NX PX, then EVALSHA compare-and-delete."""

    def __init__(self, url: str, key: str) -> None:
        clean, tls = verified(url)
        self.client = redis.Redis.from_url(
            clean,
            single_connection_client=True,
            socket_timeout=CALL_TIMEOUT_S,
            socket_connect_timeout=CALL_TIMEOUT_S,
            **tls,
        )
        self.key = key
        self.sha = str(self.client.script_load(BASELINE_RELEASE))

    def cycle(self) -> None:
        token = new_token()
        if not self.client.set(self.key, token, nx=True, px=BASELINE_TTL_MS):
            raise RuntimeError(f"baseline key {self.key!r} unexpectedly held")
        self.client.evalsha(self.sha, 1, self.key, token)

    def close(self) -> None:
        self.client.close()


def _server_cpu_s(admin: redis.Redis) -> float:
    """The server process's CPU seconds so far (``INFO cpu``: used_cpu_sys + used_cpu_user)."""
    info: dict[str, Any] = admin.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _server_commands(admin: redis.Redis) -> dict[str, tuple[int, int]]:
    """Calls and microseconds of execution per command so far (``INFO commandstats``: a
    script's own calls count, as does the ``EVALSHA``, whose time includes theirs), without
    ``INFO`` (this reading's own)."""
    stats: dict[str, Any] = admin.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(fields["calls"]), int(fields["usec"]))
        for name, fields in stats.items()
        if name != "cmdstat_info"
    }


#: Cycles of each case counted for ``server_commands_per_op`` (after the timed rounds), in
#: each of :data:`COUNTED_BATCHES` batches.
COUNTED_OPS = 100
COUNTED_BATCHES = 5


def _commands_per_op(
    admin: redis.Redis, op: Callable[[], None], sent: frozenset[str]
) -> tuple[dict[str, float], float]:
    """Server commands per call of ``op`` (its own only: nothing else runs on the server
    then), by command name, over :data:`COUNTED_OPS` calls; and the microseconds per call the
    server spent executing the commands ``op`` sends (``sent``: their names; a script's time
    includes its own calls, so those are not added again), the median of
    :data:`COUNTED_BATCHES` batches (one stalled call, a virtual CPU descheduled say, moves
    one batch's sum by milliseconds). Reading and parsing the requests, and writing the
    replies, are not in it: ``server_cpu_us_per_op`` has everything."""
    zero = (0, 0)
    readings = [_server_commands(admin)]
    batches: list[float] = []
    for _ in range(COUNTED_BATCHES):
        for _ in range(COUNTED_OPS):
            op()
        readings.append(_server_commands(admin))
        before, after = readings[-2:]
        usec = sum(after.get(name, zero)[1] - before.get(name, zero)[1] for name in sent)
        batches.append(usec / COUNTED_OPS)
    before, after = readings[:2]  # the counts of the first batch (every batch has the same)
    calls = {
        name: (count - before.get(name, zero)[0]) / COUNTED_OPS
        for name, (count, _) in sorted(after.items())
        if count != before.get(name, zero)[0]
    }
    return calls, _median(batches)


#: What each case of ``single`` sends (the rest of its commands run inside those scripts).
OURS_SENT = frozenset({"evalsha", "eval"})
RAW_SENT = frozenset({"set", "evalsha", "eval"})


def _interleaved(
    plan: Plan, cases: dict[str, Callable[[], None]], batch: Callable[[str], None]
) -> None:
    """Warm every case up, then ``plan.rounds`` rounds of one ``batch(case)`` each, the order
    rotated round by round (so no case always runs first)."""
    for _ in range(plan.warmup_ops):
        for op in cases.values():
            op()
    order = list(cases)
    for index in range(plan.rounds):
        for case in _rotated(order, index):
            batch(case)


def _bench_single(url: str, prefix: str, plan: Plan) -> dict[str, Any]:
    from .. import Lock

    name = f"{prefix}single"
    per_key_name = f"{prefix}single:per-key"
    lock = Lock(url, name, ttl=LOCK_TTL_S)
    raw = _RawLock(url, f"{prefix}raw:single")
    admin = _admin(url)

    def ours() -> None:
        lock.acquire(wait=0).release()

    def per_key() -> None:
        # a web handler's way: a Lock built for the key it needs, used once, dropped
        Lock(url, per_key_name, ttl=LOCK_TTL_S).acquire(wait=0).release()

    cases: dict[str, Callable[[], None]] = {"ours": ours, "per_key": per_key, "raw": raw.cycle}
    batches: dict[str, list[Batch]] = {case: [] for case in cases}
    server_cpu_s = dict.fromkeys(cases, 0.0)

    def batch(case: str) -> None:
        cpu0 = _server_cpu_s(admin)
        batches[case].append(_timed(cases[case], plan.batch_s))
        server_cpu_s[case] += _server_cpu_s(admin) - cpu0

    try:
        _interleaved(plan, cases, batch)
        commands, exec_us = _commands_per_op(admin, ours, OURS_SENT)
        baseline_commands, baseline_exec_us = _commands_per_op(admin, raw.cycle, RAW_SENT)
    finally:
        lock.close()
        raw.close()
        admin.close()
    mine, per, base = batches["ours"], batches["per_key"], batches["raw"]
    ops = _median([b.ops_per_s for b in mine])
    per_key_ops = _median([b.ops_per_s for b in per])
    base_ops = _median([b.ops_per_s for b in base])
    lat = [x for b in mine for x in b.latencies]
    base_lat = [x for b in base for x in b.latencies]
    per_lat = [x for b in per for x in b.latencies]

    def server_us_per_op(case: str) -> float:
        return _ratio(server_cpu_s[case] * 1e6, sum(b.ops for b in batches[case]))

    return {
        "ops_per_s": ops,
        "p50_us": _pct(lat, 0.50) * 1e6,
        "p99_us": _pct(lat, 0.99) * 1e6,
        "baseline_ops_per_s": base_ops,
        "ratio_to_baseline": _ratio(ops, base_ops),
        "per_key_ops_per_s": per_key_ops,
        "per_key_p50_us": _pct(per_lat, 0.50) * 1e6,
        "per_key_ratio_to_baseline": _ratio(per_key_ops, base_ops),
        "server_cpu_us_per_op": server_us_per_op("ours"),
        "per_key_server_cpu_us_per_op": server_us_per_op("per_key"),
        "baseline_server_cpu_us_per_op": server_us_per_op("raw"),
        "server_cpu_ratio": _ratio(server_us_per_op("ours"), server_us_per_op("raw")),
        "server_commands_per_op": sum(commands.values()),
        "server_commands_by_name": commands,
        "baseline_server_commands_per_op": sum(baseline_commands.values()),
        # the server's execution of the commands sent (INFO commandstats usec), without the
        # request and reply I/O that server_cpu_us_per_op also counts (and that is the same
        # per round trip for both): the server's share that the scripts decide
        "server_exec_us_per_op": exec_us,
        "baseline_server_exec_us_per_op": baseline_exec_us,
        "server_exec_ratio": _ratio(exec_us, baseline_exec_us),
        "baseline_p50_us": _pct(base_lat, 0.50) * 1e6,
        "baseline_p99_us": _pct(base_lat, 0.99) * 1e6,
        "round_ratios": [_ratio(m.ops_per_s, b.ops_per_s) for m, b in zip(mine, base, strict=True)],
        "histogram": _histogram({"ours": lat, "new Lock per cycle": per_lat, "raw": base_lat}),
        "cpu_us_per_op": _median([b.cpu_us_per_op for b in mine]),
        "per_key_cpu_us_per_op": _median([b.cpu_us_per_op for b in per]),
        "baseline_cpu_us_per_op": _median([b.cpu_us_per_op for b in base]),
        "rounds": plan.rounds,
    }


# ---------------------------------------------------------------------------------------------
# redlock
# ---------------------------------------------------------------------------------------------


def _bench_redlock(urls: Sequence[str], prefix: str, plan: Plan) -> dict[str, Any]:
    from .. import Lock

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2 servers given by the user: measured as given
        multi = Lock(list(urls), f"{prefix}redlock", ttl=LOCK_TTL_S)
    single = Lock(urls[0], f"{prefix}redlock-single", ttl=LOCK_TTL_S)

    def many() -> None:
        multi.acquire(wait=0).release()

    def one() -> None:
        single.acquire(wait=0).release()

    try:
        for _ in range(max(10, plan.warmup_ops // 3)):
            many()
            one()
        multi_batches: list[Batch] = []
        single_batches: list[Batch] = []
        for index in range(plan.redlock_rounds):
            first, second = (many, one) if index % 2 == 0 else (one, many)
            for op in (first, second):
                batch = _timed(op, plan.redlock_batch_s)
                (multi_batches if op is many else single_batches).append(batch)
    finally:
        multi.close()
        single.close()
    lat = [x for b in multi_batches for x in b.latencies]
    single_lat = [x for b in single_batches for x in b.latencies]
    p50 = _pct(lat, 0.50) * 1e6
    single_p50 = _pct(single_lat, 0.50) * 1e6
    async_p50, async_raw_p50 = asyncio.run(_async_redlock(urls, prefix, plan))
    return {
        "servers": len(urls),
        # one asyncio task: the same N-server cycle against one raw redis.asyncio task's
        # SET NX PX + EVALSHA on the first server, interleaved
        "async_p50_us": async_p50,
        "async_raw_single_p50_us": async_raw_p50,
        "async_ratio_p50_to_raw_single": _ratio(async_p50, async_raw_p50),
        "p50_us": p50,
        "p99_us": _pct(lat, 0.99) * 1e6,
        "single_p50_us": single_p50,
        "ratio_p50_to_single": _ratio(p50, single_p50),
        "ops_per_s": _median([b.ops_per_s for b in multi_batches]),
        "cpu_us_per_op": _median([b.cpu_us_per_op for b in multi_batches]),
        "histogram": _histogram({f"{len(urls)} servers": lat, "1 server": single_lat}),
    }


async def _async_redlock(urls: Sequence[str], prefix: str, plan: Plan) -> tuple[float, float]:
    """p50 (µs) of one asyncio task's acquire + release over every server, and of one raw
    ``redis.asyncio`` task's ``SET NX PX`` + ``EVALSHA`` on the first, interleaved in
    ``plan.redlock_rounds`` rounds of ``plan.redlock_batch_s`` each."""
    from ..asyncio import Lock as AsyncLock

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2 servers given by the user: measured as given
        many = AsyncLock(list(urls), f"{prefix}redlock-async", ttl=LOCK_TTL_S)
    clean, tls = verified(urls[0])
    raw = aredis.Redis.from_url(
        clean,
        single_connection_client=True,
        socket_timeout=CALL_TIMEOUT_S,
        socket_connect_timeout=CALL_TIMEOUT_S,
        **tls,
    )
    key = f"{prefix}raw:redlock-async"
    latencies: dict[str, list[float]] = {"ours": [], "raw": []}
    sha = ""  # loaded first thing in the try below

    async def ours() -> None:
        await (await many.acquire(wait=0)).release()

    async def base() -> None:
        token = new_token()
        if not await raw.set(key, token, nx=True, px=BASELINE_TTL_MS):
            raise RuntimeError(f"baseline key {key!r} unexpectedly held")
        await raw.evalsha(sha, 1, key, token)

    cases: dict[str, Callable[[], Awaitable[None]]] = {"ours": ours, "raw": base}
    try:
        sha = str(await raw.script_load(BASELINE_RELEASE))
        for _ in range(max(10, plan.warmup_ops // 3)):
            await ours()
            await base()
        for index in range(plan.redlock_rounds):
            for case in _rotated(list(cases), index):
                op, out = cases[case], latencies[case]
                end = time.perf_counter() + plan.redlock_batch_s
                while True:
                    began = time.perf_counter()
                    await op()
                    done = time.perf_counter()
                    out.append(done - began)
                    if done >= end:
                        break
    finally:
        await many.aclose()
        await raw.aclose()
    return _pct(latencies["ours"], 0.50) * 1e6, _pct(latencies["raw"], 0.50) * 1e6


# ---------------------------------------------------------------------------------------------
# handoff
# ---------------------------------------------------------------------------------------------

# one record per acquisition: (called acquire, got the lease, called release), monotonic s,
# and the rounds the acquisition ran after the wake-up that let it in (-1: it was not woken)
Record = tuple[float, float, float, int]


def _handoff_loop(
    url: str | list[str], key: str, start_at: float, duration_s: float
) -> list[Record]:
    """One worker: acquire (waiting) -> ~1 ms of work -> release, until the time is up
    (``url``: one server, or a list of them for a Redlock)."""
    from .. import Lock

    lock = Lock(url, key, ttl=LOCK_TTL_S, wait=10.0)
    records: list[Record] = []
    try:
        delay = start_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        end = start_at + duration_s
        while time.monotonic() < end:
            called = time.monotonic()
            lease = lock.acquire()
            got = time.monotonic()
            time.sleep(HANDOFF_WORK_S)
            # stamped before the release is sent: with a hand-over the next holder's acquire
            # can return before this release() does (the releaser descheduled after the
            # server answered), and a stamp taken after it made the gap negative under load
            releasing = time.monotonic()
            lease.release()
            records.append((called, got, releasing, lease._after_wake))
    finally:
        lock.close()
    return records


def _handoff_process(
    url: str, key: str, ready: Any, go: Any, out: Any, leave: Any, duration_s: float
) -> None:
    """Process entry point: warm up, report ready, wait for the common start time, run, then
    stay until every worker has reported (an exiting interpreter's teardown would take CPU
    from the workers still waiting for the lock, and show as their wait)."""
    from .. import Lock

    warm = Lock(url, key + ":warm", ttl=LOCK_TTL_S)
    warm.acquire(wait=1.0).release()
    warm.close()
    ready.put(os.getpid())
    start_at = go.get(timeout=60.0)
    out.put(_handoff_loop(url, key, start_at, duration_s))
    leave.get(timeout=duration_s + 60.0)


def _handoff_threads(url: str | list[str], key: str, duration_s: float) -> list[list[Record]]:
    results: list[list[Record]] = [[] for _ in range(HANDOFF_WORKERS)]
    errors: list[BaseException] = []
    start_at = time.monotonic() + 0.2

    def work(index: int) -> None:
        try:
            results[index] = _handoff_loop(url, key, start_at, duration_s)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(i,), name=f"bench-handoff-{i}")
        for i in range(HANDOFF_WORKERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=duration_s + 30.0)
    if errors:
        raise errors[0]
    return results


def _handoff_processes(url: str, key: str, duration_s: float) -> list[list[Record]]:
    ctx = multiprocessing.get_context("spawn")
    ready: Any = ctx.Queue()
    go: Any = ctx.Queue()
    out: Any = ctx.Queue()
    leave: Any = ctx.Queue()
    procs = [
        ctx.Process(
            target=_handoff_process,
            args=(url, key, ready, go, out, leave, duration_s),
            name=f"bench-handoff-{i}",
            daemon=True,
        )
        for i in range(HANDOFF_WORKERS)
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=60.0)
        start_at = time.monotonic() + 0.2  # CLOCK_MONOTONIC is shared by the processes
        for _ in procs:
            go.put(start_at)
        results = [out.get(timeout=duration_s + 60.0) for _ in procs]
    finally:
        for _ in procs:
            leave.put(True)
        for proc in procs:
            proc.join(timeout=10.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
    return [list(r) for r in results]


def _handoff_figures(per_worker: list[list[Record]], duration_s: float) -> dict[str, Any]:
    merged = sorted(
        ((rec, worker) for worker, recs in enumerate(per_worker) for rec in recs),
        key=lambda item: item[0][1],
    )
    waits = [rec[1] - rec[0] for rec, _ in merged]
    counts = [len(recs) for recs in per_worker]
    gaps: list[float] = []
    same = 0
    for (prev, pw), (nxt, nw) in itertools.pairwise(merged):
        if pw == nw:
            same += 1
        else:
            gaps.append(nxt[1] - prev[2])
    median_wait = _median(waits)
    after_wake = [rec[3] for rec, _ in merged if rec[3] >= 0]
    mean_count = _ratio(sum(counts), len(counts))
    return {
        "workers": len(per_worker),
        "p50_us": _pct(waits, 0.50) * 1e6,
        "p99_us": _pct(waits, 0.99) * 1e6,
        "acquisitions_per_s": _ratio(len(merged), duration_s),
        "max_wait_ratio": _ratio(max(waits, default=0.0), median_wait),
        "max_wait_us": max(waits, default=0.0) * 1e6,
        "per_worker": counts,
        "min_worker_share": _ratio(min(counts, default=0), mean_count),
        "same_worker_again": _ratio(same, max(1, len(merged) - 1)),
        "handoff_gap_p50_us": _median(gaps) * 1e6,
        # the same figure under its v0.2 contract name: from the holder's release() call
        # to ANOTHER worker's acquire() returning (only transitions between two workers count)
        "other_worker_p50_us": _median(gaps) * 1e6,
        "other_worker_handoffs": len(gaps),
        # rounds from the wake-up to holding the lease, mean over the acquisitions that were
        # woken (0: the grant came with the wake, a claimed hand-over; 1: an acquire or a
        # refresh round after it)
        "claim_rtts": _ratio(sum(after_wake), len(after_wake)),
        "woken_acquisitions": len(after_wake),
        "histogram": _histogram({"wait for the lease": waits}),
    }


def _bench_handoff(url: str, prefix: str, plan: Plan) -> dict[str, Any]:
    procs = _handoff_figures(
        _handoff_processes(url, f"{prefix}handoff:p", plan.handoff_s), plan.handoff_s
    )
    threads = _handoff_figures(
        _handoff_threads(url, f"{prefix}handoff:t", plan.handoff_s), plan.handoff_s
    )
    return {**procs, "mode": "processes", "threads": threads, "work_ms": HANDOFF_WORK_S * 1e3}


# ---------------------------------------------------------------------------------------------
# async
# ---------------------------------------------------------------------------------------------


async def _async_batches(url: str, prefix: str, plan: Plan) -> dict[str, Any]:
    from ..asyncio import Lock as AsyncLock

    locks = [AsyncLock(url, f"{prefix}async:{i}", ttl=LOCK_TTL_S) for i in range(ASYNC_TASKS)]
    clean, tls = verified(url)
    raw = aredis.Redis.from_url(
        clean, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S, **tls
    )
    sha = str(await raw.script_load(BASELINE_RELEASE))
    raw_keys = [f"{prefix}raw:async:{i}" for i in range(ASYNC_TASKS)]

    async def ours_task(index: int, end: float) -> int:
        lock = locks[index]
        count = 0
        while True:
            lease = await lock.acquire(wait=0)
            await lease.release()
            count += 1
            if time.perf_counter() >= end:
                return count

    async def per_key_task(index: int, end: float) -> int:
        name = f"{prefix}async:per-key:{index}"
        count = 0
        while True:
            # a web handler's way: a Lock built for the key it needs, used once, dropped
            lease = await AsyncLock(url, name, ttl=LOCK_TTL_S).acquire(wait=0)
            await lease.release()
            count += 1
            if time.perf_counter() >= end:
                return count

    async def raw_task(index: int, end: float) -> int:
        key = raw_keys[index]
        count = 0
        while True:
            token = new_token()
            if not await raw.set(key, token, nx=True, px=BASELINE_TTL_MS):
                raise RuntimeError(f"baseline key {key!r} unexpectedly held")
            await raw.evalsha(sha, 1, key, token)
            count += 1
            if time.perf_counter() >= end:
                return count

    async def batch(
        task: Callable[[int, float], Any], duration_s: float, n: int = ASYNC_TASKS
    ) -> Batch:
        cpu0 = time.process_time()
        start = time.perf_counter()
        counts = await asyncio.gather(*(task(i, start + duration_s) for i in range(n)))
        wall = time.perf_counter() - start
        return Batch(sum(counts), wall, time.process_time() - cpu0, [])

    tasks: dict[str, Callable[[int, float], Any]] = {
        "ours": ours_task,
        "per_key": per_key_task,
        "raw": raw_task,
    }
    # one task alone (nothing else in flight on the connection): a request costs what it
    # costs without pipelining, against one raw redis.asyncio task
    one_task = {"ours_one": ours_task, "raw_one": raw_task}
    batches: dict[str, list[Batch]] = {case: [] for case in [*tasks, *one_task]}
    try:
        for task in tasks.values():  # connections, scripts
            await batch(task, min(0.1, plan.async_batch_s))
        order = list(tasks)
        for index in range(plan.async_rounds):
            for case in _rotated(order, index):
                batches[case].append(await batch(tasks[case], plan.async_batch_s))
            for case in _rotated(list(one_task), index):
                batches[case].append(await batch(one_task[case], plan.async_batch_s, 1))
    finally:
        for lock in locks:
            await lock.aclose()
        await (getattr(raw, "aclose", None) or raw.close)()  # redis-py 5.0.0: close() only
    mine, per, base = batches["ours"], batches["per_key"], batches["raw"]
    one_ops = _median([b.ops_per_s for b in batches["ours_one"]])
    one_base_ops = _median([b.ops_per_s for b in batches["raw_one"]])
    ops = _median([b.ops_per_s for b in mine])
    per_key_ops = _median([b.ops_per_s for b in per])
    base_ops = _median([b.ops_per_s for b in base])
    return {
        "tasks": ASYNC_TASKS,
        "ops_per_s": ops,
        "baseline_ops_per_s": base_ops,
        "ratio_to_baseline": _ratio(ops, base_ops),
        "per_key_ops_per_s": per_key_ops,
        "per_key_ratio_to_baseline": _ratio(per_key_ops, base_ops),
        "cpu_us_per_op": _median([b.cpu_us_per_op for b in mine]),
        "per_key_cpu_us_per_op": _median([b.cpu_us_per_op for b in per]),
        "baseline_cpu_us_per_op": _median([b.cpu_us_per_op for b in base]),
        "one_task_ops_per_s": one_ops,
        "one_task_baseline_ops_per_s": one_base_ops,
        "one_task_ratio_to_baseline": _ratio(one_ops, one_base_ops),
    }


def _bench_async(url: str, prefix: str, plan: Plan) -> dict[str, Any]:
    return asyncio.run(_async_batches(url, prefix, plan))


# ---------------------------------------------------------------------------------------------
# faults: a sick minority of 5 servers
# ---------------------------------------------------------------------------------------------


def _fault_p50(
    urls: Sequence[str],
    name: str,
    plan: Plan,
    before: Callable[[], None] | None = None,
    samples: list[float] | None = None,
) -> dict[str, float]:
    """acquire(wait=0) + release cycles on ``urls`` after one warm cycle (and ``before()``)."""
    from .. import Lock

    lock = Lock(list(urls), name, ttl=LOCK_TTL_S, server_timeout=FAULT_SERVER_TIMEOUT_S)

    def cycle() -> None:
        lock.acquire(wait=0).release()

    try:
        cycle()  # connections, identity checks, scripts: not what this case measures
        if before is not None:
            before()
        batch = _timed(cycle, plan.faults_s, plan.faults_min_cycles)
    finally:
        lock.close()
    if samples is not None:
        samples.extend(batch.latencies)
    return {
        "p50_us": _pct(batch.latencies, 0.50) * 1e6,
        "p99_us": _pct(batch.latencies, 0.99) * 1e6,
        "cycles": float(batch.ops),
    }


def _bench_faults(prefix: str, plan: Plan) -> dict[str, Any]:
    """acquire+release p50 over 5 embedded servers, healthy and with a sick minority: one
    SIGSTOPped (hung) after the Lock connected to it, two black holes (connects never complete),
    two refused ports. Always on servers the bench starts itself (it pauses them)."""
    from ..testing import BlackHole, ServerError, ServerGroup, refused_urls

    try:
        group = ServerGroup(FAULT_SERVERS).start()
    except ServerError as exc:  # e.g. --server given and no server binary on this machine
        return {
            "servers": FAULT_SERVERS,
            "skipped": f"cannot start embedded servers: {exc}",
            **{f"{case}_p50_us": 0.0 for case in _FAULT_CASES},
        }
    holes: list[BlackHole] = []
    figures: dict[str, dict[str, float]] = {}
    samples: dict[str, list[float]] = {case: [] for case in _FAULT_CASES}
    try:
        urls = group.urls
        figures["healthy"] = _fault_p50(
            urls, f"{prefix}faults:healthy", plan, samples=samples["healthy"]
        )
        sick = group[FAULT_SERVERS - 1]
        paused: list[bool] = []

        def pause() -> None:
            sick.pause()
            paused.append(True)

        try:
            figures["hung_1"] = _fault_p50(
                urls, f"{prefix}faults:hung", plan, before=pause, samples=samples["hung_1"]
            )
        finally:
            if paused:
                sick.resume()
        holes = [BlackHole() for _ in range(2)]
        figures["black_holed_2"] = _fault_p50(
            urls[:3] + [h.url for h in holes],
            f"{prefix}faults:black-holed",
            plan,
            samples=samples["black_holed_2"],
        )
        figures["refused_2"] = _fault_p50(
            urls[:3] + refused_urls(2),
            f"{prefix}faults:refused",
            plan,
            samples=samples["refused_2"],
        )
    finally:
        for hole in holes:
            hole.close()
        group.stop()
    result: dict[str, Any] = {
        "servers": FAULT_SERVERS,
        "server_timeout_s": FAULT_SERVER_TIMEOUT_S,
    }
    for case in _FAULT_CASES:
        result[f"{case}_p50_us"] = figures[case]["p50_us"]
        result[f"{case}_p99_us"] = figures[case]["p99_us"]
        result[f"{case}_cycles"] = int(figures[case]["cycles"])
    result["histogram"] = _histogram(samples)
    return result


_FAULT_CASES = ("healthy", "hung_1", "black_holed_2", "refused_2")


# ---------------------------------------------------------------------------------------------
# family: semaphore, read-write lock against the plain Lock
# ---------------------------------------------------------------------------------------------


def _bench_family(url: str, prefix: str, plan: Plan) -> dict[str, Any]:
    """Uncontended acquire + release on one server: a Lock, a semaphore permit, a read lease
    and a write lease, interleaved round by round (as ``single``), each key its own."""
    from .. import Client

    client = Client(url, ttl=LOCK_TTL_S)
    lock = client.lock(f"{prefix}family:lock")
    sem = client.semaphore(f"{prefix}family:sem", limit=FAMILY_LIMIT)
    rw_read = client.rwlock(f"{prefix}family:rw-read")
    rw_write = client.rwlock(f"{prefix}family:rw-write")
    fair = client.lock(f"{prefix}family:fair", fair=True)
    reentrant = client.lock(f"{prefix}family:reentrant", reentrant=True)
    multi = client.multilock([f"{prefix}family:multi-a", f"{prefix}family:multi-b"])

    def multi_cycle() -> None:
        for lease in multi.acquire(wait=0):
            lease.release()

    cases: dict[str, Callable[[], None]] = {
        "lock": lambda: lock.acquire(wait=0).release(),
        "semaphore": lambda: sem.acquire(wait=0).release(),
        "rw_read": lambda: rw_read.acquire_read(wait=0).release(),
        "rw_write": lambda: rw_write.acquire_write(wait=0).release(),
        "fair": lambda: fair.acquire(wait=0).release(),
        "reentrant": lambda: reentrant.acquire(wait=0).release(),
        "multilock_2": multi_cycle,
    }
    batches: dict[str, list[Batch]] = {case: [] for case in cases}
    try:
        _interleaved(
            plan, cases, lambda case: batches[case].append(_timed(cases[case], plan.batch_s))
        )
    finally:
        client.close()
    ops = {case: _median([b.ops_per_s for b in batches[case]]) for case in cases}
    out: dict[str, Any] = {"lock_ops_per_s": ops["lock"], "semaphore_limit": FAMILY_LIMIT}
    for case in FAMILY_CASES:
        lat = [x for b in batches[case] for x in b.latencies]
        out[f"{case}_ops_per_s"] = ops[case]
        out[f"{case}_p50_us"] = _pct(lat, 0.50) * 1e6
        out[f"{case}_ratio_to_lock"] = _ratio(ops[case], ops["lock"])
    lock_lat = [x for b in batches["lock"] for x in b.latencies]
    out["lock_p50_us"] = _pct(lock_lat, 0.50) * 1e6
    out["rounds"] = plan.rounds
    return out


# ---------------------------------------------------------------------------------------------
# server memory and leftovers
# ---------------------------------------------------------------------------------------------


def _lock_key_names(name: str) -> list[str]:
    return list(lock_keys(name).script_keys)


def _memory(url: str, prefix: str) -> dict[str, Any]:
    """Bytes the server spends per held lock, and what a release leaves behind."""
    from .. import Lock

    name = f"{prefix}memory"
    keys = _lock_key_names(name)
    fence_key = lock_keys(name).fence
    admin = _admin(url)
    lock = Lock(url, name, ttl=LOCK_TTL_S)
    try:
        lease = lock.acquire(wait=1.0)
        held = _usage(admin, keys)
        lease.release()
        left = [k for k in keys if admin.exists(k)]
        garbage = [k for k in left if k != fence_key]
        fence_bytes = admin.memory_usage(fence_key, samples=0) if fence_key in left else 0
        lock_figures = {
            "bytes_per_held_lock": sum(held.values()),
            "bytes_by_key": held,
            "bytes_after_release": int(fence_bytes or 0),
            "keys_after_release": [k.rsplit("}", 1)[-1] or "lock" for k in left],
            "garbage_after_release": len(garbage),
        }
    finally:
        lock.close()
        admin.close()
    return {**lock_figures, **_family_memory(url, prefix), **_retention_memory(url, prefix)}


def _used_memory(admin: redis.Redis) -> int:
    return int(admin.info("memory")["used_memory"])


def _retention_memory(url: str, prefix: str) -> dict[str, Any]:
    """Server memory per key locked once (``used_memory`` before and after ``RETENTION_KEYS``
    keys were each acquired and released once), and again after their registers' retention
    ran out (each register read once it should have expired, so the server drops it now
    rather than in its background expiry cycle; then the lowest ``used_memory`` over
    ``RETENTION_SETTLE_S``, once the server had time to shrink its key tables)."""
    from .. import Lock

    admin = _admin(url)
    names = [f"{prefix}once:{i}" for i in range(RETENTION_KEYS)]
    fences = [lock_keys(name).fence for name in names]
    # the default server timeout of a 1 s lease (0.1 s) is short for a loaded machine
    options: dict[str, Any] = {
        "ttl": RETENTION_S,
        "fence_retention": RETENTION_S,
        "server_timeout": RETENTION_S / 2,
    }
    try:
        warm = Lock(url, f"{prefix}once:warm", **options)  # connection and scripts first
        warm.acquire(wait=CALL_TIMEOUT_S).release()
        warm.close()
        before = _used_memory(admin)
        for name in names:
            Lock(url, name, **options).acquire(wait=CALL_TIMEOUT_S).release()
        used = _used_memory(admin)
        register_bytes = int(admin.memory_usage(fences[-1], samples=0) or 0)
        deadline = time.monotonic() + RETENTION_WAIT_S
        left = len(fences)
        while left and time.monotonic() < deadline:
            time.sleep(0.25)
            left = sum(int(admin.exists(key)) for key in fences)
        # the server shrinks its key tables in its cron (10 times a second): the lowest
        # reading over the next RETENTION_SETTLE_S
        after = _used_memory(admin)
        settled = time.monotonic() + RETENTION_SETTLE_S
        while time.monotonic() < settled:
            time.sleep(0.25)
            after = min(after, _used_memory(admin))
    finally:
        admin.close()
    return {
        "retention_s": RETENTION_S,
        "keys_used_once": RETENTION_KEYS,
        "bytes_per_key_used_once": round((used - before) / RETENTION_KEYS, 1),
        "register_bytes": register_bytes,
        "bytes_after_retention": round((after - before) / RETENTION_KEYS, 1),
        "registers_left_after_retention": left,
    }


def _usage(admin: redis.Redis, keys: Sequence[str]) -> dict[str, int]:
    """``MEMORY USAGE`` (exact: ``SAMPLES 0``) of each key that exists, by its suffix."""
    found: dict[str, int] = {}
    for key in keys:
        usage = admin.memory_usage(key, samples=0)
        if usage is not None:
            found[key.rsplit("}", 1)[-1] or "lock"] = int(usage)
    return found


def _family_memory(url: str, prefix: str) -> dict[str, Any]:
    """Bytes per held semaphore permit (its slot's keys; a second permit of the same semaphore
    is the same again, on another slot) and per read lease (the readers zset with one reader,
    then what a second reader adds), and what their release leaves."""
    from .. import Client

    sem_name, rw_name = f"{prefix}memory:sem", f"{prefix}memory:rw"
    admin = _admin(url)
    client = Client(url, ttl=LOCK_TTL_S)
    sem = client.semaphore(sem_name, limit=FAMILY_LIMIT)
    rw = client.rwlock(rw_name)
    slot_names = [k for i in range(FAMILY_LIMIT) for k in _slot_key_names(sem_name, i)]
    readers = rw_keys(rw_name).readers
    try:
        permit = sem.acquire(wait=1.0)
        permit_keys = _usage(admin, _slot_key_names(sem_name, permit.slot))
        second = sem.acquire(wait=1.0)
        both = _usage(admin, slot_names)
        second.release()
        permit.release()
        sem_left = [k for k in slot_names if admin.exists(k)]
        first_reader = rw.acquire_read(wait=1.0)
        one_reader = _usage(admin, [readers]).get(":readers", 0)
        second_reader = rw.acquire_read(wait=1.0)
        two_readers = _usage(admin, [readers]).get(":readers", 0)
        second_reader.release()
        first_reader.release()
        rw_left = admin.exists(readers)
    finally:
        client.close()
        admin.close()
    return {
        "bytes_per_held_permit": sum(permit_keys.values()),
        "permit_bytes_by_key": permit_keys,
        "bytes_two_permits": sum(both.values()),
        "permit_keys_after_release": len(sem_left),
        "bytes_per_read_lease": one_reader,
        "bytes_per_extra_read_lease": two_readers - one_reader,
        "read_keys_after_release": int(rw_left),
    }


def _slot_key_names(name: str, slot: int) -> list[str]:
    keys = slot_keys(name, slot)
    return [keys.lock, keys.holder, keys.handoff]


def _persistent_garbage(url: str, prefix: str) -> list[str]:
    """Bench lock keys with no TTL other than fence registers (after every phase)."""
    admin = _admin(url)
    try:
        found = []
        pattern = keys_glob(prefix)
        for raw_key in admin.scan_iter(match=pattern, count=1000):
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            if key.endswith(":fence"):
                continue
            if int(admin.pttl(key)) == -1:
                found.append(key)
        return found
    finally:
        admin.close()


#: Runs of ``fencelock run -- true`` timed for ``cli.run_true_s`` (quick, full).
CLI_RUNS = (3, 7)

#: Liveness bound of one timed ``fencelock run -- true`` (seconds), never a speed target.
CLI_RUN_BOUND_S = 60.0


def _bench_cli(url: str, prefix: str, quick: bool) -> dict[str, Any]:
    """``cli.run_true_s``: the median wall time (seconds) of ``fencelock run --key K -- true``
    started as a new process (``python -m fencelock``, this very package) against ``url``:
    interpreter start, imports, one acquire, the command, the release.

    Raises :class:`RuntimeError` when a run fails (its last stderr line)."""
    import subprocess

    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["FENCELOCK_SERVERS"] = url  # not on the command line: a password stays out of ps
    argv = [sys.executable, "-m", "fencelock", "run", "--key", prefix + "cli", "--", "true"]
    runs = CLI_RUNS[0] if quick else CLI_RUNS[1]
    times: list[float] = []
    for _ in range(runs):
        began = time.perf_counter()
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=CLI_RUN_BOUND_S
        )
        times.append(time.perf_counter() - began)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"fencelock run -- true exited {done.returncode}: {last}")
    return {"run_true_s": statistics.median(times), "runs": runs}


def _cleanup(urls: Sequence[str], prefix: str) -> None:
    """Remove this run's keys from a user's servers (embedded servers are simply stopped)."""
    for url in urls:
        admin = _admin(url)
        try:
            for pattern in (keys_glob(prefix), prefix + "*"):
                batch = list(admin.scan_iter(match=pattern, count=1000))
                if batch:
                    admin.delete(*batch)
        finally:
            admin.close()


def _environment(url: str) -> dict[str, Any]:
    admin = _admin(url)
    try:
        info: dict[str, Any] = admin.info("server")
    finally:
        admin.close()
    engine = (
        "valkey" if "valkey_version" in info or info.get("server_name") == "valkey" else "redis"
    )
    try:
        import hiredis

        hiredis_version = str(getattr(hiredis, "__version__", "yes"))
    except ImportError:
        hiredis_version = "not installed"
    return {
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "hiredis": hiredis_version,
        "engine": engine,
        "server_version": str(info.get("valkey_version") or info.get("redis_version", "?")),
        "cpus": os.cpu_count() or 0,
    }


def _native_paths(env: Mapping[str, Any]) -> dict[str, Any]:
    """Which path each operation took, and the native compare-and-set commands the server's
    engine and version offer (``SET ... IFEQ``, ``DELIFEQ``, ``DELEX``, as ``fencelock doctor``
    reads them): fencelock runs its Lua scripts on every server today (``SET ... IFEQ``
    compares the whole value, token and holder info, which a lease does not keep, and an
    election's announcement rewrites)."""
    from .doctor import native_commands

    return {
        "acquire": "script",
        "extend": "script",
        "release": "script",
        "server_has": native_commands(env["engine"], env["server_version"], None),
    }


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------


#: The hand-off figures both reports show: (label, field, format spec).
_HANDOFF_ROWS = (
    ("acquisitions/s", "acquisitions_per_s", ",.0f"),
    ("wait p50 us", "p50_us", ",.0f"),
    ("wait p99 us", "p99_us", ",.0f"),
    ("max wait / median wait", "max_wait_ratio", ".2f"),
    ("release -> other worker p50 us", "other_worker_p50_us", ",.0f"),
    ("rounds after the wake (claim)", "claim_rtts", ".2f"),
    ("same worker twice in a row", "same_worker_again", ".1%"),
    ("least served worker / mean", "min_worker_share", ".2f"),
)

#: The sick-minority cases both reports show: (label, case).
_SICK_CASES = (
    ("healthy", "healthy"),
    ("1 hung (SIGSTOP)", "hung_1"),
    ("2 black-holed (connect hangs)", "black_holed_2"),
    ("2 refused (nothing listens)", "refused_2"),
)


def _family_labels(family: dict[str, Any]) -> list[tuple[str, str]]:
    """The family's cases as both reports show them: (label, case), in FAMILY_CASES order."""
    labels = {
        "semaphore": f"semaphore (limit {family['semaphore_limit']}): permit",
        "rw_read": "rwlock: read lease",
        "rw_write": "rwlock: write lease",
        "fair": "fair lock",
        "reentrant": "reentrant lock (depth 1)",
        "multilock_2": "multilock, 2 keys",
    }
    return [(labels[case], case) for case in FAMILY_CASES]


def _human(result: dict[str, Any]) -> str:
    s, r, h, a, m, e = (
        result["single"],
        result["redlock"],
        result["handoff"],
        result["async"],
        result["memory"],
        result["env"],
    )
    t = h["threads"]
    lines = [
        f"fencelock bench — {e['engine']} {e['server_version']}, Python {e['python']}, "
        f"redis-py {e['redis_py']}, hiredis {e['hiredis']}, {e['cpus']} CPUs"
        + (" (quick)" if result["quick"] else ""),
        "",
        f"{'case':<34}{'ours':>14}{'baseline':>14}{'ratio':>9}",
        "-" * 71,
        f"{'single: acquire+release ops/s':<34}{s['ops_per_s']:>14,.0f}"
        f"{s['baseline_ops_per_s']:>14,.0f}{s['ratio_to_baseline']:>9.2f}",
        f"{'single: p50 / p99 us':<34}{s['p50_us']:>7.0f} /{s['p99_us']:>5.0f}"
        f"{s['baseline_p50_us']:>7.0f} /{s['baseline_p99_us']:>5.0f}",
        f"{'single: client CPU us/op':<34}{s['cpu_us_per_op']:>14.1f}"
        f"{s['baseline_cpu_us_per_op']:>14.1f}"
        f"{_ratio(s['cpu_us_per_op'], s['baseline_cpu_us_per_op']):>9.2f}",
        f"{'single: new Lock per cycle ops/s':<34}{s['per_key_ops_per_s']:>14,.0f}"
        f"{s['baseline_ops_per_s']:>14,.0f}{s['per_key_ratio_to_baseline']:>9.2f}",
        f"{'single: server CPU us/op':<34}{s['server_cpu_us_per_op']:>14.1f}"
        f"{s['baseline_server_cpu_us_per_op']:>14.1f}{s['server_cpu_ratio']:>9.2f}",
        f"{'single: server exec us/op':<34}{s['server_exec_us_per_op']:>14.1f}"
        f"{s['baseline_server_exec_us_per_op']:>14.1f}{s['server_exec_ratio']:>9.2f}",
        f"{'single: server commands/op':<34}{s['server_commands_per_op']:>14.1f}"
        f"{s['baseline_server_commands_per_op']:>14.1f}"
        f"{_ratio(s['server_commands_per_op'], s['baseline_server_commands_per_op']):>9.2f}",
        f"{'async x' + str(a['tasks']) + ' tasks: ops/s':<34}{a['ops_per_s']:>14,.0f}"
        f"{a['baseline_ops_per_s']:>14,.0f}{a['ratio_to_baseline']:>9.2f}",
        f"{'async: new Lock per cycle ops/s':<34}{a['per_key_ops_per_s']:>14,.0f}"
        f"{a['baseline_ops_per_s']:>14,.0f}{a['per_key_ratio_to_baseline']:>9.2f}",
        f"{'async: client CPU us/op':<34}{a['cpu_us_per_op']:>14.1f}"
        f"{a['baseline_cpu_us_per_op']:>14.1f}"
        f"{_ratio(a['cpu_us_per_op'], a['baseline_cpu_us_per_op']):>9.2f}",
        "",
        f"{'redlock over ' + str(r['servers']) + ' servers':<34}{'p50 us':>14}{'p99 us':>14}"
        f"{'x single':>9}",
        "-" * 71,
        f"{'acquire+release':<34}{r['p50_us']:>14.0f}{r['p99_us']:>14.0f}"
        f"{r['ratio_p50_to_single']:>9.2f}",
        f"{'one server (same run)':<34}{r['single_p50_us']:>14.0f}{'':>14}{1.0:>9.2f}",
        f"{'asyncio, one task':<34}{r['async_p50_us']:>14.0f}{'':>14}"
        f"{r['async_ratio_p50_to_raw_single']:>9.2f}",
        f"{'raw redis.asyncio, one server':<34}{r['async_raw_single_p50_us']:>14.0f}{'':>14}"
        f"{1.0:>9.2f}",
        "",
        f"{'hand-off, ' + str(h['workers']) + ' workers, 1 key':<34}{'processes':>14}"
        f"{'threads':>14}",
        "-" * 71,
    ]
    for label, field, spec in _HANDOFF_ROWS:
        lines.append(f"{label:<34}{format(h[field], spec):>14}{format(t[field], spec):>14}")
    lines.append(f"{'per worker (processes)':<34}{' '.join(str(c) for c in h['per_worker'])}")
    lines.append(f"{'per worker (threads)':<34}{' '.join(str(c) for c in t['per_worker'])}")
    f = result["faults"]
    lines += [
        "",
        f"{'sick minority of ' + str(f['servers']) + ' servers':<34}{'p50 us':>14}"
        f"{'x healthy':>14}",
        "-" * 71,
    ]
    if "skipped" in f:
        lines.append(f"skipped: {f['skipped']}")
    else:
        lines.append(f"(server timeout {f['server_timeout_s']:g} s, acquire+release per cycle)")
        for label, case in _SICK_CASES:
            p50 = f[f"{case}_p50_us"]
            lines.append(f"{label:<34}{p50:>14,.0f}{_ratio(p50, f['healthy_p50_us']):>14.2f}")
    fam = result["family"]
    lines += [
        "",
        f"{'one server, uncontended':<34}{'ops/s':>14}{'p50 us':>14}{'x Lock':>9}",
        "-" * 71,
        f"{'Lock: acquire+release':<34}{fam['lock_ops_per_s']:>14,.0f}"
        f"{fam['lock_p50_us']:>14,.0f}{1.0:>9.2f}",
    ]
    for label, case in _family_labels(fam):
        lines.append(
            f"{label:<34}{fam[case + '_ops_per_s']:>14,.0f}{fam[case + '_p50_us']:>14,.0f}"
            f"{fam[case + '_ratio_to_lock']:>9.2f}"
        )
    by_key = ", ".join(f"{k} {v} B" for k, v in m["bytes_by_key"].items())
    permit_by_key = ", ".join(f"{k} {v} B" for k, v in m["permit_bytes_by_key"].items())
    lines += [
        "",
        f"server memory per held lock: {m['bytes_per_held_lock']} B ({by_key})",
        f"per held semaphore permit: {m['bytes_per_held_permit']} B ({permit_by_key}); "
        f"per read lease: {m['bytes_per_read_lease']} B (the readers zset with one), "
        f"{m['bytes_per_extra_read_lease']} B each more",
        f"after release: {', '.join(m['keys_after_release']) or 'nothing'} "
        f"({m['bytes_after_release']} B); garbage keys: {m['garbage_after_release']}; "
        f"keys without TTL besides fence registers after all phases: "
        f"{len(result['garbage_keys'])}",
        f"per key locked once: {m['bytes_per_key_used_once']:.0f} B (used_memory over "
        f"{m['keys_used_once']} keys; the register: {m['register_bytes']} B); after its "
        f"{m['retention_s']:g} s retention: {m['bytes_after_retention']:.0f} B, "
        f"{m['registers_left_after_retention']} registers left",
        f"took {result['duration_s']:.1f} s",
    ]
    return "\n".join(lines)


def html_report(result: dict[str, Any]) -> str:
    """``fencelock bench --html``: the tables and latency histograms (inline SVG) of one
    :func:`measure` result, as one self-contained HTML page."""
    from ._html import histogram_svg, page, table

    s, r, h, a, f, m, e = (
        result["single"],
        result["redlock"],
        result["handoff"],
        result["async"],
        result["faults"],
        result["memory"],
        result["env"],
    )

    def n(value: float, spec: str = ",.0f") -> tuple[str, str]:
        return (format(value, spec), "")

    def label(text: str) -> tuple[str, str]:
        return (text, "")

    def row(
        text: str, first: float, second: float, ratio: float | None = None, spec: str = ",.0f"
    ) -> tuple[tuple[str, str], ...]:
        """Two figures in ``spec`` and their ratio (blank when None)."""
        shown = ("", "") if ratio is None else n(ratio, ".2f")
        return (label(text), n(first, spec), n(second, spec), shown)

    base_cpu = s["baseline_cpu_us_per_op"]
    base_commands = s["baseline_server_commands_per_op"]
    body = ["<h2>Ours against raw redis-py (same run, interleaved)</h2>"]
    body.append(
        table(
            ("case", "ours", "baseline", "ratio"),
            [
                row(
                    "single: acquire+release ops/s",
                    s["ops_per_s"],
                    s["baseline_ops_per_s"],
                    s["ratio_to_baseline"],
                ),
                row("single: p50 us", s["p50_us"], s["baseline_p50_us"]),
                row("single: p99 us", s["p99_us"], s["baseline_p99_us"]),
                row(
                    "single: new Lock per cycle ops/s",
                    s["per_key_ops_per_s"],
                    s["baseline_ops_per_s"],
                    s["per_key_ratio_to_baseline"],
                ),
                row(
                    "single: client CPU us/op",
                    s["cpu_us_per_op"],
                    base_cpu,
                    _ratio(s["cpu_us_per_op"], base_cpu),
                    ".1f",
                ),
                row(
                    "single: server CPU us/op",
                    s["server_cpu_us_per_op"],
                    s["baseline_server_cpu_us_per_op"],
                    s["server_cpu_ratio"],
                    ".1f",
                ),
                row(
                    "single: server exec us/op",
                    s["server_exec_us_per_op"],
                    s["baseline_server_exec_us_per_op"],
                    s["server_exec_ratio"],
                    ".1f",
                ),
                row(
                    "single: server commands/op",
                    s["server_commands_per_op"],
                    base_commands,
                    _ratio(s["server_commands_per_op"], base_commands),
                    ".1f",
                ),
                row(
                    f"async x{a['tasks']} tasks: ops/s",
                    a["ops_per_s"],
                    a["baseline_ops_per_s"],
                    a["ratio_to_baseline"],
                ),
                row(
                    "async: new Lock per cycle ops/s",
                    a["per_key_ops_per_s"],
                    a["baseline_ops_per_s"],
                    a["per_key_ratio_to_baseline"],
                ),
            ],
            cls="bench",
        )
    )
    body.append(histogram_svg("single server: acquire+release latency", **_hist(s)))
    body.append(f"<h2>Redlock over {r['servers']} servers</h2>")
    body.append(
        table(
            ("case", "p50 us", "p99 us", "x single"),
            [
                row("acquire+release", r["p50_us"], r["p99_us"], r["ratio_p50_to_single"]),
                (label("one server (same run)"), n(r["single_p50_us"]), ("", ""), ("1.00", "")),
                (
                    label("asyncio, one task (x raw redis.asyncio, one server)"),
                    n(r["async_p50_us"]),
                    ("", ""),
                    n(r["async_ratio_p50_to_raw_single"], ".2f"),
                ),
                (
                    label("raw redis.asyncio, one server"),
                    n(r["async_raw_single_p50_us"]),
                    ("", ""),
                    ("1.00", ""),
                ),
            ],
            cls="bench",
        )
    )
    body.append(histogram_svg("redlock: acquire+release latency", **_hist(r)))
    t = h["threads"]
    body.append(f"<h2>Hand-off: {h['workers']} workers, one key</h2>")
    rows = []
    for text, key, spec in _HANDOFF_ROWS:
        rows.append((label(text), n(h[key], spec), n(t[key], spec)))
    body.append(table(("figure", "processes", "threads"), rows, cls="bench"))
    body.append(histogram_svg("hand-off: wait for the lease (processes)", **_hist(h)))
    body.append(f"<h2>A sick minority of {f['servers']} servers</h2>")
    if "skipped" in f:
        body.append(f"<p>skipped: {f['skipped']}</p>")
    else:
        sick_rows = []
        for text, case in _SICK_CASES:
            p50 = f[f"{case}_p50_us"]
            sick_rows.append(
                (
                    label(text),
                    n(p50),
                    n(f.get(f"{case}_p99_us", 0.0)),
                    n(_ratio(p50, f["healthy_p50_us"]), ".2f"),
                )
            )
        body.append(table(("case", "p50 us", "p99 us", "x healthy"), sick_rows, cls="bench"))
        if "histogram" in f:
            body.append(histogram_svg("sick minority: acquire+release latency", **_hist(f)))
    fam = result["family"]
    body.append("<h2>The family against the Lock (one server)</h2>")
    family_rows = [
        (label("Lock: acquire+release"), n(fam["lock_ops_per_s"]), n(fam["lock_p50_us"]),
         ("1.00", "")),
    ]  # fmt: skip
    for text, case in _family_labels(fam):
        family_rows.append(
            (
                label(text),
                n(fam[f"{case}_ops_per_s"]),
                n(fam[f"{case}_p50_us"]),
                n(fam[f"{case}_ratio_to_lock"], ".2f"),
            )
        )
    body.append(table(("case", "ops/s", "p50 us", "x Lock"), family_rows, cls="bench"))
    body.append("<h2>Server memory</h2>")
    body.append(
        table(
            ("figure", "value"),
            [
                (label("bytes per held lock"), (str(m["bytes_per_held_lock"]), "")),
                (label("bytes per held semaphore permit"), (str(m["bytes_per_held_permit"]), "")),
                (label("bytes per read lease (first)"), (str(m["bytes_per_read_lease"]), "")),
                (
                    label("left after release"),
                    (", ".join(m["keys_after_release"]) or "nothing", ""),
                ),
                (label("garbage keys after all phases"), (str(len(result["garbage_keys"])), "")),
                (label("bytes per key locked once"), n(m["bytes_per_key_used_once"])),
                (
                    label(f"bytes per key after its {m['retention_s']:g} s retention"),
                    n(m["bytes_after_retention"]),
                ),
            ],
        )
    )
    subtitle = (
        f"{e['engine']} {e['server_version']}, Python {e['python']}, redis-py {e['redis_py']}, "
        f"hiredis {e['hiredis']}, {e['cpus']} CPUs{' (quick)' if result['quick'] else ''}; "
        f"took {result['duration_s']:.1f} s"
    )
    return page("fencelock bench", subtitle, body)


def _hist(section: dict[str, Any]) -> dict[str, Any]:
    hist = section.get("histogram") or {"edges_us": [0.0, 1.0], "counts": {}}
    return {"edges_us": hist["edges_us"], "counts": hist["counts"]}


def _is_quick(quick: bool | None) -> bool:
    if quick is not None:
        return quick
    return os.environ.get(QUICK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def measure(
    servers: Sequence[str], *, quick: bool | None = None, progress: bool = False
) -> dict[str, Any]:
    """Run every case and return the result dict (the ``--json`` object plus extra fields).

    ``servers``: URLs to measure (the first serves the one-server cases; all of them the
    Redlock case when there are at least 3); empty: 5 embedded servers are started and stopped.
    Raises :class:`~fencelock.ConfigError` for a malformed URL (before any I/O),
    :class:`fencelock.testing.ServerError` when embedded servers cannot start, and redis-py's
    errors when a server does not answer.
    """
    from ..options import check_url

    urls = [check_url(u) for u in servers]
    plan = QUICK if _is_quick(quick) else FULL
    prefix = f"fencelock-bench:{secrets.token_hex(4)}:"
    started = time.monotonic()
    group = None
    if not urls:
        from ..testing import ServerGroup

        _progress(progress, "starting 5 embedded servers")
        group = ServerGroup(5).start()
        urls = group.urls
    try:
        single_url = urls[0]
        redlock_urls = urls if len(urls) >= 3 else urls[: len(urls)]
        env = _environment(single_url)
        _progress(progress, "single server vs raw redis-py")
        single = _bench_single(single_url, prefix, plan)
        _progress(progress, f"redlock over {len(redlock_urls)} servers")
        red = _bench_redlock(redlock_urls, prefix, plan)
        _progress(progress, f"hand-off, {HANDOFF_WORKERS} processes then threads")
        handoff = _bench_handoff(single_url, prefix, plan)
        _progress(progress, f"asyncio, {ASYNC_TASKS} tasks vs raw redis.asyncio")
        asynch = _bench_async(single_url, prefix, plan)
        _progress(progress, f"{FAULT_SERVERS} embedded servers with a sick minority")
        faults = _bench_faults(prefix, plan)
        _progress(progress, "semaphore and read-write lock vs the plain Lock")
        family = _bench_family(single_url, prefix, plan)
        _progress(progress, "fencelock run -- true, started as a new process")
        cli = _bench_cli(single_url, prefix, plan is QUICK)
        memory = _memory(single_url, prefix)
        natives = _native_paths(env)
        garbage = _persistent_garbage(single_url, prefix)
        # Redlock against the raw one-server baseline (SET NX PX + EVALSHA) of the same run
        red["raw_single_p50_us"] = single["baseline_p50_us"]
        red["ratio_p50_to_raw_single"] = _ratio(red["p50_us"], single["baseline_p50_us"])
        # issue 24's name for the figure, beside the uncontended path it belongs to
        single["bytes_per_held_lock"] = memory["bytes_per_held_lock"]
    finally:
        if group is not None:
            group.stop()
        else:
            _cleanup(urls, prefix)
    return {
        "single": single,
        "redlock": red,
        "handoff": handoff,
        "async": asynch,
        "faults": faults,
        "family": family,
        "cli": cli,
        "memory": memory,
        "native_commands": natives,
        "garbage_keys": garbage,
        "env": env,
        "quick": plan is QUICK,
        "duration_s": time.monotonic() - started,
    }


def run(
    servers: list[str],
    json_output: bool = False,
    *,
    quick: bool | None = None,
    html_path: str | None = None,
) -> int:
    """``fencelock bench``: print the results (a table, or one JSON object) and return 0.

    ``quick`` (default: ``$FENCELOCK_BENCH_QUICK``) makes a short run for CI smoke tests;
    ``html_path``: also write :func:`html_report` to that file. Raises like :func:`measure`.
    """
    result = measure(servers, quick=quick, progress=not json_output)
    if html_path is not None:
        with open(html_path, "w", encoding="utf-8") as fh:
            fh.write(html_report(result))
        _progress(True, f"wrote {html_path}")
    if json_output:
        print(json.dumps(result, separators=(",", ":")))
    else:
        print(_human(result))
    return 0
