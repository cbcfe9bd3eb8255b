"""Every path that makes a plain redis-py client of its own (``status``, ``release``,
``release --force``, ``top``, ``doctor``, ``RedisFence(url)`` sync and asyncio, ``bench``)
authenticates a TLS server as the Lock does (issue 23 #3): a server whose certificate is
signed by the trusted CA but names another host is refused, whatever redis-py is installed
(redis-py 5 does not check the host name by default; CI runs this file on the floor version
too, see ``.ci/run``). Each path is also shown to work against the right server, so a refusal
is the host name's doing. Real TLS-only redis-server processes (``tls.py``)."""

from __future__ import annotations

import asyncio
import ssl
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tls import tls_redis

from fencelock import InsecureTLSWarning, admin
from fencelock._engine.address import sentinels_from_url
from fencelock._engine.sentinel import ask
from fencelock.cli import bench, top
from fencelock.cli.doctor import diagnose
from fencelock.fence import AsyncRedisFence, RedisFence

MISMATCH = "mismatch"  # "IP address mismatch, certificate is not valid for '127.0.0.1'"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """(the right server's port, the wrong-host server's port, the certificates' folder)."""
    directory = tmp_path_factory.mktemp("tls-plain")
    with tls_redis(directory) as good, tls_redis(directory, cert="wrong-host") as bad:
        yield good, bad, directory


def url(port: int, ca: Path, extra: str = "") -> str:
    return f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}{extra}"


def _status(u: str) -> str | None:
    (row,) = admin.status([u], "tls-plain", timeout=2.0)["servers"]
    return row["error"]


def _release(u: str) -> str | None:
    (one,) = admin.release([u], "tls-plain", "no-such-token", timeout=2.0).servers
    return None if one.outcome == "not-held" else one.outcome


def _force(u: str) -> str | None:
    (one,) = admin.force_release([u], "tls-plain", timeout=2.0).servers
    return None if one.outcome == "free" else one.outcome


def _top(u: str) -> str | None:
    (row,) = top.snapshot([u], prefix="tls-plain", timeout=2.0)["servers"]
    return row["error"]


def _doctor(u: str) -> str | None:
    (reachable,) = [c for c in diagnose(u, timeout=2.0)["checks"] if c["name"] == "reachable"]
    return None if reachable["ok"] else reachable["detail"]


def _raised(call: Callable[[], object]) -> str | None:
    """None, or what was raised with its causes (redis-py 5.0's asyncio client keeps the
    certificate's complaint only on the cause)."""
    try:
        call()
    except Exception as exc:
        said: list[str] = []
        seen: BaseException | None = exc
        while seen is not None and len(said) < 10:
            said.append(f"{type(seen).__name__}: {seen} {getattr(seen, 'verify_message', '')}")
            seen = seen.__cause__ or seen.__context__
        return " <- ".join(said)
    return None


def _fence(u: str) -> str | None:
    return _raised(lambda: RedisFence(u, timeout=2.0).read("tls-plain"))


def _async_fence(u: str) -> str | None:
    async def read() -> None:
        fence = AsyncRedisFence(u, timeout=2.0)
        try:
            await fence.read("tls-plain")
        finally:
            await fence.aclose()

    return _raised(lambda: asyncio.run(read()))


def _bench(u: str) -> str | None:
    return _raised(lambda: bench._admin(u).ping())


PATHS: dict[str, Callable[[str], str | None]] = {
    "status": _status,
    "release": _release,
    "release --force": _force,
    "top": _top,
    "doctor": _doctor,
    "RedisFence": _fence,
    "AsyncRedisFence": _async_fence,
    "bench": _bench,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_server_whose_certificate_names_another_host_is_refused(
    servers: tuple[int, int, Path], path: str
) -> None:
    good, bad, ca_dir = servers
    ca = ca_dir / "ca.crt"  # the same CA signed both servers' certificates
    assert PATHS[path](url(good, ca)) is None  # the right server: works
    error = PATHS[path](url(bad, ca))
    assert error is not None and MISMATCH in error, error


@pytest.mark.parametrize("path", ["status", "RedisFence"])
def test_ssl_check_hostname_false_is_honoured_with_a_warning(
    servers: tuple[int, int, Path], path: str
) -> None:
    _, bad, ca_dir = servers
    with pytest.warns(InsecureTLSWarning, match="ssl_check_hostname=false"):
        error = PATHS[path](url(bad, ca_dir / "ca.crt", "&ssl_check_hostname=false"))
    assert error is None


def test_a_verified_url_gives_no_warning(servers: tuple[int, int, Path]) -> None:
    good, _, ca_dir = servers
    with warnings.catch_warnings():
        warnings.simplefilter("error", InsecureTLSWarning)
        assert _status(url(good, ca_dir / "ca.crt")) is None


@pytest.mark.parametrize(
    "weak", ["&ssl_cert_reqs=none", "&ssl_cert_reqs=optional", "&ssl_check_hostname=false"]
)
def test_doctor_warns_about_tls_that_does_not_authenticate_the_server(
    servers: tuple[int, int, Path], weak: str
) -> None:
    good, _, ca_dir = servers
    report = diagnose(url(good, ca_dir / "ca.crt", weak), timeout=2.0)
    (tls,) = [c for c in report["checks"] if c["name"] == "tls"]
    assert not tls["ok"] and tls["severity"] == "warning", tls
    assert weak.lstrip("&") in tls["detail"]
    (verified,) = [
        c
        for c in diagnose(url(good, ca_dir / "ca.crt"), timeout=2.0)["checks"]
        if c["name"] == "tls"
    ]
    assert verified["ok"], verified


def test_sentinels_are_asked_over_verified_tls_when_told(servers: tuple[int, int, Path]) -> None:
    """The sentinel look-up's TLS (``sentinel_ssl=true``), tried against the TLS servers (a
    plain server answers ``SENTINEL`` with an error, which proves the handshake and the
    request went through; the wrong-host server is refused before any request)."""
    good, bad, ca_dir = servers
    query = f"?sentinel_ssl=true&ssl_ca_certs={ca_dir / 'ca.crt'}"
    right = sentinels_from_url(f"redis+sentinel://127.0.0.1:{good}/locks{query}")
    assert right.tls is not None and right.tls.check_hostname
    with pytest.raises(ConnectionError, match=r"(?i)unknown command"):
        ask("127.0.0.1", good, "locks", 2.0, tls=right.tls)
    with pytest.raises(ssl.SSLCertVerificationError, match=MISMATCH):
        ask("127.0.0.1", bad, "locks", 2.0, tls=right.tls)
