"""One connection to one server for asyncio: an :class:`asyncio.Protocol` feeding the RESP parser.

Rules of this module:

- No timeouts inside: the caller bounds time by cancelling the task. Cancelled or failed, the
  connection aborts its transport and is done for (:attr:`AsyncConnection.usable` is False).
- A new connection sends the handshake :func:`~fencelock._engine.handshake.prelude` and its
  first request in one write.
- Error replies come back as :class:`~fencelock._engine.resp.ReplyError` instances in the list;
  transport failures are raised.
- Closing never shuts the socket down, and in a forked child it leaves the inherited transport
  untouched (its event loop belongs to the parent).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time

from .._engine.address import Address
from .._engine.handshake import Identity, identity_from, prelude
from .._engine.resp import INCOMPLETE, Parser, ProtocolError

__all__ = ["AsyncConnection"]


class AsyncConnection(asyncio.Protocol):
    """Connection to one server for asyncio; one request at a time.

    ``identity`` is set once the handshake replies arrived (``None`` for users without the
    right to ``INFO``/``ROLE``); ``last_used`` is the ``time.monotonic()`` of the last
    completed request (0.0 before).
    """

    def __init__(self, address: Address) -> None:
        self.address = address
        self.identity: Identity | None = None
        self.last_used = 0.0
        self.owner_pid = os.getpid()
        self._transport: asyncio.Transport | None = None
        self._parser = Parser()
        self._replies: list[object] = []
        self._want = 0
        self._waiter: asyncio.Future[list[object]] | None = None
        self._busy = False
        self._closed = False
        self._eof = False
        self._fresh = True

    def __repr__(self) -> str:
        state = "usable" if self.usable else "closed"
        return f"<AsyncConnection {self.address.name} {state}>"

    @property
    def usable(self) -> bool:
        """Connected (or never connected yet), not closed, no EOF seen, in this process."""
        if self._closed or self._eof or self.owner_pid != os.getpid():
            return False
        return self._transport is None or not self._transport.is_closing()

    @property
    def fresh(self) -> bool:
        """True until the first request completed (never used before)."""
        return self._fresh

    # ---- the request -------------------------------------------------------------------------

    async def request(self, payload: bytes, replies: int) -> list[object]:
        """Send ``payload`` (one or more encoded commands) and return its ``replies`` replies.

        Connects on first use, with the handshake in the same write as ``payload``.

        Raises:
            OSError: refused, reset, EOF, TLS failure, :class:`HandshakeError`,
                :class:`ProtocolError`, or the connection was already closed.
            asyncio.CancelledError: as usual; the connection is then closed.
        """
        assert not self._busy, "one request at a time"
        if not self.usable:
            raise ConnectionAbortedError(
                errno.ECONNABORTED, f"{self.address.name}: the connection is closed"
            )
        self._busy = True
        try:
            loop = asyncio.get_running_loop()
            handshake_n = 0
            if self._transport is None:
                handshake, handshake_n = prelude(self.address)
                payload = handshake + payload
                await self._connect(loop)
            transport = self._transport
            if transport is None or self._closed or self._eof:
                raise ConnectionResetError(
                    errno.ECONNRESET, f"{self.address.name}: the connection was lost"
                )
            waiter: asyncio.Future[list[object]] = loop.create_future()
            self._waiter = waiter
            self._replies = []
            self._want = handshake_n + replies
            transport.write(payload)
            if self._want == 0:
                waiter.set_result([])
            result = await waiter
            if handshake_n:
                self.identity = identity_from(result[:handshake_n], address=self.address)
                result = result[handshake_n:]
        except BaseException:
            self.close()
            raise
        finally:
            self._busy = False
            self._waiter = None
        self._fresh = False
        self.last_used = time.monotonic()
        return result

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
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._closed:  # closed while connecting
            transport.abort()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        try:
            while True:
                reply = parser.get()
                if reply is INCOMPLETE:
                    return
                waiter = self._waiter
                if waiter is None or waiter.done():
                    raise ProtocolError(f"{self.address.name}: a reply nobody asked for")
                self._replies.append(reply)
                if len(self._replies) == self._want:
                    waiter.set_result(self._replies)
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
        if transport is not None and self.owner_pid == os.getpid():
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
