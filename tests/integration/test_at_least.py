"""``hold(at_least=S)``: a short job keeps its lock until S seconds after the acquisition, so
another host cannot run it again too soon; then the lock is free. Both front ends."""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import math
import subprocess
import sys
import time
from typing import Any

import pytest
from api import LockFactory, front, make_lock  # noqa: F401

from fencelock import ConfigError, Lock

AT_LEAST = 2.0
# another process waits for the lock and prints the monotonic time it got it
# (time.monotonic() is system-wide on Linux, so the two processes' readings compare)
RIVAL = """
import sys, time
from fencelock import Lock
lease = Lock(sys.argv[1], sys.argv[2], ttl=5).acquire(wait=10)
print(time.monotonic(), flush=True)
lease.release()
"""


def test_a_short_job_with_at_least_blocks_another_host_until_then(
    topologies: Any, make_lock: LockFactory, key: str
) -> None:
    url = topologies.urls(1)[0]
    lock = make_lock(url, key, ttl=1.0)  # shorter than at_least: kept alive by renewal
    with lock.hold(wait=1, at_least=AT_LEAST) as lease:
        acquired_at = lease.acquired_at
        time.sleep(0.05)  # the job
    ended = time.monotonic()
    assert ended - acquired_at < AT_LEAST / 2
    assert Lock(url, key, ttl=1.0).try_acquire() is None  # still held after the block
    rival = subprocess.run(
        [sys.executable, "-c", RIVAL, url, key],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    granted_at = float(rival.stdout.split()[0])
    assert granted_at >= acquired_at + AT_LEAST - 0.01
    assert granted_at - acquired_at < AT_LEAST + 2.0  # liveness bound: released, not expired
    other = Lock(url, key, ttl=1.0).try_acquire()  # and then it is free
    assert other is not None
    other.release()


def test_a_job_longer_than_at_least_releases_when_it_ends(
    topologies: Any, make_lock: LockFactory, key: str
) -> None:
    url = topologies.urls(1)[0]
    lock = make_lock(url, key, ttl=5.0)
    with lock.hold(wait=1, at_least=0.1):
        time.sleep(0.15)
    other = Lock(url, key, ttl=1.0).try_acquire()
    assert other is not None
    other.release()


def test_a_failed_job_keeps_the_lock_too(topologies: Any, make_lock: LockFactory, key: str) -> None:
    url = topologies.urls(3)
    lock = make_lock(url, key, ttl=5.0)
    with pytest.raises(RuntimeError), lock.hold(wait=1, at_least=0.5):
        raise RuntimeError("job failed")
    assert Lock(url, key, ttl=1.0).try_acquire() is None
    lease = Lock(url, key, ttl=1.0).acquire(wait=5)  # released at 0.5 s, waiters woken
    lease.release()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "2"])
def test_a_bad_at_least_is_a_config_error(
    topologies: Any, make_lock: LockFactory, key: str, bad: Any
) -> None:
    lock = make_lock(topologies.urls(1), key, ttl=5.0)
    with pytest.raises(ConfigError), lock.hold(wait=1, at_least=bad):
        pass
    with pytest.raises(ConfigError), lock.hold(wait=1, max_hold=1.0, at_least=2.0):
        pass
