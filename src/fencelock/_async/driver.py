"""The asyncio driver: performs a flow's effects on the running event loop.

It decides nothing (see the blocking driver). A round sends all its calls before it awaits
anything, so every call is on its way even if the caller is cancelled next:

- on a server's shared connection that has already answered (the common case), a call is
  queued directly and its replies come back to the round from ``data_received``: no task,
  no future per call;
- otherwise (a connection to open and handshake, a cluster's routing and redirects, a retry
  after the shared connection broke) a call is one task that connects, handshakes and sends
  in one go, so connecting is part of the parallel round.

Votes are recorded as replies arrive; the caller waits on one future, woken when the stop
rule holds or every call answered, and by a ``call_later`` timer at the round's deadline.
Stragglers keep running (bounded) in the background. No ``asyncio.wait_for`` anywhere: a
call is bounded by aborting its connection, which cannot swallow a cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from typing import Any, TypeVar, cast

from .._core import effects as fx
from .._core.health import skip_suspects
from .._core.quorum import Tally
from .._core.replies import classify_handshake
from .._engine.address import Address
from .._engine.cluster import ASKING, BUSY_RETRY_S, MAP_REQUEST, MAX_HOPS, busy_slot
from .._engine.handshake import HandshakeError
from .._engine.resp import ReplyError, command
from .._engine.server import Server, makes_suspect, unidentified
from .._engine.wire import (
    CALLS,
    CLIENT_ID,
    PING,
    Calls,
    answer,
    client_id,
    full_call,
    is_noscript,
    is_readonly,
    wait_tail,
    wake_call,
)
from .._scripts import Script
from .._sync.background import background
from .connection import AsyncConnection, Unsent

T = TypeVar("T")
log = logging.getLogger("fencelock.asyncio")

#: A straggler's reply still missing this long (s) after its round is given up.
GIVE_UP_S = 1.0
#: Connections kept for blocking waits per server and loop, at the most.
IDLE_WAITERS_MAX = 16

# Tasks left running after their round (stragglers, shielded cleanups): referenced here so
# they are not garbage-collected mid-flight.
_background: set[asyncio.Future[Any]] = set()


def keep(task: asyncio.Future[Any]) -> asyncio.Future[Any]:
    _background.add(task)
    task.add_done_callback(_forget)
    return task


def _forget(task: asyncio.Future[Any]) -> None:
    _background.discard(task)
    if not task.cancelled():
        task.exception()


def _pool(server: Server, loop: asyncio.AbstractEventLoop) -> list[AsyncConnection]:
    """The connections of ``server`` on ``loop`` (connections belong to one loop): the first is
    the shared one every round pipelines on; the others wait for a wake signal (BLPOP blocks a
    connection, so each waiter has its own)."""
    entry = server.async_idle.get(id(loop))
    if entry is None or entry[0]() is not loop:
        for key, (ref, conns) in list(server.async_idle.items()):
            target = ref()
            if target is None or target.is_closed():  # that loop is gone: so are its sockets
                del server.async_idle[key]
                for conn in conns:
                    conn.close()
        entry = (weakref.ref(loop), [])
        server.async_idle[id(loop)] = entry
    pool: list[AsyncConnection] = entry[1]
    return pool


class _LoopGuard:
    """The rounds of one loop whose calls are still out after their round (stragglers, calls
    past the deadline). When the loop is shut down (``asyncio.run()`` cancels every task at
    its end), the connections of a given-up attempt's calls are closed there: their replies
    can no longer be heard (a late grant would not be released, see
    :meth:`_Round.shut_down`), and a request still on its way must not land after the
    loop, the attempt and its cleanup are all gone (simulation seed 205015)."""

    __slots__ = ("rounds", "task")

    def __init__(self) -> None:
        # (a weak dict, not a WeakSet: its order is the rounds' insertion order, so a shutdown
        # releases in the same order every run; a set's follows object addresses)
        self.rounds: weakref.WeakKeyDictionary[_Round, None] = weakref.WeakKeyDictionary()
        # weak: the task refers to its loop, the key of ``_guards``, whose value this is (a
        # strong reference kept every loop that ever made a guard, with all it held, alive);
        # the loop keeps the task while it sleeps (its timer) and until it is cancelled
        self.task: weakref.ref[asyncio.Task[None]] | None = None

    def running(self) -> bool:
        task = None if self.task is None else self.task()
        return task is not None and not task.done()

    async def watch(self) -> None:
        """Until no watched call is out (looked at every GIVE_UP_S: each ends within about
        that), or until cancelled: then the given-up calls' connections are closed."""
        try:
            while any(round_.open or round_.expired for round_ in list(self.rounds)):
                await asyncio.sleep(GIVE_UP_S)
        except asyncio.CancelledError:
            for round_ in list(self.rounds):
                round_.shut_down()
            raise


_guards: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopGuard] = (
    weakref.WeakKeyDictionary()
)


def _guard(round_: _Round, loop: asyncio.AbstractEventLoop) -> None:
    """Watch ``round_``'s calls still out until ``loop`` shuts down (see :class:`_LoopGuard`)."""
    guard = _guards.get(loop)
    if guard is None or not guard.running():
        guard = _guards[loop] = _LoopGuard()
        # not in _background (what callers wait on to see a flow's cleanup end): the guard
        # outlives them; its loop holds it (see _LoopGuard.task)
        guard.task = weakref.ref(loop.create_task(guard.watch()))
    guard.rounds[round_] = None


def _address_of(server: Server) -> Address:
    return server.address


async def located(server: Server, loop: asyncio.AbstractEventLoop) -> Address:
    """Where to connect to ``server`` now. A Sentinel-managed master due to be asked of its
    sentinels is looked up on a worker thread (each sentinel within ``min(timeout, 0.5)`` s,
    so the look-up is bounded by ``len(sentinels)`` times that): the loop keeps running.

    Raises:
        NoMaster: (a ConnectionError) no sentinel named the master.
    """
    if server.settled:
        return server.address
    return await loop.run_in_executor(None, _address_of, server)


def shared(
    server: Server, loop: asyncio.AbstractEventLoop, address: Address | None = None
) -> AsyncConnection:
    """The connection every task of ``loop`` pipelines its requests to ``server`` on.

    Every new connection asks the server's identity (run id, uptime, role) in the write of
    its first request, whatever this process learned on other connections or other loops:
    a vote counts only from a connection that checked it (DESIGN v0.3). A loop of its own
    per job (``asyncio.run()``) or per thread would otherwise miss a server that restarted
    empty since the last loop's handshake, and ``restart_delay`` would not apply.

    ``address``: where the server is, from :func:`located` (a Sentinel-managed master must be
    located first: reading ``server.address`` here would block the loop for the look-up)."""
    pool = _pool(server, loop)
    if address is None:
        address = server.address
    if pool and pool[0].usable and not pool[0].retired and pool[0].address == address:
        return pool[0]
    if pool and not pool[0].usable:
        server.connection_failed()  # closed under us: it may have restarted, so ask
    conn = AsyncConnection(address)  # identified on this connection (see AsyncConnection)
    if pool:
        if not pool[0].retired:  # a retired one closes once its last request is answered
            pool[0].close()
        pool[0] = conn
    else:
        pool.append(conn)
    return conn


def take_blocking(
    server: Server, loop: asyncio.AbstractEventLoop, address: Address | None = None
) -> AsyncConnection:
    """A connection of its own for one blocking wait (given back with :func:`give_back`);
    ``address`` as for :func:`shared`."""
    pool = _pool(server, loop)
    if address is None:
        address = server.address
    if not pool:
        pool.append(AsyncConnection(address))
    while len(pool) > 1:
        conn = pool.pop()
        if conn.usable and conn.address == address:
            return conn
        conn.close()
    return AsyncConnection(address)


def give_back(server: Server, loop: asyncio.AbstractEventLoop, conn: AsyncConnection) -> None:
    pool = _pool(server, loop)
    if len(pool) < IDLE_WAITERS_MAX + 1:
        pool.append(conn)
    else:
        conn.close()


def _failed(server: Server, exc: BaseException, timeout_s: float | None = None) -> None:
    """A call failed: see :func:`fencelock._engine.server.makes_suspect`."""
    server.connection_failed()
    if makes_suspect(exc) and server.failed(f"{type(exc).__name__}: {exc}", timeout_s):
        background().watch(server)


class _Call:
    """One server's part of a round: sent directly on an established connection (its replies
    come back to :meth:`__call__` from ``data_received``), or as a task that connects,
    handshakes, follows cluster redirects and retries on a fresh connection."""

    __slots__ = (
        "conn",
        "full",
        "give_up",
        "hops",
        "index",
        "node",
        "round",
        "script",
        "server",
        "suspect",
        "tail",
        "task",
    )

    def __init__(
        self,
        round_: _Round,
        index: int,
        server: Server,
        conn: AsyncConnection,
        node: Server | None = None,
    ) -> None:
        self.round = round_
        self.index = index
        self.server = server  # the vote
        self.node = server if node is None else node  # whose connection carries it
        self.conn = conn
        self.hops = 0  # cluster redirects followed
        self.task: asyncio.Task[object] | None = None
        self.script: Script | None = None  # sent directly: the script, and the WAIT after it
        self.tail = b""
        self.full = False  # the script was sent in full after a NOSCRIPT
        self.suspect: asyncio.TimerHandle | None = None  # a parked straggler's timers
        self.give_up: asyncio.TimerHandle | None = None

    def __call__(self, replies: list[object] | None, exc: BaseException | None) -> None:
        """The replies (or the failure) of a call sent directly: never raises (it runs
        inside the connection's ``data_received``)."""
        try:
            self.round.replied(self, replies, exc)
        except Exception as error:  # a bug: the round fails rather than the connection
            self.round.fail(self, error)

    def task_done(self, task: asyncio.Task[object]) -> None:
        exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
        self.round.done(self, None if exc is not None else task.result(), exc)

    def abandon(self) -> None:
        """Stop waiting for this call (a parked straggler still silent GIVE_UP_S after its
        round, or the round's deadline passed). Only this call: the connection other
        callers pipeline on stays open while any of their requests is on it (it closes
        once none is), and their calls are never sent again."""
        if self.task is not None:
            self.task.cancel()  # its request, if sent, is forgotten by the connection
        else:
            self.conn.forget(self)

    def suspect_if_silent(self) -> None:
        if self in self.round.open:
            _failed(self.server, TimeoutError("no answer within the server timeout"))


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Round:
    """One broadcast: its calls without a vote yet (``open``), and the future its collector
    waits on, woken when the stop rule holds, every call answered, or the deadline passed.
    Votes are recorded as replies arrive, until the round is parked; after that its calls
    are stragglers (bounded, see :meth:`AsyncDriver._park`)."""

    def __init__(
        self,
        effect: fx.Broadcast,
        deadline: float,
        encoder: Calls,
        timeout_s: float,
        servers: tuple[Server, ...] = (),
    ) -> None:
        self.effect = effect
        self.servers = servers  # the driver's, which a late Repeat's targets index
        self.encoder = encoder
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.open: dict[_Call, None] = {}  # insertion-ordered
        # calls past the deadline (their vote: a timeout), still heard for GIVE_UP_S: a
        # given-up attempt's grant that comes now is released (``effect.late``)
        self.expired: dict[_Call, None] = {}
        # False once parked: a late NOSCRIPT runs in full only if effect.land (then, not at
        # parking time: a flow turns it off when it gives the round up)
        self.collecting = True
        self.stop = effect.stop
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None

    def left(self) -> _Round | None:
        """This round if calls of it are still out, else None."""
        return self if self.open else None

    # -- a call sent directly on an established connection ---------------------------------

    def send(self, call: _Call) -> None:
        effect = self.effect
        if not effect.script:  # a bare handshake (fx.Identify)
            call.script, payload, call.tail, own = None, PING, b"", 1
        else:
            call.script, payload = self.encoder.encode(
                call.node, effect.script, effect.keys, effect.args
            )
            call.tail, own = wait_tail(effect.wait)
        call.conn.send(payload + call.tail, own, call)

    def replied(self, call: _Call, replies: list[object] | None, exc: BaseException | None) -> None:
        if call not in self.open and call not in self.expired:  # abandoned
            return
        if replies is None:
            assert exc is not None
            if (
                self.collecting
                and call in self.open
                and isinstance(exc, Unsent)
                and time.monotonic() < self.deadline
            ):
                # the shared connection broke before our request was written (the server
                # cannot have read it): once more on a fresh one, as a task. A request that
                # was written is never sent again: its outcome is unknown (maybe applied)
                call.conn.close()
                call.node.connection_failed()
                # located again in the task (a Sentinel-managed master is asked of its
                # sentinels off the loop); no sentinel naming it ends the call
                self.spawn(call, relocate=True)
                return
            self.done(call, None, exc)
            return
        effect = self.effect
        script = call.script
        node = call.node
        server = call.server
        own = len(replies)
        reply = replies[0]
        if script is not None and is_noscript(reply):
            node.loaded.discard(script.sha)
            if not call.full and (self.collecting or effect.land):
                call.full = True  # EVAL, which caches it again
                full = full_call(script, effect.keys, effect.args) + call.tail
                call.conn.send(full, own, call)
                return
        elif script is not None:
            node.loaded.add(script.sha)
        if is_readonly(reply):
            server.moved()
        node.learned(call.conn.identity)
        server.answered()
        self.done(call, answer(replies), None)

    # -- a call as a task ------------------------------------------------------------------

    def spawn(self, call: _Call, relocate: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(self.call(call, relocate))
        call.task = task  # kept by _park if the round is decided before it ends
        task.add_done_callback(call.task_done)

    async def call(self, call: _Call, relocate: bool = False) -> object:
        """Send the call to its node; a cluster's MOVED / ASK, or a node that cannot be
        reached, sends it to another node (a hop) while hops and the round's budget last.
        ``relocate``: on a new shared connection to where the node is now."""
        effect = self.effect
        server = call.server
        loop = asyncio.get_running_loop()
        if relocate:
            call.conn = shared(call.node, loop, await located(call.node, loop))
        asking = False
        while True:
            node = call.node
            if not effect.script:  # a bare handshake (fx.Identify)
                script, payload = None, PING
            else:
                script, payload = self.encoder.encode(node, effect.script, effect.keys, effect.args)
            tail, own = (b"", 1) if script is None else wait_tail(effect.wait)
            mapping = server.wants_map()
            prefix = (MAP_REQUEST if mapping else b"") + (ASKING if asking else b"")
            try:
                replies = await self._request(call, prefix + payload + tail, mapping + asking + own)
            except OSError as exc:
                if (
                    not server.is_cluster
                    or call.hops >= MAX_HOPS
                    or isinstance(exc, HandshakeError)
                    or time.monotonic() >= self.deadline
                    or not (isinstance(exc, Unsent) or not call.conn.wrote)
                ):
                    raise  # a request the node may have run is not sent to another
                call.conn.close()
                server.node_failed(node)
                node.connection_failed()
                call.hops += 1
                call.node = server.route(effect.keys)
                call.conn = shared(call.node, loop)
                asking = False
                continue
            if mapping:
                server.learn_map(replies[0])
            mine = replies[-own:]  # the script's reply (and its WAIT's)
            if script is not None and is_noscript(mine[0]):
                node.loaded.discard(script.sha)
                if self.collecting or effect.land:
                    full = full_call(script, effect.keys, effect.args) + tail
                    again = ASKING if asking else b""  # ASKING holds for one command only
                    mine = (await call.conn.request(again + full, own + asking))[-own:]
            reply = mine[0]
            if (
                script is not None
                and server.is_cluster
                and busy_slot(reply)
                and time.monotonic() + BUSY_RETRY_S < self.deadline
            ):
                # the node ran nothing (a slot being migrated, a failover): sent again
                # shortly, to the slot's owner as the map has it then (bounded by the
                # round's deadline, one retry per BUSY_RETRY_S)
                node.learned(call.conn.identity)
                await asyncio.sleep(BUSY_RETRY_S)
                call.hops = 0
                call.node, asking = server.route(effect.keys), False
                call.conn = shared(call.node, loop)
                continue
            redirect = server.redirected(reply) if script is not None else None
            if redirect is not None and call.hops < MAX_HOPS and time.monotonic() < self.deadline:
                node.learned(call.conn.identity)
                call.hops += 1
                call.node, asking = redirect
                call.conn = shared(call.node, loop)
                continue
            if script is not None and not is_noscript(reply):
                node.loaded.add(script.sha)
            if is_readonly(reply):
                server.moved()
            node.learned(call.conn.identity)
            if node is not server:
                server.learned(call.conn.identity)
                server.node_answered(node)
            server.answered()
            return answer(mine)

    @staticmethod
    async def _request(call: _Call, payload: bytes, replies: int) -> list[object]:
        try:
            return await call.conn.request(payload, replies)
        except Unsent:
            # the connection broke before the request was written (a restarted server
            # closed it meanwhile, or it was given up): the server cannot have read it.
            # Anything else failing after the write leaves the outcome unknown: never re-sent
            if call not in call.round.open:
                raise  # past the deadline (expired): not sent at all
            call.conn.close()
            call.node.connection_failed()  # a restarted server: learn its new identity
            loop = asyncio.get_running_loop()
            call.conn = shared(call.node, loop, await located(call.node, loop))
            return await call.conn.request(payload, replies)

    # -- votes -----------------------------------------------------------------------------

    def done(self, call: _Call, result: object, exc: BaseException | None) -> None:
        """A call ended: its vote (while collecting), and the collector woken if decided."""
        if call in self.open:
            del self.open[call]
            straggler = not self.collecting  # of a parked round
        elif call in self.expired:
            del self.expired[call]  # its vote was a timeout
            straggler = True
        else:
            return
        if straggler:
            if call.suspect is not None:
                call.suspect.cancel()
            if call.give_up is not None:
                call.give_up.cancel()
            if exc is not None and not isinstance(exc, asyncio.CancelledError):
                call.conn.close()  # (a given-up call's connection closes once unwanted)
            # a given-up attempt's grant heard only now is released there; so is what a call
            # that ended without a reply may have taken (abandoned, its connection lost, or
            # its task cancelled as asyncio.run() ends, before the loop guard ran: simulation
            # seed 742338133)
            self._release_late(call.index, result if exc is None else fx.UNHEARD)
            return
        effect = self.effect
        if exc is not None:
            if not isinstance(exc, asyncio.CancelledError):
                call.conn.close()
            _failed(call.server, exc, self.timeout_s)
            effect.tally.record(call.index, *effect.classify(exc))
        else:
            effect.tally.record(call.index, *effect.classify(result))
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            stop = self.stop
            if not self.open or (stop is not None and stop(effect.tally)):
                waiter.set_result(None)

    def fail(self, call: _Call, error: BaseException) -> None:
        """An unexpected error while handling a reply: the collector raises it."""
        self.open.pop(call, None)
        self.expired.pop(call, None)
        call.conn.close()
        if self.collecting:
            self.error = error
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)
        else:
            log.error("a straggler's reply could not be handled", exc_info=error)

    def shut_down(self) -> None:
        """The loop is shutting down: a given-up attempt's calls still out (``effect.late``
        set) have their connections closed, and what each may have taken is released on its
        server from the background thread: at once (a grant that landed while its reply was
        on its way is gone within a round trip: simulation seed 742338133) and again over its
        lease (a request still on its way may land after the first: heard no more, it is
        outlasted, :func:`~fencelock._core.acquire.unheard_repeats`). Other rounds' calls are
        left as they are."""
        if self.effect.late is None:
            return
        for call in [*self.open, *self.expired]:
            call.conn.close()
            self._release_late(call.index, fx.UNHEARD)
        self.open.clear()
        self.expired.clear()

    def _release_late(self, index: int, reply: object) -> None:
        """A given-up attempt's call to server ``index`` ended after its round with
        ``reply`` (:data:`~fencelock._core.effects.UNHEARD`: none can come): what it took there
        is released from the background thread, at once, and for an unheard one again over
        its lease (its request may still be on its way: the round's ``late`` says when)."""
        late = self.effect.late
        repeat = None if late is None else late(index, reply)
        if repeat is not None:
            background().repeat(self.servers, repeat)

    def drop_expired(self, call: _Call) -> None:
        """An expired call still silent GIVE_UP_S later: abandoned (what a given-up attempt's
        call may yet take there is released, :meth:`_release_late`)."""
        if self.expired.pop(call, None) is not None:
            call.abandon()
            self._release_late(call.index, fx.UNHEARD)

    def expire(self) -> None:
        """The deadline passed: every call still open is a TimeoutError vote (its outcome
        unknown: the flow cleans up by token). Only this round's calls are given up, after
        GIVE_UP_S: a reply that comes before is given to the round's ``late`` (a given-up
        attempt's grant that came after its cleanup is released there; simulation seed
        205015). The call's connection is retired (:meth:`AsyncConnection.retire`): what is
        sent from now on goes on a new one, so a connection whose replies stopped coming
        (a black hole, a half-open socket) costs no later request its answer, while this
        call's reply can still arrive on it."""
        effect = self.effect
        loop = asyncio.get_running_loop()
        if self.open:
            _guard(self, loop)
        for call in list(self.open):
            del self.open[call]
            self.expired[call] = None
            call.conn.retire()
            call.give_up = loop.call_later(GIVE_UP_S, self.drop_expired, call)
            exc = TimeoutError(f"no answer within {effect.budget_s:.3f} s")
            call.server.node_failed(call.node)
            _failed(call.server, exc, self.timeout_s)
            effect.tally.record(call.index, *effect.classify(exc))


class AsyncDriver:
    """Runs flows against ``servers`` on the running loop."""

    def __init__(self, servers: tuple[Server, ...], timeout_s: float) -> None:
        self.servers = servers
        self.timeout_s = timeout_s
        self._calls = CALLS

    def _suspects(self) -> tuple[bool, ...]:
        return tuple(server.health.suspect for server in self.servers)

    async def run(self, flow: fx.Flow[T], *, shielded: bool = False) -> T:
        """Drive ``flow`` to its end. A cancellation (or any exception) while an effect is
        performed is thrown into the flow; the flow's cleanup then runs in a task of its own
        that a second cancellation cannot stop, and the exception propagates.

        ``shielded``: a cancellation of the caller does not reach the flow at all: the flow
        (the round in progress included) goes on in a task of its own, and the caller gets
        the ``CancelledError`` at once (a release: what it sent still counts, and its late
        servers are still repeated)."""
        answer: Any = None
        pending: _Round | None = None
        while True:
            try:
                effect = self._send(flow, answer, pending)
            except StopIteration as stop:
                return cast(T, stop.value)
            if effect is fx.NOW:
                answer = time.monotonic()
                continue
            current: _Round | None = None
            try:
                pending = self._parked_before(effect, pending)
                if isinstance(effect, fx.Broadcast):
                    current = self._start(effect)
                    await self._collect(current, settle=False)
                    answer, pending, current = effect.tally, current.left(), None
                else:
                    answer, pending = await self._perform(effect, pending)
            except BaseException as exc:
                if shielded and isinstance(exc, asyncio.CancelledError):
                    keep(asyncio.ensure_future(self._resume(flow, effect, current, pending)))
                    raise
                self._park(current)
                rest = keep(asyncio.ensure_future(self._finish(flow, exc, pending)))
                return await asyncio.shield(rest)

    def _send(self, flow: fx.Flow[T], answer: Any, pending: _Round | None) -> fx.Effect:
        """The flow's next effect; when the flow ends (``StopIteration``, raised on) or raises,
        ``pending`` is parked first."""
        try:
            return flow.send(answer)
        except BaseException:
            self._park(pending)
            raise

    def _parked_before(self, effect: fx.Effect, pending: _Round | None) -> _Round | None:
        """``pending``, or None once parked: a new round or a pause does not wait for the
        stragglers of the last one."""
        if pending is not None and isinstance(effect, fx.Broadcast | fx.Pause):
            self._park(pending)
            return None
        return pending

    async def _resume(
        self, flow: fx.Flow[T], effect: fx.Effect, current: _Round | None, pending: _Round | None
    ) -> T:
        """A shielded flow whose caller was cancelled: finish ``effect`` (the round
        ``current`` if it was one), then drive the flow to its end here."""
        try:
            if current is not None:
                await self._collect(current, settle=False)
                answer: Any = effect.tally if isinstance(effect, fx.Broadcast) else None
                pending = current.left()
            else:
                answer, pending = await self._perform(effect, pending)
        except BaseException as exc:
            self._park(current)
            return await self._finish(flow, exc, pending)
        return await self._drive(flow, answer, pending)

    async def _drive(self, flow: fx.Flow[T], answer: Any, pending: _Round | None) -> T:
        """:meth:`run` from ``answer`` on, in a task nobody cancels."""
        while True:
            try:
                effect = self._send(flow, answer, pending)
            except StopIteration as stop:
                return cast(T, stop.value)
            try:
                pending = self._parked_before(effect, pending)
                answer, pending = await self._perform(effect, pending)
            except BaseException as exc:
                return await self._finish(flow, exc, pending)

    async def _finish(self, flow: fx.Flow[T], error: BaseException, pending: _Round | None) -> T:
        """Throw ``error`` into ``flow`` and perform what it yields while cleaning up."""
        answer: Any = None
        thrown: BaseException | None = error
        while True:
            try:
                effect = flow.throw(thrown) if thrown is not None else flow.send(answer)
            except StopIteration as stop:
                self._park(pending)
                result: T = stop.value
                return result
            thrown = None
            try:
                pending = self._parked_before(effect, pending)
                answer, pending = await self._perform(effect, pending)
            except BaseException as exc:
                answer, thrown = None, exc

    async def _perform(
        self, effect: fx.Effect, pending: _Round | None
    ) -> tuple[Any, _Round | None]:
        if effect is fx.NOW:
            return time.monotonic(), pending
        if isinstance(effect, fx.Broadcast):
            return await self._broadcast(effect)
        if effect is fx.SETTLE:
            if pending is None:
                return None, None  # every call of the last round has answered already
            await self._collect(pending, settle=True)
            return pending.effect.tally, None
        if isinstance(effect, fx.Settle):
            if pending is None:
                return None, None
            await self._collect(pending, settle=True, until=time.monotonic() + effect.within_s)
            return None, pending.left()
        if isinstance(effect, fx.Pause):
            return await self._pause(effect), pending
        if isinstance(effect, fx.Repeat):
            background().repeat(self.servers, effect)
            return None, pending
        if effect is fx.IDENTITIES:
            return tuple(server.identity for server in self.servers), pending
        if isinstance(effect, fx.Identify):
            await self._identify(effect)
            return tuple(server.identity for server in self.servers), pending
        raise TypeError(f"unknown effect {effect!r}")

    async def _broadcast(self, effect: fx.Broadcast) -> tuple[Tally, _Round | None]:
        round_ = self._start(effect)
        try:
            await self._collect(round_, settle=False)
        except BaseException:
            self._park(round_)
            raise
        return effect.tally, round_.left()

    def _start(self, effect: fx.Broadcast) -> _Round:
        """Send ``effect``'s calls: directly on established connections, as tasks where a
        connection (and its handshake) or a cluster's routing is needed. Nothing is awaited,
        so every call is on its way even if the caller is cancelled next."""
        loop = asyncio.get_running_loop()
        tally = effect.tally
        round_ = _Round(
            effect, time.monotonic() + effect.budget_s, self._calls, self.timeout_s, self.servers
        )
        servers = self.servers
        skip = any(servers[i].health.suspect for i in effect.targets) and skip_suspects(
            tally, effect.targets, self._suspects()
        )
        try:
            for index in effect.targets:
                server = servers[index]
                if skip and server.health.suspect:
                    reason = fx.NotSent(f"suspect: {server.health.reason}")
                    tally.record(index, *effect.classify(reason))
                    continue
                node = server.route(effect.keys)
                if not node.settled:
                    # a Sentinel-managed master due to be asked of its sentinels: located in
                    # the call's task, off the loop (the look-up blocks); no sentinel naming
                    # it fails the call as below. The placeholder connection never connects
                    call = _Call(round_, index, server, AsyncConnection(node.last_address), node)
                    round_.open[call] = None
                    round_.spawn(call, relocate=True)
                    continue
                try:
                    conn = shared(node, loop)
                except ConnectionError as exc:  # no sentinel named the master
                    _failed(server, exc, self.timeout_s)
                    tally.record(index, *effect.classify(exc))
                    continue
                call = _Call(round_, index, server, conn, node)
                round_.open[call] = None
                if conn.established and not server.is_cluster:
                    round_.send(call)
                else:
                    round_.spawn(call)
        except BaseException:
            self._park(round_)  # what was sent is bounded like any straggler
            raise
        return round_

    async def _identify(self, effect: fx.Identify) -> None:
        """A handshake (and a PING) with every server not identified yet and not suspect."""
        targets = unidentified(self.servers)
        if not targets:
            return
        tally = Tally(len(self.servers))
        probe = fx.Broadcast("", targets, (), (), classify_handshake, None, effect.budget_s, tally)
        _, rest = await self._broadcast(probe)
        self._park(rest)

    async def _collect(self, round_: _Round, *, settle: bool, until: float = math.inf) -> None:
        """Wait until the round's stop rule holds (``settle``: until every call answered),
        or its deadline: calls still silent then are TimeoutError votes. ``until`` (monotonic
        s, before the deadline): stop waiting then, the silent calls left open."""
        if settle:
            round_.stop = None
        tally = round_.effect.tally
        loop: asyncio.AbstractEventLoop | None = None
        read_late = False
        while round_.open and round_.error is None:
            stop = round_.stop
            if stop is not None and stop(tally):
                break
            timeout = min(round_.deadline, until) - time.monotonic()
            if timeout <= 0:
                if read_late:
                    break
                # past the deadline (the process may have been stopped, or the loop blocked,
                # while the replies arrived): the loop reads what is there before the silent
                # calls are judged
                read_late = True
                await _read_arrived()
                continue
            if loop is None:
                loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            round_.waiter = waiter
            timer = loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                round_.waiter = None
        error = round_.error
        if error is not None:
            round_.error = None
            raise error
        if round_.open and time.monotonic() >= round_.deadline:
            round_.expire()

    def _park(self, round_: _Round | None) -> None:
        """Leave a decided round's stragglers running, bounded: the server is suspect if it
        stays silent past the round's deadline, the call is abandoned after GIVE_UP_S."""
        if round_ is None or not round_.collecting:
            return
        round_.collecting = False
        if not round_.open:
            return
        loop = asyncio.get_running_loop()
        _guard(round_, loop)
        suspect_at = _loop_time(loop, round_.deadline)
        give_up_at = _loop_time(loop, max(round_.deadline, time.monotonic() + GIVE_UP_S))
        for call in round_.open:
            if call.task is not None:
                keep(call.task)
            call.suspect = loop.call_at(suspect_at, call.suspect_if_silent)
            call.give_up = loop.call_at(give_up_at, call.abandon)

    async def _pause(self, effect: fx.Pause) -> object:
        if effect.stop is not None:  # the blocking front end's; a task is cancelled instead
            raise TypeError(f"a Pause with a stop is not for the asyncio driver: {effect!r}")
        delay = effect.delay_s
        nothing: object = None if effect.claim is not None else False
        if delay < 0.001:
            return nothing
        if effect.wake is None or self.servers[effect.wake[0]].health.suspect:
            await asyncio.sleep(delay)
            return nothing
        loop = asyncio.get_running_loop()
        server = self.servers[effect.wake[0]]
        node = server.route((effect.wake[1],))
        try:
            conn = take_blocking(node, loop, await located(node, loop))
        except ConnectionError:  # no sentinel named the master: sleep instead
            await asyncio.sleep(delay)
            return nothing
        started = time.monotonic()
        timer = loop.call_later(delay + self.timeout_s, conn.close)
        payload = wake_call(effect.wake[1], effect.claim, delay)
        try:
            if effect.claim is not None and conn.client_id is None:
                conn.client_id = client_id((await conn.request(CLIENT_ID, 1))[0])
        except BaseException as exc:
            timer.cancel()
            conn.close()
            if not isinstance(exc, Exception):
                raise
            # the server went away since its round (nothing was asked of it yet): as below
            _failed(server, exc, self.timeout_s)
            rest = delay - (time.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)
            return nothing
        request = asyncio.ensure_future(conn.request(payload, 1))
        try:
            replies = await asyncio.shield(request)
        except asyncio.CancelledError as exc:
            if effect.claim is None:
                request.cancel()
                conn.close()
                raise
            # the server may have moved an element for us: end the wait from another
            # connection (CLIENT UNBLOCK) and hear the answer, so a claim is never lost --
            # in a task of its own, heard out even if the caller is cancelled again meanwhile
            # (bounded: two server timeouts); the first cancellation is raised all the same
            hearing = keep(
                asyncio.ensure_future(_unblocked(node, loop, conn, request, self.timeout_s))
            )
            while not hearing.done():
                try:
                    await asyncio.shield(hearing)
                except asyncio.CancelledError:
                    continue
            element = None if hearing.cancelled() else hearing.result()
            if element is not None:
                raise fx.ClaimInterrupted(element, exc) from exc
            raise
        except Exception as exc:
            conn.close()
            _failed(server, exc, self.timeout_s)
            rest = delay - (time.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)
            return nothing
        finally:
            timer.cancel()
        give_back(node, loop, conn)
        reply = replies[0]
        if isinstance(reply, ReplyError):  # refused (an ACL, an old server): sleep, not spin
            rest = delay - (time.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)
        if effect.claim is not None:
            return reply if isinstance(reply, bytes) else None
        return isinstance(reply, list)


async def _unblocked(
    node: Server,
    loop: asyncio.AbstractEventLoop,
    blocked: AsyncConnection,
    request: asyncio.Future[list[object]],
    timeout_s: float,
) -> bytes | None:
    """End ``blocked``'s wait (``CLIENT UNBLOCK`` on the shared connection) and return the
    element its ``BLMOVE`` moved, if it moved one; within two server timeouts."""
    try:
        if blocked.client_id is None:
            return None
        unblock = command("CLIENT", "UNBLOCK", blocked.client_id)
        conn = shared(node, loop, await asyncio.wait_for(located(node, loop), timeout_s))
        await asyncio.wait_for(conn.request(unblock, 1), timeout_s)
        replies = await asyncio.wait_for(asyncio.shield(request), timeout_s)
    except BaseException:
        return None
    finally:
        request.cancel()
        blocked.close()
    if replies and isinstance(replies[0], bytes):
        return replies[0]
    return None


async def _read_arrived() -> None:
    """Let the event loop read what the sockets hold already: in the first pass it polls
    them (their readers run after this task's step), the second runs this task after them."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _loop_time(loop: asyncio.AbstractEventLoop, monotonic_s: float) -> float:
    return loop.time() + (monotonic_s - time.monotonic())
