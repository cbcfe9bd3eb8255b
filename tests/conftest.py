"""Shared fixtures: servers shared by the session (one group per topology) and unique keys.

Tests that kill, pause or restart servers use the plugin's ``fencelock_servers(n)`` /
``fencelock_server`` instead (fresh processes, stopped at teardown).
"""

from __future__ import annotations

import re
import resource
import uuid
from collections.abc import Iterator

import pytest

from fencelock.servers import ServerGroup


def pytest_configure(config: pytest.Config) -> None:
    """The session starts and stops hundreds of servers; the process-wide registry keeps the
    idle connections of each until it is used again, so the session holds more than the
    common default of 1024 open files: raise the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else max(soft, min(hard, 65536))
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class Topologies:
    """One started ServerGroup per size, created on first use, stopped at session end."""

    def __init__(self, binary: str) -> None:
        self._binary = binary
        self._groups: dict[int, ServerGroup] = {}

    def group(self, n: int) -> ServerGroup:
        if n not in self._groups:
            self._groups[n] = ServerGroup(n, binary=self._binary).start()
        return self._groups[n]

    def urls(self, n: int) -> list[str]:
        return self.group(n).urls

    def stop(self) -> None:
        for group in self._groups.values():
            group.stop()


@pytest.fixture(scope="session")
def topologies(fencelock_server_binary: str) -> Iterator[Topologies]:
    """Shared groups of 1, 3, 5 servers: never stop, pause or kill them; use unique keys."""
    topo = Topologies(fencelock_server_binary)
    try:
        yield topo
    finally:
        topo.stop()


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A lock name unique to this test run."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:40]
    return f"t:{safe}:{uuid.uuid4().hex[:10]}"
