"""The election flows without I/O: who leads after a read, and when an observer reports."""

from __future__ import annotations

import json

import pytest
from test_flows import Script, plan_of

from fencelock import Unavailable
from fencelock._core.effects import Pause
from fencelock._core.election import Leader, leader_info, next_change, read_leader

INFO = leader_info('{"host":"h","pid":1}', "host-1", 42).encode()
FREE = [b"", -2, b""]


def held(token: bytes, pttl_ms: int, info: bytes = INFO) -> list[object]:
    return [token, pttl_ms, info]


def test_leader_info_keeps_the_holder_info_and_adds_the_name_and_term() -> None:
    assert json.loads(INFO) == {"host": "h", "pid": 1, "leader": "host-1", "term": 42}


def test_a_token_on_a_majority_that_announced_itself_leads_for_the_majoritys_time() -> None:
    plan = plan_of(3)
    replies = [held(b"t", 9000), held(b"t", 5000), held(b"t", 7000)]
    view = Script({"elect_read": [[r] for r in replies]}).run(read_leader(plan))
    assert isinstance(view.leader, Leader)
    assert view.leader.term == ("host-1", 42)
    # the second-longest PTTL (majority 2 of 3), less the round and the drift allowance
    assert view.leader.remaining == pytest.approx((7000 - 1 - plan.drift_ms(10000)) / 1000)


@pytest.mark.parametrize(
    "replies",
    [
        [held(b"t", 9000), FREE, FREE],  # a minority only
        [held(b"t", 9000), held(b"u", 9000), FREE],  # split between two tokens
        [held(b"t", 9000, b""), held(b"t", 9000, b""), FREE],  # not announced (yet)
        [held(b"t", 9000, b"{not json"), held(b"t", 9000, b"[]"), FREE],
    ],
)
def test_nobody_leads_without_an_announced_majority(replies: list[list[object]]) -> None:
    view = Script({"elect_read": [[r] for r in replies]}).run(read_leader(plan_of(3)))
    assert view.leader is None


def test_a_read_answered_by_a_minority_is_unavailable() -> None:
    replies: list[object] = [held(b"t", 9000), TimeoutError(), TimeoutError()]
    with pytest.raises(Unavailable, match="1/3 servers answered"):
        Script({"elect_read": [[r] for r in replies]}).run(read_leader(plan_of(3)))


def test_an_observer_reports_the_first_read_then_waits_until_the_term_would_run_out() -> None:
    plan = plan_of(1)
    first = Script({"elect_read": [[held(b"t", 3000)]]})
    change = first.run(next_change(plan, "obs", False, 1000.0, poll_s=10.0))
    assert change.leader is not None and not change.timed_out
    # same term again: no report; it blocks on its wake list, at most until the term ends
    same = Script({"elect_read": [[held(b"t", 3000)]]})
    change = same.run(next_change(plan, "obs", ("host-1", 42), 105.0, poll_s=10.0))
    assert change.timed_out
    pauses = [e for e in same.log if isinstance(e, Pause)]
    assert pauses and pauses[0].wake == (0, plan.keys.observers + ":obs")
    assert pauses[0].delay_s < 3.0
    # the term ended: the next read reports None
    ended = Script({"elect_read": [[held(b"t", 3000), FREE]]})
    change = ended.run(next_change(plan, "obs", ("host-1", 42), 1000.0, poll_s=10.0))
    assert change.leader is None and not change.timed_out


@pytest.mark.parametrize(
    ("replies", "wake_on"),
    [
        # nobody holds a majority: the first server that answered
        ([FREE, FREE, FREE], 0),
        ([held(b"u", 9000, b""), FREE, FREE], 0),
        # a term on a majority, not named yet on 1 and 2 (server 0 held by another token):
        # its announcement is on its way to 1 and 2, and wakes the observer there
        ([held(b"u", 9000), held(b"t", 9000, b""), held(b"t", 9000, b"")], 1),
        # named on 0 and 1 already (a leader): the first that answered
        ([held(b"t", 9000), held(b"t", 9000), held(b"t", 9000, b"")], 0),
        # named on 1 only: a leader all the same (one of its rows names it)
        ([held(b"t", 9000, b""), held(b"t", 9000), FREE], 0),
        # named nowhere (an info that is no JSON names nobody): the first of those servers
        ([FREE, held(b"t", 9000, b"{not json"), held(b"t", 9000, b"")], 1),
    ],
)
def test_an_observer_that_saw_nobody_blocks_where_a_majoritys_term_is_not_named_yet(
    replies: list[list[object]], wake_on: int
) -> None:
    view = Script({"elect_read": [[r] for r in replies]}).run(read_leader(plan_of(3), "obs"))
    assert view.answered == wake_on
