"""The slot a split permit vote proposes next (pure logic of ``_core.semaphore.proposal``)."""

from __future__ import annotations

from fencelock._core.quorum import Outcome, Tally
from fencelock._core.replies import AcquireReply
from fencelock._core.semaphore import proposal, search_order


def heard(n: int, votes: dict[int, int | None]) -> Tally:
    """A round over ``n`` servers: server -> slot granted, None for "held"; others silent."""
    tally = Tally(n)
    for index, slot in votes.items():
        if slot is None:
            tally.record(index, Outcome.HELD, AcquireReply(False, 0, -1))
        else:
            tally.record(index, Outcome.GRANTED, AcquireReply(True, 1, 0, slot=slot))
    return tally


def test_search_order_tries_the_proposal_first() -> None:
    assert search_order(-1, 3) == [0, 1, 2]
    assert search_order(2, 4) == [2, 0, 1, 3]


def test_a_server_that_skipped_a_slot_had_it_taken() -> None:
    # server 1 granted slot 1 so slot 0 is taken there; slot 1 may be free on servers 0 and 2
    assert proposal(heard(3, {0: 0, 1: 1}), -1, 2) == 1


def test_a_three_way_split_proposes_the_slot_free_everywhere() -> None:
    assert proposal(heard(3, {0: 0, 1: 2, 2: 1}), -1, 3) == 2


def test_held_everywhere_proposes_nothing() -> None:
    assert proposal(heard(3, {0: None, 1: None, 2: None}), -1, 2) is None


def test_a_proposal_that_was_skipped_is_known_taken() -> None:
    # proposed 1: server 0 skipped it (granted 0); server 1 took it without looking at 0
    assert proposal(heard(3, {0: 0, 1: 1}), 1, 2) == 0
    # proposed 0: server 1 skipped it, server 0 granted it, server 2 silent
    assert proposal(heard(3, {0: 0, 1: 1}), 0, 3) == 1
