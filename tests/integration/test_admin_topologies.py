"""``admin.status`` / ``release`` / ``force_release``, ``fencelock status`` / ``release`` and
``RedisFence`` given the URLs a Lock takes for a whole topology: ``redis+cluster://`` (any
node; the lock's keys share one hash tag, so the primary owning that slot answers) and
``redis+sentinel://`` (the master the sentinels name). Real local clusters and sentinels;
bounds are generous (the machine is shared), nothing asserts speed."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from tls import tls_redis

from fencelock import Lock, StaleFence, admin, cli
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock._engine.cluster import key_slot
from fencelock.fence import AsyncRedisFence, RedisFence
from fencelock.testing import Cluster, ReplicaSet, Server

#: A bound on anything that must not hang (s): generous, never a speed assertion.
BOUND_S = 20.0
MISMATCH = "mismatch"  # "IP address mismatch, certificate is not valid for '127.0.0.1'"


def _key() -> str:
    return f"topo-{uuid.uuid4().hex[:12]}"


def _on(node: Server, key: str) -> bytes | None:
    """The token stored for lock ``key`` on ``node`` (read directly, not through fencelock)."""
    with node.client() as conn:
        value = conn.get(f"fencelock:{{{key}}}")  # the token, byte 255, the holder info
    assert value is None or isinstance(value, bytes)
    return None if value is None else lock_token(value)


def _status_json(capsys: pytest.CaptureFixture[str], url: str, key: str) -> dict[str, object]:
    capsys.readouterr()
    assert cli.main(["status", "--json", "--key", key, "--server", url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert isinstance(report, dict)
    return report


# -- Cluster --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(fencelock_server_binary: str) -> Iterator[Cluster]:
    with Cluster(binary=fencelock_server_binary) as c:
        yield c


def _owner(cluster: Cluster, key: str) -> Server:
    return cluster.owner(key_slot(lock_keys(key).lock))


def _keys_on_two_primaries(cluster: Cluster) -> list[str]:
    """Two lock names whose slots two different primaries own (bounded search)."""
    found: dict[int, str] = {}
    for _ in range(200):
        name = _key()
        found.setdefault(_owner(cluster, name).port, name)
        if len(found) >= 2:
            return list(found.values())
    raise AssertionError("200 random names all hashed to one primary")


def test_status_and_release_through_a_cluster_url(cluster: Cluster) -> None:
    for key in _keys_on_two_primaries(cluster):
        owner = _owner(cluster, key)
        lock = Lock(cluster.url, key, ttl=30)
        lease = lock.acquire(wait=BOUND_S)
        report = admin.status(cluster.url, key)
        (row,) = report["servers"]
        assert row["error"] is None
        assert row["server"] == f"{owner.host}:{owner.port}/0"
        assert row["held"] and row["token_prefix"] == lease.token[:8]
        assert row["ttl_s"] is not None and 0 < row["ttl_s"] <= 30
        assert report["fence"] == lease.fence
        assert admin.release(cluster.url, key, "not-the-token").freed == 0
        assert _on(owner, key) == lease.token.encode()
        result = admin.release(cluster.url, key, lease.token)
        assert result.ok and [s.outcome for s in result.servers] == ["released"]
        assert _on(owner, key) is None
        assert not admin.status(cluster.url, key)["servers"][0]["held"]


def test_force_release_through_a_cluster_url(cluster: Cluster) -> None:
    key = _key()
    owner = _owner(cluster, key)
    lease = Lock(cluster.url, key, ttl=30).acquire(wait=BOUND_S)
    result = admin.force_release(cluster.url, key)
    (one,) = result.servers
    assert one.outcome == "deleted" and one.token_prefix == lease.token[:8]
    assert one.server == f"{owner.host}:{owner.port}/0"
    assert _on(owner, key) is None
    assert admin.force_release(cluster.url, key).servers[0].outcome == "free"


def test_the_cli_status_and_release_take_a_cluster_url(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    key = _key()
    lease = Lock(cluster.url, key, ttl=30).acquire(wait=BOUND_S)
    report = _status_json(capsys, cluster.url, key)
    (row,) = report["servers"]  # type: ignore[misc]
    assert row["held"] and row["token_prefix"] == lease.token[:8] and row["error"] is None
    code = cli.main(["release", "--key", key, "--token", lease.token, "--server", cluster.url])
    assert code == 0
    assert _on(_owner(cluster, key), key) is None


def test_status_through_a_cluster_url_whose_seed_is_down_reports_it(
    fencelock_server_binary: str,
) -> None:
    stopped = Server(fencelock_server_binary).start()
    host, port = stopped.host, stopped.port
    stopped.stop()
    url = f"redis+cluster://{host}:{port}"
    started = time.monotonic()
    (row,) = admin.status(url, _key(), timeout=1.0)["servers"]
    (one,) = admin.release(url, _key(), "token", timeout=1.0).servers
    assert time.monotonic() - started < BOUND_S
    assert row["error"] and not row["held"] and row["server"] == f"cluster:{host}:{port}"
    assert one.failed and one.server == f"cluster:{host}:{port}"


def test_redis_fence_through_a_cluster_url_writes_and_refuses(cluster: Cluster) -> None:
    resources = [f"res-{uuid.uuid4().hex[:8]}" for _ in range(6)]
    with RedisFence(cluster.url) as store:
        assert store.name == f"cluster:{cluster.nodes[0].host}:{cluster.nodes[0].port}"
        for resource in resources:
            store.write(resource, 5, b"new", token="t5")
            with pytest.raises(StaleFence):
                store.write(resource, 4, b"old", token="t4")
            assert store.read(resource) == (b"new", 5)
    for resource in resources:  # each hash is on the primary that owns its slot
        key = f"fencelock:res:{resource}"
        with cluster.owner(key_slot(key)).client() as direct:
            assert direct.hget(key, "fence") == b"5"


def test_async_redis_fence_through_a_cluster_url_writes_and_refuses(cluster: Cluster) -> None:
    resources = [f"res-{uuid.uuid4().hex[:8]}" for _ in range(6)]

    async def scenario() -> None:
        async with AsyncRedisFence(cluster.url) as store:
            for resource in resources:
                await store.write(resource, 5, b"new", token="t5")
                with pytest.raises(StaleFence):
                    await store.write(resource, 4, b"old", token="t4")
                assert await store.read(resource) == (b"new", 5)

    asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    for resource in resources:
        key = f"fencelock:res:{resource}"
        with cluster.owner(key_slot(key)).client() as direct:
            assert direct.hget(key, "fence") == b"5"


# -- Sentinel -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def watched(fencelock_server_binary: str) -> Iterator[ReplicaSet]:
    with ReplicaSet(1, sentinels=3, binary=fencelock_server_binary) as topology:
        yield topology


def test_status_and_release_through_a_sentinel_url(watched: ReplicaSet) -> None:
    url, key = watched.sentinel_url, _key()
    lease = Lock(url, key, ttl=30).acquire(wait=BOUND_S)
    report = admin.status(url, key)
    (row,) = report["servers"]
    assert row["error"] is None and row["server"].startswith(f"sentinel:{watched.service}@")
    assert row["held"] and row["token_prefix"] == lease.token[:8]
    assert report["fence"] == lease.fence
    assert admin.release(url, key, "not-the-token").freed == 0
    assert _on(watched.primary(), key) == lease.token.encode()
    assert admin.release(url, key, lease.token).ok
    assert _on(watched.primary(), key) is None


def test_force_release_through_a_sentinel_url(watched: ReplicaSet) -> None:
    url, key = watched.sentinel_url, _key()
    lease = Lock(url, key, ttl=30).acquire(wait=BOUND_S)
    (one,) = admin.force_release(url, key).servers
    assert one.outcome == "deleted" and one.token_prefix == lease.token[:8]
    assert _on(watched.primary(), key) is None


def test_the_cli_status_and_release_take_a_sentinel_url(
    watched: ReplicaSet, capsys: pytest.CaptureFixture[str]
) -> None:
    url, key = watched.sentinel_url, _key()
    lease = Lock(url, key, ttl=30).acquire(wait=BOUND_S)
    (row,) = _status_json(capsys, url, key)["servers"]  # type: ignore[misc]
    assert row["held"] and row["token_prefix"] == lease.token[:8] and row["error"] is None
    assert cli.main(["release", "--key", key, "--token", lease.token, "--server", url]) == 0
    assert _on(watched.primary(), key) is None


def test_redis_fence_through_a_sentinel_url_writes_and_refuses(watched: ReplicaSet) -> None:
    resource = f"res-{uuid.uuid4().hex[:8]}"
    with RedisFence(watched.sentinel_url) as store:
        assert store.name.startswith(f"sentinel:{watched.service}@")
        store.write(resource, 7, b"new", token="t7")
        with pytest.raises(StaleFence):
            store.write(resource, 6, b"old", token="t6")
        assert store.read(resource) == (b"new", 7)
    with watched.primary().client() as direct:
        assert direct.hget(f"fencelock:res:{resource}", "fence") == b"7"


def test_a_sentinel_url_naming_no_live_sentinel_is_reported(fencelock_server_binary: str) -> None:
    stopped = Server(fencelock_server_binary).start()
    url = f"redis+sentinel://{stopped.host}:{stopped.port}/nowhere"
    stopped.stop()
    started = time.monotonic()
    (row,) = admin.status(url, _key(), timeout=1.0)["servers"]
    (one,) = admin.force_release(url, _key(), timeout=1.0).servers
    assert time.monotonic() - started < BOUND_S
    assert row["server"] == one.server == f"sentinel:nowhere@{stopped.host}:{stopped.port}/0"
    assert not row["held"] and "no sentinel named the master" in str(row["error"])
    assert one.failed and "no sentinel named the master" in one.outcome
    with RedisFence(url, timeout=1.0) as store, pytest.raises(redis.RedisError):
        store.read("anything")


def test_async_redis_fence_through_a_sentinel_url_writes_and_refuses(watched: ReplicaSet) -> None:
    resource = f"res-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        async with AsyncRedisFence(watched.sentinel_url) as store:
            await store.write(resource, 7, b"new", token="t7")
            with pytest.raises(StaleFence):
                await store.write(resource, 6, b"old", token="t6")
            assert await store.read(resource) == (b"new", 7)

    asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    with watched.primary().client() as direct:
        assert direct.hget(f"fencelock:res:{resource}", "fence") == b"7"


def test_redis_fence_through_a_sentinel_url_follows_a_failover(watched: ReplicaSet) -> None:
    """After a failover the store's next acknowledged write is on the new primary: it asks the
    sentinels before each call, so a pooled connection to the old master (still a master
    until the sentinels demote it, about 10 s) does not take writes that would then be lost."""
    resource = f"res-{uuid.uuid4().hex[:8]}"
    key = f"fencelock:res:{resource}"
    with RedisFence(watched.sentinel_url, timeout=2.0) as store:
        store.write(resource, 1, b"before", token="t1")
        old = watched.primary()
        new = watched.failover()
        assert new is not old
        deadline = time.monotonic() + BOUND_S
        while True:  # no retries inside: a call may fail while the topology settles
            try:
                store.write(resource, 2, b"after", token="t2")
                break
            except redis.RedisError:
                assert time.monotonic() < deadline, "no write was acknowledged"
                time.sleep(0.2)
    with new.client() as direct:
        assert direct.hmget(key, ["value", "fence"]) == [b"after", b"2"]


def test_async_redis_fence_through_a_sentinel_url_follows_a_failover(watched: ReplicaSet) -> None:
    """:func:`test_redis_fence_through_a_sentinel_url_follows_a_failover` for asyncio."""
    resource = f"res-{uuid.uuid4().hex[:8]}"
    key = f"fencelock:res:{resource}"

    async def scenario() -> Server:
        async with AsyncRedisFence(watched.sentinel_url, timeout=2.0) as store:
            await store.write(resource, 1, b"before", token="t1")
            old = watched.primary()
            new = await asyncio.to_thread(watched.failover)
            assert new is not old
            deadline = time.monotonic() + BOUND_S
            while True:
                try:
                    await store.write(resource, 2, b"after", token="t2")
                    return new
                except redis.RedisError:
                    assert time.monotonic() < deadline, "no write was acknowledged"
                    await asyncio.sleep(0.2)

    new = asyncio.run(asyncio.wait_for(scenario(), 2 * BOUND_S))
    with new.client() as direct:
        assert direct.hmget(key, ["value", "fence"]) == [b"after", b"2"]


# -- TLS: the host name is checked on the cluster seed and on the sentinels --------------------


@pytest.fixture(scope="module")
def tls_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """(a TLS server's port, one whose certificate names another host, the CA's folder): plain
    servers, so the handshake is shown by the cluster / sentinel command they refuse."""
    directory = tmp_path_factory.mktemp("tls-topologies")
    with tls_redis(directory) as good, tls_redis(directory, cert="wrong-host") as bad:
        yield good, bad, directory


def _fails(call: Callable[[], object]) -> str:
    """What ``call`` raised (with its causes), or the status row's error it returned."""
    try:
        result = call()
    except Exception as exc:
        said: list[str] = []
        seen: BaseException | None = exc
        while seen is not None and len(said) < 10:
            said.append(f"{type(seen).__name__}: {seen}")
            seen = seen.__cause__ or seen.__context__
        return " <- ".join(said)
    assert isinstance(result, str), result
    return result


def _status_error(u: str) -> str:
    error = admin.status(u, "tls-topology", timeout=2.0)["servers"][0]["error"]
    assert error is not None
    return error


def _fence_error(u: str) -> str:
    def read() -> object:
        with RedisFence(u, timeout=2.0) as store:
            store.read("tls-topology")
        raise AssertionError("a plain TLS server read as a cluster / sentinel")

    return _fails(read)


@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
@pytest.mark.parametrize("path", [_status_error, _fence_error], ids=["status", "RedisFence"])
def test_a_topology_url_over_tls_checks_the_host_name(
    tls_servers: tuple[int, int, Path], kind: str, path: Callable[[str], str]
) -> None:
    good, bad, ca_dir = tls_servers
    ca = ca_dir / "ca.crt"  # the same CA signed both certificates

    def url(port: int) -> str:
        if kind == "cluster":
            return f"rediss+cluster://127.0.0.1:{port}?ssl_ca_certs={ca}"
        return f"redis+sentinel://127.0.0.1:{port}/locks?sentinel_ssl=true&ssl_ca_certs={ca}"

    refused = "cluster mode is not enabled" if kind == "cluster" else "unknown command"
    right = path(url(good))  # the handshake went through: the server refused the command
    assert refused in right.lower() and MISMATCH not in right, right
    wrong = path(url(bad))
    assert MISMATCH in wrong and refused not in wrong.lower(), wrong


def test_top_reads_the_primary_a_sentinel_url_names(
    watched: ReplicaSet, capsys: pytest.CaptureFixture[str]
) -> None:
    url, key = watched.sentinel_url, _key()
    prefix = key[:10]
    lease = Lock(url, key, ttl=30).acquire(wait=BOUND_S)
    try:
        capsys.readouterr()
        assert cli.main(["top", "--json", "--prefix", prefix, "--server", url]) == 0
        snap = json.loads(capsys.readouterr().out)
        (row,) = snap["servers"]
        assert row["error"] is None and row["server"].startswith(f"sentinel:{watched.service}@")
        (item,) = [i for i in snap["items"] if i["key"] == key]
        assert item["kind"] == "lock" and item["fence"] == lease.fence
    finally:
        lease.release()


def test_doctor_judges_the_primary_a_sentinel_url_names(watched: ReplicaSet) -> None:
    from fencelock.cli.doctor import diagnose

    report = diagnose(watched.sentinel_url, timeout=5.0)
    (row,) = report["servers"]
    assert row["server"].startswith(f"sentinel:{watched.service}@")
    assert row["run_id"] == watched.primary().run_id  # the primary, not a sentinel
    reachable = next(c for c in report["checks"] if c["name"] == "reachable")
    assert reachable["ok"], reachable
    # the probe reached the primary (a replica or a sentinel would fail this check)
    assert row["role"] == "master"
    replicas = next(c for c in report["checks"] if c["name"] == "replicas")
    assert replicas["ok"], replicas
