"""The chaos proxy stops cleanly: no connection task outlives its loop. A pipe left pending
when the loop closed (a request held, or delayed, in its queue) was collected later, in some
other test, as "Task was destroyed but it is pending" and an "Exception ignored in:
<coroutine _Pipe.write_loop>" unraisable warning that failed that test."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
import time
from typing import Any

import pytest

from fencelock.testing import Server
from fencelock.testing.proxy import Proxy

BOUND = 10.0  # liveness bound (s)
PING = b"*1\r\n$4\r\nPING\r\n"


@pytest.mark.parametrize("mode", ["pass", "hold", "latency", "blackhole"])
def test_stopping_a_proxy_with_a_request_in_flight_leaves_no_pending_task(
    fencelock_server: Server, mode: str
) -> None:
    seen: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        proxy = Proxy(
            fencelock_server.host,
            fencelock_server.port,
            name=f"stop-{mode}",
            password=fencelock_server.password,
        ).start()
        client = socket.create_connection((proxy.host, proxy.port), timeout=BOUND)
        try:
            password = fencelock_server.password
            assert password is not None
            client.sendall(
                b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password.encode())
            )
            assert client.recv(64) == b"+OK\r\n"  # AUTH passes through the proxy
            client.sendall(PING)
            assert client.recv(64) == b"+PONG\r\n"  # both pipes up
            {"pass": proxy.pass_through, "hold": proxy.hold, "blackhole": proxy.blackhole,
             "latency": lambda: proxy.latency(5_000)}[mode]()  # fmt: skip
            client.sendall(PING)  # held or delayed in a pipe's queue when the proxy stops
            time.sleep(0.05)
            loop = proxy._loop
            assert loop is not None
            proxy.stop()
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        finally:
            client.close()
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert pending == []
    assert seen == [], [(u.exc_value, u.object) for u in seen]


def _authed(proxy: Proxy, password: str) -> socket.socket:
    client = socket.create_connection((proxy.host, proxy.port), timeout=BOUND)
    client.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password.encode()))
    assert client.recv(64) == b"+OK\r\n"
    return client


def test_hold_connections_keeps_only_the_connections_open_then(fencelock_server: Server) -> None:
    """A request on a held connection lands after one written later on a new connection."""
    password = fencelock_server.password
    assert password is not None
    with Proxy(fencelock_server.host, fencelock_server.port, password=password) as proxy:
        old = _authed(proxy, password)
        try:
            assert proxy.hold_connections() == 1
            old.sendall(b"*3\r\n$3\r\nSET\r\n$10\r\nproxy:held\r\n$3\r\nold\r\n")
            new = _authed(proxy, password)  # opened after the hold: it passes
            try:
                new.sendall(b"*3\r\n$3\r\nSET\r\n$10\r\nproxy:held\r\n$3\r\nnew\r\n")
                assert new.recv(64) == b"+OK\r\n"
                old.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    old.recv(64)  # still held
                proxy.deliver()
                old.settimeout(BOUND)
                assert old.recv(64) == b"+OK\r\n"
                with fencelock_server.client() as direct:
                    assert direct.get("proxy:held") == b"old"  # the held write landed last
                    direct.delete("proxy:held")
            finally:
                new.close()
        finally:
            old.close()
