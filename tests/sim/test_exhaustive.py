"""The exhaustive enumeration (``tools/simulate.py --exhaustive``, ``tools/sim/exhaustive.py``):
its walk visits every tape within the bound once; the unmutated code's enumeration is clean
and complete within a small bound; a mutant is caught within a small bound, and the failing
choice sequence it prints replays to the same violation (and runs clean on the unmutated
code: the mutant, not the replay, makes it fail)."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from tests.sim.simulate_cli import ROOT, simulate
from tools.sim.exhaustive import Point, choices_text, next_tape, parse_choices
from tools.sim.mutants import MUTANTS, _copy_source, apply

#: the mutant's bound: the first 20 choice points of the Lock's flow, two non-default choices
MUTANT_BOUND = ["--flows", "lock", "--deviations", "2", "--depth", "20"]


def _run(src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return simulate("--exhaustive", *args, timeout=300, src=src)


def _walk(shape: tuple[int, ...], deviations: int) -> list[tuple[int, ...]]:
    """The tapes ``next_tape`` visits on a tree whose every run has choice points of
    ``shape`` alternatives."""
    seen: list[tuple[int, ...]] = []
    tape: list[int] | None = []
    while tape is not None:
        full = tuple(tape) + (0,) * (len(shape) - len(tape))
        seen.append(full)
        points = [Point(n, c, "") for n, c in zip(shape, full, strict=True)]
        tape = next_tape(points, deviations)
    return seen


@pytest.mark.parametrize("deviations", [0, 1, 2, 3])
def test_the_walk_visits_every_tape_within_the_bound_once(deviations: int) -> None:
    shape = (2, 4, 1, 3, 4)
    seen = _walk(shape, deviations)
    expected = {
        tape
        for tape in itertools.product(*(range(n) for n in shape))
        if sum(c != 0 for c in tape) <= deviations
    }
    assert len(seen) == len(set(seen))
    assert set(seen) == expected
    assert seen[0] == (0,) * len(shape)  # the default schedule first


def test_choices_round_trip() -> None:
    tape = [0, 0, 3, 0, 1, 0]
    assert choices_text(tape) == "2:3,4:1"
    assert parse_choices("2:3,4:1") == [0, 0, 3, 0, 1]  # (defaults past the end)
    assert parse_choices("") == []
    with pytest.raises(ValueError):
        parse_choices("2-3")


def test_the_unmutated_enumeration_is_clean_and_complete() -> None:
    """Every schedule of the Lock's flow with one non-default choice (a message late, slow or
    lost; a tie broken the other way) runs clean, and the walk ends within the bound."""
    done = _run(ROOT / "src", "--flows", "lock", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["violations"] == []
    exhaustive = report["exhaustive"]
    assert exhaustive["complete"] is True
    assert exhaustive["deviations"] == 1 and exhaustive["depth"] is None
    # every message of the flow had its alternatives (more than 60 choice points)
    assert exhaustive["schedules"] == report["schedules"] > 150
    assert exhaustive["most_choice_points"] > 60
    assert {"slow_message", "drop_reply", "lost_request"} <= set(report["faults"])


def test_a_mutant_is_caught_and_its_choices_replay(tmp_path: Path) -> None:
    mutant = next(m for m in MUTANTS if m.name == "release-without-token-check")
    src = _copy_source(tmp_path)
    apply(mutant, src)
    done = _run(src, *MUTANT_BOUND, "--stop-at-first", "--json")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["exhaustive"]["complete"] is False  # stopped at the first violation
    violation = report["violations"][0]
    choices, prop, detail = violation["choices"], violation["property"], violation["trace"][0]
    assert choices and violation["described"]
    assert f"--replay-choices '{choices}'" in violation["replay"]
    assert "--depth 20" in violation["replay"] and "--flows lock" in violation["replay"]
    replay = ["--flows", "lock", "--depth", "20", "--replay-choices", choices]
    again = _run(src, *replay)
    assert again.returncode == 1
    assert f"VIOLATION {prop}: {detail}" in again.stdout
    # the same choices on the unmutated code: clean
    clean = _run(ROOT / "src", *replay)
    assert clean.returncode == 0, clean.stdout[-3000:]
    assert "VIOLATION" not in clean.stdout
