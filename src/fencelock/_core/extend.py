"""Extend and renew, written once.

An extend restarts the lease at ``ttl`` on every server that still holds our token. Its outcome:
- confirmed on a majority within the new validity: the deadline is ``start + ttl - drift``;
- refused ("not ours") by so many servers that no majority can be ours: the lease is lost;
- anything else is unknown: the new PEXPIRE may have landed on a majority or not, so the
  deadline becomes the EARLIER of the old and the new one (a shorter ttl may have taken effect).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import LockLost, Unavailable
from .effects import NOW, Broadcast, Flow
from .plan import LockPlan
from .quorum import Tally, summary
from .replies import classify_extend, with_wait
from .rounds import lost_for_sure
from .verdicts import outage, votes

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


def _decided(tally: Tally) -> bool:
    return tally.decided


def extended_span_s(plan: LockPlan, ttl_ms: int) -> float:
    """Seconds of validity an extend to ``ttl_ms`` gives from its start: ``ttl - drift``."""
    return (ttl_ms - plan.drift_ms(ttl_ms)) / 1000.0


def extend(plan: LockPlan, token: str, ttl_ms: int, deadline: float) -> Flow[Extension]:
    """Extend a lease whose local deadline is ``deadline`` to ``ttl_ms`` from now."""
    start: float = yield NOW
    tally = Tally(plan.n)
    yield Broadcast(
        plan.wiring.extend,
        plan.everyone,
        plan.extend_keys,
        (token, ttl_ms),
        with_wait(plan, classify_extend, held=True),
        _decided,
        plan.budget_s,
        tally,
        wait=plan.wait,
    )
    now: float = yield NOW
    new_deadline = start + extended_span_s(plan, ttl_ms)
    text = summary(plan.key, tally)
    if tally.won and now < new_deadline:
        return Extension(
            ExtendOutcome.CONFIRMED, new_deadline, None, None, start, new_deadline, text
        )
    kept = earlier_deadline(deadline, new_deadline)
    if lost_for_sure(tally):
        reason = f"extend refused: {text}"
        error = LockLost(plan.key, f"{text}: the lease is no longer ours")
        return Extension(ExtendOutcome.REFUSED, kept, error, reason, start, new_deadline, text)
    reason = outage(tally, "extend not confirmed")
    unavailable = Unavailable(plan.key, f"{text}: {reason}", votes(tally, plan.names))
    if now >= kept:
        lost = _ran_out(plan.key, text)
        return Extension(
            ExtendOutcome.UNKNOWN, kept, lost[1], lost[0], start, new_deadline, text, unavailable
        )
    return Extension(
        ExtendOutcome.UNKNOWN, kept, unavailable, None, start, new_deadline, text, unavailable
    )


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
    round (the grant, or an extend) it comes from."""

    deadline: float
    since: float


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
    """
    if now >= current.deadline:
        error = LockLost(key, f"{key!r}: the lease ran out before its extend was confirmed")
        return Settled(current, DEADLINE_REASON, error, False)
    if result.outcome is ExtendOutcome.CONFIRMED:
        if result.start >= current.since:
            return Settled(Validity(result.round_deadline, result.start), None, None, True)
        return Settled(current, None, None, True)
    kept = Validity(earlier_deadline(current.deadline, result.round_deadline), current.since)
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
) -> Flow[RenewStep]:
    """One renewal step of a lease; ``stop_at`` (monotonic s): renew no more from then on
    (``max_hold``), the lease then runs out at its deadline."""
    now: float = yield NOW
    if stop_at is not None and now >= stop_at:
        return RenewStep(deadline, None, None, "max_hold reached; renewal stopped")
    result = yield from extend(plan, token, plan.ttl_ms, deadline)
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
