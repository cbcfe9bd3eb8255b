"""The fenced store of the simulation (tools/sim/store.py, ``--store``): holders write to a
simulated store through the library's real guard (``RedisFence`` and its Lua scripts), and
``guard_refuses_older_writer`` checks that the store's history is as if serialised by fence.

Seed 44 (with ``--store``): a server clock jumps past its bound at 6.4488 and c0/j2/t0 is
granted k0 (fence 1013900810) at 6.4671 while c2/j1/t0's lease (fence 1003637412) is valid
until 7.4407, an overlap ``mutual_exclusion`` tolerates; c0 claims the store, and c2's late
write at 6.9809 is refused by the guard. The store takes no step nor draw of the world's: a
seed runs the same steps, and the same trace but for the store's lines, without it."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.sim.simulate_cli import ROOT, sim_env, simulate
from tools.sim.store import StoreWrite, guard_refuses_older_writer
from tools.sim.world import Grant, History

STORE_LINE = re.compile(r"^\s*[\d.]+ store: |^store: ")


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return simulate("--replay", *args)


def test_the_store_refuses_the_older_writer_of_two_overlapping_leases() -> None:
    runs = [_replay("44", "--store") for _ in range(2)]
    assert runs[0].stdout == runs[1].stdout  # byte for byte
    out = runs[0].stdout
    assert runs[0].returncode == 0, out[-3000:]
    assert "VIOLATION" not in out
    assert "clock_break" in out.splitlines()[0]
    assert "c0/j2/t0 granted k0 fence 1013900810 until 10.4173" in out
    assert "store: c0/j2/t0 write k0 fence 1013900810 (claim): accepted" in out
    # c2's lease (granted at 3.4857, valid until 7.4407) overlaps c0's: the guard refuses it
    assert "c2/j1/t0 granted k0 fence 1003637412 until 7.4407" in out
    assert (
        "6.9809 store: c2/j1/t0 write k0 fence 1003637412 (late): REFUSED (store holds 1013900810)"
    ) in out
    assert "store: 7 writes accepted, 1 refused" in out


def test_the_store_changes_no_step_of_a_schedule() -> None:
    for seed in ("44", "32"):
        with_store, without = _replay(seed, "--store"), _replay(seed)
        assert without.returncode == 0 and with_store.returncode == 0
        assert "store:" not in without.stdout
        kept = [line for line in with_store.stdout.splitlines() if not STORE_LINE.match(line)]
        assert kept == without.stdout.splitlines()


def test_a_guard_that_accepts_every_write_is_caught() -> None:
    # the same schedule with fence_write replaced by a script that never refuses: the late
    # write of the older lease lands after the newer's claim
    code = (
        "import sys\n"
        "import fencelock.fence as f\n"
        "from fencelock._scripts import Script\n"
        "src = b\"redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1]) "
        'return {1, ARGV[1]}"\n'
        "import hashlib\n"
        "f.WRITE = Script('fence_write', src, hashlib.sha1(src).hexdigest(), 1)\n"
        "import tools.simulate as s\n"
        "sys.exit(s.main(['--replay', '44', '--store']))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=sim_env(PYTHONHASHSEED="0"),
        cwd=ROOT,
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "VIOLATION guard_refuses_older_writer: k0: the store accepted c2/j1/t0's write" in (
        run.stdout
    )
    assert "c2/j1/t0 (fence 1003637412) wrote at 6.9809 after c0/j2/t0" in run.stdout


def _grant(client: str, fence: int, at: float, deadline: float) -> Grant:
    grant = Grant(client, "k0", f"tok-{client}", fence, at, deadline)
    grant.ended = deadline
    return grant


def _write(grant: Grant, at: float, accepted: bool, current: int) -> StoreWrite:
    return StoreWrite(
        at, grant.client, "k0", grant.fence, grant.token, "write", "late", accepted, current
    )


def test_the_checker_passes_a_history_serialised_by_fence() -> None:
    old, new = _grant("a", 10, 1000.0, 1003.0), _grant("b", 20, 1001.0, 1004.0)
    history = History(grants=[old, new])
    history.store_writes = [
        _write(old, 1000.5, True, 10),
        _write(new, 1001.0, True, 20),
        _write(old, 1002.0, False, 20),  # the older writer refused
    ]
    assert guard_refuses_older_writer(history) == []


def test_the_checker_flags_an_older_writer_accepted_after_the_newer() -> None:
    old, new = _grant("a", 10, 1000.0, 1003.0), _grant("b", 20, 1001.0, 1004.0)
    history = History(grants=[old, new])
    history.store_writes = [_write(new, 1001.0, True, 20), _write(old, 1002.0, True, 10)]
    found = guard_refuses_older_writer(history)
    assert any("the store accepted a's write with fence 10 while it held 20" in f for f in found)
    assert any("accepted fence 10 (a) after 20" in f for f in found)
    assert any("a (fence 10) wrote at 2.0000 after b (fence 20) had" in f for f in found)


def test_the_checker_flags_a_refusal_without_cause() -> None:
    old, new = _grant("a", 10, 1000.0, 1001.0), _grant("b", 20, 1002.0, 1004.0)
    history = History(grants=[old, new])
    history.store_writes = [_write(old, 1000.5, True, 10), _write(new, 1002.5, False, 10)]
    assert guard_refuses_older_writer(history) == [
        "k0: the store refused b's write with fence 20 while it held 10 (at 2.5000)"
    ]


def test_the_checker_flags_an_equal_fence_of_another_lease() -> None:
    a, b = _grant("a", 10, 1000.0, 1001.0), _grant("b", 10, 1002.0, 1004.0)
    history = History(grants=[a, b])
    history.store_writes = [_write(a, 1000.5, True, 10), _write(b, 1002.5, True, 10)]
    found = guard_refuses_older_writer(history)
    assert any("accepted fence 10 (b) after 10" in f for f in found)


def test_the_store_refuses_the_older_writer_across_a_wiped_restart() -> None:
    # seed 39: one server, restarted empty at 3.1972 (crash at 2.8577): c0 is granted k0 at
    # 3.2507 while c3's lease runs until 3.9155; c3's late write is refused
    run = _replay("39", "--store")
    assert run.returncode == 0, run.stdout[-3000:]
    out = run.stdout
    assert "crash sim0 (wiped)" in out and "clock_break" not in out
    assert "3.2507 c0/j2/t0 granted k0 fence 1003250300" in out
    assert (
        "3.7308 store: c3/j0/t0 write k0 fence 1000349161 (late): REFUSED (store holds 1003250300)"
    ) in out
