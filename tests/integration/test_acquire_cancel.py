"""``Lock.acquire(cancel=event)``: the wait ends soon after the event is set, as at its
deadline, and leaves nothing behind (no queue entry, no suspect server). Real server."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from fencelock import Client, NotAcquired
from fencelock.testing import Server

DEADLINE = 30.0
PROMPT_S = 1.0  # the driver looks at the event every 50 ms; the rest is a loaded machine


@pytest.fixture
def client(fencelock_session_server: Server) -> Iterator[Client]:
    with Client(fencelock_session_server.url, ttl=30.0) as c:
        yield c


def _set_later(event: threading.Event, after_s: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(after_s), event.set()), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_setting_cancel_ends_a_long_wait_promptly_with_not_acquired(
    client: Client, fair: bool
) -> None:
    key = f"cancel-{uuid.uuid4().hex[:12]}"
    holder = client.lock(key, fair=fair).acquire(wait=0)
    cancel = threading.Event()
    setter = _set_later(cancel, 0.3)
    begin = time.monotonic()
    with pytest.raises(NotAcquired):
        client.lock(key, fair=fair).acquire(wait=DEADLINE, cancel=cancel)
    took = time.monotonic() - begin
    setter.join(DEADLINE)
    assert 0.3 <= took < 0.3 + PROMPT_S
    holder.release()
    # nothing left behind: no fair queue entry served first (a try succeeds only when nobody
    # is in line), no suspect server skipped by the next round; a plain lock's waiter hint
    # outlives the wait (as any waiter's that stopped: its hand-over is void after the claim
    # window), which costs the next caller that window at the most
    begin = time.monotonic()
    if fair:
        lease = client.lock(key, fair=True).try_acquire()
        assert lease is not None
    else:
        lease = client.lock(key).acquire(wait=DEADLINE)
    assert time.monotonic() - begin < PROMPT_S
    lease.release()


def test_a_wait_cancelled_before_it_starts_is_one_attempt(client: Client) -> None:
    key = f"cancel-{uuid.uuid4().hex[:12]}"
    holder = client.lock(key).acquire(wait=0)
    cancel = threading.Event()
    cancel.set()
    begin = time.monotonic()
    with pytest.raises(NotAcquired):
        client.lock(key).acquire(wait=DEADLINE, cancel=cancel)
    assert time.monotonic() - begin < PROMPT_S
    holder.release()


def test_a_cancel_never_set_changes_nothing(client: Client) -> None:
    key = f"cancel-{uuid.uuid4().hex[:12]}"
    holder = client.lock(key).acquire(wait=0)
    threading.Timer(0.2, holder.release).start()
    lease = client.lock(key).acquire(wait=DEADLINE, cancel=threading.Event())
    assert lease.fence > holder.fence
    lease.release()
