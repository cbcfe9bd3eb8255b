"""A leased semaphore, written once: at most ``limit`` permits valid at once, each its own lease.

A permit is one of ``limit`` slots, and slot ``i`` is an ordinary lock key
(``fencelock:{name}:slot:i``) held on a majority, so "at most ``limit`` permits" follows from
"at most one holder per lock key" (Redlock's own argument, per slot). Every slot bumps the
semaphore's ONE fence register, so fences grow per semaphore: a permit's grant is committed to
a majority before it is handed out, and any later grant's majority intersects that one.

One attempt is one round trip per server, in the lock's attempt flow (``grant_attempt``: the
majority, ``restart_delay``, validity, cleanup and fence commit are written once) read as a vote
on one slot: ``sem_acquire.lua`` takes a free slot, the proposed one first. Servers with the
same state answer the same slot; when they do not (a server missed a release, or restarted),
the slot granted by a majority wins and our token is swept from the others; when no slot
reached a majority, the attempt is repeated at once proposing the slot that the most servers
may still have free (see :func:`proposal`), so a split vote converges while capacity exists.
Extend and release of a permit are those of a lock, on its slot's keys.

Why not a counter per server (INCR on acquire, DECR on release): a holder that crashes never
decrements, so capacity leaks for ever (a TTL on the counter frees everybody's permits at once);
release cannot be owner-checked; and over N servers the counters drift apart (a DECR lost on a
minority, an INCR that landed after a timeout), so "below limit on a majority" no longer says
which permits exist: two majorities can each count a different set of holders.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..errors import ConfigError
from .acquire import Attempt, AttemptFn, Ballot, fence_commit_round, grant_attempt
from .effects import NOW, Flow
from .keys import LockKeys, limit_key, lock_keys, slot_keys
from .plan import LockPlan, Wiring, lock_wiring
from .quorum import Outcome, Tally
from .release import release_round
from .replies import AcquireReply, OtherLimit, ProtocolError, classify_slot_acquire
from .rounds import AcquireDecision, Status
from .timing import validity_ms

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

    @property
    def ballot(self) -> Ballot:
        return semaphore_ballot(self)


def make_semaphore_plan(base: LockPlan, limit: int) -> SemaphorePlan:
    shared = lock_keys(base.key)
    slots = tuple(_slot_plan(base, slot_keys(base.key, i)) for i in range(limit))
    acquire_keys: list[str] = [shared.fence, shared.waiters]
    sweep_keys: list[str] = [shared.waiters, shared.wake]
    for plan in slots:
        acquire_keys += [plan.keys.lock, plan.keys.holder, plan.keys.handoff]
        sweep_keys += [plan.keys.lock, plan.keys.holder]
    acquire_keys += [limit_key(base.key), slot_keys(base.key, limit).lock]
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

        def enough(t: Tally, fence: int = fence, own: Mapping[int, int] = own) -> bool:
            ok = len(commit_ok(t, fence, own))
            return ok >= t.needed or ok + t.pending < t.needed

        tally, commit_round = fence_commit_round(
            plan, granted, token, fence, classify_permit_commit, enough
        )
        yield commit_round
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


def _choose(tally: Tally) -> tuple[int, Tally]:
    slot = best_slot(tally)
    return (0 if slot is None else slot), slot_view(tally, slot)


def semaphore_ballot(sem: SemaphorePlan) -> Ballot:
    """A permit round read as a vote on its best slot; the fence commit on that slot's keys."""

    def commit(
        plan: LockPlan, slot: int, token: str, decision: AcquireDecision, view: Tally, start: float
    ) -> Flow[AcquireDecision]:
        return commit_permit_fence(sem.slots[slot], token, decision, view, start)

    return Ballot(settled=slot_settled, choose=_choose, commit=commit, strays=True)


#: How many more rounds one permit attempt runs after a split vote (each proposing a slot).
SPLIT_ROUNDS = 2


def search_order(proposed: int, limit: int) -> list[int]:
    """The order ``sem_acquire.lua`` tries slots in: ``proposed`` first (if any), then the rest."""
    rest = [i for i in range(limit) if i != proposed]
    return [proposed, *rest] if 0 <= proposed < limit else rest


def proposal(heard: Tally, proposed: int, limit: int) -> int | None:
    """After a split vote (servers granted different slots, none a majority): the slot the
    most servers may still have free, or None when no server had room.

    A server that granted slot ``q`` had every slot it tried before ``q`` taken (it tries
    them in :func:`search_order`); one that answered "held" had them all taken; one that did
    not answer is unknown (it may have room). Ties go to the slot more servers granted, then
    to the lowest. Proposing it converges: every server that has it free takes it.
    """
    counts = slot_counts(heard)
    if not counts:
        return None
    order = search_order(proposed, limit)
    taken: list[set[int]] = []
    for index in range(heard.n):
        outcome, detail = heard.votes.get(index, (Outcome.ERROR, None))
        if outcome is Outcome.GRANTED and isinstance(detail, AcquireReply):
            taken.append(set(order[: order.index(detail.slot)]))
        elif outcome is Outcome.HELD:
            taken.append(set(order))
        else:
            taken.append(set())
    free = {slot: sum(slot not in t for t in taken) for slot in range(limit)}
    return min(range(limit), key=lambda slot: (-free[slot], -counts[slot], slot))


def _split(heard: Tally) -> bool:
    counts = slot_counts(heard)
    return sum(counts.values()) >= heard.needed and max(counts.values()) < heard.needed


def _fresh(token: str, round_: int) -> str:
    """Another token for a repeated round (a round's token may still be on its stragglers)."""
    return hashlib.sha1(f"{token}:{round_}".encode()).hexdigest()


def _refuse_other_limit(sem: SemaphorePlan, result: Attempt, heard: Tally) -> Flow[None]:
    """Raise :class:`~fencelock.ConfigError` when a server keeps another limit for this name
    (after giving back a permit the others granted): two Semaphores of different limits on
    one name would each count only their own permits."""
    others = sorted(
        {
            d.limit
            for o, d in heard.votes.values()
            if o is Outcome.ERROR and isinstance(d, OtherLimit)
        }
    )
    if not others:
        return
    if result.grant is not None:
        granted = tuple(heard.granted_indexes())
        yield from release_round(sem.sweep, result.grant.token, granted)
    theirs = ", ".join("a larger one" if limit < 0 else str(limit) for limit in others)
    raise ConfigError(
        f"semaphore {sem.base.key!r}: limit={sem.limit}, but permits with limit {theirs} may "
        "be valid on the same name; every Semaphore of one name must use one limit (a new "
        "limit applies once the old permits ran out)"
    )


def attempt_permit(
    sem: SemaphorePlan, token: str, info: str, *, woken: bool, waiter: str, patience: int
) -> Flow[Attempt]:
    """One attempt at a permit; never raises for contention or outages (see ``attempt``):
    the lock's attempt (:func:`~fencelock._core.acquire.grant_attempt`: majority,
    ``restart_delay``, validity, cleanup) read as a vote on the best slot. When the vote
    split over slots, it is repeated at once (with a fresh token, at most SPLIT_ROUNDS more
    times) proposing the slot the most servers may still have free (:func:`proposal`)."""
    proposed = -1
    tried: set[int] = set()
    for round_ in range(SPLIT_ROUNDS + 1):
        own = token if round_ == 0 else _fresh(token, round_)
        args = (own, sem.base.ttl_ms, info, "1" if woken else "0", waiter, patience, proposed,
                sem.base.fence_retention_ms)  # fmt: skip
        result = yield from grant_attempt(
            sem.sweep, own, args, classify_slot_acquire, ballot=sem.ballot
        )
        heard = result.heard
        if heard is not None:
            yield from _refuse_other_limit(sem, result, heard)
        if result.grant is not None or heard is None or not _split(heard):
            return result
        if result.decision.status is not Status.CONTENTION:
            return result
        tried.add(proposed)
        next_slot = proposal(heard, proposed, sem.limit)
        if next_slot is None or next_slot in tried:
            return result
        proposed = next_slot
    return result


def permit_attempt(sem: SemaphorePlan) -> AttemptFn:
    """:func:`attempt_permit` bound to ``sem`` (an ``AttemptFn`` for the wait loop)."""

    def run(token: str, info: str, *, woken: bool, waiter: str, patience: int) -> Flow[Attempt]:
        return attempt_permit(sem, token, info, woken=woken, waiter=waiter, patience=patience)

    return run
