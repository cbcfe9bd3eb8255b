"""The semaphore's fence commit over N servers, driven by hand (pure: no sockets).

Two permits of one semaphore may be granted at once on different majorities; when fence
registers are ahead of the servers' clocks (a clock jump, a restore) both can merge the SAME
fence. The commit must then count for at most one of them: a register already at the fence,
not bumped there by our own grant, means someone else committed it first.
"""

from __future__ import annotations

from typing import Any

from fencelock._core.acquire import Attempt
from fencelock._core.effects import IDENTITIES, NOW, SETTLE, Broadcast, Identify, Repeat, Settle
from fencelock._core.plan import make_plan
from fencelock._core.quorum import Outcome, Tally
from fencelock._core.replies import AcquireReply
from fencelock._core.rounds import AcquireDecision, Status
from fencelock._core.semaphore import (
    CommitReply,
    attempt_permit,
    classify_permit_commit,
    commit_ok,
    commit_permit_fence,
    make_semaphore_plan,
)


def semaphore(n: int = 3) -> Any:
    base = make_plan(
        "sem",
        tuple(f"s{i}" for i in range(n)),
        ttl_s=10.0,
        drift_factor=0.01,
        drift_min_s=0.002,
        server_timeout_s=0.5,
        retry_base_s=0.01,
        retry_cap_s=0.5,
        handoff_window_s=0.05,
        wake_lifetime_s=5.0,
    )
    return make_semaphore_plan(base, 2)


def grant_view(own: dict[int, int], n: int = 3) -> Tally:
    view = Tally(n)
    for index in range(n):
        if index in own:
            view.record(index, Outcome.GRANTED, AcquireReply(True, own[index], 0, 0))
        else:
            view.record(index, Outcome.HELD, AcquireReply(False, 0, -1))
    return view


def drive(flow: Any, registers: dict[int, int]) -> tuple[AcquireDecision, list[str]]:
    """Run the commit against in-memory fence registers (what sem_fence_commit.lua does)."""
    sent: list[str] = []
    answer: object = None
    clock = 100.0
    try:
        while True:
            effect = flow.send(answer)
            answer = None
            if effect is NOW:
                clock += 0.001
                answer = clock
            elif isinstance(effect, Broadcast):
                assert effect.script == "sem_fence_commit"
                token, fence = effect.args[0], int(str(effect.args[1]))
                sent.append(str(fence))
                for index in effect.targets:
                    previous = registers[index]
                    registers[index] = max(previous, fence)
                    effect.tally.record(index, *effect.classify([1, str(previous).encode()]))
                    assert token == "tok"
            else:
                raise AssertionError(f"unexpected effect {effect!r}")
    except StopIteration as stop:
        return stop.value, sent


def test_a_fence_another_permit_committed_first_is_not_taken_again() -> None:
    sem = semaphore()
    # our grant bumped server 0 to 100 and server 1 to 51; merged: 100. Meanwhile another
    # permit, granted on servers 1 and 2, merged 100 too and committed it on server 1 first.
    view = grant_view({0: 100, 1: 51})
    registers = {0: 100, 1: 100, 2: 100}
    decision = AcquireDecision(Status.GRANTED, fence=100, validity_ms=9000.0)
    flow = commit_permit_fence(sem.slots[0], "tok", decision, view, 100.0)
    result, sent = drive(flow, registers)
    assert result.status is Status.GRANTED
    assert result.fence == 101  # above every register seen, not the other permit's 100
    assert sent == ["100", "101"]
    assert registers[0] == registers[1] == 101


def test_without_a_rival_the_merged_fence_is_committed_in_one_round() -> None:
    sem = semaphore()
    view = grant_view({0: 100, 1: 51})
    registers = {0: 100, 1: 51, 2: 7}
    decision = AcquireDecision(Status.GRANTED, fence=100, validity_ms=9000.0)
    result, sent = drive(commit_permit_fence(sem.slots[0], "tok", decision, view, 100.0), registers)
    assert (result.status, result.fence, sent) == (Status.GRANTED, 100, ["100"])


def test_commit_ok_counts_our_own_bump_but_not_an_equal_register_set_by_another() -> None:
    tally = Tally(3)
    tally.record(0, Outcome.GRANTED, CommitReply(100))  # our own grant set it to 100
    tally.record(1, Outcome.GRANTED, CommitReply(100))  # someone else's commit
    tally.record(2, Outcome.GRANTED, CommitReply(99))  # below: ours to raise
    assert commit_ok(tally, 100, {0: 100, 1: 51, 2: 60}) == [0, 2]
    assert commit_ok(tally, 100, {}) == [2]


def test_the_commit_reply_is_decoded_strictly() -> None:
    assert classify_permit_commit([1, b"42"]) == (Outcome.GRANTED, CommitReply(42))
    assert classify_permit_commit([0])[0] is Outcome.HELD
    for bad in ([1], [2, b"1"], [1, b"x"], b"1", None):
        assert classify_permit_commit(bad)[0] is Outcome.ERROR
    assert classify_permit_commit(TimeoutError())[0] is Outcome.ERROR


def run_attempt(sweep_s: float) -> tuple[Attempt, list[tuple[str, tuple[int, ...]]]]:
    """One permit attempt on 3 servers: 0 and 1 grant slot 0, 2 grants slot 1 (a stray, freed
    by a release round after the commit); that release round takes ``sweep_s``."""
    flow = attempt_permit(semaphore(), "tok", "", woken=False, waiter="-", patience=0)
    rounds: list[tuple[str, tuple[int, ...]]] = []
    answer: object = None
    clock = 100.0
    acquire = {0: [1, 100, 0], 1: [1, 80, 0], 2: [1, 90, 1]}
    try:
        while True:
            effect = flow.send(answer)
            answer = None
            if effect is NOW:
                answer = clock
            elif effect is IDENTITIES or isinstance(effect, Identify):
                answer = (None, None, None)
            elif isinstance(effect, Broadcast):
                rounds.append((effect.script, tuple(effect.targets)))
                first_sweep = (
                    effect.script == "sem_sweep"
                    and len([r for r in rounds if r[0] == "sem_sweep"]) == 1
                )
                clock += sweep_s if first_sweep else 0.001
                for index in effect.targets:
                    if effect.script == "sem_acquire":
                        reply: object = acquire[index]
                    elif effect.script == "sem_fence_commit":
                        reply = [1, b"0"]
                    else:
                        reply = 1
                    effect.tally.record(index, *effect.classify(reply))
            elif effect is SETTLE or isinstance(effect, Settle | Repeat):
                pass
            else:
                raise AssertionError(f"unexpected effect {effect!r}")
    except StopIteration as stop:
        return stop.value, rounds


def test_a_permit_is_granted_after_its_stray_slot_is_freed_in_time() -> None:
    result, rounds = run_attempt(sweep_s=0.001)
    assert result.grant is not None and result.grant.slot == 0
    assert rounds[-1] == ("sem_sweep", (2,))  # the stray slot freed, ours kept


def test_a_permit_whose_stray_release_outlasted_its_validity_is_not_granted() -> None:
    """Seed 51656: the release of a stray slot is a round after the commit's validity check;
    a process that stopped in it (GC, SIGSTOP) for about a lease must not return the permit."""
    result, rounds = run_attempt(sweep_s=10.0)  # ttl 10 s: the lease ran out meanwhile
    assert result.grant is None
    assert result.decision.status is Status.TOO_SLOW
    assert rounds[-1][0] == "sem_sweep" and 0 in rounds[-1][1] and 1 in rounds[-1][1]


def test_a_won_rounds_late_grant_of_another_slot_is_heard_and_freed() -> None:
    """Servers 0 and 1 grant slot 0 and the round stops there (a majority); server 2's
    grant of slot 1 comes later. Left alone, that slot stays taken on server 2 until its TTL
    (with two such strays, three servers ended with a different free slot each and no permit
    was granted though one was free: seed 100427 of the simulation's sync front): the won
    round hears its stragglers (a Settle) and frees the late stray with the others."""
    flow = attempt_permit(semaphore(), "tok", "", woken=False, waiter="-", patience=0)
    rounds: list[tuple[str, tuple[int, ...]]] = []
    answer: object = None
    acquire_round: Any = None
    settled: list[float] = []
    try:
        while True:
            effect = flow.send(answer)
            answer = None
            if effect is NOW:
                answer = 100.0
            elif effect is IDENTITIES or isinstance(effect, Identify):
                answer = (None, None, None)
            elif isinstance(effect, Broadcast):
                rounds.append((effect.script, tuple(effect.targets)))
                for index in effect.targets:
                    if effect.script == "sem_acquire":
                        if index == 2:
                            continue  # a straggler: no reply yet
                        reply: object = [1, 100, 0]
                    elif effect.script == "sem_fence_commit":
                        reply = [1, b"0"]
                    else:
                        reply = 1
                    effect.tally.record(index, *effect.classify(reply))
                if effect.script == "sem_acquire":
                    acquire_round = effect
                    assert effect.stop(effect.tally)  # the round ends without server 2
            elif isinstance(effect, Settle):
                settled.append(effect.within_s)
                acquire_round.tally.record(2, *acquire_round.classify([1, 90, 1]))
            elif effect is SETTLE or isinstance(effect, Repeat):
                pass
            else:
                raise AssertionError(f"unexpected effect {effect!r}")
    except StopIteration as stop:
        result = stop.value
    assert result.grant is not None and result.grant.slot == 0
    assert settled and 0 < settled[0] <= 0.25  # a failed round's grace, not a server timeout
    assert rounds[-1] == ("sem_sweep", (2,))  # the late stray freed, ours kept
