"""The short chaos run CI does: ``fencelock chaos --duration 20 --seed 1 --json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fencelock.cli.chaos.nemesis import CATEGORY
from fencelock.cli.chaos.report import JSON_FIELDS


def test_chaos_cli_json_run_is_safe_and_the_canary_sees_the_violations() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fencelock", "chaos", "--duration", "20", "--seed", "1",
         "--json"],
        capture_output=True, text=True, timeout=240, env=os.environ.copy(), check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout  # exactly one JSON object on stdout
    data = json.loads(lines[0])
    for name in JSON_FIELDS:
        assert name in data, name
    assert data["stale_writes_accepted"] == 0
    assert data["lost_updates"] == 0
    assert data["unfenced_overlaps"] > 0  # the canary sees what fencing prevents
    assert data["stale_writes_rejected"] > 0  # ... and fencing refused those writes
    assert data["acquisitions"] > 0
    assert data["primitive"] == "lock"  # the default, unchanged run
    assert 0.0 <= data["availability"] <= 1.0
    kinds = {CATEGORY[name] for name, count in data["faults"].items() if count > 0}
    assert {"pause", "kill", "partition"} <= kinds, data["faults"]
    assert "result: SAFE" in proc.stderr  # the final table goes to stderr
