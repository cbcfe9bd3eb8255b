"""The checkers added for issue 22's mutants, each on a known-bad history (a checker that never
fires proves nothing) and on the same history made good."""

from __future__ import annotations

from types import SimpleNamespace

from tools.sim.checkers import (
    fence_order,
    grant_lands_everywhere,
    grant_valid_at_return,
    honest_loss,
    lock_when_free,
    mutual_exclusion,
    one_leader_per_term,
    permit_when_free,
    rw_exclusion,
    rw_when_free,
    semaphore_limit,
)
from tools.sim.server import ZSet
from tools.sim.world import Config, Grant, History, Loss, World


def test_grant_lands_everywhere_fires_on_a_server_that_never_ran_the_acquire() -> None:
    grant = Grant("a", "k", "t1", 10, at=1000.5, deadline=1002.0, ended=1001.0, start=1000.49)
    history = History(grants=[grant], landed=[{b"t1"}, {b"t1"}, set()], servers=3)
    assert grant_lands_everywhere(history)
    history.landed[2].add(b"t1")
    assert not grant_lands_everywhere(history)


def test_grant_lands_everywhere_excuses_a_fault_near_the_grant_and_a_quick_release() -> None:
    grant = Grant("a", "k", "t1", 10, at=1000.5, deadline=1002.0, ended=1001.0, start=1000.49)
    faulty = History(
        grants=[grant], landed=[{b"t1"}, set()], servers=2, fault_windows=[(999.0, 999.9)]
    )
    assert not grant_lands_everywhere(faulty)  # within QUIET_BEFORE_S of the round
    faulty.fault_windows = [(990.0, 995.0)]
    assert grant_lands_everywhere(faulty)
    grant.ended = grant.at + 0.01  # released before its stragglers could land
    assert not grant_lands_everywhere(faulty)


def test_grant_valid_at_return_fires_on_a_lease_returned_dead() -> None:
    grant = Grant("a", "k", "t1", 10, at=1002.01, deadline=1002.0, start=1000.0)
    grant.returned_deadline = 1002.0
    history = History(grants=[grant])
    assert grant_valid_at_return(history)
    history.client_pauses = [(1001.0, 1002.01)]  # a pause after the check: not the code's
    assert not grant_valid_at_return(history)
    history.client_pauses = []
    grant.returned_deadline = 1003.9
    assert not grant_valid_at_return(history)


def test_mutual_exclusion_tolerates_an_overlap_only_across_a_broken_clock_bound() -> None:
    history = History(
        servers=3,
        grants=[
            Grant("a", "k", "t1", 10, at=1.0, deadline=3.0, ended=2.5, start=0.99),
            Grant("b", "k", "t2", 11, at=2.0, deadline=4.0, ended=3.0, start=1.99),
        ],
    )
    assert mutual_exclusion(history)
    history.clock_breaks = [1.5]
    assert not mutual_exclusion(history)
    history.grants[1].fence = 9  # the fences must still order them
    assert fence_order(history)


def _permit(client: str, slot: int, fence: int, at: float, ended: float) -> Grant:
    grant = Grant(client, f"sem/slot{slot}", f"t{fence}", fence, at=at, deadline=at + 2.0)
    grant.start, grant.ended, grant.release = at - 0.01, ended, "ok"
    return grant


def test_semaphore_limit_fires_on_one_permit_too_many() -> None:
    history = History(
        servers=3,
        limit=2,
        ttl=2.0,
        grants=[
            _permit("a", 0, 1, 1000.0, 1001.0),
            _permit("b", 1, 2, 1000.2, 1001.0),
            _permit("c", 0, 3, 1000.5, 1001.5),
        ],
    )
    assert semaphore_limit(history)
    history.grants[2].at = 1001.0  # granted when the others' releases started
    assert not semaphore_limit(history)
    history.grants[2].key = "sem/slot2"  # a slot beyond the limit
    assert semaphore_limit(history)


def test_permit_when_free_fires_on_a_refusal_with_a_free_permit_and_no_fault() -> None:
    history = History(
        servers=3,
        limit=2,
        ttl=2.0,
        grants=[_permit("a", 0, 1, 1000.0, 1003.0)],
        permits_refused=[("b", 1001.0, 1002.5)],
    )
    assert permit_when_free(history)
    history.grants.append(_permit("c", 1, 2, 1000.5, 1002.0))  # both taken for a while
    assert not permit_when_free(history)
    history.grants.pop()
    history.fault_windows = [(1000.5, 1000.6)]  # a fault just before the ask
    assert not permit_when_free(history)
    history.fault_windows = [(998.0, 998.1)]  # long before: the servers are healthy again
    assert permit_when_free(history)
    history.restarted_at = [999.5]  # but a restart within a lease: it does not vote yet
    assert not permit_when_free(history)
    history.restarted_at = []
    history.permit_attempts = [("d", 1002.0, 1002.1)]  # another ask in flight meanwhile
    assert not permit_when_free(history)
    history.permit_attempts = [("b", 1001.0, 1002.5), ("d", 1003.0, 1003.1)]
    assert permit_when_free(history)


def test_permit_when_free_counts_an_unconfirmed_release_to_its_deadline() -> None:
    """The lasting split's history (workloads.lasting_split): slot 0's release reached a
    minority (Unavailable: the permit occupies its slot to its deadline), slot 1's a majority
    (confirmed: free from its release on, whatever a minority still holds); a refusal a
    second later with no other ask is a violation, unless slot 1's release was not confirmed
    either (both slots occupied)."""
    first = _permit("sy", 0, 1, 1000.0, 1000.05)
    first.release, first.deadline = "Unavailable", 1001.978
    second = _permit("sx", 1, 2, 1000.02, 1000.06)
    history = History(
        servers=3,
        limit=2,
        ttl=2.0,
        grants=[first, second],
        fault_windows=[(1000.05, 1000.05), (1000.06, 1000.06)],  # the lost requests
        permits_refused=[("sq", 1001.11, 1001.9)],
        permit_attempts=[("sy", 999.99, 1000.0), ("sx", 1000.0, 1000.02), ("sq", 1001.11, 1001.9)],
    )
    assert permit_when_free(history)
    second.release = "Unavailable"
    assert not permit_when_free(history)


def test_a_lease_whose_local_deadline_outlives_its_keys_is_reported() -> None:
    world = World(1, Config(servers=3, faults=()))
    lease = SimpleNamespace(deadline=1005.0, lost=SimpleNamespace(is_set=lambda: False))
    grant = Grant("a", "k", "tok", 7, at=1000.0, deadline=1005.0, start=1000.0)
    grant.lease = lease
    world.history.grants.append(grant)
    for server in world.servers:
        server.data[b"fencelock:{k}"] = b"tok"
        server.expires[b"fencelock:{k}"] = 1006_000  # ms on the server's (true) clock
    world._check_leases(1001.0, 2)
    assert world.history.outlived == []
    world.servers[0].expires[b"fencelock:{k}"] = 1004_000  # a shorter ttl took effect there
    world._check_leases(1001.0, 2)
    assert world.history.outlived == []  # still on a majority
    world.servers[1].expires[b"fencelock:{k}"] = 1004_500
    world._check_leases(1001.0, 2)
    assert len(world.history.outlived) == 1


def test_a_registration_left_after_its_leases_confirmed_release_is_reported() -> None:
    """The mutant lock-grant-forgets-waiter: sim1 still registers the waiter id a granted
    acquire carried, past the window after its lease's release was confirmed."""
    world = World(1, Config(servers=3, faults=()))
    grant = Grant("a", "k", "tok", 7, at=1000.2, deadline=1002.0, ended=1000.5, start=1000.1)
    grant.release = "ok"
    world.history.grants.append(grant)
    world._waiter_ids[b"tok"] = b"w1"
    waiters = ZSet()
    waiters.scores[b"w1"] = world.clocks[1]() * 1000 + 5000  # unexpired
    world.servers[1].data[b"fencelock:{k}:waiters"] = waiters
    granted = {b"tok": grant}
    world._check_registrations(1001.0, 1.1, granted)
    assert world.history.registrations == []  # within the window after the release
    grant.release = "Unavailable"
    world._check_registrations(1002.0, 1.1, granted)
    assert world.history.registrations == []  # not confirmed: it may not have run there
    grant.release = "ok"
    waiters.scores[b"w1"] = world.clocks[1]() * 1000 - 1  # expired: as good as gone
    world._check_registrations(1002.0, 1.1, granted)
    assert world.history.registrations == []
    waiters.scores[b"w1"] = world.clocks[1]() * 1000 + 5000
    world._check_registrations(1002.0, 1.1, granted)
    assert len(world.history.registrations) == 1
    assert "sim1 fencelock:{k}:waiters still registers w1" in world.history.registrations[0]
    world._check_registrations(1002.1, 1.1, granted)
    assert len(world.history.registrations) == 1  # reported once
    # an attempt of the call that a fault delayed past the release registered it again there
    world.servers[2].data[b"fencelock:{k}:waiters"] = waiters
    world.servers[2].refused_at[b"w1"] = 1000.6
    world._check_registrations(1002.2, 1.1, granted)
    assert len(world.history.registrations) == 1


def test_fence_order_tolerates_a_step_back_only_across_a_clock_break_and_a_wipe() -> None:
    history = History(
        servers=3,
        grants=[
            Grant("a", "k", "t1", 20, at=1.0, deadline=3.0, ended=1.5, start=0.99),
            Grant("b", "k", "t2", 11, at=5.0, deadline=7.0, ended=5.5, start=4.99),
        ],
    )
    assert fence_order(history)
    history.clock_breaks = [0.5]
    assert fence_order(history)  # a clock break alone does not excuse it
    history.wiped_at = [3.0]
    assert not fence_order(history)


def test_fence_order_orders_a_handed_over_grant_by_its_wait_not_by_when_it_was_heard() -> None:
    """Seed 126721219 (``--cancel --fork --store --reentrant-hold``): b waited for a hand-over
    from 0.05; the releaser's script granted it with fence 11 at 0.2, while b's client was
    paused; the only server was wiped, a took the key again (fence 20, returned at 1.7), and b
    heard its claim only at 2.8, when its client ran again. b's grant was won by a wait that
    began before a returned: the two are not ordered (its fence was issued first). A grant that
    is no hand-over and began after a returned is still checked."""
    handed = Grant("b", "k", "h2", 11, at=2.8, deadline=3.9, ended=2.87, start=2.79)
    handed.asked = 0.05
    history = History(
        servers=1,
        grants=[Grant("a", "k", "t1", 20, at=1.7, deadline=5.6, ended=2.2, start=1.69), handed],
    )
    assert not fence_order(history)
    handed.token = "t2"  # no hand-over: its winning round began at 2.79, after a returned
    assert fence_order(history)


def test_mutual_exclusion_on_one_server_tolerates_a_multilocks_key_taken_before_a_wipe() -> None:
    """A MultiLock's first key was granted (round start 3.0) before the only server was wiped
    (4.2); it returned at 4.75, after another client took the key again (4.7): the wiped
    restart lost it, as documented for one server; not across a wipe, it is a violation."""
    history = History(
        servers=1,
        grants=[
            Grant("a", "k", "t1", 20, at=4.7, deadline=6.6, ended=4.9, start=4.69),
            Grant("b", "k", "t2", 11, at=4.75, deadline=5.4, ended=5.0, start=3.0),
        ],
        wiped_at=[4.2],
    )
    assert not mutual_exclusion(history)
    history.wiped_at = []
    assert mutual_exclusion(history)


def test_fence_order_does_not_order_a_round_that_began_before_the_other_was_granted() -> None:
    """Seed 5649: B's winning round started before A's grant (its request was delayed), ran on
    the servers after A's release, and got the larger fence; the checker ordered by round
    start and called it a step back. Only a grant acknowledged before the other's round began
    is ordered, and that one must still have the smaller fence."""
    a = Grant("a", "sem/slot0", "t1", 20, at=0.983, deadline=2.9, ended=1.016, start=0.98)
    b = Grant("b", "sem/slot0", "t2", 21, at=1.034, deadline=2.9, ended=1.36, start=0.97)
    history = History(servers=3, grants=[a, b])
    assert fence_order(history) == []
    b.start = 1.02  # B's round began after A was acknowledged: now the order is known
    assert fence_order(history) == []
    b.fence = 19
    assert fence_order(history)


def _rw(client: str, kind: str, fence: int, at: float, ended: float) -> Grant:
    grant = Grant(client, "rw0", f"t{fence}", fence, at=at, deadline=at + 2.0, ended=ended)
    grant.start, grant.kind = at - 0.01, kind
    return grant


def test_rw_exclusion_fires_on_a_writer_while_a_reader_is_valid() -> None:
    history = History(
        servers=3,
        grants=[
            _rw("r1", "read", 1, 1000.0, 1001.0),
            _rw("r2", "read", 2, 1000.2, 1001.5),  # readers share
            _rw("w", "write", 3, 1001.2, 1001.8),  # r2 is still valid
        ],
    )
    found = rw_exclusion(history)
    assert len(found) == 1 and "r2 (read)" in found[0] and "w (write)" in found[0]
    assert not mutual_exclusion(history)  # the readers are not the lock checker's
    history.grants[2] = _rw("w", "write", 3, 1001.6, 1001.8)  # after the last reader left
    assert not rw_exclusion(history)
    history.clock_breaks = [1000.5]
    history.grants[2] = _rw("w", "write", 3, 1001.2, 1001.8)
    assert not rw_exclusion(history)  # across a broken clock bound, as for the lock


def test_rw_exclusion_fires_on_two_writers_and_fence_order_on_a_reader_after_a_writer() -> None:
    history = History(
        servers=3,
        grants=[_rw("w1", "write", 5, 1000.0, 1001.0), _rw("w2", "write", 6, 1000.5, 1001.2)],
    )
    assert rw_exclusion(history)
    history.grants[1] = _rw("w2", "write", 6, 1001.1, 1001.2)
    assert not rw_exclusion(history) and not fence_order(history)
    history.grants.append(_rw("r", "read", 4, 1001.5, 1001.6))  # readers bump the same register
    assert fence_order(history)


def _term(client: str, fence: int, at: float, ended: float) -> Grant:
    grant = Grant(client, "e0", f"t{client}", fence, at=at, deadline=at + 2.0, ended=ended)
    grant.start, grant.kind = at - 0.01, "election"
    return grant


def test_one_leader_per_term_fires_on_a_term_granted_twice() -> None:
    history = History(
        servers=3, grants=[_term("a", 7, 1000.0, 1000.5), _term("b", 7, 1001.0, 1001.5)]
    )
    found = one_leader_per_term(history)
    assert any("term 7 granted twice" in f for f in found)
    assert not mutual_exclusion(history) and not fence_order(history)  # terms are its own
    history.grants[1].fence = 8
    assert not one_leader_per_term(history)
    history.grants[1].fence = 7
    history.clock_breaks, history.wiped_at = [1000.2], [1000.7]  # documented: both at once
    assert not one_leader_per_term(history)
    history.wiped_at = []
    assert one_leader_per_term(history)


def test_one_leader_per_term_fires_on_a_term_that_did_not_grow_and_two_leaders_at_once() -> None:
    history = History(
        servers=3, grants=[_term("a", 9, 1000.0, 1000.5), _term("b", 8, 1001.0, 1001.5)]
    )
    assert any("term 8 (b) after 9 (a)" in f for f in one_leader_per_term(history))
    history.grants[1] = _term("b", 10, 1000.3, 1001.5)  # a still leads at 1000.3
    found = one_leader_per_term(history)
    assert len(found) == 1 and "a (fence 9) valid until" in found[0]
    history.grants[1] = _term("b", 10, 1000.6, 1001.5)
    assert not one_leader_per_term(history)


def test_honest_loss_fires_on_a_refusal_while_a_majority_held_the_token() -> None:
    refused = Loss("a", "k", "t1", at=1001.0, reason="extend refused: 'k': 0/3", deadline=1002.0)
    refused.granted, refused.held = 1000.0, 2
    history = History(servers=3, losses=[refused])
    assert honest_loss(history)
    refused.held = 1  # no majority held it: "not ours" is the truth
    assert not honest_loss(history)
    refused.held = 3
    history.clock_breaks = [1000.5]  # a clock past its bound may have expired it meanwhile
    assert not honest_loss(history)
    history.clock_breaks = []
    refused.reason = "fork"  # an inherited lease: lost by design
    assert not honest_loss(history)
    refused.reason = "made up"  # no such loss in the contract
    assert honest_loss(history)


def test_honest_loss_fires_on_a_lease_said_to_have_run_out_before_its_deadline() -> None:
    ran_out = Loss(
        "a",
        "k",
        "t1",
        at=1001.0,
        reason="renewal not confirmed before the local deadline",
        deadline=1002.0,
        granted=1000.0,
        held=3,
    )
    history = History(servers=3, losses=[ran_out])
    assert honest_loss(history)
    ran_out.at = 1002.0  # at its deadline: what the contract says (held or not)
    assert not honest_loss(history)


def test_world_records_a_loss_with_the_servers_that_held_the_token_throughout() -> None:
    world = World(1, Config(servers=3, faults=()))
    world.clock.now = 1001.0
    grant = Grant("a", "k", "tok", 7, at=1000.0, deadline=1005.0, start=1000.0)
    lease = SimpleNamespace(deadline=1005.0, lost_reason="extend refused: 'k'")
    for server in world.servers:
        server.data[b"fencelock:{k}"] = b"tok"
        server.expires[b"fencelock:{k}"] = 1006_000
    world.servers[2].expires[b"fencelock:{k}"] = 1000_500  # expired there
    # an acquire straggler with the token after the grant: it may have set the key anew
    assert world.servers[1].ran is not None
    world.clock.now = 1000.6
    world.servers[1].ran.add((b"sha-acquire", b"tok"))
    world.clock.now = 1001.0
    world.lease_lost(grant, lease)
    (loss,) = world.history.losses
    assert (loss.held, loss.at, loss.deadline) == (1, 1001.0, 1005.0)
    assert not honest_loss(world.history)


def _refusal(**more: object) -> History:
    history = History(servers=3, ttl=2.0, locks_refused=[("b", "k", 1010.0, 1012.0)])
    history.lock_attempts = [("b", "k", 1010.0, 1012.0)]
    for name, value in more.items():
        setattr(history, name, value)
    return history


def test_lock_when_free_fires_on_a_refusal_with_the_key_free_and_no_fault() -> None:
    assert lock_when_free(_refusal())
    assert not lock_when_free(_refusal(fault_windows=[(1006.0, 1006.5)]))  # within 2 ttl + 1
    assert lock_when_free(_refusal(fault_windows=[(1004.0, 1004.9)]))
    assert not lock_when_free(_refusal(restarted_at=[1007.0]))
    other = _refusal()
    other.lock_attempts.append(("c", "k", 1011.0, 1011.5))  # another ask in flight
    assert not lock_when_free(other)
    other.lock_attempts[-1] = ("c", "k2", 1011.0, 1011.5)  # another key's
    assert lock_when_free(other)
    other.lock_attempts[-1] = ("c", "k", 1009.0, 1009.96)  # ended 40 ms before: its cleanup
    assert not lock_when_free(other)


def test_lock_when_free_counts_a_lease_to_its_confirmed_release_or_past_its_deadline() -> None:
    held = Grant("a", "k", "t1", 3, at=1008.0, deadline=1011.0, start=1007.9, ended=1010.5)
    held.release = "ok"
    history = _refusal(grants=[held])
    assert not lock_when_free(history)  # released during the wait
    held.ended = 1009.9
    assert lock_when_free(history)  # released (confirmed) before the ask
    held.release = "Unavailable"  # its key may stay until 1.5 ttl past its deadline
    assert not lock_when_free(history)
    held.deadline, held.ended = 1006.5, 1006.0
    assert lock_when_free(history)


def _rw_refusal(once: bool, **more: object) -> History:
    """b waited for the write lock from 1010 to 1012 (or tried once at 1012): a reader held it
    until its confirmed release at 1010.5."""
    asked = 1012.0 if once else 1010.0
    reader = Grant("a", "rw0", "t1", 3, at=1009.0, deadline=1011.0, start=1008.9, ended=1010.5)
    reader.release, reader.kind = "ok", "read"
    history = History(servers=3, ttl=2.0, grants=[reader])
    history.rw_refused = [("b", "write", once, asked, 1012.0)]
    history.rw_attempts = [("a", 1008.9, 1009.0), ("b", asked, 1012.0)]
    for name, value in more.items():
        setattr(history, name, value)
    return history


def test_rw_when_free_fires_on_a_writer_refused_a_second_after_the_last_reader_left() -> None:
    assert rw_when_free(_rw_refusal(once=False))
    assert not rw_when_free(_rw_refusal(once=False, fault_windows=[(1007.0, 1007.5)]))
    assert not rw_when_free(_rw_refusal(once=False, restarted_at=[1011.0]))
    late = _rw_refusal(once=False)
    late.grants[0].ended = 1011.2  # released 0.8 s before the refusal: a wake may be on its way
    assert not rw_when_free(late)
    late.grants[0].release = "Unavailable"  # not confirmed: it may hold its key 1.5 ttl longer
    late.grants[0].ended = 1009.5
    assert not rw_when_free(late)


def test_rw_when_free_fires_on_one_attempt_refused_on_a_free_lock_only() -> None:
    """The mutant rw-first-attempt-marked: a writer granted after a refusal left its intent
    marker, which stops the readers after it."""
    history = _rw_refusal(once=True)
    assert rw_when_free(history)
    history.rw_refused = [("b", "read", True, 1012.0, 1012.0)]
    assert rw_when_free(history)
    history.rw_attempts.append(("c", 1011.0, 1011.9))  # a writer refused 100 ms before:
    assert not rw_when_free(history)  # its intent may stay up to 100 ms past its wait
    history.rw_attempts[-1] = ("c", 1011.0, 1011.8)
    assert rw_when_free(history)


def test_mutual_exclusion_excuses_a_wipe_only_where_the_process_never_saw_it() -> None:
    """Seed 900009971 (``--cancel --fork --store --reentrant-hold``): c1 held k0 on sim1 and
    sim2; sim2 restarted empty; c0's process reached sim2 for the first time after that (its
    reentrant task asked late) and took k0 on sim0 and sim2. restart_delay knows only restarts
    a process saw (docs/deploying.md): documented, so not flagged. A process that had reached
    sim2 before the wipe must not count its vote: flagged."""
    history = History(
        servers=3,
        grants=[
            Grant("c1/j0/t0", "k0", "t1", 10, at=0.01, deadline=1.33, ended=1.3, start=0.0),
            Grant("c0/j0/t0", "k0", "t2", 20, at=0.54, deadline=4.4, ended=1.4, start=0.5),
        ],
        wiped_at=[0.37],
        wiped=[(0.37, 2)],
        contacts={("c1", 0): 0.0, ("c1", 1): 0.0, ("c1", 2): 0.0, ("c0", 2): 0.5},
    )
    assert not mutual_exclusion(history)
    history.contacts[("c0", 2)] = 0.2  # c0 saw sim2 before it was wiped
    assert mutual_exclusion(history)
    history.contacts[("c0", 2)] = 0.5
    history.wiped = [(0.37, 1)]  # the wiped one is sim1, which c0 never reached: excused
    assert not mutual_exclusion(history)
    history.contacts[("c0", 1)] = 0.1
    assert mutual_exclusion(history)
