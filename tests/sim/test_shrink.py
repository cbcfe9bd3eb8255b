"""Shrinking a failing schedule (tools/sim/shrink.py) and drawing it (tools/sim/timeline.py).

With no real bug to shrink, a mutant makes one: ``new-loop-identity-skip`` (a new event loop's
connection skips the identity check) fails ``mutual_exclusion`` on seed 116 of a search from
seed 1 (its entry in docs/testing.md's table; seed 32 until N-server grants skipped their
fence commit when a majority agreed, which moved the schedules), with four planned faults; its
shrunk schedule keeps two (the crash pair that wipes a server between two jobs, and a dropped
reply).
The simulation runs in a subprocess whose PYTHONPATH puts the mutated copy of ``src/`` first
(as the mutant check does: the copy must be the fencelock that is imported).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.sim.simulate_cli import simulate
from tools.sim.mutants import MUTANTS, _copy_source, apply
from tools.sim.shrink import Plan, apply_plan, measure, shrink
from tools.sim.timeline import marks_of
from tools.sim.world import Config

MUTANT, SEED, PROPERTY = "new-loop-identity-skip", 116, "mutual_exclusion"
SUMMARY = re.compile(
    r"^shrunk seed (\d+) \((\w+)\): faults (\d+) -> (\d+), steps (\d+) -> (\d+) "
    r"\((\d+) runs, [\d.]+ s\); replay: python tools/simulate.py --replay \d+ --plan (\S+)$",
    re.M,
)


@pytest.fixture(scope="module")
def mutated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = _copy_source(tmp_path_factory.mktemp("mutant"))
    apply(next(m for m in MUTANTS if m.name == MUTANT), src)
    return src


def _simulate(src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return simulate(*args, timeout=600, src=src)


@pytest.fixture(scope="module")
def shrunk(mutated: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    html = tmp_path_factory.mktemp("html") / "timeline.html"
    args = ("--replay", str(SEED), "--shrink", "--shrink-runs", "60", "--shrink-seconds", "600")
    first = _simulate(mutated, *args, "--html", str(html))
    second = _simulate(mutated, *args)
    return {"first": first, "second": second, "html": html}


def _summary(done: subprocess.CompletedProcess[str]) -> tuple[Any, ...]:
    found = SUMMARY.search(done.stdout)
    assert found is not None, done.stdout[-3000:] + done.stderr[-3000:]
    seed, prop, f0, f1, s0, s1, runs, plan = found.groups()
    return int(seed), prop, int(f0), int(f1), int(s0), int(s1), int(runs), plan


def test_a_failing_seed_shrinks_to_a_smaller_schedule_failing_the_same_way(
    shrunk: dict[str, Any], mutated: Path
) -> None:
    done = shrunk["first"]
    assert done.returncode == 1, done.stderr[-3000:]
    seed, prop, faults_before, faults_after, steps_before, steps_after, runs, plan = _summary(done)
    assert (seed, prop) == (SEED, PROPERTY)
    assert faults_after <= faults_before and steps_after <= steps_before
    assert faults_after < faults_before  # this seed: 4 planned faults -> 2
    assert 0 < runs <= 60
    # the original's trace, then the shrunk one's, each with the same property's violation
    original, _, small = done.stdout.partition(f"=== shrunk ({PROPERTY}) ===")
    assert f"VIOLATION {PROPERTY}:" in original and f"VIOLATION {PROPERTY}:" in small
    assert "(left out)" in small.splitlines()[1]
    # the printed plan replays the shrunk schedule exactly: same trace, same violation
    again = _simulate(mutated, "--replay", str(SEED), "--plan", plan)
    assert again.returncode == 1
    shrunk_trace = small.split("\nshrunk seed")[0].strip().splitlines()
    assert again.stdout.strip().splitlines() == shrunk_trace


def test_shrinking_is_deterministic(shrunk: dict[str, Any]) -> None:
    assert _summary(shrunk["first"]) == _summary(shrunk["second"])
    first = shrunk["first"].stdout.split("\nshrunk seed")[0]
    second = shrunk["second"].stdout.split("\nshrunk seed")[0]
    assert first == second  # both traces, byte for byte


def test_the_html_timeline_is_written_with_lanes_and_marks(shrunk: dict[str, Any]) -> None:
    page = shrunk["html"].read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert page.count('class="timeline"') == 2  # the replayed schedule and its shrunk form
    for lane in ("sim0", "sim1", "sim2", "network", "c0", "c1"):
        assert f"<title>{lane}</title>" in page
    for cls in ("lane server", "lane client", "grant", "grant violation", "fault wiped"):
        assert f'class="{cls}"' in page
    assert 'class="mark restart"' in page and 'class="violation-at"' in page
    assert f"--replay {SEED} --plan " in page


def test_a_search_shrinks_its_violations_and_the_mutant_run_does_not(mutated: Path) -> None:
    base = ("--seed", str(SEED), "--max-schedules", "1", "--seconds", "60", "--json")
    done = _simulate(mutated, *base, "--shrink-runs", "15")
    report = json.loads(done.stdout)
    (violation,) = report["violations"]
    assert violation["property"] == PROPERTY and violation["seed"] == SEED
    before, after = violation["shrink"]["faults"]
    assert after <= before
    assert violation["shrink"]["steps"][1] <= violation["shrink"]["steps"][0]
    assert violation["shrink"]["runs"] <= 15 and violation["shrink"]["replayed"]
    assert violation["shrunk_trace"][0].startswith("k0: ")  # the shrunk violation's detail
    assert sum(violation["shrunk_faults"].values()) >= after
    assert violation["shrunk_replay"].startswith(f"python tools/simulate.py --replay {SEED}")
    for name in ("schedules", "steps", "seeds", "faults", "properties", "primitives", "mutants"):
        assert name in report
    # the mutant check's runs (tools/sim/mutants.py run_source) pass --shrink-runs 0
    from tools.sim.mutants import run_source

    plain = run_source(mutated, 60.0, SEED, most=1)
    (violation,) = plain["violations"]
    assert not any(name.startswith("shrunk") for name in violation)


# -- the delta debugging itself, on a fake world -------------------------------------------


def _fake_run(fails: Any) -> Any:
    """A runner whose schedule fails iff ``fails(config, kept)``; steps grow with what runs."""

    def run(plan: Plan) -> tuple[Any, list[tuple[str, str]]]:
        config = apply_plan(Config(clients=4, jobs=3, fault_count=8), plan)
        kept = [i for i in range(config.fault_count) if plan.keep is None or i in plan.keep]
        history = SimpleNamespace(
            plan=[(float(i), "crash_kept", i in kept) for i in range(config.fault_count)],
            faults={"crash_kept": len(kept)},
        )
        steps = 100 * config.clients * config.jobs + 10 * len(kept)
        world = SimpleNamespace(history=history, steps=steps)
        bad = [("p", f"{len(kept)} faults")] if fails(config, kept) else []
        return world, bad

    return run


def test_ddmin_finds_the_faults_and_the_config_that_matter() -> None:
    run = _fake_run(lambda config, kept: {2, 5} <= set(kept) and config.clients >= 2)
    world, bad = run(Plan())
    original = measure(world, bad, Plan(), "p")  # type: ignore[arg-type]
    result = shrink(
        run, lambda: Config(clients=4, jobs=3, fault_count=8), "p", original, max_runs=200
    )
    assert result.complete
    assert result.shrunk.plan.keep == (2, 5)
    config = apply_plan(Config(clients=4, jobs=3), result.shrunk.plan)
    assert (config.clients, config.jobs) == (2, 1)
    assert result.shrunk.faults == 2 and result.shrunk.steps < original.steps
    # a bound stops it early, with what it had (still failing)
    bounded = shrink(run, lambda: Config(fault_count=8), "p", original, max_runs=3)
    assert not bounded.complete and bounded.runs == 3 and bounded.shrunk.failed


def test_another_property_failing_is_not_a_reduction() -> None:
    def run(plan: Plan) -> tuple[Any, list[tuple[str, str]]]:
        world, _ = _fake_run(lambda c, k: True)(plan)
        keep = plan.keep
        return world, [("p" if keep is None or 0 in keep else "q", "x")]

    world, bad = run(Plan())
    original = measure(world, bad, Plan(), "p")  # type: ignore[arg-type]
    result = shrink(run, lambda: Config(clients=4, jobs=3, fault_count=8), "p", original)
    assert result.shrunk.plan.keep == (0,)


def test_a_plan_reads_back_what_it_prints() -> None:
    values = (("jobs", 2), ("renew", False), ("primitives", ("lock",)), ("overrun", 0.0))
    plan = Plan(values, (0, 3))
    text = plan.text()
    assert text == "jobs=2,overrun=0,primitives=lock,renew=0,faults=0+3"
    assert Plan.parse(text).text() == text
    assert Plan.parse("faults=-").keep == () and Plan.parse("").keep is None
    with pytest.raises(ValueError, match="not one of"):
        Plan.parse("max_steps=3")


def test_the_timeline_reads_faults_from_the_trace() -> None:
    marks = marks_of(
        [
            "   1.2572 crash sim1 (kept), back in 0.956 s",
            "   1.5202 crash sim0 (wiped), back in 0.064 s",
            "   2.0000 pause client c2/j1 until 3.500",
            "   2.1000 delay spike to 0.300 s until 2.900",
            "   2.2000 kill client process sy",
            "   2.3000 c0/j0/t0 granted k0 fence 7 until 4.0000",
        ]
    )
    assert [(m.lane, m.kind) for m in marks] == [
        ("sim1", "crash"),
        ("sim0", "wiped"),
        ("c2", "pause"),
        ("network", "network"),
        ("sy", "kill"),
    ]
    assert marks[0].end == pytest.approx(1.2572 + 0.956)
