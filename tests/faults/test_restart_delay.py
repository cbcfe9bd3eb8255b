"""F25: a server restarts empty while server clocks are skewed (DESIGN "Where it can still fail").

Three servers without persistence, server 0's clock 2 s ahead (libfaketime). Holder A takes the
lock on {0, 1} (server 2 cut off), so its fence comes from server 0's clock: about now + 2 s.
Server 1 is killed and restarted empty. B then asks {1, 2}: neither has a fence register at
A's level (server 1 forgot it, server 2 never got it) and their TIME floors are 2 s behind.

- ``restart_delay=False`` (the canary): B is granted while A's lease is valid, with a fence
  *smaller* than A's: a paused A's writes would be accepted after B's;
- ``restart_delay=True`` (the default for N > 1): server 1's grant does not count until its
  uptime exceeds the ttl, so B is refused while A holds; after A's release B's fence is
  larger; and once server 1's uptime exceeds the ttl it votes again.

Runs only with the valkey-server binary: libfaketime hangs Debian's redis-server 7.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fencelock import Lease, Lock, LockLost, NotAcquired
from fencelock.cli.chaos.nemesis import Topology, faketime_available
from fencelock.cli.doctor import diagnose

TTL = 3.0
LOCK_KEY = "fencelock:{skewed}"
SKEW_S = 2.0

pytestmark = pytest.mark.skipif(
    not faketime_available(),
    reason="needs libfaketime (Debian package faketime) and the valkey-server binary: "
    "libfaketime hangs Debian's redis-server 7",
)


@pytest.fixture
def skewed() -> Iterator[Topology]:
    topo = Topology(3, persistence="none", faketime=True).start()
    try:
        topo.jump_clock(SKEW_S)
        yield topo
    finally:
        topo.stop()


def locks(topo: Topology, *, restart_delay: bool) -> tuple[Lock, Lock]:
    def make() -> Lock:
        return Lock(
            topo.lock_urls, "skewed", ttl=TTL, server_timeout=0.2, restart_delay=restart_delay
        )

    return make(), make()


def a_holds_then_server_1_restarts_empty(topo: Topology, a: Lock) -> tuple[Lease, float]:
    """A's lease and the monotonic time server 1 was restarted (empty)."""
    topo.proxies[2].blackhole()
    lease = a.acquire(wait=1.0)
    topo.heal_network()
    # server 2 timed out during A's round, so it is suspect (not asked) until a background
    # probe sees it healed: wait for that (bounded) so that B later finds it answering
    assert topo.wait_trusted([2], within_s=5.0), "no probe saw server 2 healed"
    topo.servers[1].kill()
    topo.servers[1].restart(wipe=True)
    return lease, time.monotonic()


def test_doctor_sees_the_skew(skewed: Topology) -> None:
    report = diagnose(skewed.direct_urls)
    (clocks,) = [c for c in report["checks"] if c["name"] == "clock_offsets"]
    assert not clocks["ok"] and "NTP" in clocks["detail"]
    offsets = [row["clock_offset_ms"] for row in report["servers"]]
    assert offsets[0] - max(offsets[1:]) > SKEW_S * 1000 * 0.9


def test_canary_without_restart_delay_b_gets_a_smaller_fence_while_a_is_valid(
    skewed: Topology,
) -> None:
    a, b = locks(skewed, restart_delay=False)
    try:
        lease_a, _ = a_holds_then_server_1_restarts_empty(skewed, a)
        lease_b = b.acquire(wait=1.0)  # a retry absorbs a vote lost to the crash's connection
        assert lease_a.valid  # A is still valid...
        assert lease_b.fence < lease_a.fence  # ... and fences went backwards: the regression
    finally:
        a.close()
        b.close()


def test_with_restart_delay_a_restarted_server_does_not_vote_until_its_uptime_exceeds_the_ttl(
    skewed: Topology,
) -> None:
    a, b = locks(skewed, restart_delay=True)
    try:
        lease_a, restarted_at = a_holds_then_server_1_restarts_empty(skewed, a)
        with pytest.raises(NotAcquired) as info:
            b.acquire(wait=1.0)
        assert lease_a.valid  # refused while A was valid
        votes = {vote.server: vote for vote in info.value.votes}
        assert votes[b.servers[0]].outcome == "held"  # A's
        restarted = votes[b.servers[1]]
        assert restarted.outcome == "error" and "restart_delay" in str(restarted.cause)
        # B's grant on the restarted server was a real key: it is released again
        with skewed.servers[1].client() as client:
            deadline = time.monotonic() + 2.0
            while client.get(LOCK_KEY) is not None:
                assert time.monotonic() < deadline, "B's refused grant stayed on server 1"
                time.sleep(0.01)
        with pytest.raises(LockLost):  # A's key is left on server 0 only: a minority
            lease_a.release()  # ... but it is deleted there
        lease_b = b.acquire(wait=1.0)  # on {0, 2}: server 0 had A's fence
        assert lease_b.fence > lease_a.fence
        lease_b.release()
        # uptime is reported in whole seconds, so the delay may last up to 1 s longer
        time.sleep(max(0.0, restarted_at + TTL + 1.2 - time.monotonic()))
        skewed.proxies[0].blackhole()
        lease_c = b.acquire(wait=1.0)  # on {1, 2}: server 1 votes again
        assert lease_c.fence > lease_b.fence
        lease_c.release()
    finally:
        skewed.heal_network()
        a.close()
        b.close()
