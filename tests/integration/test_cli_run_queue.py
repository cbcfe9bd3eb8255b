"""``fencelock run`` waits as one waiter: it keeps its place in line, and a signal still ends
the wait at once, leaving nothing held. Real server, real ``fencelock run`` processes.

Who is blocked on the wake list is read from the server (``CLIENT LIST``: ``cmd=blmove``), so
each waiter is known to be in line before the next one comes; every server is the test's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from fencelock import Lease, Lock
from fencelock.testing import Server

DEADLINE = 30.0  # generous: the machine is shared
ROUNDS = 3
# the old ``run`` joined the line anew every 0.25 s: after this long it had done so twice
RE_JOINED_S = 0.8
SH = "/bin/sh"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE} s waiting for {what}")
        time.sleep(0.02)


def blocked(client: redis.Redis) -> int:
    """Clients blocked on a wake list (claiming waiters)."""
    return sum(1 for entry in client.client_list() if entry.get("cmd") == "blmove")


class LibraryWaiter:
    """``Lock.acquire(wait=...)`` in a thread; writes ``B`` to ``order`` while holding."""

    def __init__(self, server: Server, key: str, order: Path) -> None:
        self.lock = Lock(server.url, key, ttl=30.0)
        self.order = order
        self.granted_at: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            lease = self.lock.acquire(wait=DEADLINE)
            self.granted_at = time.monotonic()
            with self.order.open("a") as out:
                out.write("B\n")
            lease.release()
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> float:
        self.thread.join(DEADLINE * 2)
        assert not self.thread.is_alive(), "the library waiter is still waiting"
        self.lock.close()
        if self.error is not None:
            raise self.error
        assert self.granted_at is not None
        return self.granted_at


@pytest.fixture
def client(fencelock_server: Server) -> Iterator[redis.Redis]:
    c = fencelock_server.client()
    yield c
    c.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:  # by their own PIDs only
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=DEADLINE)


def start_run(
    procs: list[subprocess.Popen[str]], server: Server, key: str, script: str
) -> subprocess.Popen[str]:
    argv = [
        sys.executable, "-m", "fencelock", "run", "--key", key, "--ttl", "30", "--wait", "60",
        "--server", server.url, "--", SH, "-c", script,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )
    procs.append(proc)
    return proc


def hold(server: Server, key: str) -> tuple[Lock, Lease]:
    lock = Lock(server.url, key, ttl=60.0)
    return lock, lock.acquire(wait=0)


def test_a_waiting_run_keeps_its_place_ahead_of_a_library_waiter_that_came_later(
    fencelock_server: Server,
    client: redis.Redis,
    tmp_path: Path,
    procs: list[subprocess.Popen[str]],
) -> None:
    for round_ in range(ROUNDS):
        key = f"run-queue-{uuid.uuid4().hex[:12]}"
        order = tmp_path / f"order-{round_}"
        holder_lock, holder = hold(fencelock_server, key)
        run = start_run(procs, fencelock_server, key, f'echo A >> "{order}"')
        wait_for(lambda: blocked(client) == 1, "fencelock run in line")
        waiter = LibraryWaiter(fencelock_server, key, order)
        wait_for(lambda: blocked(client) == 2, "the library waiter in line behind it")
        time.sleep(RE_JOINED_S)  # long enough for a run that joins the line anew to have
        assert run.poll() is None
        holder.release()
        holder_lock.close()
        _, err = run.communicate(timeout=DEADLINE)
        assert run.returncode == 0, err
        waiter.join()
        assert order.read_text().split() == ["A", "B"], f"round {round_}: {err}"


def test_sigterm_to_a_waiting_run_ends_it_at_once_and_the_next_waiter_gets_the_lock(
    fencelock_server: Server,
    client: redis.Redis,
    tmp_path: Path,
    procs: list[subprocess.Popen[str]],
) -> None:
    key = f"run-queue-{uuid.uuid4().hex[:12]}"
    marker, order = tmp_path / "ran", tmp_path / "order"
    holder_lock, holder = hold(fencelock_server, key)
    run = start_run(procs, fencelock_server, key, f'touch "{marker}"')
    wait_for(lambda: blocked(client) == 1, "fencelock run in line")
    waiter = LibraryWaiter(fencelock_server, key, order)
    wait_for(lambda: blocked(client) == 2, "the library waiter in line behind it")
    signalled = time.monotonic()
    run.send_signal(signal.SIGTERM)
    # the hand-over races the signal: a grant run claims as it stops is handed on at once
    holder.release()
    released = time.monotonic()
    holder_lock.close()
    _, err = run.communicate(timeout=DEADLINE)
    took = time.monotonic() - signalled
    assert run.returncode == 128 + signal.SIGTERM, err
    assert "before the command started" in err
    assert took < 2.0, f"run took {took:.3f} s to stop: {err}"
    assert not marker.exists()
    granted_at = waiter.join()
    # not left to run's 30 s ttl, nor to the holder's 60 s
    assert granted_at - released < 2.0
    assert order.read_text().split() == ["B"]
    assert client.exists(f"fencelock:{{{key}}}") == 0
