"""F22: the process forks while it holds a lease, or after its Locks opened connections.

Contract (DESIGN.md v0.3, fork-safe): in a child, inherited connections are never used, and
every inherited lease is reported lost at once (reason "fork"), never renewed, never released;
the parent is untouched. Each test forks with ``os.fork()``;
the child reports one JSON object through a pipe and leaves with ``os._exit``; the parent waits
for it with a bounded ``waitpid`` loop and kills it by PID when it overruns.

- a child renews a lease of its own (sync, and asyncio in a fresh loop);
- a child never uses a connection opened before the fork (checked on the servers: CLIENT LIST
  idle times while the parent is quiet), and parent and child using such Locks at the same
  time never get each other's replies (stress; on the v0.1 engine it fails most runs, not all);
- a lease held in the parent is, in the child, lost at once (reason "fork"), never renewed
  and never released there (v0.3; v0.2 allowed "renewed or lost", which let a child keep a
  dead parent's lock alive); a SIGKILLed parent's lock frees within its TTL while a child lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import fencelock.asyncio as fasync
from fencelock import Lock, LockLost
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock.testing.pytest_plugin import ServerGroupFactory

CHILD_LIMIT_S = 20.0  # a child still running after this long is killed (a hang is a failure)
TTL = 1.0

Report = dict[str, Any]


def fork_child(body: Callable[[], Report]) -> tuple[int, int]:
    """Fork; the child runs ``body`` and writes its report (JSON) to a pipe, then ``_exit``s.
    Returns the child's PID and the read end of the pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 3
        try:
            os.close(read_fd)
            try:
                report = body()
            except BaseException as exc:
                report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            code = 0 if report.get("ok") else 1
            os.write(write_fd, json.dumps(report, default=str).encode()[:60_000])
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def reap(pid: int, read_fd: int, limit_s: float = CHILD_LIMIT_S) -> Report:
    """Wait for the child at most ``limit_s`` (then SIGKILL it) and return its report."""
    status: int | None = None
    chunks: list[bytes] = []
    end = time.monotonic() + limit_s
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([read_fd], [], [], 0.02)
            if ready:
                chunk = os.read(read_fd, 65536)
                if chunk:
                    chunks.append(chunk)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"ok": False, "error": f"child did not finish within {limit_s} s (killed)"}
        while select.select([read_fd], [], [], 0)[0]:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    raw = b"".join(chunks)
    report: Report = json.loads(raw) if raw else {"ok": False, "error": "the child sent nothing"}
    report["exit_code"] = os.waitstatus_to_exitcode(status)
    return report


def direct_clients(urls: list[str]) -> list[redis.Redis]:
    """Fresh clients of our own (made in the calling process, after any fork)."""
    return [redis.Redis.from_url(u, socket_timeout=2.0, socket_connect_timeout=2.0) for u in urls]


def holders_of(clients: list[redis.Redis], name: str, token: str) -> int:
    """On how many servers the lock ``name`` holds ``token``."""
    key = lock_keys(name).lock
    # the value: the token, then byte 255 and the holder info
    return sum(1 for c in clients if (lock_token(c.get(key)) or b"").decode() == token)


def majority(n: int) -> int:
    return n // 2 + 1


@pytest.fixture(params=[1, 3], ids=["1-server", "3-servers"])
def urls(request: pytest.FixtureRequest, fencelock_servers: ServerGroupFactory) -> list[str]:
    """Fresh servers: a failing fork test may leave mixed-up connections to them behind."""
    return list(fencelock_servers(request.param).urls)


# -- (a) a child renews a lease of its own --------------------------------------------------------


def _hold_in_child(urls: list[str], name: str, hold_s: float) -> Report:
    lock = Lock(urls, name, ttl=TTL)
    with lock.hold(wait=2.0, renew=True) as lease:
        time.sleep(hold_s)
        ours = holders_of(direct_clients(urls), name, lease.token)
        lost = lease.lost.is_set()
        reason = lease.lost_reason
    return {"ok": ours >= majority(len(urls)) and not lost, "servers_holding_our_token": ours,
            "lost": lost, "lost_reason": reason}  # fmt: skip


def test_a_forked_child_keeps_its_own_lease_alive_by_renewal(urls: list[str], key: str) -> None:
    parent = Lock(urls, f"{key}:parent", ttl=TTL)
    with parent.hold(wait=2.0, renew=True) as lease:
        pid, read_fd = fork_child(lambda: _hold_in_child(urls, f"{key}:child", 3 * TTL))
        report = reap(pid, read_fd)
        parent_holds = holders_of(direct_clients(urls), f"{key}:parent", lease.token)
        parent_lost = lease.lost.is_set()
    assert report["ok"], f"child: {report}"
    assert not parent_lost and parent_holds >= majority(len(urls))


def test_a_forked_child_keeps_its_own_asyncio_lease_alive_by_renewal(
    urls: list[str], key: str
) -> None:
    async def warm() -> None:  # the parent used the asyncio front end before the fork
        lock = fasync.Lock(urls, f"{key}:parent-async", ttl=TTL)
        await (await lock.acquire(wait=2.0)).release()

    async def child_main() -> Report:
        lock = fasync.Lock(urls, f"{key}:child", ttl=TTL)
        async with lock.hold(wait=2.0, renew=True) as lease:
            await asyncio.sleep(3 * TTL)
            ours = holders_of(direct_clients(urls), f"{key}:child", lease.token)
            lost = lease.lost.is_set()
        return {"ok": ours >= majority(len(urls)) and not lost,
                "servers_holding_our_token": ours, "lost": lost}  # fmt: skip

    asyncio.run(warm())
    parent = Lock(urls, f"{key}:parent", ttl=TTL)
    with parent.hold(wait=2.0, renew=True) as lease:
        pid, read_fd = fork_child(lambda: asyncio.run(child_main()))
        report = reap(pid, read_fd)
        parent_lost = lease.lost.is_set()
    assert report["ok"], f"child: {report}"
    assert not parent_lost


# -- (b) parent and child use Locks whose connections were opened before the fork -----------------

CYCLES = 100  # per thread
THREADS = 3  # per process, each on a key of its own: more inherited connections in use at once


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic() - 0.005))
    while time.monotonic() < moment:  # the last few ms spun, for a start within microseconds
        pass


SERVER_TIMEOUT = 1.0
# on healthy loopback servers a call this slow means a reply went missing (read by the other
# process on a shared socket), which a majority of 3 would otherwise hide
SLOW_S = SERVER_TIMEOUT / 2


def _cycles(lock: Lock, urls: list[str], name: str, count: int) -> Report:
    """``count`` acquire/release cycles, each checked on the servers directly: the token is on a
    majority, the fence is the one the servers' fence register holds and it only grows, the
    release really freed the key, and no call waited for a missing reply."""
    clients = direct_clients(urls)
    keys = lock_keys(name)
    problems: list[str] = []
    previous = 0
    done = 0
    try:
        for i in range(count):
            began = time.monotonic()
            lease = lock.acquire(wait=2.0)
            if time.monotonic() - began > SLOW_S:
                problems.append(f"cycle {i}: acquire took {time.monotonic() - began:.3f} s")
            ours = holders_of(clients, name, lease.token)
            if ours < majority(len(urls)):
                problems.append(f"cycle {i}: token on {ours}/{len(urls)} servers")
            registers = [int(c.get(keys.fence) or 0) for c in clients]
            if sum(1 for f in registers if f == lease.fence) < majority(len(urls)):
                problems.append(f"cycle {i}: fence {lease.fence}, registers {registers}")
            if lease.fence <= previous:
                problems.append(f"cycle {i}: fence {lease.fence} after {previous}")
            previous = lease.fence
            began = time.monotonic()
            lease.release()
            if time.monotonic() - began > SLOW_S:
                problems.append(f"cycle {i}: release took {time.monotonic() - began:.3f} s")
            left = holders_of(clients, name, lease.token)
            if left:
                problems.append(f"cycle {i}: released, but the token is left on {left} servers")
            done += 1
            if len(problems) >= 5:
                break
    except Exception as exc:
        problems.append(f"after {done} cycles: {type(exc).__name__}: {exc}")
    return {"ok": not problems and done == count, "cycles": done, "problems": problems}


def _fork_lock(urls: list[str], name: str) -> Lock:
    return Lock(urls, name, ttl=5.0, server_timeout=SERVER_TIMEOUT)


def _cycles_in_threads(lock: Lock, urls: list[str], name: str, start_at: float) -> Report:
    """THREADS threads, from ``start_at`` on, each running CYCLES checked cycles on its own key
    of ``lock``'s servers (one Lock per thread, all sharing the servers' connections)."""
    reports: list[Report] = []

    def run(index: int) -> None:
        own = lock if index == 0 else _fork_lock(urls, f"{name}:{index}")
        _sleep_until(start_at)
        reports.append(_cycles(own, urls, own.key, CYCLES))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CHILD_LIMIT_S / 2)
    problems = [p for r in reports for p in r["problems"]]
    ok = len(reports) == THREADS and all(r["ok"] for r in reports)
    return {"ok": ok, "cycles": [r["cycles"] for r in reports], "problems": problems[:5]}


def test_locks_used_before_a_fork_work_in_parent_and_child_at_once(
    urls: list[str], key: str
) -> None:
    mine = _fork_lock(urls, f"{key}:parent")
    theirs = _fork_lock(urls, f"{key}:child")
    for _ in range(3):  # open (and pool) connections to every server before the fork
        mine.acquire(wait=2.0).release()
        theirs.acquire(wait=2.0).release()
    # both start at the same instant (time.monotonic() is system-wide on Linux), so the
    # connections inherited from before the fork are used by both processes at once
    start_at = time.monotonic() + 0.3

    def child() -> Report:
        return _cycles_in_threads(theirs, urls, f"{key}:child", start_at)

    pid, read_fd = fork_child(child)
    parent_report = _cycles_in_threads(mine, urls, f"{key}:parent", start_at)
    child_report = reap(pid, read_fd)
    assert child_report["ok"], f"child: {child_report}"
    assert parent_report["ok"], f"parent: {parent_report}"


QUIET_S = 2.2  # CLIENT LIST's idle is in whole seconds: pre-fork connections idle >= 2 s


def _connections(inspector: redis.Redis) -> dict[int, int]:
    """Client connection id -> idle seconds, the inspector's own left out."""
    me = inspector.client_id()
    return {
        int(c["id"]): int(c["idle"])
        for c in inspector.client_list(_type="normal")
        if int(c["id"]) != me
    }


def test_a_child_never_uses_connections_opened_before_the_fork(urls: list[str], key: str) -> None:
    """Checked deterministically on the servers: the parent stays quiet while the child uses a
    Lock made (and used) before the fork, so any pre-fork connection that was used meanwhile
    was used by the child."""
    lock = _fork_lock(urls, key)
    for _ in range(3):
        lock.acquire(wait=2.0).release()
    inspectors = [redis.Redis.from_url(u, socket_timeout=5.0) for u in urls]
    time.sleep(QUIET_S)
    before = [set(_connections(c)) for c in inspectors]
    assert all(before), "the Lock kept no connection open: nothing to inherit"
    pid, read_fd = fork_child(lambda: _cycles(lock, urls, key, 20))
    report = reap(pid, read_fd)
    used = {
        i: sorted(cid for cid, idle in _connections(c).items() if cid in before[i] and idle < 2)
        for i, c in enumerate(inspectors)
    }
    used = {i: ids for i, ids in used.items() if ids}
    assert report["ok"], f"child: {report}"
    assert used == {}, f"connections opened before the fork were used by the child: {used}"


# -- (c) a lease held in the parent, seen from the child (v0.3: lost at once, reason "fork") -----


def _watch_inherited(lease: Any, urls: list[str], name: str, watch_s: float) -> Report:
    """In the child: the inherited lease is lost at once (reason "fork"), never renewed, and
    its release raises LockLost without touching the parent's key."""
    lost_at_once = lease.lost.is_set() and lease.lost_reason == "fork"
    remaining = lease.remaining()
    try:
        pending = lease.release()
        if asyncio.iscoroutine(pending):  # an asyncio lease: on a loop of the child's own
            asyncio.run(pending)
        released = "no error"
    except LockLost as exc:
        released = f"LockLost: {exc}"
    time.sleep(watch_s)  # a renewal re-armed in the child would run meanwhile
    ours = holders_of(direct_clients(urls), name, lease.token)
    ok = lost_at_once and remaining == 0.0 and released.startswith("LockLost") and ours > 0
    return {"ok": ok, "lost_at_once": lost_at_once, "reason": lease.lost_reason,
            "remaining": remaining, "release": released, "parent_key_on": ours}  # fmt: skip


def test_a_lease_held_across_a_fork_is_lost_at_once_in_the_child(urls: list[str], key: str) -> None:
    lock = Lock(urls, key, ttl=TTL)
    with lock.hold(wait=2.0, renew=True) as lease:
        pid, read_fd = fork_child(lambda: _watch_inherited(lease, urls, key, 2 * TTL))
        report = reap(pid, read_fd)
        parent_holds = holders_of(direct_clients(urls), key, lease.token)
        parent_lost = lease.lost.is_set()
    assert report["ok"], f"child: {report}"
    # the parent's lease is untouched and still renewed
    assert not parent_lost and parent_holds >= majority(len(urls))


def test_an_asyncio_lease_held_across_a_fork_is_lost_at_once_in_the_child(
    urls: list[str], key: str
) -> None:
    async def scenario() -> tuple[Report, int, bool]:
        lock = fasync.Lock(urls, key, ttl=TTL)
        async with lock.hold(wait=2.0, renew=True) as lease:
            pid, read_fd = fork_child(lambda: _watch_inherited(lease, urls, key, 0.0))
            report = await asyncio.get_running_loop().run_in_executor(None, reap, pid, read_fd)
            await asyncio.sleep(2 * TTL)  # the parent keeps renewing
            holds = holders_of(direct_clients(urls), key, lease.token)
            return report, holds, lease.lost.is_set()

    report, parent_holds, parent_lost = asyncio.run(scenario())
    assert report["ok"], f"child: {report}"
    assert not parent_lost and parent_holds >= majority(len(urls))


_PARENT = """
import os, sys, time
from fencelock import Lock
lock = Lock(sys.argv[1].split(","), sys.argv[2], ttl=float(sys.argv[3]))
lease = lock.acquire(wait=5.0)
lease.keep_alive()
child = os.fork()
if child == 0:
    time.sleep(float(sys.argv[4]))  # a worker that outlives its parent
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_a_killed_parents_lock_frees_within_its_ttl_while_a_forked_child_lives(
    urls: list[str], key: str
) -> None:
    import subprocess
    import sys

    child_lives_s = 8.0
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT, ",".join(urls), key, str(TTL), str(child_lives_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        clients = direct_clients(urls)
        name = lock_keys(key).lock
        assert sum(1 for c in clients if c.exists(name)) >= majority(len(urls))
        proc.kill()  # SIGKILL: the parent cannot release
        proc.wait(5)
        killed_at = time.monotonic()
        while sum(1 for c in clients if c.exists(name)) >= majority(len(urls)):
            # a child that renewed its parent's lease would keep it until it exits (8 s)
            assert time.monotonic() - killed_at < TTL + 1.0, "the forked child kept the lock"
            time.sleep(0.02)
        os.kill(child, 0)  # the child is still alive: it did not free the lock by exiting
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


# -- (f) a server the parent suspected is not skipped for good by the child -------------------


def _grant_everywhere_in_child(urls: list[str], name: str) -> Report:
    """A new lock's grant reaches every server (within a bound), the one the parent had
    suspected included: nothing in the child probes a suspicion it inherited."""
    time.sleep(0.3)  # the parent resumes the paused server meanwhile
    lock = Lock(urls, name, ttl=10.0, server_timeout=SERVER_TIMEOUT)
    lease = lock.acquire(wait=2.0)
    clients = direct_clients(urls)
    end = time.monotonic() + 2.0
    ours = holders_of(clients, name, lease.token)
    while ours < len(urls) and time.monotonic() < end:
        time.sleep(0.02)
        ours = holders_of(clients, name, lease.token)
    lease.release()
    return {"ok": ours == len(urls), "servers_holding_our_token": ours}


def test_a_child_does_not_skip_a_server_its_parent_suspected(
    fencelock_servers: ServerGroupFactory, key: str
) -> None:
    group = fencelock_servers(3)
    urls = list(group.urls)
    sick = group.servers[0]
    sick.pause()
    try:
        # the paused server times out: suspect in this process, probed by its background
        Lock(urls, key, ttl=5.0, server_timeout=SERVER_TIMEOUT).acquire(wait=0).release()
        pid, read_fd = fork_child(lambda: _grant_everywhere_in_child(urls, key + ":child"))
    finally:
        sick.resume()
    report = reap(pid, read_fd)
    assert report["ok"], report
