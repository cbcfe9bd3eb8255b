"""A server's clock jumps forward (F5), portable form: ``PEXPIRE fencelock:{K} 1`` on one node
of the holder's majority. A second majority forms while the first lease is valid; fencing
refuses the old holder's write, and the unfenced canary twin loses an update.

With the Debian ``faketime`` package and the Valkey binary the same is done with a real clock
jump (libfaketime) on server 0."""

from __future__ import annotations

import time

import pytest

from fencelock import Lock, StaleFence
from fencelock.cli.chaos.checkers import (
    Op,
    check_canary,
    check_fenced_register,
    check_lease_overlap,
    lease_windows,
    unfenced_overlaps,
)
from fencelock.cli.chaos.nemesis import Topology, faketime_available
from fencelock.cli.chaos.workload import CANARY_KEY, RESOURCE, decode_count, encode_value
from fencelock.fence import RedisFence
from fencelock.testing import find_server_binary

KEY = "clock"


def now() -> int:
    return time.monotonic_ns()


def jump_scenario(topo: Topology, jump: str) -> list[Op]:
    """A holds on {0,1,2}; node 2's (or 0's) key expires early; B takes {.., 3, 4}; both write
    the fenced register and the canary, A last (it read before B wrote)."""
    # A's lease (10 s) stays valid through B's grant however slowly the steps between run;
    # the jump (PEXPIRE, or 30 s of server 0's clock) still ends its key on one server early
    a = Lock(topo.lock_urls, KEY, ttl=10.0, server_timeout=0.3)
    b = Lock(topo.lock_urls, KEY, ttl=5.0, server_timeout=0.3)
    store = RedisFence(topo.storage.url)
    canary = topo.storage.client()
    ops: list[Op] = []
    try:
        topo.proxies[3].blackhole()
        topo.proxies[4].blackhole()
        t = now()
        lease_a = a.acquire(wait=2.0)
        done = now()
        ops.append(Op(0, 1, "acquire", "ok", t, done, lease_a.fence, None,
                      done + int(lease_a.remaining() * 1e9)))
        topo.heal_network()
        t = now()
        store.advance(RESOURCE, lease_a.fence)
        ops.append(Op(0, 1, "advance", "ok", t, now(), lease_a.fence))
        t = now()
        a_value = decode_count(store.read(RESOURCE)[0])
        ops.append(Op(0, 1, "read", "ok", t, now(), lease_a.fence, a_value))
        a_canary = decode_count(canary.get(CANARY_KEY))
        # the clock of one node of A's majority jumps: A's key there expires
        if jump == "pexpire":
            with topo.servers[2].client() as direct:
                assert direct.pexpire(f"fencelock:{{{KEY}}}", 1)
        else:
            topo.jump_clock(30.0)
        time.sleep(0.05)
        # Servers 3 and 4 timed out while A acquired, so they are suspect (skipped by rounds)
        # until a background probe sees them healed: a probe sent into the black hole waits
        # out its timeout before the next one, so wait for that here (bounded) rather than
        # inside B's acquire
        assert topo.wait_trusted([3, 4], within_s=5.0), "no probe saw 3, 4 healed"
        t = now()
        # a second majority: {2, 3, 4} or {0, 3, 4}
        lease_b = b.acquire(wait=1.5)
        done = now()
        ops.append(Op(1, 1, "acquire", "ok", t, done, lease_b.fence, None,
                      done + int(lease_b.remaining() * 1e9)))
        assert lease_a.valid  # two valid leases at once
        t = now()
        store.advance(RESOURCE, lease_b.fence)
        ops.append(Op(1, 1, "advance", "ok", t, now(), lease_b.fence))
        b_value = decode_count(store.read(RESOURCE)[0])
        b_canary = decode_count(canary.get(CANARY_KEY))
        t = now()
        canary.set(CANARY_KEY, encode_value(b_canary + 1, 1, 1, lease_b.fence))
        ops.append(Op(1, 1, "canary-write", "ok", t, now(), lease_b.fence, b_canary + 1))
        t = now()
        store.write(RESOURCE, lease_b.fence, encode_value(b_value + 1, 1, 1, lease_b.fence))
        ops.append(Op(1, 1, "write", "ok", t, now(), lease_b.fence, b_value + 1))
        # A, still "holding", writes what it computed before B came
        t = now()
        canary.set(CANARY_KEY, encode_value(a_canary + 1, 0, 1, lease_a.fence))
        ops.append(Op(0, 1, "canary-write", "ok", t, now(), lease_a.fence, a_canary + 1))
        t = now()
        with pytest.raises(StaleFence):
            store.write(RESOURCE, lease_a.fence,
                        encode_value(a_value + 1, 0, 1, lease_a.fence))
        ops.append(Op(0, 1, "write", "fail", t, now(), lease_a.fence, a_value + 1, None,
                      "stale"))
        ops.append(Op(0, 1, "release", "ok", now(), now(), lease_a.fence))
        ops.append(Op(1, 1, "release", "ok", now(), now(), lease_b.fence))
        fenced_final = decode_count(store.read(RESOURCE)[0])
        canary_final = decode_count(canary.get(CANARY_KEY))
        fenced = check_fenced_register(ops, fenced_final)
        assert fenced.ok and fenced.rejected == 1  # fencing: nothing lost, the stale one out
        lost = check_canary(ops, canary_final)
        assert lost.lost_updates == 1  # canary twin: B's acknowledged update is gone
        assert unfenced_overlaps(ops) == 1
        assert check_lease_overlap(lease_windows(ops)).double_grants == 1
        return ops
    finally:
        a.close()
        b.close()
        store.close()
        canary.close()


def test_portable_clock_jump_fenced_write_refused_and_canary_loses_an_update() -> None:
    topo = Topology(5, persistence="none").start()
    try:
        jump_scenario(topo, "pexpire")
    finally:
        topo.stop()


@pytest.mark.skipif(not faketime_available(find_server_binary()),
                    reason="needs the `faketime` package and the valkey-server binary")
def test_real_clock_jump_with_libfaketime() -> None:
    topo = Topology(5, persistence="none", faketime=True).start()
    try:
        with topo.servers[0].client() as c:
            before = c.time()[0]
        jump_scenario(topo, "faketime")
        with topo.servers[0].client() as c:
            assert c.time()[0] >= before + 29  # the server's own clock really jumped
    finally:
        topo.stop()
