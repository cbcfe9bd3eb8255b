"""A fair lock, written once: waiters are granted in arrival order, over 1 or N servers.

The lock itself is an ordinary lock key with its fence register (so mutual exclusion, fences,
extend, renewal and ``fencelock status`` are those of a plain lock, and over N servers a grant
still needs a majority and a committed fence). What fairness adds is a queue on each server:

- a waiter's entry is (waiter id -> arrival **ticket**) in a zset, with a **heartbeat** (id ->
  expiry) in a second zset; every attempt refreshes the heartbeat, and a waiter attempts at
  least every ``heartbeat / 3`` while it waits, so an entry whose heartbeat ran out belongs to
  a waiter that died (SIGKILL) or stopped calling: the next script call on that server drops
  it. A dead waiter at the head is skipped within one heartbeat plus one refresh period;
- a server grants only to the head of its queue (the lowest ticket), and only while the lock
  key is free; a caller that will not wait (``try_acquire``, ``wait=0``) gets it only when
  nobody is queued;
- a grant keeps the holder's entry (a grant that did not reach a majority is released with a
  bare compare-and-delete, so its waiter stays first in line everywhere); the release takes it
  out on every server, even where the lock was not ours (the waiter id is the token's first 16
  characters), then wakes the head only (its own wake list) wherever the lock is free;
- a waiter that gives up (its wait ran out, a cancellation, an error) leaves the queue on
  every server, waking the new head when it was the head of a free lock. Anything left
  behind (a straggler that re-queued after the leave, a wake list nobody read, the entry of a
  holder that crashed) expires by its TTL (heartbeat, wake lifetime).

The ticket over N servers (what "arrival order" means): a newcomer's first attempt proposes
``max(last ticket + 1, server TIME in us)`` on each server; the ticket is the largest proposal
and is written back at once to every server by a second attempt (the first with the ticket).
A waiter has *arrived* once its ticket is on a majority; a waiter that arrives after that reads
the queue of a majority, which intersects ours, so it proposes a larger ticket: arrivals that
do not overlap are served in their order, overlapping ones in one order that every server
agrees on (ticket, then waiter id). The same ticket is re-sent on every attempt, so a server
that restarted empty gets the queue back, in order, within a refresh period.

Where the order can still be broken (fairness is best effort; mutual exclusion never is):
a waiter that stalls for longer than the heartbeat is dropped (when it comes back it takes
its old place again, ahead of those who arrived after it, but those granted meanwhile went
first); a majority of servers that lost their
queues (restart without persistence) while their clocks lag the one that issued the earlier
tickets; and a plain (not fair) lock on the same key ignores the queue (it stays mutually
exclusive with the fair one, with the same fences).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .acquire import Attempt, AttemptFn, Grant, grant_attempt
from .backoff import retry_delay_s
from .effects import NOW, Broadcast, Flow, Pause, Repeat
from .fencing import floor_step_us
from .keys import fair_queue_key
from .plan import LockPlan, lock_wiring, release_keys
from .quorum import Outcome, Tally
from .replies import AcquireReply, ProtocolError, _int, classify_decoded, decode_flag
from .verdicts import acquire_failure


@dataclass(frozen=True)
class FairKeys:
    """The queue keys of the fair lock ``lock`` (same hash tag as the lock key)."""

    queue: str  # zset: waiter id -> arrival ticket
    beats: str  # zset: waiter id -> heartbeat expiry in server ms
    wake: str  # a waiter's wake list is ``wake + ":" + its id``

    def wake_list(self, waiter: str) -> str:
        return f"{self.wake}:{waiter}"


def fair_keys(plan: LockPlan) -> FairKeys:
    base = fair_queue_key(plan.keys)
    return FairKeys(queue=base, beats=base + ":beats", wake=base + ":wake")


def fair_plan(base: LockPlan) -> LockPlan:
    """``base`` with the fair scripts: extend and the fence commit are the plain lock's."""
    k = base.keys
    q = fair_keys(base)
    wiring = replace(
        lock_wiring(k),
        acquire="fair_acquire",
        acquire_keys=(k.lock, k.fence, k.holder, q.queue, q.beats, q.wake),
        release="fair_release",
        release_keys=(k.lock, k.holder, q.queue, q.beats, q.wake),
    )
    return base.rewired(k, wiring)


@dataclass(frozen=True)
class FairReply(AcquireReply):
    """A fair_acquire reply: an :class:`AcquireReply` plus the caller's ticket on a refusal."""

    ticket: int = 0


def decode_fair(reply: object) -> FairReply:
    """``fair_acquire.lua`` returns ``{1, fence}`` on a grant, ``{0, pttl_ms, ticket}`` else."""
    if isinstance(reply, list | tuple):
        if len(reply) == 2 and _int(reply[0]) == 1:
            fence = _int(reply[1])
            if fence > 0:
                return FairReply(True, fence, 0)
        if len(reply) == 3 and _int(reply[0]) == 0:
            ticket = _int(reply[2])
            if ticket >= 0:
                return FairReply(False, 0, _int(reply[1]), ticket=ticket)
    raise ProtocolError(f"fair_acquire: unexpected reply {reply!r}")


def classify_fair(result: object) -> tuple[Outcome, object]:
    return classify_decoded(result, decode_fair)


def classify_leave(result: object) -> tuple[Outcome, object]:
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    try:
        decode_flag(result, "fair_leave")
    except ProtocolError as exc:
        return Outcome.ERROR, exc
    return Outcome.GRANTED, result


def tickets(tally: Tally) -> list[int]:
    """The tickets the servers that answered hold for the caller."""
    return [
        detail.ticket
        for outcome, detail in tally.votes.values()
        if outcome is Outcome.HELD and isinstance(detail, FairReply) and detail.ticket > 0
    ]


def attempt_fair(
    plan: LockPlan, token: str, info: str, *, waiter: str, ticket: int, heartbeat_ms: int
) -> Flow[Attempt]:
    """One attempt (``plan`` from :func:`fair_plan`): queue ``waiter`` with ``ticket`` (0: a
    new arrival) on every server and take the lock where it is first in line; a majority and
    the fence commit as for a plain lock. Never raises for contention or outages; raises
    :class:`~fencelock.ConfigError` when the servers are not independent."""
    args = (token, plan.ttl_ms, info, waiter, str(ticket), heartbeat_ms, plan.fence_retention_ms,
            floor_step_us(plan.n, plan.restart_delay))  # fmt: skip
    return grant_attempt(plan, token, args, classify_fair, cleanup=_quiet(plan))


def _quiet(plan: LockPlan) -> LockPlan:
    """``plan`` whose release is a bare compare-and-delete (the plain release script over the
    plain waiter keys, which a fair lock leaves empty): the failed attempt of a waiter keeps
    its place in the queue, and wakes nobody (it is the head; it tries again at once)."""
    k = plan.keys
    return plan.rewired(
        k,
        replace(
            plan.wiring,
            release="release",
            release_keys=release_keys(k),
        ),
    )


def _leave_keys(plan: LockPlan) -> tuple[str, ...]:
    q = fair_keys(plan)
    return (plan.keys.lock, q.queue, q.beats, q.wake)


def leave(plan: LockPlan, waiter: str) -> Flow[None]:
    """Take ``waiter`` out of the queue on every server (those that do not answer get it
    again in the background; an entry left anyway expires with its heartbeat)."""
    tally = Tally(plan.n)
    args = (waiter, plan.wake_ms)
    yield Broadcast(
        "fair_leave",
        plan.everyone,
        _leave_keys(plan),
        args,
        classify_leave,
        None,
        plan.budget_s,
        tally,
    )
    silent = tuple(
        i for i in plan.everyone if tally.votes.get(i, (Outcome.ERROR,))[0] is Outcome.ERROR
    )
    if silent:
        yield Repeat("fair_leave", silent, _leave_keys(plan), args, until_s=plan.ttl_ms / 1000.0)


def _first_answered(tally: Tally) -> int | None:
    answered = [i for i, (outcome, _) in tally.votes.items() if outcome is not Outcome.ERROR]
    return min(answered) if answered else None


def acquire_fair(
    plan: LockPlan,
    wait_s: float,
    *,
    new_token: Callable[[], str],
    holder_info: Callable[[], str],
    rand: Callable[[], float],
    heartbeat_s: float,
    cancelled: Callable[[], bool] | None = None,
) -> Flow[Grant]:
    """Wait in line up to ``wait_s`` seconds (``plan`` from :func:`fair_plan`); ``wait_s = 0``
    is one attempt that succeeds only when nobody is queued. ``heartbeat_s``: the lease of the
    caller's queue entry (refreshed every ``heartbeat_s / 3`` while it waits). ``cancelled``:
    once True, the wait ends as if its deadline had come (a pause is cut short, no attempt
    follows).

    Raises :class:`~fencelock.NotAcquired` (contention) or :class:`~fencelock.Unavailable`
    (too few servers answered) after the wait, having left the queue everywhere; any exception
    thrown in (a cancellation) also leaves the queue before it propagates.
    """
    begin: float = yield NOW
    deadline = begin + wait_s
    heartbeat_ms = max(1, int(heartbeat_s * 1000.0))
    refresh_s = heartbeat_s / 3.0
    if wait_s <= 0:
        result = yield from attempt_fair(
            plan, new_token(), holder_info(), waiter="-", ticket=0, heartbeat_ms=heartbeat_ms
        )
        if result.grant is not None:
            return result.grant
        raise acquire_failure(plan.key, result.decision, result.tally, plan.names, 1)
    waiter = new_token()[:16]
    wake = fair_keys(plan).wake_list(waiter)
    ticket = 0
    attempts = 0
    try:
        while True:
            attempts += 1
            result = yield from attempt_fair(
                plan,
                waiter + new_token()[:16],  # the release finds our entry from the token
                holder_info(),
                waiter=waiter,
                ticket=ticket,
                heartbeat_ms=heartbeat_ms,
            )
            if result.grant is not None:
                return result.grant  # our entry goes with the release (fair_release)
            seen = tickets(result.tally)
            merged = max([ticket, *seen])
            # a new ticket (or servers that disagree) is written back at once: the waiter has
            # arrived only when a majority holds the same ticket for it
            again = plan.n > 1 and any(t != merged for t in seen)
            ticket = merged
            now: float = yield NOW
            remaining = deadline - now
            if remaining <= 0 or (cancelled is not None and cancelled()):
                raise acquire_failure(plan.key, result.decision, result.tally, plan.names, attempts)
            if again:
                continue
            pttl = result.decision.holder_pttl_ms
            if result.tally.granted:
                # first in line and free on some servers but not on a majority (a release
                # still on its way to the others, a split): back off briefly, not for a lease
                pttl = None
            elif pttl == 0:
                # free, but others are ahead: the wake signal (sent to the head only) or the
                # next heartbeat ends the pause, whichever comes first
                pttl = int(remaining * 1000.0)
            delay = retry_delay_s(
                attempt=attempts - 1,
                remaining_s=remaining,
                holder_pttl_ms=pttl,
                base_s=plan.retry_base_s,
                cap_s=plan.retry_cap_s,
                rand=rand(),
            )
            delay = min(delay, refresh_s, remaining)
            server = _first_answered(result.tally)
            yield Pause(delay, None if server is None else (server, wake), stop=cancelled)
            if cancelled is not None and cancelled():
                raise acquire_failure(plan.key, result.decision, result.tally, plan.names, attempts)
    except GeneratorExit:
        raise
    except BaseException:
        yield from leave(plan, waiter)
        raise


def fair_attempt(plan: LockPlan) -> AttemptFn:
    """One attempt of a caller that will not wait (``try_acquire``): granted only when the
    lock is free and nobody is queued; it never queues itself."""

    def run(token: str, info: str, *, woken: bool, waiter: str, patience: int) -> Flow[Attempt]:
        return attempt_fair(plan, token, info, waiter="-", ticket=0, heartbeat_ms=1)

    return run
