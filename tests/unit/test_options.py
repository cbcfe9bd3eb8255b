"""Every bad input of issue 2 raises ConfigError (a ValueError) before any I/O.

The servers given are closed ports (nothing listens): were anything sent, the error would be a
connection error, not ConfigError, and slower. Both front ends are checked.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

import fencelock
from fencelock import ConfigError, FencelockError
from fencelock.testing import free_ports

PORT, OTHER_PORT = free_ports(2)  # nothing listens on either
URL = f"redis://127.0.0.1:{PORT}/0"
OTHER_URL = f"redis://127.0.0.1:{OTHER_PORT}/0"
SECRET_URL = f"redis://:s3cr3t-pw@127.0.0.1:{PORT}/0"


def _front_ends() -> list[Any]:
    fronts: list[Any] = [pytest.param(fencelock.Lock, id="sync")]
    try:
        module = importlib.import_module("fencelock.asyncio")
    except ImportError:
        fronts.append(
            pytest.param(None, id="async", marks=pytest.mark.skip("no fencelock.asyncio"))
        )
    else:
        fronts.append(pytest.param(module.Lock, id="async"))
    return fronts


@pytest.fixture(params=_front_ends())
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    cls = request.param

    def build(servers: Any = URL, key: Any = "k", *args: Any, **kwargs: Any) -> Any:
        return cls(servers, key, *args, **kwargs)

    start = time.monotonic()
    yield build
    assert time.monotonic() - start < 5.0  # nothing waited on a network


def _raises_config(func: Callable[[], object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        func()
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, FencelockError)
    return info.value


@pytest.mark.parametrize("ttl", [0, -1, -0.5, math.nan, math.inf, -math.inf, "5", True, False,
                                 None, [5], timedelta(0), timedelta(seconds=-1)])  # fmt: skip
def test_bad_ttl(make: Callable[..., Any], ttl: object) -> None:
    _raises_config(lambda: make(URL, "k", ttl))
    _raises_config(lambda: make(URL, "k", ttl=ttl))


@pytest.mark.parametrize("wait", [-1, -0.001, math.nan, -math.inf, "x", "1", None, True])
def test_bad_wait(make: Callable[..., Any], wait: object) -> None:
    _raises_config(lambda: make(URL, "k", wait=wait))


@pytest.mark.parametrize("wait", [0, 0.0, 1, 2.5, math.inf, timedelta(seconds=3)])
def test_good_wait(make: Callable[..., Any], wait: object) -> None:
    lock = make(URL, "k", wait=wait)
    expected = wait.total_seconds() if isinstance(wait, timedelta) else float(wait)  # type: ignore[arg-type]
    assert lock.options.wait == expected


def test_timedelta_ttl(make: Callable[..., Any]) -> None:
    lock = make(URL, "k", timedelta(seconds=12, milliseconds=500))
    assert lock.ttl == 12.5


@pytest.mark.parametrize("key", ["", None, b"k", 5, ["k"]])
def test_bad_key(make: Callable[..., Any], key: object) -> None:
    _raises_config(lambda: make(URL, key))


@pytest.mark.parametrize("servers", [[], (), None, 42, [42], [URL, 42], [None], {URL: 1}, b"x"])
def test_bad_servers(make: Callable[..., Any], servers: object) -> None:
    _raises_config(lambda: make(servers, "k"))


@pytest.mark.parametrize(
    "url",
    ["notaurl", "http://x", "redis://", "redis://host:99999", "redis://host:abc",
     "redis://host:0", "redis://host/notadb", "", "unix://", "tcp://127.0.0.1:6379"],
)  # fmt: skip
def test_malformed_url(make: Callable[..., Any], url: str) -> None:
    _raises_config(lambda: make(url, "k"))
    _raises_config(lambda: make([url], "k"))


def test_same_url_twice(make: Callable[..., Any]) -> None:
    _raises_config(lambda: make([URL, URL, OTHER_URL], "k"))


@pytest.mark.parametrize("timeout", [30.0, 31, 0, -1, math.nan])
def test_server_timeout_must_be_below_ttl(make: Callable[..., Any], timeout: object) -> None:
    _raises_config(lambda: make(URL, "k", 30.0, server_timeout=timeout))


@pytest.mark.parametrize(
    "kwargs",
    [{"drift_factor": -0.1}, {"drift_factor": math.nan}, {"drift_factor": "0.1"},
     {"drift_min": -1}, {"retry_base": 0}, {"retry_cap": -1},
     {"retry_base": 1.0, "retry_cap": 0.5}, {"renew_every": 30.0}, {"renew_every": 0},
     {"handoff_window": -1}, {"holder_info": "yes"}, {"purpose": 5}],
)  # fmt: skip
def test_other_bad_options(make: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    _raises_config(lambda: make(URL, "k", 30.0, **kwargs))


@pytest.mark.parametrize(
    "bad",
    [
        {"servers": [SECRET_URL, SECRET_URL]},
        {"servers": "redis://:s3cr3t-pw@127.0.0.1:abc/0"},
        {"servers": "http://:s3cr3t-pw@127.0.0.1:1/0"},
        {"servers": "redis://:s3cr3t-pw@127.0.0.1:1/x"},
        {"servers": "redis://user:s3cr3t-pw@127.0.0.1:99999/0"},
        {"servers": SECRET_URL, "ttl": -1},
        {"servers": SECRET_URL, "key": ""},
    ],
)
def test_password_never_in_error_messages(make: Callable[..., Any], bad: dict[str, Any]) -> None:
    args = {"servers": URL, "key": "k", **bad}
    err = _raises_config(lambda: make(args.pop("servers"), args.pop("key"), **args))
    assert "s3cr3t-pw" not in str(err)
    assert "s3cr3t-pw" not in repr(err)
    assert all("s3cr3t-pw" not in str(a) for a in err.args)


def test_password_not_in_names_or_repr(make: Callable[..., Any]) -> None:
    lock = make(SECRET_URL, "k")
    assert all("s3cr3t-pw" not in name for name in lock.servers)
    assert "s3cr3t-pw" not in repr(lock)


def test_sync_acquire_bad_wait_is_config_error_before_io() -> None:
    lock = fencelock.Lock(URL, "k", ttl=5)
    try:
        for wait in (-1, math.nan, "x"):
            start = time.monotonic()
            _raises_config(lambda w=wait: lock.acquire(wait=w))  # type: ignore[misc]
            assert time.monotonic() - start < 1.0
        with pytest.raises(ConfigError), lock.hold(wait=-1):
            pass
    finally:
        lock.close()


def test_async_acquire_bad_wait_is_config_error_before_io() -> None:
    aio = pytest.importorskip("fencelock.asyncio")
    import asyncio

    async def main() -> None:
        lock = aio.Lock(URL, "k", ttl=5)
        try:
            for wait in (-1, math.nan, "x"):
                with pytest.raises(ConfigError):
                    await lock.acquire(wait=wait)
            with pytest.raises(ConfigError):
                async with lock.hold(wait=-1):
                    pass
        finally:
            await lock.aclose()

    asyncio.run(main())


def test_constructing_sends_nothing(make: Callable[..., Any]) -> None:
    """A valid Lock on a closed port is built instantly: no I/O at construction."""
    start = time.monotonic()
    lock = make([URL, OTHER_URL, "valkey://127.0.0.1:1/3"], "k")
    assert time.monotonic() - start < 1.0
    assert len(lock.servers) == 3


@pytest.mark.parametrize("ttl", [0.01, 0.03, 0.05])
def test_small_ttl_with_the_default_server_timeout(make: Callable[..., Any], ttl: float) -> None:
    """ttl >= 0.01 s is accepted; the per-server timeout the user did not give must then default
    to something shorter than the ttl, not make the lock invalid."""
    lock = make(URL, "k", ttl)
    assert 0 < lock.options.server_timeout < ttl


def test_client_lock_refuses_a_bool_ttl_even_after_the_same_number_was_used() -> None:
    # True == 1 as a dict key: a cache keyed by value alone would hand back ttl=1's options
    client = fencelock.Client("redis://127.0.0.1:1/0", ttl=5)
    assert client.lock("k", ttl=1).ttl == 1.0
    with pytest.raises(fencelock.ConfigError, match="ttl"):
        client.lock("k", ttl=True)
    with pytest.raises(fencelock.ConfigError, match="wait"):
        client.lock("k", wait=False)
    client.close()


@pytest.mark.parametrize("replicas", [-1, True, False, 1.0, "1", None])
def test_bad_replicas(make: Callable[..., Any], replicas: object) -> None:
    error = _raises_config(lambda: make(URL, "k", 30.0, replicas=replicas))
    assert "replicas" in str(error)


def test_replicas_is_kept_by_lock_client_and_client_lock() -> None:
    assert fencelock.Lock(URL, "k", replicas=2).options.replicas == 2
    assert fencelock.Lock(URL, "k").options.replicas == 0
    client = fencelock.Client(URL, replicas=1)
    assert client.lock("k").options.replicas == 1
    assert client.lock("k", replicas=0).options.replicas == 0
    assert client.lock("k", ttl=5).options.replicas == 1  # the client's, with another ttl
    with pytest.raises(ConfigError, match="replicas"):
        client.lock("k", replicas=True)  # True == 1: the option cache must not mix them
    with pytest.raises(ConfigError, match="replicas"):
        fencelock.Client(URL, replicas=-1)
    client.close()
    import fencelock.asyncio as aio

    aclient = aio.Client(URL, replicas=1)
    assert aclient.lock("k").options.replicas == 1
    with pytest.raises(ConfigError, match="replicas"):
        aclient.lock("k", replicas=-2)
