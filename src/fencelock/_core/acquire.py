"""Acquire, written once: one attempt (grant round, fence commit, cleanup) and the wait loop.

Rules of an attempt:
- the clock starts before the first byte is sent; a grant is valid until
  ``start + ttl - drift`` and only if that is still ahead when the last round ends;
- over N > 1 servers the merged fence is committed to a majority before the lease is handed out,
  unless a majority already stored it in the grant (``fencing.committed_by_grant``);
- a failed attempt releases its token wherever it may have landed, after waiting briefly
  for the round's stragglers (a fraction of the budget at the most, not for a hung server):
  at once where the call ended, from the background where it is still out (once its server
  answers, and once more: it cannot be overtaken for good by the straggler's SET), and again
  in the background where the release got no answer; a straggler of the failed round that
  answers NOSCRIPT once the round is parked is not sent the script in full (:func:`give_up`);
- the same server named twice, or a replica, is a :class:`~fencelock.ConfigError` as soon as
  the servers' identities are known (the grant is released first);
- with ``replicas=k`` (``plan.wait``), a server's grant and fence commit count only once
  ``WAIT`` saw k of its replicas acknowledge them; a grant short of them is an outage vote
  and is released with the other leftovers;
- with ``restart_delay``, a grant from a server seen restarting less than a ttl ago does not
  count (it is released with the other leftovers of a failed attempt); a round that stopped
  early on such a grant hears its stragglers before it is judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from .backoff import retry_delay_s
from .effects import (
    IDENTITIES,
    NOW,
    SETTLE,
    UNHEARD,
    Broadcast,
    Classify,
    Flow,
    Identify,
    Pause,
    Repeat,
    Replicated,
    Settle,
    StopRule,
)
from .fencing import committed_by_grant, floor_step_us, needs_commit
from .handover import Handed, claim, offered_token
from .plan import LockPlan
from .quorum import Outcome, Tally
from .release import release_args, release_round, repeat_release
from .replies import AcquireReply, classify_acquire, classify_commit, with_wait
from .rounds import AcquireDecision, Status, decide_acquire, decide_confirm
from .timing import validity_ms
from .verdicts import (
    acquire_failure,
    first_held,
    independence_problem,
    may_have_landed,
    restarting,
    silent,
    without_restarted,
)

#: A patience (ms) sent to the acquire script is capped here (an infinite wait fits too).
PATIENCE_CAP_MS = 2_000_000_000
#: A failed attempt waits at least this long (s) for its round's stragglers (see
#: :func:`straggler_grace_s`).
STRAGGLER_GRACE_MIN_S = 0.1


@dataclass(frozen=True, slots=True)
class Grant:
    """A won attempt: valid until ``deadline`` (monotonic s), counted from ``start`` (for a
    claimed hand-over: from before the wait; ``start`` is then when the grant was heard)."""

    token: str
    fence: int
    start: float
    deadline: float
    slot: int = 0  # the semaphore slot won (0 for every other kind of lock)
    # the waiter id still registered (a grant claimed from a hand-over), or that left markers
    # on servers that refused the grant (a writer's intent: MARKS_WAITER)
    waiter: str = "-"
    #: rounds run after the wake-up that let this caller in (0: the grant came with the wake,
    #: a claimed hand-over); -1: granted without waiting for a wake-up
    after_wake: int = -1


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt gave: ``grant``, or the decision and tally of the refusal."""

    grant: Grant | None
    decision: AcquireDecision
    tally: Tally
    heard: Tally | None = None  # the round's replies as heard (before any vote was discounted)


class AttemptFn(Protocol):
    """One attempt with a fresh token (``attempt`` bound to a plan, or a semaphore's)."""

    def __call__(
        self, token: str, info: str, *, woken: bool, waiter: str, patience: int
    ) -> Flow[Attempt]: ...


#: The acquire scripts that read a ``+`` before the waiter id of a call's first attempt
#: (registered nowhere yet: a grant removes nothing; a refusal registers the id without it).
#: The others (a reader's, a writer's) take the id as it is sent.
MARKS_FIRST_ATTEMPT = frozenset({"acquire"})

#: The acquire scripts whose refusal leaves a marker under the caller's waiter id (the
#: writer's intent, which stops new readers): their grant keeps the id (``Grant.waiter``), so
#: that the lease's release clears the markers the servers that refused it still hold.
MARKS_WAITER = frozenset({"rw_write_acquire"})


def settled(tally: Tally) -> bool:
    """An acquire round may stop once won, or once lost AND it is clear whether for
    contention (enough servers answered "held") or for an outage (too few can answer)."""
    if tally.won:
        return True
    return tally.lost and (
        tally.answered >= tally.needed or tally.answered + tally.pending < tally.needed
    )


def _won(tally: Tally) -> bool:
    return tally.won


def patience_ms(deadline: float, now: float) -> int:
    """How long a caller will still wait, in ms, for the acquire script (capped)."""
    return int(min(max(0.0, deadline - now) * 1000.0, PATIENCE_CAP_MS))


def attempt(
    plan: LockPlan, token: str, info: str, *, woken: bool, waiter: str, patience: int
) -> Flow[Attempt]:
    """One attempt to take the lock with ``token``; never raises for contention or outages.

    Raises :class:`~fencelock.ConfigError` when the servers are not independent: judged before
    any lock traffic for the servers already identified, after the round for the others.
    """
    args = (token, plan.ttl_ms, info, "1" if woken else "0", waiter, patience,
            plan.fence_retention_ms, floor_step_us(plan.n, plan.restart_delay))  # fmt: skip
    return grant_attempt(plan, token, args, classify_acquire)


def _whole(tally: Tally) -> tuple[int, Tally]:
    return 0, tally


def _lock_commit(
    plan: LockPlan, slot: int, token: str, decision: AcquireDecision, view: Tally, start: float
) -> Flow[AcquireDecision]:
    return commit_fence(plan, token, decision, view, start)


@dataclass(frozen=True, slots=True)
class Ballot:
    """How one grant round is read, for a primitive whose servers may grant different things
    (a semaphore's slots); the default reads it as one lock key.

    ``settled``: when the round may stop; ``choose``: the slot the round is about and the
    round as a vote on it alone (grants of other slots count as "held"); ``commit``: round 2,
    the fence commit of a won slot over N > 1 servers, called as
    ``commit(plan, slot, token, decision, view, start)``; ``strays``: a server may grant
    this token something other than what the round won (another slot), so a won round's
    stragglers are heard (within a failed round's grace) before the grants of other slots
    are freed: a late grant of another slot would keep that slot taken there until its TTL.
    """

    settled: Callable[[Tally], bool] = field(default=settled)
    choose: Callable[[Tally], tuple[int, Tally]] = field(default=_whole)
    commit: Callable[[LockPlan, int, str, AcquireDecision, Tally, float], Flow[AcquireDecision]] = (
        field(default=_lock_commit)
    )
    strays: bool = False


LOCK_BALLOT = Ballot()


def grant_attempt(
    plan: LockPlan,
    token: str,
    args: tuple[str | int, ...],
    classify: Classify,
    *,
    cleanup: LockPlan | None = None,
    ballot: Ballot = LOCK_BALLOT,
) -> Flow[Attempt]:
    """One attempt, written once for every primitive: the acquire script
    (``plan.wiring.acquire`` on ``plan.acquire_keys``, called with ``args``, its replies read
    by ``classify``) on every server, the majority (of one slot, as ``ballot`` reads the
    round), ``restart_delay``, the validity check and the fence commit; what may have landed
    of a failed attempt, and a won attempt's grants of other slots, are released with
    ``cleanup``'s release (default: ``plan``'s)."""
    n = plan.n
    known = None
    if n > 1:
        known = yield Identify(plan.budget_s)
        problem = independence_problem(known, plan.names)
        if problem is not None:
            raise problem
    start: float = yield NOW
    heard = Tally(n)
    if plan.restart_delay and known is not None:
        # known to be in their restart delay already: no healthy voters (skip_suspects)
        heard.muted = frozenset(restarting(known, start, plan.ttl_ms))
    tally = heard
    drift = plan.drift_ms(plan.ttl_ms)
    undo = plan if cleanup is None else cleanup
    slot = 0
    grant_round = Broadcast(
        plan.wiring.acquire,
        plan.everyone,
        plan.acquire_keys,
        args,
        with_wait(plan, classify),
        ballot.settled,
        plan.budget_s,
        heard,
        wait=plan.wait,
    )
    try:
        yield grant_round
        if plan.restart_delay:
            tally = yield from _discount_restarted(plan, heard, ballot)
        if ballot.strays and heard.pending and ballot.choose(tally)[1].won:
            # won: the stragglers may still grant this token other slots (each then taken
            # there until its TTL: three servers can end with a different free slot each and
            # no permit is granted while one is free, seed 100427 of the sync front); heard
            # now, they are freed with the strays below
            heard_at: float = yield NOW
            yield Settle(straggler_grace_s(heard_at - start, plan.budget_s))
        slot, view = ballot.choose(tally)
        now: float = yield NOW
        decision = decide_acquire(
            view,
            grant_replies(view),
            ttl_ms=plan.ttl_ms,
            elapsed_ms=(now - start) * 1000.0,
            drift=drift,
        )
        if n > 1:
            problem = independence_problem((yield IDENTITIES), plan.names)
            if problem is not None:
                raise problem
        if decision.status is Status.GRANTED and needs_commit(n):
            granted = grant_replies(view)
            fences = (granted[i].fence for i in view.granted_indexes())
            if not committed_by_grant(fences, decision.fence, view.needed):
                decision = yield from ballot.commit(plan, slot, token, decision, view, start)
    except GeneratorExit:
        raise
    except BaseException:
        # interrupted (a cancellation, a KeyboardInterrupt) or refused (ConfigError): the
        # cleanup is done before the exception goes on, within the round's budget, so that a
        # caller who goes on at once (a new acquire) finds what this attempt took released
        give_up(grant_round, undo, token, classify)
        yield from clean_up(undo, token, heard, None)
        raise
    if decision.status is Status.GRANTED:
        _, as_heard = ballot.choose(heard)  # a restarted server's grant of our slot stays
        strays = tuple(
            index
            for index, (outcome, _) in sorted(heard.votes.items())
            if outcome is Outcome.GRANTED and as_heard.votes[index][0] is not Outcome.GRANTED
        )
        if strays:  # servers that granted us another slot: free it there
            yield from release_round(undo, token, strays)
            # a round after the last validity check: the lease may have run out meanwhile
            now = yield NOW
            if validity_ms(plan.ttl_ms, (now - start) * 1000.0, drift) <= 0:
                decision = AcquireDecision(Status.TOO_SLOW)
    if decision.status is Status.GRANTED:
        deadline = start + (plan.ttl_ms - drift) / 1000.0
        return Attempt(Grant(token, decision.fence, start, deadline, slot), decision, view, heard)
    give_up(grant_round, undo, token, classify)
    grace = straggler_grace_s(now - start, plan.budget_s)
    yield from clean_up(undo, token, tally, grace)
    return Attempt(None, decision, view, heard)


def give_up(grant_round: Broadcast, plan: LockPlan, token: str, classify: Classify) -> None:
    """The attempt failed (or was interrupted): its round's stragglers must not take effect
    from now on. A straggler that answers NOSCRIPT once its round is parked is then not sent
    the script in full: that re-send would go out after the cleanup's release had answered
    "not ours" there (the asyncio front end sends the release right behind the acquire, on the
    same connection), land the grant, and leave the key held by nobody until its TTL
    (simulation seed 50987). A re-send made before this is on its way before the release; a
    straggler the round still collects (a ``Settle``) is re-sent in full as before: its vote
    is heard, and released.

    A straggler whose acquire arrives only after the cleanup's release and both its repeats
    (a delay spike on its connection) grants there all the same: its reply, heard once the
    round is parked, gets ``token`` released on that server from the background (``plan``'s
    release, ``classify``: the round's bare reply reader; simulation seed 205015)."""
    grant_round.land = False
    # a reused token's late release could delete its next grant: a late grant stays (its TTL)
    grant_round.late = None if plan.tokens_reused else late_release(plan, token, classify)


def late_release(
    plan: LockPlan, token: str, classify: Classify
) -> Callable[[int, object], Repeat | None]:
    """A given-up round's :attr:`~.effects.Broadcast.late`: a straggler's reply that
    ``classify`` reads as a grant (the server holds the key, or a slot, with ``token`` now;
    with ``replicas=k``, whatever ``WAIT`` said) is answered with ``token``'s release there,
    repeated as the cleanup's is; any other reply took nothing. :data:`~.effects.UNHEARD` (a
    reply that can no longer be heard) may have been a grant: released too, and again at
    :func:`unheard_repeats` over the lease, since its request may still be on its way (a
    closed connection still delivers what was written to it: the server runs it, then sees
    the close), so a grant that lands late is gone within about its lateness, not its TTL."""
    args = release_args(plan, token)
    ttl_s = plan.ttl_ms / 1000.0

    def late(index: int, reply: object) -> Repeat | None:
        bare = reply.reply if isinstance(reply, Replicated) else reply
        if reply is not UNHEARD and classify(bare)[0] is not Outcome.GRANTED:
            return None
        at_s = unheard_repeats(ttl_s) if reply is UNHEARD else (0.0,)
        return Repeat(plan.wiring.release, (index,), plan.release_keys, args, ttl_s, at_s)

    return late


#: The first gap (s) between the repeats of an unheard call's release; each next one doubles.
UNHEARD_FIRST_GAP_S = 0.1


def unheard_repeats(ttl_s: float) -> tuple[float, ...]:
    """When (s from now) to release what an unheard call may have taken: at once, then after
    gaps doubling from :data:`UNHEARD_FIRST_GAP_S` for as long as its lease could last (a
    request that lands ``d`` late is released within about ``d`` of landing)."""
    at, gap, times = 0.0, UNHEARD_FIRST_GAP_S, [0.0]
    while at + gap < ttl_s:
        at += gap
        times.append(round(at, 6))
        gap *= 2
    return tuple(times)


def _discount_restarted(plan: LockPlan, tally: Tally, ballot: Ballot) -> Flow[Tally]:
    """The acquire round's tally without the grants of recently restarted servers; if it
    stopped early on one of them, the stragglers are heard first (the round's tally fills)."""
    recent = restarting((yield IDENTITIES), (yield NOW), plan.ttl_ms)
    if not any(index in recent for index in tally.granted_indexes()):
        return tally
    counted = without_restarted(tally, recent, plan.names, plan.ttl_ms)
    if ballot.choose(counted)[1].won or not tally.pending:
        return counted
    yield SETTLE  # their votes go to ``tally``; handshakes may show more restarts
    recent = restarting((yield IDENTITIES), (yield NOW), plan.ttl_ms)
    return without_restarted(tally, recent, plan.names, plan.ttl_ms)


def grant_replies(tally: Tally) -> dict[int, AcquireReply]:
    return {
        index: detail
        for index, (outcome, detail) in tally.votes.items()
        if outcome is not Outcome.ERROR and isinstance(detail, AcquireReply)
    }


def fence_commit_round(
    plan: LockPlan,
    granted: tuple[int, ...],
    token: str,
    fence: int,
    classify: Classify,
    stop: StopRule,
) -> tuple[Tally, Broadcast]:
    """Round 2 of an N-server grant (a lock's, a permit's): ``fence`` sent to the servers that
    granted (``granted``), and the tally it fills, where every other server already counts as
    HELD (it granted nothing, so it confirms nothing)."""
    commit = Tally(plan.n)
    for index in plan.everyone:
        if index not in granted:
            commit.record(index, Outcome.HELD)
    return commit, Broadcast(
        plan.wiring.commit,
        granted,
        plan.commit_keys,
        (token, str(fence), plan.fence_retention_ms),
        with_wait(plan, classify),
        stop,
        plan.budget_s,
        commit,
        wait=plan.wait,
    )


def commit_fence(
    plan: LockPlan, token: str, decision: AcquireDecision, tally: Tally, start: float
) -> Flow[AcquireDecision]:
    """Round 2 over N servers: raise the fence register to the merged fence on the granting
    servers; the lease counts only if a majority confirmed within its validity."""
    commit, commit_round = fence_commit_round(
        plan, tuple(tally.granted_indexes()), token, decision.fence, classify_commit, _won
    )
    yield commit_round
    now: float = yield NOW
    validity = decide_confirm(
        commit,
        ttl_ms=plan.ttl_ms,
        elapsed_ms=(now - start) * 1000.0,
        drift=plan.drift_ms(plan.ttl_ms),
    )
    if validity <= 0:
        status = Status.TOO_SLOW if commit.won else Status.UNAVAILABLE
        return AcquireDecision(status)
    return decision


def straggler_grace_s(elapsed_s: float, budget_s: float) -> float:
    """How long a failed attempt waits for the stragglers of its round (``elapsed_s``: how
    long the round took) before it releases: enough for healthy servers to answer (three
    times the round, :data:`STRAGGLER_GRACE_MIN_S` at least), half the round's budget at the
    most. A hung server costs the caller this, not a server timeout."""
    return min(max(STRAGGLER_GRACE_MIN_S, 3.0 * elapsed_s), 0.5 * budget_s)


def clean_up(plan: LockPlan, token: str, tally: Tally, grace_s: float | None) -> Flow[None]:
    """After a failed attempt: release ``token`` wherever it may have landed.

    - ``grace_s``: the round's stragglers are waited for this long at the most, and the
      release round waits only for the servers that answered (a decided round does not wait
      for a hung server; the answers of healthy ones fill the tally, which is the evidence of
      the error raised, and spare them a release). A server whose call is still out is sent
      the release (after the acquire, on a shared connection) without being waited for, and
      gets it again from the background thread once it answers (:class:`~.effects.Repeat`),
      so a late grant there cannot outlive the cleanup;
    - ``None`` (an attempt interrupted by an exception): the stragglers are waited for to the
      round's deadline and the release round waits for every server, so that the caller gets
      the exception once the cleanup is done, within the budget;
    - an exception thrown in meanwhile (a KeyboardInterrupt from a signal handler, a
      cancellation) stops the wait; an interrupted release round hands its work to the
      background; the exception is raised after that.
    """
    if not may_have_landed(tally):
        return
    interrupted: BaseException | None = None
    if tally.pending and (grace_s is None or grace_s > 0):
        try:
            yield SETTLE if grace_s is None else Settle(grace_s)
        except GeneratorExit:
            raise
        except BaseException as exc:
            interrupted = exc
    targets = may_have_landed(tally)
    if plan.tokens_reused:
        # only where the grant was heard, and waited for: a release that lands after this
        # cleanup could delete the next grant of the same token
        targets = tuple(i for i in targets if tally.votes.get(i, (None,))[0] is Outcome.GRANTED)
    if targets:
        heard = (
            None
            if grace_s is None or plan.tokens_reused
            else tuple(i for i in targets if i in tally.votes)
        )
        try:
            yield from release_round(plan, token, targets, await_only=heard)
        except GeneratorExit:
            raise
        except BaseException:
            # the caller is interrupted: the release goes on where no caller can stop it
            yield from repeat_release(plan, targets, release_args(plan, token))
            raise
    if interrupted is not None:
        raise interrupted


def acquire(
    plan: LockPlan,
    wait_s: float,
    *,
    new_token: Callable[[], str],
    holder_info: Callable[[], str],
    rand: Callable[[], float],
    attempt_with: AttemptFn | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Flow[Grant]:
    """Attempt until granted or ``wait_s`` ran out, woken by releases in between
    (``attempt_with``: the attempt to repeat; default: :func:`attempt` on ``plan``).

    ``cancelled``: once it returns True, the wait ends as if its deadline had come: a pause
    is cut short (one pause per wait between attempts, so the caller keeps its place among
    the waiters blocked on the holder's server while it waits), no attempt follows, and a
    grant claimed as it came is still returned (the caller gives it back).

    Raises :class:`~fencelock.NotAcquired` (contention) or :class:`~fencelock.Unavailable`
    (too few servers answered) with the last round's votes.
    """
    begin: float = yield NOW
    deadline = begin + wait_s
    waiter = new_token()[:16] if wait_s > 0 else "-"  # an id only for who will wait
    # the first attempt's id is registered nowhere yet: with "+" before it, the Lock's script
    # removes no registration when it grants (one command less on an uncontended acquire)
    marks = wait_s > 0 and attempt_with is None and plan.wiring.acquire in MARKS_FIRST_ATTEMPT
    first = "+" + waiter if marks else waiter
    attempts = 0
    woken = False
    run = _bound(plan) if attempt_with is None else attempt_with
    while True:
        attempts += 1
        now: float = yield NOW
        result = yield from run(
            new_token(),
            holder_info(),
            woken=woken,
            waiter=first if attempts == 1 else waiter,
            patience=patience_ms(deadline, now),
        )
        if result.grant is not None:
            grant = replace(result.grant, after_wake=1) if woken else result.grant
            if _may_stay_registered(plan, waiter, attempts, result.tally):
                grant = replace(grant, waiter=waiter)
            return grant
        now = yield NOW
        remaining = deadline - now
        if (
            remaining <= 0
            or (cancelled is not None and cancelled())
            # a reused token is not sent again while the last attempt's may still land
            or (plan.tokens_reused and silent(result.tally))
        ):
            raise acquire_failure(plan.key, result.decision, result.tally, plan.names, attempts)
        delay = retry_delay_s(
            attempt=attempts - 1,
            remaining_s=remaining,
            holder_pttl_ms=result.decision.holder_pttl_ms,
            base_s=plan.retry_base_s,
            cap_s=plan.retry_cap_s,
            rand=rand(),
        )
        held = first_held(result.tally)
        if held is None or not plan.hands_over or attempt_with is not None:
            wake = None if held is None else (held, plan.keys.wake)
            woken = yield Pause(delay, wake, stop=cancelled)
        else:
            giver = _giver(plan, waiter, new_token)
            claimed = yield from claim(plan, delay, held, giver, cancelled)
            if claimed.handed is not None:
                handed = claimed.handed
                # acquired when heard (``hold(at_least=)``, ``max_hold`` count from it); valid
                # until the deadline counted from before the wait
                return Grant(
                    handed.token,
                    handed.fence,
                    claimed.claimed_at,
                    claimed.deadline,
                    0,
                    waiter,
                    after_wake=1 if claimed.refreshed else 0,
                )
            woken = claimed.woken
        if cancelled is not None and cancelled():
            raise acquire_failure(plan.key, result.decision, result.tally, plan.names, attempts)


def _may_stay_registered(plan: LockPlan, waiter: str, attempts: int, won: Tally) -> bool:
    """Whether a grant keeps its waiter id for its release to remove (``Grant.waiter``; every
    release script a waiting acquire's lease runs removes it first, on every server it
    reaches: ``release.lua`` for a Lock's and a permit's, ``rw_*_release.lua``): a writer's
    always (its refusals leave markers); any other when a server may still hold the id,
    registered by a refusal: an earlier attempt was refused somewhere, or a server did not
    grant the winning one (it refused, the last holder's release not there yet, or its reply
    was not heard: the round ended on its majority, and a refusal may be on its way). A first
    attempt granted by every server registered nothing: its release sends no id."""
    if plan.wiring.acquire in MARKS_WAITER:
        return True
    return waiter != "-" and (attempts > 1 or won.granted < plan.n)


def _giver(
    plan: LockPlan, waiter: str, new_token: Callable[[], str]
) -> Callable[[Handed], Flow[object]]:
    """Releases a claimed grant that cannot be used, handing it over to the next waiter."""

    def give_back(handed: Handed) -> Flow[object]:
        return release_round(
            plan, handed.token, waiter=waiter, next_token=offered_token(plan, new_token)
        )

    return give_back


def _bound(plan: LockPlan) -> AttemptFn:
    def run(token: str, info: str, *, woken: bool, waiter: str, patience: int) -> Flow[Attempt]:
        return attempt(plan, token, info, woken=woken, waiter=waiter, patience=patience)

    return run


def try_acquire(
    plan: LockPlan, token: str, info: str, attempt_with: AttemptFn | None = None
) -> Flow[Grant | None]:
    """One attempt: the grant, ``None`` for contention; raises
    :class:`~fencelock.Unavailable` when too few servers answered."""
    run = _bound(plan) if attempt_with is None else attempt_with
    result = yield from run(token, info, woken=False, waiter="-", patience=0)
    if result.grant is not None:
        return result.grant
    if result.decision.status is Status.CONTENTION:
        return None
    raise acquire_failure(plan.key, result.decision, result.tally, plan.names, 1)
