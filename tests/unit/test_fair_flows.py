"""The fair lock's pure parts: reply decoding (unknown shapes are errors, never grants), the
wait loop's queue bookkeeping driven without I/O (a waiter that gives up leaves the queue)."""

from __future__ import annotations

from typing import Any

import pytest

from fencelock import NotAcquired
from fencelock._core.effects import IDENTITIES, NOW, Broadcast, Identify, Pause
from fencelock._core.fair import FairReply, acquire_fair, decode_fair, fair_plan
from fencelock._core.plan import make_plan
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
    from fencelock._core.quorum import Outcome

    return Outcome.HELD, FairReply(False, 0, 5000, ticket=ticket)
