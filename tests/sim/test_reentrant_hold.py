"""The simulation's ``--reentrant-hold`` workloads (tools/sim/workloads.py): a reentrant Lock
re-entered by its task, ``async with lock.hold()`` and ``async with sem.hold()`` held past
the ttl on hold()'s renewals. A seed of each replays byte for byte and clean, the trace shows
the workload really ran (a re-entry and its release in order, a hold's renewals), the flag
off leaves the seed's schedule as it was, and a reentrancy that let another task of the
process re-enter a held lock is caught (mutual_exclusion: the re-entry is not a second
holder, a second task sharing the lease is).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.sim.simulate_cli import ROOT, simulate


def _replay(seed: int, *flags: str, src: Path = ROOT / "src") -> subprocess.CompletedProcess[str]:
    return simulate("--replay", str(seed), *flags, timeout=180, src=src)


@pytest.mark.parametrize(
    ("seed", "marks"),
    [
        # ("reentrant",): re-entered to depth 2 and more, the inner ones left in order
        (21, [r"re-entered k0 fence (\d+) depth 2", r"re-entered k0 fence \d+ depth 3",
              r"left k0 depth 1 \(the outer one holds on\)"]),
        # ("hold",): lock.hold() renewed past the ttl
        (7, [r"hold of k0 renewed: until", r"left the hold of k0"]),
        # ("semhold", "semaphore"): sem.hold() renewed past the ttl
        (4, [r"hold of sem/slot\d renewed: until"]),
    ],
)  # fmt: skip
def test_a_seed_of_each_workload_replays_byte_for_byte_and_clean(
    seed: int, marks: list[str]
) -> None:
    first = _replay(seed, "--reentrant-hold")
    second = _replay(seed, "--reentrant-hold")
    assert first.returncode == 0, first.stdout[-3000:]
    assert "VIOLATION" not in first.stdout
    assert first.stdout == second.stdout
    for mark in marks:
        assert re.search(mark, first.stdout), mark


def test_a_re_entry_is_the_outer_lease_not_a_second_grant() -> None:
    """Seed 21: each re-entry reports the fence of its task's outermost grant, and only the
    outermost acquisition is a grant (one "granted" line per re-entered fence)."""
    run = _replay(21, "--reentrant-hold")
    assert run.returncode == 0, run.stdout[-3000:]
    entered = re.findall(r"(\S+) re-entered k0 fence (\d+) depth", run.stdout)
    assert entered
    for who, fence in set(entered):
        assert run.stdout.count(f"{who} granted k0 fence {fence} ") == 1


def test_without_the_flag_the_seed_is_the_schedule_it_was() -> None:
    run = _replay(21)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "re-entered" not in run.stdout and "hold of" not in run.stdout


def test_a_reentrancy_shared_by_the_tasks_of_a_process_is_caught(tmp_path: Path) -> None:
    """The reentry keyed on the lock alone (any task of the process re-enters a hold it
    finds): the re-entering task shares another task's lease while both believe they hold
    the lock. Seed 69: two tasks per job on one key."""
    from tools.sim.mutants import _copy_source

    src = _copy_source(tmp_path)
    path = src / "fencelock" / "_frontend" / "reentry.py"
    text = path.read_text()
    for find, replace in (
        ('return (lock_id, "local", id(current))', 'return (lock_id, "local", 0)'),
        ("if entry.anchor is not None and entry.anchor() is not current:", "if False:"),
    ):
        assert text.count(find) == 1
        text = text.replace(find, replace)
    path.write_text(text)
    clean = _replay(69, "--reentrant-hold")
    assert clean.returncode == 0, clean.stdout[-3000:]
    mutated = _replay(69, "--reentrant-hold", src=src)
    assert mutated.returncode == 1
    assert "VIOLATION mutual_exclusion: k0:" in mutated.stdout


def test_a_search_with_the_flag_lists_the_kinds_it_draws() -> None:
    import json

    run = simulate(
        "--seconds", "30", "--seed", "21", "--max-schedules", "1", "--reentrant-hold", "--json",
        timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    report = json.loads(run.stdout)
    assert report["primitives"][-3:] == ["reentrant", "hold", "semhold"]
    assert report["violations"] == []


def test_a_task_cancelled_while_re_entered_frees_the_key() -> None:
    """Seed 200649 (with ``--cancel``) found a simulator artefact: a task cancelled while it
    had re-entered its lock released only the outermost acquisition (which then just counts
    down), so the key stayed behind a release the trace called confirmed
    (confirmed_release_applied). Nested ``async with`` blocks release innermost first."""
    run = _replay(200649, "--cancel", "--reentrant-hold")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "VIOLATION" not in run.stdout
    assert re.search(r"cancel \S+ \(hold\)", run.stdout)


def test_a_fork_while_a_re_entered_lock_is_held_replays_clean_seed_9000081() -> None:
    """Seed 9000007 (``--cancel --fork --reentrant-hold``) forked a process whose task held a
    re-entered lock: the child inherits the view, which the world could not copy (the library's
    view recursed without end under ``copy``) nor register (a view is not the lease the library
    tracks): the search died there. Now the child's inherited lease is lost (fork) and the
    schedule runs clean. (Seed 9000081 is such a schedule since N-server grants skip their
    fence commit when a majority agrees, which moved 9000007's: c2/j0/t0 at depth 2.)"""
    done = _replay(9000081, "--cancel", "--fork", "--reentrant-hold")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "c2/j0/t0 re-entered k0 fence 1001447187 depth 2" in out
    fork = out.index("fork client process c2 -> c2f0 (pid 4004), inheriting c2/j0/t0's k0")
    assert out.index("c2/j0/t0 re-entered k0 fence 1001447187 depth 2") < fork
    assert fork < out.index("c2/j0/t0 left k0 depth 1 (the outer one holds on)")
    assert "c2f0 inherited c2/j0/t0's k0 (fence 1001447187): lost (fork)" in out
