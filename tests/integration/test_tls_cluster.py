"""Locks over ``rediss+cluster://`` against a real Cluster speaking TLS (Debian's redis-server,
see ``tls.py``): with the right CA and host names a Lock of either front end acquires, renews
and releases on whichever node owns its slot (the seed's map and redirects name the TLS
ports); a cluster whose certificate names another host is refused."""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from api import LockFactory, front, make_lock  # noqa: F401
from redis.crc import key_slot
from tls import tls_cluster

from fencelock import Unavailable
from fencelock.testing import Cluster

#: Keys tried at most to find one on the seed node and one elsewhere.
KEY_TRIES = 200


@pytest.fixture(scope="module")
def tls_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    directory = tmp_path_factory.mktemp("tls-cluster")
    with tls_cluster(directory) as cluster:
        yield cluster, directory


@pytest.fixture(scope="module")
def wrong_host_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    directory = tmp_path_factory.mktemp("tls-cluster-wrong-host")
    with tls_cluster(directory, cert="wrong-host", primaries=1) as cluster:
        yield cluster, directory


def _url(cluster: Cluster, ca: Path) -> str:
    # ssl_check_hostname is on by default (ssl_cert_reqs=required): said here to be explicit
    return f"{cluster.tls_url}?ssl_ca_certs={ca}&ssl_check_hostname=true"


def _keys(cluster: Cluster, key: str) -> list[str]:
    """Two lock names: one whose slot the seed node owns, one owned by another node."""
    seed = cluster.nodes[0]
    here: str | None = None
    there: str | None = None
    for i in range(KEY_TRIES):
        name = f"{key}:{i}"
        owner = cluster.owner(key_slot(f"fencelock:{{{name}}}".encode()))
        if owner is seed and here is None:
            here = name
        elif owner is not seed and there is None:
            there = name
        if here is not None and there is not None:
            return [here, there]
    raise AssertionError(f"no two keys on different nodes in {KEY_TRIES} tries")


def _held(cluster: Cluster, name: str) -> bool:
    node = cluster.owner(key_slot(f"fencelock:{{{name}}}".encode()))
    conn = node.client()  # the node's plain port: the kit's own check
    try:
        return bool(conn.exists(f"fencelock:{{{name}}}"))
    finally:
        conn.close()


def test_a_lock_over_a_tls_cluster_acquires_renews_and_releases(
    tls_nodes: tuple[Cluster, Path], make_lock: LockFactory, key: str
) -> None:
    cluster, directory = tls_nodes
    url = _url(cluster, directory / "ca.crt")
    for name in _keys(cluster, key):
        lock = make_lock(url, name, ttl=5)
        lease = lock.acquire(wait=5)
        assert lease.fence > 0 and 4 < lease.remaining() <= 5
        assert _held(cluster, name)
        assert make_lock(url, name, ttl=5).try_acquire() is None
        lease.extend(10)
        assert 9 < lease.remaining() <= 10
        lease.release()
        assert not _held(cluster, name)
        with lock.hold(wait=5) as again:
            assert again.fence > lease.fence


def test_a_tls_cluster_whose_certificate_names_another_host_is_refused(
    wrong_host_nodes: tuple[Cluster, Path], make_lock: LockFactory, key: str
) -> None:
    cluster, directory = wrong_host_nodes
    lock = make_lock(_url(cluster, directory / "ca.crt"), key, ttl=5)
    with pytest.raises(Unavailable) as info:
        lock.acquire(wait=0)
    (vote,) = info.value.votes
    assert vote.outcome == "error"
    assert isinstance(vote.cause, ssl.SSLCertVerificationError)
    assert "certificate verify failed" in str(info.value)
    assert "127.0.0.1" in str(vote.cause)  # the host name did not match
    assert not _held(cluster, key)
