"""The "fork_client" fault (tools/sim/fork.py, ``--fork``): a simulated client process forks
while a job of its runs; the child gets copies of the parent's engine state and leases, a pid
of its own, runs the library's after-fork-in-child hooks, then a job of its own on a new loop
that renews, extends, releases or works under each lease it inherited.

Seed 133 (with ``--fork``) forks one client twice while it holds a MultiLock's two keys,
the children try every action on them (all refused: ``LockLost``, reason "fork"), the parent
goes on with its own (its releases confirmed) and a child takes a lease of its own; the
schedule replays byte for byte and clean. The mutant fork-renewals-re-armed (an
inherited lease not lost in the child) is caught by ``no_foreign_lease_use`` on seed 2, where
a child's keep_alive() renews its parent's semaphore permit; the same seeds run clean
unmutated. Without ``--fork`` (the default, CI's draw) a seed's faults keep their plan."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.sim.simulate_cli import ROOT, simulate
from tools.sim.checkers import no_foreign_lease_use, violations
from tools.sim.fork import AT_FORK_MODULES
from tools.sim.mutants import MUTANTS, _copy_source, apply, run_clean, run_source, verdict
from tools.sim.world import History


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return simulate("--replay", *args)


def test_a_fork_schedule_replays_byte_for_byte_and_clean() -> None:
    runs = [_replay("133", "--fork") for _ in range(2)]
    assert runs[0].stdout == runs[1].stdout
    out = runs[0].stdout
    assert runs[0].returncode == 0, out[-3000:]
    assert "VIOLATION" not in out
    assert "fork_client" in out.splitlines()[0]  # in the plan (a shrink may leave it out)
    forks = re.findall(r"fork client process (\S+) -> (\S+) \(pid (\d+)\), inheriting (.*)", out)
    assert [(p, c) for p, c, _, _ in forks] == [("c2", "c2f0"), ("c2", "c2f1")]
    assert len({pid for _, _, pid, _ in forks}) == 2  # a pid of its own each
    inherited = re.findall(r"(c\df\d) inherited .*: (lost \(fork\)|valid); (\S+)", out)
    # (the schedule moves with the drivers' timers: seed 4 showed this until the asyncio
    # connection wrote a request alone at once)
    assert len(inherited) == 4 and all(state == "lost (fork)" for _, state, _ in inherited)
    assert {action for _, _, action in inherited} == {"extend", "with", "release", "keep_alive"}
    outcomes = re.findall(r"c\df\d (\w+) on \S+ \S+ \(fence \d+\): (\S+)", out)
    assert len(outcomes) == 4 and all(o == "LockLost:" for _, o in outcomes)
    # the parent's leases are untouched by the child's hooks: released by the parent after
    for key in ("k0", "k1"):
        assert re.search(
            rf"c2f1 \w+ on c2/j2/t0's {key} .*\n(.*\n)*.*c2/j2/t0 released {key}: ok", out
        )
    assert "c2f0/j0/t0 granted k0" in out  # the child's own lease, own connections
    assert "c2f0/j0/t0 released k0: ok" in out


def test_without_fork_the_other_faults_are_as_they_were() -> None:
    with_fork = _replay("4", "--fork").stdout.splitlines()[0]
    without = _replay("4").stdout.splitlines()[0]
    assert "fork_client" not in without
    assert with_fork.startswith(without.rstrip())


def test_the_fork_mutant_is_caught_where_the_unmutated_code_runs_clean(tmp_path: Path) -> None:
    mutant = next(m for m in MUTANTS if m.name == "fork-renewals-re-armed")
    assert mutant.args == ("--fork",)
    src = _copy_source(tmp_path)
    apply(mutant, src)
    report = run_source(src, 120.0, 1, most=10, args=mutant.args)
    found = verdict(mutant.name, 1, report)
    assert found["caught"] and found["seed"] == 2, report["seeds"]
    violation = report["violations"][0]
    assert violation["property"] == "no_foreign_lease_use"
    assert re.match(r"sim\d: c0f0 ran extend with c0/j0/t1's token", violation["trace"][0])
    clean = run_clean(120.0, 1, most=2, args=mutant.args)
    assert clean["violations"] == [] and clean["schedules"] == 2


def test_no_foreign_lease_use_reports_what_the_servers_recorded() -> None:
    history = History()
    assert not no_foreign_lease_use(history)
    history.foreign.append("sim0: c0f0 ran extend with c0/j0/t1's token (k0, fence 3) at 1.0")
    assert violations(history) == [("no_foreign_lease_use", history.foreign[0])]


def test_every_fork_hook_of_the_library_runs_in_a_simulated_child() -> None:
    """tools/sim/fork.py runs the ``_after_fork_in_child`` of AT_FORK_MODULES: every module
    of the library that registers one with ``os.register_at_fork``."""
    registering = {
        ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)
        for path in (ROOT / "src" / "fencelock").rglob("*.py")
        if "os.register_at_fork(after_in_child=_after_fork_in_child)" in path.read_text()
    }
    assert registering == set(AT_FORK_MODULES)
    assert not any(
        "register_at_fork" in path.read_text()
        for path in (ROOT / "src" / "fencelock").rglob("*.py")
        if ".".join(path.relative_to(ROOT / "src").with_suffix("").parts) not in registering
    )


def test_a_fork_violation_shrinks_to_the_fork_and_replays(tmp_path: Path) -> None:
    """The mutant's seed 2 shrinks to its one fork (the reset and the other fork left out);
    the printed command (with ``--fork``) replays the shrunk schedule, which fails the same way
    on the mutant and runs clean unmutated; the timeline marks the fork on both lanes."""
    mutant = next(m for m in MUTANTS if m.name == "fork-renewals-re-armed")
    src = _copy_source(tmp_path)
    apply(mutant, src)
    html = tmp_path / "2.html"
    args = ["--replay", "2", "--fork", "--shrink", "--shrink-runs", "60", "--html", str(html)]
    run = simulate(*args, timeout=300, src=src)
    assert run.returncode == 1, run.stdout[-3000:]
    last = run.stdout.splitlines()[-2]
    found = re.match(
        r"shrunk seed 2 \(no_foreign_lease_use\): faults 3 -> 1, .*; replay: "
        r"python tools/simulate.py (--replay 2 --fork --plan \S+)$",
        last,
    )
    assert found, last
    replay = found.group(1).split()
    again = simulate(*replay, src=src)
    assert again.returncode == 1 and "VIOLATION no_foreign_lease_use" in again.stdout
    assert again.stdout.splitlines()[0].endswith("#2 fork_client at 2.6742")
    clean = _replay(*replay[1:])
    assert clean.returncode == 0 and "VIOLATION" not in clean.stdout, clean.stdout[-2000:]
    page = html.read_text()
    assert "fork client process c0 -&gt; c0f0" in page or "fork client process c0 -> c0f0" in page
