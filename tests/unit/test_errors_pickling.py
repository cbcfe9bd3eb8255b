"""Errors survive pickling with their evidence (process pools, Celery's pickled results)."""

from __future__ import annotations

import pickle

from fencelock.errors import ConfigError, LockLost, NotAcquired, ServerVote, StaleFence, Unavailable


def test_round_errors_keep_their_class_key_votes_and_message_through_pickle() -> None:
    votes = [ServerVote("a:1/0", "held", pttl_ms=5), ServerVote("b:1/0", "error", OSError("x"))]
    for cls in (NotAcquired, Unavailable):
        error = cls("k", "'k': 0/2 servers agreed", votes, attempts=3)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is cls
        assert (copy.key, copy.attempts, str(copy)) == ("k", 3, str(error))
        assert [v.server for v in copy.votes] == ["a:1/0", "b:1/0"]


def test_lease_and_fence_errors_keep_their_fields_through_pickle() -> None:
    lost = pickle.loads(pickle.dumps(LockLost("k", "'k': lease lost")))
    assert type(lost) is LockLost and lost.key == "k" and str(lost) == "'k': lease lost"
    stale = pickle.loads(pickle.dumps(StaleFence("r", 1, 2)))
    assert (stale.resource, stale.offered, stale.current) == ("r", 1, 2)
    config = pickle.loads(pickle.dumps(ConfigError("bad ttl")))
    assert type(config) is ConfigError and str(config) == "bad ttl"
