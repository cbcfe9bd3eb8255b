"""The blocking front end in the world: client programs of the sync API (``fencelock.Lock``,
``fencelock.Semaphore``, ``Lock.hold()`` with its renewal threads), on threads the world
schedules (:mod:`tools.sim.threads`), and the ``interrupt`` client fault (Ctrl-C).

A client process runs jobs one after another; a job is ``config.tasks`` threads started
together, the first of them the process's main thread (the one a Ctrl-C interrupts, as
CPython delivers signals to the main thread only); each thread builds its own Lock or
Semaphore (as a handler does), takes it, holds it for a while (renewed by ``keep_alive()`` or
inside ``with lock.hold():``, or not), and releases it. The process's background thread, timers
thread and renewal pool are the library's own, made on first use as in a real process. Every
grant and release goes to the world's history as in :mod:`tools.sim.workloads`; the same
checkers read it.

The interrupt fault: at a moment drawn from a random stream of its own, one client job's main
thread that is blocked in a call (a round's ``poll``, a wait's ``select``, a backoff's
``sleep``, the user's own ``sleep`` while holding) gets ``KeyboardInterrupt`` there, as a
signal handler raises it; the library cleans up and re-raises, and the thread ends (recorded:
``interrupt NAME (phase) at file:line function``). An interrupted acquire records no grant
(a key it left is a ghost unless the library released it within the cleanup window); an
interrupted release is "interrupted", and must be applied all the same (by the background)
like a confirmed one; a lease held when the interrupt came is released on the way out (a
``with`` block's exit), or by ``hold()`` itself.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import fencelock as fl
from fencelock import LockLost, NotAcquired, Unavailable

from .threads import SimThread, ThreadHub, patched_sync
from .world import MIN_EXTEND, Grant, World

#: The sync front's mixes (the primitives it drives: Lock, Semaphore)
SYNC_MIXES = (("lock",), ("lock",), ("lock", "semaphore"), ("semaphore",))
#: The share of sync schedules with interrupts (1-3), and of their tasks that take the lock
#: with ``hold()`` (its renewal threads) rather than acquire/keep_alive/release
INTERRUPT_SHARE = 0.4
HOLD_SHARE = 0.4


def sync_config(config: Any, seed: int) -> None:
    """Make schedule ``seed``'s configuration a sync front's one: its mix and interrupts drawn
    from random streams of their own (the asyncio front's draws, and so its schedules, are
    untouched)."""
    rng = random.Random(seed * 7919 + 17)
    config.primitives = rng.choice(SYNC_MIXES)
    config.keys = max(1, min(config.keys, 2))
    config.cancels = 0
    config.forks = 0  # a fork is modelled for the asyncio front only (tools/sim/fork.py)
    config.interrupts = rng.randint(1, 3) if rng.random() < INTERRUPT_SHARE else 0


def sync_workload(world: World) -> None:
    hub = ThreadHub(world)
    world.hub = hub  # type: ignore[attr-defined]
    world.interrupts = []  # type: ignore[attr-defined]
    with patched_sync(hub):
        try:
            _run(world, hub)
        finally:
            hub.close()
    if hub.leaked:
        world.history.errors.append(f"threads left blocked at the end: {hub.leaked}")


def _innermost(thread: SimThread) -> str:
    """Where ``thread`` is blocked: the innermost frame outside the simulation's machinery."""
    frame = sys._current_frames().get(thread._thread.ident or -1)
    while frame is not None and (
        frame.f_code.co_filename.endswith(("/tools/sim/threads.py", "/threading.py"))
        or frame.f_code.co_name in ("fl_sleep", "told", "_innermost")
    ):
        frame = frame.f_back
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {code.co_name}"


def plan_interrupts(world: World, hub: ThreadHub, start: float, end: float) -> None:
    """The "interrupt" faults: ``config.interrupts`` moments in [start, end] from a stream of
    their own; in the plan after the others (a shrink can leave them out)."""
    cfg = world.config
    rng = random.Random(world.seed * 7919 + 19)
    keep = cfg.keep_faults
    first = cfg.fault_count + cfg.cancels
    interrupted: set[str] = set()

    def fire() -> None:
        live = [
            t
            for t in hub.threads
            if t.main and t.started and not t.done and t.name not in interrupted
        ]
        if not live:
            if not getattr(world, "workload_over", False):
                world.at(world.clock.now + rng.uniform(0.005, 0.2), fire)
            else:
                world.note("interrupt: no client thread running")
            return
        thread = rng.choice(live)
        # where: the blocking call it is in now, or one of its next few (a round's poll, a
        # wait, a sleep: points in its calls rather than in time, which a long wait fills)
        after = rng.choice((0, 0, 1, 2, 3, 5, 8))
        interrupted.add(thread.name)

        def told() -> None:
            where = _innermost(thread)
            phase = world.phase.get(thread.name, "?")
            world.interrupts.append((world.clock.now, thread.name, phase, where))  # type: ignore[attr-defined]
            world.note(f"interrupt {thread.name} ({phase}) at {where}")
            world._fault_until(world.clock.now)

        thread.interrupt(KeyboardInterrupt(), after, told)

    for number in range(first, first + getattr(cfg, "interrupts", 0)):
        when = rng.uniform(start, end)
        kept = keep is None or number in keep
        world.history.plan.append((when, "interrupt", kept))
        if not kept:
            continue
        world.history.faults["interrupt"] = world.history.faults.get("interrupt", 0) + 1
        world.at(when, fire)


def _run(world: World, hub: ThreadHub) -> None:
    cfg = world.config
    keys = [f"k{i}" for i in range(cfg.keys)]
    start = world.clock.now
    world.plan_faults(start + 0.05, start + cfg.duration * 0.8)
    plan_interrupts(world, hub, start + 0.05, start + cfg.duration * 0.5)
    finished: list[int] = [0]
    options: dict[str, Any] = {
        "ttl": cfg.ttl,
        "wait": cfg.wait,
        "server_timeout": cfg.server_timeout,
    }

    def granted(name: str, key: str, lease: fl.Lease, asked: float) -> tuple[Grant, list[float]]:
        grant = Grant(name, key, lease.token, lease.fence, world.clock.now, lease.deadline)
        grant.start = lease.acquired_at
        grant.asked = asked
        grant.returned_deadline = lease.deadline
        grant.lease = lease
        world.history.grants.append(grant)
        world.note(f"{name} granted {key} fence {lease.fence} until {lease.deadline - 1000:.4f}")
        lost_at: list[float] = []
        lease.on_lost(
            lambda _lease: (lost_at.append(world.clock.now), world.lease_lost(grant, _lease))
        )
        if world.store is not None:
            world.store.claim(grant)
        return grant, lost_at

    def closing(grant: Grant, lease: fl.Lease, lost_at: list[float]) -> None:
        grant.deadline = min(lease.deadline, *lost_at) if lost_at else lease.deadline
        grant.ended = world.clock.now
        grant.lease = None
        grant.lost_reason = lease.lost_reason

    def ended(name: str, grant: Grant, lease: fl.Lease, lost_at: list[float]) -> None:
        if world.store is not None:
            world.store.late_write(grant)
        closing(grant, lease, lost_at)
        world.phase[name] = "release"
        try:
            lease.release()
            grant.release = "ok"
        except KeyboardInterrupt:
            # the library must release all the same (it repeats it in the background): the
            # key watch reports it still on a majority past the window
            grant.release = "interrupted"
            world.note(f"{name} release of {grant.key} interrupted")
            raise
        except LockLost:
            grant.release = "LockLost"
        except Unavailable:
            grant.release = "Unavailable"
        world.note(f"{name} released {grant.key}: {grant.release}")

    def hold_for(name: str, lease: fl.Lease, grant: Grant) -> None:
        """The user's work: mostly shorter than the lease, sometimes past it (no renewal),
        sometimes with extends to a new ttl in between (as the asyncio workload)."""
        rng = world.rng
        overrun = rng.random() < cfg.overrun
        span = rng.uniform(0.8, 1.3) * cfg.ttl if overrun else rng.uniform(0.0, cfg.hold_max)
        if not cfg.extends or overrun or (cfg.renew and not cfg.extend_while_renewing):
            fl_sleep(span)
            return
        for _ in range(rng.randrange(1, 4)):
            fl_sleep(span / 3)
            ttl = rng.uniform(MIN_EXTEND, 1.5) * cfg.ttl
            grant.extending = True
            world.phase[name] = "extend"
            try:
                lease.extend(ttl)
                world.note(f"{name} extended to {ttl:.3f} s: until {lease.deadline - 1000:.4f}")
            except (Unavailable, LockLost) as exc:
                world.note(f"{name} extend to {ttl:.3f} s: {type(exc).__name__}")
                if lease.lost.is_set():
                    return
            finally:
                grant.extending = False
                world.phase[name] = "hold"

    def with_hold(name: str, key: str, lock: fl.Lock, asked: float) -> None:
        """``with lock.hold(wait=...) as lease``: renewed by the library's timers and pool
        threads while the block runs, released when it ends."""
        state: list[Any] = []
        in_body = [False]
        try:
            with lock.hold(wait=cfg.wait) as lease:
                grant, lost_at = granted(name, key, lease, asked)
                state[:] = [grant, lease, lost_at]
                world.phase[name] = "hold"
                in_body[0] = True
                try:
                    fl_sleep(world.rng.uniform(0.0, cfg.hold_max + cfg.ttl / 2))
                    in_body[0] = False
                finally:
                    closing(grant, lease, lost_at)
                    world.phase[name] = "release"
            grant.release = "ok"
            world.note(f"{name} left the hold of {key}")
        except LockLost:
            if not state:
                raise
            state[0].release = "LockLost"
            world.note(f"{name} lost {key} while the block ran")
        except Unavailable:
            if not state:
                raise
            state[0].release = "Unavailable"
            world.note(f"{name} released {key}: Unavailable")
        except KeyboardInterrupt:
            if state:
                # in the block: hold() released it quietly (its outcome is not reported);
                # in the release after it: interrupted (it must be applied all the same)
                state[0].release = "quiet" if in_body[0] else "interrupted"
                world.note(f"{name} release of {key} after the interrupt: {state[0].release}")
            raise

    def take(name: str) -> None:
        rng = world.rng
        kind = rng.choice(cfg.primitives)
        asked = world.clock.now
        world.phase[name] = f"acquire {kind}"
        try:
            if kind == "semaphore":
                sem = fl.Semaphore(world.urls, "s0", cfg.limit, **options)
                try:
                    if rng.random() < 0.3:
                        maybe = sem.try_acquire()
                        if maybe is None:
                            raise NotAcquired("s0", "try_acquire: no permit")
                        permit = maybe
                    else:
                        permit = sem.acquire()
                except NotAcquired:
                    world.history.permits_refused.append((name, asked, world.clock.now))
                    raise
                finally:
                    world.history.permit_attempts.append((name, asked, world.clock.now))
                lease: fl.Lease = permit
                key = f"sem/slot{permit.slot}"
            else:
                key = rng.choice(keys)
                lock = fl.Lock(world.urls, key, **options)
                if cfg.renew and rng.random() < HOLD_SHARE:
                    world.phase[name] = "hold() acquire lock"
                    try:  # (its acquire's end is not seen here: the whole block counts)
                        with_hold(name, key, lock, asked)
                    finally:
                        world.history.lock_attempts.append((name, key, asked, world.clock.now))
                    return
                try:
                    lease = lock.acquire()
                except NotAcquired:
                    world.history.locks_refused.append((name, key, asked, world.clock.now))
                    raise
                finally:
                    world.history.lock_attempts.append((name, key, asked, world.clock.now))
        except NotAcquired:
            world.history.refusals += 1
            return
        except Unavailable:
            world.history.unavailable += 1
            return
        grant, lost_at = granted(name, key, lease, asked)
        world.phase[name] = "hold"
        try:
            if cfg.renew:
                lease.keep_alive()
            hold_for(name, lease, grant)
        except KeyboardInterrupt:
            # on the way out (a ``with lease:`` block's exit): released, once
            if grant.ended is None:
                ended(name, grant, lease, lost_at)
            raise
        ended(name, grant, lease, lost_at)

    def thread_body(name: str, done: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                take(name)
            except KeyboardInterrupt:
                world.note(f"{name} ended by its interrupt")
            except Exception as exc:
                world.history.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            finally:
                world.phase.pop(name, None)
                done()

        return body

    def run_jobs(client: str) -> None:
        def next_job(number: int) -> None:
            if number >= cfg.jobs:
                finished[0] += 1
                return
            left = [cfg.tasks]

            def one_done() -> None:
                left[0] -= 1
                if left[0] == 0:
                    gap = world.rng.uniform(0.0, cfg.job_gap) if cfg.job_gap else 0.0
                    world.at(world.clock.now + gap, lambda: next_job(number + 1))

            for t in range(cfg.tasks):
                name = f"{client}/j{number}/t{t}"
                hub.spawn(client, name, thread_body(name, one_done), main=t == 0)

        next_job(0)

    for c in range(cfg.clients):
        run_jobs(f"c{c}")
    world.watching = True
    world.at(world.clock.now, world.watch_keys)
    world.run_until(lambda: finished[0] >= cfg.clients, start + cfg.duration * 4)
    world.workload_over = True

    heal_at = max(world.clock.now, start + cfg.duration) + 1.0
    world.at(heal_at, lambda: None)
    world.run_until(lambda: False, heal_at)
    world.watching = False
    world.heal()
    settle_until = world.clock.now + cfg.ttl + 1.5
    world.at(settle_until, lambda: None)
    world.run_until(lambda: False, settle_until)
    probe_done: list[bool] = [False]

    def probe() -> None:
        wait = min(cfg.ttl / 2, 1.0)
        probe_options: dict[str, Any] = {"ttl": cfg.ttl, "server_timeout": cfg.server_timeout}
        for key in keys:
            lock = fl.Lock(world.urls, key, **probe_options)
            asked = world.clock.now
            try:
                lease = lock.acquire(wait=wait)
            except (NotAcquired, Unavailable) as exc:
                world.history.liveness.append(f"{key}: {type(exc).__name__}: {exc}")
                continue
            finally:
                world.history.lock_attempts.append(("probe", key, asked, world.clock.now))
            lease.release()
        probe_done[0] = True

    hub.spawn("probe", "probe", probe, main=True)
    world.run_until(lambda: probe_done[0], world.clock.now + 3 * cfg.ttl + 5.0)
    if not probe_done[0]:
        world.history.liveness.append("the probe did not finish")


def fl_sleep(seconds: float) -> None:
    """The user's own work: a blocking sleep (the world's clock, as the library's)."""
    import time

    time.sleep(seconds)
