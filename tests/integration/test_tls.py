"""Locks over TLS (``rediss://``) against a real TLS-only Redis (see ``tls.py``): the right CA
works over both front ends, a wrong CA is refused with an Unavailable naming the TLS failure."""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from api import LockFactory, front, make_lock  # noqa: F401
from tls import tls_redis

from fencelock import Unavailable
from fencelock.cli.doctor import diagnose


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    directory = tmp_path_factory.mktemp("tls-locks")
    with tls_redis(directory) as port:
        yield port, directory


def url(port: int, ca: Path) -> str:
    return f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"


def test_a_lock_over_tls_with_the_right_ca_acquires_extends_and_releases(
    tls_server: tuple[int, Path], make_lock: LockFactory, key: str
) -> None:
    port, directory = tls_server
    lock = make_lock(url(port, directory / "ca.crt"), key, ttl=5)
    lease = lock.acquire(wait=0)
    assert lease.fence > 0 and 4 < lease.remaining() <= 5
    assert make_lock(url(port, directory / "ca.crt"), key, ttl=5).try_acquire() is None
    lease.extend(10)
    assert 9 < lease.remaining() <= 10
    lease.release()
    with lock.hold(wait=1) as again:
        assert again.fence > lease.fence


def test_a_server_signed_by_another_ca_is_unavailable_naming_the_certificate_failure(
    tls_server: tuple[int, Path], make_lock: LockFactory, key: str
) -> None:
    port, directory = tls_server
    lock = make_lock(url(port, directory / "other-ca.crt"), key, ttl=5)
    with pytest.raises(Unavailable) as info:
        lock.acquire(wait=0)
    (vote,) = info.value.votes
    assert vote.outcome == "error"
    assert isinstance(vote.cause, ssl.SSLCertVerificationError)
    assert "certificate verify failed" in str(info.value)


def test_doctor_checks_a_tls_server_too(tls_server: tuple[int, Path]) -> None:
    port, directory = tls_server
    good = diagnose(url(port, directory / "ca.crt"))
    assert good["servers"][0]["engine"] == "redis" and good["servers"][0]["run_id"]
    bad = diagnose(url(port, directory / "other-ca.crt"))
    (reachable,) = [c for c in bad["checks"] if c["name"] == "reachable"]
    assert not reachable["ok"] and "certificate verify failed" in reachable["detail"]
