"""The flows of ``fencelock._core`` driven by a scripted driver: no sockets, no sleeps.

The driver answers each Broadcast from a table of replies per (script, server) in an order the
test chooses, so stragglers can be made to arrive in every order; a vote not given before the
round's stop rule holds is a straggler, recorded only at SETTLE (or never).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from fencelock import ConfigError, LockLost, NotAcquired, Unavailable
from fencelock._core import fencing
from fencelock._core.acquire import Grant, acquire, attempt, try_acquire, unheard_repeats
from fencelock._core.effects import (
    IDENTITIES,
    NOW,
    SETTLE,
    UNHEARD,
    Broadcast,
    Flow,
    Identify,
    NotSent,
    Pause,
    Repeat,
    Replicated,
    Settle,
    Wait,
)
from fencelock._core.extend import ExtendOutcome, extend, renew
from fencelock._core.plan import LockPlan, make_plan, replica_wait
from fencelock._core.quorum import Outcome, Tally
from fencelock._core.release import release
from fencelock._core.replies import NotReplicated, ProtocolError, classify_acquire, replicated
from fencelock._engine.resp import ReplyError

GRANT = [1, 500]  # acquire.lua: granted, fence 500
HELD = [0, 1200]  # acquire.lua: held by another, 1200 ms left
OK = 1
NOT_OURS = 0


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


@dataclass
class Ident:
    run_id: str
    role: str = "master"
    restarted_at: float | None = None


@dataclass
class Script:
    """Replies by script name: a list per server index (one entry per call of that script), and
    the order in which servers answer; ``ROUND_S`` of the clock passes per round."""

    replies: dict[str, list[list[object]]]
    order: Sequence[int] | None = None
    identities: tuple[Any, ...] = ()  # known after the grant round (its handshakes)
    known: tuple[Any, ...] = ()  # known before it (answer to Identify)
    round_s: float = 0.001
    now: float = 100.0
    log: list[Any] = field(default_factory=list)
    stragglers: list[tuple[Broadcast, list[int]]] = field(default_factory=list)
    hung: frozenset[int] = frozenset()  # servers whose stragglers never answer a Settle

    def reply(self, script: str, index: int) -> object:
        queue = self.replies[script][index]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def run(self, flow: Flow[Any]) -> Any:
        answer: Any = None
        error: BaseException | None = None
        pending: tuple[Broadcast, list[int]] | None = None
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(answer)
            except StopIteration as stop:
                return stop.value
            error = None
            self.log.append(effect)
            if effect is NOW:
                answer = self.now
            elif effect is IDENTITIES:
                answer = self.identities
            elif isinstance(effect, Identify):
                answer = self.known
            elif isinstance(effect, Broadcast):
                self.now += self.round_s
                order = [i for i in (self.order or effect.targets) if i in effect.targets]
                left = list(order)
                while left and not (effect.stop is not None and effect.stop(effect.tally)):
                    index = left.pop(0)
                    result = self.reply(effect.script, index)
                    effect.tally.record(index, *effect.classify(result))
                pending = (effect, left) if left else None
                if pending:
                    self.stragglers.append(pending)
                answer = None
            elif isinstance(effect, Settle):
                if pending is not None:
                    for index in [i for i in pending[1] if i not in self.hung]:
                        result = self.reply(pending[0].script, index)
                        pending[0].tally.record(index, *pending[0].classify(result))
                        pending[1].remove(index)
                answer = None
            elif effect is SETTLE:
                if pending is not None:
                    for index in pending[1]:
                        result = self.reply(pending[0].script, index)
                        pending[0].tally.record(index, *pending[0].classify(result))
                    pending[1].clear()
                answer = None
            elif isinstance(effect, Pause):
                self.now += effect.delay_s
                answer = False
            elif isinstance(effect, Repeat):
                answer = None
            else:
                raise AssertionError(effect)

    def broadcasts(self, script: str) -> list[Broadcast]:
        return [e for e in self.log if isinstance(e, Broadcast) and e.script == script]


def table(n: int, **by_script: Sequence[object]) -> dict[str, list[list[object]]]:
    return {name: [[r] for r in replies] for name, replies in by_script.items()} | {
        name: [[OK]] * n for name in ("release", "fence_commit", "extend") if name not in by_script
    }


def test_a_one_server_grant_is_valid_until_start_plus_ttl_minus_drift() -> None:
    plan = plan_of(1)
    driver = Script(table(1, acquire=[GRANT]), round_s=3.0)  # a slow round: 3 s of 10
    grant = driver.run(try_acquire(plan, "tok", ""))
    assert isinstance(grant, Grant)
    drift = plan.drift_ms(plan.ttl_ms) / 1000
    # the round's elapsed time is not subtracted a second time
    assert grant.deadline == pytest.approx(grant.start + 10.0 - drift)
    assert grant.fence == 500


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_three_servers_grant_in_every_reply_order_and_commit_only_to_granting(
    order: tuple[int, ...],
) -> None:
    plan = plan_of(3)
    driver = Script(table(3, acquire=[GRANT, [1, 700], HELD]), order=order)
    grant = driver.run(try_acquire(plan, "tok", ""))
    assert grant is not None and grant.fence in (500, 700)
    commit = driver.broadcasts("fence_commit")
    assert len(commit) == 1
    assert set(commit[0].targets) == {i for i in (0, 1) if i in commit[0].targets}
    assert 2 not in commit[0].targets
    assert commit[0].args[1] == str(grant.fence)
    assert not driver.broadcasts("release")


@pytest.mark.parametrize("hung", [False, True], ids=["answers", "hung"])
@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_a_failed_round_waits_briefly_for_stragglers_then_releases_where_it_may_have_landed(
    order: tuple[int, ...], hung: bool
) -> None:
    # issue 21 item 8: the stragglers are waited for a short grace only (a Settle, never the
    # round's deadline); one that answers then is released in the round (so the release
    # cannot overtake its SET); one still out is sent the release without being waited for,
    # and gets it again from the background once it answers (Repeat)
    plan = plan_of(3)
    driver = Script(
        table(3, acquire=[GRANT, HELD, HELD]), order=order, hung=frozenset({0} if hung else ())
    )
    assert driver.run(try_acquire(plan, "tok", "")) is None
    assert SETTLE not in driver.log
    settles = [e for e in driver.log if isinstance(e, Settle)]
    assert all(0 < e.within_s <= plan.budget_s / 2 for e in settles)
    releases = driver.broadcasts("release")
    repeats = [e for e in driver.log if isinstance(e, Repeat)]
    if not driver.stragglers:  # server 0's grant was read in the round
        assert not settles and not repeats
        assert len(releases) == 1 and releases[0].targets == (0,)
    elif not hung:  # it answered within the grace: released in a round, after the Settle
        assert settles and driver.log.index(settles[0]) < driver.log.index(releases[0])
        assert len(releases) == 1 and releases[0].targets == (0,) and not repeats
    else:  # still out: sent the release, not waited for; repeated in the background
        assert settles and len(releases) == 1 and releases[0].targets == (0,)
        assert releases[0].stop is not None and releases[0].stop(Tally(3))
        assert [r.targets for r in repeats] == [(0,)]
        assert repeats[0].script == plan.wiring.release and repeats[0].args[0] == "tok"


def test_contention_waits_on_the_holders_wake_list_then_raises_not_acquired() -> None:
    plan = plan_of(3)
    driver = Script(table(3, acquire=[HELD, HELD, HELD]))
    flow = acquire(plan, 0.5, new_token=lambda: "t" * 40, holder_info=str, rand=lambda: 0.5)
    with pytest.raises(NotAcquired) as caught:
        driver.run(flow)
    assert "0/3 servers agreed, majority is 3" in str(caught.value) or "0/3" in str(caught.value)
    pauses = [e for e in driver.log if isinstance(e, Pause)]
    assert pauses and all(p.wake == (0, plan.keys.wake) for p in pauses)
    assert not driver.broadcasts("release")  # nothing can have landed


@pytest.mark.parametrize(
    ("replies", "order", "wait_s", "kept"),
    [
        ([[GRANT]], (0,), 1.0, False),  # granted by every server: registered nowhere
        ([[GRANT]] * 3, (0, 1, 2), 1.0, True),  # the round ended on 2: the third unheard
        ([[GRANT], [GRANT], [HELD]], (0, 1, 2), 1.0, True),  # a refusal on its way
        ([[GRANT], [GRANT], [HELD]], (2, 0, 1), 1.0, True),  # refused, so registered there
        ([[HELD, GRANT]], (0,), 1.0, True),  # an earlier attempt registered it
        ([[GRANT], [GRANT], [HELD]], (2, 0, 1), 0.0, False),  # no wait: no waiter id at all
    ],
    ids=["everywhere", "unheard", "straggler", "refused-in-win", "second-attempt", "no-wait"],
)
def test_a_lock_grant_keeps_its_waiter_id_where_a_refusal_may_have_registered_it(
    replies: list[list[object]], order: tuple[int, ...], wait_s: float, kept: bool
) -> None:
    """Its release removes the id (release.lua, before its ownership check): a server that
    refused the winning attempt (the last holder's release not there yet) holds the lock of
    nobody this lease knows, and the registration would make its next release hand the lock
    to nobody. Simulation seed 12 (``no_stale_registration``): the refusal came after the
    round had ended on its majority."""
    n = len(replies)
    plan = plan_of(n)
    driver = Script({**table(n), "acquire": replies}, order=order)
    flow = acquire(plan, wait_s, new_token=lambda: "t" * 40, holder_info=str, rand=lambda: 0.5)
    grant = driver.run(flow)
    assert grant.waiter == ("t" * 16 if kept else "-")


def test_suspect_servers_are_not_released_in_the_round_but_repeated_later() -> None:
    plan = plan_of(3)
    driver = Script(table(3, acquire=[NotSent("suspect"), HELD, HELD]))
    assert driver.run(try_acquire(plan, "tok", "")) is None
    assert not driver.broadcasts("release")  # never sent: nothing to undo
    driver = Script(table(3, acquire=[GRANT, GRANT, GRANT], release=[OK, NotSent("x"), OK]))
    grant = driver.run(try_acquire(plan, "tok", ""))
    assert grant is not None
    verdict = driver.run(release(plan, grant.token, expired=False))
    assert verdict.error is None
    repeats = [e for e in driver.log if isinstance(e, Repeat)]
    assert repeats and repeats[0].targets == (1,)


def test_too_few_answers_is_unavailable_not_contention() -> None:
    plan = plan_of(3)
    driver = Script(table(3, acquire=[TimeoutError(), TimeoutError(), HELD]))
    with pytest.raises(Unavailable):
        driver.run(try_acquire(plan, "tok", ""))
    releases = driver.broadcasts("release")
    assert releases and set(releases[0].targets) == {0, 1}


def test_the_same_server_twice_is_a_config_error_and_the_grant_is_released() -> None:
    plan = plan_of(3)
    driver = Script(
        table(3, acquire=[GRANT, HELD, GRANT]),
        identities=(Ident("a"), Ident("a"), Ident("c")),
    )
    with pytest.raises(ConfigError, match="same server"):
        driver.run(try_acquire(plan, "tok", ""))
    releases = driver.broadcasts("release")
    assert releases and set(releases[0].targets) == {0, 2}


def test_servers_known_to_be_the_same_are_refused_before_any_lock_traffic() -> None:
    driver = Script(
        table(3, acquire=[GRANT, GRANT, GRANT]), known=(Ident("a"), Ident("b"), Ident("a"))
    )
    with pytest.raises(ConfigError, match="same server"):
        driver.run(try_acquire(plan_of(3), "tok", ""))
    assert not [e for e in driver.log if isinstance(e, Broadcast)]


def test_a_replica_given_as_a_node_is_a_config_error() -> None:
    driver = Script(
        table(3, acquire=[GRANT, GRANT, GRANT]),
        identities=(Ident("a"), Ident("b", "slave"), Ident("c")),
    )
    with pytest.raises(ConfigError, match="replica"):
        driver.run(try_acquire(plan_of(3), "tok", ""))


def restart_plan(n: int, ttl_s: float = 10.0) -> LockPlan:
    return replace(plan_of(n, ttl_s), restart_delay=True)


def test_a_grant_from_a_server_restarted_less_than_a_ttl_ago_does_not_count() -> None:
    # server 0 restarted 4 s ago (ttl 10 s): its grant is no vote; 1 and 2 are held
    driver = Script(
        table(3, acquire=[GRANT, HELD, HELD]),
        identities=(Ident("a", restarted_at=96.0), Ident("b"), Ident("c")),
    )
    assert driver.run(try_acquire(restart_plan(3), "tok", "")) is None  # contention
    # ... and its grant, a real key, is released
    (release_round,) = driver.broadcasts("release")
    assert 0 in release_round.targets


def test_a_round_that_stopped_on_a_restarted_grant_hears_its_stragglers() -> None:
    # 0 (restarted) and 1 grant first: the round stops there; without 0 it needs 2's vote
    # (each server bumps to its own value: the grant alone puts no fence on a majority)
    driver = Script(
        table(3, acquire=[[1, 500], [1, 501], [1, 502]]),
        order=[0, 1, 2],
        identities=(Ident("a", restarted_at=99.0), Ident("b"), Ident("c")),
    )
    grant = driver.run(try_acquire(restart_plan(3), "tok", ""))
    assert isinstance(grant, Grant)
    assert SETTLE in driver.log
    (commit,) = driver.broadcasts("fence_commit")
    assert commit.targets == (1, 2)  # the restarted server is not counted, nor committed


def test_a_majority_that_stored_the_merged_fence_in_its_grant_needs_no_commit() -> None:
    # every granting server returned (and so stored) the merged fence: a commit would change
    # nothing on a majority, so the lease is handed out after one round
    driver = Script(table(3, acquire=[GRANT, GRANT, [0, 900]]))
    grant = driver.run(try_acquire(plan_of(3), "tok", ""))
    assert isinstance(grant, Grant) and grant.fence == 500
    assert driver.broadcasts("fence_commit") == []


@pytest.mark.parametrize(
    "fences",
    [(500, 501, 502), (900, 500, 500), (500, 900, 500)],
    ids=["all-differ", "one-ahead-first", "one-ahead-second"],
)
def test_a_grant_whose_majority_did_not_return_the_merged_fence_is_committed(
    fences: tuple[int, ...],
) -> None:
    # the merged fence is the largest; fewer than a majority returned it: round 2 raises the
    # others (two of three agreeing on a smaller value is not enough)
    driver = Script(table(3, acquire=[[1, fence] for fence in fences]), order=[0, 1, 2])
    grant = driver.run(try_acquire(plan_of(3), "tok", ""))
    assert isinstance(grant, Grant)
    (commit,) = driver.broadcasts("fence_commit")
    assert commit.args[1] == str(grant.fence) and grant.fence == max(fences[:2])


@pytest.mark.parametrize(
    ("plan", "step"),
    [(plan_of(1), 0), (plan_of(3), 0), (restart_plan(3), fencing.FLOOR_STEP_US)],
    ids=["one-server", "N3-no-restart-delay", "N3-restart-delay"],
)
def test_the_fence_floor_step_is_sent_only_over_n_servers_with_restart_delay(
    plan: LockPlan, step: int
) -> None:
    flow = attempt(plan, "tok", "", woken=False, waiter="-", patience=0)
    effect = next(flow)
    if isinstance(effect, Identify):
        assert flow.send(()) is NOW
    first = flow.send(100.0)
    assert isinstance(first, Broadcast) and first.script == "acquire"
    assert first.args[7] == step
    flow.close()


def test_a_restarted_server_votes_again_once_its_uptime_exceeds_the_ttl() -> None:
    driver = Script(
        table(3, acquire=[GRANT, HELD, GRANT]),
        identities=(Ident("a", restarted_at=89.0), Ident("b"), Ident("c")),  # 11 s > 10 s
    )
    assert isinstance(driver.run(try_acquire(restart_plan(3), "tok", "")), Grant)


def test_without_restart_delay_a_restarted_servers_grant_counts() -> None:
    driver = Script(
        table(3, acquire=[GRANT, HELD, GRANT]),
        identities=(Ident("a", restarted_at=99.0), Ident("b"), Ident("c")),
    )
    assert isinstance(driver.run(try_acquire(plan_of(3), "tok", "")), Grant)


def test_an_interrupt_during_the_round_releases_before_it_propagates() -> None:
    plan = plan_of(3)
    flow = attempt(plan, "tok", "", woken=False, waiter="-", patience=0)
    assert isinstance(next(flow), Identify)
    assert flow.send(()) is NOW
    first = flow.send(100.0)
    assert isinstance(first, Broadcast) and first.script == "acquire"
    first.tally.record(0, *first.classify(GRANT))
    cleanup = flow.throw(KeyboardInterrupt())
    # the flow asks to wait for the stragglers, then releases where the SET may have landed
    # (the caller gets the interrupt once the cleanup is done, within the round's budget)
    assert cleanup is SETTLE
    step = flow.send(None)
    assert isinstance(step, Broadcast) and step.script == "release" and step.stop is None
    for index in step.targets:
        step.tally.record(index, *step.classify(OK))
    with pytest.raises(KeyboardInterrupt):
        flow.send(None)


def test_an_interrupt_during_the_cleanup_release_leaves_it_to_the_background() -> None:
    # issue 21 item 9: the cleanup runs on every exit path
    plan = plan_of(3)
    flow = attempt(plan, "tok", "", woken=False, waiter="-", patience=0)
    assert isinstance(next(flow), Identify)
    assert flow.send(()) is NOW
    first = flow.send(100.0)
    assert isinstance(first, Broadcast)
    for index in range(3):  # granted everywhere, but too late: the round outlived the lease
        first.tally.record(index, *first.classify(GRANT))
    assert flow.send(None) is NOW
    assert flow.send(100.0 + 10.0) is IDENTITIES
    step = flow.send(())
    assert isinstance(step, Broadcast) and step.script == "release"
    assert step.targets == (0, 1, 2)
    step.tally.record(0, *step.classify(OK))
    handed = flow.throw(KeyboardInterrupt())  # while the release round waits for 1 and 2
    assert isinstance(handed, Repeat) and handed.script == "release"
    assert handed.targets == (0, 1, 2) and handed.args[0] == "tok"
    with pytest.raises(KeyboardInterrupt):
        flow.send(None)


def test_a_release_interrupted_mid_round_is_handed_to_the_background() -> None:
    # simulation seed 7001075 --cancel --fork: a release whose round is cancelled (its task
    # cancelled as asyncio.run() ended) is repeated everywhere in the background, then raises
    plan = plan_of(3)
    flow = release(plan, "tok", expired=False)
    step = next(flow)
    assert isinstance(step, Broadcast) and step.script == "release"
    step.tally.record(0, *step.classify(OK))
    handed = flow.throw(_Cancelled())  # while the round waits for 1 and 2
    assert isinstance(handed, Repeat) and handed.script == "release"
    assert handed.targets == (0, 1, 2) and handed.args[0] == "tok"
    with pytest.raises(_Cancelled):
        flow.send(None)


class _Cancelled(BaseException):
    """As asyncio.CancelledError: a BaseException thrown into a flow."""


def _grant_round_land_seen(flow: Flow[Any], seen: list[tuple[Any, bool]]) -> Flow[Any]:
    """``flow``, recording each effect it yields with its grant round's ``land`` then (what a
    driver would read if a straggler of that round answered NOSCRIPT at that moment)."""
    grant_round: Broadcast | None = None
    answer: Any = None
    while True:
        try:
            effect = flow.send(answer)
        except StopIteration as stop:
            return stop.value
        if grant_round is None and isinstance(effect, Broadcast):
            grant_round = effect
        seen.append((effect, grant_round is not None and grant_round.land))
        answer = yield effect


@pytest.mark.parametrize("hung", [False, True], ids=["answers", "hung"])
def test_a_failed_attempt_gives_its_round_up_before_it_cleans_up(hung: bool) -> None:
    # simulation seed 50987: a straggler of a failed (or interrupted) attempt that answers
    # NOSCRIPT after the round is parked must not be sent the script in full: the cleanup's
    # release (after the acquire on the same connection) has answered "not ours" there by
    # then, and the late grant would stay until its TTL. The flow turns the round's ``land``
    # off before the first effect of its cleanup (the drivers read it then)
    plan = plan_of(3)
    seen: list[tuple[Any, bool]] = []
    driver = Script(
        table(3, acquire=[GRANT, HELD, HELD]), order=(1, 2, 0), hung=frozenset({0} if hung else ())
    )
    assert driver.run(_grant_round_land_seen(try_acquire(plan, "tok", ""), seen)) is None
    grant_round = driver.broadcasts("acquire")[0]
    assert grant_round.land is False
    cleanup = [i for i, (e, _) in enumerate(seen) if isinstance(e, Settle | Repeat) or (
        isinstance(e, Broadcast) and e.script == "release")]  # fmt: skip
    assert cleanup and all(not land for _, land in seen[cleanup[0] :])
    assert (grant_round, True) in seen  # the round itself was sent to land


def test_a_won_attempt_keeps_its_round_landing() -> None:
    # a won round's stragglers must still land (grant_lands_everywhere)
    driver = Script(table(3, acquire=[GRANT, GRANT, HELD]), order=(0, 1, 2))
    assert isinstance(driver.run(try_acquire(plan_of(3), "tok", "")), Grant)
    assert driver.stragglers and driver.broadcasts("acquire")[0].land is True


def test_an_interrupted_attempt_gives_its_round_up_lock_and_semaphore() -> None:
    from fencelock._core.semaphore import attempt_permit, make_semaphore_plan

    plan = plan_of(3)
    flows = [
        attempt(plan, "tok", "", woken=False, waiter="-", patience=0),
        attempt_permit(
            make_semaphore_plan(plan, 2), "tok", "", woken=False, waiter="-", patience=0
        ),
    ]
    for flow in flows:
        assert isinstance(next(flow), Identify)
        assert flow.send(()) is NOW
        first = flow.send(100.0)
        assert isinstance(first, Broadcast) and first.land is True
        assert flow.throw(KeyboardInterrupt()) is SETTLE  # every call still out
        assert first.land is False, first.script


def run_extend(plan: LockPlan, replies: list[object], deadline: float) -> Any:
    driver = Script(table(plan.n, extend=replies))
    return driver.run(extend(plan, "tok", 2000, deadline))


def test_an_extend_of_unknown_outcome_keeps_the_earlier_deadline() -> None:
    plan = plan_of(3)
    old = 100.0 + 9.0
    result = run_extend(plan, [OK, TimeoutError(), TimeoutError()], old)
    assert result.outcome is ExtendOutcome.UNKNOWN
    # a shorter PEXPIRE (2 s) may have landed on a majority: the new, earlier deadline holds
    assert result.deadline == pytest.approx(100.0 + 2.0 - plan.drift_ms(2000) / 1000)
    assert isinstance(result.error, Unavailable)


def test_a_confirmed_extend_moves_the_deadline_and_a_refused_one_loses_the_lease() -> None:
    plan = plan_of(3)
    confirmed = run_extend(plan, [OK, OK, NOT_OURS], 101.0)
    assert confirmed.outcome is ExtendOutcome.CONFIRMED and confirmed.error is None
    assert confirmed.deadline == pytest.approx(100.0 + 2.0 - plan.drift_ms(2000) / 1000)
    refused = run_extend(plan, [NOT_OURS, NOT_OURS, OK], 101.0)
    assert refused.outcome is ExtendOutcome.REFUSED
    assert isinstance(refused.error, LockLost) and refused.lost_reason


def test_renewal_stops_at_max_hold_and_retries_sooner_after_a_failure() -> None:
    plan = plan_of(3)
    driver = Script(table(3, extend=[OK, OK, OK]))
    stopped = driver.run(renew(plan, "tok", 105.0, every_s=3.0, stop_at=100.0))
    assert stopped.next_at is None and stopped.stop_reason and stopped.lost_reason is None
    driver = Script(table(3, extend=[TimeoutError(), TimeoutError(), OK]))
    step = driver.run(renew(plan, "tok", 103.0, every_s=3.0, stop_at=None))
    assert step.lost_reason is None and step.next_at is not None
    assert step.next_at - driver.now < 3.0  # retried before the usual period


def test_a_renewal_that_did_not_confirm_puts_the_lease_at_risk_and_one_that_did_clears_it() -> None:
    plan = plan_of(3)
    missed = Script(table(3, extend=[TimeoutError(), TimeoutError(), OK]))
    step = missed.run(renew(plan, "tok", 103.0, every_s=3.0, stop_at=None))
    assert step.at_risk and step.lost_reason is None
    confirmed = Script(table(3, extend=[OK, OK, TimeoutError()]))
    step = confirmed.run(renew(plan, "tok", 103.0, every_s=3.0, stop_at=None))
    assert not step.at_risk and step.lost_reason is None


@pytest.mark.parametrize(
    ("replies", "expired", "error"),
    [
        ([OK, OK, NOT_OURS], False, None),
        ([NOT_OURS, NOT_OURS, OK], False, LockLost),
        ([TimeoutError(), TimeoutError(), OK], False, Unavailable),
        ([TimeoutError(), TimeoutError(), OK], True, LockLost),
    ],
)
def test_release_verdicts(
    replies: list[object], expired: bool, error: Callable[..., Exception] | None
) -> None:
    driver = Script(table(3, release=replies))
    verdict = driver.run(release(plan_of(3), "tok", expired=expired))
    if error is None:
        assert verdict.error is None
    else:
        assert isinstance(verdict.error, error)  # type: ignore[arg-type]


# -- replicas=k: a vote counts only with k replica acknowledgements (WAIT) ---------------------


def replicated_plan(n: int, replicas: int = 1) -> LockPlan:
    return replace(plan_of(n), wait=replica_wait(replicas, 0.5))


def test_the_wait_of_a_plan_is_three_quarters_of_the_server_timeout_and_never_zero() -> None:
    assert replica_wait(0, 0.5) is None
    assert replica_wait(2, 0.5) == Wait(2, 375)
    assert replica_wait(1, 0.0001) == Wait(1, 1)  # WAIT k 0 would block forever


@pytest.mark.parametrize(
    ("result", "outcome", "detail"),
    [
        (Replicated(GRANT, 1), Outcome.GRANTED, None),
        (Replicated(GRANT, 2), Outcome.GRANTED, None),
        (Replicated(GRANT, 0), Outcome.ERROR, NotReplicated),
        (Replicated(HELD, 0), Outcome.HELD, None),  # a refusal wrote nothing
        (Replicated(GRANT, ReplyError("ERR WAIT cannot be used")), Outcome.ERROR, ReplyError),
        (Replicated(GRANT, b"x"), Outcome.ERROR, ProtocolError),
        (Replicated(ReplyError("NOPERM"), 1), Outcome.ERROR, None),
        (TimeoutError("late"), Outcome.ERROR, TimeoutError),
    ],
)
def test_a_grant_counts_only_with_enough_replica_acknowledgements(
    result: object, outcome: Outcome, detail: type[BaseException] | None
) -> None:
    got, why = replicated(classify_acquire, 1, 375)(result)
    assert got is outcome
    if detail is not None:
        assert isinstance(why, detail)


def test_a_grant_short_of_replicas_is_unavailable_and_released() -> None:
    plan = replicated_plan(1)
    driver = Script(table(1, acquire=[Replicated(GRANT, 0)]))
    with pytest.raises(Unavailable, match="0 of 1 replica"):
        driver.run(try_acquire(plan, "tok", ""))
    (round_,) = driver.broadcasts("acquire")
    assert round_.wait == Wait(1, 375)
    releases = driver.broadcasts("release")
    assert releases and releases[0].targets == (0,)  # what was written there is cleaned up


def test_replicated_grants_on_a_majority_win_and_the_commit_carries_the_wait_too() -> None:
    plan = replicated_plan(3)
    driver = Script(
        table(
            3,
            acquire=[Replicated(GRANT, 1), Replicated(GRANT, 0), Replicated([1, 501], 1)],
            fence_commit=[Replicated(OK, 1)] * 3,
        )
    )
    grant = driver.run(try_acquire(plan, "tok", ""))
    assert grant is not None and grant.fence == 501
    (commit,) = driver.broadcasts("fence_commit")
    assert commit.wait == Wait(1, 375) and set(commit.targets) == {0, 2}


def test_an_extend_short_of_replicas_is_not_confirmed() -> None:
    plan = replicated_plan(1)
    driver = Script(table(1, extend=[Replicated(OK, 0)]))
    result = driver.run(extend(plan, "tok", 2000, 109.0))
    assert result.outcome is ExtendOutcome.UNKNOWN and isinstance(result.error, Unavailable)
    confirmed = Script(table(1, extend=[Replicated(OK, 1)])).run(extend(plan, "tok", 2000, 109.0))
    assert confirmed.outcome is ExtendOutcome.CONFIRMED


def test_without_replicas_no_round_carries_a_wait() -> None:
    driver = Script(table(1, acquire=[GRANT]))
    assert driver.run(try_acquire(plan_of(1), "tok", "")) is not None
    assert all(b.wait is None for b in driver.log if isinstance(b, Broadcast))


@pytest.mark.parametrize("n", [1, 3], ids=["hand-over", "redlock"])
def test_a_cancelled_wait_ends_with_its_pause_and_makes_no_attempt_after_it(n: int) -> None:
    plan = plan_of(n)
    driver = Script(table(n, acquire=[HELD] * n))

    def cancelled() -> bool:  # set while the first pause waits
        return any(isinstance(effect, Pause) for effect in driver.log)

    flow = acquire(
        plan, 60.0, new_token=lambda: "t" * 40, holder_info=str, rand=lambda: 0.5,
        cancelled=cancelled,
    )  # fmt: skip
    with pytest.raises(NotAcquired):
        driver.run(flow)
    pauses = [e for e in driver.log if isinstance(e, Pause)]
    assert len(pauses) == 1 and pauses[0].stop is cancelled  # the driver can cut it short
    assert pauses[0].wake == (0, plan.keys.wake)
    assert len(driver.broadcasts("acquire")) == 1


def test_a_wait_cancelled_before_it_starts_makes_one_attempt_and_no_pause() -> None:
    plan = plan_of(1)
    driver = Script(table(1, acquire=[HELD]))
    flow = acquire(
        plan, 60.0, new_token=lambda: "t" * 40, holder_info=str, rand=lambda: 0.5,
        cancelled=lambda: True,
    )  # fmt: skip
    with pytest.raises(NotAcquired):
        driver.run(flow)
    assert not [e for e in driver.log if isinstance(e, Pause)]
    assert len(driver.broadcasts("acquire")) == 1


def test_a_given_up_rounds_late_grant_is_released_on_its_server_and_nothing_else() -> None:
    # simulation seed 205015: a failed attempt's acquire delayed on its connection past the
    # cleanup's release and both its repeats still grants there; its reply, heard once the
    # round is parked, must get the token released on that server (Broadcast.late)
    plan = plan_of(3)
    driver = Script(table(3, acquire=[GRANT, HELD, HELD]), order=(1, 2, 0), hung=frozenset({0}))
    assert driver.run(try_acquire(plan, "tok", "")) is None
    late = driver.broadcasts("acquire")[0].late
    assert late is not None
    repeat = late(0, GRANT)
    assert isinstance(repeat, Repeat)
    assert repeat.script == plan.wiring.release and repeat.targets == (0,)
    assert repeat.keys == plan.release_keys and repeat.args[0] == "tok"
    assert repeat.until_s == plan.ttl_ms / 1000.0
    assert late(2, Replicated(GRANT, 0)) == replace(repeat, targets=(2,))  # short of replicas
    assert late(0, HELD) is None  # took nothing there
    assert late(0, ReplyError("NOSCRIPT No matching script")) is None
    assert repeat.at_s == (0.0,)  # heard: it landed already, released once (and repeated)
    # a reply that can no longer be heard (its asyncio loop shut down, its connection closed)
    # may have been a grant, or its request may land yet: released at once and over the lease
    unheard = late(1, UNHEARD)
    assert unheard == replace(repeat, targets=(1,), at_s=unheard_repeats(plan.ttl_ms / 1000.0))


def test_an_unheard_calls_release_is_repeated_with_doubling_gaps_over_the_lease() -> None:
    assert unheard_repeats(2.0) == (0.0, 0.1, 0.3, 0.7, 1.5)
    assert unheard_repeats(0.05) == (0.0,)
    thirty = unheard_repeats(30.0)
    assert thirty[-1] < 30.0 < thirty[-1] + 2 * (thirty[-1] - thirty[-2]) and len(thirty) == 9


def test_a_won_rounds_stragglers_are_never_released() -> None:
    # a won round's late grant is the holder's
    driver = Script(table(3, acquire=[GRANT, GRANT, HELD]), order=(0, 1, 2))
    assert isinstance(driver.run(try_acquire(plan_of(3), "tok", "")), Grant)
    assert driver.stragglers and driver.broadcasts("acquire")[0].late is None


def test_a_given_up_permit_or_fair_attempt_releases_its_late_grant_by_token() -> None:
    from fencelock._core.fair import attempt_fair, fair_plan
    from fencelock._core.semaphore import attempt_permit, make_semaphore_plan

    plan = plan_of(3)
    sem = make_semaphore_plan(plan, 2)
    cases = [
        # a slot's late grant: every slot of the token swept (as the cleanup does)
        (attempt_permit(sem, "tok", "", woken=False, waiter="-", patience=0), [1, 500, 1],
         "sem_sweep"),
        # the fair lock's cleanup release: compare-and-delete, the queue entry kept
        (attempt_fair(fair_plan(plan), "tok", "", waiter="w", ticket=0, heartbeat_ms=1000),
         [1, 5], "release"),
    ]  # fmt: skip
    for flow, grant, release_script in cases:
        assert isinstance(next(flow), Identify)
        assert flow.send(()) is NOW
        first = flow.send(100.0)
        assert isinstance(first, Broadcast) and first.late is None
        assert flow.throw(KeyboardInterrupt()) is SETTLE
        assert first.late is not None, first.script
        repeat = first.late(1, grant)
        assert repeat is not None and repeat.targets == (1,) and repeat.args[0] == "tok"
        assert repeat.script == release_script
        assert first.late(1, [0, 1200] if len(grant) == 3 else [0, 1200, 3]) is None


# -- tokens that are granted again (the compat layer's; LockPlan.tokens_reused) ----------------


def reused_plan(n: int) -> LockPlan:
    return replace(plan_of(n), tokens_reused=True)


def _repeats(driver: Script) -> list[Repeat]:
    return [e for e in driver.log if isinstance(e, Repeat)]


@pytest.mark.parametrize("reused", [False, True], ids=["own", "reused"])
def test_a_refused_release_is_repeated_only_for_a_token_that_is_never_granted_again(
    reused: bool,
) -> None:
    # a repeat of a reused token's release deleted the next grant of the same token
    plan = reused_plan(1) if reused else plan_of(1)
    driver = Script(table(1, release=[NOT_OURS]))
    verdict = driver.run(release(plan, "tok", expired=False))
    assert isinstance(verdict.error, LockLost)
    assert bool(_repeats(driver)) is not reused


def test_a_reused_tokens_failed_attempt_releases_only_a_heard_grant_and_nothing_late() -> None:
    plan = reused_plan(3)
    driver = Script(table(3, acquire=[GRANT, HELD, HELD]), order=(1, 2, 0), hung=frozenset({0}))
    assert driver.run(try_acquire(plan, "tok", "")) is None
    assert not driver.broadcasts("release")  # server 0's grant was never heard
    assert not _repeats(driver)
    assert driver.broadcasts("acquire")[0].late is None  # a late grant is not released
    # one that was heard is released, and waited for
    driver = Script(table(3, acquire=[GRANT, HELD, HELD]), order=(0, 1, 2))
    assert driver.run(try_acquire(plan, "tok", "")) is None
    (released,) = driver.broadcasts("release")
    assert released.targets == (0,) and released.stop is None and not _repeats(driver)


def test_a_reused_token_is_not_sent_again_after_an_attempt_a_server_did_not_answer() -> None:
    plan = reused_plan(1)
    driver = Script(table(1, acquire=[TimeoutError()]))
    flow = acquire(plan, 5.0, new_token=lambda: "t" * 32, holder_info=str, rand=lambda: 0.5)
    with pytest.raises(Unavailable):
        driver.run(flow)
    assert len(driver.broadcasts("acquire")) == 1
    # with its own tokens the lock tries again until the wait is over
    driver = Script(table(1, acquire=[TimeoutError()]))
    flow = acquire(plan_of(1), 0.2, new_token=lambda: "t" * 32, holder_info=str, rand=lambda: 0.5)
    with pytest.raises(Unavailable):
        driver.run(flow)
    assert len(driver.broadcasts("acquire")) > 1


def test_an_interrupted_release_of_a_reused_token_is_not_handed_to_the_background() -> None:
    flow = release(reused_plan(3), "tok", expired=False)
    step = next(flow)
    assert isinstance(step, Broadcast) and step.script == "release"
    with pytest.raises(_Cancelled):
        flow.throw(_Cancelled())


def test_an_expired_release_of_a_reused_token_a_server_did_not_answer_is_unavailable() -> None:
    """Sim seed 900015543 (``--compat``): an expired compat lease's release timed out and was
    reported LockLost; it reached the server after the same token's next grant and deleted
    it. For a token that is granted again, a release that was not answered is Unavailable
    (ServersUnavailable: may still land), whatever the lease's deadline; answered "not ours"
    it is LockLost, and with the lock's own tokens an expired release is LockLost as before."""
    silent = Script(table(1, release=[TimeoutError()]))
    verdict = silent.run(release(reused_plan(1), "tok", expired=True))
    assert isinstance(verdict.error, Unavailable) and not isinstance(verdict.error, LockLost)
    refused = Script(table(1, release=[0]))
    assert isinstance(refused.run(release(reused_plan(1), "tok", expired=True)).error, LockLost)
    own = Script(table(1, release=[TimeoutError()]))
    assert isinstance(own.run(release(plan_of(1), "tok", expired=True)).error, LockLost)


def test_a_reused_tokens_extend_and_release_carry_the_grants_fence_on_one_server() -> None:
    """The scripts refuse an extend or release whose grant's fence is no longer the fence
    register's (the same token granted again since): compat plans, one server, send it; the
    lock's own tokens and N servers (whose registers differ until a commit) do not."""
    fence = 2**60 + 7  # exact past 2^53, as a decimal string
    assert reused_plan(1).grant_tag(fence) == str(fence)
    assert plan_of(1).grant_tag(fence) == ""
    assert reused_plan(3).grant_tag(fence) == ""
    plan = reused_plan(1)
    flow = extend(plan, "tok", 5000, 100.0, plan.grant_tag(fence))
    assert next(flow) is NOW
    sent = flow.send(0.0)
    assert isinstance(sent, Broadcast)
    assert sent.keys == (plan.keys.lock, plan.keys.fence) and sent.args == ("tok", 5000, str(fence))
    released = next(release(plan, "tok", expired=False, grant=plan.grant_tag(fence)))
    assert isinstance(released, Broadcast) and released.args[-1] == str(fence)
    own = plan_of(1)
    flow = extend(own, "tok", 5000, 100.0)
    next(flow)
    sent = flow.send(0.0)
    assert isinstance(sent, Broadcast) and sent.keys == own.extend_keys
    assert sent.args == ("tok", 5000)
    released = next(release(own, "tok", expired=False))
    assert isinstance(released, Broadcast) and len(released.args) == 7


@pytest.mark.parametrize("script", ["acquire", "rw_write_acquire", "rw_read_acquire"])
def test_only_the_locks_script_is_told_that_a_first_attempts_waiter_is_unregistered(
    script: str,
) -> None:
    """``acquire.lua`` reads ``+id`` as "registered nowhere yet" (its grant removes nothing);
    a reader's and a writer's scripts take the id as sent, so they get it bare, or a waiting
    writer registered ``+id`` and then stood behind its own registration (CI)."""
    plan = plan_of(1)
    plan = replace(plan, wiring=replace(plan.wiring, acquire=script))
    driver = Script({script: [[HELD, GRANT]], "release": [[OK]]})
    flow = acquire(plan, 5.0, new_token=lambda: "t" * 32, holder_info=str, rand=lambda: 0.0)
    driver.run(flow)
    first, second = (sent.args[4] for sent in driver.broadcasts(script))
    assert isinstance(first, str) and isinstance(second, str)
    assert first == ("+" + second if script == "acquire" else second)
    assert second == "t" * 16
