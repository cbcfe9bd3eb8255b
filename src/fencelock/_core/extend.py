"""Extend and renew, written once.

An extend restarts the lease at ``ttl`` on every server that still holds our token. Its outcome:
- confirmed on a majority within the new validity: the deadline is ``start + ttl - drift``;
- refused ("not ours") by so many servers that no majority can be ours: the lease is lost;
- anything else is unknown: the new PEXPIRE may have landed on a majority or not, so the
  deadline becomes the EARLIER of the old and the new one (a shorter ttl may have taken effect).

A PEXPIRE whose reply did not come (the server was silent) may still land later, after a
later round's: there it cuts the key to when it lands plus its ttl, so to no less than the
later round's start plus its ttl. The validity keeps, per server, the shortest such span
(``Validity.pending``), and a confirmed round lasts only while a majority of the servers that
confirmed it hold the key under those bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..errors import LockLost, Unavailable
from .effects import NOW, Broadcast, Flow
from .plan import LockPlan
from .quorum import Tally, summary
from .replies import classify_extend, with_wait
from .rounds import lost_for_sure
from .verdicts import outage, silent, votes

#: A failed renewal is retried after this long (s) at the least.
RETRY_FLOOR_S = 0.01


class ExtendOutcome(str, Enum):
    CONFIRMED = "confirmed"
    REFUSED = "refused"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Extension:
    outcome: ExtendOutcome
    deadline: float  # the lease's local deadline after this extend (monotonic s)
    error: LockLost | Unavailable | None  # what extend() raises; None when confirmed
    lost_reason: str | None  # set when the lease is now known lost
    #: When this round started (monotonic s): orders rounds that overlapped (:func:`settle`).
    start: float = 0.0
    #: ``start + ttl - drift``: the deadline this round's PEXPIRE gives where it landed.
    round_deadline: float = 0.0
    #: The tally's summary (``'k': 2/3 servers agreed...``), for the verdict's messages.
    text: str = ""
    #: What an unknown outcome raises while the lease is still valid.
    unavailable: Unavailable | None = None
    #: The servers that confirmed it, and how many make a majority.
    confirmed_by: tuple[int, ...] = ()
    needed: int = 1
    #: The servers it was sent to whose reply was not heard: its PEXPIRE may land there later.
    unheard: tuple[int, ...] = ()

    @property
    def span(self) -> float:
        """Seconds of validity this round's PEXPIRE gives from its start."""
        return self.round_deadline - self.start


def _decided(tally: Tally) -> bool:
    return tally.decided


def extended_span_s(plan: LockPlan, ttl_ms: int) -> float:
    """Seconds of validity an extend to ``ttl_ms`` gives from its start: ``ttl - drift``."""
    return (ttl_ms - plan.drift_ms(ttl_ms)) / 1000.0


def extend(
    plan: LockPlan, token: str, ttl_ms: int, deadline: float, grant: str = ""
) -> Flow[Extension]:
    """Extend a lease whose local deadline is ``deadline`` to ``ttl_ms`` from now; ``grant``
    (see :meth:`LockPlan.grant_tag`): the lease's grant, for a token that is granted again."""
    start: float = yield NOW
    tally = Tally(plan.n)
    yield Broadcast(
        plan.wiring.extend,
        plan.everyone,
        (*plan.extend_keys, plan.keys.fence) if grant else plan.extend_keys,
        (token, ttl_ms, grant) if grant else (token, ttl_ms),
        with_wait(plan, classify_extend, held=True),
        _decided,
        plan.budget_s,
        tally,
        wait=plan.wait,
    )
    now: float = yield NOW
    new_deadline = start + extended_span_s(plan, ttl_ms)
    text = summary(plan.key, tally)
    # servers whose reply did not come within the round (and, for a round that did not
    # confirm, those it did not wait for): their PEXPIRE may land after a later round's. A
    # confirmed round that ended on its majority leaves the rest in flight, answered at once
    # in the common case; they are not counted (docs/design.md, "Extends that land late")
    unheard = set(silent(tally))
    if not (tally.won and now < new_deadline):
        unheard.update(i for i in plan.everyone if i not in tally.votes)

    def made(
        outcome: ExtendOutcome,
        deadline: float,
        error: LockLost | Unavailable | None,
        lost_reason: str | None,
        unavailable: Unavailable | None = None,
    ) -> Extension:
        return Extension(
            outcome, deadline, error, lost_reason, start, new_deadline, text, unavailable,
            tuple(tally.granted_indexes()), tally.needed, tuple(sorted(unheard)),
        )  # fmt: skip

    if tally.won and now < new_deadline:
        return made(ExtendOutcome.CONFIRMED, new_deadline, None, None)
    kept = earlier_deadline(deadline, new_deadline)
    if lost_for_sure(tally):
        reason = f"extend refused: {text}"
        error = LockLost(plan.key, f"{text}: the lease is no longer ours")
        return made(ExtendOutcome.REFUSED, kept, error, reason)
    reason = outage(tally, "extend not confirmed")
    unavailable = Unavailable(plan.key, f"{text}: {reason}", votes(tally, plan.names))
    if now >= kept:
        lost_reason, lost = _ran_out(plan.key, text)
        return made(ExtendOutcome.UNKNOWN, kept, lost, lost_reason, unavailable)
    return made(ExtendOutcome.UNKNOWN, kept, unavailable, None, unavailable)


def earlier_deadline(deadline: float, new_deadline: float) -> float:
    """The deadline after an extend that was not confirmed: the earlier of the lease's
    deadline and the one the extend's PEXPIRE gives (a shorter ttl may have landed)."""
    kept = min(deadline, new_deadline)
    return kept


def _ran_out(key: str, text: str) -> tuple[str, LockLost]:
    """The loss of a lease whose deadline passed before a majority confirmed its extend."""
    reason = f"renewal not confirmed before the lease ran out: {text}"
    return reason, LockLost(key, f"{text}: the lease ran out before a majority confirmed")


@dataclass(frozen=True, slots=True)
class Validity:
    """A lease's local validity: its deadline (monotonic s), and the start of the confirmed
    round (the grant, or an extend) it comes from. ``pending``: per server index, the shortest
    span (s) of an extend sent there whose reply was not heard (``inf``: none; ``()``: none
    anywhere): it may land after a later round's and cut the key to that span."""

    deadline: float
    since: float
    pending: tuple[float, ...] = ()


def _pending_after(pending: tuple[float, ...], result: Extension) -> tuple[float, ...]:
    """``pending`` with ``result``'s span on the servers that did not answer it."""
    if not result.unheard:
        return pending
    size = max(len(pending), max(result.unheard) + 1)
    spans = list(pending) + [math.inf] * (size - len(pending))
    for index in result.unheard:
        spans[index] = min(spans[index], result.span)
    return tuple(spans)


def _confirmed_deadline(result: Extension, pending: tuple[float, ...]) -> float:
    """A confirmed round's deadline under the PEXPIREs of earlier rounds that may still land
    (``pending``): each confirming server holds the key until the round's start plus the
    shorter of its span and the server's pending one; the lease lasts while a majority do
    (a confirmed round has at least ``needed`` servers that confirmed it)."""
    if not pending:
        return result.round_deadline
    bounds = sorted(
        (
            result.start + min(result.span, pending[i] if i < len(pending) else math.inf)
            for i in result.confirmed_by
        ),
        reverse=True,
    )
    return min(result.round_deadline, bounds[result.needed - 1])


@dataclass(frozen=True, slots=True)
class Settled:
    """An extend's verdict applied to the lease's validity as it is when the reply arrived."""

    validity: Validity
    lost_reason: str | None  # the lease is lost now
    error: LockLost | Unavailable | None  # what a user's extend() raises
    confirmed: bool  # a confirmed round that counts (clears ``at_risk``)


#: Why a lease is lost at its local deadline (the timer's reason, and a too-late reply's).
DEADLINE_REASON = "renewal not confirmed before the local deadline"


def settle(key: str, current: Validity, result: Extension, now: float) -> Settled:
    """Apply ``result`` to the lease's validity ``current`` at ``now``, when its reply arrived
    (the caller has checked that the lease is not already lost or released: a late reply never
    revives a lost lease, nor clears its ``at_risk``).

    - A reply that arrives at or after the current deadline is too late, confirmed or not: the
      lease was not valid meanwhile, so it is lost (the deadline timer says so too).
    - Rounds may overlap (a user's extend and a renewal already in flight): a confirmed round
      moves the deadline only if it started no earlier than the round the current deadline
      comes from; an older one's result never overwrites a newer one's.
    - An unknown or refused outcome keeps the earlier of the current deadline and the one this
      round would give (its PEXPIRE may have landed), whatever the order.
    - A round's PEXPIRE whose reply was not heard on a server may land there later than any
      later round's (``Validity.pending``): a confirmed round's deadline counts, on each
      server that confirmed it, the shorter of its span and that server's pending one.
    """
    if now >= current.deadline:
        error = LockLost(key, f"{key!r}: the lease ran out before its extend was confirmed")
        return Settled(current, DEADLINE_REASON, error, False)
    pending = _pending_after(current.pending, result)
    if result.outcome is ExtendOutcome.CONFIRMED:
        if result.start >= current.since:
            deadline = _confirmed_deadline(result, current.pending)
            return Settled(Validity(deadline, result.start, pending), None, None, True)
        return Settled(Validity(current.deadline, current.since, pending), None, None, True)
    kept = Validity(
        earlier_deadline(current.deadline, result.round_deadline), current.since, pending
    )
    if result.outcome is ExtendOutcome.REFUSED:
        return Settled(kept, result.lost_reason, result.error, False)
    if now >= kept.deadline:
        reason, lost = _ran_out(key, result.text)
        return Settled(kept, reason, lost, False)
    return Settled(kept, None, result.unavailable or result.error, False)


@dataclass(frozen=True, slots=True)
class RenewStep:
    """After one renewal: the new deadline, and either when to renew next or why it stopped.

    ``at_risk``: the renewal missed its deadline: its round did not confirm on a majority
    (servers silent, paused or partitioned), so the lease may soon be lost. Renewals are
    retried at a third of the time left, so the warning comes well before the loss (about two
    thirds of the lease early with the default period). False after a renewal that confirmed,
    which clears an earlier warning.

    These fields judge the round against the deadline it started with; a lease applies the
    round's ``extension`` to its validity as it is when the reply arrives
    (:func:`settle_renewal`).
    """

    deadline: float
    next_at: float | None  # monotonic s of the next renewal; None: renewal stops
    lost_reason: str | None  # the lease is lost now (None: still ours, or left to expire)
    stop_reason: str | None = None  # renewal stopped on purpose (max_hold); lost at deadline
    failed: bool = False  # this step's extend was not confirmed (refused or unknown)
    at_risk: bool = False
    extension: Extension | None = None  # the round's result; None when none was sent


def _next_at(
    confirmed: bool, deadline: float, now: float, every_s: float, stop_at: float | None
) -> float:
    """When to renew next: after ``every_s`` once confirmed, but never later than a third of
    the validity left (a short ttl, say); after a failure, sooner (a third of what is left,
    at least :data:`RETRY_FLOOR_S`); never past ``stop_at``."""
    if confirmed:
        next_at = min(now + every_s, now + max(0.0, deadline - now) / 3.0)
    else:
        next_at = now + max(RETRY_FLOOR_S, min(every_s, (deadline - now) / 3.0))
    return next_at if stop_at is None else min(next_at, stop_at)


def renew(
    plan: LockPlan,
    token: str,
    deadline: float,
    *,
    every_s: float,
    stop_at: float | None,
    grant: str = "",
) -> Flow[RenewStep]:
    """One renewal step of a lease; ``stop_at`` (monotonic s): renew no more from then on
    (``max_hold``), the lease then runs out at its deadline."""
    now: float = yield NOW
    if stop_at is not None and now >= stop_at:
        return RenewStep(deadline, None, None, "max_hold reached; renewal stopped")
    result = yield from extend(plan, token, plan.ttl_ms, deadline, grant)
    now = yield NOW
    if result.lost_reason is not None:
        return RenewStep(
            result.deadline, None, result.lost_reason, failed=True, at_risk=True, extension=result
        )
    confirmed = result.outcome is ExtendOutcome.CONFIRMED
    next_at = _next_at(confirmed, result.deadline, now, every_s, stop_at)
    return RenewStep(
        result.deadline,
        next_at,
        None,
        failed=not confirmed,
        at_risk=not confirmed,
        extension=result,
    )


@dataclass(frozen=True, slots=True)
class Renewed:
    """A renewal step applied to the lease's validity when its reply arrived."""

    validity: Validity
    next_at: float | None  # None: renewal stops
    lost_reason: str | None  # the lease is lost now
    at_risk: bool  # the round did not confirm: set ``at_risk``
    confirmed: bool  # a confirmed round: clears ``at_risk``


def settle_renewal(
    key: str,
    current: Validity,
    step: RenewStep,
    now: float,
    *,
    every_s: float,
    stop_at: float | None,
) -> Renewed:
    """Apply a renewal step to ``current`` at ``now`` (see :func:`settle`; the caller has
    checked the lease is neither lost nor released). A step that sent nothing (``max_hold``)
    leaves the validity as it is and stops the renewal."""
    if step.extension is None:
        return Renewed(current, None, None, False, False)
    settled = settle(key, current, step.extension, now)
    if settled.lost_reason is not None:
        return Renewed(settled.validity, None, settled.lost_reason, False, False)
    confirmed = settled.confirmed
    next_at = _next_at(confirmed, settled.validity.deadline, now, every_s, stop_at)
    return Renewed(settled.validity, next_at, None, not confirmed, confirmed)
