"""F26: a server restarts empty between two uses of one process, and the next use comes on a
connection that never saw the old one fail: a new event loop (``asyncio.run()`` per job), or
a new blocking connection while the pooled ones are busy in other threads.

The rule (DESIGN.md v0.3): a vote counts only from a connection whose server identity (run id,
uptime, role) was checked on that connection. Before the rule, such a connection skipped INFO
and ROLE when the last handshake had gone well, the restart went unseen, ``restart_delay`` did
not apply, and a second majority formed while another process's lease was valid.

Sequence: this process uses the lock once (identities known); a holder process takes it on
all three servers with a long ttl; servers 0 and 1 are killed and restarted empty; this
process asks again: servers 0 and 1 would grant (their keyspace is empty), server 2 says held.
With the rule, both restarted servers' grants are discounted and the acquire is refused.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

import fencelock.asyncio as fl_async
from fencelock import Lock, Unavailable
from fencelock._engine.registry import resolve
from fencelock.testing import ServerGroup

TTL = 10.0
KEY = "new-connection-identity"

HOLDER = textwrap.dedent(
    """
    import sys
    from fencelock import Lock
    lock = Lock(sys.argv[1].split(","), sys.argv[2], ttl=float(sys.argv[3]))
    lease = lock.acquire(wait=5.0)
    print(lease.fence, flush=True)
    sys.stdin.readline()  # hold until told
    """
)


@pytest.fixture
def group() -> Iterator[ServerGroup]:
    with ServerGroup(3) as servers:
        yield servers


def _holder(group: ServerGroup) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, ",".join(group.urls), KEY, str(TTL)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip().isdigit(), "the holder process did not acquire"
    return proc


def _restart_two_empty(group: ServerGroup) -> None:
    """kill -9 and a wiped restart of servers 0 and 1, as another machine's operator would
    do it: the test kit tells this process's engine of restarts it makes (so that tests do
    not inherit each other's state), which a real restart never does, so that is undone."""
    for server in group.servers[:2]:
        server.kill()
        server.restart(wipe=True)
    for url in group.urls:
        for engine_server in resolve(url):
            engine_server.recheck = False


def _stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def test_a_new_event_loop_sees_a_restart_between_two_jobs(group: ServerGroup) -> None:
    async def job() -> int | None:
        lock = fl_async.Lock(group.urls, KEY, ttl=TTL, server_timeout=0.5)
        lease = await lock.try_acquire()
        if lease is None:
            return None
        fence = lease.fence
        await lease.release()
        return fence

    assert asyncio.run(job()) is not None  # job 1: every server identified
    holder = _holder(group)
    try:
        _restart_two_empty(group)
        with pytest.raises(Unavailable) as info:  # job 2, a new loop: refused while H holds
            asyncio.run(job())
        causes = [str(vote.cause) for vote in info.value.votes if vote.outcome == "error"]
        assert sum("restart_delay" in cause for cause in causes) == 2, causes
        with group.servers[2].client() as client:
            assert client.exists(f"fencelock:{{{KEY}}}") == 1  # the holder's key is untouched
    finally:
        _stop(holder)


def test_a_new_blocking_connection_sees_a_restart(group: ServerGroup) -> None:
    lock = Lock(group.urls, KEY, ttl=TTL, server_timeout=0.5, wait=0.0)
    lock.acquire().release()  # every server identified
    holder = _holder(group)
    try:
        _restart_two_empty(group)
        # the pooled connections are in use elsewhere (other threads of this process): this
        # caller gets new ones, made while nothing has failed yet in this process
        for url in group.urls:
            for server in resolve(url):
                idle, server.idle = server.idle, []
                for conn in idle:
                    conn.close()
        with pytest.raises(Unavailable) as info:
            lock.acquire()
        causes = [str(vote.cause) for vote in info.value.votes if vote.outcome == "error"]
        assert sum("restart_delay" in cause for cause in causes) == 2, causes
    finally:
        _stop(holder)
        lock.close()
