"""Crash + restart of a lock server (F8, F17), three ways, on 3 servers:

holder A holds on {0, 1} only (server 2 cut off while A acquires), then server 1 is killed
(``kill -9``) and restarted, and B tries to take the lock on {1, 2} while A's lease is valid.

- ``appendfsync always``: server 1 comes back with A's key -> B is refused: no double grant;
- no persistence, immediate restart, ``restart_delay=False`` (the canary: mitigations off):
  server 1 comes back empty -> B is granted while A's lease is valid: the overlap checker must
  report a double grant;
- the same with ``restart_delay`` (the default for N > 1): server 1's grant does not count while
  its uptime is below the ttl -> B is refused: no double grant;
- no persistence, restart after more than the TTL: A's lease has ended when B gets it.

Fences never go backwards: even the double grant hands B a larger fence (the TIME floor), so
fenced storage still refuses A.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from fencelock import Lease, Lock, NotAcquired
from fencelock.cli.chaos.checkers import Op, check_fences, check_lease_overlap, lease_windows
from fencelock.cli.chaos.nemesis import Topology
from fencelock.testing import Persistence

TTL = 4.0


def lease_ops(worker: int, lease: Lease, invoked_ns: int, acquired_ns: int) -> list[Op]:
    until = acquired_ns + int(lease.remaining() * 1e9)
    return [Op(worker, 1, "acquire", "ok", invoked_ns, acquired_ns, lease.fence, None, until)]


def crash_scenario(
    persistence: Persistence, restart_delay: float, *, delay_votes: bool = True
) -> tuple[list[Op], bool]:
    """Returns A's and B's acquisitions as a history, and whether B got the lock
    (``delay_votes``: the locks' ``restart_delay`` option)."""
    topo = Topology(3, persistence=persistence).start()
    a = Lock(topo.lock_urls, "crash", ttl=TTL, server_timeout=0.2, restart_delay=delay_votes)
    b = Lock(topo.lock_urls, "crash", ttl=TTL, server_timeout=0.2, restart_delay=delay_votes)
    try:
        topo.proxies[2].blackhole()
        t = time.monotonic_ns()
        lease_a = a.acquire(wait=1.0)
        ops = lease_ops(0, lease_a, t, time.monotonic_ns())
        topo.heal_network()
        topo.servers[1].kill()
        time.sleep(restart_delay)
        topo.servers[1].restart()
        t = time.monotonic_ns()
        try:
            # wait=1 s (< A's 4 s lease): a retry absorbs one vote lost to a connection the
            # crash closed; B still tries only while A's lease is valid
            lease_b = b.acquire(wait=1.0)
        except NotAcquired:
            return ops, False
        ops += lease_ops(1, lease_b, t, time.monotonic_ns())
        if restart_delay < TTL:
            assert lease_a.valid  # two valid leases at once
        assert lease_b.fence > lease_a.fence  # fencing still holds the line
        return ops, True
    finally:
        a.close()
        b.close()
        topo.stop()


def test_crash_restart_with_appendfsync_always_grants_no_second_lease() -> None:
    ops, b_granted = crash_scenario("aof-always", restart_delay=0.05)
    assert not b_granted
    assert check_lease_overlap(lease_windows(ops)).double_grants == 0


def test_canary_crash_immediate_restart_without_persistence_double_grants() -> None:
    ops, b_granted = crash_scenario("none", restart_delay=0.05, delay_votes=False)
    assert b_granted
    overlap = check_lease_overlap(lease_windows(ops))
    assert overlap.double_grants == 1  # the checker sees two valid leases at once
    assert check_fences(ops).ok  # ... but fences still only grow


def test_crash_immediate_restart_with_restart_delay_grants_no_second_lease() -> None:
    ops, b_granted = crash_scenario("none", restart_delay=0.05, delay_votes=True)
    assert not b_granted  # server 1's grant did not count: {1, 2} is no majority
    assert check_lease_overlap(lease_windows(ops)).double_grants == 0


def test_crash_delayed_restart_without_persistence_grants_no_overlapping_lease() -> None:
    ops, b_granted = crash_scenario("none", restart_delay=TTL + 0.5)
    assert b_granted  # A's lease ran out while server 1 was down
    assert check_lease_overlap(lease_windows(ops)).double_grants == 0


@pytest.mark.parametrize("persistence", ["none", "aof-always"])
def test_fences_do_not_go_backwards_after_a_wiped_restart(persistence: Persistence) -> None:
    topo = Topology(1, persistence=persistence).start()
    lock = Lock(topo.lock_urls, "crash-fence", ttl=1.0)
    try:
        before = lock.acquire(wait=1.0)
        before.release()
        topo.servers[0].kill()
        topo.servers[0].restart(wipe=True)  # the fence register F is gone
        after = lock.acquire(wait=2.0)
        after.release()
        assert after.fence > before.fence
    finally:
        lock.close()
        topo.stop()


def test_asyncio_locks_also_do_not_count_a_restarted_servers_grant() -> None:
    """The same crash over the asyncio front end (restart_delay left to its default)."""
    aio = pytest.importorskip("fencelock.asyncio")

    async def scenario(topo: Topology) -> tuple[bool, bool]:
        a = aio.Lock(topo.lock_urls, "crash-async", ttl=TTL, server_timeout=0.2)
        b = aio.Lock(topo.lock_urls, "crash-async", ttl=TTL, server_timeout=0.2)
        topo.proxies[2].blackhole()
        lease_a = await a.acquire(wait=1.0)
        topo.heal_network()
        topo.servers[1].kill()
        topo.servers[1].restart()
        try:
            await b.acquire(wait=1.0)
        except NotAcquired as exc:
            causes = [str(v.cause) for v in exc.votes if v.outcome == "error"]
            return False, any("restart_delay" in cause for cause in causes)
        finally:
            assert lease_a.valid
        return True, False

    topo = Topology(3, persistence="none").start()
    try:
        b_granted, delayed = asyncio.run(scenario(topo))
    finally:
        topo.stop()
    assert not b_granted
    assert delayed  # refused because server 1's vote was held back, not by chance
