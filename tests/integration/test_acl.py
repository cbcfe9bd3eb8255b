"""The least-privilege ACL user of docs/deploying.md (``fencelock.cli.doctor.ACL_SETUSER``): the
lock behaviour suite of ``test_lock.py`` passes as that user, over both front ends and 1 and 3
servers; the line grants exactly what fencelock sends; a user missing a permission gets an
``Unavailable`` that says the ACL refused it."""

# ruff: noqa: F811  (the api fixtures and test_lock's tests are imported, then collected here)

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from api import LockFactory, front, make_lock  # noqa: F401
from test_lock import (  # noqa: F401  (collected again here, as the ACL user)
    test_contention,
    test_context_managers_release_on_error,
    test_expiry_then_takeover,
    test_extend_prolongs,
    test_failed_round_leaves_nothing_of_ours,
    test_fences_strictly_increase,
    test_free_lock_is_free_after_a_waiter_gave_up,
    test_handoff_wakes_a_blocked_waiter,
    test_nothing_left_after_release_but_the_fence,
    test_stale_lease_cannot_release_or_extend,
    test_with_lock_shared_by_threads,
)

import fencelock
import fencelock.admin
from fencelock import NotAcquired, Unavailable
from fencelock._core.verdicts import ACL_HINT
from fencelock.cli.doctor import ACL_SETUSER, diagnose
from fencelock.testing import Server, ServerGroup

PASSWORD = "s3cret-pw"
SCRIPTS_DIR = Path(fencelock.__file__).parent / "_scripts"
# on the user's data server (fence_guard: the check the three include)
GUARD_SCRIPTS = {"fence_advance", "fence_apply", "fence_write", "fence_guard"}
# what a lock server runs: every script but the storage guard's
LOCK_SCRIPTS = sorted(p.stem for p in SCRIPTS_DIR.glob("*.lua") if p.stem not in GUARD_SCRIPTS)


def rules() -> list[str]:
    """The ACL SETUSER line's rules, with our password."""
    words = ACL_SETUSER.split()
    assert words[:3] == ["ACL", "SETUSER", "fencelock"]
    return [f">{PASSWORD}" if w.startswith(">") else w for w in words[3:]]


def add_user(server: Server, name: str, *more: str) -> str:
    with server.client() as client:
        client.execute_command("ACL", "SETUSER", name, "reset", *rules(), *more)
    return f"redis://{name}:{PASSWORD}@{server.host}:{server.port}/0"


class AclGroup:
    """A started ServerGroup whose ``urls`` log in as the least-privilege user; ``servers``
    and ``server.client()`` stay the default user, for the tests' own inspections."""

    def __init__(self, group: ServerGroup) -> None:
        self.group = group
        self.servers = group.servers
        self.urls = [add_user(server, "fencelock") for server in group.servers]

    def __iter__(self) -> Iterator[Server]:
        return iter(self.servers)

    def __getitem__(self, index: int) -> Server:
        return self.servers[index]

    def __len__(self) -> int:
        return len(self.servers)


class AclTopologies:
    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.groups: dict[int, AclGroup] = {}

    def group(self, n: int) -> AclGroup:
        if n not in self.groups:
            self.groups[n] = AclGroup(ServerGroup(n, binary=self.binary).start())
        return self.groups[n]

    def urls(self, n: int) -> list[str]:
        return self.group(n).urls

    def stop(self) -> None:
        for group in self.groups.values():
            group.group.stop()


@pytest.fixture(scope="module")
def topologies(fencelock_server_binary: str) -> Iterator[AclTopologies]:
    """Overrides the session topologies: same shape, every URL logs in as the ACL user."""
    topo = AclTopologies(fencelock_server_binary)
    try:
        yield topo
    finally:
        topo.stop()


def test_the_line_grants_exactly_what_fencelock_sends_and_its_lock_scripts_call() -> None:
    granted = {w[1:].upper() for w in ACL_SETUSER.split() if w.startswith("+")}
    called = set()
    for name in LOCK_SCRIPTS:
        source = (SCRIPTS_DIR / f"{name}.lua").read_text()
        called |= {c.upper() for c in re.findall(r"redis\.p?call\('(\w+)'", source)}
    # engine + handshake; BLMOVE claims a hand-over, CLIENT ID / UNBLOCK end an interrupted one
    sent = {"PING", "INFO", "ROLE", "SELECT", "EVAL", "EVALSHA", "BLPOP", "BLMOVE"}
    sent |= {"CLIENT|ID", "CLIENT|UNBLOCK"}
    sent |= {"MGET"}  # release --force reads token and holder info at once (admin)
    assert granted == called | sent
    assert "~fencelock:*" in ACL_SETUSER.split() and "-@all" in ACL_SETUSER.split()


def test_the_acl_user_may_not_touch_other_keys_or_commands(topologies: AclTopologies) -> None:
    (server,) = topologies.group(1).servers
    with server.client(username="fencelock", password=PASSWORD) as client:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get("not-ours")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("FLUSHALL")
        assert client.ping()


@pytest.mark.filterwarnings("ignore:2 servers")
def test_the_acl_user_sees_the_servers_identity(topologies: AclTopologies) -> None:
    """INFO and ROLE are granted: the same server twice is still refused."""
    group = topologies.group(1)
    server = group.servers[0]
    twice = [group.urls[0], group.urls[0].replace("127.0.0.1", "localhost")]
    lock = fencelock.Lock(twice, "acl:twice", ttl=5)
    with pytest.raises(fencelock.ConfigError, match="same server"):
        lock.acquire(wait=0)
    assert server.is_running


@pytest.mark.parametrize("missing", ["-eval", "-set", "-time"])
def test_a_user_missing_a_permission_gets_unavailable_saying_the_acl_refused(
    fencelock_server: Server, make_lock: LockFactory, key: str, missing: str
) -> None:
    url = add_user(fencelock_server, "short", missing)
    lock = make_lock(url, key, ttl=5)
    with pytest.raises(Unavailable) as info:
        lock.acquire(wait=0)
    assert ACL_HINT in str(info.value)
    (vote,) = info.value.votes
    assert vote.outcome == "error"
    assert re.search("NOPERM|ACL failure|can't run", str(vote.cause)), vote.cause
    if missing == "-eval":
        assert "'eval'" in str(vote.cause)  # the server names the command


def test_an_extend_the_acl_refuses_is_unavailable_saying_so(
    fencelock_server: Server, make_lock: LockFactory, key: str
) -> None:
    url = add_user(fencelock_server, "noexpire", "-pexpire")
    lease = make_lock(url, key, ttl=5).acquire(wait=0)  # a free lock's acquire needs no PEXPIRE
    with pytest.raises(Unavailable) as info:
        lease.extend(10)
    assert ACL_HINT in str(info.value)
    assert 0 < lease.remaining() <= 5  # unknown outcome: the old deadline stays
    lease.release()


def test_a_waiter_whose_user_may_not_block_sleeps_instead_of_spinning(
    fencelock_server: Server, make_lock: LockFactory, key: str
) -> None:
    url = add_user(fencelock_server, "noblpop", "-blpop", "-blmove")
    holder = make_lock(url, key, ttl=30)
    lease = holder.acquire(wait=0)
    waiter = make_lock(url, key, ttl=30)
    with fencelock_server.client() as admin:
        admin.config_resetstat()
        began = time.monotonic()
        with pytest.raises(NotAcquired):
            waiter.acquire(wait=1.0)
        assert time.monotonic() - began >= 1.0
        stats = admin.info("commandstats")
        errors = admin.info("errorstats")
    attempts = sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("eval", "evalsha"))
    assert 1 <= attempts < 100, stats  # retries with backoff, not a busy loop
    # BLPOP / BLMOVE was refused
    assert errors.get("errorstat_NOPERM", {}).get("count", 0) >= 1, errors
    lease.release()
    # and a release still lets the waiter in (it polls with backoff instead of blocking)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(wait=5)))
    thread.start()
    thread.join(10)
    assert got and got[0].fence > lease.fence
    got[0].release()


@pytest.mark.parametrize("page", ["deploying.md", "security.md"])
def test_the_documented_line_is_the_one_tested(page: str) -> None:
    docs = Path(__file__).parents[2] / "docs" / page
    assert ACL_SETUSER in docs.read_text()


def test_release_force_and_status_work_as_the_acl_user(topologies: AclTopologies) -> None:
    """``release --force`` reads the token and the holder info with MGET: the line grants it."""
    group = topologies.group(1)
    key = f"acl:force:{time.monotonic_ns()}"
    lease = fencelock.Lock(group.urls, key, ttl=30).acquire(wait=1)
    report = fencelock.admin.status(group.urls, key)
    assert report["servers"][0]["held"] and report["servers"][0]["error"] is None
    result = fencelock.admin.force_release(group.urls, key)
    assert [one.outcome for one in result.servers] == ["deleted"], result
    with group[0].client() as client:
        assert client.exists(f"fencelock:{{{key}}}") == 0
    assert lease.fence > 0


def test_doctor_names_mget_when_the_user_may_not_run_it(fencelock_server: Server) -> None:
    url = add_user(fencelock_server, "nomget", "-mget")
    (acl,) = [c for c in diagnose(url)["checks"] if c["name"] == "acl"]
    assert not acl["ok"] and "MGET" in acl["detail"] and "+mget" in acl["detail"], acl
    full = diagnose(add_user(fencelock_server, "full"))
    (ok,) = [c for c in full["checks"] if c["name"] == "acl"]
    assert ok["ok"], ok


@pytest.mark.parametrize("n", [1, 3])
def test_the_whole_family_works_as_the_acl_user(topologies: AclTopologies, n: int) -> None:
    """Fair lock, semaphore, read-write lock and election run their own scripts (ZRANGE,
    ZRANGEBYSCORE, ZSCORE beyond the plain lock's): the one line must cover them too."""
    client = fencelock.Client(topologies.urls(n), ttl=5.0)
    base = f"acl:family:{n}:{time.monotonic_ns()}"
    with client.lock(f"{base}:fair", fair=True).hold(wait=2) as lease:
        assert lease.fence > 0
    sem = client.semaphore(f"{base}:sem", limit=2)
    with sem.hold(wait=2) as one, sem.hold(wait=2) as two:
        assert {one.slot, two.slot} == {0, 1}
    rw = client.rwlock(f"{base}:rw")
    with rw.read(wait=2) as r1, rw.read(wait=2) as r2:
        assert r1.token != r2.token
    with rw.write(wait=2) as writer:
        assert writer.fence > max(r1.fence, r2.fence)
    election = client.election(f"{base}:elect", name="acl")
    with election.campaign(wait=2) as term:
        leader = election.leader()
        assert leader is not None and (leader.name, leader.fence) == ("acl", term.fence)
    client.close()


def test_a_user_narrowed_to_its_prefix_cannot_touch_another_applications_locks(
    fencelock_server: Server, key: str
) -> None:
    """docs/security.md "Isolating applications": ``~fencelock:{billing:*`` instead of
    ``~fencelock:*`` confines a user to the locks named ``billing:...``."""
    url = add_user(fencelock_server, "billing", "resetkeys", "~fencelock:{billing:*")
    with fencelock.Lock(url, f"billing:{key}", ttl=5).hold(wait=1) as lease:
        assert lease.fence > 0
    other = fencelock.Lock(fencelock_server.url, f"search:{key}", ttl=30).acquire(wait=1)
    with pytest.raises(Unavailable) as info:
        fencelock.Lock(url, f"search:{key}", ttl=5).acquire(wait=0)
    assert ACL_HINT in str(info.value)
    with (
        fencelock_server.client(username="billing", password=PASSWORD) as client,
        pytest.raises(redis.exceptions.NoPermissionError),
    ):
        client.delete(f"fencelock:{{search:{key}}}")
    other.release()
