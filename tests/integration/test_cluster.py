"""A Redis/Valkey Cluster as one server, on a real local cluster (3 primaries + 3 replicas):
calls are routed by slot, MOVED/ASK are followed during a reshard, and a primary killed mid-hold
with its replica promoted costs at most the lease, never a hang or a silent double grant."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import fencelock.asyncio as aio
from fencelock import Client, ConfigError, Lock, LockLost, Unavailable, cli
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock._engine.cluster import key_slot
from fencelock._engine.registry import resolve
from fencelock.testing import Cluster, ClusterNode, Server

#: A bound on anything that must not hang (generous: the machine is shared).
BOUND_S = 15.0


@pytest.fixture(scope="module")
def cluster(fencelock_server_binary: str) -> Iterator[Cluster]:
    """Shared by the tests that change nothing but keys."""
    with Cluster(binary=fencelock_server_binary) as c:
        yield c


@pytest.fixture
def own_cluster(fencelock_server_binary: str) -> Iterator[Cluster]:
    """A cluster of the test's own, for reshards and kills."""
    with Cluster(binary=fencelock_server_binary) as c:
        yield c


def _slot(name: str) -> int:
    return key_slot(lock_keys(name).lock)


def _names_on_every_primary(cluster: Cluster, per_primary: int = 3) -> list[str]:
    """Lock names whose slots are spread over every primary (by the cluster's own map)."""
    owners: dict[int, list[str]] = {}
    for i in range(2000):
        name = f"spread:{i}"
        port = cluster.owner(_slot(name)).port
        bucket = owners.setdefault(port, [])
        if len(bucket) < per_primary:
            bucket.append(name)
        if len(owners) == cluster.primaries and all(len(b) == per_primary for b in owners.values()):
            break
    assert len(owners) == cluster.primaries
    return [name for bucket in owners.values() for name in bucket]


def _node_client(node: ClusterNode) -> redis.Redis:
    return node.client()


def _holder_on(cluster: Cluster, name: str) -> bytes | None:
    """The token in the lock key's value (up to byte 255, where its holder info starts), read
    on the primary that owns its slot now."""
    with contextlib.closing(_node_client(cluster.owner(_slot(name)))) as client:
        value = client.get(lock_keys(name).lock)
    return lock_token(value) if isinstance(value, bytes) else None


# ---- addresses and configuration -----------------------------------------------------------


def test_a_cluster_url_and_a_cluster_client_are_one_server_each(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    rc = cluster.client()
    try:
        (by_url,) = resolve(cluster.url)
        (by_client,) = resolve(rc)
        assert by_url.is_cluster and by_client.is_cluster
        assert by_url is by_client  # the same seed node: the same cluster
        assert by_url.name == f"cluster:{node.host}:{node.port}"
    finally:
        rc.close()


def test_a_cluster_url_with_a_database_is_refused_before_any_io() -> None:
    with pytest.raises(ConfigError, match="only database 0"):
        Lock("redis+cluster://127.0.0.1:1/3", "k")


# ---- routing -------------------------------------------------------------------------------


def test_the_slot_computed_here_is_the_servers(cluster: Cluster) -> None:
    names = ["orders:42", "}abc", "{abc", "a{b}c", "x}y{z}", "", "é", *(f"n{i}" for i in range(50))]
    with contextlib.closing(_node_client(cluster.nodes[0])) as client:
        for name in names:
            for key in lock_keys(name or "-").script_keys:
                assert key_slot(key) == int(client.execute_command("CLUSTER", "KEYSLOT", key))


def test_locks_on_keys_of_every_primary_land_on_the_owner_of_their_slot(cluster: Cluster) -> None:
    names = _names_on_every_primary(cluster)
    with Client(cluster.url, ttl=30.0) as client:
        leases = [client.lock(name).acquire(wait=0) for name in names]
        try:
            for name, lease in zip(names, leases, strict=True):
                assert _holder_on(cluster, name) == lease.token.encode()
                assert client.lock(name).try_acquire() is None  # held: refused
        finally:
            for lease in leases:
                lease.release()
        for name in names:
            assert _holder_on(cluster, name) is None


def test_a_redis_py_cluster_client_works_as_the_server(cluster: Cluster) -> None:
    rc = cluster.client()
    try:
        names = _names_on_every_primary(cluster, per_primary=1)
        for name in names:
            lock = Lock(rc, name, ttl=10.0)
            lease = lock.acquire(wait=0)
            assert lock_token(rc.get(lock_keys(name).lock)) == lease.token.encode()
            again = Lock(rc, name, ttl=10.0)
            assert again.try_acquire() is None
            lease.release()
            assert rc.get(lock_keys(name).lock) is None
    finally:
        rc.close()


def test_many_asyncio_tasks_lock_keys_in_many_slots(cluster: Cluster) -> None:
    names = [f"tasks:{i}" for i in range(60)]
    assert len({cluster.owner(_slot(n)).port for n in names}) == cluster.primaries

    async def scenario() -> list[int]:
        async with aio.Client(cluster.url, ttl=10.0) as client:

            async def one(name: str) -> int:
                lease = await client.lock(name).acquire(wait=0)
                assert await client.lock(name).try_acquire() is None
                assert _holder_on(cluster, name) == lease.token.encode()
                await lease.release()
                return lease.fence

            return await asyncio.gather(*(one(n) for n in names))

    fences = asyncio.run(asyncio.wait_for(scenario(), BOUND_S * 2))
    assert len(fences) == len(names)
    for name in names:
        assert _holder_on(cluster, name) is None


def test_an_asyncio_cluster_client_works_as_the_server(cluster: Cluster) -> None:
    import redis.asyncio.cluster

    node = cluster.nodes[1]

    async def scenario() -> tuple[bool, bool]:
        rc = redis.asyncio.cluster.RedisCluster(
            host=node.host, port=node.port, password=cluster.password
        )
        try:
            lock = aio.Lock(rc, "async-client", ttl=10.0)
            lease = await lock.acquire(wait=0)
            held = lock_token(await rc.get(lock_keys("async-client").lock)) == lease.token.encode()
            refused = await aio.Lock(rc, "async-client", ttl=10.0).try_acquire() is None
            await lease.release()
            return held, refused
        finally:
            await rc.aclose()

    assert asyncio.run(scenario()) == (True, True)


def test_mutual_exclusion_between_two_clients_of_one_cluster(cluster: Cluster) -> None:
    """Two Clients (one by URL through node 0, one by a RedisCluster client through node 2):
    while one holds a key, the other is refused; after the release, the other gets it."""
    node = cluster.nodes[2]
    rc = redis.cluster.RedisCluster(host=node.host, port=node.port, password=cluster.password)
    a = Client(cluster.url, ttl=10.0)
    b = Client(rc, ttl=10.0)
    try:
        for name in _names_on_every_primary(cluster, per_primary=1):
            lease = a.lock(name).acquire(wait=0)
            assert b.lock(name).try_acquire() is None
            lease.release()
            other = b.lock(name).acquire(wait=0)
            assert other.fence > lease.fence
            assert a.lock(name).try_acquire() is None
            other.release()
    finally:
        a.close()
        b.close()
        rc.close()


def test_redlock_over_three_independent_clusters(fencelock_server_binary: str) -> None:
    with contextlib.ExitStack() as stack:
        clusters = [
            stack.enter_context(Cluster(2, 0, binary=fencelock_server_binary)) for _ in range(3)
        ]
        urls = [c.url for c in clusters]
        lock = Lock(urls, "redlock-of-clusters", ttl=10.0)
        lease = lock.acquire(wait=0)
        for c in clusters:
            assert _holder_on(c, "redlock-of-clusters") == lease.token.encode()
        assert Lock(urls, "redlock-of-clusters", ttl=10.0).try_acquire() is None
        lease.release()
        for c in clusters:
            assert _holder_on(c, "redlock-of-clusters") is None


# ---- resharding ----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sync", "asyncio"])
def test_a_held_lock_follows_its_slot_through_a_reshard(own_cluster: Cluster, engine: str) -> None:
    """Mid-migration (keys moved, slot still MIGRATING/IMPORTING) the source answers ASK; after
    SETSLOT NODE it answers MOVED: extend and release follow both, and the key moved."""
    cluster = own_cluster
    name = f"reshard-{engine}"
    slot = _slot(name)
    source = cluster.owner(slot)
    target = next(n for n in cluster.nodes[: cluster.primaries] if n is not source)

    def start_migration() -> None:
        with (
            contextlib.closing(_node_client(source)) as src,
            contextlib.closing(_node_client(target)) as dst,
        ):
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        assert cluster.migrate_keys(slot, source, target) >= 1

    def on(node: ClusterNode) -> bytes | None:
        with contextlib.closing(_node_client(node)) as client:
            # ASKING lets the importing node answer for the slot before it owns it
            pipe = client.pipeline(transaction=False)
            pipe.execute_command("ASKING")
            pipe.execute_command("GET", lock_keys(name).lock)
            try:
                value = pipe.execute()[1]
            except redis.ResponseError:
                return None
        return lock_token(value) if isinstance(value, bytes) else None

    if engine == "sync":
        with Client(cluster.url, ttl=10.0) as client:
            lease = client.lock(name).acquire(wait=0)
            start_migration()
            lease.extend(20.0)  # ASK: the keys are on the target already
            assert lease.remaining() > 10.0
            cluster.finish_move(slot, target)
            lease.extend(20.0)  # MOVED: the target owns the slot now
            assert on(target) == lease.token.encode()
            lease.release()
            assert on(target) is None
            again = client.lock(name).acquire(wait=0)
            assert again.fence > lease.fence
            again.release()
    else:

        async def scenario() -> None:
            async with aio.Client(cluster.url, ttl=10.0) as client:
                lease = await client.lock(name).acquire(wait=0)
                await asyncio.to_thread(start_migration)
                await lease.extend(20.0)
                assert lease.remaining() > 10.0
                await asyncio.to_thread(cluster.finish_move, slot, target)
                await lease.extend(20.0)
                assert on(target) == lease.token.encode()
                await lease.release()
                assert on(target) is None
                again = await client.lock(name).acquire(wait=0)
                assert again.fence > lease.fence
                await again.release()

        asyncio.run(asyncio.wait_for(scenario(), BOUND_S * 2))
    assert cluster.owner(slot) is target


# ---- failover ------------------------------------------------------------------------------


def _wait_replicated(replica: ClusterNode, name: str, token: str) -> None:
    """Until the replica has the grant (bounded): the kill then tests failover, not luck."""
    deadline = time.monotonic() + BOUND_S
    with contextlib.closing(_node_client(replica)) as client:
        client.execute_command("READONLY")
        while lock_token(client.get(lock_keys(name).lock)) != token.encode():
            assert time.monotonic() < deadline, "the grant never reached the replica"
            time.sleep(0.01)


@pytest.mark.parametrize("engine", ["sync", "asyncio"])
def test_a_primary_killed_mid_hold_costs_at_most_the_lease(
    own_cluster: Cluster, engine: str
) -> None:
    """SIGKILL the primary of a held lock's slot, promote its replica: the extend either keeps
    the lease or reports it lost (never hangs past a bound), a second client is refused while
    the lease is kept, and new acquires work after."""
    cluster = own_cluster
    name = f"failover-{engine}"
    slot = _slot(name)
    primary = cluster.owner(slot)
    replica = cluster.replicas_of(primary)[0]

    def kill_and_promote(token: str) -> None:
        _wait_replicated(replica, name, token)
        primary.kill()  # SIGKILL by PID
        cluster.promote(replica)

    if engine == "sync":
        with Client(cluster.url, ttl=10.0) as a, Client(cluster.url, ttl=10.0) as b:
            lease = a.lock(name).acquire(wait=0)
            kill_and_promote(lease.token)
            started = time.monotonic()
            kept = True
            try:
                lease.extend(10.0)
            except LockLost:
                kept = False
            assert time.monotonic() - started < BOUND_S
            assert kept, "the grant was replicated before the kill: the promoted replica has it"
            assert b.lock(name).try_acquire() is None
            lease.release()
            started = time.monotonic()
            after = b.lock(name).acquire(wait=5.0)
            assert time.monotonic() - started < BOUND_S
            assert after.fence > lease.fence
            assert _holder_on(cluster, name) == after.token.encode()
            after.release()
    else:

        async def scenario() -> None:
            async with aio.Client(cluster.url, ttl=10.0) as a, aio.Client(cluster.url) as b:
                lease = await a.lock(name).acquire(wait=0)
                await asyncio.to_thread(kill_and_promote, lease.token)
                await lease.extend(10.0)
                assert await b.lock(name).try_acquire() is None
                await lease.release()
                after = await b.lock(name).acquire(wait=5.0)
                assert after.fence > lease.fence
                await after.release()

        asyncio.run(asyncio.wait_for(scenario(), BOUND_S * 2))
    assert cluster.owner(slot) is replica


def test_an_unreplicated_grant_lost_in_a_failover_is_caught_by_the_fence(
    own_cluster: Cluster,
) -> None:
    """The replica's link is cut (it is paused and its primary drops it), so A's grant never
    reaches it; the primary is killed and the replica promoted. The promoted primary grants the
    lock to B while A still holds its lease (the double grant of asynchronous replication),
    but B's fence is larger than A's (the TIME floor), so a fenced store refuses A's writes after
    B's; A's next extend reports the lease lost; nothing hangs."""
    cluster = own_cluster
    name = "unreplicated"
    slot = _slot(name)
    primary = cluster.owner(slot)
    replica = cluster.replicas_of(primary)[0]
    # A 60 s lease: killing the primary and promoting the replica took more than 10 s on a
    # loaded CI machine, and A's lease had simply run out before the double grant was seen.
    with Client(cluster.url, ttl=60.0) as a, Client(cluster.url, ttl=60.0) as b:
        warm = a.lock(name).acquire(wait=0)  # the fence register reaches the replica
        warm.release()
        replica.pause()
        try:
            with contextlib.closing(_node_client(primary)) as client:
                client.execute_command("CLIENT", "KILL", "TYPE", "replica")
            lease = a.lock(name).acquire(wait=0)
            primary.kill()
        finally:
            replica.resume()
        cluster.promote(replica)
        started = time.monotonic()
        other = b.lock(name).acquire(wait=5.0)  # granted again: the promoted node never saw A
        assert time.monotonic() - started < BOUND_S
        assert lease.remaining() > 0  # A still believes it holds: a double grant...
        assert other.fence > lease.fence  # ...that the fence orders: A's writes are refused
        started = time.monotonic()
        with pytest.raises(LockLost):
            lease.extend(60.0)
        assert time.monotonic() - started < BOUND_S
        other.release()


def test_a_hung_primary_costs_its_slots_a_bounded_wait_and_the_others_nothing(
    own_cluster: Cluster,
) -> None:
    """SIGSTOP the primary of one lock's slot: acquiring that lock fails within a bound
    (Unavailable: the cluster's one vote timed out), a lock in another primary's slots is
    still granted, and once the primary resumes the first lock is granted again."""
    cluster = own_cluster
    names = _names_on_every_primary(cluster, per_primary=1)
    hung_name = names[0]
    hung = cluster.owner(_slot(hung_name))
    other_name = next(n for n in names if cluster.owner(_slot(n)) is not hung)
    with Client(cluster.url, ttl=10.0, server_timeout=0.3) as client:
        client.lock(hung_name).acquire(wait=0).release()  # the map is known
        hung.pause()
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable):
                client.lock(hung_name).acquire(wait=0)
            assert time.monotonic() - started < BOUND_S
            deadline = time.monotonic() + BOUND_S
            while True:  # the cluster was suspect; the background probe clears it (bounded)
                try:
                    lease = client.lock(other_name).acquire(wait=0)
                    break
                except Unavailable:
                    assert time.monotonic() < deadline, "another primary's lock never worked"
                    time.sleep(0.05)
            lease.release()
        finally:
            hung.resume()
        lease = client.lock(hung_name).acquire(wait=5.0)
        lease.release()


# ---- doctor --------------------------------------------------------------------------------


def _doctor(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["doctor", "--json", "--server", url])
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return code, report


def _check_named(report: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in report["checks"] if c["name"] == name]
    return dict(found)


def test_doctor_reports_a_healthy_cluster_by_its_primaries_and_exits_0(
    fencelock_server_binary: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Cluster(3, 1, binary=fencelock_server_binary, persistence="aof-always") as c:
        code, report = _doctor(capsys, c.url)
        primaries = {f"127.0.0.1:{n.port}/0" for n in c.nodes[: c.primaries]}
    assert [x for x in report["checks"] if not x["ok"]] == []
    assert code == 0
    assert {row["server"] for row in report["servers"]} == primaries
    assert all(row["role"] == "master" for row in report["servers"])
    cluster_check = _check_named(report, "cluster")
    assert "3 primaries, 3 replicas, 16384 of 16384 slots" in cluster_check["detail"]


def test_doctor_warns_of_a_primary_without_replica(
    fencelock_server_binary: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Cluster(2, 0, binary=fencelock_server_binary, persistence="aof-always") as c:
        code, report = _doctor(capsys, c.url)
        strict = cli.main(["doctor", "--json", "--strict", "--server", c.url])
        capsys.readouterr()
    cluster_check = _check_named(report, "cluster")
    assert not cluster_check["ok"] and cluster_check["severity"] == "warning"
    assert "without a replica" in cluster_check["detail"]
    assert code == 0  # only warnings (DESIGN v0.3: doctor exits 0 when only WARNs)
    assert strict == 1  # --strict fails on a warning


def test_doctor_says_a_standalone_server_given_as_a_cluster_is_not_one(
    fencelock_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    url = fencelock_server.url.replace("redis://", "redis+cluster://").removesuffix("/0")
    code, report = _doctor(capsys, url)
    cluster_check = _check_named(report, "cluster")
    assert not cluster_check["ok"] and cluster_check["severity"] == "error"
    assert "cluster-enabled" in cluster_check["detail"]
    assert code == 1


def test_fencelock_run_holds_a_lock_on_a_cluster(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "cli-run"
    script = 'test -n "$FENCELOCK_FENCE" || exit 1; exit 7'
    code = cli.main(["run", "--key", name, "--server", cluster.url, "--", "sh", "-c", script])
    assert code == 7  # the child ran (its own code), holding the lock
    assert _holder_on(cluster, name) is None  # released after it


def test_a_valkey_py_cluster_client_works_as_the_server(cluster: Cluster) -> None:
    valkey_cluster = pytest.importorskip("valkey.cluster")
    node = cluster.nodes[2]
    vc = valkey_cluster.ValkeyCluster(host=node.host, port=node.port, password=cluster.password)
    try:
        (server,) = resolve(vc)
        assert server.is_cluster
        lease = Lock(vc, "valkey-py", ttl=10.0).acquire(wait=0)
        assert lock_token(vc.get(lock_keys("valkey-py").lock)) == lease.token.encode()
        lease.release()
        assert vc.get(lock_keys("valkey-py").lock) is None
    finally:
        vc.close()


def test_replicas_1_on_a_cluster_waits_for_each_slots_replica(cluster: Cluster) -> None:
    """``replicas=1`` over a cluster: the WAIT follows the script to the node that owns the
    slot (after the slot map request of a fresh client, and after redirects), and a grant
    counts once that primary's replica acknowledged it; the replica then has the key."""
    names = _names_on_every_primary(cluster, per_primary=1)
    for flavour in ("sync", "asyncio"):
        if flavour == "sync":
            with Client(cluster.url, ttl=30.0, replicas=1) as client:
                leases = [client.lock(name).acquire(wait=5) for name in names]
        else:

            async def grab() -> list[Any]:
                async with aio.Client(cluster.url, ttl=30.0, replicas=1) as client:
                    return [await client.lock(name).acquire(wait=5) for name in names]

            leases = asyncio.run(grab())
        try:
            for name, lease in zip(names, leases, strict=True):
                owner = cluster.owner(_slot(name))
                (replica,) = cluster.replicas_of(owner)
                with contextlib.closing(_node_client(replica)) as client:
                    client.execute_command("READONLY")
                    assert lock_token(client.get(lock_keys(name).lock)) == lease.token.encode()
        finally:
            for name in names:  # the leases' clients are closed: free the keys directly
                with contextlib.closing(_node_client(cluster.owner(_slot(name)))) as client:
                    client.delete(lock_keys(name).lock)


def test_the_cluster_topology_is_reachable_from_the_testing_kit_and_its_old_names() -> None:
    import importlib
    import sys

    import fencelock.testing

    assert fencelock.testing.Cluster is Cluster
    assert fencelock.testing.ClusterNode is ClusterNode
    for old in ("fencelock.servers", "fencelock.cluster_servers"):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match="fencelock.testing"):
            module = importlib.import_module(old)
        assert module.Cluster is Cluster
        assert module.ClusterNode is ClusterNode
