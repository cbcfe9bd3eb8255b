"""Run the deterministic simulation of fencelock (issue 22; docs/testing.md).

    python tools/simulate.py --seconds S [--seed X] [--json]   # search fresh schedules
    python tools/simulate.py --replay SEED                      # one schedule, with its trace
    python tools/simulate.py --replay SEED --shrink [--html F]  # ... and its smallest failing form
    python tools/simulate.py --replay SEED --plan TEXT          # a shrunk schedule, exactly
    python tools/simulate.py --mutants [--seconds S]            # every mutant must be caught
    python tools/simulate.py --mutants --seed 1 --clean-seed random --cancel --fork  # CI
    python tools/simulate.py --exhaustive [--deviations K] [--depth D]  # every small schedule
    python tools/simulate.py --exhaustive --replay-choices TEXT  # one of them, with its trace

Each schedule is one seed: its servers, network, clients and faults (a random subset of the
fault kinds: swarm testing) all follow from it, so a failing seed replays exactly. Exit 1 on
any violation or missed mutant. ``--json`` prints one object (DESIGN.md v0.3 "Simulation").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# str hashes are salted per process: a set of strs iterates in another order in another
# process. A schedule must not depend on that, so the command runs with a fixed salt.
if os.environ.get("PYTHONHASHSEED") != "0" and __name__ == "__main__":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools.sim

from tools.sim.checkers import PROPERTIES, violations
from tools.sim.shrink import Plan, ShrinkResult, apply_plan, measure, shrink
from tools.sim.world import FAULT_KINDS, Config, World, run_schedule

PRIMITIVES = ("lock", "semaphore", "multilock", "rwlock", "election", "fair")
# what a schedule's tasks take (each task draws one of its mix)
MIXES = (
    ("lock",),
    ("lock",),
    ("lock", "semaphore"),
    ("semaphore",),
    ("lock", "multilock"),
    ("multilock",),
)
# the rest of the family: a schedule takes one of these mixes instead (a draw of its own, so
# the other schedules keep their shapes and the mutants their catching seeds)
FAMILY_MIXES = (
    ("rwlock",),
    ("rwlock", "lock"),
    ("election",),
    ("election", "semaphore"),
    ("fair",),
)
FAMILY_SHARE = 0.25
# --reentrant-hold: a share of the schedules takes one of these mixes instead (a draw of its
# own, and only with the flag: without it every seed is the schedule it was)
#: what a task takes in them: a reentrant Lock re-entered by its task, ``async with
#: lock.hold()``, ``async with sem.hold()`` (tools/sim/workloads.py)
HOLD_KINDS = ("reentrant", "hold", "semhold")
HOLD_MIXES = (
    ("reentrant",),
    ("reentrant", "lock"),
    ("hold",),
    ("hold", "lock"),
    ("semhold", "semaphore"),
    ("reentrant", "hold"),
)
HOLD_SHARE = 0.5
# --compat: a share of the schedules runs fencelock.compat's redis-py shape instead (tokens
# the caller chose, the same in each job: tools/sim/workloads.py), on one server as redis-py
# does (a draw of its own, and only with the flag)
COMPAT_MIXES = (("compat",), ("compat",), ("compat", "lock"))
COMPAT_SHARE = 0.3


def config_for(seed: int) -> Config:
    """The shape of schedule ``seed`` (servers, clients, faults) drawn from the seed itself."""
    import random

    rng = random.Random(seed * 7919 + 1)
    config = Config(
        servers=rng.choice((1, 3, 3, 5)),
        clients=rng.choice((2, 3, 4)),
        tasks=rng.choice((1, 2, 4)),
        jobs=rng.choice((2, 3, 4)),
        keys=rng.choice((1, 1, 2)),
        ttl=rng.choice((2.0, 4.0)),
        server_timeout=rng.choice((0.1, 0.2)),
        renew=rng.random() < 0.3,
        fault_count=rng.randrange(0, 8),
        faults=tuple(k for k in FAULT_KINDS if rng.random() < 0.7) or FAULT_KINDS,
        overrun=rng.choice((0.0, 0.2, 0.5)),
        extends=rng.random() < 0.4,
        primitives=rng.choice(MIXES),
        limit=rng.choice((1, 2, 3)),
        job_gap=rng.choice((0.0, 0.5, 2.0)),
    )
    family = random.Random(seed * 7919 + 2)
    if family.random() < FAMILY_SHARE:
        config.primitives = family.choice(FAMILY_MIXES)
    if "multilock" in config.primitives:
        config.keys = max(config.keys, 2)
    cancel = random.Random(seed * 7919 + 3)
    if cancel.random() < CANCEL_SHARE:
        config.cancels = cancel.randint(1, 3)
    fork = random.Random(seed * 7919 + 4)
    if fork.random() < FORK_SHARE:
        config.forks = fork.randint(1, 2)
    held = random.Random(seed * 7919 + 5)
    if REENTRANT_HOLD[0] and held.random() < HOLD_SHARE:
        config.primitives = held.choice(HOLD_MIXES)
    compat = random.Random(seed * 7919 + 6)
    if COMPAT[0] and compat.random() < COMPAT_SHARE:
        config.primitives = compat.choice(COMPAT_MIXES)
        config.servers = 1
    config.drain_on_close = DRAIN[0]
    return config


#: The share of schedules with "cancel_task" faults (1-3 client tasks cancelled at seeded
#: moments; a draw of its own, so the other schedules stay as they were)
CANCEL_SHARE = 0.3

#: The share of schedules with "fork_client" faults (1-2 client processes fork at seeded
#: moments, tools/sim/fork.py; a draw of its own, so the other schedules stay as they were)
FORK_SHARE = 0.3


#: A search collects the garbage before every this many schedules (a full collection per
#: schedule was a tenth of the search's time).
COLLECT_EVERY = 10

#: --extend-while-renewing (the default): users' extends race keep_alive's renewals (the race
#: seeds 13252 and 13782 found, fixed; --no-extend-while-renewing leaves it out)
EXTEND_WHILE_RENEWING = [True]

#: --cancel: the "cancel_task" faults of CANCEL_SHARE of the schedules; off by default, so a
#: seed replays as it always did (seed 50987's ghost key, found with it, is fixed; CI's fresh
#: unmutated draw takes it: docs/testing.md). The mutant runs never take it (their catching
#: seeds stay as they were)
CANCEL = [False]

#: --front sync: every schedule runs the blocking front end (threads the world schedules,
#: tools/sim/sync_front.py); its mix and interrupts come from streams of their own
FRONT = ["asyncio"]

#: --fork: the "fork_client" faults of FORK_SHARE of the schedules; off by default (so CI's
#: draw and the mutants' catching seeds stay as they were; the fork mutant runs with it)
FORK = [False]

#: --store: the fenced store (tools/sim/store.py): holders write to it through the library's
#: real guard, checked by guard_refuses_older_writer. It takes no step nor draw of the world's
#: (a seed runs the same steps with it), off by default all the same (its writes are traced)
STORE = [False]

#: --reentrant-hold: HOLD_SHARE of the schedules take a HOLD_MIXES mix (a reentrant Lock
#: re-entered by its task, ``lock.hold()``, ``sem.hold()``); off by default, so a seed replays
#: as it always did and the mutants keep their catching seeds
REENTRANT_HOLD = [False]

#: --compat: COMPAT_SHARE of the schedules take a COMPAT_MIXES mix on one server; off by
#: default, so a seed replays as it always did (its mutant runs with it)
COMPAT = [False]

#: --drain-on-close: in every schedule a connection the client closes still delivers the
#: requests it wrote before (Config.drain_on_close); off by default, so a seed replays as it
#: always did (the mutants keep their catching seeds; CI's unmutated draw takes it)
DRAIN = [False]


def replay_flags() -> str:
    """The flags a violation's replay needs beyond its seed (the search's own)."""
    flags = "" if EXTEND_WHILE_RENEWING[0] else " --no-extend-while-renewing"
    flags += " --cancel" if CANCEL[0] else ""
    flags += " --fork" if FORK[0] else ""
    flags += " --store" if STORE[0] else ""
    flags += " --reentrant-hold" if REENTRANT_HOLD[0] else ""
    flags += " --compat" if COMPAT[0] else ""
    flags += " --drain-on-close" if DRAIN[0] else ""
    return flags + (" --front sync" if FRONT[0] == "sync" else "")


def fresh_seed() -> int:
    """A first seed no earlier run is likely to have started from (``--clean-seed random``):
    from the OS's randomness, above the seeds the docs and tests name."""
    import secrets

    return 100_000 + secrets.randbelow(900_000_000)


def base_config(seed: int) -> Config:
    """Schedule ``seed``'s configuration as a search runs it (the command's flags applied)."""
    config = config_for(seed)
    config.extend_while_renewing = EXTEND_WHILE_RENEWING[0]
    if not CANCEL[0]:
        config.cancels = 0
    if not FORK[0]:
        config.forks = 0
    config.store = STORE[0]
    if FRONT[0] == "sync":
        from tools.sim.sync_front import sync_config

        sync_config(config, seed)
    return config


def one(
    seed: int, *, collect: bool = True, plan: Plan | None = None
) -> tuple[World, list[tuple[str, str]]]:
    """Run schedule ``seed`` (as ``plan`` changes it, if given): its world and violations."""
    from tools.sim.workloads import lock_workload

    config = base_config(seed)
    if plan is not None:
        apply_plan(config, plan)
    workload = lock_workload
    if FRONT[0] == "sync":
        from tools.sim.sync_front import sync_workload

        workload = sync_workload
    world = run_schedule(seed, config, workload, collect=collect)
    return world, violations(world.history)


#: A search shrinks each violation it found within these bounds (``--shrink-runs``,
#: ``--shrink-seconds``); a replay with ``--shrink`` within the larger ones.
SEARCH_SHRINK_RUNS = 40
SEARCH_SHRINK_SECONDS = 15.0
REPLAY_SHRINK_RUNS = 300
REPLAY_SHRINK_SECONDS = 300.0
SHRINK_TOTAL = 4  # a search shrinks for at most this many times --shrink-seconds in all


def shrink_seed(
    seed: int,
    prop: str,
    first: tuple[World, list[tuple[str, str]]] | None = None,
    *,
    plan: Plan | None = None,
    max_runs: int = REPLAY_SHRINK_RUNS,
    max_seconds: float = REPLAY_SHRINK_SECONDS,
) -> ShrinkResult:
    """Shrink schedule ``seed`` (``plan`` of it), which fails ``prop``; ``first`` is its run
    if it was already made."""
    start = plan or Plan()
    world, bad = first if first is not None else one(seed, plan=start)
    original = measure(world, bad, start, prop)
    return shrink(
        lambda p: one(seed, plan=p),
        lambda: base_config(seed),
        prop,
        original,
        max_runs=max_runs,
        max_seconds=max_seconds,
    )


def replay_command(seed: int, plan: Plan) -> str:
    text = plan.text()
    return f"python tools/simulate.py --replay {seed}{replay_flags()}" + (
        f" --plan {text}" if text else ""
    )


def search(
    seconds: float,
    first: int,
    most: int | None = None,
    *,
    stop_at_first: bool = False,
    shrink_runs: int = SEARCH_SHRINK_RUNS,
    shrink_seconds: float = SEARCH_SHRINK_SECONDS,
) -> dict[str, Any]:
    import gc

    # what lives now (modules, caches) is never garbage: out of the collector's sight, so
    # the collection before each schedule looks at the last schedule's objects only
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    seed = first
    schedules = steps = 0
    faults: dict[str, int] = {}
    found: list[dict[str, Any]] = []
    store = {"accepted": 0, "refused": 0, "refused_in_overlap": 0, "overlap_seeds": []}
    while True:
        world, bad = one(seed, collect=schedules % COLLECT_EVERY == 0)
        schedules += 1
        steps += world.steps
        if STORE[0]:
            count_store(store, seed, world)
        for kind, count in world.history.faults.items():
            faults[kind] = faults.get(kind, 0) + count
        if bad:
            prop, detail = bad[0]
            found.append(
                {
                    "seed": seed,
                    "property": prop,
                    "trace": [detail, *world.history.trace[-60:]],
                    "replay": f"python tools/simulate.py --replay {seed}{replay_flags()}",
                }
            )
        seed += 1
        if time.perf_counter() - started >= seconds or len(found) >= (1 if stop_at_first else 20):
            break
        if most is not None and schedules >= most:
            break
    elapsed = max(1e-9, time.perf_counter() - started)
    if shrink_runs > 0 and shrink_seconds > 0:
        # after the search (its figures are the search's own): each violation's schedule,
        # shrunk within the bounds (fields "shrunk_*"; "trace" stays the original's), and
        # SHRINK_TOTAL times the time bound in all (later violations: no shrunk fields)
        shrinking = time.perf_counter()
        for violation in found:
            left = shrink_seconds * SHRINK_TOTAL - (time.perf_counter() - shrinking)
            if left <= 0:
                break
            result = shrink_seed(
                violation["seed"],
                violation["property"],
                max_runs=shrink_runs,
                max_seconds=min(shrink_seconds, left),
            )
            violation.update(shrunk_fields(violation["seed"], result))
    return {
        "schedules": schedules,
        "schedules_per_s": schedules / elapsed,
        "steps": steps,
        "steps_per_s": steps / elapsed,
        "seeds": [first, seed - 1],
        "faults": faults,
        "properties": list(PROPERTIES),
        "primitives": [
            *PRIMITIVES,
            *(HOLD_KINDS if REENTRANT_HOLD[0] else ()),
            *(("compat",) if COMPAT[0] else ()),
        ],
        "violations": found,
        "mutants": [],
        **({"store": store} if STORE[0] else {}),
    }


def count_store(store: dict[str, Any], seed: int, world: World) -> None:
    """Add schedule ``seed``'s fenced-store writes to a search's figures (``--store``)."""
    from tools.sim.store import refused_in_overlap

    writes = world.history.store_writes
    accepted = sum(1 for w in writes if w.accepted)
    store["accepted"] += accepted
    store["refused"] += len(writes) - accepted
    overlap = len(refused_in_overlap(world.history))
    store["refused_in_overlap"] += overlap
    if overlap and len(store["overlap_seeds"]) < 20:
        store["overlap_seeds"].append(seed)


def clean_with(
    flags: tuple[str, ...],
    seconds: float,
    first: int,
    most: int | None,
    shrink_runs: int,
    shrink_seconds: float,
) -> dict[str, Any]:
    """The unmutated code's search with ``flags`` (``--fork``, ``--cancel``) on, as a mutant
    that takes them runs: ``{"args", "schedules", "seeds", "faults", "violations"}``."""
    saved = CANCEL[0], FORK[0], COMPAT[0], DRAIN[0]
    CANCEL[0] = CANCEL[0] or "--cancel" in flags
    FORK[0] = FORK[0] or "--fork" in flags
    COMPAT[0] = COMPAT[0] or "--compat" in flags
    DRAIN[0] = DRAIN[0] or "--drain-on-close" in flags
    try:
        found = search(seconds, first, most, shrink_runs=shrink_runs, shrink_seconds=shrink_seconds)
    finally:
        CANCEL[0], FORK[0], COMPAT[0], DRAIN[0] = saved
    keep = ("schedules", "seeds", "faults", "violations")
    return {"args": list(flags), **{name: found[name] for name in keep}}


def shrunk_fields(seed: int, result: ShrinkResult) -> dict[str, Any]:
    """A violation's JSON fields for its shrunk schedule."""
    small, big = result.shrunk, result.original
    if not big.failed:  # the seed did not fail again: the simulation is not deterministic
        return {"shrink": {"replayed": False, "runs": 0}}
    return {
        "shrunk_trace": [small.detail, *small.trace[-200:]],
        "shrunk_faults": small.fault_kinds,
        "shrunk_plan": small.plan.text(),
        "shrunk_replay": replay_command(seed, small.plan),
        "shrink": {
            "faults": [big.faults, small.faults],
            "steps": [big.steps, small.steps],
            "runs": result.runs,
            "seconds": round(result.seconds, 3),
            "complete": result.complete,
            "replayed": True,
        },
    }


def print_world(world: World, bad: list[tuple[str, str]]) -> None:
    """A run's readable trace: its fault plan, every event, its violations, its size."""
    plan = world.history.plan
    if plan:
        print(
            "planned faults: "
            + ", ".join(
                f"#{i} {kind} at {when - 1000.0:.4f}" + ("" if kept else " (left out)")
                for i, (when, kind, kept) in enumerate(plan)
            )
        )
    print("\n".join(world.history.trace))
    for prop, detail in bad:
        print(f"VIOLATION {prop}: {detail}")
    grants = len(world.history.grants)
    print(f"{world.steps} steps, {grants} grants, faults {world.history.faults}")
    writes = world.history.store_writes
    if writes:
        accepted = sum(1 for w in writes if w.accepted)
        print(f"store: {accepted} writes accepted, {len(writes) - accepted} refused")


def replay(args: argparse.Namespace) -> int:
    try:
        plan = Plan.parse(args.plan or "")
    except ValueError as exc:
        print(f"simulate.py: --plan: {exc}", file=sys.stderr)
        return 2
    world, bad = one(args.replay, plan=plan)
    print_world(world, bad)
    shown: list[tuple[str, World, list[tuple[str, str]]]] = [
        (replay_command(args.replay, plan), world, bad)
    ]
    failing = bool(bad)
    if args.shrink and bad:
        prop = bad[0][0]
        result = shrink_seed(
            args.replay,
            prop,
            (world, bad),
            plan=plan,
            max_runs=args.shrink_runs if args.shrink_runs is not None else REPLAY_SHRINK_RUNS,
            max_seconds=(
                args.shrink_seconds if args.shrink_seconds is not None else REPLAY_SHRINK_SECONDS
            ),
        )
        small = result.shrunk
        assert small.world is not None
        # the shrunk schedule's own violations (the same property among them)
        small_bad = violations(small.world.history)
        print()
        print(f"=== shrunk ({prop}) ===")
        print_world(small.world, small_bad)
        command = replay_command(args.replay, small.plan)
        print(
            f"shrunk seed {args.replay} ({prop}): faults {result.original.faults} -> "
            f"{small.faults}, steps {result.original.steps} -> {small.steps} "
            f"({result.runs} runs, {result.seconds:.1f} s"
            + ("" if result.complete else ", stopped by its bound")
            + f"); replay: {command}"
        )
        shown.append((command, small.world, small_bad))
        failing = small.failed
    if args.html:
        from tools.sim.timeline import html_timeline

        Path(args.html).write_text(html_timeline(args.replay, shown))
        print(f"timeline written to {args.html}")
    return 1 if failing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simulate.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=None, help="search budget (s)")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: from time)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--replay", type=int, default=None, metavar="SEED")
    parser.add_argument(
        "--plan",
        default=None,
        metavar="TEXT",
        help="with --replay: run the seed's schedule as a shrink left it (printed by --shrink)",
    )
    parser.add_argument(
        "--shrink",
        action="store_true",
        help="with --replay: shrink a failing schedule and print both traces",
    )
    parser.add_argument(
        "--html", default=None, metavar="FILE", help="with --replay: write an HTML timeline"
    )
    parser.add_argument(
        "--shrink-runs",
        type=int,
        default=None,
        metavar="N",
        help=(
            f"shrink each violation within N schedule runs (default: {SEARCH_SHRINK_RUNS} in a "
            f"search, {REPLAY_SHRINK_RUNS} with --replay --shrink; 0: no shrinking; the "
            "mutant runs do not shrink)"
        ),
    )
    parser.add_argument(
        "--shrink-seconds",
        type=float,
        default=None,
        metavar="S",
        help=(
            f"... and within S seconds (default: {SEARCH_SHRINK_SECONDS:g} in a search, "
            f"{REPLAY_SHRINK_SECONDS:g} with --replay --shrink)"
        ),
    )
    parser.add_argument("--mutants", action="store_true", help="run the mutant check")
    parser.add_argument(
        "--clean-seed",
        default=None,
        metavar="SEED|random",
        help=(
            "with --mutants: the unmutated run's first seed (default: --seed's); 'random' draws "
            "a fresh one, printed (the mutants keep --seed)"
        ),
    )
    parser.add_argument(
        "--max-schedules", type=int, default=None, help="stop after this many schedules too"
    )
    parser.add_argument(
        "--extend-while-renewing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let holds extend while keep_alive renews (default: on)",
    )
    parser.add_argument(
        "--cancel",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=(
            "cancel client tasks at seeded moments in some schedules (default: off; with "
            "--mutants: the unmutated run only)"
        ),
    )
    parser.add_argument(
        "--fork",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="fork client processes at seeded moments in some schedules (default: off)",
    )
    parser.add_argument(
        "--store",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=(
            "holders write to a fenced store through the library's guard, checked by "
            "guard_refuses_older_writer (default: off; the schedules are the same with it)"
        ),
    )
    parser.add_argument(
        "--reentrant-hold",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=(
            "in some schedules the tasks re-enter a reentrant Lock or hold a lock or permit "
            "with hold() past its ttl (default: off; with --mutants: the unmutated run only)"
        ),
    )
    parser.add_argument(
        "--compat",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=(
            "in some schedules the tasks take fencelock.compat's redis-py lock under tokens "
            "they chose, on one server (default: off)"
        ),
    )
    parser.add_argument(
        "--drain-on-close",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=(
            "a connection the client closes still delivers the requests it wrote before, as "
            "TCP does (default: off, every seed's schedule as it was)"
        ),
    )
    parser.add_argument(
        "--front",
        choices=("asyncio", "sync"),
        default="asyncio",
        help="the front end the clients use (sync: the blocking API on scheduled threads)",
    )
    parser.add_argument(
        "--pending",
        action="store_true",
        help="with --mutants: also the mutants not caught yet (their misses do not fail)",
    )
    parser.add_argument(
        "--stop-at-first", action="store_true", help="stop at the first violation (mutant runs)"
    )
    add_exhaustive_arguments(parser)
    args = parser.parse_args(argv)
    EXTEND_WHILE_RENEWING[0] = args.extend_while_renewing
    CANCEL[0] = args.cancel
    FORK[0] = args.fork
    STORE[0] = args.store
    FRONT[0] = args.front
    REENTRANT_HOLD[0] = args.reentrant_hold
    COMPAT[0] = args.compat
    DRAIN[0] = args.drain_on_close
    if args.front == "sync" and (args.reentrant_hold or args.compat):
        parser.error("--reentrant-hold and --compat draw asyncio workloads (not with --front sync)")
    if args.front == "sync" and (args.fork or args.cancel):
        parser.error("--fork and --cancel are asyncio faults (the sync front has interrupts)")
    import logging

    # the library's warnings (a lease at risk, lost) are the faults doing their work: the
    # history, not the log, is what the checkers read
    logging.getLogger("fencelock").setLevel(logging.CRITICAL)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    if args.exhaustive or args.replay_choices is not None:
        return exhaustive(args)
    if args.seconds is None:
        args.seconds = 10.0
    if args.replay is not None:
        return replay(args)
    if args.plan or args.shrink or args.html:
        parser.error("--plan, --shrink and --html go with --replay")
    if args.clean_seed is not None and not args.mutants:
        parser.error("--clean-seed goes with --mutants (a search takes --seed)")
    clean_first: int | None = None
    if args.clean_seed is not None:
        if args.clean_seed == "random":
            clean_first = fresh_seed()
        else:
            try:
                clean_first = int(args.clean_seed)
            except ValueError:
                parser.error(f"--clean-seed: an integer or 'random', not {args.clean_seed!r}")
    shrink_runs = args.shrink_runs if args.shrink_runs is not None else SEARCH_SHRINK_RUNS
    shrink_seconds = (
        args.shrink_seconds if args.shrink_seconds is not None else SEARCH_SHRINK_SECONDS
    )
    first = args.seed if args.seed is not None else int(time.time()) % 1_000_000_000
    if args.mutants:
        from tools.sim.mutants import run_mutants

        # the unmutated code, for the same budget as each mutant: it must run clean (from
        # --clean-seed: fresh seeds each run, said before it starts so that a run that does
        # not finish can be replayed too)
        clean = first if clean_first is None else clean_first
        print(
            f"unmutated: seeds from {clean}"
            + (f" with{replay_flags()}" if replay_flags() else "")
            + f" (replay one: python tools/simulate.py --replay SEED{replay_flags()})",
            file=sys.stderr,
            flush=True,
        )
        report = search(
            args.seconds,
            clean,
            args.max_schedules,
            shrink_runs=shrink_runs,
            shrink_seconds=shrink_seconds,
        )
        from tools.sim.mutants import MUTANTS, PENDING

        chosen = MUTANTS + PENDING if args.pending else MUTANTS
        # ... and with the flags some mutants' runs take (a fault kind off by default), unless
        # the run above already had them on (CI's: --cancel --fork)
        on = {"--cancel"} if CANCEL[0] else set()
        on |= {"--fork"} if FORK[0] else set()
        on |= {"--compat"} if COMPAT[0] else set()
        on |= {"--drain-on-close"} if DRAIN[0] else set()
        report["clean_with"] = [
            clean_with(flags, args.seconds, first, args.max_schedules, shrink_runs, shrink_seconds)
            for flags in sorted({m.args for m in chosen if m.args})
            if not set(flags) <= on
        ]
        front = ("--front", "sync") if args.front == "sync" else ()
        if front:  # a fork is an asyncio fault: its mutant has no sync form
            chosen = tuple(m for m in chosen if "--fork" not in m.args)
        report["mutants"] = run_mutants(
            args.seconds, first, chosen, most=args.max_schedules, args=front
        )
        pending = {m.name for m in PENDING}
        missed = [m for m in report["mutants"] if not m["caught"] and m["name"] not in pending]
        if args.json:
            print(json.dumps(report))
        else:
            for m in report["mutants"]:
                state = (
                    f"caught after {m['schedules_to_catch']} schedules" if m["caught"] else "MISSED"
                )
                print(f"{m['name']}: {state} (seed {m['seed']})")
            print(
                f"unmutated: {report['schedules']} schedules, seeds {report['seeds'][0]}.."
                f"{report['seeds'][1]}, {len(report['violations'])} violations"
            )
            for v in report["violations"]:
                print(f"VIOLATION (unmutated) seed {v['seed']} {v['property']}: {v['trace'][0]}")
                print(f"  replay: {v['replay']}")
            for extra in report["clean_with"]:
                print(
                    f"unmutated with {' '.join(extra['args'])}: {extra['schedules']} schedules, "
                    f"{len(extra['violations'])} violations"
                )
                for v in extra["violations"]:
                    print(
                        f"VIOLATION (unmutated, {' '.join(extra['args'])}) seed {v['seed']} "
                        f"{v['property']}: {v['trace'][0]}"
                    )
                    print(f"  replay: {v['replay']}")
        unclean = any(extra["violations"] for extra in report["clean_with"])
        return 1 if missed or report["violations"] or unclean else 0
    report = search(
        args.seconds,
        first,
        args.max_schedules,
        stop_at_first=args.stop_at_first,
        shrink_runs=shrink_runs,
        shrink_seconds=shrink_seconds,
    )
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['schedules']} schedules ({report['schedules_per_s']:.1f}/s), "
            f"{report['steps']} steps ({report['steps_per_s']:.0f}/s), seeds "
            f"{report['seeds'][0]}..{report['seeds'][1]}, faults {report['faults']}"
        )
        if "store" in report:
            print(f"store: {report['store']}")
        for v in report["violations"]:
            print(f"VIOLATION seed {v['seed']} {v['property']}: {v['trace'][0]}")
            print(f"  replay: {v['replay']}")
            if "shrunk_replay" in v:
                shrunk = v["shrink"]
                print(
                    f"  shrunk: faults {shrunk['faults'][0]} -> {shrunk['faults'][1]}, steps "
                    f"{shrunk['steps'][0]} -> {shrunk['steps'][1]}: {v['shrunk_replay']}"
                )
    return 1 if report["violations"] else 0


def add_exhaustive_arguments(parser: argparse.ArgumentParser) -> None:
    from tools.sim.exhaustive import Bound

    default = Bound()
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help="enumerate every schedule of the small world within the bound (no --seconds: all)",
    )
    parser.add_argument(
        "--deviations",
        type=int,
        default=default.deviations,
        metavar="K",
        help=f"with --exhaustive: at most K non-default choices (default {default.deviations})",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=None,
        metavar="D",
        help="with --exhaustive: only the first D choice points of a schedule (default: all)",
    )
    parser.add_argument(
        "--message-faults",
        action=argparse.BooleanOptionalAction,
        default=default.faults,
        help="with --exhaustive: a message may also be slow (a straggler) or lost (default: on)",
    )
    parser.add_argument(
        "--flows",
        default="lock,semaphore",
        help="with --exhaustive: the clients' flows, of lock,semaphore (default: both)",
    )
    parser.add_argument(
        "--replay-choices",
        default=None,
        metavar="TEXT",
        help="with --exhaustive: run the schedule of these choices (POINT:ALTERNATIVE,...)",
    )


def exhaustive(args: argparse.Namespace) -> int:
    """``--exhaustive``: the enumeration (or, with ``--replay-choices``, one of its schedules)."""
    from tools.sim.exhaustive import Bound, describe, enumerate_schedules, parse_choices, run_tape

    flows = tuple(f for f in args.flows.split(",") if f)
    if not flows or any(f not in ("lock", "semaphore") for f in flows):
        print("simulate.py: --flows: lock, semaphore or both", file=sys.stderr)
        return 2
    if args.deviations < 0 or (args.depth is not None and args.depth < 0):
        print("simulate.py: --deviations and --depth are >= 0", file=sys.stderr)
        return 2
    bound = Bound(deviations=args.deviations, depth=args.depth, faults=args.message_faults)
    flags = exhaustive_flags(bound, flows)
    if args.replay_choices is not None:
        try:
            tape = parse_choices(args.replay_choices)
        except ValueError as exc:
            print(f"simulate.py: --replay-choices: {exc}", file=sys.stderr)
            return 2
        run = run_tape(tape, bound, flows=flows)
        print_world(run.world, run.bad)
        print(f"{len(run.points)} choice points; non-default:")
        for line in describe(run.points):
            print(f"  {line}")
        return 1 if run.bad else 0
    report_of = enumerate_schedules(
        bound,
        max_schedules=args.max_schedules,
        seconds=args.seconds,
        stop_at_first=args.stop_at_first,
        flows=flows,
    )
    elapsed = max(1e-9, report_of.seconds)
    for v in report_of.violations:
        v["replay"] = (
            f"python tools/simulate.py --exhaustive{flags} --replay-choices '{v['choices']}'"
        )
    report = {
        "schedules": report_of.schedules,
        "schedules_per_s": report_of.schedules / elapsed,
        "steps": report_of.steps,
        "steps_per_s": report_of.steps / elapsed,
        "seeds": [1, 1],
        "faults": report_of.faults,
        "properties": list(PROPERTIES),
        "primitives": list(flows),
        "violations": [{"seed": 1, **v} for v in report_of.violations],
        "mutants": [],
        "exhaustive": {
            "schedules": report_of.schedules,
            "complete": report_of.complete,
            "deviations": bound.deviations,
            "depth": bound.depth,
            "message_faults": bound.faults,
            "flows": list(flows),
            "most_choice_points": report_of.most_points,
            "seconds": round(report_of.seconds, 3),
        },
    }
    if args.json:
        print(json.dumps(report))
    else:
        state = "complete" if report_of.complete else "NOT complete: stopped early"
        print(
            f"exhaustive: {report_of.schedules} schedules ({state}), at most {bound.deviations} "
            f"non-default choices, depth {bound.depth if bound.depth is not None else 'all'}, "
            f"message faults {'on' if bound.faults else 'off'}, flows {','.join(flows)}; "
            f"{report_of.steps} steps, {report_of.seconds:.1f} s, up to "
            f"{report_of.most_points} choice points a schedule, faults {report_of.faults}"
        )
        for v in report_of.violations:
            print(f"VIOLATION {v['property']}: {v['trace'][0]}")
            for line in v["described"]:
                print(f"  {line}")
            print(f"  replay: {v['replay']}")
    return 1 if report_of.violations else 0


def exhaustive_flags(bound: Any, flows: tuple[str, ...]) -> str:
    """The command-line flags that give ``bound`` and ``flows`` (a replay's)."""
    flags = ""
    if bound.depth is not None:
        flags += f" --depth {bound.depth}"
    if not bound.faults:
        flags += " --no-message-faults"
    if flows != ("lock", "semaphore"):
        flags += f" --flows {','.join(flows)}"
    return flags


if __name__ == "__main__":
    sys.exit(main())
