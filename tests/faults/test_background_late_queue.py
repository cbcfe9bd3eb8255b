"""Issue 21 (background thread): a ``Repeat`` queued by a caller while the background thread
walks the server's queue of late calls neither breaks the walk ("deque mutated during
iteration", which failed the thread's step) nor gets lost (a queue found spent was cleared,
dropping a call appended meanwhile).

Deterministic: the background thread is held inside an action of its inbox while the test
walks the queue as ``_tend`` does and a caller queues a Repeat; the caller's call must reach
the queue through the thread (after the walk), and its release must then reach the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from fencelock._core.effects import Repeat
from fencelock._core.keys import lock_keys
from fencelock._core.plan import release_keys
from fencelock._engine.registry import resolve
from fencelock._engine.server import LateCall
from fencelock._scripts import BY_NAME
from fencelock._sync.background import background
from fencelock.testing import Server

BOUND = 10.0


@pytest.fixture
def held_thread() -> Iterator[threading.Event]:
    """The background thread, blocked in an action of its inbox until the event is set."""
    go = threading.Event()
    entered = threading.Event()

    def hold() -> None:
        entered.set()
        go.wait(BOUND)

    bg = background()
    bg._post(hold)
    assert entered.wait(BOUND), "the background thread never ran the action"
    try:
        yield go
    finally:
        go.set()


def test_a_repeat_queued_while_the_late_queue_is_walked_is_neither_an_error_nor_lost(
    fencelock_server: Server, held_thread: threading.Event
) -> None:
    (server,) = resolve([fencelock_server.url])
    name = "late-queue"
    keys = lock_keys(name)
    fencelock_server.client().set(keys.lock, "tok-late", px=60_000)
    release = "release"
    assert release in BY_NAME
    spent = LateCall(release, (keys.lock,), ("other",), until=0.0)  # nothing left to do
    server.late.append(spent)
    walk = iter(server.late)  # as _tend walks it, in the thread
    assert next(walk) is spent
    effect = Repeat(
        release,
        (0,),
        release_keys(keys),
        ("tok-late", 0, 0, "", 60_000, "-"),
        until_s=30.0,
    )
    background().repeat((server,), effect)  # a caller thread
    assert list(walk) == []  # no "deque mutated during iteration": nothing changed under us
    held_thread.set()
    client = fencelock_server.client()
    deadline = time.monotonic() + BOUND
    while client.exists(keys.lock):
        assert time.monotonic() < deadline, "the repeated release never reached the server"
        time.sleep(0.02)
