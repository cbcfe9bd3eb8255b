"""Issue 21 item 12 and "an extend overwritten by a renewal in flight": how an extend's or a
renewal's reply is applied to a lease's validity as it is when the reply arrives. Pure flows
and the lease's local state, no sockets, no sleeps."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fencelock import Lock, LockLost, Unavailable
from fencelock._core.acquire import Grant
from fencelock._core.effects import NOW, Broadcast, Flow
from fencelock._core.extend import (
    ExtendOutcome,
    Extension,
    RenewStep,
    Validity,
    extend,
    renew,
    settle,
    settle_renewal,
)
from fencelock._core.plan import LockPlan, make_plan

OK = 1


def plan_of(n: int, ttl_s: float = 10.0) -> LockPlan:
    return make_plan(
        "k",
        tuple(f"s{i}" for i in range(n)),
        ttl_s=ttl_s,
        drift_factor=0.01,
        drift_min_s=0.002,
        server_timeout_s=0.5,
        retry_base_s=0.01,
        retry_cap_s=0.5,
        handoff_window_s=0.05,
        wake_lifetime_s=5.0,
    )


def run(flow: Flow[object], clock: list[float], replies: list[object]) -> object:
    """Drive ``flow``: NOW answers ``clock.pop(0)``; a broadcast records ``replies``."""
    answer: object = None
    while True:
        try:
            effect = flow.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = None
        if effect is NOW:
            answer = clock.pop(0)
        elif isinstance(effect, Broadcast):
            for index, reply in zip(effect.targets, replies, strict=False):
                effect.tally.record(index, *effect.classify(reply))
        else:
            raise AssertionError(effect)


def confirmed(start: float, ttl_s: float = 10.0) -> Extension:
    plan = plan_of(3, ttl_s)
    flow = extend(plan, "tok", int(ttl_s * 1000), start + 5.0)
    result = run(flow, [start, start + 0.01], [OK] * 3)
    assert isinstance(result, Extension) and result.outcome is ExtendOutcome.CONFIRMED
    return result


def unknown(start: float, ttl_s: float = 10.0) -> Extension:
    plan = plan_of(3, ttl_s)
    replies: list[object] = [OK, TimeoutError(), TimeoutError()]
    result = run(extend(plan, "tok", int(ttl_s * 1000), start + 5.0), [start, start + 0.5], replies)
    assert isinstance(result, Extension) and result.outcome is ExtendOutcome.UNKNOWN
    return result


def test_a_confirmed_reply_that_arrives_after_the_deadline_loses_the_lease() -> None:
    current = Validity(deadline=110.0, since=100.0)
    late = confirmed(start=109.5)
    settled = settle("k", current, late, now=110.2)
    assert settled.lost_reason is not None and not settled.confirmed
    assert isinstance(settled.error, LockLost)
    assert settled.validity == current  # not revived to 109.5 + ttl
    in_time = settle("k", current, late, now=109.9)
    assert in_time.confirmed and in_time.lost_reason is None and in_time.error is None
    assert in_time.validity == Validity(late.round_deadline, 109.5)


def test_an_older_confirmed_round_never_overwrites_a_newer_one() -> None:
    # a renewal (ttl 10) started at 101 and still in flight; the user's extend(2 s) started at
    # 102 and confirmed first: its deadline holds when the renewal's reply comes after it
    renewal = confirmed(start=101.0, ttl_s=10.0)
    users = confirmed(start=102.0, ttl_s=2.0)
    after_user = settle("k", Validity(110.0, 100.0), users, now=102.02).validity
    assert after_user.deadline == pytest.approx(users.round_deadline)
    after_renewal = settle("k", after_user, renewal, now=102.1)
    assert after_renewal.confirmed and after_renewal.error is None
    assert after_renewal.validity == after_user
    # in the other order the newer round (the user's) is applied last anyway
    first = settle("k", Validity(110.0, 100.0), renewal, now=101.01).validity
    assert settle("k", first, users, now=102.02).validity == after_user


def test_an_unknown_outcome_keeps_the_earlier_deadline_whatever_the_order() -> None:
    newer = confirmed(start=103.0, ttl_s=10.0)
    current = settle("k", Validity(110.0, 100.0), newer, now=103.01).validity
    older_short = unknown(start=102.0, ttl_s=2.0)  # its PEXPIRE 2 s may have landed last
    settled = settle("k", current, older_short, now=102.6)
    assert settled.validity.deadline == pytest.approx(older_short.round_deadline)
    assert settled.validity.since == current.since
    assert isinstance(settled.error, Unavailable) and settled.lost_reason is None
    longer = unknown(start=104.0, ttl_s=30.0)
    kept = settle("k", current, longer, now=104.5)
    assert (kept.validity.deadline, kept.validity.since) == (current.deadline, current.since)
    # the two servers that did not answer may still run its PEXPIRE (see the test below)
    assert kept.validity.pending == (float("inf"), longer.span, longer.span)


def test_an_extend_that_may_still_land_bounds_a_later_confirmed_round() -> None:
    """Seeds 900003152 and 900009192 (``--cancel --fork --store --reentrant-hold``): an extend
    to 1.173 s timed out on the servers (unknown), a later extend to 2.714 s was confirmed on
    another connection, and the first one's PEXPIRE landed after it: the key ran out 1.5 s
    before the deadline the confirmed round gave. On each server that did not answer the
    short one, a later round counts no more than the short span from its own start; the lease
    lasts while a majority of the servers that confirmed it hold the key."""
    short = unknown(start=102.0, ttl_s=1.0)  # answered by server 0 only
    assert short.unheard == (1, 2)
    current = settle("k", Validity(110.0, 100.0), short, now=102.5).validity
    assert current.deadline == pytest.approx(short.round_deadline)
    later = confirmed(start=102.6, ttl_s=10.0)  # all three confirm it
    after = settle("k", current, later, now=102.61).validity
    # servers 1 and 2 may still cut the key to 102.6 + 1 s: one server (0) is no majority
    assert after.deadline == pytest.approx(102.6 + short.span)
    assert after.since == 102.6
    assert after.pending == current.pending
    # a later round confirmed by servers that answered everything keeps its whole span
    clean = settle("k", Validity(110.0, 100.0), later, now=102.61).validity
    assert clean.deadline == pytest.approx(later.round_deadline)
    # renewals of the lease's own ttl are not shortened by a pending span of the same ttl
    renewal = unknown(start=103.0, ttl_s=10.0)
    pending = settle("k", Validity(110.0, 100.0), renewal, now=103.5).validity
    next_one = confirmed(start=104.0, ttl_s=10.0)
    assert settle("k", pending, next_one, now=104.01).validity.deadline == pytest.approx(
        next_one.round_deadline
    )


def test_a_confirmed_round_counts_the_majority_of_its_own_servers_under_the_bounds() -> None:
    """Five servers: servers 3 and 4 may still run a 1 s PEXPIRE; a 10 s round confirmed by
    0, 1, 3 and 4 lasts while three of them hold it: 0 and 1 hold 10 s, 3 and 4 only 1 s."""
    plan = plan_of(5, 1.0)
    replies: list[object] = [OK, OK, OK, TimeoutError(), TimeoutError()]
    short = run(extend(plan, "tok", 1000, 105.0), [102.0, 102.5], replies)
    assert isinstance(short, Extension) and short.outcome is ExtendOutcome.CONFIRMED
    assert short.unheard == (3, 4)  # silent within the round, though it was confirmed
    current = settle("k", Validity(110.0, 100.0), short, now=102.5).validity
    plan10 = plan_of(5, 10.0)
    mixed: list[object] = [OK, OK, TimeoutError(), OK, OK]
    later = run(extend(plan10, "tok", 10_000, 105.0), [102.6, 102.61], mixed)
    assert isinstance(later, Extension) and later.confirmed_by == (0, 1, 3, 4)
    after = settle("k", current, later, now=102.62).validity
    assert after.deadline == pytest.approx(102.6 + short.span)
    # confirmed by 0, 1 and 2 (none of them pending): its whole span
    others: list[object] = [OK, OK, OK, TimeoutError(), TimeoutError()]
    full = run(extend(plan10, "tok", 10_000, 105.0), [102.6, 102.61], others)
    assert isinstance(full, Extension)
    assert settle("k", current, full, now=102.62).validity.deadline == pytest.approx(
        full.round_deadline
    )


def test_an_unknown_outcome_is_judged_against_the_deadline_as_it_is_now() -> None:
    # the extend started when the deadline was 104.2; a renewal moved it to 113 meanwhile:
    # its unknown outcome at 104.5 leaves the lease valid (Unavailable), not lost
    plan = plan_of(3, 10.0)
    result = run(
        extend(plan, "tok", 10_000, 104.2), [104.0, 104.5], [OK, TimeoutError(), TimeoutError()]
    )
    assert isinstance(result, Extension) and result.lost_reason is not None  # by its own view
    settled = settle("k", Validity(113.0, 103.0), result, now=104.5)
    assert settled.lost_reason is None and isinstance(settled.error, Unavailable)


def test_a_renewal_reply_after_the_deadline_stops_the_renewal_and_loses_the_lease() -> None:
    plan = plan_of(3, 10.0)
    flow = renew(plan, "tok", 110.0, every_s=3.0, stop_at=None)
    step = run(flow, [109.5, 109.5, 110.3, 110.3], [OK] * 3)
    assert isinstance(step, RenewStep)
    renewed = settle_renewal("k", Validity(110.0, 100.0), step, 110.3, every_s=3.0, stop_at=None)
    assert renewed.lost_reason is not None and renewed.next_at is None
    assert not renewed.confirmed and renewed.validity.deadline == 110.0


def _lease(ttl_s: float = 10.0) -> Any:
    """A blocking lease on a lock that never talks to a server here (no I/O is done)."""
    lock = Lock("redis://127.0.0.1:9/0", "k", ttl=ttl_s)
    now = time.monotonic()
    return lock._lease(Grant("tok", 1, now - 1.0, now + ttl_s - 1.0))


def test_a_late_renewal_reply_never_revives_a_lost_lease_nor_clears_its_at_risk() -> None:
    """The race of the loaded run: the deadline timer fires, then a renewal's confirmed reply
    is applied. Ordered by hand here: lost stays, at_risk stays, the deadline stays."""
    lease = _lease()
    lease._every_s = 3.0
    lease._mark_at_risk()
    start = time.monotonic()
    plan = lease._definition.plan
    step = run(
        renew(plan, "tok", lease.deadline, every_s=3.0, stop_at=None),
        [start, start, start + 0.01, start + 0.01],
        [OK],
    )
    lease._deadline = time.monotonic() - 0.001
    lease._deadline_passed()  # the timer
    deadline = lease.deadline
    assert lease.lost.is_set() and lease.at_risk.is_set()
    assert lease._renewed(step) is None  # the late reply
    assert lease.lost.is_set() and lease.at_risk.is_set()
    assert lease.deadline == deadline


def test_a_users_extend_whose_reply_comes_after_the_loss_raises_lock_lost() -> None:
    lease = _lease()
    start = time.monotonic()
    plan = lease._definition.plan
    result = run(extend(plan, "tok", 10_000, lease.deadline), [start, start + 0.01], [OK])
    lease._deadline = time.monotonic() - 0.001
    lease._deadline_passed()
    deadline = lease.deadline
    with pytest.raises(LockLost):
        lease._extended(result)
    assert lease.deadline == deadline and lease.lost.is_set()


def test_a_renewal_in_flight_does_not_overwrite_a_users_later_extend_on_the_lease() -> None:
    """A renewal (ttl 10 s) started, then the user's extend(2 s) started and confirmed; the
    renewal's reply is applied last: the lease keeps the extend's deadline (on a connection the
    servers apply the renewal's PEXPIRE first, so they keep the 2 s one)."""
    lease = _lease()
    lease._every_s = 3.0
    plan = lease._definition.plan
    t = time.monotonic()
    renewal = run(renew(plan, "tok", lease.deadline, every_s=3.0, stop_at=None),
                  [t, t, t + 0.02, t + 0.02], [OK])  # fmt: skip
    users = run(extend(plan, "tok", 2000, lease.deadline), [t + 0.01, t + 0.015], [OK])
    lease._extended(users)
    after_extend = lease.deadline
    assert after_extend == pytest.approx(t + 0.01 + 2.0 - plan.drift_ms(2000) / 1000)
    assert lease._renewed(renewal) is not None
    assert lease.deadline == after_extend
    assert not lease.lost.is_set()


def test_a_renewal_applied_first_still_bounds_a_users_extend_it_overlapped() -> None:
    """Seed 9501150 of the sync front: the user's extend(20 s) is sent, then a renewal (ttl
    10 s) on another connection; the servers apply the renewal's PEXPIRE last, its reply is
    lost (unknown outcome) and applied first, then the extend's confirmed reply. The key
    lives 10 s from the renewal, so the lease is valid no longer than that."""
    lease = _lease()
    lease._every_s = 3.0
    plan = lease._definition.plan
    users_flow = lease._extend_flow(20.0)
    renewal_flow = lease._renew_flow()
    t = time.monotonic()
    users = run(users_flow, [t, t + 0.03], [OK])
    renewal = run(renewal_flow, [t + 0.01, t + 0.01, t + 0.02, t + 0.02], [TimeoutError()])
    assert isinstance(renewal, RenewStep) and renewal.extension is not None
    assert renewal.extension.outcome is ExtendOutcome.UNKNOWN
    assert lease._renewed(renewal) is not None
    lease._extended(users)
    assert lease.deadline <= t + 0.01 + 10.0 - plan.drift_ms(10_000) / 1000
    assert not lease.lost.is_set()


@pytest.mark.parametrize("renewal_answered", [True, False])
def test_a_round_applied_before_another_was_sent_does_not_bound_it(
    renewal_answered: bool,
) -> None:
    """The bound of a round applied while another was in flight lasts only until that other
    round is applied: an extend sent afterwards moves the deadline as far as it gives, unless
    the renewal's server did not answer it (its PEXPIRE of 10 s may still land after the
    extend's: seeds 900003152 and 900009192), which bounds the extend to 10 s from its start."""
    lease = _lease()
    lease._every_s = 3.0
    plan = lease._definition.plan
    first_flow = lease._extend_flow(20.0)
    renewal_flow = lease._renew_flow()
    t = time.monotonic()
    reply: object = OK if renewal_answered else TimeoutError()
    renewal = run(renewal_flow, [t + 0.01, t + 0.01, t + 0.02, t + 0.02], [reply])
    assert lease._renewed(renewal) is not None
    lease._extended(run(first_flow, [t, t + 0.03], [OK]))
    later = lease._extend_flow(30.0)
    u = t + 0.05  # after the renewal's start (t + 0.01): the newer round
    lease._extended(run(later, [u, u + 0.01], [OK]))
    span = 30.0 - plan.drift_ms(30_000) / 1000 if renewal_answered else plan.ttl_ms / 1000.0
    if not renewal_answered:
        span -= plan.drift_ms(plan.ttl_ms) / 1000
    assert lease.deadline == pytest.approx(u + span)
