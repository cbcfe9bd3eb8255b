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
    "acquire": "a44f6166e18fd41ae874ac64cad657444f19364c",
    "release": "6fd9b01aa09acb096709f060b3efc965a24f0fb9",
    "extend": "b676294b7416a2cf7f647384bfbaabcabfcf944d",
    "fence_commit": "93dd03dca5e019c3fb53981119758e3002d88063",
    "elect_announce": "b7339a072b28365c4e0479435c11b8aaa41a6daf",
    "elect_read": "536335c6640f34755417dce4057e7150cc63e779",
    "sem_acquire": "e446a431d928d9cf98a01ac69bf65bbb2f847874",
    "sem_sweep": "18a329484433c6eadd7f34dbfdafb13a1b983244",
    "sem_fence_commit": "e92350c2df200f0b21bd1a75f8fad166ac7f9d62",
    "rw_read_acquire": "a5c65d550084b4c406c74248d6dc3401a5dee20b",
    "rw_read_commit": "058043b817dcfa9e939513a94dab1a221ff8e12c",
    "rw_read_extend": "af810cf64c63510f762fc826c3a66a97b02376da",
    "rw_read_release": "e36c13dd732be30470725aafc08649c91301d8b0",
    "rw_write_acquire": "f78806ddd2b25cc3280d38fbcf619ed57e301fc9",
    "rw_write_release": "0afff886276144ebb6dacb34af38b65b004449d0",
    "fair_acquire": "5876f5de79baf44b0c813b79c5a5b16d490495e9",
    "fair_release": "2c66ed25796d4767988edfa42efbd54e0297b3a5",
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
