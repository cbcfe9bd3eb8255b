"""Issue 21 (registry): the idle connections of a server that stopped are closed by the
background thread, not kept until their address is used again (a test session that started
and stopped many servers ran out of its 1024 descriptors). Those of a live server stay."""

from __future__ import annotations

import time

import pytest

import fencelock
from fencelock._engine.registry import resolve
from fencelock._sync import background as background_module
from fencelock._sync.background import background
from fencelock.testing import Server

BOUND = 10.0


def test_idle_connections_of_a_stopped_server_are_closed(
    fencelock_server_binary: str, fencelock_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(background_module, "SWEEP_S", 0.1, raising=False)
    background()  # the thread runs
    live = fencelock.Lock(fencelock_server.url, "sweep-live", ttl=5.0)
    with Server(fencelock_server_binary) as stopping:
        lock = fencelock.Lock(stopping.url, "sweep", ttl=5.0)
        lock.acquire(wait=0).release()
        live.acquire(wait=0).release()
        (engine,) = resolve([stopping.url])
        (live_engine,) = resolve([fencelock_server.url])
        idle = list(engine.idle)
        kept = list(live_engine.idle)
        assert idle and kept
        stopping.stop()
    deadline = time.monotonic() + BOUND
    while not all(conn.closed for conn in idle):
        assert time.monotonic() < deadline, "the stopped server's idle connections stay open"
        time.sleep(0.05)
    assert not [conn for conn in idle if conn in engine.idle]
    assert all(not conn.closed for conn in kept)  # a live server's are kept
    live.acquire(wait=0).release()
