"""``fencelock top``: every lock under a prefix, on one server, three servers and a Cluster."""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from fencelock import Client, ConfigError, NotAcquired
from fencelock.cli import main
from fencelock.cli.top import snapshot
from fencelock.testing import Cluster, ServerGroup


def _top_json(urls: list[str], prefix: str) -> tuple[int, dict[str, Any]]:
    argv = ["top", "--json", "--prefix", prefix]
    for url in urls:
        argv += ["--server", url]
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(argv)
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1, "exactly one JSON object on stdout"
    return code, json.loads(lines[0])


def _by_key(snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["key"]: item for item in snap["items"]}


@pytest.fixture(params=[1, 3], ids=["1-server", "3-servers"])
def urls(request: pytest.FixtureRequest, fencelock_server_binary: str) -> Iterator[list[str]]:
    with ServerGroup(request.param, binary=fencelock_server_binary) as group:
        yield list(group.urls)


def test_top_shows_every_kind_with_holder_ttl_fence_and_waiters(urls: list[str]) -> None:
    prefix = f"top{uuid.uuid4().hex[:6]}:"
    with ExitStack() as stack:
        client = stack.enter_context(Client(urls, ttl=20.0, wait=0.0))
        lease = client.lock(prefix + "plain").acquire()
        stack.callback(lease.release)
        free = client.lock(prefix + "free").acquire()
        free.release()  # leaves only the fence register: shown as a free lock
        permit = stack.enter_context(client.semaphore(prefix + "sem", limit=3).hold())
        reader = stack.enter_context(client.rwlock(prefix + "rw").read())
        term = stack.enter_context(client.election(prefix + "elect", name="host-a").campaign())
        fair = client.lock(prefix + "fair", fair=True)
        held_fair = fair.acquire()
        stack.callback(held_fair.release)

        # a fair waiter queues on every server while it waits (and gives up after 1.5 s)
        def wait_in_line() -> None:
            with pytest.raises(NotAcquired):
                fair.acquire(wait=1.5)

        waiting = threading.Thread(target=wait_in_line, daemon=True)
        waiting.start()
        stack.callback(waiting.join, 5.0)
        deadline_items: dict[str, dict[str, Any]] = {}
        for _ in range(50):  # the waiter queues within a few ms: look until it is seen
            code, snap = _top_json(urls, prefix)
            deadline_items = _by_key(snap)
            if (deadline_items.get(prefix + "fair") or {}).get("waiters"):
                break
        assert code == 0
        items = deadline_items
        assert set(items) == {
            prefix + n for n in ("plain", "free", "sem", "rw", "elect", "fair")
        }, items.keys()
        plain = items[prefix + "plain"]
        assert plain["kind"] == "lock"
        assert plain["token_prefix"] == lease.token[:8]
        # the highest register: over N servers a straggler's own TIME floor can be above the
        # fence the majority agreed on, never below
        assert plain["fence"] == lease.fence if len(urls) == 1 else plain["fence"] >= lease.fence
        assert plain["holder"]["pid"] > 0
        assert 10_000 < plain["ttl_ms"] <= 20_000
        assert plain["servers_held"] == len(urls) and plain["agree"] is True
        assert items[prefix + "free"]["holder"] is None
        assert items[prefix + "free"]["ttl_ms"] is None
        assert items[prefix + "free"]["fence"] >= free.fence
        sem = items[prefix + "sem"]
        assert sem["kind"] == "semaphore"
        assert [p["slot"] for p in sem["permits"]] == [permit.slot]
        rw = items[prefix + "rw"]
        assert rw["kind"] == "rwlock" and len(rw["readers"]) == 1 and rw["writer"] is None
        assert reader.fence > 0
        elect = items[prefix + "elect"]
        assert elect["kind"] == "election" and elect["leader"] == "host-a"
        assert elect["fence"] >= term.fence
        fair_item = items[prefix + "fair"]
        assert fair_item["kind"] == "fair" and fair_item["waiters"] == 1
        assert len(snap["servers"]) == len(urls)
        assert all(row["complete"] and row["error"] is None for row in snap["servers"])


def test_top_reads_only_its_prefix_and_says_when_it_stopped_short(urls: list[str]) -> None:
    prefix = f"top{uuid.uuid4().hex[:6]}:"
    with Client(urls, ttl=20.0, wait=0.0) as client:
        leases = [client.lock(f"{prefix}{i:02d}").acquire() for i in range(5)]
        other = client.lock("elsewhere:" + uuid.uuid4().hex).acquire()
        try:
            snap = snapshot(urls, prefix=prefix, max_items=3)
            assert [item["key"] for item in snap["items"]] == [f"{prefix}{i:02d}" for i in range(3)]
            assert snap["truncated"] is True
        finally:
            for lease in [*leases, other]:
                lease.release()


def test_top_text_and_html_escape_what_holders_wrote(urls: list[str], tmp_path: Path) -> None:
    prefix = f"top{uuid.uuid4().hex[:6]}:"
    with (
        Client(urls, ttl=20.0, wait=0.0) as client,
        client.election(prefix + "e", name="evil\x1b[2J\nforged line <b>").campaign(),
    ):
        out = io.StringIO()
        argv = ["top", "--iterations", "1", "--prefix", prefix]
        for url in urls:
            argv += ["--server", url]
        with redirect_stdout(out):
            assert main(argv) == 0
        text = out.getvalue()
        assert "\x1b" not in text and "\\x1b" in text
        assert "forged line" in text and "\nforged line" not in text
        page = tmp_path / "top.html"
        argv = ["top", "--html", str(page), "--prefix", prefix]
        for url in urls:
            argv += ["--server", url]
        assert main(argv) == 0
        body = page.read_text()
        assert "&lt;b&gt;" in body and "<b>" not in body


def test_top_refuses_bad_input_before_any_io() -> None:
    with pytest.raises(ConfigError):
        snapshot([])
    with pytest.raises(ConfigError):
        snapshot("redis://127.0.0.1:1", prefix="a*b")
    with pytest.raises(ConfigError):
        snapshot("redis://127.0.0.1:1", max_items=0)
    with pytest.raises(ConfigError):
        snapshot(["redis+cluster://127.0.0.1:1", "redis://127.0.0.1:2"])


def test_top_reports_a_server_that_does_not_answer(fencelock_server_binary: str) -> None:
    from fencelock.testing import refused_urls

    (dead,) = refused_urls(1)
    code, snap = _top_json([dead], "x")
    assert code == 69
    assert snap["servers"][0]["error"]
    assert snap["items"] == []


def test_top_over_a_cluster_scans_each_primary(fencelock_server_binary: str) -> None:
    prefix = f"top{uuid.uuid4().hex[:6]}:"
    with (
        Cluster(3, 0, binary=fencelock_server_binary) as cluster,
        Client(cluster.url, ttl=20.0, wait=0.0) as client,
    ):
        names = [f"{prefix}{i}" for i in range(12)]  # spread over the three primaries
        leases = [client.lock(name).acquire() for name in names]
        try:
            code, snap = _top_json([cluster.url], prefix)
            assert code == 0
            assert len(snap["servers"]) == 3
            items = _by_key(snap)
            assert set(items) == set(names)
            for lease, name in zip(leases, names, strict=True):
                assert items[name]["fence"] == lease.fence
                assert items[name]["token_prefix"] == lease.token[:8]
            assert sum(1 for row in snap["servers"] if row["keys_scanned"]) >= 2
        finally:
            for lease in leases:
                lease.release()
