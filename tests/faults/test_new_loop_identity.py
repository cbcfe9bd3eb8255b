"""F26: a majority restarts empty between two event loops of one process.

Job 1 (``asyncio.run()``) takes and releases the lock, so this process knows every server's
identity and nothing failed on its connections. Another process then takes the lock (its key
on all three servers), and servers 0 and 1 are killed (``kill -9``) and restarted empty. Job 2
runs on a new loop: its first connections must check each server's identity (run id, uptime)
on that connection, see the restart, and hold back the restarted servers' grants
(``restart_delay``): job 2 is refused while the other process's lease is valid, exactly as a
job on the same loop would be. Also with many tasks of one loop asking at once.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

import fencelock.testing.server
from fencelock import NotAcquired, Unavailable
from fencelock.testing import ServerGroup

aio = pytest.importorskip("fencelock.asyncio")

TTL = 30.0  # the other process's lease outlives the test
HOLDER = """
import sys
from fencelock import Lock
lock = Lock(sys.argv[1].split(","), sys.argv[2], ttl=float(sys.argv[3]), restart_delay=False)
lease = lock.acquire(wait=5.0)
print(lease.fence)
"""  # exits without releasing: its key stays on every server for the TTL


def take_and_release(urls: list[str], key: str) -> None:
    async def job() -> None:
        lock = aio.Lock(urls, key, ttl=TTL, server_timeout=0.5)
        lease = await lock.acquire(wait=2.0)
        await lease.release()

    asyncio.run(job())


def other_process_holds(urls: list[str], key: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", HOLDER, ",".join(urls), key, str(TTL)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0


def majority_restarts_empty(group: ServerGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 and an empty restart, by someone else (an operator, systemd): the test
    harness's own note to this process's engine that it restarted them is turned off."""
    with monkeypatch.context() as patch:
        patch.setattr(fencelock.testing.server, "server_started", lambda *_, **__: None)
        for server in (group[0], group[1]):
            server.kill()
            server.restart(wipe=True)


# refused: the restarted servers' grants held back (too few votes left: Unavailable), or "held"
REFUSED = (NotAcquired, Unavailable)


def restart_delay_cause(exc: NotAcquired | Unavailable) -> bool:
    return any(v.outcome == "error" and "restart_delay" in str(v.cause) for v in exc.votes)


@pytest.mark.parametrize("tasks", [1, 20])
def test_a_new_event_loop_checks_each_servers_identity_and_is_refused(
    tasks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"new-loop-{tasks}"
    with ServerGroup(3) as group:
        urls = group.urls
        take_and_release(urls, key)
        other_process_holds(urls, key)
        majority_restarts_empty(group, monkeypatch)

        async def job2() -> list[BaseException | object]:
            async def one() -> object:
                lock = aio.Lock(urls, key, ttl=TTL, server_timeout=0.5)  # a Lock per task
                return await lock.acquire(wait=0)

            return await asyncio.gather(*(one() for _ in range(tasks)), return_exceptions=True)

        started = time.monotonic()
        outcomes = asyncio.run(job2())
        assert time.monotonic() - started < 10.0
        granted = [o for o in outcomes if not isinstance(o, BaseException)]
        assert granted == []  # a second lease while the other process's is valid
        assert all(isinstance(o, REFUSED) for o in outcomes), outcomes
        assert any(restart_delay_cause(o) for o in outcomes if isinstance(o, REFUSED))


def test_the_same_loop_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference: one loop throughout (its connections see the restart)."""
    key = "same-loop"
    with ServerGroup(3) as group:
        urls = group.urls

        async def scenario() -> NotAcquired | Unavailable | None:
            lock = aio.Lock(urls, key, ttl=TTL, server_timeout=0.5)
            lease = await lock.acquire(wait=2.0)
            await lease.release()
            await asyncio.to_thread(other_process_holds, urls, key)
            await asyncio.to_thread(majority_restarts_empty, group, monkeypatch)
            try:
                await lock.acquire(wait=0)
            except REFUSED as exc:
                return exc
            return None

        refused = asyncio.run(scenario())
        assert refused is not None
        assert restart_delay_cause(refused)
