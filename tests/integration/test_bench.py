"""``fencelock bench --json`` in quick mode: the contract's fields exist and are positive numbers.

Speeds are never asserted (the machine is shared and noisy); only that every figure was measured.
"""

from __future__ import annotations

import json
import math

import pytest

from fencelock.cli import bench

FIELDS = {
    "single": (
        "ops_per_s",
        "p50_us",
        "p99_us",
        "baseline_ops_per_s",
        "ratio_to_baseline",
        # v0.2
        "per_key_ratio_to_baseline",
        "server_cpu_ratio",
        # v0.3
        "server_commands_per_op",
        "baseline_server_commands_per_op",
        "bytes_per_held_lock",
        # the server's execution of what each case sends (issue 24)
        "server_exec_us_per_op",
        "baseline_server_exec_us_per_op",
        "server_exec_ratio",
    ),
    "redlock": (
        "servers",
        "p50_us",
        "p99_us",
        "single_p50_us",
        "ratio_p50_to_single",
        "ratio_p50_to_raw_single",  # v0.3
        # one asyncio task over N servers against one raw redis.asyncio task (issue 24)
        "async_p50_us",
        "async_raw_single_p50_us",
        "async_ratio_p50_to_raw_single",
    ),
    "handoff": (
        "workers",
        "p50_us",
        "p99_us",
        "acquisitions_per_s",
        "max_wait_ratio",
        "other_worker_p50_us",  # v0.2
    ),
    "async": (
        "tasks",
        "ops_per_s",
        "baseline_ops_per_s",
        "ratio_to_baseline",
        "per_key_ratio_to_baseline",  # v0.2
        "one_task_ratio_to_baseline",  # v0.3
    ),
    # v0.2
    "faults": (
        "servers",
        "healthy_p50_us",
        "hung_1_p50_us",
        "black_holed_2_p50_us",
        "refused_2_p50_us",
    ),
    # the family against the plain Lock, same run
    "family": (
        "lock_ops_per_s",
        "lock_p50_us",
        "semaphore_limit",
        "semaphore_ops_per_s",
        "semaphore_p50_us",
        "semaphore_ratio_to_lock",
        "rw_read_ops_per_s",
        "rw_read_p50_us",
        "rw_read_ratio_to_lock",
        "rw_write_ops_per_s",
        "rw_write_p50_us",
        "rw_write_ratio_to_lock",
        "fair_ratio_to_lock",
        "reentrant_ratio_to_lock",
        "multilock_2_ratio_to_lock",
    ),
    # issue 26: a new process's `fencelock run --key K -- true` (median wall time, s)
    "cli": ("run_true_s", "runs"),
}


def _positive_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def test_bench_json_has_every_field_as_a_positive_number(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(bench.QUICK_ENV, "1")
    assert bench.run([], json_output=True) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1, "exactly one JSON object on stdout"
    result = json.loads(out)
    assert result["quick"] is True
    for section, fields in FIELDS.items():
        for field in fields:
            assert _positive_number(result[section][field]), (section, field, result[section])
    assert result["redlock"]["servers"] == 5
    assert result["handoff"]["workers"] == 8
    assert result["async"]["tasks"] == 50
    faults = result["faults"]
    assert faults["servers"] == 5 and "skipped" not in faults, faults
    # each sick case ran at least the quick plan's minimum of timed cycles
    for case in ("healthy", "hung_1", "black_holed_2", "refused_2"):
        assert isinstance(faults[f"{case}_cycles"], int) and faults[f"{case}_cycles"] >= 3
    # CPU figures are per operation, both measured (a ratio of two positive numbers)
    single = result["single"]
    assert single["server_cpu_us_per_op"] > 0 and single["baseline_server_cpu_us_per_op"] > 0
    assert single["server_cpu_ratio"] == pytest.approx(
        single["server_cpu_us_per_op"] / single["baseline_server_cpu_us_per_op"]
    )
    # the server's execution of what each case sent (commandstats usec): both measured
    assert single["server_exec_us_per_op"] > 0 and single["baseline_server_exec_us_per_op"] > 0
    assert single["server_exec_ratio"] == pytest.approx(
        single["server_exec_us_per_op"] / single["baseline_server_exec_us_per_op"]
    )
    # server commands per acquire+release: counted by name (the scripts' own calls included),
    # at least the baseline's SET + EVALSHA (+ its GET and DEL)
    assert single["server_commands_per_op"] == sum(single["server_commands_by_name"].values())
    assert single["server_commands_by_name"]["evalsha"] == 2  # one round trip each way
    assert single["server_commands_per_op"] >= single["baseline_server_commands_per_op"] >= 2
    # which path each operation took (the Lua scripts today), and what the server could offer
    natives = result["native_commands"]
    assert {natives[op] for op in ("acquire", "extend", "release")} == {"script"}, natives
    assert isinstance(natives["server_has"], list)
    if result["env"]["engine"] == "valkey":  # Valkey 8.1 has SET ... IFEQ
        assert "SET IFEQ" in natives["server_has"], natives
    assert result["redlock"]["raw_single_p50_us"] == single["baseline_p50_us"]
    red = result["redlock"]
    assert red["async_ratio_p50_to_raw_single"] == pytest.approx(
        red["async_p50_us"] / red["async_raw_single_p50_us"]
    )
    # every worker got the lock at least once, and a release leaves only the fence register
    assert all(count > 0 for count in result["handoff"]["per_worker"])
    # v0.3: one server hands the lock over in its release, so a woken waiter holds it with
    # the wake-up's reply (BLMOVE) and runs no round of its own (1 per plain wake-up)
    for figures in (result["handoff"], result["handoff"]["threads"]):
        assert figures["woken_acquisitions"] > 0, figures
        assert figures["claim_rtts"] == 0.0, figures
    # the human table has a line for each v0.2 figure
    text = bench._human(result)
    for label in (
        "single: new Lock per cycle ops/s",
        "single: server CPU us/op",
        "single: server commands/op",
        "async: new Lock per cycle ops/s",
        "release -> other worker p50 us",
        "1 hung (SIGSTOP)",
        "2 black-holed",
        "2 refused",
    ):
        assert label in text, label
    assert result["memory"]["bytes_per_held_lock"] > 0
    assert result["memory"]["garbage_after_release"] == 0
    assert result["garbage_keys"] == []
    # the family: ratios are the ops/s over the Lock's of the same run; memory per permit and
    # per read lease measured, and nothing of theirs left after release
    family = result["family"]
    for case in ("semaphore", "rw_read", "rw_write", "fair", "reentrant", "multilock_2"):
        assert family[f"{case}_ratio_to_lock"] == pytest.approx(
            family[f"{case}_ops_per_s"] / family["lock_ops_per_s"]
        )
    assert family["semaphore_limit"] == 4
    memory = result["memory"]
    for field in ("bytes_per_held_permit", "bytes_two_permits", "bytes_per_read_lease"):
        assert isinstance(memory[field], int) and memory[field] > 0, (field, memory)
    assert isinstance(memory["bytes_per_extra_read_lease"], int)
    assert memory["bytes_per_extra_read_lease"] >= 0
    assert set(memory["permit_bytes_by_key"]) == {":slot:0"}  # its holder info in its value
    assert memory["bytes_per_held_permit"] == sum(memory["permit_bytes_by_key"].values())
    assert memory["permit_keys_after_release"] == 0
    assert memory["read_keys_after_release"] == 0
    for label in ("semaphore (limit 4): permit", "rwlock: read lease", "rwlock: write lease",
                  "per held semaphore permit", "per read lease",
                  "per key locked once"):  # fmt: skip
        assert label in text, label
    # a key locked once costs memory until its fence register's retention ran out, then none:
    # every register is gone, and what is left per key is allocator noise (well under what a
    # key cost: the register alone is about 100 B)
    assert memory["bytes_per_key_used_once"] > 0 and memory["register_bytes"] > 0, memory
    assert memory["registers_left_after_retention"] == 0, memory
    assert memory["keys_used_once"] >= 1000 and memory["retention_s"] > 0, memory
    assert abs(memory["bytes_after_retention"]) < memory["bytes_per_key_used_once"] / 2, memory


def test_bench_against_given_servers_leaves_no_keys(
    fencelock_server: object, capsys: pytest.CaptureFixture[str]
) -> None:
    url: str = fencelock_server.url  # type: ignore[attr-defined]
    assert bench.run([url], json_output=True, quick=True) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["redlock"]["servers"] == 1
    # the faults case runs on servers the bench starts itself, never on a user's servers
    assert result["faults"]["servers"] == 5
    assert _positive_number(result["faults"]["hung_1_p50_us"])
    for field in FIELDS["redlock"]:
        assert _positive_number(result["redlock"][field]), field
    client = fencelock_server.client()  # type: ignore[attr-defined]
    assert client.dbsize() == 0, "the bench removes its keys from a user's server"


def test_bench_rejects_a_bad_url_before_any_io() -> None:
    from fencelock import ConfigError

    with pytest.raises(ConfigError):
        bench.run(["http://nowhere"], json_output=True, quick=True)
