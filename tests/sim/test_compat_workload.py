"""The simulation's ``--compat`` workload (tools/sim/workloads.py): tasks take
``fencelock.compat.AsyncRedisPyLock`` on one server under tokens they chose (one per client
process and task number, the same in every job), and take it again under the same token
after a release, refused ones included. A seed replays byte for byte and clean, its trace
shows a refused release followed by the same token's next grant, the flag off leaves the
seed's schedule as it was, and compat plans that forget their tokens are granted again
(``LockPlan.tokens_reused`` off: the bug python-redis-lock's ``test_bogus_release`` found)
are caught: a background repeat of the refused release deletes the next grant, and another
task takes the lock while that lease is valid.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.sim.simulate_cli import ROOT, simulate

#: Seed 11 with --compat: ("compat",) on one server; c0/j1/t0's release at 19.4334 is refused
#: (its lease ran out) and it is granted compat:k0 again 3 ms later under the same token.
SEED = 11


def _run(*flags: str, src: Path = ROOT / "src") -> subprocess.CompletedProcess[str]:
    return simulate(*flags, timeout=180, src=src)


def _refused_then_granted(trace: str) -> list[tuple[str, float, float]]:
    """(task, refused at, granted again at) for each task whose release was refused and that
    was granted the same compat key again."""
    refused: dict[tuple[str, str], float] = {}
    found = []
    for line in trace.splitlines():
        m = re.match(r"\s*([\d.]+) (\S+) (granted|released) (compat:k\d)(.*)", line)
        if not m:
            continue
        at, who, what, key, rest = m.groups()
        if what == "released" and rest.endswith(": LockLost"):
            refused[who, key] = float(at)
        elif what == "granted" and (who, key) in refused:
            found.append((who, refused.pop((who, key)), float(at)))
    return found


def test_a_seed_replays_byte_for_byte_and_clean_with_a_token_granted_again() -> None:
    first = _run("--replay", str(SEED), "--compat")
    second = _run("--replay", str(SEED), "--compat")
    assert first.returncode == 0, first.stdout[-3000:]
    assert "VIOLATION" not in first.stdout
    assert first.stdout == second.stdout
    assert " granted compat:k0 (compat) fence " in first.stdout
    again = _refused_then_granted(first.stdout)
    assert ("c0/j1/t0", 19.4334, 19.4364) in again, again


def test_without_the_flag_the_seed_is_the_schedule_it_was() -> None:
    run = _run("--replay", str(SEED))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "compat" not in run.stdout


def test_compat_plans_whose_tokens_are_not_reused_are_caught(tmp_path: Path) -> None:
    from tools.sim.mutants import MUTANTS, _copy_source, apply

    src = _copy_source(tmp_path)
    apply(next(m for m in MUTANTS if m.name == "compat-reused-token-repeated"), src)
    mutated = _run("--replay", str(SEED), "--compat", src=src)
    assert mutated.returncode == 1, mutated.stdout[-3000:]
    assert "background repeat of release on sim0" in mutated.stdout
    assert "VIOLATION mutual_exclusion: compat:k0: " in mutated.stdout
    assert "VIOLATION lease_within_keys: " in mutated.stdout


def test_a_search_with_the_flag_lists_compat_among_the_kinds_it_draws() -> None:
    run = _run("--seconds", "30", "--seed", str(SEED), "--max-schedules", "1", "--compat", "--json")
    assert run.returncode == 0, run.stdout[-3000:]
    report = json.loads(run.stdout)
    assert report["primitives"][-1] == "compat"
    assert report["violations"] == []
