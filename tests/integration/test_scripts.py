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
    "acquire": "a8244aae2899aa87746c401c5aca20dd941d270a",
    "release": "04cb77600118d3b9589eb1557ee2b557e4224c8a",
    "extend": "4e3c65ca9dbb8c878577ed2d7e8295abbfc6affb",
    "fence_commit": "520420c4e38450c058d2d8551665040bbde77ab7",
    "elect_announce": "67c5da1be7769ff0c1c763a1bf9f4502ba0b9858",
    "elect_read": "16b27e06e49391d96be8fcb0decd5253491f4d82",
    "sem_acquire": "e707b5c5c191d29a0a642e83e62fabb99dd91a60",
    "sem_sweep": "aff25c99be1c9fd8d49b92cc12153de0b63040bd",
    "sem_fence_commit": "529d3376da37ed31c581d28f94c6285934dd1657",
    "rw_read_acquire": "0143329f405b6c72c01c6e2a65b75b34e4dc36b4",
    "rw_read_commit": "41db3111a701b1bfed528b5c67ef4942dca8d976",
    "rw_read_extend": "af810cf64c63510f762fc826c3a66a97b02376da",
    "rw_read_release": "a4c2200aba55b2265174d25262aa579d05d36646",
    "rw_write_acquire": "b69fa1982b905a730a846be7d1ba4ba7e0cff225",
    "rw_write_release": "76f84b1c19739957e977e252943a964e42d8ab81",
    "fair_acquire": "20904fc870b91208426d0278cabb2672b9c567b1",
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
