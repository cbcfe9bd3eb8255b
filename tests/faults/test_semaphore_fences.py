"""Two permits of one semaphore granted at once over 3 servers never share a fence.

Regression (found by `fencelock chaos --primitive semaphore` after a clock jump): with fence
registers ahead of the servers' clocks, permit A (granted on servers 0 and 1) and permit B
(granted on servers 1 and 2, while A's fence commit was still on its way to server 1) both
merged the same fence, and the commit round accepted a register already at that fence. A's
link to server 1 is slowed (a proxy with latency) so that B runs inside that window, every
time; servers 2 (for A) and 0 (for B) refuse connections.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import fencelock
from fencelock._core.keys import lock_keys, slot_keys
from fencelock.testing import refused_url
from fencelock.testing.proxy import Proxy

BOUND = 20.0  # liveness bound (s), never a speed assertion
LATENCY_MS = 400.0


def test_permits_granted_at_once_on_different_majorities_get_different_fences(
    fencelock_servers: Any,
) -> None:
    group = fencelock_servers(3)
    s0, s1, s2 = group.servers
    name = f"sem-fences-{time.monotonic_ns()}"
    fence_key = lock_keys(name).fence
    ahead = time.time_ns() // 1000 + 10**9  # registers 1000 s ahead of the clocks
    for server in (s0, s2):
        server.client().set(fence_key, ahead)
    s2.client().set(slot_keys(name, 0).lock, "someone-else", px=60_000)  # slot 0 taken on s2
    proxy = Proxy(s1.host, s1.port, name="a->s1", password=s1.password).start()
    try:
        a_client = fencelock.Client(
            [s0.url, proxy.url, refused_url()], ttl=30.0, server_timeout=5.0
        )
        b_client = fencelock.Client([refused_url(), s1.url, s2.url], ttl=30.0)
        for client in (a_client, b_client):  # connections, identities and scripts warm
            client.semaphore(f"{name}-warm", limit=2).acquire(wait=0).release()
        proxy.latency(LATENCY_MS)
        got: list[Any] = []
        a = threading.Thread(
            target=lambda: got.append(a_client.semaphore(name, limit=2).acquire(wait=0))
        )
        a.start()
        deadline = time.monotonic() + BOUND
        while s1.client().get(slot_keys(name, 0).lock) is None:  # A's grant reached s1
            assert time.monotonic() < deadline, "A's grant never reached server 1"
            time.sleep(0.005)
        b = b_client.semaphore(name, limit=2).acquire(wait=0)  # inside A's commit window
        a.join(BOUND)
        assert not a.is_alive() and len(got) == 1
        (first,) = got
        assert (first.slot, b.slot) == (0, 1)
        assert first.valid and b.valid  # two permits at once, as a limit of 2 allows
        assert b.fence > ahead and first.fence > ahead
        assert first.fence != b.fence
        assert first.fence > b.fence  # A's commit ended last: its fence is the larger
        for lease in (first, b):
            lease.release()
        a_client.close()
        b_client.close()
    finally:
        proxy.stop()
