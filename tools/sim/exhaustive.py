"""Exhaustive enumeration of a small world's schedules (``simulate.py --exhaustive``).

The swarm (``simulate.py --seconds``) draws every ordering choice of the world from a seed;
this module makes the same world (:mod:`tools.sim.world`, the real asyncio front end, the real
Lua scripts, the same checkers) take each choice from a *tape* instead, and walks the tree of
tapes depth first. The choice points (:class:`TapeChooser`, the world's ``chooser``):

- **every message** (a request on its way to a server, a reply on its way back): it arrives
  *on time* (``SHORT_S``, the default), *late* (``LATE_S``: overtaken by what is sent on
  other connections just after it; order is kept within a connection, it is TCP), *slow*
  (past the round's server timeout: a straggler), or is *lost* (a request lost before the
  server ran it, a reply lost after; then the connection is reset). ``faults=False`` leaves
  the slow and lost alternatives out;
- **ties**: two or more client loops (or a server's timer) due at the same instant: which
  runs first; the one chosen then runs until it is idle at that instant (its steps are not
  interleaved with the other's there). Messages and the world's own timers due then go before
  them (not a choice: a loop that ran first would have seen a message that came an instant
  later, which the late alternative covers). The final probe makes no choice (every message
  on time).

A schedule is its tape: the alternative taken at each choice point, in the order they come
(0, the default, past its end). A run records how many alternatives each point had; the next
tape is the run's with its last point that has an alternative left (within the bound) moved
to that alternative, and nothing after it: depth first, each tape once. The bound
(:class:`Bound`): at most ``deviations`` non-default choices in a schedule (as bounded
preemption: most bugs need few), only the first ``depth`` choice points of a schedule (the
rest take the default; None: all). The enumeration is *complete* when the tree within the
bound is exhausted (not stopped by ``max_schedules`` or ``seconds``).

The workload (:func:`core_workload`): two client processes, one job each, started at the same
instant on N = 3 servers; each takes the Lock ``k0`` (waiting), holds it, extends it to a
shorter ttl, holds, releases it, then takes the semaphore ``s0``'s one permit, holds it and
releases it. After both, every fault is healed and a probe must take ``k0`` and a permit (no
ghost key). No draw of the seed's stream decides anything in it: a tape alone is a schedule
(:func:`parse_choices`, :func:`choices_text`: ``simulate.py --exhaustive --replay-choices``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fencelock.asyncio as fl
from fencelock import LockLost, NotAcquired, Unavailable

from .checkers import violations
from .loop import SimLoop
from .world import Config, Grant, World, _close_loop, _Conn, run_schedule

__all__ = [
    "ALTERNATIVES",
    "Bound",
    "NondeterminismError",
    "Point",
    "TapeChooser",
    "choices_text",
    "core_workload",
    "enumerate_schedules",
    "exhaustive_config",
    "parse_choices",
    "run_tape",
]

SHORT_S = 0.001  # a message on time
LATE_S = 0.003  # a late one: what is sent within 2 ms after it on other connections overtakes it
SLOW_MARGIN_S = 0.05  # a slow one comes this long after the round's server timeout
#: a message's alternatives, in order (the first is the default)
ALTERNATIVES = ("on time", "late", "slow", "lost")
SEED = 1  # tokens and the servers' own draws (the tape decides every ordering)

HOLD_S = 0.1  # each hold (a lease, a permit)
EXTEND_TTL = 1.0  # the extend asks for a shorter ttl than the lease's
FLOWS = ("lock", "semaphore")


class NondeterminismError(RuntimeError):
    """A tape's prefix met a choice point with other alternatives than the run it came from:
    the world is not a function of its tape."""


@dataclass(frozen=True)
class Bound:
    """How much of the tree is enumerated: at most ``deviations`` non-default choices in a
    schedule, at the first ``depth`` choice points only (None: every one); ``faults``: the
    slow and lost alternatives of a message are offered too."""

    deviations: int = 1
    depth: int | None = None
    faults: bool = True


@dataclass(frozen=True)
class Point:
    """One choice point of a run: ``n`` alternatives, ``chosen`` taken, what it was."""

    n: int
    chosen: int
    label: str
    names: tuple[str, ...] = ()  # the alternatives' names


class TapeChooser:
    """The world's chooser that takes its choices from ``tape`` (then the default, 0) and
    records every choice point (the first ``depth``; later ones take the default unrecorded).
    """

    def __init__(
        self, tape: Sequence[int], *, depth: int | None = None, faults: bool = True
    ) -> None:
        self.tape = list(tape)
        self.depth = depth
        self.faults = faults
        self.points: list[Point] = []
        self._first: tuple[float, str] | None = None  # the loop a tie chose (when, which)

    def _choose(self, names: tuple[str, ...], label: str) -> int:
        at = len(self.points)
        if self.depth is not None and at >= self.depth:
            return 0
        chosen = self.tape[at] if at < len(self.tape) else 0
        if chosen >= len(names):
            raise NondeterminismError(
                f"choice point #{at} ({label}) has {len(names)} alternatives, the tape takes "
                f"alternative {chosen}"
            )
        self.points.append(Point(len(names), chosen, label, names))
        return chosen

    def tie(self, world: World, due: list[Callable[[], None]]) -> int:
        if due[0] == world._pop_event or world.workload_over:
            return 0  # messages and timers first; the final probe: not a choice
        names = tuple(_name(action) for action in due)
        now = world.clock.now
        if self._first is not None and self._first[0] == now and self._first[1] in names:
            return names.index(self._first[1])  # the one chosen runs on until it is idle
        chosen = self._choose(names, "which runs first")
        self._first = (now, names[chosen])
        return chosen

    def delay(self, top: float) -> float:
        return SHORT_S  # a handshake, a reset: no choice

    def message(self, world: World, conn: _Conn, kind: str) -> float | None:
        if world.workload_over:  # the final probe is the checkers' instrument: no choice
            return SHORT_S
        names = ALTERNATIVES if self.faults else ALTERNATIVES[:2]
        where = (
            f"{conn.loop.name} -> sim{conn.server}"
            if kind == "request"
            else f"sim{conn.server} -> {conn.loop.name}"
        )
        chosen = names[self._choose(names, f"{kind} {where} (conn {conn.id})")]
        if chosen == "on time":
            return SHORT_S
        if chosen == "late":
            return LATE_S
        if chosen == "slow":
            slow = world.config.server_timeout + SLOW_MARGIN_S
            world.note(f"slow {kind} on conn {conn.id} (sim{conn.server}): {slow:.3f} s")
            world._fault_until(world.clock.now + slow)  # a delay spike, for the checkers
            faults = world.history.faults
            faults["slow_message"] = faults.get("slow_message", 0) + 1
            return slow
        return None  # (the world counts it: lost_request, drop_reply)


def _name(action: Callable[[], None]) -> str:
    owner = getattr(action, "__self__", None)
    if isinstance(owner, SimLoop):
        return owner.name
    return "a server's timer"


def exhaustive_config() -> Config:
    """The small world: 3 servers, 2 client processes, one job of one task each."""
    return Config(
        servers=3,
        clients=2,
        tasks=1,
        jobs=1,
        keys=1,
        ttl=2.0,
        server_timeout=0.2,
        wait=3.0,
        faults=(),
        fault_count=0,
        limit=1,
        duration=8.0,
        max_steps=50_000,
    )


def core_workload(world: World, flows: Sequence[str] = FLOWS) -> None:
    """Two client processes at once: the Lock (acquire, hold, extend shorter, hold, release),
    then the semaphore's one permit (acquire, hold, release); then the faults heal and a
    probe takes ``k0`` and a permit. Grants, releases and errors go to the history as the
    swarm's workload records them (the same checkers read it)."""
    cfg = world.config
    start = world.clock.now
    options: dict[str, Any] = {
        "ttl": cfg.ttl,
        "wait": cfg.wait,
        "server_timeout": cfg.server_timeout,
    }
    finished: list[int] = [0]

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
        return grant, lost_at

    async def ended(name: str, grant: Grant, lease: fl.Lease, lost_at: list[float]) -> None:
        grant.deadline = min(lease.deadline, *lost_at) if lost_at else lease.deadline
        grant.ended = world.clock.now
        grant.lease = None
        grant.lost_reason = lease.lost_reason
        try:
            await lease.release()
            grant.release = "ok"
        except LockLost:
            grant.release = "LockLost"
        except Unavailable:
            grant.release = "Unavailable"
        world.note(f"{name} released {grant.key}: {grant.release}")

    async def lock_flow(name: str) -> None:
        asked = world.clock.now
        try:
            lease = await fl.Lock(world.urls, "k0", **options).acquire()
        except NotAcquired:
            world.history.refusals += 1
            return
        except Unavailable:
            world.history.unavailable += 1
            return
        grant, lost_at = granted(name, "k0", lease, asked)
        await asyncio.sleep(HOLD_S)
        grant.extending = True
        try:
            await lease.extend(EXTEND_TTL)
            world.note(f"{name} extended to {EXTEND_TTL} s: until {lease.deadline - 1000:.4f}")
        except (Unavailable, LockLost) as exc:
            world.note(f"{name} extend to {EXTEND_TTL} s: {type(exc).__name__}")
        finally:
            grant.extending = False
        await asyncio.sleep(HOLD_S)
        await ended(name, grant, lease, lost_at)

    async def semaphore_flow(name: str) -> None:
        sem = fl.Semaphore(world.urls, "s0", cfg.limit, **options)
        asked = world.clock.now
        try:
            permit = await sem.acquire()
        except NotAcquired:
            world.history.permits_refused.append((name, asked, world.clock.now))
            world.history.refusals += 1
            return
        except Unavailable:
            world.history.unavailable += 1
            return
        finally:
            world.history.permit_attempts.append((name, asked, world.clock.now))
        grant, lost_at = granted(name, f"sem/slot{permit.slot}", permit, asked)
        await asyncio.sleep(HOLD_S)
        await ended(name, grant, permit, lost_at)

    async def job(name: str) -> None:
        if "lock" in flows:
            await lock_flow(name)
        if "semaphore" in flows:
            await semaphore_flow(name)

    for c in range(cfg.clients):
        client = f"c{c}"
        loop = SimLoop(world.clock, world.connect, f"{client}/j0")
        world.add_loop(loop)
        task = loop.create_task(job(f"{client}/j0/t0"))

        def done(fut: asyncio.Task[None], client: str = client, loop: SimLoop = loop) -> None:
            if not fut.cancelled() and fut.exception() is not None:
                exc = fut.exception()
                world.history.errors.append(f"{client}/j0: {type(exc).__name__}: {exc}")
            finished[0] += 1
            world.at(world.clock.now, lambda: _close_loop(loop))

        task.add_done_callback(done)

    world.watching = True
    world.at(world.clock.now, world.watch_keys)
    world.run_until(lambda: finished[0] >= cfg.clients, start + cfg.duration)
    if finished[0] < cfg.clients:
        world.history.liveness.append(
            f"the workload did not finish within {cfg.duration:g} s ({world.steps} steps)"
        )
    world.workload_over = True
    # every fault heals; then k0 and a permit must be free within a bound (no ghost key)
    heal_at = world.clock.now + 1.0
    world.at(heal_at, lambda: None)
    world.run_until(lambda: False, heal_at)
    world.watching = False
    world.heal()
    settle_until = world.clock.now + cfg.ttl + 1.5
    world.at(settle_until, lambda: None)
    world.run_until(lambda: False, settle_until)
    probe_done: list[bool] = [False]

    async def probe() -> None:
        wait = min(cfg.ttl / 2, 1.0)
        probe_options: dict[str, Any] = {"ttl": cfg.ttl, "server_timeout": cfg.server_timeout}
        try:
            lease = await fl.Lock(world.urls, "k0", **probe_options).acquire(wait=wait)
            await lease.release()
        except (NotAcquired, Unavailable) as exc:
            world.history.liveness.append(f"k0: {type(exc).__name__}: {exc}")
        if "semaphore" in flows:
            sem = fl.Semaphore(world.urls, "s0", cfg.limit, **probe_options)
            try:
                permit = await sem.acquire(wait=wait)
                await permit.release()
            except (NotAcquired, Unavailable) as exc:
                world.history.liveness.append(f"s0: {type(exc).__name__}: {exc}")
        probe_done[0] = True

    loop = SimLoop(world.clock, world.connect, "probe")
    world.add_loop(loop)
    loop.create_task(probe())
    world.run_until(lambda: probe_done[0], world.clock.now + 3 * cfg.ttl + 5.0)
    if not probe_done[0]:
        world.history.liveness.append("the probe did not finish")


@dataclass
class Run:
    """One schedule of the enumeration: its world, violations and choice points."""

    world: World
    bad: list[tuple[str, str]]
    points: list[Point]

    @property
    def tape(self) -> list[int]:
        return [p.chosen for p in self.points]


def run_tape(
    tape: Sequence[int],
    bound: Bound = Bound(),
    *,
    config: Config | None = None,
    flows: Sequence[str] = FLOWS,
    collect: bool = False,
) -> Run:
    """Run the schedule ``tape`` chooses (the default past its end) and check it."""
    chooser = TapeChooser(tape, depth=bound.depth, faults=bound.faults)
    world = run_schedule(
        SEED,
        config if config is not None else exhaustive_config(),
        lambda w: core_workload(w, flows),
        collect=collect,
        chooser=chooser,
    )
    return Run(world, violations(world.history), chooser.points)


def next_tape(points: Sequence[Point], deviations: int) -> list[int] | None:
    """The tape after a run's (depth first): its last point with an alternative left whose
    taking keeps the non-default choices within ``deviations``, moved on; None: none left."""
    used = [0] * (len(points) + 1)  # non-default choices before each point
    for i, p in enumerate(points):
        used[i + 1] = used[i] + (p.chosen != 0)
    for i in range(len(points) - 1, -1, -1):
        p = points[i]
        if p.chosen + 1 < p.n and used[i] + 1 <= deviations:
            return [q.chosen for q in points[:i]] + [p.chosen + 1]
    return None


def choices_text(tape: Sequence[int]) -> str:
    """A tape's non-default choices as ``POINT:ALTERNATIVE,...`` ("" for the default one)."""
    return ",".join(f"{i}:{c}" for i, c in enumerate(tape) if c)


def parse_choices(text: str) -> list[int]:
    """The tape ``choices_text`` wrote.

    Raises:
        ValueError: not ``POINT:ALTERNATIVE`` pairs of non-negative integers.
    """
    tape: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        point, sep, alternative = part.partition(":")
        if not sep or not point.isdigit() or not alternative.isdigit():
            raise ValueError(f"{part!r} is not POINT:ALTERNATIVE")
        at, chosen = int(point), int(alternative)
        tape.extend([0] * (at + 1 - len(tape)))
        tape[at] = chosen
    return tape


def describe(points: Sequence[Point]) -> list[str]:
    """The non-default choices of a run, readable: ``#POINT LABEL: NAME``."""
    return [
        f"#{i} {p.label}: {p.names[p.chosen] if p.names else p.chosen}"
        for i, p in enumerate(points)
        if p.chosen
    ]


@dataclass
class Enumeration:
    schedules: int = 0
    steps: int = 0
    complete: bool = False
    seconds: float = 0.0
    most_points: int = 0  # the most choice points one schedule had
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)


def enumerate_schedules(
    bound: Bound = Bound(),
    *,
    max_schedules: int | None = None,
    seconds: float | None = None,
    stop_at_first: bool = False,
    flows: Sequence[str] = FLOWS,
    progress: Callable[[Enumeration], None] | None = None,
) -> Enumeration:
    """Every schedule within ``bound``, depth first, each through the checkers; stops early
    at ``max_schedules``, after ``seconds``, or (``stop_at_first``) at the first violation
    (then ``complete`` is False). A violation: ``{"choices", "property", "trace",
    "described"}`` (``choices``: :func:`choices_text` of its tape)."""
    import gc

    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    result = Enumeration()
    tape: list[int] | None = []
    while tape is not None:
        run = run_tape(tape, bound, flows=flows, collect=result.schedules % 10 == 0)
        if run.tape[: len(tape)] != tape:
            raise NondeterminismError(f"tape {choices_text(tape)!r} ran as {run.tape!r}")
        result.schedules += 1
        result.steps += run.world.steps
        result.most_points = max(result.most_points, len(run.points))
        for kind, count in run.world.history.faults.items():
            result.faults[kind] = result.faults.get(kind, 0) + count
        if run.bad:
            prop, detail = run.bad[0]
            result.violations.append(
                {
                    "choices": choices_text(run.tape),
                    "property": prop,
                    "described": describe(run.points),
                    "trace": [detail, *run.world.history.trace[-60:]],
                }
            )
        if progress is not None:
            progress(result)
        tape = next_tape(run.points, bound.deviations)
        if tape is None:
            result.complete = True
            break
        if (stop_at_first and result.violations) or len(result.violations) >= 20:
            break
        if max_schedules is not None and result.schedules >= max_schedules:
            break
        if seconds is not None and time.perf_counter() - started >= seconds:
            break
    result.seconds = time.perf_counter() - started
    return result
