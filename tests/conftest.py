"""Shared fixtures: servers shared by the session (one group per topology) and unique keys.

Tests that kill, pause or restart servers use the plugin's ``fencelock_servers(n)`` /
``fencelock_server`` instead (fresh processes, stopped at teardown).
"""

from __future__ import annotations

import os
import re
import resource
import uuid
from collections.abc import Callable, Iterator

import pytest
from clockwatch import ClockWatch

from fencelock.testing import ServerGroup


def pytest_configure(config: pytest.Config) -> None:
    """The session starts and stops hundreds of servers; the process-wide registry keeps the
    idle connections of each until it is used again, so the session holds more than the
    common default of 1024 open files: raise the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else max(soft, min(hard, 65536))
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


#: The session's watch of the host's wall clock against its monotonic clock (started when this
#: file is loaded); the terminal summary reports how far it moved and its steps.
_CLOCK = ClockWatch()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report steps of the wall clock the servers expire keys by (tests/clockwatch.py): a
    lease test that failed while the host's clock stepped by as much failed of that step."""
    moved = _CLOCK.stop()
    steps = ", ".join(f"{size * 1000:+.1f} ms at monotonic {at:.3f}" for at, size in _CLOCK.steps)
    terminalreporter.write_line(
        f"wall clock against monotonic: moved {moved * 1000:.3f} ms over the session"
        + (f"; steps: {steps}" if steps else "; no step over 1 ms")
    )


# The quick subset (`pytest -m "not slow"`, README): whole modules that start topologies
# (clusters, replica sets, sentinels), run fault scenarios or real workloads for seconds,
# drive the commands end to end, or run other libraries' suites (compat). Everything else --
# the library's behaviour on real servers, one machine, no faults -- runs in the quick subset.
_SLOW_DIRS = ("tests/faults/", "tests/sim/")
_SLOW_PREFIXES = ("test_cluster", "test_cli", "test_compat", "test_sentinel", "test_tls_cluster")
_SLOW_MODULES = frozenset(
    {
        "test_bench.py",
        "test_celery.py",
        "test_cli_elect.py",
        "test_cli_signals.py",
        "test_cluster.py",
        "test_cluster_kit.py",
        "test_demo.py",
        "test_failover.py",
        "test_html_pages.py",
        "test_keys_cluster.py",
        "test_replicas.py",
        "test_sentinel.py",
        "test_top.py",
        "test_watchdog.py",
        "test_engine_regressions.py",
        "test_at_risk.py",
        "test_acl.py",
        "test_handover_review.py",
        "test_election.py",
        "test_doctor.py",
        "test_reentrant_at_least.py",
    }
)


# Tests whose outcome cannot depend on the engine: they start no server (pure logic, the
# simulation's own server), run another library's test suite through fencelock.compat
# (whose scripts and behaviour run on both engines in test_compat*.py), or check what a
# command prints or draws (bench's fields, demo's table, chaos's JSON, the HTML pages in
# chromium: the server is a backdrop; the library paths they drive run on both engines in
# the library's own tests). CI's second engine leg sets FENCELOCK_SECOND_ENGINE=1 to deselect
# them (pytest reports them as deselected); it keeps CI under its 40 minutes.
_ENGINE_FREE_DIRS = ("tests/unit/", "tests/sim/")
_ENGINE_BOUND_IN_FREE_DIRS = frozenset({"test_differential.py"})
_ENGINE_FREE_MODULES = frozenset(
    {
        "test_compat_redislock_suite.py",
        "test_compat_redispy.py",
        "test_bench.py",
        "test_demo.py",
        "test_chaos_cli.py",
        "test_html_pages.py",
    }
)


def _serverless(item: pytest.Item) -> bool:
    """Pure logic and the simulation's own server: no server process, no port."""
    path = item.path.as_posix()
    in_dirs = any(d in path for d in _ENGINE_FREE_DIRS)
    return in_dirs and item.path.name not in _ENGINE_BOUND_IN_FREE_DIRS


def _engine_free(item: pytest.Item) -> bool:
    return item.path.name in _ENGINE_FREE_MODULES or _serverless(item)


#: ``FENCELOCK_SERVERLESS``: ``only`` keeps the tests that start no server, ``skip`` leaves
#: them out. CI runs them beside its first engine leg (``.ci/run``: they are pure CPU, the
#: leg mostly waits on servers and timers), the leg with ``skip``; unset, all run.
_SERVERLESS_ENV = "FENCELOCK_SERVERLESS"


def _deselect(
    config: pytest.Config, items: list[pytest.Item], drop: Callable[[pytest.Item], bool]
) -> None:
    dropped = [item for item in items if drop(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not drop(item)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tiers ``slow`` so that ``-m "not slow"`` is the quick subset; with
    ``FENCELOCK_SECOND_ENGINE=1``, deselect the tests no engine can change; with
    ``FENCELOCK_SERVERLESS=only`` / ``skip``, keep / leave out the tests that start no server."""
    if os.environ.get("FENCELOCK_SECOND_ENGINE") == "1":
        _deselect(config, items, _engine_free)
    serverless = os.environ.get(_SERVERLESS_ENV, "")
    if serverless == "only":
        _deselect(config, items, lambda item: not _serverless(item))
    elif serverless == "skip":
        _deselect(config, items, _serverless)
    elif serverless:
        raise pytest.UsageError(f"{_SERVERLESS_ENV} is 'only' or 'skip', not {serverless!r}")
    slow = pytest.mark.slow
    for item in items:
        path = item.path.as_posix()
        name = item.path.name
        if (
            any(d in path for d in _SLOW_DIRS)
            or name in _SLOW_MODULES
            or name.startswith(_SLOW_PREFIXES)
        ):
            item.add_marker(slow)


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
