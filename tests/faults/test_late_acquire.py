"""An acquire that lands after its caller gave up and closed the connection is released
within about its lateness, not left held by nobody for its TTL.

TCP delivers what was written to a connection before its close (the FIN comes after it), so
a request whose caller timed out can still run on the server after the caller closed the
connection and cleaned up: its grant then holds the key for a token nobody has. The flow
releases such an unheard call's token at once and again after gaps doubling from 0.1 s over
the lease (``_core/acquire.py``, ``unheard_repeats``). Before, the asyncio front end
released it once more a second later, and the blocking one never: a grant that landed after
that held the key until its TTL (simulation seed 991000098 with ``--drain-on-close``).

The request is held in its TCP connection by :meth:`Proxy.hold_connections` (``drain``: it
still reaches the server after the client closed); both front ends, ``asyncio.run()`` per job.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import fencelock
import fencelock.asyncio as fasync
from fencelock import Unavailable
from fencelock._core.keys import lock_keys
from fencelock.testing import Server
from fencelock.testing.proxy import Proxy

TTL_S = 10.0  # the lease: a grant left behind would hold the key this long
SERVER_TIMEOUT_S = 0.2
GIVE_UP_S = 1.0  # a straggler still silent this long after its round is abandoned (closed)
# the stuck acquire lands this long after its connection closed: between the repeats at 0.7
# and 1.5 s (and past the asyncio front end's old second release, at 1 s)
LATE_S = 1.1
GONE_WITHIN_S = 4.0  # liveness bound after it landed, far under the TTL (never a speed claim)


def _lands_then_goes(lone_server: Server, draining_proxy: Proxy, lock_key: str) -> None:
    """Deliver the held acquire; it must grant (the key appears, held by nobody's lease),
    then be released well within its TTL."""
    draining_proxy.deliver()
    with lone_server.client() as direct:
        bound = time.monotonic() + GONE_WITHIN_S
        while time.monotonic() < bound and not direct.exists(lock_key):
            time.sleep(0.005)
        landed = time.monotonic()
        assert landed < bound, "the held acquire never landed"
        while time.monotonic() < landed + GONE_WITHIN_S and direct.exists(lock_key):
            time.sleep(0.02)
        left = int(direct.pttl(lock_key))
        assert left == -2, f"the late grant still holds the key: {left} ms of its TTL left"


def test_asyncio_a_late_acquire_after_its_connection_closed_is_released(
    lone_server: Server, draining_proxy: Proxy, key: str
) -> None:
    async def job() -> None:
        lock = fasync.Lock(draining_proxy.url, key, ttl=TTL_S, server_timeout=SERVER_TIMEOUT_S)
        await (await lock.acquire(wait=0)).release()  # the loop's connection is open
        assert draining_proxy.hold_connections() >= 1
        with pytest.raises(Unavailable):
            await lock.acquire(wait=0)

    asyncio.run(job())  # the loop's end closes the straggler's connection
    time.sleep(LATE_S)
    _lands_then_goes(lone_server, draining_proxy, lock_keys(key).lock)


def test_sync_a_late_acquire_after_its_connection_closed_is_released(
    lone_server: Server, draining_proxy: Proxy, key: str
) -> None:
    lock = fencelock.Lock(draining_proxy.url, key, ttl=TTL_S, server_timeout=SERVER_TIMEOUT_S)
    try:
        lock.acquire(wait=0).release()  # an idle connection in the pool
        assert draining_proxy.hold_connections() >= 1
        with pytest.raises(Unavailable):
            lock.acquire(wait=0)
        # the background thread abandons the silent straggler GIVE_UP_S later (its
        # connection closed), and releases what it may have taken from then on
        time.sleep(GIVE_UP_S + LATE_S)
        _lands_then_goes(lone_server, draining_proxy, lock_keys(key).lock)
    finally:
        lock.close()
