"""``fencelock doctor`` against good and bad setups (real servers, each started for its case)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from fencelock import cli
from fencelock.cli.doctor import ACL_SETUSER, DEFAULT_TIMEOUT, Report, diagnose
from fencelock.testing import Server, refused_url
from fencelock.testing.pytest_plugin import ServerGroupFactory

SERVER_FIELDS = {
    "server", "engine", "version", "role", "maxmemory_policy", "appendonly", "appendfsync",
    "native_commands", "clock_offset_ms", "run_id",
}  # fmt: skip
CHECK_FIELDS = {"name", "ok", "severity", "detail"}


def doctor_json(capsys: pytest.CaptureFixture[str], *urls: str) -> tuple[int, dict[str, Any]]:
    argv = ["doctor", "--json"]
    for url in urls:
        argv += ["--server", url]
    code = cli.main(argv)
    out = capsys.readouterr().out
    report: dict[str, Any] = json.loads(out)  # exactly one JSON object on stdout
    return code, report


def check(report: Report | dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in report["checks"] if c["name"] == name]
    assert len(found) == 1, report["checks"]
    result: dict[str, Any] = found[0]
    return result


def failed(report: Report | dict[str, Any]) -> set[str]:
    return {c["name"] for c in report["checks"] if not c["ok"]}


def test_a_good_setup_passes_every_check_and_exits_0(
    fencelock_servers: ServerGroupFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    group = fencelock_servers(2, persistence="aof-always")
    code, report = doctor_json(capsys, *group.urls)
    assert set(report) == {"servers", "checks"}
    assert failed(report) == set(), report["checks"]
    assert code == 0
    assert len(report["servers"]) == 2
    for row, server in zip(report["servers"], group, strict=True):
        assert set(row) == SERVER_FIELDS
        assert row["server"] == f"127.0.0.1:{server.port}/0"
        assert row["engine"] == server.engine.name
        assert row["role"] == "master"
        assert row["maxmemory_policy"] == "noeviction"
        assert row["appendonly"] is True and row["appendfsync"] == "always"
        assert row["run_id"] == server.run_id
        assert abs(row["clock_offset_ms"]) < 1000  # same host: the same clock
    names = {c["name"] for c in report["checks"]}
    assert {
        "reachable", "eviction_policy", "persistence", "clock_offsets", "independence",
        "replicas", "acl", "native_commands",
    } <= names  # fmt: skip
    for item in report["checks"]:
        assert set(item) == CHECK_FIELDS
        assert item["severity"] in ("error", "warning", "info")


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lru"])
def test_an_eviction_policy_that_can_evict_lock_keys_fails_and_says_noeviction(
    fencelock_server_binary: str, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    with Server(
        fencelock_server_binary,
        persistence="aof-always",
        extra_args=("--maxmemory-policy", policy),
    ) as server:
        code, report = doctor_json(capsys, server.url)
    assert code == 1
    assert failed(report) == {"eviction_policy"}
    detail = check(report, "eviction_policy")["detail"]
    assert policy in detail and "noeviction" in detail
    assert ("TTL" in detail) if policy.startswith("volatile") else ("any key" in detail)
    assert report["servers"][0]["maxmemory_policy"] == policy


def test_a_server_without_fsynced_aof_fails_persistence_and_says_what_a_restart_does(
    fencelock_server: Server,
) -> None:
    report = diagnose(fencelock_server.url)
    assert report["servers"][0]["appendonly"] is False
    item = check(report, "persistence")
    assert not item["ok"]
    assert "appendonly no" in item["detail"]
    assert "appendfsync always" in item["detail"] and "fence" in item["detail"]


def test_a_replica_given_as_a_node_fails_and_names_its_primary(
    fencelock_servers: ServerGroupFactory,
) -> None:
    primary, replica = fencelock_servers(2, persistence="aof-always")
    with replica.client() as client:
        client.config_set("masterauth", primary.password)
        client.execute_command("REPLICAOF", primary.host, primary.port)
    report = diagnose([primary.url, replica.url])
    assert report["servers"][1]["role"] == "slave"
    item = check(report, "replicas")
    assert not item["ok"] and item["severity"] == "error"
    assert f"127.0.0.1:{replica.port}/0" in item["detail"]
    assert f"{primary.host}:{primary.port}" in item["detail"]
    assert "primaries" in item["detail"]


def test_the_same_server_under_two_names_fails_independence(
    fencelock_servers: ServerGroupFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    (server,) = fencelock_servers(1, persistence="aof-always")
    code, report = doctor_json(capsys, server.url, server.url.replace("127.0.0.1", "localhost"))
    assert code == 1
    assert failed(report) == {"independence"}
    assert "listed twice" in check(report, "independence")["detail"]
    assert report["servers"][0]["run_id"] == report["servers"][1]["run_id"]


def test_an_unreachable_server_exits_69_and_is_named(
    fencelock_servers: ServerGroupFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    (server,) = fencelock_servers(1, persistence="aof-always")
    dead = refused_url()
    began = time.monotonic()
    code, report = doctor_json(capsys, server.url, dead)
    assert time.monotonic() - began < 10 * DEFAULT_TIMEOUT
    assert code == 69
    item = check(report, "reachable")
    assert not item["ok"]
    assert dead.removeprefix("redis://") in item["detail"]
    assert report["servers"][1]["run_id"] is None and report["servers"][1]["engine"] is None
    assert report["servers"][0]["run_id"] == server.run_id  # the other one is still judged


def acl_url(server: Server, user: str, *rules: str) -> str:
    with server.client() as client:
        client.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *rules)
    return f"redis://{user}:pw@127.0.0.1:{server.port}/0"


def least_privilege_rules() -> list[str]:
    words = ACL_SETUSER.split()
    assert words[:4] == ["ACL", "SETUSER", "fencelock", "on"]
    return [w for w in words[4:] if not w.startswith(">")]


def test_the_least_privilege_user_passes_the_acl_check(fencelock_server: Server) -> None:
    url = acl_url(fencelock_server, "lp", *least_privilege_rules())
    report = diagnose(url)
    assert check(report, "acl")["ok"], check(report, "acl")
    assert report["servers"][0]["run_id"] == fencelock_server.run_id  # INFO allowed


@pytest.mark.parametrize(
    ("missing", "expected"),
    [("-eval", "EVAL"), ("-evalsha", "EVALSHA"), ("-blpop", "BLPOP"), ("-zadd", "ZADD"),
     ("-pexpire", "PEXPIRE"), ("-time", "TIME")],
)  # fmt: skip
def test_a_user_missing_one_permission_fails_the_acl_check_naming_it(
    fencelock_server: Server, missing: str, expected: str
) -> None:
    url = acl_url(fencelock_server, "short", *least_privilege_rules(), missing)
    item = check(diagnose(url), "acl")
    assert not item["ok"] and item["severity"] == "error"
    assert f"may not run {expected}" in item["detail"] or f", {expected}" in item["detail"]
    assert f"ACL SETUSER short +{expected.lower()}" in item["detail"]


def test_a_user_without_info_and_role_works_but_is_warned_about_hidden_checks(
    fencelock_server: Server,
) -> None:
    url = acl_url(fencelock_server, "blind", *least_privilege_rules(), "-info", "-role")
    report = diagnose(url)
    item = check(report, "acl")
    assert not item["ok"] and item["severity"] == "warning"
    assert "INFO, ROLE" in item["detail"]
    assert report["servers"][0]["run_id"] is None


def test_native_commands_follow_the_engine_and_version(fencelock_server: Server) -> None:
    (row,) = diagnose(fencelock_server.url)["servers"]
    engine = fencelock_server.engine.name
    version = tuple(int(part) for part in fencelock_server.engine.version.split(".")[:2])
    expected = []
    if (engine == "valkey" and version >= (8, 1)) or (engine == "redis" and version >= (8, 4)):
        expected.append("SET IFEQ")
    if engine == "valkey" and version >= (9,):
        expected.append("DELIFEQ")
    if engine == "redis" and version >= (8, 4):
        expected.append("DELEX")
    assert row["native_commands"] == expected
