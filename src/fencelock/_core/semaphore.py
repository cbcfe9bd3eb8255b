"""A leased semaphore, written once: at most ``limit`` permits valid at once, each its own lease.

A permit is one of ``limit`` slots, and slot ``i`` is an ordinary lock key
(``fencelock:{name}:slot:i``) held on a majority, so "at most ``limit`` permits" follows from
"at most one holder per lock key" (Redlock's own argument, per slot). Every slot bumps the
semaphore's ONE fence register, so fences grow per semaphore: a permit's grant is committed to
a majority before it is handed out, and any later grant's majority intersects that one.

One attempt is one round trip per server: ``sem_acquire.lua`` takes the first free slot in a
fixed order. Servers with the same state answer the same slot; when they do not (a server
missed a release, or restarted), the slot granted by a majority wins, our token is swept from
the others, and when no slot reached a majority the attempt fails like a split vote and is
repeated. Extend and release of a permit are those of a lock, on its slot's keys.

Why not a counter per server (INCR on acquire, DECR on release): a holder that crashes never
decrements, so capacity leaks for ever (a TTL on the counter frees everybody's permits at once);
release cannot be owner-checked; and over N servers the counters drift apart (a DECR lost on a
minority, an INCR that landed after a timeout), so "below limit on a majority" no longer says
which permits exist: two majorities can each count a different set of holders.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..errors import ConfigError
from .acquire import Attempt, AttemptFn, Grant, clean_up, grant_replies
from .effects import IDENTITIES, NOW, Broadcast, Flow, Identify
from .fencing import needs_commit
from .keys import LockKeys, lock_keys, slot_keys
from .plan import LockPlan, Wiring, lock_wiring
from .quorum import Outcome, Tally
from .release import release_round
from .replies import AcquireReply, ProtocolError, classify_slot_acquire, with_wait
from .rounds import AcquireDecision, Status, decide_acquire
from .timing import validity_ms
from .verdicts import independence_problem

#: The most slots a semaphore may have (every attempt sends three keys per slot).
LIMIT_MAX = 1024


def check_limit(limit: object) -> int:
    """A semaphore's limit: an ``int`` (not a bool) in 1..LIMIT_MAX."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ConfigError(f"limit must be an int, not {type(limit).__name__}")
    if not 1 <= limit <= LIMIT_MAX:
        raise ConfigError(f"limit must be between 1 and {LIMIT_MAX}, not {limit}")
    return limit


@dataclass(frozen=True, slots=True)
class SemaphorePlan:
    """A semaphore over ``limit`` slots: ``base`` is the plan of its name (timing, wake keys);
    ``slots[i]`` the lock plan of slot ``i``; ``sweep`` releases our token from any slot."""

    base: LockPlan
    limit: int
    slots: tuple[LockPlan, ...]
    sweep: LockPlan
    acquire_keys: tuple[str, ...]


def make_semaphore_plan(base: LockPlan, limit: int) -> SemaphorePlan:
    shared = lock_keys(base.key)
    slots = tuple(_slot_plan(base, slot_keys(base.key, i)) for i in range(limit))
    acquire_keys: list[str] = [shared.fence, shared.waiters]
    sweep_keys: list[str] = [shared.waiters, shared.wake]
    for plan in slots:
        acquire_keys += [plan.keys.lock, plan.keys.holder, plan.keys.handoff]
        sweep_keys += [plan.keys.lock, plan.keys.holder]
    sweep = base.rewired(
        shared,
        Wiring(
            acquire="sem_acquire",
            acquire_keys=tuple(acquire_keys),
            commit="fence_commit",
            commit_keys=(),
            release="sem_sweep",
            release_keys=tuple(sweep_keys),
            extend="extend",
            extend_keys=(),
        ),
    )
    return SemaphorePlan(base, limit, slots, sweep, tuple(acquire_keys))


def _slot_plan(base: LockPlan, keys: LockKeys) -> LockPlan:
    wiring = lock_wiring(keys)
    return base.rewired(keys, replace(wiring, commit="sem_fence_commit"))


#: How often a permit's fence commit is repeated with a higher fence when another permit,
#: granted at the same time, committed the same fence first (one round trip each).
COMMIT_RETRIES = 8


@dataclass(frozen=True, slots=True)
class CommitReply:
    """A server's answer to ``sem_fence_commit``: its fence register before our commit."""

    previous: int


def classify_permit_commit(result: object) -> tuple[Outcome, object]:
    """GRANTED (the slot is ours; detail: :class:`CommitReply`), HELD (not ours) or ERROR."""
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    if isinstance(result, list | tuple) and result and result[0] in (0, 1):
        if result[0] == 0 and len(result) == 1:
            return Outcome.HELD, result
        if result[0] == 1 and len(result) == 2:
            raw = result[1]
            text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
            if isinstance(text, str) and text.isdigit():
                return Outcome.GRANTED, CommitReply(int(text))
    return Outcome.ERROR, ProtocolError(f"sem_fence_commit: unexpected reply {result!r}")


def commit_ok(tally: Tally, fence: int, own: Mapping[int, int]) -> list[int]:
    """The servers where our commit of ``fence`` counts: the slot was ours, and the register
    stood below ``fence`` before, or at ``fence`` because our own grant there bumped it to
    exactly that. A register already at or above ``fence`` for any other reason means another
    permit, granted at the same time on other servers, may have committed the same fence:
    two majorities share a server, so at most one of two such commits counts there."""
    ok = []
    for index, (outcome, detail) in sorted(tally.votes.items()):
        if outcome is not Outcome.GRANTED or not isinstance(detail, CommitReply):
            continue
        if detail.previous < fence or (detail.previous == fence and own.get(index) == fence):
            ok.append(index)
    return ok


def commit_permit_fence(
    plan: LockPlan, token: str, decision: AcquireDecision, view: Tally, start: float
) -> Flow[AcquireDecision]:
    """Round 2 of an N-server permit: commit the merged fence on the granting servers, where
    it must count on a majority (see :func:`commit_ok`); when another permit got there first
    with the same fence, commit again above every register seen (at most COMMIT_RETRIES
    times, within the permit's validity)."""
    granted = tuple(view.granted_indexes())
    own = {
        index: detail.fence
        for index, (outcome, detail) in view.votes.items()
        if outcome is Outcome.GRANTED and isinstance(detail, AcquireReply)
    }
    fence = decision.fence
    drift = plan.drift_ms(plan.ttl_ms)
    for _ in range(COMMIT_RETRIES + 1):
        tally = Tally(plan.n)
        for index in plan.everyone:
            if index not in granted:
                tally.record(index, Outcome.HELD)

        def enough(t: Tally, fence: int = fence, own: Mapping[int, int] = own) -> bool:
            ok = len(commit_ok(t, fence, own))
            return ok >= t.needed or ok + t.pending < t.needed

        yield Broadcast(
            plan.wiring.commit,
            granted,
            plan.commit_keys,
            (token, str(fence)),
            with_wait(plan, classify_permit_commit),
            enough,
            plan.budget_s,
            tally,
            wait=plan.wait,
        )
        now: float = yield NOW
        validity = validity_ms(plan.ttl_ms, (now - start) * 1000.0, drift)
        ok = commit_ok(tally, fence, own)
        if len(ok) >= tally.needed:
            if validity <= 0:
                return AcquireDecision(Status.TOO_SLOW)
            return replace(decision, fence=fence, validity_ms=validity)
        seen = [
            detail.previous
            for outcome, detail in tally.votes.values()
            if outcome is Outcome.GRANTED and isinstance(detail, CommitReply)
        ]
        if validity <= 0 or len(seen) == len(ok):
            break  # too slow, or short of a majority for another reason than a shared fence
        fence = max(seen) + 1
        own = {}  # above every register seen: a register at it now was set by someone else
    return AcquireDecision(Status.UNAVAILABLE)


def slot_counts(tally: Tally) -> Counter[int]:
    """How many servers granted each slot."""
    return Counter(
        detail.slot
        for outcome, detail in tally.votes.values()
        if outcome is Outcome.GRANTED and isinstance(detail, AcquireReply)
    )


def best_slot(tally: Tally) -> int | None:
    """The slot granted by the most servers (the lowest on a tie), or None."""
    counts = slot_counts(tally)
    if not counts:
        return None
    return min(counts, key=lambda slot: (-counts[slot], slot))


def slot_settled(tally: Tally) -> bool:
    """A semaphore round may stop once one slot has a majority, or once no slot can reach
    one AND it is clear whether for contention or for an outage."""
    counts = slot_counts(tally)
    best = max(counts.values(), default=0)
    if best >= tally.needed:
        return True
    if best + tally.pending >= tally.needed:
        return False
    return tally.answered >= tally.needed or tally.answered + tally.pending < tally.needed


def slot_view(tally: Tally, slot: int | None) -> Tally:
    """The round as a vote on ``slot`` alone: grants of other slots count as "held"."""
    view = Tally(tally.n)
    for index, (outcome, detail) in tally.votes.items():
        if outcome is Outcome.GRANTED and isinstance(detail, AcquireReply) and detail.slot != slot:
            view.record(index, Outcome.HELD, AcquireReply(False, 0, -1))
        else:
            view.record(index, outcome, detail)
    return view


def attempt_permit(
    sem: SemaphorePlan, token: str, info: str, *, woken: bool, waiter: str, patience: int
) -> Flow[Attempt]:
    """One attempt at a permit; never raises for contention or outages (see ``attempt``)."""
    plan = sem.base
    if plan.n > 1:
        problem = independence_problem((yield Identify(plan.budget_s)), plan.names)
        if problem is not None:
            raise problem
    start: float = yield NOW
    args = (token, plan.ttl_ms, info, "1" if woken else "0", waiter, patience)
    tally = Tally(plan.n)
    drift = plan.drift_ms(plan.ttl_ms)
    slot: int | None = None
    try:
        yield Broadcast(
            "sem_acquire",
            plan.everyone,
            sem.acquire_keys,
            args,
            with_wait(plan, classify_slot_acquire),
            slot_settled,
            plan.budget_s,
            tally,
            wait=plan.wait,
        )
        now: float = yield NOW
        slot = best_slot(tally)
        view = slot_view(tally, slot)
        decision = decide_acquire(
            view,
            grant_replies(view),
            ttl_ms=plan.ttl_ms,
            elapsed_ms=(now - start) * 1000.0,
            drift=drift,
        )
        problem = independence_problem((yield IDENTITIES), plan.names)
        if problem is not None:
            raise problem
        if decision.status is Status.GRANTED and slot is not None and needs_commit(plan.n):
            decision = yield from commit_permit_fence(sem.slots[slot], token, decision, view, start)
    except GeneratorExit:
        raise
    except BaseException:
        yield from clean_up(sem.sweep, token, tally)
        raise
    if decision.status is Status.GRANTED and slot is not None:
        strays = tuple(
            index
            for index, (outcome, _) in sorted(tally.votes.items())
            if outcome is Outcome.GRANTED and view.votes[index][0] is not Outcome.GRANTED
        )
        if strays:  # servers that gave us another slot: free it there
            yield from release_round(sem.sweep, token, strays)
        deadline = start + (plan.ttl_ms - drift) / 1000.0
        return Attempt(Grant(token, decision.fence, start, deadline, slot), decision, view)
    yield from clean_up(sem.sweep, token, tally)
    return Attempt(None, decision, view)


def permit_attempt(sem: SemaphorePlan) -> AttemptFn:
    """:func:`attempt_permit` bound to ``sem`` (an ``AttemptFn`` for the wait loop)."""

    def run(token: str, info: str, *, woken: bool, waiter: str, patience: int) -> Flow[Attempt]:
        return attempt_permit(sem, token, info, woken=woken, waiter=waiter, patience=patience)

    return run
