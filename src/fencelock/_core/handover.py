"""Hand-over, written once: a release that finds a waiter grants the lock to it in the same
script, so the next holder needs no acquire round trip of its own (one server, see
:func:`~.plan.hands_over`).

Rules:
- the releaser picks the next holder's token (``h`` + a fresh random token, so that the
  acquire script can tell a handed-over grant from an ordinary one) and the script bumps the
  fence exactly as an acquire does; the grant waits in the wake list as one element
  ``token fence lease_ms window_ms`` for the releaser's ``plan.handoff_ms`` (the claim
  window, ``window_ms``);
- the first waiter blocked on the wake list claims it by moving the element to the claimed
  list (``BLMOVE``): the server serves blocked clients in the order they blocked, so waiters
  are granted in arrival order; a waiter that died or gave up never blocks again, so it is
  skipped; a grant nobody claimed within the window is void (the acquire script takes its
  place), so a dead waiter costs the others at most the window;
- the claimer counts its lease from before it blocked, less the claim window (the element
  may have waited that long before it blocked): ``paused_at + lease - window - drift``, with
  the window the element names (the releaser's: a claimer's own may be shorter); a
  lease shorter than its own ttl is used as it was given; when that leaves less than
  :data:`REFRESH_BELOW` of a fresh lease (the grant came late in a long wait), one extend
  round restarts it (refused: the grant is no longer ours, and no grant is returned);
- a claim interrupted after the server moved the element (KeyboardInterrupt, cancellation) is
  given back at once: released, and handed over to the next waiter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .effects import NOW, ClaimInterrupted, Flow, Pause
from .extend import ExtendOutcome, extend
from .fencing import FENCE_MAX
from .plan import LockPlan

#: The first character of a token a release chose for the next holder (never in a hex token).
HANDED_PREFIX = "h"


@dataclass(frozen=True, slots=True)
class Handed:
    """A grant a release handed over: its token, fence, lease and claim window (ms)."""

    token: str
    fence: int
    lease_ms: int
    window_ms: int


def offered_token(plan: LockPlan, new_token: Callable[[], str] | None) -> str:
    """The token a release offers to the next holder ('' when it only wakes a waiter)."""
    if not plan.hands_over or new_token is None:
        return ""
    return HANDED_PREFIX + new_token()


def parse_handed(element: object) -> Handed | None:
    """The grant in a wake element, or None for a plain wake-up (``b"1"``) or nothing."""
    if not isinstance(element, bytes) or not element.startswith(b"h"):
        return None
    parts = element.split(b" ")
    if len(parts) != 4:
        return None
    try:
        fence, lease_ms, window_ms = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None
    if not 0 < fence <= FENCE_MAX or lease_ms <= 0 or window_ms <= 0:
        return None
    return Handed(parts[0].decode("ascii", "replace"), fence, lease_ms, window_ms)


def claimed_deadline(plan: LockPlan, handed: Handed, paused_at: float) -> float:
    """Monotonic s until which a claimed grant is valid (see the module's rules)."""
    lease_ms = min(plan.ttl_ms, handed.lease_ms)
    window_ms = max(plan.handoff_ms, handed.window_ms)  # the element lived the releaser's
    return paused_at + (lease_ms - window_ms - plan.drift_ms(lease_ms)) / 1000.0


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claiming pause gave: a grant still valid (``handed`` and its ``deadline``), a
    plain wake-up (``woken``), or neither (the pause ran out)."""

    handed: Handed | None
    deadline: float
    paused_at: float
    woken: bool
    stale: Handed | None = None  # claimed, but no longer valid: to be released
    claimed_at: float = 0.0  # monotonic s when the grant was heard (its ``acquired_at``)
    refreshed: bool = False  # one extend round ran after the grant was heard


def claim(
    plan: LockPlan,
    delay_s: float,
    server: int,
    give_back: Callable[[Handed], Flow[object]],
    stop: Callable[[], bool] | None = None,
) -> Flow[Claim]:
    """Block on ``server``'s wake list up to ``delay_s``, claiming a handed-over grant.

    ``give_back`` releases a grant this flow claimed but cannot use: one the wait was
    interrupted after (then the interruption is raised again), or one whose validity already
    ran out (returned as ``stale`` too, for the caller to count). ``stop``: ends the wait
    early (see :class:`~.effects.Pause`); a grant claimed as it did is returned as usual.
    """
    paused_at: float = yield NOW
    try:
        element = yield Pause(delay_s, (server, plan.keys.wake), plan.keys.claimed, stop)
    except ClaimInterrupted as interrupted:
        handed = parse_handed(interrupted.element)
        if handed is not None:
            yield from give_back(handed)
        raise interrupted.cause from None
    handed = parse_handed(element)
    if handed is None:
        return Claim(None, 0.0, paused_at, woken=element is not None)
    deadline = claimed_deadline(plan, handed, paused_at)
    now: float = yield NOW
    claimed_at = now
    was_refreshed = False
    if deadline > now and deadline - now < REFRESH_BELOW * full_validity_s(plan):
        # the grant came late in a long wait (or the lease is short against the claim
        # window): a fresh lease costs one extend round, as a woken waiter's acquire would
        try:
            refreshed = yield from extend(plan, handed.token, plan.ttl_ms, deadline)
        except GeneratorExit:
            raise
        except BaseException:
            yield from give_back(handed)
            raise
        if refreshed.outcome is ExtendOutcome.REFUSED:
            # "not ours": the handed token no longer holds the lock (released, taken over):
            # there is nothing to use, nor to give back
            return Claim(None, 0.0, paused_at, woken=True)
        deadline = refreshed.deadline
        was_refreshed = True
        now = yield NOW
    if deadline <= now:
        yield from give_back(handed)
        return Claim(None, 0.0, paused_at, woken=True, stale=handed)
    return Claim(
        handed,
        deadline,
        paused_at,
        woken=True,
        claimed_at=claimed_at,
        refreshed=was_refreshed,
    )


#: A claimed lease with less than this share of a fresh lease's validity left is extended.
REFRESH_BELOW = 0.75


def full_validity_s(plan: LockPlan) -> float:
    """The validity (s) a lease has when its grant round takes no time."""
    return (plan.ttl_ms - plan.drift_ms(plan.ttl_ms)) / 1000.0
