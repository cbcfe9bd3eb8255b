"""Acquire, written once: one attempt (grant round, fence commit, cleanup) and the wait loop.

Rules of an attempt:
- the clock starts before the first byte is sent; a grant is valid until
  ``start + ttl - drift`` and only if that is still ahead when the last round ends;
- over N > 1 servers the merged fence is committed to a majority before the lease is handed out;
- a failed attempt releases its token wherever it may have landed, after waiting for the
  stragglers that were sent it (so the release cannot overtake their SET), and repeats the
  release in the background on servers that did not answer;
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
from dataclasses import dataclass
from typing import Protocol

from .backoff import retry_delay_s
from .effects import IDENTITIES, NOW, SETTLE, Broadcast, Classify, Flow, Identify, Pause
from .fencing import needs_commit
from .handover import Handed, claim, offered_token
from .plan import LockPlan
from .quorum import Outcome, Tally
from .release import release_round
from .replies import AcquireReply, classify_acquire, classify_commit, with_wait
from .rounds import AcquireDecision, Status, decide_acquire, decide_confirm
from .verdicts import (
    acquire_failure,
    first_held,
    independence_problem,
    may_have_landed,
    restarting,
    without_restarted,
)

#: A patience (ms) sent to the acquire script is capped here (an infinite wait fits too).
PATIENCE_CAP_MS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class Grant:
    """A won attempt: valid until ``deadline`` (monotonic s), counted from ``start`` (for a
    claimed hand-over: from before the wait; ``start`` is then when the grant was heard)."""

    token: str
    fence: int
    start: float
    deadline: float
    slot: int = 0  # the semaphore slot won (0 for every other kind of lock)
    waiter: str = "-"  # the waiter id still registered (a grant claimed from a hand-over)


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt gave: ``grant``, or the decision and tally of the refusal."""

    grant: Grant | None
    decision: AcquireDecision
    tally: Tally


class AttemptFn(Protocol):
    """One attempt with a fresh token (``attempt`` bound to a plan, or a semaphore's)."""

    def __call__(
        self, token: str, info: str, *, woken: bool, waiter: str, patience: int
    ) -> Flow[Attempt]: ...


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
    args = (token, plan.ttl_ms, info, "1" if woken else "0", waiter, patience)
    return grant_attempt(plan, token, args, classify_acquire)


def grant_attempt(
    plan: LockPlan,
    token: str,
    args: tuple[str | int, ...],
    classify: Classify,
    *,
    cleanup: LockPlan | None = None,
) -> Flow[Attempt]:
    """The body of an attempt whose acquire script (``plan.wiring.acquire``, called with
    ``args``, its replies read by ``classify``) grants like the plain lock's: the majority,
    ``restart_delay``, the validity check and the fence commit; what may have landed of a
    failed attempt is released with ``cleanup``'s release (default: ``plan``'s)."""
    n = plan.n
    if n > 1:
        problem = independence_problem((yield Identify(plan.budget_s)), plan.names)
        if problem is not None:
            raise problem
    start: float = yield NOW
    tally = Tally(n)
    drift = plan.drift_ms(plan.ttl_ms)
    undo = plan if cleanup is None else cleanup
    try:
        yield Broadcast(
            plan.wiring.acquire,
            plan.everyone,
            plan.acquire_keys,
            args,
            with_wait(plan, classify),
            settled,
            plan.budget_s,
            tally,
            wait=plan.wait,
        )
        if plan.restart_delay:
            tally = yield from _discount_restarted(plan, tally)
        now: float = yield NOW
        decision = decide_acquire(
            tally,
            grant_replies(tally),
            ttl_ms=plan.ttl_ms,
            elapsed_ms=(now - start) * 1000.0,
            drift=drift,
        )
        if n > 1:
            problem = independence_problem((yield IDENTITIES), plan.names)
            if problem is not None:
                raise problem
        if decision.status is Status.GRANTED and needs_commit(n):
            decision = yield from commit_fence(plan, token, decision, tally, start)
    except GeneratorExit:
        raise
    except BaseException:
        yield from clean_up(undo, token, tally)
        raise
    if decision.status is Status.GRANTED:
        deadline = start + (plan.ttl_ms - drift) / 1000.0
        return Attempt(Grant(token, decision.fence, start, deadline), decision, tally)
    yield from clean_up(undo, token, tally)
    return Attempt(None, decision, tally)


def _discount_restarted(plan: LockPlan, tally: Tally) -> Flow[Tally]:
    """The acquire round's tally without the grants of recently restarted servers; if it
    stopped early on one of them, the stragglers are heard first (the round's tally fills)."""
    recent = restarting((yield IDENTITIES), (yield NOW), plan.ttl_ms)
    if not any(index in recent for index in tally.granted_indexes()):
        return tally
    counted = without_restarted(tally, recent, plan.names, plan.ttl_ms)
    if counted.won or not tally.pending:
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


def commit_fence(
    plan: LockPlan, token: str, decision: AcquireDecision, tally: Tally, start: float
) -> Flow[AcquireDecision]:
    """Round 2 over N servers: raise the fence register to the merged fence on the granting
    servers; the lease counts only if a majority confirmed within its validity."""
    granted = tuple(tally.granted_indexes())
    commit = Tally(plan.n)
    for index in plan.everyone:
        if index not in granted:
            commit.record(index, Outcome.HELD)
    yield Broadcast(
        plan.wiring.commit,
        granted,
        plan.commit_keys,
        (token, str(decision.fence)),
        with_wait(plan, classify_commit),
        _won,
        plan.budget_s,
        commit,
        wait=plan.wait,
    )
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


def clean_up(plan: LockPlan, token: str, tally: Tally) -> Flow[None]:
    """After a failed attempt: release ``token`` wherever it may have landed."""
    if not may_have_landed(tally):
        return
    if tally.pending:
        yield SETTLE  # so the release cannot overtake a straggler's SET on the server
    targets = may_have_landed(tally)
    if targets:
        yield from release_round(plan, token, targets)


def acquire(
    plan: LockPlan,
    wait_s: float,
    *,
    new_token: Callable[[], str],
    holder_info: Callable[[], str],
    rand: Callable[[], float],
    attempt_with: AttemptFn | None = None,
) -> Flow[Grant]:
    """Attempt until granted or ``wait_s`` ran out, woken by releases in between
    (``attempt_with``: the attempt to repeat; default: :func:`attempt` on ``plan``).

    Raises :class:`~fencelock.NotAcquired` (contention) or :class:`~fencelock.Unavailable`
    (too few servers answered) with the last round's votes.
    """
    begin: float = yield NOW
    deadline = begin + wait_s
    waiter = new_token()[:16] if wait_s > 0 else "-"  # an id only for who will wait
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
            waiter=waiter,
            patience=patience_ms(deadline, now),
        )
        if result.grant is not None:
            return result.grant
        now = yield NOW
        remaining = deadline - now
        if remaining <= 0:
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
            woken = yield Pause(delay, None if held is None else (held, plan.keys.wake))
            continue
        claimed = yield from claim(plan, delay, held, _giver(plan, waiter, new_token))
        if claimed.handed is not None:
            handed = claimed.handed
            # acquired when heard (``hold(at_least=)``, ``max_hold`` count from it); valid
            # until the deadline counted from before the wait
            return Grant(
                handed.token, handed.fence, claimed.claimed_at, claimed.deadline, 0, waiter
            )
        woken = claimed.woken


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
