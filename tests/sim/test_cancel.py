"""The "cancel_task" fault (tools/sim/world.py, ``--cancel``): a client task cancelled
(``task.cancel()``) at whatever await it is at. Seed 571 cancels an acquire in the middle of
its round, seed 672 a release in the middle of its round (the library must release all the
same; one seed, 166, did both until N-server grants skipped their fence commit when a
majority agreed, and seed 475 the acquire until the asyncio connection wrote a request alone
at once, each of which moved the schedules); each replays byte for byte and clean. Without
``--cancel`` (the default, CI's draw) the seed's faults keep their plan.

Seed 50987 (with ``--cancel``) found a ghost key: an acquire cancelled mid-round while one of
its servers had restarted with an empty script cache; the parked round's straggler answered
NOSCRIPT and sent the acquire in full after the cleanup's release (and its background
repeat) had already run there, so the key stayed held by nobody until its TTL. Fixed: a
failed or interrupted attempt gives its round up (``_core/acquire.py``, ``give_up``) and its
stragglers' NOSCRIPT is no longer answered with the script (docs/testing.md). Since the
world's background repeats a release twice, as the library does (seed 51119), this seed runs
clean without the fix too (the second repeat comes after the late grant); the fix's tests that
fail without it are in tests/unit/test_flows.py and
tests/faults/test_abandoned_noscript_straggler.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.sim.simulate_cli import simulate


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return simulate("--replay", *args)


@pytest.mark.parametrize(
    ("seed", "what", "after"),
    [
        (
            "571",
            "cancel c0/j2/t0 (acquire lock) at driver.py",
            "c0/j2/t0 ended by its cancellation",
        ),
        ("672", "cancel c1/j3/t0 (release) at driver.py", "c1/j3/t0 release of k1 cancelled"),
    ],
    ids=["acquire", "release"],
)
def test_a_cancel_schedule_fires_mid_round_and_replays_clean(
    seed: str, what: str, after: str
) -> None:
    runs = [_replay(seed, "--cancel") for _ in range(2)]
    assert runs[0].stdout == runs[1].stdout
    out = runs[0].stdout
    assert runs[0].returncode == 0, out[-3000:]
    assert "VIOLATION" not in out
    assert "cancel_task" in out.splitlines()[0]  # in the plan (a shrink may leave it out)
    # cancelled while its round was out (the collector's await), and the library goes on
    assert re.search(re.escape(what) + r":\d+ _collect", out), out[-3000:]
    assert after in out


def test_without_cancel_the_other_faults_are_as_they_were() -> None:
    with_cancel = _replay("166", "--cancel").stdout.splitlines()[0]
    without = _replay("166").stdout.splitlines()[0]
    assert "cancel_task" not in without
    assert with_cancel.startswith(without.rstrip())


def test_a_cancelled_acquire_leaves_no_key_behind_seed_50987() -> None:
    run = _replay("50987", "--cancel")
    # the seed's first cancellation still hits an acquire in flight; where they land moves
    # with the driver's timers (an acquire's round once; since the asyncio connection writes a
    # request alone at once, the acquire while it waits and a release mid-round; since the
    # simulation's background double delivers at once what its repeats wake, the second one,
    # at 5.0568, finds no task awaiting anything)
    assert re.search(r"cancel c\d/j\d/t\d \(acquire lock\) at driver\.py:\d+ _pause", run.stdout)
    assert "VIOLATION" not in run.stdout, run.stdout[-2000:]
    assert run.returncode == 0
