"""The fair lock under faults: a waiter killed with SIGKILL at the head of the queue is skipped
within a bounded time (its heartbeat runs out) and the next waiter gets the lock; a server that
restarts empty (a minority) changes neither who is next nor mutual exclusion: the waiters are
still granted in arrival order.

The killed waiter is a child Python (signalled by PID) that says on stdout when it is waiting."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

import fencelock
from fencelock._core.keys import lock_keys
from fencelock.options import FAIR_HEARTBEAT

WAITER = r"""
import sys, fencelock
urls, key = sys.argv[1].split(","), sys.argv[2]
print("waiting", flush=True)
lease = fencelock.Lock(urls, key, ttl=10.0, fair=True).acquire(wait=120)
print("held", lease.fence, flush=True)
sys.stdin.readline()
"""
SKIP_BOUND_S = 10.0  # generous: one heartbeat (3 s) and one refresh period, on a loaded machine
QUEUED_S = 30.0


def queue_key(name: str) -> str:
    return lock_keys(name).lock + ":fair"


def wait_for(check: Any, what: str, bound_s: float = QUEUED_S) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"not within {bound_s} s: {what}")


@pytest.mark.parametrize("n", [pytest.param(1, id="n1"), pytest.param(3, id="n3")])
def test_a_killed_waiter_at_the_head_is_skipped_within_seconds(
    topologies: Any, key: str, n: int, tmp_path: Path
) -> None:
    urls = topologies.urls(n)
    servers = [redis.Redis.from_url(url) for url in urls]
    # one attempt (wait=0) never queues: the queue holds only the waiters below
    holder = fencelock.Lock(urls, key, ttl=10.0, fair=True).acquire(wait=0)
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, str(script), ",".join(urls), key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    got: list[tuple[float, int]] = []
    errors: list[BaseException] = []
    try:
        wait_for(lambda: all(s.zcard(queue_key(key)) == 1 for s in servers), "the child is queued")

        def second() -> None:
            try:
                lease = fencelock.Lock(urls, key, ttl=10.0, fair=True).acquire(wait=60)
                got.append((time.monotonic(), lease.fence))
                lease.release()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        wait_for(lambda: all(s.zcard(queue_key(key)) == 2 for s in servers), "the thread is queued")
        head = [s.zrange(queue_key(key), 0, 0) for s in servers]
        child.kill()  # the head of the queue dies without a word
        child.wait(10)
        released_at = time.monotonic()
        holder.release()
        thread.join(60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert not errors
    assert got, "the waiter behind the dead one never got the lock"
    waited = got[0][0] - released_at
    assert waited < SKIP_BOUND_S
    # it was skipped, not served: it had to wait for the dead head's heartbeat to run out
    assert waited > FAIR_HEARTBEAT / 3
    assert got[0][1] > holder.fence
    for server, first in zip(servers, head, strict=True):
        assert first and not server.zscore(queue_key(key), first[0])
        assert not server.exists(queue_key(key))


def test_waiters_keep_their_order_when_a_minority_restarts_empty(
    fencelock_servers: Any, key: str
) -> None:
    group = fencelock_servers(3)
    urls = group.urls
    servers = [redis.Redis.from_url(url) for url in urls]
    client = fencelock.Client(urls, ttl=10.0, restart_delay=False)
    holder = client.lock(key, fair=True).acquire(wait=0)
    order: list[int] = []
    errors: list[BaseException] = []

    def waiter(i: int) -> None:
        try:
            with client.lock(key, fair=True).hold(wait=60):
                order.append(i)
        except BaseException as exc:
            errors.append(exc)

    threads = []
    for i in range(3):
        thread = threading.Thread(target=waiter, args=(i,))
        thread.start()
        threads.append(thread)
        wait_for(
            lambda i=i: all(s.zcard(queue_key(key)) == i + 1 for s in servers),
            f"waiter {i} queued",
        )
    group.servers[0].kill()
    group.servers[0].restart(wipe=True)  # a crash without persistence: its queue is gone
    fresh = redis.Redis.from_url(group.servers[0].url)
    # the waiters reach it again (the head takes the free key there, a minority, and lets go)
    wait_for(lambda: fresh.exists(lock_keys(key).fence), "the waiters reach the restarted server")
    holder.release()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert order == [0, 1, 2]
