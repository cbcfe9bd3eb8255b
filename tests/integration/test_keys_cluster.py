"""Lock names with braces on a real cluster-enabled server (a one-node cluster owning every
slot): ``CLUSTER KEYSLOT`` must give one slot for all keys of a lock, and the scripts, which
touch all of them at once, must run (Cluster refuses a script whose keys span slots with
CROSSSLOT).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from fencelock import Lock
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock.testing import Server, free_port

NAMES = ["orders:42", "}abc", "{abc", "abc}", "{}", "a{b}c", "}{", "%7D", "{%7D}", "x}y{z}"]


def _free_cluster_port() -> int:
    """A port whose cluster bus (port + 10000, Redis' default) would also be valid."""
    for _ in range(100):
        port = free_port()
        if port <= 55535:
            return port
    raise AssertionError("no free port below 55536 in 100 tries")


@pytest.fixture(scope="module")
def cluster_node(fencelock_server_binary: str) -> Iterator[Server]:
    server = Server(
        fencelock_server_binary,
        port=_free_cluster_port(),
        extra_args=("--cluster-enabled", "yes", "--cluster-port", str(free_port())),
    ).start()
    try:
        client = server.client()
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 30.0
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "the one-node cluster never reached state ok"
            time.sleep(0.05)
        client.close()
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(cluster_node: Server) -> Iterator[redis.Redis]:
    c = cluster_node.client()
    yield c
    c.close()


@pytest.mark.parametrize("name", NAMES)
def test_every_key_of_a_lock_is_in_one_cluster_slot(client: redis.Redis, name: str) -> None:
    keys = lock_keys(name).script_keys
    slots = {int(client.execute_command("CLUSTER", "KEYSLOT", key)) for key in keys}
    assert len(slots) == 1, (name, keys, slots)


@pytest.mark.parametrize("name", NAMES)
def test_a_lock_named_with_braces_works_on_a_cluster_node(
    cluster_node: Server, client: redis.Redis, name: str
) -> None:
    lock = Lock(cluster_node.url, name, ttl=10.0)
    try:
        lease = lock.acquire(wait=0)
        assert lock_token(client.get(lock_keys(name).lock)) == lease.token.encode()
        assert lock.try_acquire() is None  # held: a second acquire is refused
        lease.release()
        assert client.exists(lock_keys(name).lock) == 0
        again = lock.acquire(wait=0)
        assert again.fence > lease.fence
        again.release()
    finally:
        lock.close()
