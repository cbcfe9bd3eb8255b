"""Pauses: a holder process stopped past its TTL (F1) and a paused lock server (F13).

F1 is run on the real chaos machinery (worker processes, SIGSTOP by PID, the nemesis) with a
fixed seed; its canary twin is the unfenced register written by the same workers in the same
run, which must show the lost update that fencing prevents.
"""

from __future__ import annotations

import time

import pytest

from fencelock import Lock, Unavailable
from fencelock.cli.chaos.cli import ChaosConfig, run_chaos
from fencelock.testing import ServerGroup


def test_holder_pause_fencing_refuses_stale_writes_and_the_canary_loses_updates() -> None:
    config = ChaosConfig(servers=3, workers=3, duration=9.0, faults=("pause-holder",),
                         seed=11, ttl=1.0, work_s=0.2)
    result, records = run_chaos(config)
    log = "\n".join(str(r) for r in records)
    assert result.faults.get("pause-holder", 0) >= 2, log
    # fenced register: nothing stale got in, nothing acknowledged got lost ...
    assert result.stale_writes_accepted == 0, log
    assert result.lost_updates == 0, log
    assert result.details["phantom_writes"] == 0
    # ... because the store refused the paused holders' late writes
    assert result.stale_writes_rejected >= 1, log
    # canary twin (no fence): the same pauses lose acknowledged updates
    assert result.unfenced_overlaps >= 1, log
    assert result.details["canary_lost_updates"] >= 1, log
    # the lock itself never granted two valid leases: pauses are the holder's problem
    assert result.details["double_grants"] == 0
    assert result.details["fence_violations"] == 0


def test_paused_server_is_skipped_within_the_per_server_timeout() -> None:
    with ServerGroup(3) as group:
        lock = Lock(group.urls, "pause-server", ttl=5.0, server_timeout=0.2)
        try:
            lock.acquire(wait=0).release()  # warm connections
            group[0].pause()
            try:
                started = time.monotonic()
                lease = lock.acquire(wait=0)
                elapsed = time.monotonic() - started
                assert lease.valid
                lease.release()
                # one round: bounded by the per-server timeout (0.2 s), far below redis-py's
                # default retrying (seconds); generous margin for a loaded machine
                assert elapsed < 2.0
                group[1].pause()  # now a majority is paused
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    lock.acquire(wait=0)
                assert time.monotonic() - started < 3.0
            finally:
                for server in group:
                    server.resume()
            # healed. The paused servers apply the queued SET NX of the failed round when they
            # wake, after its cleanup was sent (F4): an orphan, but only until its TTL (5 s)
            started = time.monotonic()
            lock.acquire(wait=5.0 + 3.0).release()
            assert time.monotonic() - started < 5.0 + 3.0
        finally:
            lock.close()
