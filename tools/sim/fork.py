"""The "fork_client" fault (``--fork``): a simulated client process forks while a job of its
runs, and parent and child go on as two client processes.

What is modelled is the realistic way an asyncio program forks: a coroutine calls something
that forks (``multiprocessing`` with the fork start method, a pre-fork server's worker spawn)
while the process holds leases (renewed by ``keep_alive()`` or not). The parent returns into
its loop and goes on untouched. The child never runs the parent's loop again (on Python 3.11
``asyncio.get_running_loop()`` in the child does not even see it): it runs a job of its own on
a new loop (``asyncio.run()`` in the child), with what it inherited:

- **memory**: the engine's process-wide state (the registry's Servers with what they learned,
  the definitions, the reentrancy table) and the leases the parent held, as *copies*
  (:func:`inherit`): what the child changes, the parent does not see. The parent's loop, its
  tasks, futures and timers become objects of a copy of that loop that never runs (an
  "orphan" loop), the sockets the child's copies of the parent's connections hold are dead
  to it (:class:`DeadTransport`), and a copied connection has no request in flight (the
  parent's rounds waiting on it never resume in the child);
- **a new pid**: ``os.getpid()`` as the library sees it is per simulated process while a
  schedule with forks runs, and ``fencelock._async.connection._pid`` (kept by a fork hook) and
  ``fencelock._frontend.lease._live`` (every lease of the process) are per process too;
- **the library's after-fork-in-child hooks** (``os.register_at_fork`` in
  :data:`AT_FORK_MODULES`), run in the child's context right after the copy: they drop the
  inherited connections and mark every inherited lease lost (reason "fork").

The child's job then acts on each inherited lease as a user's code might: ``keep_alive()``
while it works, ``extend()``, ``release()``, or ``async with lease:`` around its work (drawn
from the fork's own random stream), besides one task of its own (a new acquisition through
the inherited Locks' engine state). The contract (DESIGN.md "Fork-safe", F28): an inherited
lease is lost at once, never renewed, never released. The servers see who runs what: every
script call carrying a grant's token from a process other than the grant's is reported
(``no_foreign_lease_use``); a child releasing its parent's key under it shows as two valid
leases (``mutual_exclusion``) too.

Forks are drawn (whether, when) from random streams of their own, so every schedule without
one is as it was; they come last in the plan (after "cancel_task"), so a shrink can leave
them out.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import os
import random
import threading
import types
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .loop import SimLoop
from .world import Grant, World, _Transport

KIND = "fork_client"

#: The modules whose ``_after_fork_in_child`` the library registers with
#: ``os.register_at_fork`` (``tests/sim/test_fork.py`` checks the list covers every one).
AT_FORK_MODULES = ("fencelock._engine.registry", "fencelock._async.connection")

#: The first simulated pid (the host's own pid is the "" process's).
FIRST_PID = 4000


class DeadTransport(asyncio.Transport):
    """The child's copy of a socket of the parent's loop: the child must not touch it (the
    library's ``owner_pid`` check); what it would write goes nowhere."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        return None

    def is_closing(self) -> bool:
        return True

    def close(self) -> None:
        return None

    def abort(self) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0


@dataclass
class Inherited:
    """A lease the parent held at the fork (its grant) and the child's copy of it."""

    grant: Grant
    lease: Any


def _nothing() -> None:
    return None


def inherit(roots: Any, orphan: SimLoop) -> Any:
    """A copy of ``roots`` as a forked child has it: plain objects copied (shared structure
    kept), the parent's event loops replaced by ``orphan`` (a loop that never runs), futures
    and tasks by futures of ``orphan`` in the same state, timers by timers of ``orphan``,
    sockets by :class:`DeadTransport`, locks by locks in the same state, a connection by one
    with no request in flight."""
    from fencelock._async.connection import AsyncConnection
    from fencelock._engine.resp import Parser

    dispatch: dict[type, Any] = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    lock_type = type(threading.Lock())
    rlock_type = type(threading.RLock())

    def future(x: asyncio.Future[Any], memo: dict[int, Any]) -> asyncio.Future[Any]:
        copied = orphan.create_future()
        if x.done():
            if x.cancelled():
                copied.cancel()
            elif x.exception() is not None:
                copied.set_exception(x.exception())  # type: ignore[arg-type]
                copied.exception()
            else:
                copied.set_result(x.result())
        return copied

    def handle(x: asyncio.Handle, memo: dict[int, Any]) -> asyncio.Handle:
        if isinstance(x, asyncio.TimerHandle):
            copied: asyncio.Handle = orphan.call_at(x.when(), _nothing)
        else:
            copied = orphan.call_soon(_nothing)
        if x.cancelled():
            copied.cancel()
        return copied

    def lock(x: Any, memo: dict[int, Any]) -> Any:
        copied = threading.Lock()
        if x.locked():  # held at the fork (by a thread the child does not have)
            copied.acquire()
        return copied

    def connection(x: AsyncConnection, memo: dict[int, Any]) -> AsyncConnection:
        copied = copy.copy(x)
        memo[id(x)] = copied
        copied._loop = orphan
        copied._transport = DeadTransport() if x._transport is not None else None
        connecting = x._connecting
        copied._connecting = None if connecting is None else future(connecting, memo)
        copied._parser = Parser()
        # (the parent's rounds waiting on it never resume in the child)
        copied._queue = deque()
        copied._out = bytearray()
        copied._unflushed = 0
        return copied

    extra: dict[type, Any] = {
        SimLoop: lambda x, memo: orphan,
        World: lambda x, memo: x,
        _Transport: lambda x, memo: DeadTransport(),
        asyncio.Future: future,
        asyncio.Task: future,
        asyncio.Handle: handle,
        asyncio.TimerHandle: handle,
        lock_type: lock,
        rlock_type: lambda x, memo: threading.RLock(),
        AsyncConnection: connection,
        types.GeneratorType: lambda x, memo: None,  # a suspended flow: never resumed here
        types.CoroutineType: lambda x, memo: None,
    }
    saved = {cls: dispatch.get(cls) for cls in extra}
    dispatch.update(extra)
    try:
        return copy.deepcopy(roots)
    finally:
        for cls, was in saved.items():
            if was is None:
                dispatch.pop(cls, None)
            else:
                dispatch[cls] = was


#: What a child does with an inherited lease (a user's code; the library must refuse all of it
#: but looking): renew it while it works, extend it, release it, work in ``async with lease``.
ACTIONS = ("keep_alive", "extend", "release", "with")

ChildJob = Callable[[str, list[Inherited]], Coroutine[Any, Any, None]]


class Forks:
    """The fork fault of one schedule: its plan, the per-process pids and lease sets, the
    children, and the servers' record of who ran a script with whose token."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = random.Random(world.seed * 7919 + 29)
        self.spawn: Callable[[str, list[Inherited]], None] | None = None
        self.pids: dict[str, int] = {}
        self.pid_slot: dict[str, int] = {}
        self.live_slot: dict[str, Any] = {}
        self.children: dict[str, int] = {}
        self.orphans: list[SimLoop] = []
        self.conn_module: Any = importlib.import_module("fencelock._async.connection")
        self.lease_module: Any = importlib.import_module("fencelock._frontend.lease")
        self._session_process: dict[int, str] = {}
        self._conns_seen = 0
        self._owner: dict[bytes, Grant] = {}
        self._grants_seen = 0
        self._session: Any = None
        self._reported: set[tuple[int, str, str, str]] = set()

    # -- per-process pid and lease set ---------------------------------------------------------

    def pid_of(self, process: str) -> int:
        pid = self.pids.get(process)
        if pid is None:
            pid = self.pids[process] = FIRST_PID + len(self.pids)
        return pid

    def switched(self, old: str, new: str) -> None:
        """``world.switch`` moved from process ``old`` to ``new``: their pid (as the fork hook
        keeps it) and lease set go with them; a new process starts with its own pid and none."""
        self.pid_slot[old] = self.conn_module._pid
        self.live_slot[old] = self.lease_module._live
        pid = self.pid_slot.get(new)
        self.conn_module._pid = pid if pid is not None else self.pid_of(new)
        live = self.live_slot.get(new)
        self.lease_module._live = live if live is not None else weakref.WeakSet()

    def install(self) -> None:
        """Patch what the library sees of the process (``os.getpid``) and watch the servers'
        script calls; undone at the end of the schedule (``world.cleanups``)."""
        world = self.world
        real_getpid = os.getpid
        self.pids[""] = real_getpid()
        os.getpid = lambda: self.pid_of(world.process)
        world.on_switch.append(self.switched)
        for index, server in enumerate(world.servers):
            self._watch(index, server)

        def undo() -> None:
            os.getpid = real_getpid
            for orphan in self.orphans:
                orphan.close()

        world.cleanups.append(undo)

    def _watch(self, index: int, server: Any) -> None:
        from fencelock._scripts import BY_NAME

        names = {script.sha.encode(): name for name, script in BY_NAME.items()}
        acquiring = self.world.history.acquire_shas | {BY_NAME["sem_acquire"].sha.encode()}
        execute = server._execute
        call_script = server._call_script

        def watched_execute(session: Any, args: list[bytes]) -> Any:
            self._session = session
            return execute(session, args)

        def watched_call(sha: bytes, a: list[bytes]) -> Any:
            if sha not in acquiring:
                self._check(index, names.get(sha, "?"), a, self._session)
            return call_script(sha, a)

        server._execute = watched_execute
        server._call_script = watched_call

    def _check(self, index: int, script: str, a: list[bytes], session: Any) -> None:
        """A script run with a grant's token (ARGV[1]) from a process other than the grant's."""
        try:
            numkeys = int(a[2])
        except ValueError:
            return
        if len(a) <= 3 + numkeys:
            return
        world = self.world
        grants = world.history.grants
        if len(grants) != self._grants_seen:
            for grant in grants[self._grants_seen :]:
                self._owner.setdefault(grant.token.encode(), grant)
            self._grants_seen = len(grants)
        grant = self._owner.get(a[3 + numkeys])
        if grant is None:
            return
        if len(world.conns) != self._conns_seen:
            for conn in world.conns[self._conns_seen :]:
                self._session_process[id(conn.session)] = conn.loop.process
            self._conns_seen = len(world.conns)
        process = self._session_process.get(id(session))
        owner = grant.client.split("/", 1)[0]
        if process is None or process == owner:
            return
        seen = (index, process, grant.token, script)
        if seen in self._reported:
            return  # (once per server, process, lease and script)
        self._reported.add(seen)
        text = (
            f"sim{index}: {process} ran {script} with {grant.client}'s token "
            f"({grant.key}, fence {grant.fence}), first at {world.clock.now - 1000:.4f}"
        )
        world.history.foreign.append(text)
        world.note(f"foreign lease use: {text}")

    # -- the fault -----------------------------------------------------------------------------

    def plan(self, count: int, start: float, end: float, first_number: int) -> None:
        """``count`` forks in [start, end], in the plan from ``first_number`` on."""
        world = self.world
        keep = world.config.keep_faults
        for number in range(first_number, first_number + count):
            when = self.rng.uniform(start, end)
            kept = keep is None or number in keep
            world.history.plan.append((when, KIND, kept))
            if not kept:
                continue
            world.history.faults[KIND] = world.history.faults.get(KIND, 0) + 1
            world.at(when, lambda: self.fork(0))

    def fork(self, tries: int) -> None:
        """A running client process forks; preferably one holding a lease (the next one a
        moment later while none does, 20 times at the most)."""
        world = self.world
        if world.workload_over:
            world.note("fork: no client process running")
            return
        now = world.clock.now
        live = sorted(
            {
                loop.process
                for loop in world.loops
                if not loop.is_closed()
                and loop.process not in world.dead
                and loop.paused_until <= now
            }
        )
        held: dict[str, list[Grant]] = {}
        for grant in world.history.grants:
            process = grant.client.split("/", 1)[0]
            if process in live and grant.ended is None and grant.lease is not None:
                held.setdefault(process, []).append(grant)
        if not held and (not live or tries < 20):
            world.at(now + self.rng.uniform(0.005, 0.2), lambda: self.fork(tries + 1))
            return
        parent = self.rng.choice(sorted(held) or live)
        self._fork(parent, held.get(parent, []))

    def _fork(self, parent: str, held: list[Grant]) -> None:
        world = self.world
        number = self.children.get(parent, 0)
        self.children[parent] = number + 1
        child = f"{parent}f{number}"
        contacts = world.history.contacts  # what the parent's engine knew, the child knows
        for (process, index), at in list(contacts.items()):
            if process == parent:
                contacts.setdefault((child, index), at)
        previous = world.process
        world.switch(parent)
        state = [getattr(module, attr) for module, attr in world._state_slots]
        orphan = SimLoop(world.clock, world.connect, f"{child}/parent-loop")
        self.orphans.append(orphan)
        copied_state, copied = inherit((state, [g.lease for g in held]), orphan)
        # the child's memory is the parent's: its pid as the hook keeps it, its leases
        self.pid_slot[child] = self.conn_module._pid
        # (a re-entered lock's view is not the lease the library registers: its shared one is)
        from fencelock._frontend.reentry import HeldBase

        self.live_slot[child] = weakref.WeakSet(
            x._entry.lease if isinstance(x, HeldBase) else x for x in copied
        )
        world._states[child] = list(copied_state)
        self.pid_of(child)
        world.switch(child)
        try:
            for name in AT_FORK_MODULES:
                importlib.import_module(name)._after_fork_in_child()
        except Exception as exc:
            world.history.errors.append(f"{child}: after-fork hook: {type(exc).__name__}: {exc}")
        finally:
            world.switch(previous)
        what = ", ".join(f"{g.client}'s {g.key} fence {g.fence}" for g in held) or "no lease"
        world.note(
            f"fork client process {parent} -> {child} (pid {self.pids[child]}), inheriting {what}"
        )
        inherited = [Inherited(g, lease) for g, lease in zip(held, copied, strict=True)]
        if self.spawn is not None:
            self.spawn(child, inherited)

    async def use(self, child: str, item: Inherited, ttl: float) -> None:
        """What the child's code does with one inherited lease (see :data:`ACTIONS`)."""
        from fencelock import LockLost, Unavailable

        world = self.world
        lease, grant = item.lease, item.grant
        where = f"{grant.client}'s {grant.key} (fence {grant.fence})"
        state = f"lost ({lease.lost_reason})" if lease.lost.is_set() else "valid"
        action = self.rng.choice(ACTIONS) if grant.kind != "election" else "look"
        work = self.rng.uniform(0.2, 1.5) * ttl
        world.note(f"{child} inherited {where}: {state}; {action}")
        try:
            if action == "keep_alive":
                lease.keep_alive()
                await asyncio.sleep(work)
                await lease.release()
            elif action == "extend":
                await lease.extend(self.rng.uniform(0.5, 1.5) * ttl)
            elif action == "release":
                await lease.release()
            elif action == "with":
                async with lease:
                    await asyncio.sleep(work)
            outcome = "done"
        except (LockLost, Unavailable) as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        world.note(f"{child} {action} on {where}: {outcome}")


def forks_of(world: World) -> Forks | None:
    forks = getattr(world, "forks", None)
    return forks if isinstance(forks, Forks) else None


def plan_forks(
    world: World, start: float, end: float, spawn: Callable[[str, list[Inherited]], None]
) -> None:
    """The schedule's "fork_client" faults (``config.forks``), planned after the others;
    ``spawn(child, inherited)`` starts a child's job (the workload's)."""
    count = world.config.forks
    if count <= 0:
        return
    forks = Forks(world)
    forks.spawn = spawn
    world.forks = forks
    forks.install()
    first = world.config.fault_count + world.config.cancels
    forks.plan(count, start, end, first)
