"""The blocking front end's background thread: the work no caller waits for.

- **stragglers** of decided rounds: their replies are read (a NOSCRIPT is answered with the
  full script when the round's grant must land everywhere), then the connection is reused; a
  straggler silent past the server timeout makes its server suspect;
- **probes** of suspect servers (PING on a new connection, with growing delays): a server
  that answers is used by rounds again;
- **late repeats** (``Repeat`` effects): pipelined on one connection once the server answers.

One thread and one selector for all servers of the process; nothing here blocks.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._core.effects import UNHEARD, Broadcast, Repeat
from .._engine.cluster import ASKING, busy_slot
from .._engine.registry import PerProcess, sweep_idle
from .._engine.server import LateCall, Server
from .._engine.wire import CALLS, PING, answer, full_call, is_noscript
from .._scripts import BY_NAME
from .connection import Connection

log = logging.getLogger("fencelock.background")

#: A straggler's reply still missing this long (s) after its round was lost on the way.
GIVE_UP_S = 1.0
#: A probe or a late batch gets the server timeout to answer, and this long (s) at the most.
PROBE_TIMEOUT_S = 1.0
#: A late call is sent once more this long (s) after its first answer.
LATE_AGAIN_S = 0.05
#: Late calls that could not be sent (refused, reset) are tried again this long (s) later.
LATE_RETRY_S = 0.1
#: The loop looks at its timers at least this often (s).
TICK_S = 0.05
#: Idle connections closed by their server are closed here this often (s).
SWEEP_S = 5.0


class _Job:
    """One connection the thread waits on."""

    def __init__(self, server: Server, conn: Connection, give_up_at: float) -> None:
        self.server = server
        self.conn = conn
        self.give_up_at = give_up_at
        self.node = server  # whose connection it is (a cluster's node, for a probe)
        self.fd = -1  # registered under this descriptor (the connection forgets it when closed)

    def replied(self, replies: list[object]) -> bool:
        """Handle the replies; False when the job sent something more and keeps waiting."""
        self.server.answered()
        self.server.learned(self.conn.identity)
        if self.node is not self.server:
            self.node.learned(self.conn.identity)
        return True

    def failed(self, exc: BaseException) -> None:
        self.conn.close()
        if isinstance(exc, TimeoutError | ConnectionError):
            self.server.failed(f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True, slots=True)
class Straggler:
    """A call of a decided round whose replies are still to come."""

    #: when (monotonic s) its server counts as suspect if it has not answered
    suspect_at: float
    #: the round: its script, keys and args are the call's; a NOSCRIPT is answered with the
    #: full script while its ``land`` holds (read when the NOSCRIPT comes: the flow turns it
    #: off once it gave the round up)
    effect: Broadcast
    #: the WAIT sent after the script (replicas=k), or nothing
    tail: bytes = b""
    #: the replies of the call itself: the script's, then the WAIT's
    own: int = 1
    #: the call went after ASKING (a cluster's ASK redirect)
    asking: bool = False
    #: the call's server index in ``servers`` (the driver's): the round's ``late`` is given
    #: the reply (a given-up attempt's late grant is released, see :func:`heard_late`)
    index: int = -1
    servers: tuple[Server, ...] = ()

    @property
    def script(self) -> str:
        return self.effect.script

    @property
    def keys(self) -> tuple[str, ...]:
        return self.effect.keys

    @property
    def args(self) -> tuple[str | int, ...]:
        return self.effect.args


class _StragglerJob(_Job):
    def __init__(
        self, server: Server, conn: Connection, give_up_at: float, call: Straggler
    ) -> None:
        super().__init__(server, conn, give_up_at)
        self.call = call
        self.suspect_at = call.suspect_at  # 0 once its server was made suspect

    def replied(self, replies: list[object]) -> bool:
        call = self.call
        script = BY_NAME.get(call.script)  # None: a bare handshake
        # the script's own reply: after a slot map request or ASKING, before a WAIT's
        if script is not None and is_noscript(replies[-call.own]):
            self.server.loaded.discard(script.sha)
            if call.effect.land:
                payload = full_call(script, call.keys, call.args) + call.tail
                if call.asking:  # ASKING holds for one command only
                    self.conn.start(ASKING + payload, call.own + 1)
                else:
                    self.conn.start(payload, call.own)
                return False
        elif script is not None:
            self.server.loaded.add(script.sha)
        if call.servers and script is not None:
            heard_late(call.effect, call.servers, call.index, answer(replies[-call.own :]))
        super().replied(replies)
        self.server.idle.append(self.conn)
        return True

    def failed(self, exc: BaseException) -> None:
        """No reply will come (given up, or the connection failed): what the call may have
        taken there is released as the round's ``late`` says for an unheard one (its request
        may still land: the connection closed behind it delivers it)."""
        super().failed(exc)
        call = self.call
        if call.servers and BY_NAME.get(call.script) is not None:
            heard_late(call.effect, call.servers, call.index, UNHEARD)


def heard_late(effect: Broadcast, servers: tuple[Server, ...], index: int, result: object) -> None:
    """A reply of a parked round (``result``: as its ``classify`` is given one) from
    ``servers[index]``: the ``Repeat`` the round's ``late`` asks for, if any, is queued (a
    given-up attempt's grant that came after its cleanup is released there)."""
    late = effect.late
    if late is None:
        return
    repeat = late(index, result)
    if repeat is not None:
        background().repeat(servers, repeat)


class _Probe(_Job):
    def replied(self, replies: list[object]) -> bool:
        super().replied(replies)
        self.node.idle.append(self.conn)
        return True

    def failed(self, exc: BaseException) -> None:
        self.conn.close()
        with self.server.lock:
            self.server.health.probe_failed(time.monotonic())


class _LateBatch(_Job):
    def __init__(
        self,
        server: Server,
        conn: Connection,
        give_up_at: float,
        calls: list[LateCall],
        owner: Server | None = None,
        moved: Callable[[Server, Server], None] | None = None,
    ) -> None:
        super().__init__(server, conn, give_up_at)
        self.calls = calls
        self.owner = owner  # the cluster this node serves (None: a standalone server)
        self.moved = moved  # called with (node, cluster) when a call goes to another node

    def replied(self, replies: list[object]) -> bool:
        super().replied(replies)
        now = time.monotonic()
        owner = self.owner
        for call, reply in zip(self.calls, replies, strict=False):
            if is_noscript(reply):
                self.server.loaded.discard(BY_NAME[call.script].sha)
                call.due = now
                self.server.late.append(call)
                continue
            if owner is not None:
                redirect = owner.redirected(reply)
                if redirect is not None and not redirect[1] and redirect[0] is not self.server:
                    # MOVED: the slot lives on another node now; the call goes there
                    call.due = now
                    redirect[0].late.append(call)
                    if self.moved is not None:
                        self.moved(redirect[0], owner)
                    continue
                if busy_slot(reply) or redirect is not None:
                    # not run (a slot being migrated: TRYAGAIN, or ASK while keys move):
                    # not an answer; tried again here until the slot settles (then MOVED)
                    call.due = now + LATE_RETRY_S
                    self.server.late.append(call)
                    continue
            call.answered += 1
            if call.answered < 2 and now < call.until:
                call.due = now + LATE_AGAIN_S
                self.server.late.append(call)
        self.server.idle.append(self.conn)
        return True

    def failed(self, exc: BaseException) -> None:
        super().failed(exc)
        due = time.monotonic() + LATE_RETRY_S
        for call in self.calls:
            call.due = due
        self.server.late.extend(self.calls)


class Background:
    """The thread; use :func:`background` to get the process's one instance."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._inbox: deque[Callable[[], None]] = deque()
        self._jobs: dict[int, _Job] = {}
        self._watched: set[Server] = set()
        self._busy: set[Server] = set()  # a probe or a late batch in flight
        self._owners: dict[Server, Server] = {}  # a cluster's node -> the cluster
        self._swept_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="fencelock-background", daemon=True)
        self._thread.start()

    # -- called from any thread ---------------------------------------------------------------

    def adopt(self, server: Server, conn: Connection, call: Straggler) -> None:
        """Take over a straggler of a decided round (on ``conn``, a connection to ``server``)."""
        give_up_at = max(call.suspect_at, time.monotonic() + GIVE_UP_S)
        job = _StragglerJob(server, conn, give_up_at, call)
        self._post(lambda: self._add(job))

    def watch(self, server: Server) -> None:
        """Probe ``server`` until it answers (it just became suspect)."""
        self._post(lambda: self._watched.add(server))

    def repeat(self, servers: tuple[Server, ...], effect: Repeat) -> None:
        """Queue a ``Repeat`` effect's script for each of its target servers, once for each
        of its ``at_s`` (first sent that long from now, its ``until_s`` counted from then).
        The calls are queued by the thread itself: a server's queue of late calls is touched
        by the thread only (a caller appending to it while the thread walked it broke the
        walk, and a call appended just before the thread cleared a spent queue was lost)."""
        now = time.monotonic()
        for at_s in effect.at_s:
            first = now + at_s
            until = first + effect.until_s
            for index in effect.targets:
                owner = servers[index]
                server = owner.route(effect.keys)  # a cluster's node
                call = LateCall(effect.script, effect.keys, effect.args, until, due=first)
                self._post(lambda s=server, o=owner, c=call: self._queue(s, o, c))  # type: ignore[misc]

    def _queue(self, node: Server, owner: Server, call: LateCall) -> None:
        """In the thread: queue ``call`` on ``node`` and watch it."""
        node.late.append(call)
        self._watch_node(node, owner)

    def _watch_node(self, node: Server, owner: Server) -> None:
        """Watch ``node`` (in the thread); ``owner``: the cluster it serves, if it is one's."""
        if owner is not node:
            self._owners[node] = owner
        self._watched.add(node)

    def _post(self, action: Callable[[], None]) -> None:
        self._inbox.append(action)
        with contextlib.suppress(OSError):  # a full wake pipe: the loop is awake anyway
            self._wake_w.send(b"\0")

    # -- the thread ---------------------------------------------------------------------------

    def _add(self, job: _Job) -> None:
        try:
            job.fd = job.conn.fileno()
            self._selector.register(job.fd, job.conn.events(), job)
            self._jobs[job.fd] = job
        except (OSError, ValueError) as exc:
            self._fail(job, exc)

    def _drop(self, job: _Job) -> None:
        if self._jobs.get(job.fd) is job:
            del self._jobs[job.fd]
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(job.fd)
        if not isinstance(job, _StragglerJob):
            # (only a probe or a late batch makes its server busy: a straggler adopted for
            # the same server ending first cleared it, and the next _tend stopped watching
            # a server whose batch was still in flight)
            self._busy.discard(job.server)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        """``job`` failed: dropped, told, and its server watched if that made it suspect (a
        late batch that timed out: it is probed until it answers, and its calls are sent
        again then; unwatched, it stayed suspect, skipped by every round of the process,
        simulation seed 920000825 with --front sync)."""
        self._drop(job)
        job.failed(exc)
        if job.server.health.suspect or job.server.late:
            self._watched.add(job.server)

    def _run(self) -> None:
        while True:
            try:
                self._step()
            except Exception:  # never die silently: log and go on
                log.exception("fencelock background step failed")
                time.sleep(TICK_S)

    def _step(self) -> None:
        for key, _ in self._selector.select(TICK_S):
            if key.data is None:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
                continue
            self._advance(key.data)
        while self._inbox:
            self._inbox.popleft()()
        now = time.monotonic()
        for job in list(self._jobs.values()):
            if isinstance(job, _StragglerJob) and job.suspect_at and now >= job.suspect_at:
                job.suspect_at = 0.0
                if job.server.failed("no answer within the server timeout"):
                    self._watched.add(job.server)
            if now >= job.give_up_at:
                self._fail(job, TimeoutError("no answer"))
        for server in list(self._watched):
            self._tend(server, now)
        if now - self._swept_at >= SWEEP_S:
            self._swept_at = now
            sweep_idle()

    def _advance(self, job: _Job) -> None:
        try:
            replies = job.conn.advance()
        except Exception as exc:
            self._fail(job, exc)
            return
        if replies is None:
            self._selector.modify(job.fd, job.conn.events(), job)
            return
        if job.replied(replies):
            self._drop(job)
        else:
            self._selector.modify(job.fd, job.conn.events(), job)

    def _tend(self, server: Server, now: float) -> None:
        """Probe a suspect server when due; send a healthy server's due late calls."""
        if server in self._busy:
            return
        health = server.health
        if health.suspect:
            if health.probe_due(now):
                self._start(server, _Probe, PING, 1, node=server.probe_target())
            return
        due = [call for call in server.late if call.due <= now and call.until > now]
        if not due:
            if not server.late or all(call.until <= now for call in server.late):
                server.late.clear()
                self._watched.discard(server)
            return
        for call in due:
            server.late.remove(call)
        payload = b"".join(CALLS.encode(server, c.script, c.keys, c.args)[1] for c in due)
        owner = self._owners.get(server)
        self._start(server, _LateBatch, payload, len(due), due, owner, self._watch_node)

    def _start(
        self,
        server: Server,
        kind: type[_Job],
        payload: bytes,
        replies: int,
        *extra: Any,
        node: Server | None = None,
    ) -> None:
        target = server if node is None else node  # a cluster is probed through a node
        timeout = min(PROBE_TIMEOUT_S, max(0.05, server.timeout_s))
        try:
            address = target.address
        except ConnectionError as exc:  # no sentinel named the master: the job failed
            idle = Connection(server.last_address)  # never started: nothing to close
            kind(server, idle, time.monotonic() + timeout, *extra).failed(exc)
            return
        conn = Connection(address)
        job = kind(server, conn, time.monotonic() + timeout, *extra)
        job.node = target
        try:
            conn.start(payload, replies)
        except Exception as exc:
            job.failed(exc)
            return
        self._busy.add(server)
        self._add(job)


#: The process's background thread, started on first use (and again in a forked child).
background = PerProcess(Background)
