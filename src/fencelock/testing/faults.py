"""Addresses that misbehave the way sick servers do: :class:`BlackHole` (connects hang),
:func:`refused_url` (connects are refused), :func:`delayed_proxy` (every round trip is slow).

All durations are in seconds.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Sequence

from .._engine.registry import resolve
from .proxy import Proxy
from .server import Server, ServerError, free_ports

__all__ = [
    "BLACK_HOLE_FILLERS",
    "BlackHole",
    "delayed_proxy",
    "refused_url",
    "refused_urls",
    "wait_trusted",
]

# --------------------------------------------------------------------------------------------
# fault helpers: addresses that misbehave the way sick servers do
# --------------------------------------------------------------------------------------------

BLACK_HOLE_FILLERS = 3
"""Filler connections a :class:`BlackHole` opens into its own backlog.

Measured on Linux 6.18 (loopback, ``tcp_syncookies=1``, ``tcp_abort_on_overflow=0``): with
``listen(0)`` the accept queue holds one connection, so a single completed filler is enough for
every later SYN to be dropped (a 0.3 s and a 3.5 s ``create_connection`` both timed out; with no
filler the first connect succeeded). Three leave a margin; the extra two simply stay in SYN-SENT.
"""

_BLACK_HOLE_READY_S = 2.0  # the first filler's handshake completes in microseconds on loopback


def _writable(socks: Sequence[socket.socket], timeout_s: float) -> list[socket.socket]:
    """The sockets of ``socks`` that became writable within ``timeout_s`` (poll: any fd
    number, where ``select`` fails above 1023 in a process with many files open)."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLOUT)
    return [by_fd[fd] for fd, _ in poller.poll(max(0, int(timeout_s * 1000)))]


class BlackHole:
    """A loopback TCP address where connects never complete (neither refused nor accepted).

    It listens with ``listen(0)`` and never calls ``accept``; its own non-blocking filler
    connections fill the accept queue, so the kernel drops every later SYN and a client's connect
    hangs until its own timeout: what a server behind a dead link or a full backlog looks like.
    Starts in the constructor; :meth:`close` (or leaving the ``with`` block) closes every socket.

    Raises:
        ServerError: the backlog could not be filled within 2 s.
    """

    def __init__(self, host: str = "127.0.0.1", fillers: int = BLACK_HOLE_FILLERS) -> None:
        if fillers < 1:
            raise ValueError("a BlackHole needs at least one filler connection")
        self.host = host
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._fillers: list[socket.socket] = []
        try:
            self._listener.bind((host, 0))
            self._listener.listen(0)
            self.port: int = self._listener.getsockname()[1]
            for _ in range(fillers):
                filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                filler.setblocking(False)
                self._fillers.append(filler)
                with contextlib.suppress(BlockingIOError):
                    filler.connect((host, self.port))
            # the queue is full once one filler's handshake completed (it becomes writable)
            writable = _writable(self._fillers, _BLACK_HOLE_READY_S)
            if not any(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in writable):
                raise ServerError(f"black hole on port {self.port}: no filler connected")
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """``redis://host:port/0`` of the black hole (no password: nothing is ever sent)."""
        return f"redis://{self.host}:{self.port}/0"

    def close(self) -> None:
        """Close the listener and every filler. Idempotent."""
        for sock in [*self._fillers, self._listener]:
            with contextlib.suppress(OSError):
                sock.close()
        self._fillers.clear()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BlackHole {self.host}:{self.port}>"


def refused_url(host: str = "127.0.0.1") -> str:
    """A ``redis://`` URL on ``host`` where nothing listens: connects are refused at once (it
    needs no password: no connection is ever made).

    The port was bound and closed a moment ago (as :func:`free_port`); another process could take
    it in between, which on a test machine practically never happens.
    """
    return refused_urls(1, host)[0]


def refused_urls(count: int, host: str = "127.0.0.1") -> list[str]:
    """``count`` distinct :func:`refused_url` addresses (their ports from :func:`free_ports`), for
    a server list with several refusing members: a port given twice would be a configuration
    error, not two refusing servers."""
    return [f"redis://{host}:{port}/0" for port in free_ports(count, host)]


def delayed_proxy(server: Server, delay: float) -> Proxy:
    """Start a :class:`~fencelock.testing.proxy.Proxy` in front of ``server`` that makes every
    round trip ``delay`` seconds slower; return it (use its ``url``, which carries the server's
    password; ``stop()`` it, or use it as a context manager).

    The proxy's ``latency`` mode delays every chunk in both directions, so each direction gets
    ``delay / 2``: a request and its reply together take ``delay`` more (the connection handshake
    too, as with a slow server). ``proxy.pass_through()`` heals it, ``proxy.latency(ms)`` changes
    the one-way delay.

    Raises:
        ValueError: ``delay`` is negative or not finite.
        fencelock.testing.proxy.ProxyError: the proxy could not start.
    """
    if not 0.0 <= delay < 3600.0:
        raise ValueError(f"delay must be in [0, 1 h) seconds, got {delay!r}")
    proxy = Proxy(
        server.host, server.port, name=f"delay->{server.port}", password=server.password
    ).start()
    try:
        proxy.latency(delay * 1000.0 / 2.0)
    except BaseException:
        proxy.stop()
        raise
    return proxy


def wait_trusted(servers: Sequence[object], within_s: float = 5.0) -> bool:
    """Wait until this process's Locks no longer suspect ``servers`` (URLs or clients, as a
    Lock takes them): a server that timed out or refused is skipped by rounds until a
    background probe sees it answer, and a probe sent into a black hole waits out its timeout
    first. At most ``within_s`` seconds; whether they are all trusted again. A server no Lock
    of this process has used is trusted."""
    healing = [server for spec in servers for server in resolve(spec)]
    deadline = time.monotonic() + within_s
    while any(server.health.suspect for server in healing):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
