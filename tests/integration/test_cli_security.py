"""The smaller holes of issue 23 #4, on real servers: what ``fencelock status`` prints of
holder info and leader names (written by whoever may write the lock's keys), holder info
nested without bound, a password given as ``?password=``, a user name without a password."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

import fencelock
from fencelock._core.keys import lock_keys
from fencelock.testing import Server

BOUND = 60.0  # seconds, a liveness bound for each command (the machine is shared)
ESC = "\x1b"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    return subprocess.run(
        [sys.executable, "-m", "fencelock", *args],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env=env,
    )


@pytest.fixture
def closed_url(fencelock_server_binary: str) -> str:
    """The URL of a server that was started and stopped: nothing listens on its port."""
    stopped = Server(fencelock_server_binary).start()
    url = stopped.url
    stopped.stop()
    return url


@pytest.fixture
def server(fencelock_session_server: Server) -> Server:
    return fencelock_session_server


@pytest.fixture
def client(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


FORGED = f"{ESC}]0;owned{chr(7)}{ESC}[2J\nlock 'x': held on 0/1 servers (majority 1)\u202e"


def test_status_escapes_control_characters_in_holder_fields(server: Server, key: str) -> None:
    lock = fencelock.Lock(server.url, key, ttl=30, purpose=FORGED)
    with lock.hold(wait=1):
        result = cli("status", "--key", key, "--server", server.url)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert ESC not in out and "\u202e" not in out and chr(7) not in out
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x0alock 'x'" in out  # shown, escaped, on its line
    assert not any(line.startswith("lock 'x'") for line in out.splitlines())


def test_status_escapes_a_leader_name(server: Server, key: str) -> None:
    election = fencelock.Client(server.url, ttl=30.0).election(key, name=FORGED)
    with election.campaign(wait=2):
        result = cli("status", "--key", key, "--server", server.url)
    assert result.returncode == 0, result.stderr
    leader_lines = [line for line in result.stdout.splitlines() if line.startswith("leader: ")]
    assert len(leader_lines) == 1 and ESC not in result.stdout, result.stdout
    assert leader_lines[0].startswith("leader: \\x1b]0;owned")


DEEP = "[" * 200_000 + "]" * 200_000  # json.loads recurses once per level


@pytest.mark.parametrize("where", ["value", "holder key"])
def test_status_and_leader_survive_holder_info_nested_without_bound(
    server: Server, client: redis.Redis, key: str, where: str
) -> None:
    """In the lock key's value (after byte 255), or in the ``:holder`` key of 0.3's layout."""
    keys = lock_keys(key)
    if where == "value":
        client.set(keys.lock, b"f" * 40 + b"\xff" + DEEP.encode(), px=30_000)
    else:
        client.set(keys.lock, "f" * 40, px=30_000)
        client.set(keys.holder, DEEP, px=30_000)
    result = cli("status", "--key", key, "--server", server.url, "--json")
    assert result.returncode == 0, result.stderr
    assert "RecursionError" not in result.stderr
    text = cli("status", "--key", key, "--server", server.url)
    assert text.returncode == 0 and "held by ffffffff" in text.stdout, text.stderr
    election = fencelock.Client(server.url, ttl=30.0).election(key, name="n")
    leader = election.leader()  # raised RecursionError before
    assert leader is None or leader.name != ""


def test_a_password_in_the_query_is_never_printed(closed_url: str, key: str) -> None:
    url = closed_url + "?password=s3cret-in-query"
    for args in (["doctor", "--server", url], ["status", "--key", key, "--server", url]):
        result = cli(*args)
        assert result.returncode != 0
        assert "s3cret" not in result.stdout + result.stderr, (args, result)
    # doctor names the URL it could not reach: redacted like a password in the netloc
    assert "?password=***" in cli("doctor", "--server", url).stderr


def test_a_user_name_without_a_password_is_refused_before_any_io(key: str) -> None:
    for args in (
        ["run", "--key", key, "--server", "redis://app@127.0.0.1:1/0", "--", "true"],
        ["status", "--key", key, "--server", "redis://app@127.0.0.1:1/0"],
    ):
        result = cli(*args)
        assert result.returncode == 64, result
        assert "no password" in result.stderr
    with pytest.raises(fencelock.ConfigError, match="no password"):
        fencelock.Lock("redis://app@127.0.0.1:1/0", key)
