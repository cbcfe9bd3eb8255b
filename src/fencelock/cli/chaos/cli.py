"""``fencelock chaos``: a fault-injection run on embedded servers.

:func:`run` is what the ``fencelock chaos`` command calls; :func:`run_chaos` does the work and
returns a :class:`~fencelock.chaos.report.ChaosResult`; :func:`analyse` turns a history into
one (pure). Durations are seconds.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from ..._core.keys import lock_keys, rw_keys, slot_keys
from ...errors import ConfigError
from ...fence import DEFAULT_PREFIX
from ...testing import Persistence, find_server_binary
from .checkers import (
    Op,
    check_canary,
    check_election,
    check_fenced_register,
    check_fences,
    check_key_fences,
    check_lease_overlap,
    check_liveness,
    check_permit_overlap,
    check_rw_exclusion,
    check_writer_fences,
    lease_modes,
    lease_windows,
    reader_fence_duplicates,
    unfenced_overlaps,
)
from .nemesis import (
    ALL_FAULTS,
    CATEGORY,
    FaultRecord,
    Nemesis,
    Topology,
    faketime_available,
    make_schedule,
)
from .report import ChaosResult, History, availability, html_report
from .workload import (
    CANARY_KEY,
    FRONTS,
    PRIMITIVE_ALIASES,
    PRIMITIVES,
    RESOURCE,
    WorkerConfig,
    WorkerPool,
    decode_count,
    multi_keys,
)

__all__ = [
    "DEFAULT_LIMIT",
    "FRONTS",
    "PRIMITIVES",
    "ChaosConfig",
    "analyse",
    "default_faults",
    "run",
    "run_chaos",
]

LIVENESS_MARGIN_S = 1.0  # generous: 2 shared cores, other processes running
DEFAULT_LIMIT = 2  # ``--primitive semaphore``: permits (below the default 5 workers: contention)


@dataclass(frozen=True)
class ChaosConfig:
    """A run's settings. ``ttl`` is the lease (s); ``work_s`` the mean time a holder works;
    ``primitive`` one of :data:`PRIMITIVES` (``"rw"`` is taken as ``"rwlock"``); ``limit`` the
    semaphore's permits; ``front`` one of :data:`FRONTS`."""

    servers: int = 5
    workers: int = 5
    duration: float = 30.0
    faults: tuple[str, ...] = ()
    seed: int = 0
    ttl: float = 1.0
    work_s: float = 0.03
    persistence: Persistence = "aof-always"
    key: str = "chaos"
    retry_cap: float = 0.5
    skipped: tuple[str, ...] = field(default=())
    primitive: str = "lock"
    limit: int = DEFAULT_LIMIT
    front: str = "sync"

    def __post_init__(self) -> None:
        if self.servers < 1 or self.workers < 1:
            raise ConfigError("servers and workers must be >= 1")
        object.__setattr__(self, "primitive", PRIMITIVE_ALIASES.get(self.primitive, self.primitive))
        if self.primitive not in PRIMITIVES:
            raise ConfigError(
                f"primitive must be one of {', '.join(PRIMITIVES)}, not {self.primitive!r}"
            )
        if self.front not in FRONTS:
            raise ConfigError(f"front must be one of {', '.join(FRONTS)}, not {self.front!r}")
        check_front(self.primitive, self.front)
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ConfigError(f"limit must be an int >= 1, not {self.limit!r}")
        if not self.duration > 0 or self.duration > 86_400:
            raise ConfigError(f"duration must be in (0, 86400] s, got {self.duration}")
        unknown = [f for f in self.faults if f not in CATEGORY]
        if unknown:
            raise ConfigError(f"unknown faults {unknown}; known: {', '.join(ALL_FAULTS)}")


#: The class each primitive comes from, looked up in the front end's module.
_FORMS = {
    "lock": "Lock",
    "fair": "Lock",
    "semaphore": "Semaphore",
    "rwlock": "RWLock",
    "multi": "MultiLock",
    "election": "Election",
}


def check_front(primitive: str, front: str) -> None:
    """Raise :class:`~fencelock.ConfigError` (before anything starts) when ``front`` has no
    form of ``primitive`` (today every primitive has both)."""
    import fencelock
    import fencelock.asyncio

    module = fencelock.asyncio if front == "asyncio" else fencelock
    if not hasattr(module, _FORMS[primitive]):
        raise ConfigError(
            f"--primitive {primitive} has no {front} form ({module.__name__}."
            f"{_FORMS[primitive]} does not exist)"
        )


def default_faults(servers: int, faketime: bool) -> tuple[str, ...]:
    """Every fault that makes sense for ``servers`` lock servers."""
    out = []
    for name in ALL_FAULTS:
        if name == "faketime-jump" and not faketime:
            continue
        if servers < 3 and name in ("partition", "clock-jump", "faketime-jump"):
            continue
        out.append(name)
    return tuple(out)


# --------------------------------------------------------------------------------------------
# analysis (pure)


def analyse(
    ops: Sequence[Op],
    *,
    fenced_final: int,
    canary_final: int,
    records: Sequence[FaultRecord],
    start_ns: int,
    end_ns: int,
    ttl: float,
    retry_cap: float,
    extra: dict[str, object] | None = None,
    primitive: str = "lock",
    limit: int = DEFAULT_LIMIT,
    front: str = "sync",
) -> ChaosResult:
    """Run every checker over a finished history and build the result.

    ``primitive`` says which exclusion rule the lease windows must keep: a lock's (never two
    valid at once; a MultiLock's and an election's too), a semaphore's (never more than
    ``limit``) or a read-write lock's (never a writer with a reader or another writer);
    ``double_grants`` counts the breaches of that rule, and the primitive's own figures are
    added (``permit_overlaps``, ``max_concurrent_permits``; ``writer_with_reader``,
    ``two_writers``, ``max_readers``, ``writer_fence_violations``, ``reader_fence_duplicates``;
    ``keys``, ``fence_violations_by_key``; ``terms``, ``two_leaders_in_a_term``,
    ``terms_out_of_order``, ``two_leaders_at_once``, ``terms_lost``, ``bodies_cancelled``).
    ``front`` (``"sync"`` or ``"asyncio"``) is reported as given.

    ``fence_violations`` counts fences handed out twice and fences out of grant order; for a
    read-write lock, a fence shared only by readers is not counted there (readers may share
    one: over N servers two concurrent readers' merged fences can be equal; no writer's can)
    but in ``reader_fence_duplicates``; for a MultiLock it is counted per key (each key has
    its own fences)."""
    fenced = check_fenced_register(ops, fenced_final)
    canary = check_canary(ops, canary_final)
    fences = check_fences(ops)
    windows = lease_windows(ops)
    overlap = check_lease_overlap(windows)
    family: dict[str, object] = {"primitive": primitive, "front": front}
    double_grants = overlap.double_grants
    fence_violations = fences.duplicates + fences.out_of_order
    if primitive == "semaphore":
        permits = check_permit_overlap(windows, limit)
        double_grants = permits.over_limit
        family.update(
            limit=limit,
            permit_overlaps=permits.over_limit,
            max_concurrent_permits=permits.max_concurrent,
        )
    reader_dups = 0
    if primitive == "rwlock":
        reader_dups = reader_fence_duplicates(ops)
        rw = check_rw_exclusion(windows, lease_modes(ops))
        writer_fences = check_writer_fences(ops)
        double_grants = rw.writer_with_reader + rw.two_writers
        family.update(
            reads=rw.readers,
            writes=rw.writers,
            writer_with_reader=rw.writer_with_reader,
            two_writers=rw.two_writers,
            max_readers=rw.max_readers,
            writer_fence_violations=writer_fences.violations,
            reader_fence_duplicates=reader_dups,
        )
        fence_violations -= reader_dups
    if primitive == "multi":
        keyed = check_key_fences(ops)
        fence_violations = keyed.duplicates + keyed.out_of_order  # the first key's included
        family.update(keys=len(keyed.keys), fence_violations_by_key=keyed.by_key)
    if primitive == "election":
        election = check_election(ops)
        family.update(
            terms=election.terms,
            two_leaders_in_a_term=election.same_term,
            terms_out_of_order=election.out_of_order,
            two_leaders_at_once=election.two_leaders,
            terms_lost=sum(1 for op in ops if op.kind == "release" and op.status == "fail"),
            bodies_cancelled=sum(1 for op in ops if op.kind == "work" and op.info == "cancelled"),
        )
    acquired = sorted(
        op.done_ns
        for op in ops
        if op.kind == "acquire" and op.status == "ok" and op.done_ns is not None
    )
    bound = ttl + retry_cap + LIVENESS_MARGIN_S
    heals = [r.heal_ns for r in records if r.heal_ns is not None and not r.error]
    live = check_liveness(heals, acquired, end_ns=end_ns, bound_s=bound)
    counts: dict[str, int] = {}
    for r in records:
        if not r.error:
            counts[r.fault.name] = counts.get(r.fault.name, 0) + 1
    by_category: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        if r.heal_ns is not None and not r.error:
            by_category.setdefault(r.fault.name, []).append((r.start_ns, r.heal_ns))
    avail_by_fault = {
        name: _availability_during(acquired, spans) for name, spans in by_category.items()
    }
    attempts = [op for op in ops if op.kind == "acquire"]
    details: dict[str, object] = {
        "canary_writes_acknowledged": canary.acknowledged,
        "canary_lost_updates": canary.lost_updates,
        "fenced_writes_unknown": fenced.unknown,
        "phantom_writes": fenced.phantom,
        "fenced_final_value": fenced.final,
        "double_grants": double_grants,
        "outlived_leases": overlap.outlived,
        "fence_violations": fence_violations,
        "acquire_attempts": len(attempts),
        "acquire_unavailable": sum(1 for op in attempts if op.info == "unavailable"),
        "availability_during_fault": avail_by_fault,
        "recovery_bound_s": bound,
        "recovery_max_s": None if live.max_delay_s is None else round(live.max_delay_s, 3),
        "recovery_median_s": (
            None if live.median_delay_s is None else round(live.median_delay_s, 3)
        ),
        "liveness_late": live.late,
        "fault_errors": sum(1 for r in records if r.error),
        **family,
    }
    if extra:
        details.update(extra)
    return ChaosResult(
        acquisitions=len(acquired),
        fenced_writes_accepted=fenced.acknowledged,
        stale_writes_rejected=fenced.rejected,
        stale_writes_accepted=fenced.stale_accepted,
        lost_updates=fenced.lost_updates,
        unfenced_overlaps=unfenced_overlaps(ops),
        availability=availability(acquired, start_ns, end_ns),
        faults=counts,
        duration_s=round((end_ns - start_ns) / 1e9, 3),
        details=details,
    )


def _availability_during(acquired: list[int], spans: list[tuple[int, int]]) -> float:
    """Fraction of 0.25-s buckets inside fault spans with an acquisition."""
    width = 250_000_000
    total = hit = 0
    import bisect

    for start, end in spans:
        t = start
        while t + width <= end:
            total += 1
            i = bisect.bisect_left(acquired, t)
            if i < len(acquired) and acquired[i] < t + width:
                hit += 1
            t += width
    return round(hit / total, 4) if total else 1.0


# --------------------------------------------------------------------------------------------
# the run


class _Progress:
    """Live progress on ``stream``: a rewritten line on a TTY, else a line every 5 s."""

    def __init__(
        self, stream: TextIO, pool: WorkerPool, nemesis: Nemesis, t0: float, duration: float
    ) -> None:
        self.stream = stream
        self.pool = pool
        self.nemesis = nemesis
        self.t0 = t0
        self.duration = duration
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-progress", daemon=True)

    def start(self) -> _Progress:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        if self.tty:
            with contextlib.suppress(Exception):
                self.stream.write("\n")
                self.stream.flush()

    def _line(self) -> str:
        ops = list(self.pool.ops)
        fenced = check_fenced_register(ops, final=10**12)  # final unknown yet: stale only
        overlaps = unfenced_overlaps(ops)
        faults = sum(self.nemesis.injected.values())
        elapsed = time.monotonic() - self.t0
        return (
            f"chaos {elapsed:5.1f}/{self.duration:.0f}s  acquisitions {self.pool.acquisitions}"
            f"  faults {faults}  stale accepted {fenced.stale_accepted}"
            f"  stale rejected {fenced.rejected}  canary overlaps {overlaps}"
        )

    def _run(self) -> None:
        every = 0.5 if self.tty else 5.0
        while not self._stop.wait(every):
            try:
                line = self._line()
                if self.tty:
                    self.stream.write("\r\x1b[K" + line)
                else:
                    self.stream.write(line + "\n")
                self.stream.flush()
            except Exception:
                return


def _expire_keys(config: ChaosConfig) -> tuple[str, ...]:
    """What ``clock-jump`` expires on a node: the keys a holder of the primitive holds there."""
    if config.primitive == "semaphore":
        return tuple(slot_keys(config.key, i).lock for i in range(config.limit))
    if config.primitive == "rwlock":
        keys = rw_keys(config.key)
        return (keys.writer.lock, keys.readers)
    if config.primitive == "multi":
        return tuple(lock_keys(name).lock for name in multi_keys(config.key))
    return ()  # a lock, a fair lock, an election: the key's lock


def run_chaos(
    config: ChaosConfig, *, progress: TextIO | None = None, log: TextIO | None = None
) -> tuple[ChaosResult, list[FaultRecord]]:
    """Start the topology and workers, play the schedule for ``config.duration`` seconds, stop
    everything (by PID, in ``finally``), check the history. Returns the result and the fault
    log. Raises :class:`~fencelock.testing.ServerError` if servers cannot start."""
    binary = find_server_binary()
    use_faketime = "faketime-jump" in config.faults and faketime_available(binary)
    faults = [f for f in config.faults if f != "faketime-jump" or use_faketime]
    skipped = list(config.skipped) + (
        ["faketime-jump"] if "faketime-jump" in config.faults and not use_faketime else []
    )
    schedule = make_schedule(
        config.seed, config.duration, faults, servers=config.servers, ttl=config.ttl
    )
    topo = Topology(config.servers, persistence=config.persistence, faketime=use_faketime)
    pool: WorkerPool | None = None
    nemesis: Nemesis | None = None
    bar: _Progress | None = None
    try:
        topo.start()
        bound = time.monotonic() + config.duration + 120.0
        rng = random.Random(config.seed)
        configs = [
            WorkerConfig(
                worker=w,
                lock_urls=tuple(topo.lock_urls),
                storage_url=topo.storage.url,
                key=config.key,
                ttl=config.ttl,
                wait=3 * config.ttl,
                work_s=config.work_s,
                seed=rng.randrange(2**31),
                deadline_s=bound,
                primitive=config.primitive,
                limit=config.limit,
                front=config.front,
            )
            for w in range(config.workers)
        ]
        pool = WorkerPool(configs).start()
        nemesis = Nemesis(
            topo,
            schedule,
            config.key,
            holder_probe=pool.holder_after,
            signal_worker=pool.signal,
            iteration_done=pool.iteration_done,
            expire_keys=_expire_keys(config),
        )
        start_ns = time.monotonic_ns()
        t0 = time.monotonic()
        nemesis.start()
        if progress is not None:
            bar = _Progress(progress, pool, nemesis, t0, config.duration).start()
        time.sleep(max(config.duration - (time.monotonic() - t0), 0.0))
        nemesis.stop(timeout=60.0)
        end_ns = time.monotonic_ns()
        if bar is not None:
            bar.stop()
            bar = None
        pool.stop(timeout=30.0)
        with topo.storage.client() as storage:
            fenced_raw = storage.hget(DEFAULT_PREFIX + RESOURCE, "value")
            canary_raw = storage.get(CANARY_KEY)
        records = list(nemesis.records)
        extra: dict[str, object] = {
            "seed": config.seed,
            "servers": config.servers,
            "workers": config.workers,
            "ttl_s": config.ttl,
            "engine": topo.servers[0].engine.name,
            "skipped_faults": skipped,
            "fault_log": [str(r) for r in records],
        }
        result = analyse(
            pool.ops,
            fenced_final=decode_count(fenced_raw),
            canary_final=decode_count(canary_raw),
            records=records,
            start_ns=start_ns,
            end_ns=end_ns,
            ttl=config.ttl,
            retry_cap=config.retry_cap,
            extra=extra,
            primitive=config.primitive,
            limit=config.limit,
            front=config.front,
        )
        result.history = History(
            ops=list(pool.ops),
            records=records,
            start_ns=start_ns,
            end_ns=end_ns,
            servers=config.servers,
            workers=config.workers,
        )
        if log is not None and not result.safe:
            log.write(f"safety violation; schedule (seed {config.seed}):\n")
            for r in records:
                log.write(f"  {r}\n")
        return result, records
    finally:
        if bar is not None:
            bar.stop()
        if nemesis is not None:
            nemesis.stop(timeout=60.0)
        if pool is not None:
            pool.stop(timeout=10.0)
        topo.stop()


def run(
    servers: int = 5,
    workers: int = 5,
    duration: float = 30.0,
    faults: list[str] | None = None,
    seed: int | None = None,
    json_output: bool = False,
    html_path: str | None = None,
    primitive: str = "lock",
    limit: int = DEFAULT_LIMIT,
    front: str = "sync",
) -> int:
    """The ``fencelock chaos`` command: 0 when the fenced register saw no safety violation
    (no stale write accepted, no lost update), 1 otherwise. ``primitive`` (one of
    :data:`PRIMITIVES`, or ``"rw"`` for ``"rwlock"``) is what the workers acquire; ``limit``:
    a semaphore's permits; ``front`` (one of :data:`FRONTS`): the blocking API or
    :mod:`fencelock.asyncio`. With ``json_output`` exactly one JSON object goes to stdout;
    progress and the table go to stderr. With ``html_path`` the run's picture
    (:func:`~fencelock.chaos.report.html_report`) is written to that file. Raises
    :class:`~fencelock.ConfigError` for a bad primitive, front or limit, or a primitive the
    front has no form of, before anything starts."""
    binary = find_server_binary()
    faketime = faketime_available(binary)
    chosen = tuple(faults) if faults else default_faults(servers, faketime)
    seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    err = sys.stderr
    config = ChaosConfig(
        servers=servers,
        workers=workers,
        duration=float(duration),
        faults=chosen,
        seed=seed,
        primitive=primitive,
        limit=limit,
        front=front,
    )
    primitive = config.primitive  # "rw" is "rwlock"
    what = {
        "lock": "a lock",
        "fair": "a fair lock",
        "semaphore": f"a semaphore of {limit}",
        "rwlock": "a rwlock",
        "multi": "a multilock of 2 keys",
        "election": "an election",
    }
    err.write(
        f"fencelock chaos: {what[primitive]} ({front}), {servers} servers, {workers} workers, "
        f"{duration:g} s, seed {seed}, faults: {', '.join(chosen)}\n"
    )
    if "faketime-jump" in chosen and not faketime:
        err.write(
            "fencelock chaos: faketime-jump skipped (needs the `faketime` package and "
            "the valkey-server binary)\n"
        )
    err.flush()
    result, _ = run_chaos(config, progress=err, log=err)
    err.write(result.table() + "\n")
    if html_path is not None and result.history is not None:
        with open(html_path, "w", encoding="utf-8") as fh:
            fh.write(html_report(result, result.history))
        err.write(f"fencelock chaos: wrote {html_path}\n")
    if not result.safe:
        family = "" if primitive == "lock" else f" --primitive {primitive}"
        if primitive == "semaphore":
            family += f" --limit {limit}"
        if front != "sync":
            family += f" --front {front}"
        err.write(
            f"replay: fencelock chaos{family} --servers {servers} --workers {workers} "
            f"--duration {duration:g} --faults {','.join(chosen)} --seed {seed}\n"
        )
    err.flush()
    if json_output:
        sys.stdout.write(result.to_json() + "\n")
        sys.stdout.flush()
    return 0 if result.safe else 1
