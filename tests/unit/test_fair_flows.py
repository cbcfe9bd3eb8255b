"""The fair lock's pure parts: reply decoding (unknown shapes are errors, never grants), the
wait loop's queue bookkeeping driven without I/O (a waiter that gives up leaves the queue)."""

from __future__ import annotations

from typing import Any

import pytest

from fencelock import NotAcquired
from fencelock._core.effects import IDENTITIES, NOW, Broadcast, Identify, Pause, Repeat
from fencelock._core.fair import FairReply, acquire_fair, decode_fair, fair_plan
from fencelock._core.plan import make_plan
from fencelock._core.quorum import Outcome
from fencelock._core.replies import ProtocolError


def plan(n: int = 1) -> Any:
    base = make_plan(
        "k",
        tuple(f"s{i}" for i in range(n)),
        ttl_s=10.0,
        drift_factor=0.01,
        drift_min_s=0.002,
        server_timeout_s=0.1,
        retry_base_s=0.01,
        retry_cap_s=0.5,
        handoff_window_s=0.05,
        wake_lifetime_s=5.0,
    )
    return fair_plan(base)


def test_fair_replies_decode_and_unknown_shapes_are_errors() -> None:
    assert decode_fair([1, 5]) == FairReply(True, 5, 0)
    assert decode_fair([0, 900, b"17"]) == FairReply(False, 0, 900, ticket=17)
    for bad in ([1, 0], [0, 5], [2, 1, 1], [0, 1, -1], "OK", [1, 5, 7]):
        with pytest.raises(ProtocolError):
            decode_fair(bad)


def test_a_waiter_whose_wait_runs_out_leaves_the_queue_before_the_error() -> None:
    """Drive the flow by hand: one refused attempt (ticket 42), a pause on its own wake list,
    the deadline passes, and the last effect before NotAcquired is the leave."""
    p = plan()
    clock = [0.0]
    flow = acquire_fair(
        p, 1.0, new_token=lambda: "a" * 32, holder_info=str, rand=lambda: 0.5, heartbeat_s=3.0
    )
    sent: list[Any] = []
    answer: Any = None
    with pytest.raises(NotAcquired):
        while True:
            effect = flow.send(answer)
            sent.append(effect)
            answer = None
            if effect is NOW:
                answer = clock[0]
            elif isinstance(effect, Identify) or effect is IDENTITIES:
                answer = (None,)
            elif isinstance(effect, Broadcast) and effect.script == "fair_acquire":
                assert effect.args[3] == "a" * 16  # the waiter id
                for index in effect.targets:
                    effect.tally.record(index, *_held(42))
            elif isinstance(effect, Broadcast) and effect.script == "fair_leave":
                for index in effect.targets:
                    effect.tally.record(index, Outcome.GRANTED, 1)
            elif isinstance(effect, Pause):
                assert effect.wake == (0, p.keys.lock + ":fair:wake:" + "a" * 16)
                assert effect.delay_s <= 1.0  # a heartbeat refresh at least every third of it
                clock[0] += 2.0
    scripts = [e.script for e in sent if isinstance(e, Broadcast)]
    assert scripts[-1] == "fair_leave"
    assert sent[-1].args[0] == "a" * 16
    # the second attempt re-sent the ticket the server gave
    attempts = [e for e in sent if isinstance(e, Broadcast) and e.script == "fair_acquire"]
    assert [a.args[4] for a in attempts] == ["0", "42"]


def _held(ticket: int) -> tuple[Any, Any]:
    return Outcome.HELD, FairReply(False, 0, 5000, ticket=ticket)


class Interrupted(BaseException):
    """Stands for a cancellation thrown into the flow by a driver."""


def test_an_exception_thrown_in_while_waiting_leaves_the_queue_then_propagates() -> None:
    p = plan()
    flow = acquire_fair(
        p, 30.0, new_token=lambda: "b" * 32, holder_info=str, rand=lambda: 0.5, heartbeat_s=3.0
    )
    effect = flow.send(None)
    answer: Any = None
    while not isinstance(effect, Pause):
        answer = 0.0 if effect is NOW else (None,) if effect is IDENTITIES else None
        if isinstance(effect, Broadcast):
            for index in effect.targets:
                effect.tally.record(index, *_held(7))
        effect = flow.send(answer)
    effect = flow.throw(Interrupted())
    assert isinstance(effect, Broadcast) and effect.script == "fair_leave"
    assert effect.args[0] == "b" * 16 and effect.targets == (0,)
    effect.tally.record(0, Outcome.GRANTED, 1)
    with pytest.raises(Interrupted):
        flow.send(None)


def test_a_cancelled_wait_ends_with_its_pause_and_leaves_the_queue_before_the_error() -> None:
    p = plan()
    cancel = [False]
    flow = acquire_fair(
        p, 30.0, new_token=lambda: "c" * 32, holder_info=str, rand=lambda: 0.5,
        heartbeat_s=3.0, cancelled=lambda: cancel[0],
    )  # fmt: skip
    sent: list[Any] = []
    answer: Any = None
    with pytest.raises(NotAcquired):
        while True:
            effect = flow.send(answer)
            sent.append(effect)
            answer = 0.0 if effect is NOW else (None,) if effect is IDENTITIES else None
            if isinstance(effect, Broadcast):
                for index in effect.targets:
                    effect.tally.record(index, *_held(3))
            elif isinstance(effect, Pause):
                assert effect.stop is not None and not effect.stop()
                cancel[0] = True  # set while it waits: the driver ends the pause
    scripts = [e.script for e in sent if isinstance(e, Broadcast)]
    assert scripts == ["fair_acquire", "fair_leave"]  # no attempt after the pause
    assert sum(isinstance(e, Pause) for e in sent) == 1


def test_a_grant_is_handed_out_at_once_with_a_token_that_names_the_waiter() -> None:
    """Nothing stands between a grant and its lease (a cancellation there would orphan the
    lock); the waiter's entry goes with the release, which finds it from the token."""
    p = plan(3)
    flow = acquire_fair(
        p, 30.0, new_token=lambda: "c" * 32, holder_info=str, rand=lambda: 0.5, heartbeat_s=3.0
    )
    answer: Any = None
    effects: list[Any] = []
    try:
        while True:
            effect = flow.send(answer)
            effects.append(effect)
            answer = 0.0 if effect is NOW else (None, None, None)
            if isinstance(effect, Broadcast):
                answer = None
                for index in effect.targets:
                    if effect.script == "fair_acquire" and index < 2:
                        effect.tally.record(index, Outcome.GRANTED, FairReply(True, 9 + index, 0))
                    elif effect.script == "fair_acquire":
                        effect.tally.record(index, *_held(3))
                    else:  # the fence commit
                        effect.tally.record(index, Outcome.GRANTED, 1)
    except StopIteration as stop:
        grant = stop.value
    assert grant.fence == 10
    assert grant.token.startswith("c" * 16) and len(grant.token) == 32
    assert [e.script for e in effects if isinstance(e, Broadcast)] == [
        "fair_acquire",
        "fence_commit",
    ]
    assert not any(isinstance(e, Repeat) for e in effects)
