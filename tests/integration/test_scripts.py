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
    "acquire": "c00ad876dbb977ccae15ea9bbcf0d3fca9b9286c",
    "release": "bc1bb10a7bfb971cbce221d25fbc5effb8102e55",
    "extend": "07c66b20e72c628c175ecd454b5939fd251c9f8c",
    "fence_commit": "b00dab476a1bed11fe076beaf3900763fcc730e2",
    "elect_announce": "dd29974f83341620196507c6b189fa075974cfe3",
    "elect_read": "c9c5b1ff47bf53f472c4e106b6335d1f0e347070",
    "sem_acquire": "1b093c66013c69c636fcba5b27315cd17733d4b5",
    "sem_sweep": "eee9684b962b388b3d1b1c80cdf5563d0e312b3e",
    "sem_fence_commit": "dddcbc01099e2e874d40caebed1f0793299fe861",
    "rw_read_acquire": "0143329f405b6c72c01c6e2a65b75b34e4dc36b4",
    "rw_read_commit": "41db3111a701b1bfed528b5c67ef4942dca8d976",
    "rw_read_extend": "af810cf64c63510f762fc826c3a66a97b02376da",
    "rw_read_release": "a4c2200aba55b2265174d25262aa579d05d36646",
    "rw_write_acquire": "c8c7e939586012ebca5735cb544e3ea194ac153b",
    "rw_write_release": "0c3c0d6bc43f256369ad388613525bdadb6f418f",
    "fair_acquire": "2e21f2e26090c6dbd3a81db158b504869586d907",
    "fair_release": "5a33d208dc6a118143d6faafe0392ff31a5d6489",
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
