"""Short ``fencelock chaos`` runs of the MultiLock, the election and the asyncio front end
(issue 22) on 3 embedded servers, on whichever engine ``$FENCELOCK_SERVER_BIN`` picks (CI runs
this file on Redis and on Valkey).

The faults are those a correct lease survives (a holder paused past its TTL, a paused server,
a server killed and restarted with its AOF), so every checker must pass; and each run must
have done real work: leases granted, the holder pause injected, and a paused holder's stale
write refused by the fenced register (or, for an asyncio election, its body cancelled when
its term was lost). Nothing asserts speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from fencelock.cli.chaos.report import JSON_FIELDS

FAULTS = "pause-holder,pause-server,kill-restart"


def chaos(*args: str, duration: str = "7") -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fencelock", "chaos", "--servers", "3", "--workers", "3",
         "--duration", duration, "--seed", "5", "--faults", FAULTS, "--json", *args],
        capture_output=True, text=True, timeout=240, env=os.environ.copy(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout  # exactly one JSON object on stdout
    data: dict[str, Any] = json.loads(lines[0])
    for name in JSON_FIELDS:
        assert name in data, name
    # safe ...
    assert data["stale_writes_accepted"] == 0 and data["lost_updates"] == 0
    assert data["phantom_writes"] == 0
    assert data["fence_violations"] == 0  # fences strictly grow per key, in grant order
    assert data["double_grants"] == 0
    assert "result: SAFE" in proc.stderr
    # ... and not idle: leases granted, writes accepted, the holder pause injected
    assert data["acquisitions"] >= 20, data["acquisitions"]
    assert data["fenced_writes_accepted"] >= 10
    assert data["faults"].get("pause-holder", 0) >= 1, data["faults"]
    assert data["fault_errors"] == 0, data["fault_log"]
    return data, proc.stderr


def test_chaos_multilock_run_keeps_the_lock_rules_on_each_key() -> None:
    data, stderr = chaos("--primitive", "multi")
    assert data["primitive"] == "multi" and data["front"] == "sync"
    assert data["keys"] == 2
    assert data["fence_violations_by_key"] == {"chaos:a": 0, "chaos:b": 0}
    assert data["stale_writes_rejected"] > 0  # the paused holder's write, refused
    assert "key fence violations" in stderr


def test_chaos_election_run_has_one_leader_per_term_and_refuses_a_deposed_leader() -> None:
    data, stderr = chaos("--primitive", "election")
    assert data["primitive"] == "election" and data["front"] == "sync"
    assert data["terms"] > 1  # leadership changed hands, many times
    assert data["two_leaders_in_a_term"] == 0 and data["terms_out_of_order"] == 0
    assert data["two_leaders_at_once"] == 0
    assert data["terms_lost"] >= 1  # the paused leader was deposed ...
    assert data["stale_writes_rejected"] > 0  # ... and storage refused its stale term
    assert "two leaders in a term" in stderr


@pytest.mark.parametrize("primitive", ["lock", "semaphore"])
def test_chaos_asyncio_run_keeps_the_same_rules(primitive: str) -> None:
    data, stderr = chaos("--front", "asyncio", "--primitive", primitive)
    assert data["primitive"] == primitive and data["front"] == "asyncio"
    assert data["stale_writes_rejected"] > 0
    if primitive == "semaphore":
        assert data["permit_overlaps"] == 0 and data["max_concurrent_permits"] == 2
    assert "(asyncio)" in stderr


def test_chaos_asyncio_election_cancels_a_deposed_leaders_body() -> None:
    data, _stderr = chaos("--front", "asyncio", "--primitive", "election")
    assert data["front"] == "asyncio" and data["terms"] > 1
    assert data["two_leaders_in_a_term"] == 0 and data["terms_out_of_order"] == 0
    assert data["two_leaders_at_once"] == 0
    assert data["terms_lost"] >= 1
    # the paused leader's body was cancelled at its next await (no write sent), or it wrote
    # and storage refused the stale term
    assert data["bodies_cancelled"] + data["stale_writes_rejected"] > 0


def test_chaos_rw_is_rwlock_and_a_bad_front_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fencelock", "chaos", "--duration", "1", "--front", "trio"],
        capture_output=True, text=True, timeout=60, env=os.environ.copy(), check=False,
    )  # fmt: skip
    assert proc.returncode == 64, proc.stderr
    from fencelock.cli.chaos.cli import ChaosConfig

    assert ChaosConfig(primitive="rw").primitive == "rwlock"
    assert ChaosConfig(primitive="election", front="asyncio").front == "asyncio"
