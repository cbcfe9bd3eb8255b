"""The family over processes: a holder killed with SIGKILL frees its permit / read lease /
multilock within its ttl, and a holder paused with SIGSTOP past its ttl finds, once resumed,
that its permit was given to someone else and cannot release it (release is owner-checked).

Workers are child Pythons talking over a pipe (stdout lines); they are signalled by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fencelock

TTL = 1.0
WORKER = r"""
import sys, fencelock
urls, kind, key, ttl = sys.argv[1].split(","), sys.argv[2], sys.argv[3], float(sys.argv[4])
if kind == "permit":
    lease = fencelock.Semaphore(urls, key, 2, ttl=ttl).acquire(wait=5)
    lease.keep_alive()
elif kind == "paused_permit":
    lease = fencelock.Semaphore(urls, key, 1, ttl=ttl).acquire(wait=5)
elif kind == "reader":
    lease = fencelock.RWLock(urls, key, ttl=ttl).acquire_read(wait=5)
    lease.keep_alive()
else:
    leases = fencelock.MultiLock(urls, [key + ":a", key + ":b"], ttl=ttl).acquire(wait=5)
    for lease in leases:
        lease.keep_alive()
print("held", lease.fence, flush=True)
line = sys.stdin.readline()  # the parent says when to release
try:
    lease.release()
    print("released", flush=True)
except fencelock.LockLost:
    print("lost", flush=True)
"""


def _spawn(
    tmp_path: Path, urls: list[str], kind: str, key: str
) -> tuple[subprocess.Popen[str], int]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, str(script), ",".join(urls), kind, key, str(TTL)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("held"), line
    return child, int(line.split()[1])


def _stop(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(10)


@pytest.mark.parametrize("kind", ["permit", "reader", "multi"])
@pytest.mark.parametrize("n", [1, 3])
def test_a_killed_holder_gives_its_capacity_back_within_its_ttl(
    topologies: Any, key: str, tmp_path: Path, kind: str, n: int
) -> None:
    urls = topologies.urls(n)
    child, _ = _spawn(tmp_path, urls, kind, key)
    try:
        if kind == "permit":
            sem = fencelock.Semaphore(urls, key, 2, ttl=TTL)
            mine = sem.acquire(wait=0)  # the second permit
            mine.keep_alive()
            assert sem.try_acquire() is None
            take = lambda: sem.acquire(wait=TTL * 3)  # noqa: E731
        elif kind == "reader":
            rw = fencelock.RWLock(urls, key, ttl=TTL)
            assert rw.try_write() is None
            take = lambda: rw.acquire_write(wait=TTL * 3)  # noqa: E731
        else:
            multi = fencelock.MultiLock(urls, [key + ":b"], ttl=TTL)
            assert multi.try_acquire() is None
            take = lambda: multi.acquire(wait=TTL * 3)  # noqa: E731
        time.sleep(TTL * 1.5)  # renewed: still held
        if kind == "permit":
            assert sem.try_acquire() is None
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        taken = take()
        assert time.monotonic() - killed < TTL + 0.5  # no renewal after the kill: the ttl
        if kind == "permit":
            mine.release()
        for lease in taken if isinstance(taken, tuple) else (taken,):
            lease.release()
    finally:
        _stop(child)


@pytest.mark.parametrize("n", [1, 3])
def test_a_paused_permit_holder_cannot_release_the_permit_given_after_its_ttl(
    topologies: Any, key: str, tmp_path: Path, n: int
) -> None:
    urls = topologies.urls(n)
    child, fence = _spawn(tmp_path, urls, "paused_permit", key)
    try:
        os.kill(child.pid, signal.SIGSTOP)
        sem = fencelock.Semaphore(urls, key, 1, ttl=10)
        assert sem.try_acquire() is None
        newer = sem.acquire(wait=TTL * 3)  # the paused holder's ttl ran out
        assert newer.fence > fence  # storage can refuse the paused holder's late writes
        os.kill(child.pid, signal.SIGCONT)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("release\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "lost"
        assert sem.try_acquire() is None  # the old holder freed nothing
        assert newer.remaining() > 5
        newer.release()
    finally:
        _stop(child)
