"""A small TCP proxy per lock server: the network faults of the chaos run.

The kernel here has no ``tc netem`` and there is no Toxiproxy package, so latency, partitions,
late delivery and one-way drops come from this proxy. Each :class:`Proxy` listens on a free
``127.0.0.1`` port and forwards to one server; its asyncio loop runs in a daemon thread of its
own, and the controller thread changes its mode at any time:

- ``pass``: forward both directions as they come;
- ``latency``: delay every chunk by ``latency_ms`` (order kept, both directions);
- ``blackhole``: accept connections and read requests, but never forward nor answer;
- ``hold``: keep every byte (both directions) until :meth:`Proxy.deliver` or :meth:`Proxy.heal`,
  then deliver it late, in order;
- ``drop-replies``: forward requests, discard every reply (the request is applied, the client
  never hears of it).

Apart from the mode, :meth:`Proxy.hold_connections` keeps the bytes of the connections open
now (only those) until :meth:`Proxy.deliver`: a request written on one of them then reaches
the server after requests written later on new connections, as a request stuck in one TCP
connection does.

Durations are seconds unless the name says ``_ms``. Control calls wait at most
``CONTROL_TIMEOUT`` seconds for the loop thread and raise :class:`ProxyError` past that.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .._engine.registry import server_started
from .server import url_userinfo

__all__ = ["CONTROL_TIMEOUT", "Mode", "ModeName", "Proxy", "ProxyError", "ProxyStats"]

ModeName = Literal["pass", "latency", "blackhole", "hold", "drop-replies"]
CONTROL_TIMEOUT = 5.0  # seconds a control call waits for the proxy's loop thread
_CHUNK = 65536
_CONNECT_TIMEOUT = 2.0  # seconds to reach the upstream server
T = TypeVar("T")


class ProxyError(RuntimeError):
    """The proxy could not start, stop, or answer a control call in time."""


@dataclass(frozen=True)
class Mode:
    """A proxy mode; ``latency_ms`` is used only by ``latency``."""

    name: ModeName = "pass"
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in ("pass", "latency", "blackhole", "hold", "drop-replies"):
            raise ValueError(f"unknown proxy mode {self.name!r}")
        if not 0.0 <= self.latency_ms < 3_600_000.0:
            raise ValueError(f"latency_ms must be in [0, 1 h), got {self.latency_ms}")

    def __str__(self) -> str:
        return f"latency({self.latency_ms:g} ms)" if self.name == "latency" else self.name


@dataclass
class ProxyStats:
    """Counters since start (bytes)."""

    connections: int = 0
    forwarded_up: int = 0
    forwarded_down: int = 0
    dropped_up: int = 0
    dropped_down: int = 0
    held_max: int = 0
    modes: list[str] = field(default_factory=list)
    #: bytes read from clients (whatever the mode then: forwarded, delayed, held or dropped)
    read_up: int = 0


class _Pipe:
    """One direction of one connection: read chunks, decide, queue, write in order."""

    def __init__(
        self,
        proxy: Proxy,
        up: bool,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        gate: asyncio.Event,
    ) -> None:
        self.proxy = proxy
        self.up = up  # client -> server
        self.reader = reader
        self.writer = writer
        self.gate = gate  # the connection's own hold (hold_connections): clear while held
        self.queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.reader.read(_CHUNK)
                if not data:
                    break
                mode = self.proxy._mode
                # (read_up counts a chunk once its fate is decided: a mode set after it was
                # counted applies to the next chunk)
                if mode.name == "blackhole" or (mode.name == "drop-replies" and not self.up):
                    self.proxy._count(self.up, dropped=len(data), read=len(data))
                    continue
                delay = mode.latency_ms / 1000.0 if mode.name == "latency" else 0.0
                self.queue.put_nowait((loop.time() + delay, data))
                self.proxy._count(self.up, read=len(data))
        except (ConnectionError, OSError):
            pass
        finally:
            self.queue.put_nowait(None)

    async def write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    break
                due, data = item
                await self.proxy._flowing.wait()  # hold mode keeps bytes here
                await self.gate.wait()  # and hold_connections, this connection's
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.proxy._flowing.wait()
                await self.gate.wait()
                self.writer.write(data)
                await self.writer.drain()
                self.proxy._count(self.up, forwarded=len(data))
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                self.writer.close()


class Proxy:
    """TCP proxy ``127.0.0.1:<port>`` -> ``target_host:target_port`` with switchable faults.

    ``Proxy(target_host, target_port).start()`` binds a free port and returns ``self``;
    :attr:`url` is the ``redis://`` URL clients should use. Always :meth:`stop` it (or use it as
    a context manager). Raises :class:`ProxyError` when it cannot start or answer in time.

    It forwards bytes, so a client authenticates to the target through it (``AUTH``/``HELLO``
    pass as they are); ``password`` (the target's, e.g. ``server.password``) only goes into
    :attr:`url`, which the proxy itself never reads. ``drain``: when a client closes its
    connection, what it sent is still forwarded (after its delay) before the server's end is
    closed, as TCP delivers what was sent before a FIN (default: both ends close at once).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        name: str = "",
        password: str | None = None,
        drain: bool = False,
    ) -> None:
        if not 0 < target_port < 65536:
            raise ValueError(f"bad target port {target_port}")
        self.password = password
        self.drain = drain
        self.target_host = target_host
        self.target_port = target_port
        self.name = name or f"proxy->{target_port}"
        self.host = "127.0.0.1"
        self.port = 0
        self.stats = ProxyStats()
        self._mode = Mode()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._flowing: asyncio.Event = None  # type: ignore[assignment]  # set in the loop
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._gates: set[asyncio.Event] = set()  # one per open connection
        self._stats_lock = threading.Lock()

    # ---- properties -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://:PASSWORD@127.0.0.1:<port>/0`` of the proxy (no ``:PASSWORD@`` without
        a ``password``)."""
        return f"redis://{url_userinfo(self.password)}{self.host}:{self.port}/0"

    @property
    def mode(self) -> Mode:
        """The current mode."""
        return self._mode

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> Proxy:
        """Start the loop thread and listen on a free loopback port; return ``self``.

        Raises:
            ProxyError: already started, or the listener was not up within CONTROL_TIMEOUT s.
        """
        if self._thread is not None:
            raise ProxyError(f"{self.name} already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run_loop, args=(loop, ready), name=self.name, daemon=True
        )
        self._thread.start()
        if not ready.wait(CONTROL_TIMEOUT):
            raise ProxyError(f"{self.name}: loop thread did not start")
        self._call(self._listen())
        # the port may have served another server before: what the engine knew of that
        # address (its identity, so a restart that is none) is forgotten, as for a new server
        server_started(self.host, self.port, new_server=True)
        return self

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
        with contextlib.suppress(Exception):
            # every task still pending (a connection accepted while stopping, a pipe whose
            # cancel was not processed yet) ends here, not in the garbage collector later,
            # where it surfaced as another test's unraisable-exception warning (CI)
            for _ in range(3):
                pending = asyncio.all_tasks(loop)
                if not pending:
                    break
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.wait(pending, timeout=CONTROL_TIMEOUT))
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._on_client, sock=sock)

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop thread. Idempotent.

        Raises:
            ProxyError: the loop thread did not end within CONTROL_TIMEOUT s.
        """
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(ProxyError, RuntimeError):
                self._call(self._shutdown())
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CONTROL_TIMEOUT)
            if thread.is_alive():
                raise ProxyError(f"{self.name}: loop thread did not stop")
        self._loop = None
        self._thread = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop_all()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)

    def __enter__(self) -> Proxy:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- control (from any thread) ----------------------------------------------------------

    def set_mode(self, mode: Mode) -> None:
        """Switch to ``mode`` (applies to every chunk read from now on).

        Leaving ``hold`` delivers what was held. Raises :class:`ProxyError` if not running.
        """
        self._call(self._apply(mode))

    def pass_through(self) -> None:
        """Mode ``pass``."""
        self.set_mode(Mode("pass"))

    def latency(self, ms: float) -> None:
        """Mode ``latency``: every chunk waits ``ms`` milliseconds before it is forwarded."""
        self.set_mode(Mode("latency", float(ms)))

    def blackhole(self) -> None:
        """Mode ``blackhole``: accept and read, never forward nor answer."""
        self.set_mode(Mode("blackhole"))

    def hold(self) -> None:
        """Mode ``hold``: keep all bytes until :meth:`deliver` / :meth:`heal`."""
        self.set_mode(Mode("hold"))

    def drop_replies(self) -> None:
        """Mode ``drop-replies``: forward requests, discard replies."""
        self.set_mode(Mode("drop-replies"))

    def hold_connections(self) -> int:
        """Keep every byte of the connections open now (both directions) until
        :meth:`deliver` or :meth:`heal`; connections opened later pass as the mode says. A
        request written on a held connection reaches the server after those written later on
        new ones. Returns how many connections are held. Raises :class:`ProxyError` if not
        running."""
        return self._call(self._hold_connections())

    async def _hold_connections(self) -> int:
        for gate in self._gates:
            gate.clear()
        self._record(f"hold-connections({len(self._gates)})")
        return len(self._gates)

    def deliver(self) -> None:
        """Release held bytes (late; those of :meth:`hold_connections` too) and go back to
        ``pass``."""
        self.set_mode(Mode("pass"))

    def heal(self, *, reset: bool = False) -> None:
        """Back to ``pass`` (held bytes are delivered); ``reset`` also closes every connection,
        so clients reconnect cleanly (what a healed partition often looks like)."""
        self._call(self._apply(Mode("pass"), reset=reset))

    def reset(self) -> None:
        """Close every current connection (the mode is kept)."""
        self._call(self._apply(self._mode, reset=True))

    async def _apply(self, mode: Mode, reset: bool = False) -> None:
        self._mode = mode
        self._record(str(mode))
        if mode.name == "hold":
            self._flowing.clear()
        else:
            self._flowing.set()
            for gate in self._gates:  # what hold_connections kept goes too
                gate.set()
        if reset:
            self._drop_all()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or self._thread is None or not self._thread.is_alive():
            coro.close()
            raise ProxyError(f"{self.name} is not running")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(CONTROL_TIMEOUT)
        except TimeoutError as exc:  # concurrent.futures.TimeoutError is TimeoutError on 3.11+
            future.cancel()
            raise ProxyError(f"{self.name}: control call timed out") from exc
        except Exception as exc:
            if type(exc).__name__ == "TimeoutError":  # Python 3.10
                future.cancel()
                raise ProxyError(f"{self.name}: control call timed out") from exc
            raise

    # ---- connections (loop thread) ----------------------------------------------------------

    def _record(self, what: str) -> None:
        """Note a mode change in :attr:`ProxyStats.modes` (the last 20 are kept)."""
        with self._stats_lock:
            self.stats.modes.append(what)
            del self.stats.modes[:-20]

    def _count(self, up: bool, *, forwarded: int = 0, dropped: int = 0, read: int = 0) -> None:
        with self._stats_lock:
            if up:
                self.stats.read_up += read
                self.stats.forwarded_up += forwarded
                self.stats.dropped_up += dropped
            else:
                self.stats.forwarded_down += forwarded
                self.stats.dropped_down += dropped

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.close()
        self._writers.clear()

    async def _on_client(
        self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        with self._stats_lock:
            self.stats.connections += 1
        self._writers.add(c_writer)
        s_writer: asyncio.StreamWriter | None = None
        tasks: list[asyncio.Task[None]] = []
        gate: asyncio.Event | None = None
        try:
            try:
                s_reader, upstream = await asyncio.wait_for(
                    asyncio.open_connection(self.target_host, self.target_port),
                    _CONNECT_TIMEOUT,
                )
            except (OSError, asyncio.TimeoutError):
                return  # upstream down: the client sees its connection closed
            s_writer = upstream
            self._writers.add(upstream)
            gate = asyncio.Event()  # (a connection is held only once both pipes are up)
            gate.set()
            self._gates.add(gate)
            up = _Pipe(self, True, c_reader, upstream, gate)
            down = _Pipe(self, False, s_reader, c_writer, gate)
            parts = [up.read_loop(), up.write_loop(), down.read_loop(), down.write_loop()]
            tasks = [asyncio.ensure_future(p) for p in parts]
            for pipe_task in tasks:  # stop() waits for them too: none is left to the GC
                self._tasks.add(pipe_task)
                pipe_task.add_done_callback(self._tasks.discard)
            # when either side closes, close both: a half-open Redis connection is useless
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if self.drain and tasks[0] in done:
                # the client closed: what it sent still reaches the server, late as its mode
                # says (TCP delivers what was sent before a FIN), before both ends close
                await asyncio.wait([tasks[1], tasks[2]], return_when=asyncio.FIRST_COMPLETED)
            for end in (c_writer, upstream):
                with contextlib.suppress(Exception):
                    end.close()
            await asyncio.wait(tasks, timeout=1.0)
            for t in tasks:
                t.cancel()
        except asyncio.CancelledError:
            pass
        finally:
            for t in tasks:  # also when this task was cancelled (stop): the pipes end with it
                t.cancel()
            for maybe in (c_writer, s_writer):
                if maybe is not None:
                    self._writers.discard(maybe)
                    with contextlib.suppress(Exception):
                        maybe.close()
            if gate is not None:
                self._gates.discard(gate)
            if task is not None:
                self._tasks.discard(task)

    def __repr__(self) -> str:
        target = f"{self.target_host}:{self.target_port}"
        return f"<Proxy {self.host}:{self.port} -> {target} {self._mode}>"
