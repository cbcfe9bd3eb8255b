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
    "acquire": "90f40b49d49d20c301361b7020c8dc1655b9a510",
    "release": "e6c6e5b3f5a8339c4fb1c54743cb6b6699fa682a",
    "extend": "bd682e77c0f6e0fe2efb539496be91ae03223d5a",
    "fence_commit": "5f2e2689de560c8d57d2807f672ef009ef139386",
    "elect_announce": "184ba226218e9aa0b7519308827fcd721fa28327",
    "elect_read": "f70afe12a393aff3993e9b63f3c5cbe428531cd8",
    "sem_acquire": "3f96be288442efd53934412681c983cfed74b455",
    "sem_sweep": "162b55bcd37459661954cfda420c9b8110a34e1c",
    "sem_fence_commit": "dce883065bebb2de31035a4f73f2d8ac37d6f484",
    "rw_read_acquire": "8331689a4e42e1ce97e3ba0b8f28e89bdb0fd651",
    "rw_read_commit": "beee2dd374ffda16c79d875dbcccca9a24ba2c20",
    "rw_read_extend": "af810cf64c63510f762fc826c3a66a97b02376da",
    "rw_read_release": "a4c2200aba55b2265174d25262aa579d05d36646",
    "rw_write_acquire": "37638a8ce07ef5cb3c9869fa023d514affab4590",
    "rw_write_release": "328b62f59146fed95573bda3db99c756da9c9ee9",
    "fair_acquire": "b8d2f019b731fc719e3387db94598ce575706c76",
    "fair_release": "47d3bfc0db1233cc830d3c05a1480486acdc7ea5",
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
