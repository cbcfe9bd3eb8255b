"""The blocking driver: performs a flow's effects with non-blocking sockets and one selector.

It decides nothing: which servers to ask, when a round may stop and what a reply means come
with the effect. A round writes to every target first (connecting and handshaking inside the
round, never before it), then reads replies as they become readable, so it costs about one round
trip and a sick server delays nobody past the round's budget. Servers that are suspect are not
asked (their vote is :class:`~fencelock._core.effects.NotSent`); stragglers of a decided round
go to the background thread unless the flow's next effect waits for them (``SETTLE``).
"""

from __future__ import annotations

import contextlib
import math
import select
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .._core.effects import (
    IDENTITIES,
    NOW,
    SETTLE,
    STOP_CHECK_S,
    Broadcast,
    ClaimInterrupted,
    Effect,
    Flow,
    Identify,
    NotSent,
    Pause,
    Repeat,
    Settle,
)
from .._core.health import skip_suspects
from .._core.quorum import Tally
from .._core.replies import classify_handshake
from .._engine.cluster import ASKING, BUSY_RETRY_S, MAP_REQUEST, MAX_HOPS, busy_slot
from .._engine.handshake import HandshakeError
from .._engine.registry import on_fork
from .._engine.resp import ReplyError, bulks, command
from .._engine.server import Server, makes_suspect, unidentified
from .._engine.wire import (
    CALLS,
    CLIENT_ID,
    PING,
    answer,
    client_id,
    full_call,
    is_noscript,
    is_readonly,
    wait_tail,
    wake_call,
)
from .._scripts import Script
from .background import Straggler, background, heard_late
from .connection import POLL_MASKS, Connection, Stopped

T = TypeVar("T")

#: An idle connection used less than this long ago (s) is taken without a staleness check
#: (the check costs a system call).
STALE_CHECK_AFTER_S = 0.05


def take(server: Server, *, check: bool = False) -> Connection:
    """An idle connection to ``server`` that the server has not closed, or a new one;
    ``check``: even one used a moment ago is checked (after a failure or a redirect, when a
    connection closed under us is likely: a request written on it could not be sent again).

    Raises:
        NoMaster: (a ConnectionError) no sentinel named a Sentinel-managed master.
    """
    address = server.address
    idle = server.idle
    while idle:
        try:
            conn: Connection = idle.pop()
        except IndexError:
            break
        if conn.address is not address and conn.address != address:  # a node no longer leading
            conn.close()
            continue
        recent = not check and time.monotonic() - conn.last_used < STALE_CHECK_AFTER_S
        if recent or not conn.stale():
            return conn
        conn.close()
        server.connection_failed()  # closed by the server: it may have restarted, so ask
    return Connection(address)


def _ready(server: Server, recent: float) -> Connection | None:
    """An idle connection to a standalone server (not suspect, no sentinels) that answered
    after ``recent`` (monotonic s), for a lean round; None: the general path decides (it
    takes, checks or opens connections)."""
    if server.is_cluster or server.sentinels is not None or server.health.suspect_since is not None:
        return None
    idle = server.idle
    try:
        conn: Connection = idle.pop()
    except IndexError:
        return None
    if conn.last_used < recent or conn.closed:
        idle.append(conn)  # take() checks it
        return None
    return conn


class _Call:
    __slots__ = (
        "asking", "conn", "hops", "index", "mapping", "node", "own", "payload", "replies",
        "retried", "script", "server", "tail",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        server: Server,
        conn: Connection,
        script: Script | None,
        payload: bytes,
        node: Server | None = None,
        tail: bytes = b"",
        own: int = 1,
    ) -> None:
        self.index = index
        self.server = server  # the vote
        self.node = server if node is None else node  # whose connection carries it
        self.conn = conn
        self.script = script  # None for a bare handshake (Identify)
        self.tail = tail  # sent after the script call (a WAIT), in the same pipeline
        self.own = own  # the replies of the call itself (and of its WAIT): the last ones
        self.payload = payload + tail
        self.replies = own  # the payload's replies: a map request's and ASKING's come first
        self.mapping = False  # the payload starts with the cluster's slot map request
        self.asking = False  # the call is preceded by ASKING (a cluster's ASK redirect)
        self.hops = 0  # cluster redirects followed
        # a connection used before may have been closed by a restarted server meanwhile:
        # such a call is tried once more on a new connection
        self.retried = conn.fresh


def retry_on_new_connection(call: _Call, exc: BaseException) -> bool:
    """True when ``exc`` says the (reused) connection was dead before any of the request was
    written. A request of which a byte was written is never sent again (DESIGN v0.3): the
    server may have run it (a reset after the script ran: a ``CLIENT KILL``, a proxy), so
    its outcome is unknown, a failed vote, cleaned up by token."""
    return (
        not call.retried
        and not call.conn.wrote
        and isinstance(exc, ConnectionError)
        and not isinstance(exc, HandshakeError)
    )


class _Round:
    """One Broadcast in flight: its calls by file descriptor, its deadline, its tally."""

    def __init__(self, effect: Broadcast, deadline: float) -> None:
        self.effect = effect
        self.deadline = deadline
        self.calls: dict[int, _Call] = {}
        # calls a cluster node did not run (TRYAGAIN, CLUSTERDOWN), to send again: (when,
        # the call, the replies it got)
        self.later: list[tuple[float, _Call, list[object]]] = []


class _Poller:
    """``select.poll`` behind the few calls the driver makes: registering a descriptor costs
    no system call (an epoll selector costs two per call: register and unregister)."""

    def __init__(self) -> None:
        self._poll = self.poll = select.poll()

    def register(self, fd: int, events: int) -> None:
        self._poll.register(fd, POLL_MASKS[events])

    def modify(self, fd: int, events: int) -> None:
        self._poll.modify(fd, POLL_MASKS[events])

    def unregister(self, fd: int) -> None:
        self._poll.unregister(fd)

    def select(self, timeout_s: float) -> list[int]:
        """Descriptors ready (or failed) within ``timeout_s`` seconds."""
        return [fd for fd, _ in self._poll.poll(math.ceil(timeout_s * 1000.0))]


_local = threading.local()


def _selector() -> _Poller:
    poller: _Poller | None = getattr(_local, "poller", None)
    if poller is None:
        poller = _local.poller = _Poller()
    return poller


def _reset_after_fork() -> None:
    global _local
    _local = threading.local()  # start afresh in the child


on_fork(_reset_after_fork)


def _sleep(delay_s: float, stop: Callable[[], bool] | None) -> None:
    """Sleep ``delay_s`` seconds, or until ``stop()`` (looked at every STOP_CHECK_S)."""
    if stop is None:
        time.sleep(delay_s)
        return
    until = time.monotonic() + delay_s
    while not stop():
        rest = until - time.monotonic()
        if rest <= 0:
            return
        time.sleep(min(rest, STOP_CHECK_S))


class Driver:
    """Runs flows against ``servers`` (engine Servers, in the plan's order)."""

    def __init__(self, servers: tuple[Server, ...], timeout_s: float) -> None:
        self.servers = servers
        self.timeout_s = timeout_s
        self._calls = CALLS

    def _suspects(self) -> tuple[bool, ...] | None:
        """Which servers are suspect; None when none is (the common case, no tuple built)."""
        suspects = tuple(server.health.suspect for server in self.servers)
        return suspects if True in suspects else None

    def run(self, flow: Flow[T]) -> T:
        """Drive ``flow`` to its end; an exception while performing an effect (a
        KeyboardInterrupt, say) is thrown into the flow, which cleans up and re-raises."""
        answer: Any = None
        error: BaseException | None = None
        pending: _Round | None = None
        try:
            while True:
                try:
                    effect = flow.throw(error) if error is not None else flow.send(answer)
                except StopIteration as stop:
                    if pending is not None:
                        self._harvest(pending)
                    result: T = stop.value
                    return result
                error = None
                if effect is NOW:  # the most frequent effect: no dispatch
                    answer = time.monotonic()
                    continue
                try:
                    if isinstance(effect, Broadcast):
                        # the last round's stragglers are read while this one runs (a lean
                        # round), then handed to the background thread if still silent
                        older, pending = pending, None
                        answer, pending = self._broadcast(effect, older)
                        continue
                    if pending is not None and isinstance(effect, Pause):
                        self._park(pending)
                        pending = None
                    answer, pending = self._perform(effect, pending)
                except BaseException as exc:
                    answer, error = None, exc
        finally:
            if pending is not None:
                self._park(pending)

    def _perform(self, effect: Effect, pending: _Round | None) -> tuple[Any, _Round | None]:
        if effect is NOW:
            return time.monotonic(), pending
        if isinstance(effect, Broadcast):
            return self._broadcast(effect)
        if effect is SETTLE:
            if pending is None:
                return None, None  # every call of the last round has answered already
            self._collect(pending, settle=True)
            return pending.effect.tally, None
        if isinstance(effect, Settle):
            if pending is None:
                return None, None
            self._collect(pending, settle=True, until=time.monotonic() + effect.within_s)
            return None, (pending if pending.calls else None)
        if isinstance(effect, Pause):
            return self._pause(effect), pending
        if isinstance(effect, Repeat):
            background().repeat(self.servers, effect)
            return None, pending
        if effect is IDENTITIES:
            return tuple(server.identity for server in self.servers), pending
        if isinstance(effect, Identify):
            self._identify(effect)
            return tuple(server.identity for server in self.servers), pending
        raise TypeError(f"unknown effect {effect!r}")

    # -- rounds -------------------------------------------------------------------------------

    def _broadcast(
        self, effect: Broadcast, older: _Round | None = None
    ) -> tuple[Tally, _Round | None]:
        """Run ``effect``; ``older``: the previous round's stragglers, parked when done."""
        lean = self._lean(effect, older)
        if lean is not None:
            return lean
        if older is not None:
            self._park(older)
        tally = effect.tally
        round_ = _Round(effect, time.monotonic() + effect.budget_s)
        tail, replies = wait_tail(effect.wait)
        try:
            suspects = self._suspects()
            skip = suspects is not None and skip_suspects(tally, effect.targets, suspects)
            for index in effect.targets:
                server = self.servers[index]
                if skip and server.health.suspect:
                    reason = NotSent(f"suspect: {server.health.reason}")
                    tally.record(index, *effect.classify(reason))
                    continue
                node = server.route(effect.keys)
                script, payload = self._calls.encode(node, effect.script, effect.keys, effect.args)
                try:
                    # checked even if used a moment ago: the lean round could not take it, so
                    # something is unusual (a cluster, a failure); a request written on a
                    # connection the server had closed could not be sent again
                    conn = take(node, check=True)
                except ConnectionError as exc:  # no sentinel named the master
                    self._failed(server, exc)
                    tally.record(index, *effect.classify(exc))
                    continue
                call = _Call(index, server, conn, script, payload, node, tail, replies)
                if server.wants_map():
                    call.mapping, call.replies = True, call.replies + 1
                    call.payload = MAP_REQUEST + call.payload
                self._start(round_, call)
            self._collect(round_, settle=False)
        except BaseException:
            self._park(round_)
            raise
        return tally, (round_ if round_.calls else None)

    def _lean(
        self, effect: Broadcast, older: _Round | None = None
    ) -> tuple[Tally, _Round | None] | None:
        """The common round, with the fewest objects and calls: every target a standalone
        server, not suspect, with a connection that answered recently. Writes every call,
        then reads replies as they come and records the plain ones. Anything else (an error
        reply such as NOSCRIPT or READONLY, a broken connection, the deadline) turns the calls
        still open into the general round's, which carries on. None when the round cannot
        start lean (nothing was sent then, and ``older`` is left as it was); else ``older``
        (the last round's stragglers) is read meanwhile and parked at the end if still open."""
        servers = self.servers
        picked: list[tuple[int, Server, Connection]] = []
        recent = time.monotonic() - STALE_CHECK_AFTER_S
        for index in effect.targets:
            server = servers[index]
            conn = _ready(server, recent)
            if conn is None:
                for _, other, taken in picked:
                    other.idle.append(taken)
                return None
            picked.append((index, server, conn))
        deadline = time.monotonic() + effect.budget_s
        tail, own = wait_tail(effect.wait)
        name, keys, args = effect.script, effect.keys, effect.args
        head = self._calls.head
        nargs = len(args)
        body = bulks(args)  # the same for every server
        poll = _selector().poll
        # fd -> (index, server, connection, script, payload without its tail)
        open_: dict[int, tuple[int, Server, Connection, Script, bytes]] = {}
        tally = effect.tally
        classify = effect.classify
        stop = effect.stop
        widened: _Round | None = None
        try:
            for index, server, conn in picked:
                script, prefix = head(server, name, keys, nargs)
                payload = prefix + body
                # a write failure is raised by advance()
                conn.start(payload + tail if tail else payload, own)
                fd = conn.fileno()
                poll.register(fd, POLL_MASKS[conn.events()])
                open_[fd] = (index, server, conn, script, payload)
            while open_ and widened is None and not (stop is not None and stop(tally)):
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
                for fd, _ in poll.poll(math.ceil(timeout * 1000.0)):
                    entry = open_.get(fd)
                    if entry is None:
                        if older is not None and fd in older.calls:
                            self._straggler(older, fd)
                        continue
                    index, server, conn, script, payload = entry
                    try:
                        replies = conn.advance()
                    except Exception as exc:
                        widened = self._widen(effect, deadline, open_)
                        self._broke(widened, widened.calls[fd], fd, exc)
                        break
                    if replies is None:
                        poll.modify(fd, POLL_MASKS[conn.events()])
                        continue
                    reply = replies[-own]
                    if isinstance(reply, ReplyError):  # NOSCRIPT, READONLY...: the full path
                        widened = self._widen(effect, deadline, open_)
                        self._replied(widened, widened.calls[fd], fd, replies)
                        break
                    del open_[fd]
                    poll.unregister(fd)
                    server.idle.append(conn)
                    if server.recheck or conn.identity is not server.identity:
                        server.learned(conn.identity)
                    server.loaded.add(script.sha)
                    if server.health.suspect_since is not None:
                        server.answered()
                    tally.record(index, *classify(reply if own == 1 else answer(replies)))
                if stop is not None and stop(tally):
                    break
            if older is not None:
                if older.calls:
                    self._park(older)
                older = None
            if open_:
                widened = self._widen(effect, deadline, open_)
            if widened is not None:
                # go on as the general path does: to the stop rule or the deadline
                self._collect(widened, settle=False)
        except BaseException:
            if older is not None:
                self._park(older)
            if open_:
                widened = self._widen(effect, deadline, open_)
            if widened is not None:
                self._park(widened)
            raise
        return tally, (widened if widened is not None and widened.calls else None)

    def _widen(
        self,
        effect: Broadcast,
        deadline: float,
        open_: dict[int, tuple[int, Server, Connection, Script, bytes]],
    ) -> _Round:
        """The lean round's open calls as a general round (their descriptors stay watched)."""
        round_ = _Round(effect, deadline)
        tail, own = wait_tail(effect.wait)
        for fd, (index, server, conn, script, payload) in open_.items():
            round_.calls[fd] = _Call(index, server, conn, script, payload, server, tail, own)
        open_.clear()
        return round_

    def _identify(self, effect: Identify) -> None:
        """A handshake (and a PING) with every server not identified yet and not suspect."""
        targets = unidentified(self.servers)
        if not targets:
            return
        tally = Tally(len(self.servers))
        probe = Broadcast("", targets, (), (), classify_handshake, None, effect.budget_s, tally)
        round_ = _Round(probe, time.monotonic() + effect.budget_s)
        try:
            for index in targets:
                server = self.servers[index]
                node = server.route(())
                try:
                    conn = take(node)
                except ConnectionError as exc:  # no sentinel named the master
                    self._failed(server, exc)
                    tally.record(index, *classify_handshake(exc))
                    continue
                self._start(round_, _Call(index, server, conn, None, PING, node))
            self._collect(round_, settle=True)
        finally:
            self._park(round_)

    def _start(self, round_: _Round, call: _Call) -> None:
        """Send ``call`` (connecting if need be) and watch its connection."""
        conn = call.conn
        try:
            conn.start(call.payload, call.replies)
            fd = conn.fileno()
            _selector().register(fd, conn.events())
        except Exception as exc:
            conn.close()
            if retry_on_new_connection(call, exc) and self._reconnect(call):
                self._start(round_, call)
                return
            if self._elsewhere(round_, call, exc):
                return
            self._failed(call.server, exc)
            round_.effect.tally.record(call.index, *round_.effect.classify(exc))
            return
        round_.calls[fd] = call

    def _reconnect(self, call: _Call) -> bool:
        """Give ``call`` a new connection (its reused one was dead); False when there is no
        address to connect to (no sentinel named the master)."""
        call.retried = True
        call.node.connection_failed()  # a restarted server: learn its new identity
        try:
            call.conn = Connection(call.node.address)
        except ConnectionError:
            return False
        return True

    def _collect(self, round_: _Round, *, settle: bool, until: float = math.inf) -> None:
        """Read replies until the round may stop (``settle``: until every call answered) or
        its deadline; calls still silent at the deadline are votes of TimeoutError. ``until``
        (monotonic s, before the deadline): stop reading then, the silent calls left open."""
        effect = round_.effect
        tally = effect.tally
        stop = None if settle else effect.stop
        selector = _selector()
        calls = round_.calls
        end = min(round_.deadline, until)
        while (calls or round_.later) and not (stop is not None and stop(tally)):
            timeout = end - time.monotonic()
            if timeout > 0 and round_.later:
                timeout = min(timeout, self._send_due(round_))
                if timeout <= 0:
                    continue
            if timeout <= 0:
                # past the deadline (this process may have been stopped, or slowed by a long
                # GC, while the replies arrived): what is there already is read before the
                # silent calls are judged
                for fd in selector.select(0.0):
                    call = calls.get(fd)
                    if call is not None:
                        self._advance(round_, call, selector)
                break
            for fd in selector.select(timeout):
                call = calls.get(fd)
                if call is None:
                    continue
                self._advance(round_, call, selector)
        if round_.later and time.monotonic() >= round_.deadline:
            for _, call, replies in round_.later:  # their last answer is their vote
                tally.record(call.index, *effect.classify(answer(replies[-call.own :])))
            round_.later.clear()
        if calls and time.monotonic() >= round_.deadline:
            for fd, call in list(calls.items()):
                del calls[fd]
                selector.unregister(fd)
                exc = TimeoutError(f"no answer within {effect.budget_s:.3f} s")
                call.server.node_failed(call.node)
                self._failed(call.server, exc)
                tally.record(call.index, *effect.classify(exc))
                # still heard in the background (GIVE_UP_S): a given-up attempt's grant
                # that comes after its cleanup is released there (effect.late; simulation
                # seed 205015); its server is suspect already
                self._adopt(round_, call, suspect_at=0.0)

    def _send_due(self, round_: _Round) -> float:
        """Send the calls of ``round_.later`` that are due (to their slot's owner as the map
        has it now); seconds until the next one is due (inf: none left)."""
        now = time.monotonic()
        later = round_.later
        due = [entry for entry in later if entry[0] <= now]
        if due:
            later[:] = [entry for entry in later if entry[0] > now]
            for _, call, _ in due:
                call.hops = 0  # bounded by the round's deadline, one retry per BUSY_RETRY_S
                self._send_to(round_, call, call.server.route(round_.effect.keys), asking=False)
        return min((entry[0] for entry in later), default=math.inf) - now

    def _advance(self, round_: _Round, call: _Call, selector: _Poller) -> None:
        conn = call.conn
        fd = conn.fileno()
        try:
            replies = conn.advance()
        except Exception as exc:
            self._broke(round_, call, fd, exc)
            return
        if replies is None:
            selector.modify(fd, conn.events())
            return
        self._replied(round_, call, fd, replies)

    def _broke(self, round_: _Round, call: _Call, fd: int, exc: Exception) -> None:
        """``call``'s connection (watched as ``fd``) failed with ``exc``: retry a reused
        connection once on a new one, try another cluster node, or record the failure."""
        del round_.calls[fd]
        _selector().unregister(fd)
        call.conn.close()
        if (
            retry_on_new_connection(call, exc)
            and time.monotonic() < round_.deadline
            and self._reconnect(call)
        ):
            self._start(round_, call)
            return
        if self._elsewhere(round_, call, exc):
            return
        self._failed(call.server, exc)
        effect = round_.effect
        effect.tally.record(call.index, *effect.classify(exc))

    def _replied(self, round_: _Round, call: _Call, fd: int, replies: list[object]) -> None:
        """``call`` (watched as ``fd``) has its replies: rerun a script the server lacked,
        follow a redirect, or record the vote."""
        effect = round_.effect
        conn = call.conn
        call.retried = True  # it answered: a later failure is not a stale connection's
        server = call.server
        node = call.node
        reply = replies[-call.own]  # the script's own (a WAIT's comes after it)
        if call.mapping:
            server.learn_map(replies[0])
        script = call.script
        if script is not None and is_noscript(reply):
            # flushed or restarted: run it in full on the same connection
            node.loaded.discard(script.sha)
            call.payload = full_call(script, effect.keys, effect.args) + call.tail
            call.mapping, call.replies = False, call.own
            if call.asking:  # ASKING holds for one command only
                call.payload, call.replies = ASKING + call.payload, call.own + 1
            conn.start(call.payload, call.replies)
            _selector().modify(fd, conn.events())
            return
        redirect = server.redirected(reply) if script is not None else None
        node.learned(conn.identity)
        del round_.calls[fd]
        _selector().unregister(fd)
        node.idle.append(conn)
        if (
            script is not None
            and server.is_cluster
            and busy_slot(reply)
            and time.monotonic() + BUSY_RETRY_S < round_.deadline
        ):
            # the node ran nothing (a slot being migrated, a failover): sent again shortly
            round_.later.append((time.monotonic() + BUSY_RETRY_S, call, replies))
            return
        if redirect is not None and call.hops < MAX_HOPS and time.monotonic() < round_.deadline:
            self._send_to(round_, call, redirect[0], asking=redirect[1])
            return
        if script is not None:
            node.loaded.add(script.sha)
        if is_readonly(reply):
            server.moved()
        if node is not server:
            server.learned(conn.identity)
            server.node_answered(node)
        server.answered()
        effect.tally.record(call.index, *effect.classify(answer(replies[-call.own :])))

    def _send_to(self, round_: _Round, call: _Call, node: Server, *, asking: bool) -> None:
        """Send ``call`` again, to ``node`` (a cluster's redirect, or another node after a
        failure): one more hop; the slot map is asked for too when it is stale."""
        effect = round_.effect
        call.hops += 1
        call.node = node
        call.conn = take(node, check=True)
        call.retried = call.conn.fresh
        if call.script is None:
            payload = PING
        else:
            call.script, payload = self._calls.encode(node, effect.script, effect.keys, effect.args)
        call.mapping = call.server.wants_map()
        call.asking = asking
        call.replies = call.own + call.mapping + asking
        call.payload = (MAP_REQUEST if call.mapping else b"") + (ASKING if asking else b"")
        call.payload += payload + (b"" if call.script is None else call.tail)
        self._start(round_, call)

    def _elsewhere(self, round_: _Round, call: _Call, exc: BaseException) -> bool:
        """A cluster node could not be reached: try the call on another node (which knows
        where the slot lives now), within the hops and the round's budget. True if sent.
        Never once a byte of it was written: the node may have run it (its outcome is
        unknown), and another node's ``MOVED`` would send it back there to run again."""
        server = call.server
        if (
            not server.is_cluster
            or call.conn.wrote
            or call.hops >= MAX_HOPS
            or not isinstance(exc, OSError)
            or isinstance(exc, HandshakeError)
            or time.monotonic() >= round_.deadline
        ):
            return False
        server.node_failed(call.node)
        call.node.connection_failed()
        self._send_to(round_, call, server.route(round_.effect.keys), asking=False)
        return True

    def _harvest(self, round_: _Round) -> None:
        """Read the replies of ``round_``'s stragglers that have arrived already (no
        waiting), so that fewer of them go to the background thread."""
        calls = round_.calls
        for fd in _selector().select(0.0):
            if fd in calls:
                self._straggler(round_, fd)

    def _straggler(self, round_: _Round, fd: int) -> None:
        """Progress a straggler of a decided round as the background thread would (its
        vote no longer counts: the flow's tally is left as the round ended, and a failure
        is not retried elsewhere): a NOSCRIPT runs the script in full when the round's
        calls must land everywhere; an answer returns the connection to the idle ones."""
        call = round_.calls[fd]
        conn = call.conn
        effect = round_.effect
        selector = _selector()
        try:
            replies = conn.advance()
        except Exception as exc:
            del round_.calls[fd]
            selector.unregister(fd)
            conn.close()
            call.server.node_failed(call.node)
            self._failed(call.server, exc)
            return
        if replies is None:
            selector.modify(fd, conn.events())
            return
        node = call.node
        script = call.script
        if script is not None and is_noscript(replies[-call.own]):
            node.loaded.discard(script.sha)
            if effect.land:
                call.payload = full_call(script, effect.keys, effect.args) + call.tail
                call.mapping, call.replies = False, call.own
                if call.asking:  # ASKING holds for one command only
                    call.payload, call.replies = ASKING + call.payload, call.own + 1
                conn.start(call.payload, call.replies)
                selector.modify(fd, conn.events())
                return
        elif script is not None:
            node.loaded.add(script.sha)
        del round_.calls[fd]
        selector.unregister(fd)
        if script is not None and effect.late is not None:
            heard_late(effect, self.servers, call.index, answer(replies[-call.own :]))
        node.learned(conn.identity)
        node.idle.append(conn)
        call.server.answered()

    def _park(self, round_: _Round) -> None:
        """Hand a decided round's stragglers to the background thread."""
        selector = _selector()
        for fd, call in list(round_.calls.items()):
            del round_.calls[fd]
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(fd)
            self._adopt(round_, call, suspect_at=round_.deadline)

    def _adopt(self, round_: _Round, call: _Call, *, suspect_at: float) -> None:
        """Hand ``call`` (unwatched already) to the background thread as a straggler; its
        server is made suspect at ``suspect_at`` if still silent (0: it is already)."""
        straggler = Straggler(
            suspect_at=suspect_at,
            effect=round_.effect,
            tail=call.tail,
            own=call.own,
            asking=call.asking,
            index=call.index,
            servers=self.servers,
        )
        background().adopt(call.node, call.conn, straggler)

    def _failed(self, server: Server, exc: BaseException) -> None:
        """A call failed: the server is suspect (skipped by rounds, probed in the background)
        when it timed out or could not be reached; a handshake refused (a wrong password) is
        not, so that its error keeps showing."""
        server.connection_failed()
        if makes_suspect(exc) and server.failed(f"{type(exc).__name__}: {exc}", self.timeout_s):
            background().watch(server)

    # -- waiting ------------------------------------------------------------------------------

    def _pause(self, effect: Pause) -> object:
        """Sleep up to ``delay_s``, or block on the wake list of one server: True if woken
        (with ``claim``: the element moved to the claim list, or None)."""
        delay = effect.delay_s
        stop = effect.stop
        if delay < 0.001 or (stop is not None and stop()):
            return None if effect.claim is not None else False
        if effect.wake is None or self.servers[effect.wake[0]].health.suspect:
            _sleep(delay, stop)
            return None if effect.claim is not None else False
        server = self.servers[effect.wake[0]]
        node = server.route((effect.wake[1],))
        try:
            conn = take(node)
        except ConnectionError:  # no sentinel named the master: sleep instead
            _sleep(delay, stop)
            return None if effect.claim is not None else False
        started = time.monotonic()
        payload = wake_call(effect.wake[1], effect.claim, delay)
        try:
            if effect.claim is not None and conn.client_id is None:
                conn.client_id = client_id(conn.call(CLIENT_ID, 1, self.timeout_s)[0])
            replies = conn.call(payload, 1, delay + self.timeout_s, stop, STOP_CHECK_S)
        except BaseException as exc:
            reply = None
            if effect.claim is not None and not conn.closed:
                # the server may have moved an element for us: end the wait from another
                # connection (CLIENT UNBLOCK) and hear the answer, so a claim is never lost
                reply = self._unblocked(node, conn)
            conn.close()
            if reply is not None:
                if not isinstance(exc, Exception):
                    raise ClaimInterrupted(reply, exc) from exc
                return reply
            if not isinstance(exc, Exception):
                raise
            if isinstance(exc, Stopped):  # the flow's stop: the server did nothing wrong
                return None if effect.claim is not None else False
            self._failed(server, exc)
            rest = delay - (time.monotonic() - started)
            if rest > 0:
                _sleep(rest, stop)
            return None if effect.claim is not None else False
        node.idle.append(conn)
        popped = replies[0]
        if isinstance(popped, ReplyError):  # refused (an ACL, an old server): sleep, not spin
            rest = delay - (time.monotonic() - started)
            if rest > 0:
                _sleep(rest, stop)
        if effect.claim is not None:
            return popped if isinstance(popped, bytes) else None
        return isinstance(popped, list)

    def _unblocked(self, node: Server, blocked: Connection) -> bytes | None:
        """End ``blocked``'s wait (``CLIENT UNBLOCK`` from another connection) and return the
        element its ``BLMOVE`` moved, if it moved one; within two server timeouts."""
        if blocked.client_id is None:
            return None
        try:
            other = take(node)
            other.call(command("CLIENT", "UNBLOCK", blocked.client_id), 1, self.timeout_s)
        except BaseException:
            return None
        node.idle.append(other)
        replies = blocked.finish(self.timeout_s)
        if replies and isinstance(replies[0], bytes):
            return replies[0]
        return None
