"""Real threads run one at a time, scheduled by the world: the blocking front end in the world.

The blocking front end (``fencelock.Lock`` and the rest of the sync API) runs on threads: the
caller's, the process's background thread (stragglers, probes, repeats), its timers thread and
its renewal pool. Here each of them is a real ``threading.Thread`` that runs only while it
holds its *baton*: the world's scheduler (:meth:`tools.sim.world.World.run_until`) hands it
the baton (:meth:`SimThread.step`) and waits until the thread gives it back, which it does
whenever it would block: in ``poll``/``select`` on its sockets, in ``time.sleep``, in a
condition's ``wait``, in a queue of the renewal pool. So exactly one thread runs at a time,
and which one resumes next is the world's (seeded) choice, as for the asyncio loops: a
:class:`SimThread` looks to the scheduler like a loop (``next_at()``, ``step()``,
``is_closed()``, ``paused_until``, ``name``, ``process``).

Only the seams are replaced, as module attributes of the library's sync modules while a
schedule runs (:func:`patched_sync`): ``socket`` (in-memory sockets on the world's network:
:class:`SimSocket`), ``select.poll`` and ``selectors.DefaultSelector`` (they wait on the
world's clock), ``threading.Thread``/``Condition`` and ``ThreadPoolExecutor`` in the timers
and background modules (threads the world schedules); ``time.sleep`` is the world's too
(``time.monotonic`` already is, :func:`tools.sim.loop.patched_time`). The library's code,
its ``Connection``, its driver, its background and timer threads, runs unchanged.

A client's interrupt (Ctrl-C: ``KeyboardInterrupt``) is delivered the way CPython delivers
it, to a blocking call of the process's main thread (here: a client job's thread), by
:meth:`SimThread.interrupt`: the call it is blocked in raises ``KeyboardInterrupt`` when it
resumes.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import math
import selectors
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# the real primitives, taken before anything is patched
_RealThread = threading.Thread
_RealSemaphore = threading.Semaphore
_real_sleep = time.sleep
_get_ident = threading.get_ident

#: The scheduler gives up on a thread that neither yields nor ends within this long (real s):
#: a thread blocked outside the simulated primitives (a real lock held across a yield).
STUCK_S = 30.0

POLLIN = 0x001
POLLPRI = 0x002
POLLOUT = 0x004


class Killed(BaseException):
    """Raised in a thread of the simulation at its next blocking call when its schedule ends
    (or its process is killed): not an ``Exception``, so the library's own loops do not catch
    it (they catch ``Exception`` only)."""


class Stuck(RuntimeError):
    """A thread of the simulation neither yielded nor ended within :data:`STUCK_S`."""


class SimProcess:
    """A client process: its threads' pause (GC, SIGSTOP: every thread stops), and the
    "loop" of its connections for the world's network (data arrives in the kernel's buffer:
    at once, whatever its threads are doing)."""

    def __init__(self, name: str, hub: ThreadHub) -> None:
        self.name = name
        self.process = name
        self.paused_until = 0.0
        self.hub = hub
        # the process's PerProcess singletons (its timers thread, its background thread)
        self.singletons: dict[int, Any] = {}

    def is_closed(self) -> bool:
        return self.name in self.hub.world.dead

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        callback(*args)


class SimThread:
    """One real thread, run by the world one step at a time (a step: from when it is handed
    its baton until it blocks again or ends)."""

    def __init__(
        self,
        hub: ThreadHub,
        process: SimProcess,
        name: str,
        target: Callable[[], object],
        *,
        main: bool = False,
    ) -> None:
        self.hub = hub
        self.proc = process
        self.process = process.name
        self.name = name
        self.main = main  # a client job's thread: the one a Ctrl-C interrupts
        self._target = target
        self._go = _RealSemaphore(0)
        self._back = _RealSemaphore(0)
        self.done = False
        self.started = False
        self.error: BaseException | None = None  # what ended it, if it raised
        # what it waits for: ready() true, or the true time ``until``
        self.ready: Callable[[], bool] | None = None
        self.until: float | None = hub.world.clock.now
        self.blocked_in = "start"  # the primitive it waits in (for the trace)
        self.pending: BaseException | None = None  # raised where it resumes (interrupt, kill)
        # an interrupt due at the entry of a later blocking call: (calls to let pass, what
        # to raise, told when it is raised)
        self.armed: tuple[int, BaseException, Callable[[], None]] | None = None
        self.killing = False
        self._thread = _RealThread(target=self._main, name=f"sim:{name}", daemon=True)

    # -- the scheduler's side ---------------------------------------------------------------

    @property
    def paused_until(self) -> float:
        return self.proc.paused_until

    @paused_until.setter
    def paused_until(self, value: float) -> None:
        self.proc.paused_until = value  # a pause stops every thread of the process

    def is_closed(self) -> bool:
        return self.done

    def next_at(self) -> float | None:
        if self.done:
            return None
        now = self.hub.world.clock.now
        if self.pending is not None:
            return max(now, self.proc.paused_until) if not self.killing else now
        ready = self.ready
        if ready is not None and ready():
            return max(now, self.proc.paused_until)
        if self.until is None:
            return None
        return max(self.until, self.proc.paused_until)

    def step(self) -> None:
        """Run the thread until it blocks again or ends."""
        if self.done:
            return
        hub = self.hub
        hub.enter(self.proc)
        previous, hub.current = hub.current, self
        try:
            if not self.started:
                self.started = True
                self._thread.start()
            self._go.release()
            if not self._back.acquire(timeout=STUCK_S):
                self.done = True
                raise Stuck(f"{self.name} did not yield within {STUCK_S} s ({self.blocked_in})")
        finally:
            hub.current = previous

    def interrupt(
        self, exc: BaseException, after: int = 0, told: Callable[[], None] | None = None
    ) -> None:
        """Raise ``exc`` in the thread: where it blocks now (``after`` 0), or as it enters its
        ``after``-th blocking call from now (a signal that comes just as it blocks there);
        ``told()`` runs in the thread just before it is raised."""
        if after <= 0:
            if told is not None:
                told()
            self.pending = exc
        else:
            self.armed = (after, exc, told or (lambda: None))

    def close(self) -> None:
        """End the thread: :class:`Killed` at each blocking call until it ends (a bounded
        number of steps: the library's cleanup may block again on the way out)."""
        if self.done:
            return
        if not self.started:
            self.done = True
            return
        self.killing = True
        for _ in range(50):
            if self.done:
                return
            self.pending = Killed()
            self.step()
        self.done = True  # left blocked for good (a daemon thread): reported by the hub
        self.hub.leaked.append(self.name)

    # -- the thread's side ------------------------------------------------------------------

    def _main(self) -> None:
        self._go.acquire()
        self.hub.threads_by_ident[_get_ident()] = self
        try:
            if self.pending is not None and self.killing:
                raise Killed()
            self._target()
        except Killed:
            pass
        except BaseException as exc:
            self.error = exc
        finally:
            self.done = True
            self.hub.threads_by_ident.pop(_get_ident(), None)
            self._back.release()

    def block(self, what: str, ready: Callable[[], bool] | None, until: float | None) -> None:
        """Give the baton back until ``ready()`` or the true time ``until`` (None: no time
        limit); raises what :meth:`interrupt` (or the end of the schedule) delivered."""
        pending = self.pending
        if pending is not None:
            self.pending = None
            raise pending
        armed = self.armed
        if armed is not None:
            after, exc, told = armed
            if after <= 1:
                self.armed = None
                told()
                raise exc
            self.armed = (after - 1, exc, told)
        self.ready = ready
        self.until = until
        self.blocked_in = what
        self._back.release()
        self._go.acquire()
        self.ready = None
        self.until = None
        pending = self.pending
        if pending is not None:
            self.pending = None
            raise pending


class ThreadHub:
    """The threads of one schedule, and the processes they belong to."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.processes: dict[str, SimProcess] = {}
        self.threads: list[SimThread] = []
        self.threads_by_ident: dict[int, SimThread] = {}
        self.current: SimThread | None = None
        self.leaked: list[str] = []
        self._names = itertools.count(1)
        self.net = SimNet(self)
        self.singletons: list[Any] = []  # the PerProcess objects swapped per process
        self.entered: SimProcess | None = None

    def process(self, name: str) -> SimProcess:
        proc = self.processes.get(name)
        if proc is None:
            proc = self.processes[name] = SimProcess(name, self)
        return proc

    def spawn(
        self, process: str, name: str, target: Callable[[], object], *, main: bool = False
    ) -> SimThread:
        """A new thread of ``process``, runnable now (it starts when the world steps it)."""
        thread = SimThread(self, self.process(process), name, target, main=main)
        self.threads.append(thread)
        self.world.loops.append(thread)
        return thread

    def me(self) -> SimThread:
        thread = self.threads_by_ident.get(_get_ident())
        if thread is None:
            raise RuntimeError("a blocking call outside the simulation's threads")
        return thread

    def enter(self, proc: SimProcess) -> None:
        """``proc``'s engine state in the modules (the world's) and its singletons."""
        self.world.switch(proc.name)
        if self.entered is proc:
            return
        if self.entered is not None:
            for single in self.singletons:
                self.entered.singletons[id(single)] = single._value
        for single in self.singletons:
            single._value = proc.singletons.get(id(single))
        self.entered = proc

    def close(self) -> None:
        for thread in list(self.threads):
            if not thread.done:
                self.enter(thread.proc)
                thread.close()
        if self.entered is not None:
            for single in self.singletons:
                single._value = None
        self.entered = None

    # -- the primitives (called on the simulation's threads) --------------------------------

    def sleep(self, seconds: float) -> None:
        thread = self.threads_by_ident.get(_get_ident())
        if thread is None:
            _real_sleep(seconds)
            return
        thread.block("sleep", None, self._after(seconds))

    def _after(self, seconds: float) -> float:
        """The true time ``seconds`` from now; later than now for any positive ``seconds``
        (a tiny rest added to now can round to now: the waiter would spin)."""
        now = self.world.clock.now
        if seconds <= 0.0:
            return now
        return max(now + seconds, math.nextafter(now, math.inf))

    def wait(self, what: str, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``ready()`` or ``timeout`` seconds (None: none); ``ready()`` after."""
        if ready():
            return True
        if timeout is not None and timeout <= 0.0:
            return False
        until = None if timeout is None else self._after(timeout)
        self.me().block(what, ready, until)
        return ready()


# -- sockets -----------------------------------------------------------------------------------


class SimSocket:
    """An in-memory non-blocking socket: a client connection over the world's network (made by
    ``connect_ex``), or one end of a local ``socketpair``."""

    def __init__(self, net: SimNet, family: int = 2) -> None:
        self.net = net
        self.family = family
        self.fd = net.new_fd(self)
        self.inbox = bytearray()
        self.eof = False
        self.reset: BaseException | None = None
        self.error = 0  # SO_ERROR of a failed connect
        self.connecting = False
        self.connected = False
        self.closed = False
        self.conn: Any = None  # the world's connection (a client connection)
        self.peer: SimSocket | None = None  # the other end (a socketpair)

    # what Connection uses
    def setblocking(self, flag: bool) -> None:
        pass

    def setsockopt(self, *args: Any) -> None:
        pass

    def fileno(self) -> int:
        return -1 if self.closed else self.fd

    def connect_ex(self, sockaddr: Any) -> int:
        _host, port = sockaddr
        self.connecting = True
        self.net.connect(self, int(port))
        return errno.EINPROGRESS

    def getsockopt(self, level: int, option: int) -> int:
        return self.error

    def getpeername(self) -> Any:
        if not self.connected:
            raise OSError(errno.ENOTCONN, "not connected")
        return ("127.0.0.1", 0)

    def send(self, data: bytes | bytearray | memoryview) -> int:
        if self.closed:
            raise OSError(errno.EBADF, "closed")
        if self.reset is not None:
            raise ConnectionResetError(errno.ECONNRESET, "simulated reset")
        if self.eof:
            raise BrokenPipeError(errno.EPIPE, "broken pipe")
        if self.peer is not None:
            self.peer.inbox += data
            return len(data)
        if not self.connected:
            raise BlockingIOError(errno.EAGAIN, "not connected yet")
        self.net.send(self, bytes(data))
        return len(data)

    def recv(self, size: int) -> bytes:
        if self.closed:
            raise OSError(errno.EBADF, "closed")
        if self.inbox:
            data = bytes(self.inbox[:size])
            del self.inbox[:size]
            return data
        if self.reset is not None:
            raise ConnectionResetError(errno.ECONNRESET, "simulated reset")
        if self.eof:
            return b""
        raise BlockingIOError(errno.EAGAIN, "no data")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.net.fds.pop(self.fd, None)
        if self.conn is not None:
            self.net.close(self)
        if self.peer is not None:
            self.peer.eof = True

    def pending(self) -> int:
        return 0

    # readiness, as poll would report it
    def events_ready(self, mask: int) -> int:
        if self.closed:
            return 0
        ready = 0
        if mask & (POLLIN | POLLPRI) and (
            self.inbox or self.eof or self.reset is not None or self.error
        ):
            ready |= POLLIN
        if mask & POLLOUT and (self.connected or self.error or self.peer is not None):
            ready |= POLLOUT
        return ready

    # the world's network delivers here (as the protocol of an asyncio connection)
    def data_received(self, data: bytes) -> None:
        self.inbox += data

    def connection_lost(self, exc: BaseException | None) -> None:
        if exc is None:
            self.eof = True
        else:
            self.reset = exc


class SimNet:
    """The sockets of one schedule, by descriptor, and their link to the world's network."""

    def __init__(self, hub: ThreadHub) -> None:
        self.hub = hub
        self.fds: dict[int, SimSocket] = {}
        self._next = itertools.count(100)

    def new_fd(self, sock: SimSocket) -> int:
        fd = next(self._next)
        self.fds[fd] = sock
        return fd

    def connect(self, sock: SimSocket, port: int) -> None:
        world = self.hub.world
        from .world import PORT, _Conn

        process = self.hub.me().proc
        index = port - PORT

        def done() -> None:
            sock.connecting = False
            if sock.closed:
                return
            server = world.servers[index]
            if not server.up or (process.name, index) in world.cut or process.name in world.dead:
                sock.error = errno.ECONNREFUSED
                return
            conn = _Conn(len(world.conns), process, sock, index, server.connect())  # type: ignore[arg-type]
            world.conns.append(conn)
            world.history.contacts.setdefault((process.name, index), world.clock.now)
            sock.conn = conn
            sock.connected = True

        world.at(world.clock.now + world._delay(), done)  # the handshake's round trip

    def send(self, sock: SimSocket, data: bytes) -> None:
        conn = sock.conn
        if not conn.closed:
            self.hub.world._send_up(conn, data)

    def close(self, sock: SimSocket) -> None:
        self.hub.world._close(sock.conn, by_client=True)

    def socketpair(self) -> tuple[SimSocket, SimSocket]:
        a, b = SimSocket(self, 1), SimSocket(self, 1)
        a.peer, b.peer = b, a
        a.connected = b.connected = True
        return a, b

    def ready(self, watched: dict[int, int]) -> list[tuple[int, int]]:
        """The descriptors of ``watched`` ({fd: poll mask}) ready now, in registration order
        (a descriptor closed under the watch reports as ready, as a hung-up socket does)."""
        found = []
        fds = self.fds
        for fd, mask in watched.items():
            sock = fds.get(fd)
            if sock is None:
                found.append((fd, POLLIN))
                continue
            got = sock.events_ready(mask)
            if got:
                found.append((fd, got))
        return found


class _SocketModule:
    """What the library's sync modules use of ``socket``: sockets on the world's network."""

    def __init__(self, hub: ThreadHub) -> None:
        import socket as real

        self._real = real
        self._hub = hub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def socket(self, family: int = 2, kind: int = 1, *args: Any) -> SimSocket:
        return SimSocket(self._hub.net, family)

    def socketpair(self, *args: Any) -> tuple[SimSocket, SimSocket]:
        return self._hub.net.socketpair()

    def getaddrinfo(self, host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        return [(self._real.AF_INET, self._real.SOCK_STREAM, 6, "", (host, port))]


class SimPoll:
    """``select.poll()`` on the world's sockets and clock."""

    def __init__(self, hub: ThreadHub) -> None:
        self._hub = hub
        self._watched: dict[int, int] = {}

    def register(self, fd: Any, mask: int = POLLIN | POLLPRI | POLLOUT) -> None:
        self._watched[fd if isinstance(fd, int) else fd.fileno()] = mask

    def modify(self, fd: Any, mask: int) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if fd not in self._watched:
            raise FileNotFoundError(errno.ENOENT, "not registered")
        self._watched[fd] = mask

    def unregister(self, fd: Any) -> None:
        del self._watched[fd if isinstance(fd, int) else fd.fileno()]

    def poll(self, timeout_ms: float | None = None) -> list[tuple[int, int]]:
        net = self._hub.net
        watched = self._watched
        found = net.ready(watched)
        if found or (timeout_ms is not None and timeout_ms == 0):
            return found
        timeout = None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000.0
        self._hub.wait("poll", lambda: bool(net.ready(watched)), timeout)
        return net.ready(watched)


class _SelectModule:
    def __init__(self, hub: ThreadHub) -> None:
        import select as real

        self._real = real
        self._hub = hub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def poll(self) -> SimPoll:
        return SimPoll(self._hub)


def _poll_mask(events: int) -> int:
    mask = 0
    if events & selectors.EVENT_READ:
        mask |= POLLIN
    if events & selectors.EVENT_WRITE:
        mask |= POLLOUT
    return mask


class SimSelector:
    """``selectors.DefaultSelector()`` on the world's sockets and clock."""

    def __init__(self, hub: ThreadHub) -> None:
        self._hub = hub
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd < 0:
            raise ValueError(f"invalid file descriptor {fd}")
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd not in self._keys:
            raise KeyError(f"{fileobj!r} is not registered")
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def _ready(self) -> list[tuple[selectors.SelectorKey, int]]:
        watched = {fd: _poll_mask(key.events) for fd, key in self._keys.items()}
        out = []
        for fd, got in self._hub.net.ready(watched):
            events = (selectors.EVENT_READ if got & POLLIN else 0) | (
                selectors.EVENT_WRITE if got & POLLOUT else 0
            )
            key = self._keys[fd]
            out.append((key, (events & key.events) or key.events))
        return out

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        found = self._ready()
        if found or (timeout is not None and timeout <= 0):
            return found
        self._hub.wait("select", lambda: bool(self._ready()), timeout)
        return self._ready()

    def close(self) -> None:
        self._keys.clear()

    def get_map(self) -> dict[int, selectors.SelectorKey]:
        return self._keys

    def __enter__(self) -> SimSelector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SelectorsModule:
    def __init__(self, hub: ThreadHub) -> None:
        self._hub = hub

    def __getattr__(self, name: str) -> Any:
        return getattr(selectors, name)

    def DefaultSelector(self) -> SimSelector:
        return SimSelector(self._hub)


# -- threads, conditions, the renewal pool ----------------------------------------------------


class SimCondition:
    """``threading.Condition()`` whose ``wait`` blocks on the world's clock. Its lock is a
    real one (only one thread runs at a time, and none yields while holding it)."""

    def __init__(self, hub: ThreadHub) -> None:
        self._hub = hub
        self._lock = threading.RLock()
        self._generation = 0

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def notify(self, n: int = 1) -> None:
        self._generation += 1

    def notify_all(self) -> None:
        self._generation += 1

    def wait(self, timeout: float | None = None) -> bool:
        seen = self._generation
        self._lock.release()
        try:
            return self._hub.wait("condition", lambda: self._generation != seen, timeout)
        finally:
            self._lock.acquire()


class _Threading:
    """What the timers and background modules use of ``threading``: threads the world
    schedules, and conditions on its clock."""

    def __init__(self, hub: ThreadHub) -> None:
        self._hub = hub

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)

    def Condition(self) -> SimCondition:
        return SimCondition(self._hub)

    def Thread(
        self, target: Callable[[], object], name: str = "thread", daemon: bool = True
    ) -> _ThreadHandle:
        return _ThreadHandle(self._hub, target, name)


class _ThreadHandle:
    def __init__(self, hub: ThreadHub, target: Callable[[], object], name: str) -> None:
        self._hub = hub
        self._target = target
        self.name = name

    def start(self) -> None:
        hub = self._hub
        proc = hub.me().proc
        name = f"{proc.name}/{self.name}"
        hub.world.note(f"{name} thread started")
        hub.spawn(proc.name, name, self._target)


class SimPool:
    """The renewal pool (``ThreadPoolExecutor``): up to ``workers`` threads of the world, made
    as work comes, taking jobs in order."""

    def __init__(self, hub: ThreadHub, workers: int, prefix: str) -> None:
        self._hub = hub
        self._workers = workers
        self._prefix = prefix
        self._queue: list[tuple[int, Callable[[], object]]] = []
        self._seq = itertools.count()
        self._threads = 0
        self._idle = 0

    def submit(self, action: Callable[[], object]) -> None:
        heapq.heappush(self._queue, (next(self._seq), action))
        if self._idle == 0 and self._threads < self._workers:
            self._threads += 1
            hub = self._hub
            proc = hub.me().proc
            name = f"{proc.name}/{self._prefix}_{self._threads - 1}"
            hub.world.note(f"{name} thread started")
            hub.spawn(proc.name, name, self._work)

    def _work(self) -> None:
        hub = self._hub
        while True:
            if not self._queue:
                self._idle += 1
                try:
                    hub.wait("pool", lambda: bool(self._queue), None)
                finally:
                    self._idle -= 1
                continue
            _, action = heapq.heappop(self._queue)
            # as the executor: the job's future holds its error; nobody reads it
            with contextlib.suppress(Exception):
                action()


@contextmanager
def patched_sync(hub: ThreadHub) -> Iterator[None]:
    """The library's sync modules on the world's sockets, clock and threads, inside."""
    from fencelock._sync import background, connection, driver, renewal

    saved: list[tuple[Any, str, Any]] = []

    def put(module: Any, name: str, value: Any) -> None:
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    sockets, select_, selectors_ = _SocketModule(hub), _SelectModule(hub), _SelectorsModule(hub)
    threading_ = _Threading(hub)
    put(connection, "socket", sockets)
    put(connection, "select", select_)
    put(connection, "selectors", selectors_)
    put(driver, "select", select_)
    put(driver, "_local", threading.local())  # each schedule's threads make their pollers
    put(background, "socket", sockets)
    put(background, "selectors", selectors_)
    put(background, "threading", threading_)
    put(renewal, "threading", threading_)
    put(
        renewal,
        "ThreadPoolExecutor",
        lambda workers, thread_name_prefix="pool": SimPool(hub, workers, thread_name_prefix),
    )
    put(time, "sleep", hub.sleep)
    hub.singletons = [renewal.scheduler, background.background]
    saved_make = background.background._make
    background.background._make = lambda: _ordered(saved_make())
    saved.append((background.background, "_make", saved_make))
    for single in hub.singletons:
        saved.append((single, "_value", single._value))
        single._value = None
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


class OrderedSet:
    """A set that iterates in insertion order (the background's watched servers: a set of
    objects iterates in the order of their addresses, which differ from run to run)."""

    def __init__(self) -> None:
        self._items: dict[Any, None] = {}

    def add(self, item: Any) -> None:
        self._items[item] = None

    def discard(self, item: Any) -> None:
        self._items.pop(item, None)

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


def _ordered(background: Any) -> Any:
    background._watched = OrderedSet()
    return background
