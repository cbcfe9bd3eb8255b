"""Checkers: pure functions over histories (no I/O, no clock reads).

A history is a list of :class:`Op` records, one per operation a worker performed, each with the
``time.monotonic_ns()`` of its invocation and of its completion (the monotonic clock is
system-wide on Linux, so histories of different processes compare). An operation that never
completed (its process was killed) has ``status="unknown"`` and ``done_ns=None``.

Operation kinds written by :mod:`fencelock.chaos.workload`:

- ``acquire``: ``fence`` and ``until_ns`` (end of the lease's validity) when ``ok``; for a
  read-write lock ``info`` is ``"read"`` or ``"write"`` (the mode asked for), for a
  semaphore ``"permit"``;
- ``advance`` / ``read`` / ``write``: the fenced register (``value`` = the count read or
  written; ``fail`` with ``info="stale"`` = refused for an older fence);
- ``canary-read`` / ``canary-write``: the unfenced canary register, same shape;
- ``key-fence``: one per key of a MultiLock's grant (``fence`` that key's, ``info`` the key);
- ``work``: only when the asyncio front end cancelled the body (``info="cancelled"``);
- ``release``.

Each checker returns a small frozen result whose ``ok`` property says whether the safety
property held; the fields count what was seen.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "ElectionResult",
    "FenceResult",
    "KeyFenceResult",
    "LeaseWindow",
    "LivenessResult",
    "Op",
    "OverlapResult",
    "PermitResult",
    "RWResult",
    "RegisterResult",
    "WriterFenceResult",
    "check_canary",
    "check_election",
    "check_fenced_register",
    "check_fences",
    "check_key_fences",
    "check_lease_overlap",
    "check_liveness",
    "check_permit_overlap",
    "check_rw_exclusion",
    "check_writer_fences",
    "lease_modes",
    "lease_windows",
    "reader_fence_duplicates",
    "stale_accepted_writes",
    "unfenced_overlap_ops",
    "unfenced_overlaps",
]

Status = Literal["ok", "fail", "unknown"]


@dataclass(frozen=True)
class Op:
    """One operation of one worker. Times are ``time.monotonic_ns()`` values.

    ``iteration`` groups the operations of one acquire..release cycle of ``worker``.
    """

    worker: int
    iteration: int
    kind: str
    status: Status
    invoke_ns: int
    done_ns: int | None = None
    fence: int | None = None
    value: int | None = None
    until_ns: int | None = None
    info: str = ""


# --------------------------------------------------------------------------------------------
# registers


@dataclass(frozen=True)
class RegisterResult:
    """What a register saw.

    ``acknowledged``: writes that returned ok; ``rejected``: refused as stale (fenced only);
    ``stale_accepted``: writes accepted although a newer fence had been acknowledged by the
    store before they were sent; ``lost_updates``: acknowledged increments missing from the
    final value (or written twice over the same read); ``phantom``: final value above every
    acknowledged and unknown write (a write nobody made).
    """

    acknowledged: int
    rejected: int
    unknown: int
    stale_accepted: int
    lost_updates: int
    phantom: int
    final: int
    duplicates: int

    @property
    def ok(self) -> bool:
        return self.stale_accepted == 0 and self.lost_updates == 0 and self.phantom == 0


def _register(
    ops: Sequence[Op], final: int, write_kind: str, fence_kinds: tuple[str, ...]
) -> RegisterResult:
    writes = [op for op in ops if op.kind == write_kind]
    acked = [op for op in writes if op.status == "ok"]
    rejected = sum(
        1 for op in ops if op.kind in fence_kinds and op.status == "fail" and op.info == "stale"
    )
    unknown = sum(1 for op in writes if op.status == "unknown")
    stale = len(_stale_accepted(ops, acked, fence_kinds)) if write_kind == "write" else 0
    counts = Counter(op.value for op in acked if op.value is not None)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    lost = max(len(acked) - final, duplicates, 0)
    phantom = max(final - len(acked) - unknown, 0)
    return RegisterResult(
        acknowledged=len(acked),
        rejected=rejected,
        unknown=unknown,
        stale_accepted=stale,
        lost_updates=lost,
        phantom=phantom,
        final=final,
        duplicates=duplicates,
    )


def _stale_accepted(
    ops: Sequence[Op], acked: Sequence[Op], fence_kinds: tuple[str, ...]
) -> list[Op]:
    """Acknowledged writes whose fence is older than one the store had already acknowledged
    (acknowledged before this write was even sent: the store must have seen it first)."""
    fenced = sorted(
        (
            op
            for op in ops
            if op.kind in fence_kinds
            and op.status == "ok"
            and op.fence is not None
            and op.done_ns is not None
        ),
        key=lambda op: op.done_ns or 0,
    )
    newest = _newest_fence_before(fenced)
    found: list[Op] = []
    for op in acked:
        if op.fence is None:
            continue
        top = newest(op.invoke_ns)
        if top is not None and top > op.fence:
            found.append(op)
    return found


def _newest_fence_before(by_done: Sequence[Op]) -> Callable[[int], int | None]:
    """For ops sorted by ``done_ns``: the function giving the highest fence among those
    acknowledged before a time (strictly), None when none was."""
    done_times = [op.done_ns or 0 for op in by_done]
    prefix_max: list[int] = []
    best = -1
    for op in by_done:
        best = max(best, op.fence or 0)
        prefix_max.append(best)

    def newest(t_ns: int) -> int | None:
        i = bisect.bisect_left(done_times, t_ns)
        return prefix_max[i - 1] if i > 0 else None

    return newest


def stale_accepted_writes(ops: Sequence[Op]) -> list[Op]:
    """The fenced writes :func:`check_fenced_register` counts as ``stale_accepted``."""
    acked = [op for op in ops if op.kind == "write" and op.status == "ok"]
    return _stale_accepted(ops, acked, ("advance", "write"))


def check_fenced_register(ops: Sequence[Op], final: int) -> RegisterResult:
    """The fenced register: zero stale writes accepted and ``final`` equal to the number of
    acknowledged increments (no lost update).

    ``final`` is the count read from the store after every worker stopped. Writes whose outcome
    is unknown may or may not be in it: they are allowed, never required.
    """
    return _register(ops, final, "write", ("advance", "write"))


def check_canary(ops: Sequence[Op], final: int) -> RegisterResult:
    """The unfenced canary register, same rules (``stale_accepted`` stays 0: it has no fence).

    Under process pauses a lease lock alone loses updates here; that is what the canary is for.
    """
    return _register(ops, final, "canary-write", ())


# --------------------------------------------------------------------------------------------
# fences


@dataclass(frozen=True)
class FenceResult:
    """``duplicates``: fences handed out twice; ``out_of_order``: a lease acknowledged before
    another was requested but with a fence that is not smaller."""

    leases: int
    duplicates: int
    out_of_order: int
    examples: tuple[tuple[int, int], ...] = ()

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.out_of_order == 0


def check_fences(ops: Sequence[Op]) -> FenceResult:
    """Fences are unique, and if lease A was acknowledged before lease B was requested then
    ``fence(A) < fence(B)``."""
    acquired = [
        op
        for op in ops
        if op.kind == "acquire"
        and op.status == "ok"
        and op.fence is not None
        and op.done_ns is not None
    ]
    counts = Counter(op.fence for op in acquired)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    newest = _newest_fence_before(sorted(acquired, key=lambda op: op.done_ns or 0))
    bad: list[tuple[int, int]] = []
    for op in acquired:
        top = newest(op.invoke_ns)
        if top is not None and top >= (op.fence or 0):
            bad.append((top, op.fence or 0))
    return FenceResult(len(acquired), duplicates, len(bad), tuple(bad[:5]))


@dataclass(frozen=True)
class KeyFenceResult:
    """A MultiLock's fences, per key: each key is its own lock with its own fence register,
    so :func:`check_fences`' rules hold for each key apart. ``by_key``: key -> its
    violations (duplicates + out of order)."""

    keys: tuple[str, ...]
    duplicates: int
    out_of_order: int
    by_key: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.out_of_order == 0


def check_key_fences(ops: Sequence[Op]) -> KeyFenceResult:
    """:func:`check_fences` over the ``key-fence`` records of each key (a MultiLock's grants
    record one per key, with the grant's times)."""
    per_key: dict[str, list[Op]] = {}
    for op in ops:
        if op.kind == "key-fence":
            per_key.setdefault(op.info, []).append(dataclasses.replace(op, kind="acquire"))
    results = {key: check_fences(group) for key, group in sorted(per_key.items())}
    return KeyFenceResult(
        keys=tuple(results),
        duplicates=sum(r.duplicates for r in results.values()),
        out_of_order=sum(r.out_of_order for r in results.values()),
        by_key={key: r.duplicates + r.out_of_order for key, r in results.items()},
    )


# --------------------------------------------------------------------------------------------
# lease overlap


@dataclass(frozen=True)
class LeaseWindow:
    """A granted lease: it may act in ``[start_ns, end_ns]``, where ``end_ns`` is the end of
    its validity or its release, whichever came first; ``used_until_ns`` is when the holder
    last acted (it may be later than ``end_ns`` after a pause)."""

    worker: int
    iteration: int
    fence: int
    start_ns: int
    end_ns: int
    used_until_ns: int


def lease_windows(ops: Sequence[Op]) -> list[LeaseWindow]:
    """Build each lease's window from a history: [acquire ok, min(validity end, release
    sent)], and how long the holder kept acting (its last operation's completion)."""
    groups: dict[tuple[int, int], list[Op]] = {}
    for op in ops:
        groups.setdefault((op.worker, op.iteration), []).append(op)
    windows: list[LeaseWindow] = []
    for (worker, iteration), group in groups.items():
        acq = next((o for o in group if o.kind == "acquire" and o.status == "ok"), None)
        if acq is None or acq.done_ns is None or acq.until_ns is None:
            continue
        end = acq.until_ns
        used = acq.done_ns
        for o in group:
            if o is acq:
                continue
            if o.kind == "release":
                end = min(end, o.invoke_ns)
                used = max(used, o.invoke_ns)
            else:
                used = max(used, o.done_ns if o.done_ns is not None else o.invoke_ns)
        windows.append(
            LeaseWindow(worker, iteration, acq.fence or 0, acq.done_ns, max(end, acq.done_ns), used)
        )
    windows.sort(key=lambda w: w.start_ns)
    return windows


@dataclass(frozen=True)
class OverlapResult:
    """``double_grants``: later leases granted while an earlier one was still valid (two valid
    leases at once: a lock safety violation, e.g. a server restarted without persistence or a
    server clock jump). ``outlived``: holders that kept acting past the end of their validity
    while a later lease had been granted (expected under pauses; only fencing makes it
    harmless), counted once per such holder."""

    leases: int
    double_grants: int
    outlived: int
    examples: tuple[tuple[LeaseWindow, LeaseWindow], ...] = ()

    @property
    def ok(self) -> bool:
        return self.double_grants == 0


def check_lease_overlap(windows: Iterable[LeaseWindow]) -> OverlapResult:
    """Validity windows of one key must not overlap (see :class:`OverlapResult`)."""
    ordered = sorted(windows, key=lambda w: w.start_ns)
    starts = [w.start_ns for w in ordered]
    double = 0
    examples: list[tuple[LeaseWindow, LeaseWindow]] = []
    latest_end: LeaseWindow | None = None  # the earlier lease whose validity ends last
    for w in ordered:
        if latest_end is not None and latest_end.end_ns > w.start_ns:
            double += 1
            if len(examples) < 5:
                examples.append((latest_end, w))
        if latest_end is None or w.end_ns > latest_end.end_ns:
            latest_end = w
    outlived = 0
    for w in ordered:
        if w.used_until_ns <= w.end_ns:
            continue
        # a later lease granted after this one's validity ended but before it stopped acting
        i = bisect.bisect_right(starts, w.end_ns)
        if i < len(starts) and starts[i] < w.used_until_ns:
            outlived += 1
    return OverlapResult(len(ordered), double, outlived, tuple(examples))


@dataclass(frozen=True)
class ElectionResult:
    """An election's history, where a leadership is a granted ``acquire`` and its fence the
    term. ``same_term``: leaderships given a term already given (two leaders in one term);
    ``out_of_order``: a term not larger than one granted before this campaign was won
    (terms grow in the order leadership was granted); ``two_leaders``: leaderships granted
    while an earlier leader's term was still valid (:func:`check_lease_overlap`'s double
    grants; a holder acting past its term is counted apart, in ``outlived``)."""

    terms: int
    same_term: int
    out_of_order: int
    two_leaders: int
    outlived: int
    examples: tuple[tuple[int, int], ...] = ()

    @property
    def ok(self) -> bool:
        return self.same_term == 0 and self.out_of_order == 0 and self.two_leaders == 0


def check_election(ops: Sequence[Op]) -> ElectionResult:
    """At most one leader per term, terms growing in grant order, never two leaders valid at
    once (see :class:`ElectionResult`); the storage's refusal of a deposed leader's term is
    :func:`check_fenced_register`'s."""
    fences = check_fences(ops)
    overlap = check_lease_overlap(lease_windows(ops))
    return ElectionResult(
        terms=fences.leases,
        same_term=fences.duplicates,
        out_of_order=fences.out_of_order,
        two_leaders=overlap.double_grants,
        outlived=overlap.outlived,
        examples=fences.examples,
    )


# --------------------------------------------------------------------------------------------
# semaphore and read-write lock


@dataclass(frozen=True)
class PermitResult:
    """``over_limit``: grants that made more than ``limit`` permits valid at once (each
    counted once, when it was granted); ``max_concurrent``: the most valid at once."""

    leases: int
    limit: int
    max_concurrent: int
    over_limit: int
    examples: tuple[tuple[LeaseWindow, ...], ...] = ()

    @property
    def ok(self) -> bool:
        return self.over_limit == 0


def check_permit_overlap(windows: Iterable[LeaseWindow], limit: int) -> PermitResult:
    """At no time more than ``limit`` validity windows of one semaphore key (a window that
    ends exactly when another starts does not overlap it, as in :func:`check_lease_overlap`)."""
    ordered = sorted(windows, key=lambda w: w.start_ns)
    active: list[tuple[int, int, LeaseWindow]] = []  # heap of (end_ns, seq, window)
    over = most = 0
    examples: list[tuple[LeaseWindow, ...]] = []
    for seq, w in enumerate(ordered):
        while active and active[0][0] <= w.start_ns:
            heapq.heappop(active)
        heapq.heappush(active, (w.end_ns, seq, w))
        most = max(most, len(active))
        if len(active) > limit:
            over += 1
            if len(examples) < 5:
                examples.append(tuple(sorted((a[2] for a in active), key=lambda x: x.start_ns)))
    return PermitResult(len(ordered), limit, most, over, tuple(examples))


def lease_modes(ops: Sequence[Op]) -> dict[tuple[int, int], str]:
    """(worker, iteration) -> the ``info`` of its granted acquire (``"read"`` / ``"write"``
    for a read-write lock)."""
    return {
        (op.worker, op.iteration): op.info
        for op in ops
        if op.kind == "acquire" and op.status == "ok"
    }


@dataclass(frozen=True)
class RWResult:
    """Pairs of overlapping validity windows of one read-write lock key:
    ``writer_with_reader`` (a writer and a reader) and ``two_writers``; ``max_readers``: the
    most readers valid at once (more than one shows that readers do share)."""

    readers: int
    writers: int
    writer_with_reader: int
    two_writers: int
    max_readers: int
    examples: tuple[tuple[LeaseWindow, LeaseWindow], ...] = ()

    @property
    def ok(self) -> bool:
        return self.writer_with_reader == 0 and self.two_writers == 0


def check_rw_exclusion(
    windows: Iterable[LeaseWindow], modes: dict[tuple[int, int], str]
) -> RWResult:
    """Never a writer's window overlapping a reader's or another writer's. ``modes`` maps
    (worker, iteration) to ``"read"`` or ``"write"`` (:func:`lease_modes`); a window of any
    other mode counts as a writer (the stricter reading)."""
    ordered = sorted(windows, key=lambda w: w.start_ns)
    active: list[tuple[int, int, LeaseWindow, bool]] = []  # (end_ns, seq, window, is_writer)
    readers = writers = with_reader = two = most_readers = 0
    examples: list[tuple[LeaseWindow, LeaseWindow]] = []
    for seq, w in enumerate(ordered):
        while active and active[0][0] <= w.start_ns:
            heapq.heappop(active)
        writer = modes.get((w.worker, w.iteration)) != "read"
        for _, _, other, other_writer in active:
            if writer and other_writer:
                two += 1
            elif writer or other_writer:
                with_reader += 1
            else:
                continue
            if len(examples) < 5:
                examples.append((other, w))
        heapq.heappush(active, (w.end_ns, seq, w, writer))
        if writer:
            writers += 1
        else:
            readers += 1
            most_readers = max(most_readers, sum(1 for a in active if not a[3]))
    return RWResult(readers, writers, with_reader, two, most_readers, tuple(examples))


def reader_fence_duplicates(ops: Sequence[Op]) -> int:
    """Fences granted more than once where every grant holding it was a reader (``info ==
    "read"``), counted as :func:`check_fences` counts duplicates (n grants of one fence: n-1)."""
    holders: dict[int, list[str]] = {}
    for op in ops:
        if op.kind == "acquire" and op.status == "ok" and op.fence is not None:
            holders.setdefault(op.fence, []).append(op.info)
    return sum(
        len(infos) - 1
        for infos in holders.values()
        if len(infos) > 1 and all(info == "read" for info in infos)
    )


@dataclass(frozen=True)
class WriterFenceResult:
    """``violations``: writer grants whose fence is not larger than the fence of a grant
    (reader's or writer's) acknowledged before the writer's own."""

    writers: int
    violations: int
    examples: tuple[tuple[int, int], ...] = ()

    @property
    def ok(self) -> bool:
        return self.violations == 0


def check_writer_fences(ops: Sequence[Op]) -> WriterFenceResult:
    """A writer's fence exceeds every fence granted before it on the key: larger than the
    fence of every grant acknowledged before the writer's grant was (``acquire`` ops with
    ``info="write"`` are the writers; every granted ``acquire`` counts as earlier)."""
    acquired = sorted(
        (
            op
            for op in ops
            if op.kind == "acquire"
            and op.status == "ok"
            and op.fence is not None
            and op.done_ns is not None
        ),
        key=lambda op: op.done_ns or 0,
    )
    best = -1
    writers = 0
    bad: list[tuple[int, int]] = []
    i = 0
    while i < len(acquired):
        # grants acknowledged at the same instant are not "before" one another
        j = i
        while j < len(acquired) and acquired[j].done_ns == acquired[i].done_ns:
            j += 1
        for op in acquired[i:j]:
            if op.info == "write":
                writers += 1
                if (op.fence or 0) <= best:
                    bad.append((best, op.fence or 0))
        for op in acquired[i:j]:
            best = max(best, op.fence or 0)
        i = j
    return WriterFenceResult(writers, len(bad), tuple(bad[:5]))


def unfenced_overlaps(ops: Sequence[Op]) -> int:
    """Canary writes acknowledged after another worker had acquired the lock since the writer
    did: exactly the writes fencing would have refused once the newer holder claimed the
    resource. Real-time order only; no fence is trusted."""
    return len(unfenced_overlap_ops(ops))


def unfenced_overlap_ops(ops: Sequence[Op]) -> list[Op]:
    """The canary writes :func:`unfenced_overlaps` counts, in history order."""
    acquired = sorted(
        (
            (op.done_ns, op.worker, op.iteration)
            for op in ops
            if op.kind == "acquire" and op.status == "ok" and op.done_ns is not None
        ),
    )
    times = [a[0] for a in acquired]
    own: dict[tuple[int, int], int] = {
        (op.worker, op.iteration): op.done_ns
        for op in ops
        if op.kind == "acquire" and op.status == "ok" and op.done_ns is not None
    }
    found: list[Op] = []
    for op in ops:
        if op.kind != "canary-write" or op.status != "ok":
            continue
        mine = own.get((op.worker, op.iteration))
        if mine is None:
            continue
        lo = bisect.bisect_right(times, mine)
        hi = bisect.bisect_left(times, op.invoke_ns)
        if any(
            acquired[i][1] != op.worker or acquired[i][2] != op.iteration for i in range(lo, hi)
        ):
            found.append(op)
    return found


# --------------------------------------------------------------------------------------------
# liveness


@dataclass(frozen=True)
class LivenessResult:
    """Delay from each heal to the next acquisition (seconds; ``None``: none before the end).
    ``late``: heals not followed by an acquisition within the bound."""

    bound_s: float
    delays_s: tuple[float | None, ...]
    late: int
    examples: tuple[tuple[int, float | None], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.late == 0

    @property
    def max_delay_s(self) -> float | None:
        known = [d for d in self.delays_s if d is not None]
        return max(known) if known else None

    @property
    def median_delay_s(self) -> float | None:
        known = sorted(d for d in self.delays_s if d is not None)
        return known[len(known) // 2] if known else None


def check_liveness(
    heals_ns: Sequence[int], acquired_ns: Sequence[int], *, end_ns: int, bound_s: float
) -> LivenessResult:
    """After each heal, the next acquisition must come within ``bound_s`` seconds (the brief's
    bound: TTL + max retry delay + a margin). A heal closer than ``bound_s`` to ``end_ns``
    (the end of the observation) counts only if an acquisition came."""
    times = sorted(acquired_ns)
    bound_ns = int(bound_s * 1e9)
    delays: list[float | None] = []
    late = 0
    examples: list[tuple[int, float | None]] = []
    for heal in heals_ns:
        i = bisect.bisect_left(times, heal)
        if i < len(times):
            delay = (times[i] - heal) / 1e9
            delays.append(delay)
            if times[i] - heal > bound_ns:
                late += 1
                examples.append((heal, delay))
        else:
            delays.append(None)
            if end_ns - heal > bound_ns:
                late += 1
                examples.append((heal, None))
    return LivenessResult(bound_s, tuple(delays), late, tuple(examples[:5]))
