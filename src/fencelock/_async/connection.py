"""One connection to one server for asyncio: an :class:`asyncio.Protocol` feeding the RESP parser.

Rules of this module:

- No timeouts inside: the caller bounds time (by cancelling, or by closing the connection).
- Many tasks share one connection: requests are pipelined and answered in order; a cancelled
  (or :meth:`~AsyncConnection.forget`-ten) request keeps its place, and one caller giving up
  never fails the others' requests: the connection is closed only once no request on it is
  still wanted. A failed connection fails every request waiting on it and is done for
  (:attr:`AsyncConnection.usable` is False); a request none of which was written fails with
  :class:`Unsent` (safe to send again), any other with an outcome unknown.
- A new connection sends the handshake :func:`~fencelock._engine.handshake.prelude` and its
  first request in one write.
- Error replies come back as :class:`~fencelock._engine.resp.ReplyError` instances in the list;
  transport failures are raised.
- Closing never shuts the socket down, and in a forked child it leaves the inherited transport
  untouched (its event loop belongs to the parent).
- A request is awaited (:meth:`AsyncConnection.request`) or, on a connection that has already
  answered, handed a callback (:meth:`AsyncConnection.send`) that ``data_received`` calls with
  the replies: no future, no task, no extra loop iteration.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .._engine.address import Address
from .._engine.handshake import prelude, split_prelude
from .._engine.link import LinkState
from .._engine.resp import INCOMPLETE, Parser, ProtocolError

__all__ = ["AsyncConnection", "OnReplies", "Unsent"]

#: What :meth:`AsyncConnection.send` calls once: ``(replies, None)`` or ``(None, error)``.
OnReplies = Callable[[list[object] | None, BaseException | None], None]

# This process's id, kept by a fork hook: ``usable`` is asked on every call, and
# ``os.getpid()`` is a system call.
_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Unsent(ConnectionAbortedError):
    """A request failed before any of it was written: the server cannot have read it, so it
    may be sent again (on another connection). Any other failure of a request leaves its
    outcome unknown: the server may have run it."""


@dataclass(slots=True, eq=False)
class _Pending:
    """One request's place in the connection's queue: its replies arrive in order, to
    ``future`` or to ``on_done``."""

    future: asyncio.Future[list[object]] | None
    want: int
    handshake_n: int
    on_done: OnReplies | None = None
    replies: list[object] = field(default_factory=list, init=False)


class AsyncConnection(LinkState, asyncio.Protocol):
    """Connection to one server for asyncio, shared by any number of tasks of one loop.

    Requests are pipelined: each is queued with the number of replies it wants, and the replies
    are handed out in order. Writes made in one loop iteration leave in one ``send``. A request
    whose task is cancelled keeps its place (its replies are read and dropped), so one task's
    cancellation never costs the others their connection. ``identity`` is set once the handshake
    replies arrived (``None`` for users without the right to ``INFO``/``ROLE``).
    """

    def __init__(self, address: Address, *, identify: bool = True) -> None:
        super().__init__(address, identify, _pid)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._parser = Parser()
        self._queue: deque[_Pending] = deque()
        self._out = bytearray()
        self._flush_scheduled = False
        self._closed = False
        self._eof = False
        self._unflushed = 0  # requests at the queue's tail whose bytes are still in _out
        self._wrote = False
        self._retired = False

    def __repr__(self) -> str:
        state = "usable" if self.usable else "closed"
        return f"<AsyncConnection {self.address.name} {state}>"

    @property
    def usable(self) -> bool:
        """Connected (or never connected yet), not closed, no EOF seen, in this process."""
        if self._closed or self._eof or self.owner_pid != _pid:
            return False
        return self._transport is None or not self._transport.is_closing()

    @property
    def established(self) -> bool:
        """Connected, handshake done, a request answered, usable: :meth:`send` may be used."""
        if self._fresh or self._closed or self._eof or self.owner_pid != _pid:
            return False
        transport = self._transport
        return transport is not None and not transport.is_closing()

    @property
    def retired(self) -> bool:
        """True once :meth:`retire` was called: no new request belongs on it."""
        return self._retired

    def retire(self) -> None:
        """Take no new request from now on (its owner shares another connection instead); the
        requests on it still get their replies, and it closes once none of them is wanted."""
        self._retired = True
        self._close_if_unwanted()

    @property
    def wrote(self) -> bool:
        """True once any request was written: before that, none can have been read."""
        return self._wrote

    @property
    def pending(self) -> int:
        """Requests sent (or queued) whose replies have not all arrived."""
        return len(self._queue)

    # ---- the request -------------------------------------------------------------------------

    async def request(self, payload: bytes, replies: int) -> list[object]:
        """Send ``payload`` (one or more encoded commands) and return its ``replies`` replies.

        Connects on first use, with the handshake in the same write as the first payload.
        No timeout inside: the caller bounds time (by cancelling, or by :meth:`close`).

        Raises:
            OSError: refused, reset, EOF, TLS failure, :class:`HandshakeError`,
                :class:`ProtocolError`, or the connection was closed.
        """
        if not self.usable:
            raise Unsent(errno.ECONNABORTED, f"{self.address.name}: the connection is closed")
        loop = asyncio.get_running_loop()
        self._loop = loop
        handshake_n = 0
        if self._transport is None:
            if self._connecting is None:
                handshake, handshake_n = prelude(self.address, identify=self.identify)
                payload = handshake + payload
                self._connecting = loop.create_future()
                try:
                    await self._connect(loop)
                except BaseException as exc:
                    self.close()
                    self._connecting.set_exception(
                        exc
                        if isinstance(exc, Exception)
                        else Unsent(errno.ECONNABORTED, f"{self.address.name}: not connected")
                    )
                    self._connecting.exception()
                    raise
                self._connecting.set_result(None)
            else:
                await asyncio.shield(self._connecting)
        transport = self._transport
        if transport is None or self._closed or self._eof:
            raise Unsent(errno.ECONNRESET, f"{self.address.name}: the connection was lost")
        future: asyncio.Future[list[object]] = loop.create_future()
        entry = _Pending(future, handshake_n + replies, handshake_n)
        if entry.want == 0:
            future.set_result([])
        else:
            self._queue.append(entry)
            self._unflushed += 1
        self._put(payload, loop)
        try:
            result = await future
        except asyncio.CancelledError:
            entry.future = None  # its replies are read and dropped
            self._close_if_unwanted()
            raise
        if handshake_n:
            self.identity, result = split_prelude(
                result,
                handshake_n,
                address=self.address,
                identify=self.identify,
                on_error=self.close,
            )
        self._fresh = False
        self.last_used = time.monotonic()
        return result

    def send(self, payload: bytes, replies: int, on_done: OnReplies) -> None:
        """Queue ``payload`` (``replies`` replies, >= 1) on an :attr:`established` connection;
        ``on_done`` is called once, from the event loop, with the replies or the error that
        failed the connection. Nothing is awaited: the caller bounds time (by :meth:`close`).
        On a connection that is not established (or closed meanwhile), ``on_done`` gets a
        :class:`Unsent` at once."""
        loop = self._loop
        if loop is None or not self.established:
            on_done(
                None, Unsent(errno.ECONNABORTED, f"{self.address.name}: the connection is closed")
            )
            return
        self._queue.append(_Pending(None, replies, 0, on_done))
        self._unflushed += 1
        self._put(payload, loop)

    def forget(self, on_done: OnReplies) -> None:
        """The caller of :meth:`send` with ``on_done`` gave up: its request keeps its place
        (its replies are read and dropped), ``on_done`` is not called; the connection is
        closed once no request on it is still wanted."""
        for entry in self._queue:
            if entry.on_done is on_done:
                entry.on_done = None
        self._close_if_unwanted()

    def _close_if_unwanted(self) -> None:
        for entry in self._queue:
            if entry.on_done is not None or (entry.future is not None and not entry.future.done()):
                return
        if self._queue or self._retired:
            self.close()

    def _put(self, payload: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """Write ``payload`` (the requests at the queue's tail) now when no other request is
        in flight or buffered on this connection: a request alone costs no extra turn of the
        loop. Otherwise buffer it: the requests that tasks queue in one turn of the loop go
        out in one write at the next (one system call for many tasks)."""
        transport = self._transport
        if (
            len(self._queue) <= 1
            and not self._flush_scheduled
            and transport is not None
            and not self._closed
        ):
            self._write_now(transport, payload)
            return
        self._out += payload
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if transport is not None and self._out and not self._closed:
            self._write_now(transport, bytes(self._out))
        self._out.clear()

    def _write_now(self, transport: asyncio.Transport, data: bytes) -> None:
        """Hand ``data`` (every request not written yet) to the transport: from here on the
        server may run them, so none of them is ever sent again."""
        transport.write(data)
        self._wrote = True
        self._unflushed = 0

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        address = self.address
        if address.path is not None:
            await loop.create_unix_connection(lambda: self, address.path)
            return
        tls = address.tls
        await loop.create_connection(
            lambda: self,
            address.host,
            address.port,
            ssl=tls.context() if tls is not None else None,
            server_hostname=address.host if tls is not None else None,
        )
        transport = self._transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _fail(self, exc: BaseException) -> None:
        """Every request still waiting fails with ``exc`` (those not written yet with
        :class:`Unsent`)."""
        queue, self._queue = self._queue, deque()
        written = len(queue) - self._unflushed
        self._unflushed = 0
        self._out.clear()
        unsent = Unsent(errno.ECONNABORTED, f"{self.address.name}: not sent: {exc}")
        for i, entry in enumerate(queue):
            if i >= written:
                exc = unsent
            if entry.on_done is not None:
                entry.on_done(None, exc)
            elif entry.future is not None and not entry.future.done():
                entry.future.set_exception(exc)
                entry.future.exception()  # retrieved: a cancelled caller may never look

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._closed:  # closed while connecting
            transport.abort()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        queue = self._queue
        try:
            while True:
                reply = parser.get()
                if reply is INCOMPLETE:
                    return
                if not queue:
                    raise ProtocolError(f"{self.address.name}: a reply nobody asked for")
                entry = queue[0]
                replies = entry.replies
                replies.append(reply)
                if len(replies) == entry.want:
                    queue.popleft()
                    on_done = entry.on_done
                    if on_done is not None:
                        on_done(replies, None)
                        if self._closed:  # the callback closed it: its queue is failed
                            return
                    elif entry.future is not None and not entry.future.done():
                        entry.future.set_result(replies)  # done: its caller was cancelled
                    if self._retired:
                        self._close_if_unwanted()
                        if self._closed:
                            return
        except ProtocolError as exc:
            self._fail(exc)
            self.close()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._fail(
            ConnectionResetError(
                errno.ECONNRESET, f"{self.address.name}: the server closed the connection"
            )
        )
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        if exc is None:
            exc = ConnectionResetError(
                errno.ECONNRESET, f"{self.address.name}: the connection was lost"
            )
        self._fail(exc)

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Abort the transport (no shutdown, no TLS close_notify); idempotent. A request in
        flight fails with ``ConnectionAbortedError``. In a forked child the inherited transport
        is left alone (touching it would change the parent's event loop registrations)."""
        self._closed = True
        self._fail(
            ConnectionAbortedError(
                errno.ECONNABORTED, f"{self.address.name}: the connection was closed"
            )
        )
        transport, self._transport = self._transport, None
        if transport is not None and self.owner_pid == _pid:
            try:
                transport.abort()
            except RuntimeError:  # its event loop is closed: close the socket itself
                _close_socket_of(transport)


def _close_socket_of(transport: asyncio.BaseTransport) -> None:
    """Close the socket under a transport whose event loop is already closed."""
    inner: object = transport
    for _ in range(3):  # a TLS transport wraps the socket transport
        sock = getattr(inner, "_sock", None)
        if isinstance(sock, socket.socket):
            sock.close()
            return
        protocol = getattr(inner, "_ssl_protocol", None)
        inner = getattr(protocol, "_transport", None)
        if inner is None:
            return
