"""Issue 21 item 21 (pure part): with ``replicas=k``, an extend or a release of a lease
already granted also counts when every replica the server has acknowledged it (its ``ROLE``
lists them), fewer than k included; a new grant still needs k."""

from __future__ import annotations

from fencelock._core.effects import Replicated
from fencelock._core.plan import LockPlan, make_plan
from fencelock._core.quorum import Outcome
from fencelock._core.replies import (
    REPL_TIMEOUT_MS,
    NotReplicated,
    classify_acquire,
    classify_extend,
    replica_count,
    replicated,
    with_wait,
)
from fencelock._engine.resp import ReplyError

NO_REPLICA = [b"master", 1234, []]
ONE_REPLICA = [b"master", 1234, [[b"127.0.0.1", b"7001", b"1200"]]]


def test_replica_count_reads_a_primarys_role_only() -> None:
    assert replica_count(NO_REPLICA) == 0
    assert replica_count(ONE_REPLICA) == 1
    assert replica_count([b"slave", b"127.0.0.1", 7000, b"connected", 10]) is None
    assert replica_count(ReplyError("NOPERM no role")) is None
    assert replica_count(None) is None


def test_a_held_extend_counts_when_every_replica_the_server_has_acknowledged() -> None:
    held = replicated(classify_extend, 1, 450, held=True)
    assert held(Replicated(1, 0, NO_REPLICA))[0] is Outcome.GRANTED  # a promoted primary
    assert held(Replicated(1, 1, ONE_REPLICA))[0] is Outcome.GRANTED
    outcome, detail = held(Replicated(1, 0, ONE_REPLICA))  # a replica that lags
    assert outcome is Outcome.ERROR and isinstance(detail, NotReplicated)
    outcome, _ = held(Replicated(1, 0, ReplyError("NOPERM")))  # ROLE not allowed: strict
    assert outcome is Outcome.ERROR
    outcome, _ = held(Replicated(1, 0))  # no ROLE asked: strict
    assert outcome is Outcome.ERROR


def test_a_new_grant_still_needs_k_acknowledgements() -> None:
    grant = replicated(classify_acquire, 1, 450)
    outcome, detail = grant(Replicated([1, 500], 0, NO_REPLICA))
    assert outcome is Outcome.ERROR and isinstance(detail, NotReplicated)


def test_the_relaxed_rule_is_for_leases_shorter_than_the_servers_repl_timeout() -> None:
    def plan(ttl_s: float) -> LockPlan:
        return make_plan(
            "k", ("s0",), ttl_s=ttl_s, drift_factor=0.01, drift_min_s=0.002,
            server_timeout_s=0.5, retry_base_s=0.01, retry_cap_s=0.5,
            handoff_window_s=0.05, wake_lifetime_s=5.0, replicas=1,
        )  # fmt: skip

    short = with_wait(plan(REPL_TIMEOUT_MS / 1000 - 1), classify_extend, held=True)
    long = with_wait(plan(REPL_TIMEOUT_MS / 1000), classify_extend, held=True)
    assert short(Replicated(1, 0, NO_REPLICA))[0] is Outcome.GRANTED
    assert long(Replicated(1, 0, NO_REPLICA))[0] is Outcome.ERROR
