"""``fencelock status`` / ``admin.status`` for a semaphore and a read-write lock, on real servers
(1 and 3): permits with their slots, readers, the writer, and nothing once they are released.
Timing is asserted only as generous bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from fencelock import Client, ConfigError, admin
from fencelock._core.keys import lock_keys

PLAIN_FIELDS = {"key", "servers", "fence", "leader"}


@pytest.fixture
def name() -> str:
    return f"status-family-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=[1, 3], ids=["1-server", "3-servers"])
def urls(request: pytest.FixtureRequest, topologies: Any) -> list[str]:
    found: list[str] = topologies.urls(request.param)
    return found


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencelock", *args],
        capture_output=True, text=True, timeout=60, env=os.environ.copy(), check=False,
    )  # fmt: skip


def server_args(urls: list[str]) -> list[str]:
    out: list[str] = []
    for url in urls:
        out += ["--server", url]
    return out


def test_status_shows_each_held_permit_with_its_slot_and_holder(urls: list[str], name: str) -> None:
    with Client(urls, ttl=30.0, purpose="status-test") as client:
        sem = client.semaphore(name, limit=3)
        first, second = sem.acquire(wait=5), sem.acquire(wait=5)
        try:
            for report in (admin.status(urls, name), admin.status(urls, name, limit=3)):
                assert report["kind"] == "semaphore"
                permits = report["permits"]
                assert [(p["slot"], p["token_prefix"]) for p in permits] == sorted(
                    [(first.slot, first.token[:8]), (second.slot, second.token[:8])]
                )
                for permit in permits:
                    assert permit["servers_held"] == len(urls) and permit["majority"] is True
                    assert permit["ttl_s"] is not None and 0 < permit["ttl_s"] <= 30
                    assert permit["holder"] is not None
                    assert permit["holder"]["pid"] == os.getpid()
                    assert permit["holder"]["purpose"] == "status-test"
                for row in report["servers"]:
                    assert {p["slot"] for p in row["permits"]} == {first.slot, second.slot}
                    assert row["held"] is False  # the semaphore's own name is not a lock key
                assert report["fence"] is not None and report["fence"] >= second.fence
            assert admin.status(urls, name)["limit"] == 3  # the servers keep it beside the permits
            assert admin.status(urls, name, limit=3)["limit"] == 3
            first.release()
            (left,) = admin.status(urls, name)["permits"]
            assert (left["slot"], left["token_prefix"]) == (second.slot, second.token[:8])
        finally:
            second.release()
    after = admin.status(urls, name)
    assert set(after) == PLAIN_FIELDS  # nothing left: the plain lock's report, unchanged
    told = admin.status(urls, name, kind="semaphore")
    assert told["kind"] == "semaphore" and told["permits"] == []


def test_status_shows_readers_then_the_writer(urls: list[str], name: str) -> None:
    with Client(urls, ttl=30.0, purpose="rw-test") as client:
        rw = client.rwlock(name)
        readers = [rw.acquire_read(wait=5), rw.acquire_read(wait=5)]
        try:
            report = admin.status(urls, name)
            assert report["kind"] == "rwlock"
            assert {r["token_prefix"] for r in report["readers"]} == {
                lease.token[:8] for lease in readers
            }
            for reader in report["readers"]:
                assert reader["majority"] is True and reader["servers_held"] == len(urls)
                assert reader["ttl_s"] is not None and 0 < reader["ttl_s"] <= 30
                assert reader["holder"] is None  # readers store no holder info
            assert report["writer"] is None and report["writer_waiting"] is False
        finally:
            for lease in readers:
                lease.release()
        assert set(admin.status(urls, name)) == PLAIN_FIELDS
        with rw.write(wait=5) as writer:
            report = admin.status(urls, name, kind="rwlock")
            assert report["readers"] == []
            seen = report["writer"]
            assert seen is not None and seen["token_prefix"] == writer.token[:8]
            assert seen["majority"] is True and seen["holder"] is not None
            assert seen["holder"]["purpose"] == "rw-test"
            # found automatically, a writer alone is the lock key's holder
            auto = admin.status(urls, name)
            assert set(auto) == PLAIN_FIELDS
            assert all(row["token_prefix"] == writer.token[:8] for row in auto["servers"])
    after = admin.status(urls, name, kind="rwlock")
    assert after["writer"] is None and after["readers"] == []


def test_status_says_a_writer_is_waiting(urls: list[str], name: str) -> None:
    with Client(urls, ttl=30.0) as client:
        rw = client.rwlock(name)
        reader = rw.acquire_read(wait=5)
        got: list[Any] = []

        def write() -> None:
            lease = rw.acquire_write(wait=20)
            got.append(lease)
            lease.release()

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            report = admin.status(urls, name)
            while not report.get("writer_waiting") and time.monotonic() < deadline:
                time.sleep(0.05)
                report = admin.status(urls, name)
            assert report["kind"] == "rwlock" and report["writer_waiting"] is True
            assert report["writer"] is None
            assert [r["token_prefix"] for r in report["readers"]] == [reader.token[:8]]
        finally:
            reader.release()
            thread.join(25)
        assert not thread.is_alive() and len(got) == 1


def test_status_cli_json_and_text_for_a_semaphore(urls: list[str], name: str) -> None:
    with Client(urls, ttl=30.0, purpose="cli-sem") as client:
        sem = client.semaphore(name, limit=3)
        permits = [sem.acquire(wait=5), sem.acquire(wait=5)]
        try:
            result = cli("status", "--key", name, "--json", *server_args(urls))
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout)
            assert set(report) >= PLAIN_FIELDS  # nothing removed
            assert report["kind"] == "semaphore"
            assert {p["slot"] for p in report["permits"]} == {p.slot for p in permits}
            text = cli("status", "--key", name, "--limit", "3", *server_args(urls))
            assert text.returncode == 0, text.stderr
            assert "2 permit(s)" in text.stdout and "limit 3" in text.stdout
            kept = cli("status", "--key", name, *server_args(urls))  # the servers keep it
            assert kept.returncode == 0 and "limit 3" in kept.stdout, kept.stdout
            for permit in permits:
                assert f"slot {permit.slot}: {permit.token[:8]}" in text.stdout
                assert permit.token not in text.stdout  # only the prefix is shown
            assert "cli-sem" in text.stdout
        finally:
            for permit in permits:
                permit.release()
    after = json.loads(cli("status", "--key", name, "--json", *server_args(urls)).stdout)
    assert set(after) == PLAIN_FIELDS


def test_status_cli_text_for_a_read_write_lock(urls: list[str], name: str) -> None:
    with Client(urls, ttl=30.0) as client:
        rw = client.rwlock(name)
        with rw.read(wait=5) as reader:
            text = cli("status", "--key", name, *server_args(urls))
            assert text.returncode == 0, text.stderr
            assert "read-write lock" in text.stdout and "1 reader(s)" in text.stdout
            assert f"reader {reader.token[:8]}" in text.stdout
            assert "writer: none" in text.stdout
        with rw.write(wait=5) as writer:
            text = cli("status", "--key", name, "--kind", "rwlock", *server_args(urls))
            assert text.returncode == 0, text.stderr
            assert f"writer: {writer.token[:8]}" in text.stdout


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda url: admin.status(url, "k", kind="mutex"), id="unknown-kind"),
        pytest.param(lambda url: admin.status(url, "k", limit=0), id="limit-0"),
        pytest.param(lambda url: admin.status(url, "k", limit=True), id="limit-bool"),
        pytest.param(lambda url: admin.status(url, "k", limit=2.0), id="limit-float"),
        pytest.param(lambda url: admin.status(url, "k", kind="rwlock", limit=2), id="limit-rw"),
    ],
)
def test_status_rejects_bad_family_options_before_any_io(call: Any) -> None:
    with pytest.raises(ConfigError):
        call("redis://127.0.0.1:1/0")  # nothing listens there: no I/O is tried


def test_status_cli_rejects_a_limit_for_another_kind() -> None:
    result = cli("status", "--key", "k", "--kind", "lock", "--limit", "2",
                 "--server", "redis://127.0.0.1:1/0")  # fmt: skip
    assert result.returncode == 64, result.stderr


def test_a_permit_held_on_a_minority_is_shown_as_not_valid(topologies: Any, name: str) -> None:
    group = topologies.group(3)
    slot_key = f"fencelock:{{{name}}}:slot:1"  # the key layout DESIGN.md fixes, by hand
    with group.servers[0].client() as c:
        c.set(slot_key, "f" * 40, px=60_000)
        c.set(slot_key + ":holder", '{"host":"h","pid":1}', px=60_000)
    try:
        report = admin.status(group.urls, name)
        assert report["kind"] == "semaphore"
        (permit,) = report["permits"]
        assert permit["slot"] == 1 and permit["token_prefix"] == "f" * 8
        assert permit["servers_held"] == 1 and permit["majority"] is False
        assert permit["ttl_s"] is None  # not valid on a majority
        assert permit["holder"] == {"host": "h", "pid": 1}
        assert [len(row["permits"]) for row in report["servers"]] == [1, 0, 0]
        assert report["servers"][0]["permits"][0]["ttl_s"] is not None
        text = cli("status", "--key", name, *server_args(group.urls))
        assert "on 1/3 servers (not a majority: not valid)" in text.stdout, text.stdout
    finally:
        with group.servers[0].client() as c:
            c.delete(slot_key, slot_key + ":holder")


@pytest.mark.parametrize("odd", ["rep*?[x]", "{tag}:slot", "a\\b"])
def test_a_semaphore_name_with_glob_characters_finds_only_its_own_slots(
    topologies: Any, odd: str
) -> None:
    urls = topologies.urls(1)
    name = f"{odd}-{uuid.uuid4().hex[:8]}"
    lookalike = name.replace("*", "X").replace("?", "Y").replace("\\", "Z") + "-other"
    with Client(urls, ttl=30.0) as client:
        mine = client.semaphore(name, limit=2).acquire(wait=5)
        other = client.semaphore(lookalike, limit=2).acquire(wait=5)
        try:
            permits = admin.status(urls, name)["permits"]
            assert [p["token_prefix"] for p in permits] == [mine.token[:8]]
        finally:
            mine.release()
            other.release()


def test_status_as_the_least_privilege_acl_user_keeps_a_locks_report(
    fencelock_server: Any, name: str
) -> None:
    from fencelock.cli.doctor import ACL_SETUSER

    rules = ["on" if w == "on" else (">pw" if w.startswith(">") else w)
             for w in ACL_SETUSER.split()[3:]]  # fmt: skip
    with fencelock_server.client() as c:
        c.execute_command("ACL", "SETUSER", "locker", "reset", *rules)
    url = f"redis://locker:pw@{fencelock_server.host}:{fencelock_server.port}/0"
    with Client(url, ttl=30.0) as client:
        with client.lock(name).hold(wait=5) as lease:
            # that user may not SCAN: auto still gives the lock's own report, unchanged
            report = admin.status(url, name)
            assert set(report) == PLAIN_FIELDS
            (row,) = report["servers"]
            assert row["error"] is None and row["token_prefix"] == lease.token[:8]
            # a named kind says why its keys could not be read, beside the lock's fields
            (row,) = admin.status(url, name, kind="semaphore")["servers"]
            assert row["error"] is not None and "permits / readers" in row["error"]
            assert "scan" in row["error"].lower()
            assert row["token_prefix"] == lease.token[:8]
        sem = client.semaphore(name + "-sem", limit=2)
        with sem.hold(wait=5) as permit:  # with --limit no SCAN is needed
            (seen,) = admin.status(url, name + "-sem", limit=2)["permits"]
            assert seen["token_prefix"] == permit.token[:8]


def test_status_shows_a_fair_locks_queue_in_line_order(urls: list[str], name: str) -> None:
    queue_key = lock_keys(name).lock + ":fair"
    done: list[bool] = []
    with Client(urls, ttl=30.0) as client:
        holder = client.lock(name, fair=True).acquire(wait=0)

        def wait_in_line() -> None:
            with client.lock(name, fair=True).hold(wait=30.0):
                done.append(True)

        waiters = []
        for count in (1, 2):  # one after the other: the line has a known order
            waiter = threading.Thread(target=wait_in_line)
            waiter.start()
            waiters.append(waiter)
            deadline = time.monotonic() + 10.0
            while len(admin.status(urls, name).get("queue", [])) < count:
                assert time.monotonic() < deadline, "the waiter never showed in the queue"
                time.sleep(0.02)
        report = admin.status(urls, name)
        line = [m.decode()[:8] for m in redis.Redis.from_url(urls[0]).zrange(queue_key, 0, -1)]
        assert [w["waiter_prefix"] for w in report["queue"]] == line
        assert all(w["servers"] == len(urls) for w in report["queue"])
        assert report["servers"][0]["queue"] == line
        text = cli("status", "--key", name, *server_args(urls))
        assert text.returncode == 0 and "fair queue: 2 waiter(s) in line" in text.stdout
        assert f"1. {line[0]}…" in text.stdout, text.stdout
        holder.release()
        for waiter in waiters:
            waiter.join(30.0)
        assert done == [True, True]
    assert "queue" not in admin.status(urls, name)  # nobody in line: the plain report
