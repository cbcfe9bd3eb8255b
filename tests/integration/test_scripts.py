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
    "acquire": "268811146644c395f087eda3e254ff3bf971af3d",
    "release": "18b2cbc1d80dcb981dfabfecea122c03749a1559",
    "extend": "cc903e64b15236d4db3b1b4d152b8691118d2db1",
    "fence_commit": "62ce3e88bcbc3e90ecc54abd539626f92047e598",
    "elect_announce": "b7339a072b28365c4e0479435c11b8aaa41a6daf",
    "elect_read": "536335c6640f34755417dce4057e7150cc63e779",
    "sem_acquire": "7b1fcb414a6a41e28b2039a431dac510947bc691",
    "sem_sweep": "18a329484433c6eadd7f34dbfdafb13a1b983244",
    "sem_fence_commit": "cc50c80dc6ad0de1eeac2d12923428e91cd776a4",
    "rw_read_acquire": "c8c6e789b50e6373088037758a14fdb1b6648c95",
    "rw_read_commit": "593fb70ad8ddc3247b4d12f5c5e7b43a68a821ee",
    "rw_read_extend": "af810cf64c63510f762fc826c3a66a97b02376da",
    "rw_read_release": "a4c2200aba55b2265174d25262aa579d05d36646",
    "rw_write_acquire": "022ab9c80bd5ea30eaed0e03625823d16cdf4f53",
    "rw_write_release": "cbee3e81bc22aff10bea1f5555bc6c795c47590b",
    "fair_acquire": "ccbfd4374f5bef9b2d8b22a42ea5c318b54f9890",
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
