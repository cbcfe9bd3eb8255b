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


def _decided(tally: Tally) -> bool:
    return tally.decided


def extend(plan: LockPlan, token: str, ttl_ms: int, deadline: float) -> Flow[Extension]:
    """Extend a lease whose local deadline is ``deadline`` to ``ttl_ms`` from now."""
    start: float = yield NOW
    tally = Tally(plan.n)
    yield Broadcast(
        plan.wiring.extend,
        plan.everyone,
        plan.extend_keys,
        (token, ttl_ms),
        with_wait(plan, classify_extend),
        _decided,
        plan.budget_s,
        tally,
        wait=plan.wait,
    )
    now: float = yield NOW
    new_deadline = start + (ttl_ms - plan.drift_ms(ttl_ms)) / 1000.0
    text = summary(plan.key, tally)
    if tally.won and now < new_deadline:
        return Extension(ExtendOutcome.CONFIRMED, new_deadline, None, None)
    if lost_for_sure(tally):
        reason = f"extend refused: {text}"
        error = LockLost(plan.key, f"{text}: the lease is no longer ours")
        return Extension(ExtendOutcome.REFUSED, min(deadline, new_deadline), error, reason)
    kept = min(deadline, new_deadline)
    if now >= kept:
        reason = f"renewal not confirmed before the lease ran out: {text}"
        error = LockLost(plan.key, f"{text}: the lease ran out before a majority confirmed")
        return Extension(ExtendOutcome.UNKNOWN, kept, error, reason)
    reason = outage(tally, "extend not confirmed")
    unavailable = Unavailable(plan.key, f"{text}: {reason}", votes(tally, plan.names))
    return Extension(ExtendOutcome.UNKNOWN, kept, unavailable, None)


@dataclass(frozen=True, slots=True)
class RenewStep:
    """After one renewal: the new deadline, and either when to renew next or why it stopped.

    ``at_risk``: the renewal missed its deadline: its round did not confirm on a majority
    (servers silent, paused or partitioned), so the lease may soon be lost. Renewals are
    retried at a third of the time left, so the warning comes well before the loss (about two
    thirds of the lease early with the default period). False after a renewal that confirmed,
    which clears an earlier warning.
    """

    deadline: float
    next_at: float | None  # monotonic s of the next renewal; None: renewal stops
    lost_reason: str | None  # the lease is lost now (None: still ours, or left to expire)
    stop_reason: str | None = None  # renewal stopped on purpose (max_hold); lost at deadline
    failed: bool = False  # this step's extend was not confirmed (refused or unknown)
    at_risk: bool = False


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
        return RenewStep(result.deadline, None, result.lost_reason, failed=True, at_risk=True)
    confirmed = result.outcome is ExtendOutcome.CONFIRMED
    if confirmed:
        next_at = now + every_s
    else:
        next_at = now + max(RETRY_FLOOR_S, min(every_s, (result.deadline - now) / 3.0))
    if stop_at is not None:
        next_at = min(next_at, stop_at)
    return RenewStep(result.deadline, next_at, None, failed=not confirmed, at_risk=not confirmed)
