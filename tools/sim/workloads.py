"""Client programs of the simulation: what users do with the public asyncio API.

A client process runs jobs one after another, each on a new event loop (``asyncio.run()`` per
job); a job runs several tasks on that loop, each building its own Lock per key (as a handler
does) and taking it, holding it for a while (renewed or not), and releasing it. Every grant and
release goes to the world's history with the true time it happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
from redis.exceptions import LockNotOwnedError

import fencelock.asyncio as fl
from fencelock import LockLost, NotAcquired, Unavailable
from fencelock.compat import AsyncRedisPyLock

from .checkers import LIVENESS_QUIET_S
from .fork import Inherited, plan_forks
from .loop import SimLoop
from .world import DRIFT_FACTOR, MIN_EXTEND, PORT, Grant, World, _close_loop

PRIMITIVES = ("lock", "semaphore", "multilock", "rwlock", "election", "fair")

#: A compat lock's key (``compat`` workloads): its name itself, on the first server, where
#: redis-py keeps it (``fencelock.compat``); apart from the Locks' ``fencelock:{k}`` keys.
COMPAT_PREFIX = "compat:"


def compat_lock(key: str, ttl: float, wait: float, sleep: float = 0.1) -> AsyncRedisPyLock:
    """``redis.asyncio.Redis(...).lock(key, timeout=ttl, blocking_timeout=wait,
    lock_class=AsyncRedisPyLock)`` on the world's first server, built per call as a handler
    does (one server, as redis-py's own lock)."""
    conn = redis.asyncio.Redis(host="127.0.0.1", port=PORT)
    return AsyncRedisPyLock(conn, key, timeout=ttl, sleep=sleep, blocking_timeout=wait)


def lock_workload(world: World) -> None:
    """Clients contend for ``config.keys`` lock keys; after the workload and every fault,
    each key must be free again within a bound (no ghost key)."""
    cfg = world.config
    keys = [f"k{i}" for i in range(cfg.keys)]
    start = world.clock.now
    world.plan_faults(start + 0.05, start + cfg.duration * 0.8)
    world.plan_cancels(start + 0.05, start + cfg.duration * 0.5)
    finished: list[int] = [0]
    processes = [cfg.clients]  # client processes whose jobs the workload waits for

    def job(client: str, number: int) -> Callable[[], object]:
        async def body() -> None:
            await asyncio.gather(
                *(task(client, number, t) for t in range(cfg.tasks)), return_exceptions=False
            )

        return body

    async def hold(
        lease: fl.Lease, name: str, grant: Grant, unknown: list[str] | None = None
    ) -> None:
        """Hold for a while: mostly shorter than the lease; sometimes past it (a slow job,
        no renewal: the lease runs out under the holder); sometimes with extends to a new ttl
        (longer or shorter than what is left) in between. An extend of unknown outcome
        (Unavailable) is added to ``unknown``."""
        rng = world.rng
        overrun = rng.random() < cfg.overrun
        span = rng.uniform(0.8, 1.3) * cfg.ttl if overrun else rng.uniform(0.0, cfg.hold_max)
        if not cfg.extends or overrun or (cfg.renew and not cfg.extend_while_renewing):
            await asyncio.sleep(span)
            return
        for _ in range(rng.randrange(1, 4)):
            await asyncio.sleep(span / 3)
            ttl = rng.uniform(MIN_EXTEND, 1.5) * cfg.ttl
            grant.extending = True
            world.phase[name] = "extend"
            try:
                await lease.extend(ttl)
                world.note(f"{name} extended to {ttl:.3f} s: until {lease.deadline - 1000:.4f}")
            except (Unavailable, LockLost) as exc:
                world.note(f"{name} extend to {ttl:.3f} s: {type(exc).__name__}")
                if unknown is not None and isinstance(exc, Unavailable):
                    unknown.append("extend")
                if lease.lost.is_set():
                    return
            finally:
                grant.extending = False
                world.phase[name] = "hold"

    def granted(
        name: str, key: str, lease: fl.Lease, asked: float, kind: str = "lock"
    ) -> tuple[Grant, list[float]]:
        grant = Grant(name, key, lease.token, lease.fence, world.clock.now, lease.deadline)
        grant.kind = kind
        grant.start = lease.acquired_at
        grant.asked = asked
        grant.returned_deadline = lease.deadline
        grant.lease = lease
        world.history.grants.append(grant)
        what = "" if kind == "lock" else f" ({kind})"
        world.note(
            f"{name} granted {key}{what} fence {lease.fence} until {lease.deadline - 1000:.4f}"
        )
        lost_at: list[float] = []
        lease.on_lost(
            lambda _lease: (lost_at.append(world.clock.now), world.lease_lost(grant, _lease))
        )
        if world.store is not None:
            world.store.claim(grant)
        return grant, lost_at

    async def ended(
        name: str,
        grant: Grant,
        lease: fl.Lease,
        lost_at: list[float],
        release: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Release ``lease`` (or call ``release``: a compat lock's own, whose LockLost is
        redis-py's LockNotOwnedError) and record how it went."""
        if world.store is not None:
            world.store.late_write(grant)
        grant.deadline = min(lease.deadline, *lost_at) if lost_at else lease.deadline
        grant.ended = world.clock.now
        grant.lease = None
        grant.lost_reason = lease.lost_reason
        world.phase[name] = "release"
        try:
            await (lease.release() if release is None else release())
            grant.release = "ok"
        except asyncio.CancelledError:
            # (a cancel_task fault: the library must release all the same, or repeat it in
            # the background; the key watch reports it still on a majority past the window)
            grant.release = "cancelled"
            world.note(f"{name} release of {grant.key} cancelled")
            raise
        except (LockLost, LockNotOwnedError):
            grant.release = "LockLost"
        except Unavailable:  # (a compat lock's ServersUnavailable too)
            grant.release = "Unavailable"
        world.note(f"{name} released {grant.key}: {grant.release}")

    async def campaign(name: str) -> None:
        """An election's campaigner (``client.election(key).campaign()``): it leads for a
        while (renewed), then leaves the block or resigns; its term is a grant of kind
        "election" (``one_leader_per_term``)."""
        rng = world.rng
        client = fl.Client(
            world.urls, ttl=cfg.ttl, wait=cfg.wait, server_timeout=cfg.server_timeout
        )
        election = client.election("e0", name=name)
        asked = world.clock.now
        state: list[Any] = []
        world.phase[name] = "acquire election"
        try:
            async with election.campaign(wait=cfg.wait) as term:
                grant, lost_at = granted(name, "e0", term, asked, "election")
                state[:] = [grant, term, lost_at]
                resign = rng.random() < 0.3
                world.phase[name] = "hold election"
                try:
                    await asyncio.sleep(rng.uniform(0.0, cfg.hold_max + cfg.ttl / 2))
                finally:
                    world.phase[name] = "leave election"
                    grant.deadline = min(term.deadline, *lost_at) if lost_at else term.deadline
                    grant.ended = world.clock.now
                    grant.lease = None
                    grant.lost_reason = term.lost_reason
                if resign:
                    world.phase[name] = "resign election"
                    await election.resign()
                    world.note(f"{name} resigned e0")
            grant.release = "left"  # a hold's release: its outcome is not reported
            world.note(f"{name} left e0")
        except NotAcquired:
            world.history.refusals += 1
        except Unavailable:
            world.history.unavailable += 1
        except LockLost:
            if state:
                state[0].release = "LockLost"
            world.note(f"{name} lost e0")

    async def reentrant(name: str) -> None:
        """A task that takes a reentrant Lock (``reentrant=True``: the owner is the task) and
        re-enters it 1-3 times, through the same Lock object or a new one for the same key
        (as a nested call builds its own), then releases the inner acquisitions in order,
        holding on a while after each (an inner release that freed the key would let a
        contender in: mutual_exclusion), then the outermost one. Only the outermost is a
        grant: a re-entry is the same lease (same token and fence), not a second holder; the
        other tasks of the job and the other processes contend as separate owners."""
        rng = world.rng
        options = {"ttl": cfg.ttl, "wait": cfg.wait, "server_timeout": cfg.server_timeout}
        key = rng.choice(keys)
        lock = fl.Lock(world.urls, key, **options, reentrant=True)
        # (staggered: a task of the job may ask while another one holds and re-enters)
        await asyncio.sleep(rng.uniform(0.0, cfg.hold_max))
        asked = world.clock.now
        world.phase[name] = "acquire reentrant"
        try:
            outer = await lock.acquire()
        except NotAcquired:
            world.history.refusals += 1
            return
        except Unavailable:
            world.history.unavailable += 1
            return
        finally:  # an attempt on the key: lock_when_free holds no refusal during it against it
            world.history.lock_attempts.append((name, key, asked, world.clock.now))
        grant, lost_at = granted(name, key, outer, asked)
        world.phase[name] = "hold"
        inner: list[fl.Lease] = []
        try:
            if cfg.renew:
                outer.keep_alive()
            for _ in range(rng.randrange(1, 4)):
                await asyncio.sleep(rng.uniform(0.0, cfg.hold_max / 3))
                again = (
                    lock
                    if rng.random() < 0.5
                    else fl.Lock(world.urls, key, **options, reentrant=True)
                )
                world.phase[name] = "re-enter"
                try:
                    if rng.random() < 0.3:  # one attempt: the owner's own entry, never None
                        entered = await again.try_acquire()
                    else:
                        entered = await again.acquire()
                except LockLost as exc:  # the lease ran out under the owner: refused
                    world.note(f"{name} re-entering {key}: LockLost ({exc})")
                    break
                finally:
                    world.phase[name] = "hold"
                if entered is None or (entered.token, entered.fence) != (
                    outer.token,
                    outer.fence,
                ):
                    what = "None" if entered is None else f"fence {entered.fence}"
                    world.history.errors.append(
                        f"{name}: re-entering {key} (fence {outer.fence}) gave {what}"
                    )
                    break
                inner.append(entered)
                world.note(f"{name} re-entered {key} fence {entered.fence} depth {entered.depth}")
            await hold(outer, name, grant)
            while inner:
                entered = inner.pop()
                world.phase[name] = "leave"
                await entered.release()  # counts down: frees nothing
                world.note(f"{name} left {key} depth {len(inner) + 1} (the outer one holds on)")
                world.phase[name] = "hold"
                await asyncio.sleep(rng.uniform(0.0, cfg.hold_max / 3))
            await ended(name, grant, outer, lost_at)
        except (LockLost, Unavailable) as exc:  # an inner release of a lost lease
            world.note(f"{name} leaving {key}: {type(exc).__name__}")
            await unwind(name, inner, grant, outer, lost_at)
        except asyncio.CancelledError:
            if name not in world.cancelled:
                raise
            # on the way out of nested ``async with`` blocks: the inner acquisitions still
            # open are released first, innermost first, then the outermost (the only one
            # that frees the key; releasing it first would only count down)
            await unwind(name, inner, grant, outer, lost_at)
            raise

    async def unwind(
        name: str, inner: list[fl.Lease], grant: Grant, outer: fl.Lease, lost_at: list[float]
    ) -> None:
        """Release what a reentrant task still holds, innermost first."""
        while inner:
            entered = inner.pop()
            try:
                await entered.release()
            except (LockLost, Unavailable) as exc:
                world.note(f"{name} leaving {grant.key}: {type(exc).__name__}")
        if grant.ended is None:
            await ended(name, grant, outer, lost_at)

    async def compat_rounds(name: str) -> None:
        """A task that takes a compat lock (redis-py's shape, ``fencelock.compat``) 1-3 times
        in a row under the token its caller chose: one per client process and task number,
        the same in every job (``lock.acquire(token=...)``, as a worker that names itself).
        Each round holds it a while (past the lease in some: its release is refused), then
        releases it and, at once or a little later, takes it again under the same token: no
        release of an earlier round may land on a later round's grant (the bug fixed by
        ``LockPlan.tokens_reused``: a refused release repeated in the background deleted the
        next grant). A round with a request of unknown outcome (an extend or the release:
        ServersUnavailable) is followed by the next all the same: that request may still reach
        the server after the next grant of the token, and must be refused there (it carries
        its grant's fence, ``LockPlan.grant_tag``)."""
        rng = world.rng
        process, _, number = name.rpartition("/t")
        token = f"{process.split('/', 1)[0]}-t{number}"
        key = COMPAT_PREFIX + rng.choice(keys)
        sleep = rng.choice((0.05, 0.1, 0.25))
        for _ in range(rng.randrange(1, 4)):
            lock = compat_lock(key, cfg.ttl, cfg.wait, sleep)
            asked = world.clock.now
            world.phase[name] = "acquire compat"
            try:
                took = await lock.acquire(token=token)
            except Unavailable:
                world.history.unavailable += 1
                return
            finally:
                world.history.lock_attempts.append((name, key, asked, world.clock.now))
            if not took:
                world.history.refusals += 1
                return
            lease = lock.lease
            grant, lost_at = granted(name, key, lease, asked, "compat")
            world.phase[name] = "hold"
            unknown: list[str] = []
            try:
                await hold(lease, name, grant, unknown)
                await ended(name, grant, lease, lost_at, lock.release)
            except asyncio.CancelledError:
                if name not in world.cancelled:
                    raise
                if grant.ended is None:
                    await ended(name, grant, lease, lost_at, lock.release)
                raise
            if unknown or grant.release == "Unavailable":
                world.note(f"{name} takes {key} again under {token} (a request unanswered)")
            if rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0.0, 0.1))

    async def held_block(name: str, kind: str) -> None:
        """``async with lock.hold() as lease`` (or ``sem.hold()``): the body awaits in
        steps for 1-2.5 ttls, so only hold()'s renewals keep the lease (each one seen is
        noted); a loss cancels the body and the block raises LockLost. Its grant ends as the
        body does (the release is the block's: its outcome is not reported)."""
        rng = world.rng
        options = {"ttl": cfg.ttl, "wait": cfg.wait, "server_timeout": cfg.server_timeout}
        asked = world.clock.now
        state: list[Grant] = []
        key = "s0" if kind == "semhold" else rng.choice(keys)
        world.phase[name] = f"acquire {kind}"
        try:
            if kind == "semhold":
                sem = fl.Semaphore(world.urls, "s0", cfg.limit, **options)
                block: Any = sem.hold(wait=cfg.wait)
            else:
                block = fl.Lock(world.urls, key, **options).hold(wait=cfg.wait)
            async with block as lease:
                if kind == "semhold":
                    key = f"sem/slot{lease.slot}"
                    world.history.permit_attempts.append((name, asked, world.clock.now))
                grant, lost_at = granted(name, key, lease, asked)
                state.append(grant)
                world.phase[name] = "hold"
                seen = lease.deadline
                steps = rng.randrange(2, 6)
                span = rng.uniform(1.0, 2.5) * cfg.ttl
                try:
                    for _ in range(steps):
                        await asyncio.sleep(span / steps)
                        if lease.deadline > seen:
                            seen = lease.deadline
                            world.note(f"{name} hold of {key} renewed: until {seen - 1000:.4f}")
                finally:
                    world.phase[name] = "release"
                    grant.deadline = min(lease.deadline, *lost_at) if lost_at else lease.deadline
                    grant.ended = world.clock.now
                    grant.lease = None
                    grant.lost_reason = lease.lost_reason
            grant.release = "left"
            world.note(f"{name} left the hold of {key}")
        except NotAcquired:
            world.history.refusals += 1
            if kind == "semhold":
                world.history.permits_refused.append((name, asked, world.clock.now))
                world.history.permit_attempts.append((name, asked, world.clock.now))
        except Unavailable:
            world.history.unavailable += 1
            if kind == "semhold" and not state:
                world.history.permit_attempts.append((name, asked, world.clock.now))
        except LockLost:
            if state:
                state[0].release = "LockLost"
            world.note(f"{name} lost the hold of {key}")
        finally:  # an attempt on the key (the whole block: lock_when_free holds none against it)
            if kind == "hold":
                world.history.lock_attempts.append((name, key, asked, world.clock.now))

    async def task(client: str, number: int, t: int) -> None:
        """One task of a job; a cancel_task fault's CancelledError ends it (recorded), any
        other goes on (the loop closing)."""
        name = f"{client}/j{number}/t{t}"
        me = asyncio.current_task()
        assert me is not None
        world.running[name] = me
        try:
            await take(name)
        except asyncio.CancelledError:
            if name not in world.cancelled:
                raise
            world.note(f"{name} ended by its cancellation")
        finally:
            world.running.pop(name, None)
            world.phase.pop(name, None)

    async def take(name: str) -> None:
        rng = world.rng
        kind = rng.choice(cfg.primitives)
        options = {"ttl": cfg.ttl, "wait": cfg.wait, "server_timeout": cfg.server_timeout}
        asked = world.clock.now
        if kind == "election":
            await campaign(name)
            return
        if kind == "reentrant":
            await reentrant(name)
            return
        if kind in ("hold", "semhold"):
            await held_block(name, kind)
            return
        if kind == "compat":
            await compat_rounds(name)
            return
        granted_as = kind if kind == "fair" else "lock"
        world.phase[name] = f"acquire {kind}"
        try:
            if kind == "multilock" and len(keys) >= 2:
                chosen = sorted(rng.sample(keys, rng.randrange(2, len(keys) + 1)))
                multi = fl.MultiLock(world.urls, chosen, **options)
                for key in chosen:
                    world.busy[key] = world.busy.get(key, 0) + 1
                try:
                    # a wait longer than a lease: the keys taken first must not run out
                    leases: tuple[fl.Lease, ...] = await multi.acquire(
                        rng.uniform(1.0, 2.0) * cfg.ttl
                    )
                finally:
                    for key in chosen:
                        world.busy[key] -= 1
                        world.busy_until[key] = world.clock.now
                        world.history.lock_attempts.append((name, key, asked, world.clock.now))
            elif kind == "semaphore":
                sem = fl.Semaphore(world.urls, "s0", cfg.limit, **options)
                asked = world.clock.now
                try:
                    if rng.random() < 0.3:  # one attempt: None only when all are taken
                        maybe = await sem.try_acquire()
                        if maybe is None:
                            raise NotAcquired("s0", "try_acquire: no permit")
                        permit = maybe
                    else:
                        permit = await sem.acquire()
                except NotAcquired:
                    world.history.permits_refused.append((name, asked, world.clock.now))
                    raise
                finally:
                    world.history.permit_attempts.append((name, asked, world.clock.now))
                leases = (permit,)
                chosen = [f"sem/slot{permit.slot}"]
            elif kind == "rwlock":  # readers share rw0; a writer excludes them all
                rw = fl.RWLock(world.urls, "rw0", **options)
                writer = rng.random() < 0.4
                granted_as = "write" if writer else "read"
                once = rng.random() < 0.3  # one attempt
                try:
                    if once:
                        tried = await (rw.try_write() if writer else rw.try_read())
                        if tried is None:
                            raise NotAcquired("rw0", "try: taken")
                        rw_lease = tried
                    else:
                        rw_lease = await (rw.acquire_write() if writer else rw.acquire_read())
                except NotAcquired:
                    refused = (name, granted_as, once, asked, world.clock.now)
                    world.history.rw_refused.append(refused)
                    raise
                finally:
                    world.history.rw_attempts.append((name, asked, world.clock.now))
                leases = (rw_lease,)
                chosen = ["rw0"]
            else:  # a Lock, or a fair one (the same key: kind "fair" runs in its own mix)
                chosen = [rng.choice(keys)]
                lock = fl.Lock(world.urls, chosen[0], **options, fair=kind == "fair")
                try:
                    leases = (await lock.acquire(),)
                except NotAcquired:
                    if kind == "lock":
                        refused = (name, chosen[0], asked, world.clock.now)
                        world.history.locks_refused.append(refused)
                    raise
                finally:
                    attempt = (name, chosen[0], asked, world.clock.now)
                    world.history.lock_attempts.append(attempt)
        except NotAcquired:
            world.history.refusals += 1
            return
        except Unavailable:
            world.history.unavailable += 1
            return
        except LockLost:  # a MultiLock's key ran out while a later one was awaited: all freed
            world.history.refusals += 1
            return
        held = [
            (granted(name, k, lease, asked, granted_as), lease)
            for k, lease in zip(chosen, leases, strict=True)
        ]
        world.phase[name] = "hold"
        try:
            if len(leases) == 1:
                (grant, lost_at), lease = held[0]
                if cfg.renew:
                    lease.keep_alive()
                await hold(lease, name, grant)
            else:
                await asyncio.sleep(rng.uniform(0.0, cfg.hold_max))
            for (grant, lost_at), lease in held:
                await ended(name, grant, lease, lost_at)
        except asyncio.CancelledError:
            if name not in world.cancelled:
                raise
            # on the way out (a ``finally``, an ``async with``): what is still held is
            # released, once (a release the cancellation cut short is not repeated here)
            for (grant, lost_at), lease in held:
                if grant.ended is None:
                    await ended(name, grant, lease, lost_at)
            raise

    def run_jobs(client: str) -> None:
        def next_job(number: int) -> None:
            if number >= cfg.jobs:
                finished[0] += 1
                return
            loop = SimLoop(world.clock, world.connect, f"{client}/j{number}")
            world.add_loop(loop)
            coro = job(client, number)()
            the_task = loop.create_task(coro)  # type: ignore[arg-type]

            def done(fut: asyncio.Task[object]) -> None:
                if not fut.cancelled() and fut.exception() is not None:
                    exc = fut.exception()
                    world.history.errors.append(f"{client}/j{number}: {type(exc).__name__}: {exc}")
                # asyncio.run() closes the loop at the end of the job: so do we, at once
                world.at(world.clock.now, lambda: _finish(loop, number))

            the_task.add_done_callback(done)

        def _finish(loop: SimLoop, number: int) -> None:
            from .world import _close_loop

            _close_loop(loop)
            # the process idles between jobs (no connection open: what happens to the
            # servers meanwhile, it learns only from its next job's new connections)
            gap = world.rng.uniform(0.0, cfg.job_gap) if cfg.job_gap else 0.0
            world.at(world.clock.now + gap, lambda: next_job(number + 1))

        next_job(0)

    def forked(child: str, inherited: list[Inherited]) -> None:
        """A forked child (tools/sim/fork.py): one job on a new loop, acting on the leases it
        inherited besides one task of its own."""
        processes[0] += 1
        forks = world.forks
        loop = SimLoop(world.clock, world.connect, f"{child}/j0")
        world.add_loop(loop)

        async def body() -> None:
            await asyncio.gather(
                *(forks.use(child, item, cfg.ttl) for item in inherited), task(child, 0, 0)
            )

        def done(fut: asyncio.Task[object]) -> None:
            if not fut.cancelled() and fut.exception() is not None:
                exc = fut.exception()
                world.history.errors.append(f"{child}/j0: {type(exc).__name__}: {exc}")
            finished[0] += 1
            world.at(world.clock.now, lambda: _close_loop(loop))

        loop.create_task(body()).add_done_callback(done)  # type: ignore[arg-type]

    plan_forks(world, start + 0.05, start + cfg.duration * 0.5, forked)
    for c in range(cfg.clients):
        run_jobs(f"c{c}")
    world.watching = True
    world.at(world.clock.now, world.watch_keys)
    world.run_until(lambda: finished[0] >= processes[0], start + cfg.duration * 4)
    world.workload_over = True

    # every fault heals; then each key must be acquirable within a bound (no ghost key)
    heal_at = max(world.clock.now, start + cfg.duration) + 1.0
    world.at(heal_at, lambda: None)
    world.run_until(lambda: False, heal_at)
    world.watching = False
    world.heal()
    # a restarted server does not vote until its uptime exceeds the ttl (restart_delay), and
    # a suspect one is probed in the background: the probe comes after both
    settle_until = world.clock.now + cfg.ttl + 1.5
    world.at(settle_until, lambda: None)
    world.run_until(lambda: False, settle_until)
    probe_done: list[bool] = [False]

    async def probe() -> None:
        # shorter than a lease: a key held by nobody for its TTL is a ghost
        wait = min(cfg.ttl / 2, 1.0)
        options: dict[str, Any] = {"ttl": cfg.ttl, "server_timeout": cfg.server_timeout}
        for key in keys:
            lock = fl.Lock(world.urls, key, **options, fair=cfg.primitives == ("fair",))
            asked = world.clock.now
            try:
                lease = await lock.acquire(wait=wait)
            except (NotAcquired, Unavailable) as exc:
                world.history.liveness.append(f"{key}: {type(exc).__name__}: {exc}")
                continue
            finally:
                world.history.lock_attempts.append(("probe", key, asked, world.clock.now))
            await lease.release()
        if "rwlock" in cfg.primitives:  # a writer: no reader nor writer left behind
            try:
                lease = await fl.RWLock(world.urls, "rw0", **options).acquire_write(wait=wait)
                await lease.release()
            except (NotAcquired, Unavailable) as exc:
                world.history.liveness.append(f"rw0 (write): {type(exc).__name__}: {exc}")
        if "election" in cfg.primitives:
            election = fl.Client(world.urls, **options).election("e0", name="probe")
            try:
                async with election.campaign(wait=wait):
                    pass
            except (NotAcquired, Unavailable, LockLost) as exc:
                world.history.liveness.append(f"e0 (campaign): {type(exc).__name__}: {exc}")
        if "compat" in cfg.primitives:
            for key in keys:
                compat = compat_lock(COMPAT_PREFIX + key, cfg.ttl, wait)
                try:
                    if not await compat.acquire():
                        world.history.liveness.append(f"{COMPAT_PREFIX}{key}: not acquired")
                        continue
                    await compat.release()
                except (Unavailable, LockNotOwnedError) as exc:
                    world.history.liveness.append(f"{COMPAT_PREFIX}{key}: {type(exc).__name__}")
        probe_done[0] = True

    loop = SimLoop(world.clock, world.connect, "probe")
    world.add_loop(loop)
    loop.create_task(probe())
    world.run_until(lambda: probe_done[0], world.clock.now + 3 * cfg.ttl + 5.0)
    if not probe_done[0]:
        world.history.liveness.append("the probe did not finish")
    if "semaphore" in cfg.primitives and cfg.servers >= 3 and cfg.limit >= 2:
        lasting_split(world, granted, ended)


Granted = Callable[[str, str, fl.Lease, float], tuple[Grant, list[float]]]
Ended = Callable[[str, Grant, fl.Lease, list[float]], Awaitable[None]]


def lasting_split(world: World, granted: Granted, ended: Ended) -> None:
    """Servers that disagree on the semaphore's slots for longer than a wait, with nobody
    asking meanwhile (the concurrent asks of the workload make only splits that the next
    attempt resolves): two client processes each take a permit (slots 0 and 1, on every
    server); the first one's release is lost on a majority of the servers, the second one's
    on a minority inside it (a request lost, then the connection reset), and each process is
    killed as its release returns (kill -9: its background repeats of the release die with
    it). What stays until it expires is a staircase: some servers have both slots free, some
    only slot 1, some none. A second after the last fault a third process asks, and must get
    a permit: slot 1 is free on a majority (``permit_when_free``; first-free alone splits
    the vote on every attempt until the keys expire)."""
    cfg = world.config
    rng = world.rng
    n = cfg.servers
    majority = n // 2 + 1
    order = list(range(n))
    rng.shuffle(order)
    # the first release reaches the largest minority, the second one a majority (it is
    # confirmed) but not all: servers order[:n - majority] have both slots free, the next
    # ones slot 1 only, the last ones neither, and no slot is first free on a majority
    lost_first = order[n - majority :]
    lost_second = order[n - rng.randint(1, n - majority) :]
    options: dict[str, Any] = {"ttl": cfg.ttl, "server_timeout": cfg.server_timeout}
    held: dict[str, tuple[Grant, fl.Lease, list[float]]] = {}
    done: set[str] = set()
    loops: dict[str, SimLoop] = {}

    async def take(name: str, wait: float, once: bool) -> None:
        sem = fl.Semaphore(world.urls, "s0", cfg.limit, **options)
        asked = world.clock.now
        try:
            if once:  # one attempt: None only when all are taken
                maybe = await sem.try_acquire()
                if maybe is None:
                    raise NotAcquired("s0", "try_acquire: no permit")
                permit = maybe
            else:
                permit = await sem.acquire(wait=wait)
        except NotAcquired:
            world.history.permits_refused.append((name, asked, world.clock.now))
            world.history.refusals += 1
            return
        except Unavailable:
            world.history.unavailable += 1
            return
        finally:
            world.history.permit_attempts.append((name, asked, world.clock.now))
            done.add(name)
        grant, lost_at = granted(name, f"sem/slot{permit.slot}", permit, asked)
        held[name] = (grant, permit, lost_at)

    async def give_back(name: str, lost: list[int]) -> None:
        grant, permit, lost_at = held[name]
        process = name.split("/", 1)[0]
        cut = {(process, index) for index in lost}
        world.cut |= cut
        if lost:
            world.note(f"{process} cut off from {', '.join(f'sim{i}' for i in sorted(lost))}")
        try:
            await ended(name, grant, permit, lost_at)
        finally:
            world.cut -= cut
            done.add(f"{name} released")

    def run(name: str, coro: Callable[[], Any], what: str, limit_s: float) -> bool:
        process = name.split("/", 1)[0]
        loop = loops.get(process)
        if loop is None:
            loop = loops[process] = SimLoop(world.clock, world.connect, f"{process}/split")
            world.add_loop(loop)
        loop.create_task(coro())
        world.run_until(lambda: what in done, world.clock.now + limit_s)
        return what in done

    first, second, third = "sy/split", "sx/split", "sq/split"
    world.note(
        f"lasting split: {first}'s release lost on "
        f"{', '.join(f'sim{i}' for i in sorted(lost_first))}, {second}'s on "
        f"{', '.join(f'sim{i}' for i in sorted(lost_second))}"
    )
    for name in (first, second):
        run(name, lambda name=name: take(name, cfg.wait, False), name, cfg.wait + 5.0)
        if name not in held:
            return
    for name, lost in ((first, lost_first), (second, lost_second)):
        released = f"{name} released"
        run(name, lambda name=name, lost=lost: give_back(name, lost), released, 5.0)
        world.kill(name.split("/", 1)[0])
        if released not in done:
            return
    # a second past the last fault; the wait ends before the permits' keys expire
    ask_at = world.clock.now + LIVENESS_QUIET_S + 0.05
    expires = min(g.start or g.at for g, _, _ in held.values()) + cfg.ttl * (1 - DRIFT_FACTOR)
    wait = min(cfg.wait, expires - ask_at - 0.1)
    if wait <= 0.0:
        return
    world.at(ask_at, lambda: None)
    world.run_until(lambda: False, ask_at)
    once = rng.random() < 0.3
    run(third, lambda: take(third, wait, once), third, wait + 5.0)
    if third in held:
        released = f"{third} released"
        run(third, lambda: give_back(third, []), released, 5.0)
