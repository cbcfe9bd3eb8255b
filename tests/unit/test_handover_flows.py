"""The hand-over flows of ``fencelock._core.handover``, driven by hand: no sockets, no sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from fencelock._core.effects import NOW, Broadcast, ClaimInterrupted, Flow, Pause
from fencelock._core.handover import (
    Handed,
    claim,
    claimed_deadline,
    offered_token,
    parse_handed,
)
from fencelock._core.plan import hands_over, make_plan, replica_wait
from fencelock._core.release import release_round


def plan_of(n: int = 1, ttl_s: float = 10.0, replicas: int = 0) -> Any:
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
        replicas=replicas,
    )


def test_only_a_one_server_plan_without_replica_acks_hands_over() -> None:
    assert plan_of(1).hands_over
    assert not plan_of(3).hands_over  # a waiter needs a majority of grants
    assert not plan_of(1, replicas=1).hands_over  # the grant would count before WAIT
    assert not plan_of(1, ttl_s=0.1).hands_over  # the claim window is too long for the lease
    assert hands_over(1, 200, 50, None) and not hands_over(1, 199, 50, None)
    assert not hands_over(1, 10_000, 50, replica_wait(1, 0.5))
    # plans rewired to other scripts (a semaphore's slot, a reader) never hand over
    plan = plan_of(1)
    assert not plan.rewired(plan.keys, plan.wiring).hands_over


def test_the_offered_token_is_marked_and_fresh() -> None:
    tokens = iter(["ab" * 20, "cd" * 20])
    assert offered_token(plan_of(1), lambda: next(tokens)) == "h" + "ab" * 20
    assert offered_token(plan_of(3), lambda: next(tokens)) == ""
    assert offered_token(plan_of(1), None) == ""


@pytest.mark.parametrize(
    ("element", "expected"),
    [
        (b"habc 17 10000 50", Handed("habc", 17, 10000, 50)),
        (b"1", None),  # a plain wake-up
        (None, None),
        (b"habc 17", None),
        (b"habc 17 10000", None),  # no window
        (b"habc 17 10000 0", None),
        (b"habc x 10000 50", None),
        (b"habc 0 10000 50", None),
        (b"habc 17 -5 50", None),
        (b"abc 17 10000 50", None),  # not a handed-over token
    ],
)
def test_wake_elements_are_read_strictly(element: object, expected: Handed | None) -> None:
    assert parse_handed(element) == expected


def test_a_claimed_lease_counts_from_before_the_wait_less_the_window() -> None:
    plan = plan_of(1, ttl_s=10.0)
    deadline = claimed_deadline(plan, Handed("h1", 5, 10_000, 50), paused_at=100.0)
    # 10 s lease - 50 ms window - drift (10 s * 0.01 + 2 ms)
    assert deadline == pytest.approx(100.0 + 10.0 - 0.05 - 0.102)
    # a grant of a shorter lease than our own ttl is taken as it was given
    short = claimed_deadline(plan, Handed("h1", 5, 4_000, 50), paused_at=100.0)
    assert short == pytest.approx(100.0 + 4.0 - 0.05 - 0.042)
    # the element waited for the releaser's window, longer than ours: that one counts
    aged = claimed_deadline(plan, Handed("h1", 5, 10_000, 1_000), paused_at=100.0)
    assert aged == pytest.approx(100.0 + 10.0 - 1.0 - 0.102)


def _start(flow: Flow[Any]) -> Pause:
    assert flow.send(None) is NOW
    effect = flow.send(100.0)
    assert isinstance(effect, Pause)
    return effect


def _give_back(plan: Any) -> Any:
    return lambda handed: release_round(plan, handed.token, waiter="w1", next_token="hNEXT")


def test_a_claim_blocks_by_moving_the_element_to_the_claimed_list() -> None:
    plan = plan_of(1)
    flow = claim(plan, 0.3, 0, _give_back(plan))
    pause = _start(flow)
    assert pause == Pause(0.3, (0, plan.keys.wake), plan.keys.claimed)
    assert flow.send(b"htok 42 10000 50") is NOW
    with pytest.raises(StopIteration) as stop:
        flow.send(100.01)
    got = stop.value.value
    assert got.handed == Handed("htok", 42, 10000, 50) and got.woken
    assert got.deadline == pytest.approx(claimed_deadline(plan, got.handed, 100.0))
    assert got.claimed_at == 100.01  # acquired when heard, not when the wait began
    assert not got.refreshed  # held with the wake-up's reply: no round of its own (bench)


def test_a_plain_wake_up_or_nothing_is_no_grant() -> None:
    plan = plan_of(1)
    for element, woken in ((b"1", True), (None, False)):
        flow = claim(plan, 0.3, 0, _give_back(plan))
        _start(flow)
        with pytest.raises(StopIteration) as stop:
            flow.send(element)
        assert stop.value.value.handed is None
        assert stop.value.value.woken is woken


def test_an_interrupted_claim_is_given_back_then_the_interruption_raised() -> None:
    plan = plan_of(1)
    flow = claim(plan, 0.3, 0, _give_back(plan))
    _start(flow)
    effect = flow.throw(ClaimInterrupted(b"htok 42 10000 50", KeyboardInterrupt()))
    assert isinstance(effect, Broadcast)
    assert effect.script == "release"
    assert effect.args[0] == "htok"  # the claimed grant's token
    assert effect.args[3] == "hNEXT" and effect.args[5] == "w1"  # handed on; we leave
    with pytest.raises(KeyboardInterrupt):
        flow.send(None)


def test_an_interrupted_wait_that_claimed_nothing_just_raises() -> None:
    plan = plan_of(1)
    flow = claim(plan, 0.3, 0, _give_back(plan))
    _start(flow)
    with pytest.raises(KeyboardInterrupt):
        flow.throw(ClaimInterrupted(b"1", KeyboardInterrupt()))


def test_a_claim_that_ran_out_is_given_back_and_not_used() -> None:
    plan = plan_of(1)
    flow = claim(plan, 0.3, 0, _give_back(plan))
    _start(flow)
    assert flow.send(b"htok 42 10000 50") is NOW
    effect = flow.send(200.0)  # long after the claimed lease ended
    assert isinstance(effect, Broadcast) and effect.args[0] == "htok"
    with pytest.raises(StopIteration) as stop:
        flow.send(None)
    assert stop.value.value.handed is None
    assert stop.value.value.stale == Handed("htok", 42, 10000, 50)


def test_a_claim_late_in_a_long_wait_is_refreshed_by_one_extend() -> None:
    plan = plan_of(1)
    flow = claim(plan, 5.0, 0, _give_back(plan))
    _start(flow)  # paused at 100.0
    assert flow.send(b"htok 42 10000 50") is NOW
    assert flow.send(104.0) is NOW  # the grant came 4 s into the wait: 5.8 s left of 9.9
    effect = flow.send(104.0)  # the extend round starts its clock, then sends
    assert isinstance(effect, Broadcast) and effect.script == "extend"
    assert effect.args == ("htok", plan.ttl_ms)


def _refresh_round(plan: Any) -> tuple[Any, Broadcast]:
    """A claim whose grant came 4 s into a 5 s wait, up to its refresh extend round (sent)."""
    flow = claim(plan, 5.0, 0, _give_back(plan))
    _start(flow)  # paused at 100.0
    assert flow.send(b"htok 42 10000 50") is NOW
    assert flow.send(104.0) is NOW  # late in a long wait: refreshed
    effect = flow.send(104.0)
    assert isinstance(effect, Broadcast) and effect.script == "extend"
    return flow, effect


def test_a_refreshed_claim_says_it_ran_one_round_after_the_wake() -> None:
    plan = plan_of(1)
    flow, effect = _refresh_round(plan)
    effect.tally.record(0, *effect.classify(1))  # ours: extended
    try:
        effect = flow.send(None)
        while True:
            assert not isinstance(effect, Broadcast)
            effect = flow.send(104.01)
    except StopIteration as stop:
        got = stop.value
    assert got.handed == Handed("htok", 42, 10000, 50)
    assert got.refreshed  # handoff.claim_rtts counts this extend round


def test_a_claim_whose_refresh_is_refused_is_no_grant() -> None:
    """The refresh extend answered "not ours": the lock key is no longer the handed token
    (released by an operator, taken over), so the claim must not become a lease."""
    plan = plan_of(1)
    flow, effect = _refresh_round(plan)
    effect.tally.record(0, *effect.classify(0))  # "not ours"
    assert flow.send(None) is NOW  # the extend's clock
    try:
        while True:
            effect = flow.send(104.01)
            assert not isinstance(effect, Broadcast)  # nothing to give back: not ours
    except StopIteration as stop:
        got = stop.value
    assert got.handed is None


def test_a_claim_whose_refresh_ran_out_unconfirmed_is_given_back() -> None:
    """The refresh extend was not answered in time (its PEXPIRE may have landed): the grant
    may still be ours on the server, so it is given back, not left to its ttl."""
    plan = plan_of(1)
    flow, effect = _refresh_round(plan)
    effect.tally.record(0, *effect.classify(TimeoutError("silent")))
    assert flow.send(None) is NOW
    assert flow.send(110.0) is NOW  # the extend came back after the claimed lease ran out
    effect = flow.send(110.0)
    assert isinstance(effect, Broadcast) and effect.script == "release"
    assert effect.args[0] == "htok"
