"""The Lua scripts: each SHA pinned against a real server, and the NOSCRIPT fallback."""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

from typing import Any

import pytest
from api import LockFactory, front, lock_value, make_lock  # noqa: F401

from fencelock._scripts import ALL, BY_NAME


def test_every_script_is_listed() -> None:
    assert {s.name for s in ALL} == {
        "acquire",
        "release",
        "extend",
        "fence_commit",
        "elect_announce",
        "elect_read",
        "sem_acquire",
        "sem_sweep",
        "sem_fence_commit",
        "rw_read_acquire",
        "rw_read_commit",
        "rw_read_extend",
        "rw_read_release",
        "rw_write_acquire",
        "rw_write_release",
        "fair_acquire",
        "fair_release",
        "fair_leave",
    }
    assert len({s.sha for s in ALL}) == len(ALL)


@pytest.mark.parametrize("script", ALL, ids=lambda s: s.name)
def test_sha_matches_script_load(fencelock_session_server: Any, script: Any) -> None:
    client = fencelock_session_server.client()
    assert client.script_load(script.source) == script.sha
    assert client.script_exists(script.sha) == [True]
    # the header documents the KEYS the script is called with (a variadic one: its fixed
    # leading keys, then the repeated group)
    text = script.source.decode()
    assert f"KEYS[{script.numkeys}]" in text
    if script.variadic:
        assert "variadic" in text.split("\nlocal ", 1)[0]
    else:
        assert f"KEYS[{script.numkeys + 1}]" not in text


#: Changing a script changes its SHA: deployed servers keep the old one cached, so say so.
SHAS = {
    "acquire": "af712ef6b8ca3768fb399c774c7ee8afb5600fcd",
    "release": "584d15406cd000ba9f6ae5648185008a68c53b23",
    "extend": "4e3c65ca9dbb8c878577ed2d7e8295abbfc6affb",
    "fence_commit": "d737600cb3d048e087aa81d2a17de7b90c25adbf",
    "elect_announce": "67c5da1be7769ff0c1c763a1bf9f4502ba0b9858",
    "elect_read": "66866ef41563323a1dfce0570c3f814557da8e3d",
    "sem_acquire": "b069a838e96fd30a016a6e691a859457f75a30c3",
    "sem_sweep": "aff25c99be1c9fd8d49b92cc12153de0b63040bd",
    "sem_fence_commit": "fa17229b7dc938c9fea1cd9023d7f47a69975bc8",
    "rw_read_acquire": "9c21e8f9c2c80a20fd955a458220ed86c747c885",
    "rw_read_commit": "0df2f4a794a82f773117332b6798706a3141ccb8",
    "rw_read_extend": "2464f17192ac9e2a3e7a0a1d9bb7f9771f6a922b",
    "rw_read_release": "535692975132f29d978c63ebe5ec5d227641b2d8",
    "rw_write_acquire": "3cc2e3a4d315e1e2866d735e47ae1645353aa326",
    "rw_write_release": "581212d1cc66beece09852da1ed6f1a4b9d55708",
    "fair_acquire": "5f36cebe2fdf0c45a27ac8ca1d3994845adcc857",
    "fair_release": "872bc35403c1531b966f270b8d21447d4adf3496",
    "fair_leave": "2c61a2abfc77159cccb10269f4286b5acc4037d5",
}


def test_script_shas_are_pinned() -> None:
    assert {name: BY_NAME[name].sha for name in SHAS} == SHAS


@pytest.mark.parametrize("n", [1, 3])
def test_lock_works_after_script_flush(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    group = topologies.group(n)
    clients = [s.client() for s in group.servers]
    lock = make_lock(group.urls, key, ttl=10)
    lock.acquire(wait=0).release()  # scripts cached, connections open
    for client in clients:
        client.script_flush()
        assert client.script_exists(*[s.sha for s in ALL]) == [False] * len(ALL)
    lease = lock.acquire(wait=0)  # acquire (+ fence_commit for n > 1) via EVAL fallback
    assert sum(lock_value(c, key) == lease.token for c in clients) >= n // 2 + 1
    for client in clients:
        client.script_flush()
    lease.extend(20)
    assert lease.remaining() > 15
    for client in clients:
        client.script_flush()
    lease.release()
    assert all(lock_value(c, key) is None for c in clients)
