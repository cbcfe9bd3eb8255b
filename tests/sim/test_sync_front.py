"""The blocking front end in the simulation (``--front sync``: tools/sim/threads.py,
tools/sim/sync_front.py): ``fencelock.Lock``/``Semaphore`` and ``hold()`` on real threads run
one at a time in the order the seed chooses, the library's own background, timers and renewal
threads among them, and the ``interrupt`` fault (KeyboardInterrupt at a blocking call)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.sim.simulate_cli import simulate
from tools.sim.mutants import MUTANTS, Mutant, _copy_source, apply, run_source, verdict

SYNC = ("--front", "sync")

#: Leaves out the cleanup of an acquire interrupted by an exception (a KeyboardInterrupt
#: mid-round): whatever the round set stays until its TTL. Not one of the mutants the
#: simulation's check runs (only the sync front delivers interrupts): the test below.
SKIP_INTERRUPT_CLEANUP = Mutant(
    name="interrupted-acquire-not-cleaned",
    description="an acquire interrupted mid-round does not release what its round may have set",
    file="_core/acquire.py",
    find="        yield from clean_up(undo, token, heard, None)\n",
    replace="        pass\n",
)


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return simulate("--replay", *args, *SYNC, timeout=180)


def test_a_sync_schedule_replays_byte_for_byte_and_clean() -> None:
    """Seed 29: four processes with Locks and a Semaphore, extends, renewal by keep_alive()
    and hold(): each process's timers thread, renewal pool and background thread run in the
    world (noted as they start), leases held past their first deadline are released "ok"."""
    runs = [_replay("29") for _ in range(2)]
    assert runs[0].stdout == runs[1].stdout
    out = runs[0].stdout
    assert runs[0].returncode == 0, out[-3000:]
    assert "VIOLATION" not in out
    assert "fencelock-timers thread started" in out
    assert "fencelock-renew_0 thread started" in out
    assert "fencelock-background thread started" in out
    assert "left the hold of" in out  # a hold() block
    assert re.search(r"granted sem/slot\d", out)
    grants = int(re.search(r"(\d+) grants", out).group(1))  # type: ignore[union-attr]
    assert grants >= 20


def test_an_interrupted_acquire_leaves_nothing_held_seed_10(tmp_path: Path) -> None:
    """Seed 10: a KeyboardInterrupt reaches c0/j0/t0 in its acquire while the round is out
    (driver.py's poll); the library releases what the round may have set before the
    interrupt goes on, and no key is left held by nobody (no_ghost_key). With that cleanup
    left out, the same schedule leaves the key for its TTL: the checker sees it. (Seed 110
    showed this until the background thread kept watching a server whose late batch failed:
    that moved seed 110's schedule, and its interrupt now comes before the round is out.
    Seed 22 before that, until N-server grants skipped their fence commit when a majority
    agreed.)"""
    run = _replay("10")
    out = run.stdout
    assert run.returncode == 0, out[-3000:]
    assert "interrupt c0/j0/t0 (acquire lock) at driver.py" in out
    assert "c0/j0/t0 ended by its interrupt" in out
    assert "VIOLATION" not in out
    src = _copy_source(tmp_path)
    apply(SKIP_INTERRUPT_CLEANUP, src)
    report = run_source(src, 120.0, 10, most=1, args=SYNC)
    assert [v["property"] for v in report["violations"]] == ["no_ghost_key"], report
    assert "interrupt c0/j0/t0 (acquire lock) at driver.py" in "\n".join(
        report["violations"][0]["trace"]
    )


def test_interrupts_are_planned_apart_from_the_other_faults() -> None:
    """The interrupts come after the other faults in the plan, from a stream of their own:
    seed 5's other faults are those of its asyncio schedule, at the same times."""
    sync = _replay("5").stdout.splitlines()[0]
    asyncio = simulate("--replay", "5", timeout=180).stdout.splitlines()[0]
    assert "interrupt" not in asyncio
    assert sync.startswith(asyncio.rstrip() + ", #2 interrupt at "), (sync, asyncio)


#: Mutants in code both front ends drive (``_core``), and the sync front's first catching seed
#: from seed 1 (``python tools/simulate.py --front sync --mutants --seed 1 --max-schedules
#: 200 --seconds 300``)
CORE_MUTANTS = (
    ("validity-without-drift", 8),  # _core/timing.py (28 before the fence commit skip)
    ("unknown-extend-keeps-later-deadline", 105),  # _core/extend.py (52 before it)
)


@pytest.mark.parametrize(("name", "seed"), CORE_MUTANTS)
def test_a_shared_core_mutant_is_caught_through_the_sync_front(
    tmp_path: Path, name: str, seed: int
) -> None:
    """A bug in the flows both front ends drive is caught through the blocking one too, on
    the schedule where the unmutated code runs clean."""
    mutant = next(m for m in MUTANTS if m.name == name)
    src = _copy_source(tmp_path / "mutant")
    apply(mutant, src)
    report = run_source(src, 300.0, seed, most=1, args=SYNC)
    assert verdict(mutant.name, seed, report)["caught"], report
    clean = run_source(_copy_source(tmp_path / "clean"), 300.0, seed, most=1, args=SYNC)
    assert clean["violations"] == [] and clean["schedules"] == 1


def test_a_free_permit_is_granted_while_won_rounds_late_grants_linger_seed_100427() -> None:
    """Found by the sync front's search: three processes ask for permits (limit 3) at once;
    two win slot 0 and slot 1 on bare majorities, and their rounds' late replies (after the
    win) granted each of them another slot on the third server, which nobody freed. Each
    server then had a different single free slot, and a third process was refused though a
    permit was free (``permit_when_free``). A won permit round now hears its stragglers and
    frees their slots (``_core/acquire.py``, ``Ballot.strays``)."""
    run = _replay("100427", "--plan", "jobs=2,renew=0,faults=-")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "VIOLATION" not in run.stdout


def test_a_renewal_of_unknown_outcome_bounds_an_extend_it_overlapped_seed_9501150() -> None:
    """Found by the sync front's search: c2's user extend(2.219 s) and a keep_alive renewal
    (2 s, started later, on another connection) overlap; the server applies the renewal's
    PEXPIRE last, its reply is dropped (unknown outcome, applied first), then the extend's
    confirmed reply set the deadline 0.2 s past the key (``lease_within_keys``). A round's
    bound now stays on every round that was in flight when it was applied
    (``_frontend/lease.py``, ``_forget_round``). Since a round's calls past their deadline
    are still heard (the late-grant fix, seed 205015) this seed's schedule goes another way
    (its extend asks 1.638 s): it is kept as a clean replay; the overlap itself is
    ``tests/unit/test_extend_settle.py::
    test_a_renewal_applied_first_still_bounds_a_users_extend_it_overlapped``."""
    run = _replay("9501150", "--store")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "VIOLATION" not in run.stdout
    assert "c2/j0/t1 extended to 1.638 s: until 3.5154" in run.stdout


def test_a_server_whose_late_batch_timed_out_is_probed_again_seed_920000825() -> None:
    """Seed 920000825: in c0's process a late batch to sim1 timed out in a delay spike, which
    made sim1 suspect; a straggler job for sim1 that ended while the batch was in flight had
    cleared the server's busy mark, and the next look at it stopped watching it, so nothing
    probed it: it stayed suspect, skipped by c0's rounds, and c0's grant at 3.54 s never ran
    there (grant_lands_everywhere). Now a failed job's server is watched again, and only a
    probe or a late batch makes a server busy."""
    run = _replay("920000825")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "VIOLATION" not in run.stdout
    assert "c0/j2/t0 granted k0 fence" in run.stdout
