"""One non-blocking connection to one server, driven by the caller's selector.

Rules of this module:

- Nothing here blocks, ever: :meth:`Connection.start` begins a non-blocking connect (and TLS
  handshake) and returns at once; :meth:`Connection.advance` does whatever the socket allows
  right now and returns. A black-holed port or a SIGSTOPped server costs the caller nothing
  but the time it chooses to wait in its own selector. (One exception: a host *name* is resolved
  with ``getaddrinfo``, which may wait on DNS; IP addresses and ``/etc/hosts`` names do not.)
- A new connection sends the handshake :func:`~fencelock._engine.handshake.prelude` and its
  first request in one write: connecting costs no extra round trip.
- Error replies come back as :class:`~fencelock._engine.resp.ReplyError` instances in the reply
  list; transport failures are raised (``OSError`` subclasses: refused, reset, EOF, TLS,
  :class:`~fencelock._engine.handshake.HandshakeError`), after which the connection is closed
  for good.
- :meth:`Connection.close` never calls ``shutdown()``: a forked child closing its copy must not
  break the parent's connection.
"""

from __future__ import annotations

import errno
import math
import os
import select
import selectors
import socket
import ssl
import time
from collections.abc import Callable
from typing import Final

from .._engine.address import Address
from .._engine.handshake import prelude, split_prelude
from .._engine.link import LinkState
from .._engine.resp import Parser, ProtocolError

__all__ = ["Connection"]

_READ: Final = selectors.EVENT_READ
_WRITE: Final = selectors.EVENT_WRITE
_RECV_SIZE: Final = 65536


def _poll_mask(events: int) -> int:
    return (select.POLLIN if events & _READ else 0) | (select.POLLOUT if events & _WRITE else 0)


#: poll() flags by the selector events :meth:`Connection.events` returns (READ, WRITE, both)
POLL_MASKS: Final[dict[int, int]] = {events: _poll_mask(events) for events in range(4)}


# states
_NEW: Final = 0  # no socket yet
_CONNECTING: Final = 1  # TCP/unix connect in progress
_TLS: Final = 2  # TLS handshake in progress
_READY: Final = 3  # connected (and TLS done)
_CLOSED: Final = 4


class Stopped(Exception):
    """:meth:`Connection.call` gave up waiting because its ``stop`` said so."""


def _sockaddr(address: Address) -> tuple[socket.AddressFamily, object]:
    """Family and socket address to connect to; IPv4 first when a name has both."""
    if address.path is not None:
        return socket.AF_UNIX, address.path
    try:
        infos = socket.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except socket.gaierror as exc:
        raise OSError(exc.errno, f"{address.name}: cannot resolve {address.host!r}: {exc}") from exc
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


def _readable_now(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # pragma: no cover - platforms without poll
    return bool(readable)


class Connection(LinkState):
    """Non-blocking connection to one server; one request at a time; never used by two threads
    at once.

    Register :meth:`fileno` with a selector for :meth:`events`, call :meth:`advance` when it
    reports readiness, re-read :meth:`events` after each call. ``identity`` is set once the
    handshake replies arrived (``None`` for users without the right to ``INFO``/``ROLE``);
    ``last_used`` is the ``time.monotonic()`` of the last completed request (0.0 before).
    """

    def __init__(self, address: Address, *, identify: bool = True) -> None:
        super().__init__(address, identify, os.getpid())
        self._sock: socket.socket | None = None
        self._state = _NEW
        self._out = bytearray()
        self._parser = Parser()
        self._replies: list[object] = []
        self._want = 0  # replies the current request still needs in all (prelude included)
        self._prelude_n = 0
        self._busy = False
        self._error: OSError | None = None  # a failure found in start(), raised by advance()
        self._tls_events = _WRITE
        self._wrote = False  # a byte of the request in flight was written to the socket
        self._plain = address.tls is None

    def __repr__(self) -> str:
        states = ("new", "connecting", "tls", "ready", "closed")
        busy = " busy" if self._busy else ""
        return f"<Connection {self.address.name} {states[self._state]}{busy}>"

    @property
    def wrote(self) -> bool:
        """True once any byte of the last request started (with its handshake, on a new
        connection) was written to the socket. Until then the server cannot have read it, so
        it may be sent again on another connection; once written, its outcome is unknown
        until its replies arrive (the server may have run it): it is never sent again."""
        return self._wrote

    @property
    def busy(self) -> bool:
        """A request was started and has neither completed nor failed."""
        return self._busy

    @property
    def closed(self) -> bool:
        return self._state == _CLOSED

    # ---- the request cycle -------------------------------------------------------------------

    def start(self, payload: bytes, replies: int) -> None:
        """Queue one request: ``payload`` (one or more encoded commands) and the number of
        replies it produces. Connects first if needed (non-blocking; the handshake goes out in
        the same write as the payload). Writes at once when already connected. Never blocks.

        A failure to connect or write found here is raised by the next :meth:`advance` (the
        socket is then ready, so a selector wakes the caller at once).

        Raises:
            ConnectionAbortedError: the connection was closed.
            OSError: no socket could be created (e.g. out of file descriptors).
            RuntimeError: a request is already in flight.
        """
        self._wrote = False
        if self._state == _CLOSED:
            raise ConnectionAbortedError(f"{self.address.name}: the connection is closed")
        if self._busy:
            raise RuntimeError(f"{self.address.name}: a request is already in flight")
        if replies < 0:
            raise ValueError("replies must be >= 0")
        self._busy = True
        self._replies = []
        if self._state == _READY and not self._out:  # the common case: write it now
            self._prelude_n = 0
            self._want = replies
            sock = self._sock
            assert sock is not None
            try:
                sent = sock.send(payload)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent = 0
            except OSError as exc:
                self._out += payload
                self._error = exc
                return
            if sent:
                self._wrote = True
            if sent < len(payload):
                self._out += payload[sent:]
            return
        if self._state == _NEW:
            handshake, self._prelude_n = prelude(self.address, identify=self.identify)
            self._out += handshake
            self._out += payload
            self._want = self._prelude_n + replies
            self._connect()
        else:
            self._prelude_n = 0
            self._out += payload
            self._want = replies
            if self._state == _READY:
                try:
                    self._write()
                except OSError as exc:
                    self._error = exc

    def _connect(self) -> None:
        try:
            family, sockaddr = _sockaddr(self.address)
        except OSError as exc:
            # nothing to wait on: a connected socket pair makes the failure visible to the
            # caller's selector like any other
            self._sock, peer = socket.socketpair()
            peer.close()
            self._sock.setblocking(False)
            self._error = exc
            self._state = _CONNECTING
            return
        sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock = sock
        sock.setblocking(False)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._state = _CONNECTING
        err = sock.connect_ex(sockaddr)  # type: ignore[arg-type]
        if err == 0:
            try:
                self._connected()
            except OSError as exc:
                self._error = exc
        elif err in (errno.EINPROGRESS, errno.EALREADY) or (
            err == errno.EWOULDBLOCK and family != socket.AF_UNIX
        ):
            pass  # advance() finishes it
        else:
            # e.g. refused at once, or a unix socket whose accept backlog is full (EAGAIN);
            # an unconnected socket polls as hung up, so the caller's selector wakes at once
            self._error = OSError(err, f"{self.address.name}: connect: {os.strerror(err)}")

    def _connected(self) -> None:
        tls = self.address.tls
        if tls is None:
            self._state = _READY
            self._write()
            return
        assert self._sock is not None
        self._sock = tls.context().wrap_socket(
            self._sock, server_hostname=self.address.host, do_handshake_on_connect=False
        )
        self._state = _TLS
        self._handshake()

    def _handshake(self) -> None:
        sock = self._sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._tls_events = _READ
            return
        except ssl.SSLWantWriteError:
            self._tls_events = _WRITE
            return
        self._state = _READY
        self._write()

    def _write(self) -> None:
        sock = self._sock
        assert sock is not None
        out = self._out
        while out:
            try:
                sent = sock.send(out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            if sent:
                self._wrote = True
            del out[:sent]

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        tls = self.address.tls is not None
        while True:
            try:
                data = sock.recv(_RECV_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            if not data:
                raise ConnectionResetError(
                    errno.ECONNRESET, f"{self.address.name}: the server closed the connection"
                )
            self._parser.feed(data)
            # a short plain read drained the socket; TLS may still hold decrypted bytes
            if len(data) < _RECV_SIZE and not (tls and sock.pending()):  # type: ignore[attr-defined]
                return

    def _collect(self) -> bool:
        """Move parsed replies to the request; True when it has them all."""
        try:
            if not self._parser.fill(self._replies, self._want):
                return False
        except ProtocolError as exc:
            raise ProtocolError(f"{self.address.name}: {exc}") from None
        return not self._out

    def advance(self) -> list[object] | None:
        """Progress connect / TLS / write / read as far as possible without blocking.

        Safe to call at any time (spuriously too). Returns the request's replies once all
        arrived (``ReplyError`` instances inside, not raised; the connection is then idle and
        reusable), else ``None``.

        Raises:
            OSError: refused, reset, EOF, TLS failure, :class:`HandshakeError`,
                :class:`ProtocolError`; the connection is then closed and must be discarded.
        """
        if not self._busy:
            return None
        if self._state == _READY and self._plain and not self._out and self._error is None:
            # the common case, in one piece: a plain connection with its request written
            sock = self._sock
            assert sock is not None
            try:
                try:
                    data = sock.recv(_RECV_SIZE)
                except BlockingIOError:
                    return None
                if not data:
                    raise ConnectionResetError(
                        errno.ECONNRESET, f"{self.address.name}: the server closed the connection"
                    )
                parser = self._parser
                parser.feed(data)
                if len(data) == _RECV_SIZE:
                    self._read()  # there may be more
                if not parser.fill(self._replies, self._want):
                    return None
            except ProtocolError as exc:
                self.close()
                raise ProtocolError(f"{self.address.name}: {exc}") from None
            except BaseException:
                self.close()
                raise
            if self._prelude_n:
                return self._finish()
            replies = self._replies
            self._replies = []
            self._busy = False
            self._fresh = False
            self.last_used = time.monotonic()
            return replies
        try:
            if self._error is not None:
                raise self._error
            if self._state == _CONNECTING:
                sock = self._sock
                assert sock is not None
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, f"{self.address.name}: connect: {os.strerror(err)}")
                try:
                    sock.getpeername()
                except OSError as exc:
                    if exc.errno == errno.ENOTCONN:
                        return None  # still in progress
                    raise
                self._connected()
            if self._state == _TLS:
                self._handshake()
            if self._state != _READY:
                return None
            if self._out:
                self._write()
            self._read()
            if not self._collect():
                return None
        except BaseException:
            self.close()
            raise
        return self._finish()

    def _finish(self) -> list[object]:
        replies = self._replies
        self._replies = []
        self._busy = False
        n = self._prelude_n
        if n:
            self._prelude_n = 0
            self.identity, replies = split_prelude(
                replies, n, address=self.address, identify=self.identify, on_error=self.close
            )
        self._fresh = False
        self.last_used = time.monotonic()
        return replies

    # ---- selector support --------------------------------------------------------------------

    def fileno(self) -> int:
        """The socket's file descriptor (-1 before :meth:`start` and after :meth:`close`).
        It does not change between :meth:`start` and the end of the connection."""
        return -1 if self._sock is None else self._sock.fileno()

    def events(self) -> int:
        """The selector events :meth:`advance` needs right now."""
        if self._error is not None:
            return _READ | _WRITE
        state = self._state
        if state == _CONNECTING:
            return _WRITE
        if state == _TLS:
            return self._tls_events
        if state == _READY and self._busy and self._out:
            return _READ | _WRITE
        return _READ

    # ---- lifecycle ---------------------------------------------------------------------------

    def stale(self) -> bool:
        """True if this connection must not be reused: closed, inherited from a parent process,
        or idle and readable (the server closed it, or sent something nobody asked for).
        A stale connection of this process is closed here. An in-flight or never-used one is
        not stale."""
        if self._state == _CLOSED:
            return True
        if self.owner_pid != os.getpid():
            return True
        if self._state == _NEW or self._busy:
            return False
        sock = self._sock
        assert sock is not None
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
        if pending or _readable_now(sock.fileno()):
            self.close()
            return True
        return False

    def close(self) -> None:
        """Close the socket without ``shutdown()``; idempotent. A request in flight is dropped."""
        self._state = _CLOSED
        self._busy = False
        self._error = None
        self._out.clear()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def finish(self, timeout_s: float) -> list[object] | None:
        """Wait for the replies of the request in flight (after :meth:`call` was interrupted),
        at most ``timeout_s`` seconds: the replies, or None (failed, or the time ran out)."""
        sock = self._sock
        if not self._busy or sock is None or self.owner_pid != os.getpid():
            return None
        deadline = time.monotonic() + timeout_s
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        while True:
            try:
                result = self.advance()
            except OSError:
                return None
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            poller.poll(math.ceil(remaining * 1000.0))

    def call(
        self,
        payload: bytes,
        replies: int,
        timeout_s: float,
        stop: Callable[[], bool] | None = None,
        stop_check_s: float = math.inf,
    ) -> list[object]:
        """Blocking convenience: send one request and wait for its replies on a selector of
        its own, at most ``timeout_s`` seconds; ``stop`` is looked at every ``stop_check_s``.

        Raises:
            TimeoutError: no complete answer within ``timeout_s`` (the connection is closed).
            Stopped: ``stop()`` turned true first (the request is still in flight: hear it
                out with :meth:`finish`, or close the connection).
            OSError: as :meth:`advance`.
        """
        deadline = time.monotonic() + timeout_s
        self.start(payload, replies)
        # poll(), not a selectors.DefaultSelector: an epoll instance costs three system calls
        # more per call (create, register, close), paid by every blocked waiter
        poller = select.poll()
        fd = self.fileno()
        events = self.events()
        poller.register(fd, POLL_MASKS[events])
        while True:
            result = self.advance()
            if result is not None:
                return result
            if stop is not None and stop():
                raise Stopped(f"{self.address.name}: the wait was stopped")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise TimeoutError(
                    f"{self.address.name}: no reply within {timeout_s * 1000:.0f} ms"
                )
            wanted = self.events()
            if wanted != events:
                poller.modify(fd, POLL_MASKS[wanted])
                events = wanted
            poller.poll(math.ceil(min(remaining, stop_check_s) * 1000.0))
