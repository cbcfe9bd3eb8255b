"""Turning one round's replies into a decision. Shared by the sync and asyncio shells."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from .fencing import merge
from .quorum import Outcome, Tally, contention_or_unavailable
from .replies import AcquireReply
from .timing import validity_ms


class Status(str, Enum):
    GRANTED = "granted"
    CONTENTION = "contention"  # enough servers answered: someone else holds it
    UNAVAILABLE = "unavailable"  # too few servers answered to reach a majority
    TOO_SLOW = "too_slow"  # a majority granted but the round outlived the lease's validity


@dataclass(frozen=True)
class AcquireDecision:
    status: Status
    fence: int = 0  # merged fence of the granting servers (GRANTED only)
    validity_ms: float = 0.0  # time left on the lease, counted from the round's start
    holder_pttl_ms: int | None = None  # longest lease another holder reported, if any


def decide_acquire(
    tally: Tally,
    replies: Mapping[int, AcquireReply],
    *,
    ttl_ms: float,
    elapsed_ms: float,
    drift: float,
) -> AcquireDecision:
    """Decide round 1 of an acquire from the tally and the decoded replies by server index."""
    if tally.won:
        validity = validity_ms(ttl_ms, elapsed_ms, drift)
        if validity > 0:
            fence = merge([replies[i].fence for i in tally.granted_indexes()])
            return AcquireDecision(Status.GRANTED, fence, validity)
        return AcquireDecision(
            Status.TOO_SLOW, validity_ms=validity, holder_pttl_ms=_holder_pttl(replies)
        )
    status = Status(contention_or_unavailable(tally))
    return AcquireDecision(status, holder_pttl_ms=_holder_pttl(replies))


def _holder_pttl(replies: Mapping[int, AcquireReply]) -> int | None:
    """The longest lease another holder reported, if any."""
    held = [r.pttl_ms for r in replies.values() if not r.granted and r.pttl_ms >= 0]
    return max(held) if held else None


def decide_confirm(tally: Tally, *, ttl_ms: float, elapsed_ms: float, drift: float) -> float:
    """Validity (ms) after a confirming round (fence commit, extend); <= 0 means not confirmed."""
    if not tally.won:
        return 0.0
    return validity_ms(ttl_ms, elapsed_ms, drift)


def lost_for_sure(tally: Tally) -> bool:
    """True when so many servers said "not ours" that we cannot hold a majority anywhere."""
    return tally.count(Outcome.HELD) > tally.n - tally.needed
