"""Fixtures the fault tests share: one fresh server, and a proxy to it that drains."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fencelock.testing import Server
from fencelock.testing.proxy import Proxy


@pytest.fixture
def lone_server() -> Iterator[Server]:
    """A fresh server of its own (no persistence), stopped at teardown."""
    started = Server(persistence="none").start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def draining_proxy(lone_server: Server) -> Iterator[Proxy]:
    """A proxy to ``lone_server`` with ``drain``: a request written before the client closed
    its connection still arrives, as TCP delivers what was sent before a FIN."""
    made = Proxy(
        lone_server.host, lone_server.port, password=lone_server.password, drain=True
    ).start()
    try:
        yield made
    finally:
        made.stop()
