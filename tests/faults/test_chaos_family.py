"""Short ``fencelock chaos --primitive semaphore|rwlock`` runs on 3 embedded servers: the fenced
register stays safe and the primitive's own checkers find no violation.

The faults are those a correct lease survives (paused holders and servers, a server killed and
restarted with its AOF), so every checker must pass. Nothing asserts speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from fencelock.cli.chaos.report import JSON_FIELDS

FAULTS = "pause-holder,pause-server,kill-restart"


def chaos(*args: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fencelock", "chaos", "--servers", "3", "--duration", "8",
         "--seed", "7", "--faults", FAULTS, "--json", *args],
        capture_output=True, text=True, timeout=240, env=os.environ.copy(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout  # exactly one JSON object on stdout
    data: dict[str, Any] = json.loads(lines[0])
    for name in JSON_FIELDS:
        assert name in data, name
    assert data["stale_writes_accepted"] == 0 and data["lost_updates"] == 0
    assert data["acquisitions"] > 0
    assert data["fence_violations"] == 0  # fences strictly grow per key, in grant order
    assert data["double_grants"] == 0
    assert "result: SAFE" in proc.stderr
    return data, proc.stderr


def test_chaos_semaphore_run_never_has_more_than_limit_valid_permits() -> None:
    data, stderr = chaos("--primitive", "semaphore", "--limit", "2")
    assert data["primitive"] == "semaphore" and data["limit"] == 2
    assert data["permit_overlaps"] == 0
    assert 1 <= data["max_concurrent_permits"] <= 2
    assert "permits over the limit" in stderr


def test_chaos_rwlock_run_never_has_a_writer_with_a_reader_or_two_writers() -> None:
    data, stderr = chaos("--primitive", "rwlock")
    assert data["primitive"] == "rwlock"
    assert data["writer_with_reader"] == 0 and data["two_writers"] == 0
    assert data["writer_fence_violations"] == 0
    assert data["reads"] > 0 and data["writes"] > 0  # both modes ran
    assert data["max_readers"] >= 1
    assert "writer with a reader" in stderr


def test_chaos_fair_lock_run_keeps_the_lock_rules() -> None:
    """Issue 21: no chaos run exercised the fair lock. Its waiters queue in arrival order; the
    checks are the lock's (no double grant, fences grow, no stale write accepted)."""
    data, _stderr = chaos("--primitive", "fair")
    assert data["primitive"] == "fair"


def test_chaos_rejects_an_unknown_primitive_and_a_bad_limit() -> None:
    for args in (["--primitive", "queue"], ["--primitive", "semaphore", "--limit", "0"]):
        proc = subprocess.run(
            [sys.executable, "-m", "fencelock", "chaos", "--duration", "1", *args],
            capture_output=True, text=True, timeout=60, env=os.environ.copy(), check=False,
        )  # fmt: skip
        assert proc.returncode == 64, (args, proc.stderr)
