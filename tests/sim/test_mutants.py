"""The mutant runner's apply step and its reading of a simulation report (no simulation run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.simulate_cli import simulate
from tools.sim.mutants import (
    MUTANTS,
    PENDING,
    ROOT,
    Mutant,
    MutantError,
    _copy_source,
    apply,
    verdict,
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy_source(tmp_path_factory.mktemp("pristine"))


@pytest.mark.parametrize("mutant", MUTANTS + PENDING, ids=lambda m: m.name)
def test_every_mutant_applies_once_to_todays_code(
    mutant: Mutant, pristine: Path, tmp_path: Path
) -> None:
    src = _copy_source(tmp_path)
    apply(mutant, src)
    before = (pristine / "fencelock" / mutant.file).read_text()
    after = (src / "fencelock" / mutant.file).read_text()
    assert after != before
    expected = before
    for find, replace in ((mutant.find, mutant.replace), *mutant.also):
        expected = expected.replace(find, replace)
    assert after == expected
    assert (ROOT / "src" / "fencelock" / mutant.file).read_text() == before  # the tree untouched


def test_a_mutant_whose_text_moved_fails_loudly(tmp_path: Path) -> None:
    src = _copy_source(tmp_path)
    gone = Mutant("gone", "", "_core/timing.py", "no such text\n", "x")
    with pytest.raises(MutantError, match="occurs 0 times"):
        apply(gone, src)
    twice = Mutant("twice", "", "_core/timing.py", "return", "x")
    with pytest.raises(MutantError, match="expected exactly once"):
        apply(twice, src)
    with pytest.raises(MutantError, match="no file"):
        apply(Mutant("nofile", "", "_core/nope.py", "a", "b"), src)


def test_the_mutated_copy_is_what_a_run_imports(tmp_path: Path) -> None:
    """PYTHONPATH puts the copy before the editable install: the mutant is the code that runs."""
    src = _copy_source(tmp_path)
    apply(next(m for m in MUTANTS if m.name == "validity-without-drift"), src)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fencelock._core.timing import validity_ms as v; print(v(100, 10, 5))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "90"  # unmutated: 85


def test_verdict_reads_the_report() -> None:
    caught = {"schedules": 40, "seeds": [100, 139], "violations": [{"seed": 112, "property": "p"}]}
    assert verdict("m", 100, caught) == {
        "name": "m",
        "caught": True,
        "schedules_to_catch": 13,
        "seed": 112,
    }
    missed = {"schedules": 500, "seeds": [100, 599], "violations": []}
    assert verdict("m", 100, missed) == {
        "name": "m",
        "caught": False,
        "schedules_to_catch": None,
        "seed": 100,
    }


def test_a_mutant_is_caught_where_the_unmutated_code_runs_clean(tmp_path: Path) -> None:
    """End to end: the mutated copy's search finds a violation within a small budget, and the
    same seeds run clean on an unmutated copy (a checker that fires on both proves nothing)."""
    from tools.sim.mutants import run_clean, run_source

    mutant = next(m for m in MUTANTS if m.name == "release-without-token-check")
    src = _copy_source(tmp_path)
    apply(mutant, src)
    report = run_source(src, 120.0, 1, most=30)
    assert verdict(mutant.name, 1, report)["caught"], report["seeds"]
    caught_at = report["violations"][0]["seed"]
    clean = run_clean(120.0, 1, most=caught_at)
    assert clean["violations"] == [] and clean["schedules"] == caught_at


# The mutant check with its mutants stubbed out (each would be a simulation of its own): what
# the unmutated run's seeds and flags are. A fresh process per run (the command's own).
_STUBBED = """
import sys
sys.argv[0] = "simulate.py"
import tools.sim.mutants as mutants
import tools.simulate as simulate
seen = []
def stub(budget_s, seed, chosen, most=None, args=()):
    seen.append(seed)
    return []
mutants.run_mutants = stub
code = simulate.main(sys.argv[1:])
print("MUTANT_SEEDS", seen)
sys.exit(code)
"""


def _stubbed_check(*flags: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-c", _STUBBED, "--mutants", "--seed", "1", "--max-schedules", "2",
         "--seconds", "60", "--shrink-runs", "0", *flags],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_clean_run_draws_fresh_seeds_and_says_them_the_mutants_keep_theirs() -> None:
    import json

    runs = [_stubbed_check("--clean-seed", "random", "--cancel", "--json") for _ in range(2)]
    firsts = []
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        report = json.loads(run.stdout.splitlines()[0])
        assert report["schedules"] == 2
        first = report["seeds"][0]
        firsts.append(first)
        assert first >= 100_000  # above the seeds the docs and tests name
        # said before the run (a run that does not finish is replayable too), with its flags
        assert f"unmutated: seeds from {first} with --cancel" in run.stderr
        assert "--replay SEED --cancel" in run.stderr
        assert "MUTANT_SEEDS [1]" in run.stdout  # the mutants keep --seed
    assert firsts[0] != firsts[1]


def test_the_clean_seed_can_be_given_and_defaults_to_the_seed() -> None:
    import json

    given = _stubbed_check("--clean-seed", "50987", "--json")
    assert json.loads(given.stdout.splitlines()[0])["seeds"] == [50987, 50988]
    assert "MUTANT_SEEDS [1]" in given.stdout
    default = _stubbed_check("--json")
    assert json.loads(default.stdout.splitlines()[0])["seeds"] == [1, 2]
    assert "with --cancel" not in default.stderr
    refused = simulate("--clean-seed", "random", timeout=60)
    assert refused.returncode == 2 and "--clean-seed goes with --mutants" in refused.stderr


def _replay_today_and_mutated(
    tmp_path: Path, mutant: str, seed: str
) -> dict[str, subprocess.CompletedProcess[str]]:
    """``--replay seed`` on today's source ("today") and on a copy with ``mutant`` applied
    ("mutant")."""
    src = _copy_source(tmp_path)
    apply(next(m for m in MUTANTS if m.name == mutant), src)
    return {
        "today": simulate("--replay", seed, src=ROOT / "src", timeout=180),
        "mutant": simulate("--replay", seed, src=src, timeout=180),
    }


def test_a_writer_granted_after_a_refusal_leaves_no_intent_behind(tmp_path: Path) -> None:
    """Seed 316 (all primitives): a writer refused while readers held rw0 is granted when they
    leave. Today nothing it left stops the reader after it; with the read-write scripts sent
    the first attempt's ``+`` (rw-first-attempt-marked, last stop's CI failure) its intent
    marker stays, and that reader waits 1.5 s on a free lock, refused (``rw_when_free``)."""
    runs = _replay_today_and_mutated(tmp_path, "rw-first-attempt-marked", "316")
    assert runs["today"].returncode == 0, runs["today"].stdout[-3000:]
    assert "granted rw0 (write)" in runs["today"].stdout
    assert runs["mutant"].returncode == 1, runs["mutant"].stdout[-3000:]
    assert "VIOLATION rw_when_free: " in runs["mutant"].stdout
    assert "was refused the read lock after waiting" in runs["mutant"].stdout


def test_a_waiter_granted_where_a_release_came_late_leaves_no_registration(
    tmp_path: Path,
) -> None:
    """Seed 12 (no fault needed: shrunk to none): a waiter's winning attempt reaches sim1
    before the last holder's release does, is refused there and registers, and is granted by
    the two others. Today its release removes that registration; with a Lock's grant keeping
    no waiter id (lock-grant-forgets-waiter, CI's failure at a72da2b) it stays registered on
    sim1 past its confirmed release (``no_stale_registration``)."""
    runs = _replay_today_and_mutated(tmp_path, "lock-grant-forgets-waiter", "12")
    assert runs["today"].returncode == 0, runs["today"].stdout[-3000:]
    assert runs["mutant"].returncode == 1, runs["mutant"].stdout[-3000:]
    assert "VIOLATION no_stale_registration: sim1 fencelock:{k0}:waiters still registers" in (
        runs["mutant"].stdout
    )
