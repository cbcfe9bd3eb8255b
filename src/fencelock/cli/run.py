"""``fencelock run``: a distributed ``flock(1)``. The command runs while the lock is held and
renewed; it gets every fatal signal the wrapper gets, and dies with the wrapper (parent-death
signal and a watchdog in its process group); on a loss its whole group is signalled.

Why this module is longer than 600 lines: it is one supervisor (start, forward, linger, reap)
whose parts share one state and one set of signal handlers."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from .. import (
    Lease,
    Lock,
    LockLost,
    NotAcquired,
    Unavailable,
)
from ..options import DEFAULT_WAIT
from .common import (
    DEFAULT_SERVER,
    EX_LOST,
    EX_UNAVAILABLE,
    PROG,
    log,
    read_failures,
    resolve_servers,
    say,
    signal_name,
)

#: Seconds ``fencelock run`` waits between looks at the child, the lost event and signals.
POLL_INTERVAL = 0.05

#: The first such wait (s), doubled at each look up to :data:`POLL_INTERVAL`: a short command
#: (``-- true``) is seen to end about when it does, not up to a whole interval later.
FIRST_POLL_INTERVAL = 0.001


#: Longest single wait call while servers fail (``fencelock run``: its acquire calls then, so
#: that each one's votes are read; ``fencelock elect``: every ``campaign`` wait): a signal
#: while waiting is acted on within about this long. Against a holder, ``run`` waits in one
#: ``acquire`` call, which a queued signal cancels (see :meth:`RunState.is_set`).
ACQUIRE_SLICE = 0.25


#: Seconds between SIGTERM and SIGKILL after a loss, unless ``--grace`` says otherwise.
DEFAULT_GRACE = 5.0


def _fatal_signals() -> tuple[int, ...]:
    """Every signal whose default action ends a process, that a process can catch, and that
    is not a fault of the process itself (SIGSEGV, SIGBUS, ...: those are not sent to ask it
    to stop)."""
    names = (
        "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE",
        "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ", "SIGIO", "SIGPWR", "SIGSTKFLT",
    )  # fmt: skip
    found = {int(getattr(signal, name)) for name in names if hasattr(signal, name)}
    if hasattr(signal, "SIGRTMIN") and hasattr(signal, "SIGRTMAX"):
        found.update(range(int(signal.SIGRTMIN), int(signal.SIGRTMAX) + 1))
    return tuple(sorted(found))


#: The signals ``run`` and ``elect`` catch (unless ignored when they start, as SIGHUP under
#: ``nohup`` or SIGPIPE, which Python ignores): each is forwarded to the command's process
#: group, so that the wrapper never dies of one and leaves the command running unlocked.
FATAL_SIGNALS: tuple[int, ...] = _fatal_signals()


# The command is started through this small program (``python -I -S -c``), in a session of
# its own: it asks the kernel to SIGKILL it when the fencelock process dies (Linux), starts a
# watchdog in the command's process group (not a child of the command: double fork) that
# SIGKILLs the whole group when the fencelock process's end of a pipe closes without a word
# (it died, SIGKILL included), then execs the command in its own pid. An exec failure is
# reported as an errno on a close-on-exec pipe, as subprocess does.
# argv: watch-fd report-fd parent-pid signals LC_CTYPE-as-given CMD ARGS...
_LAUNCHER = r"""
import os, signal, sys
watch, report, parent = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ignored = [int(n) for n in sys.argv[4].split(",") if n]
ctype, argv = sys.argv[5], sys.argv[6:]
os.set_inheritable(report, False)
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except Exception:
        pass
if os.getppid() != parent:
    os.killpg(0, signal.SIGKILL)
first = os.fork()
if first == 0:
    if os.fork() == 0:
        for n in ignored:
            try:
                signal.signal(n, signal.SIG_IGN)
            except (OSError, ValueError):
                pass
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, watch)
        os.closerange(watch + 1, 65536)
        try:
            word = os.read(watch, 1)
        except OSError:
            word = b""
        if not word:
            os.killpg(0, signal.SIGKILL)
    os._exit(0)
os.waitpid(first, 0)
os.close(watch)
if ctype.startswith("="):
    os.environ["LC_CTYPE"] = ctype[1:]
else:
    os.environ.pop("LC_CTYPE", None)
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    os.write(report, str(exc.errno or 0).encode())
    os._exit(127)
"""


@dataclass
class RunState:
    """The signals of :data:`FATAL_SIGNALS` seen by ``fencelock run``/``elect``: the handler
    only queues them, and the code that polls acts on them (before the command: release and
    exit 128 + N; while it runs: forward them to its process group, then release once it
    ended). The handler never raises, so no library call is ever cut short: an acquire
    interrupted on its way back with a grant would leave the lock held to its ttl.
    """

    pending: list[int] = field(default_factory=list)
    #: The loss was told on stderr already (by the supervisor, when it stopped the command):
    #: the closing line then does not tell it again.
    loss_told: bool = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)

    def is_set(self) -> bool:
        """Whether a signal is queued: the state is the ``cancel`` flag of the acquire (a
        flag, not a :class:`threading.Event`: the handler takes no lock, so it cannot
        deadlock on one its own thread holds)."""
        return bool(self.pending)

    def interrupted(self, prog: str) -> int:
        sig = self.pending[0]
        say(prog, f"interrupted by {signal_name(sig)} before the command started")
        return 128 + sig

    def catch(self) -> dict[int, Any]:
        """Queue every signal of :data:`FATAL_SIGNALS` from now on, except those ignored
        already (``nohup``'s SIGHUP stays ignored); the previous handlers, to restore."""
        previous: dict[int, Any] = {}
        for sig in FATAL_SIGNALS:
            try:
                if signal.getsignal(sig) == signal.SIG_IGN:
                    continue
                previous[sig] = signal.signal(sig, self.handler)
            except (OSError, ValueError):  # pragma: no cover - reserved by the platform
                continue
        return previous


class LossLogFilter(logging.Filter):
    """Drops the library's own "lease on K lost" record while ``run``/``elect`` supervise a
    command: they tell the loss themselves, once, with what they did about it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "fencelock.lock" and record.msg == "lease on %r lost: %s")


@contextlib.contextmanager
def own_loss_messages() -> Iterator[None]:
    """While inside: the library's loss record is not printed (see :class:`LossLogFilter`)."""
    target = logging.getLogger("fencelock.lock")
    only = LossLogFilter()
    target.addFilter(only)
    try:
        yield
    finally:
        target.removeFilter(only)


def restore_handlers(previous: dict[int, Any]) -> None:
    for sig, old in previous.items():
        signal.signal(sig, signal.SIG_DFL if old is None else old)


def child_exit_code(returncode: int) -> int:
    """A shell's view: a child killed by signal N gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def cmd_run(args: argparse.Namespace) -> int:
    prog = f"{PROG} run"
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    lock_kwargs: dict[str, Any] = {"purpose": args.purpose}
    if args.ttl is not None:
        lock_kwargs["ttl"] = args.ttl
    lock = Lock(servers, args.key, **lock_kwargs)  # ConfigError (64) before any I/O
    return supervised(
        lambda state: _run_locked(prog, lock, args, state, Watcher(prog, servers, args.verbose)),
        lock.close,
    )


def supervised(body: Callable[[RunState], int], close: Callable[[], None]) -> int:
    """``body(state)`` with the signals caught into ``state`` (installed before the acquire:
    from then on a signal is queued, never lost or raised) and the loss messages ours;
    afterwards the handlers are restored and ``close()`` is called (run and elect alike)."""
    state = RunState()
    previous = state.catch()
    try:
        with own_loss_messages():
            return body(state)
    finally:
        restore_handlers(previous)
        close()


class PermanentFailure(Exception):
    """The servers' failures that deny a majority will not go away by waiting (a refused
    password, no such database, an unknown host, TLS spoken to a plain port)."""


def _plain_resp(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether ``host:port`` answers a plain-text ``PING`` (so it is no TLS port): one short
    connection, bounded by ``timeout`` seconds; False on any failure."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS"))


class Watcher:
    """Reads each slice's :class:`Unavailable` (or :class:`NotAcquired`): raises
    :class:`PermanentFailure` once the permanent failures alone deny a majority; under ``-v``
    says how many servers fail whenever that changes. A ``rediss://`` server that timed out is
    probed once with a plain ``PING`` (a plain port never answers a TLS handshake)."""

    def __init__(self, prog: str, servers: list[str], verbose: int) -> None:
        self.prog = prog
        self.verbose = verbose
        self.tls: dict[str, tuple[str, int]] = {}
        for url in servers:
            parts = urlsplit(url)
            if parts.scheme.lower() == "rediss" and parts.hostname:
                self.tls[f"{parts.hostname}:{parts.port or 6379}"] = (
                    parts.hostname,
                    parts.port or 6379,
                )
        self.plain: set[str] = set()
        self.probed: set[str] = set()
        self.last: str | None = None

    def _probe(self, exc: NotAcquired | Unavailable) -> None:
        for vote in exc.votes:
            if vote.outcome != "error" or not isinstance(vote.cause, TimeoutError):
                continue
            where = vote.server.split("/", 1)[0]
            if where in self.tls and vote.server not in self.probed:
                self.probed.add(vote.server)
                if _plain_resp(*self.tls[where]):
                    self.plain.add(vote.server)

    def see(self, exc: NotAcquired | Unavailable) -> None:
        if self.tls:
            self._probe(exc)
        reading = read_failures(exc.votes, plain_ports=frozenset(self.plain))
        if reading.servers and reading.hopeless:
            raise PermanentFailure(reading.give_up_line()) from exc
        if self.verbose > 0 and reading.failing:
            line = reading.progress_line()
            if line != self.last:
                self.last = line
                say(self.prog, line)


def _acquire(
    lock: Lock, wait: float, state: RunState, watcher: Watcher | None = None
) -> Lease | None:
    """Acquire within ``wait`` seconds: ``None`` when a signal came before a grant.

    A first attempt tells whether others hold the lock; if so, the rest of the wait is one
    ``acquire`` call (one waiter, keeping its place in line), which a queued signal cancels.
    While too few servers answer, calls of at most :data:`ACQUIRE_SLICE` seconds follow
    each other, so that ``watcher`` reads each one's votes.

    Raises the last call's :class:`NotAcquired` or :class:`Unavailable` at the deadline, and
    :class:`PermanentFailure` (from ``watcher``) as soon as waiting cannot help.
    """
    deadline = time.monotonic() + wait
    patience = 0.0
    while not state.pending:
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            return lock.acquire(min(remaining, patience), cancel=state)
        except (NotAcquired, Unavailable) as exc:
            if watcher is not None:
                watcher.see(exc)
            if time.monotonic() >= deadline:
                raise
            patience = math.inf if isinstance(exc, NotAcquired) else ACQUIRE_SLICE
    return None


def _run_locked(
    prog: str, lock: Lock, args: argparse.Namespace, state: RunState, watcher: Watcher
) -> int:
    wait = 0.0 if args.nonblock else DEFAULT_WAIT if args.wait is None else args.wait
    try:
        lease = _acquire(lock, wait, state, watcher)
    except PermanentFailure as exc:
        if state.pending:
            return state.interrupted(prog)
        say(prog, f"Unavailable: {exc}")
        return EX_UNAVAILABLE
    except NotAcquired as exc:
        if state.pending:
            return state.interrupted(prog)
        if not args.nonblock or args.verbose > 0:  # flock -n: a conflict is silent
            say(prog, f"not acquired: {exc}")
        return int(args.conflict_exit_code)
    except Unavailable:
        if state.pending:
            return state.interrupted(prog)
        raise
    if lease is None:
        return state.interrupted(prog)
    log.info("acquired %r fence=%d token=%s…", lock.key, lease.fence, lease.token[:8])
    if state.pending:  # came with the grant: give the lock back at once
        _release(prog, lease)
        return state.interrupted(prog)
    returncode = run_child(prog, lease, args, state, {})
    if returncode is None:  # it could not start
        _release(prog, lease)
        return int(args.start_failure)
    if not lease.lost.is_set() and args.at_least is not None:
        _linger(prog, lease, args.at_least, state)
    released_ok = _release(prog, lease)
    if lease.lost.is_set() or not released_ok:
        status = f"command exit status {child_exit_code(returncode)}; exiting {EX_LOST}"
        if state.loss_told:
            say(prog, status)
        else:
            reason = lease.lost_reason or "it had expired or been taken when the command ended"
            say(prog, f"lease on {lock.key!r} lost while the command ran ({reason}); {status}")
        return EX_LOST
    return child_exit_code(returncode)


def run_child(
    prog: str,
    lease: Lease,
    args: argparse.Namespace,
    state: RunState,
    extra_env: dict[str, str],
    *,
    renew: bool = True,
) -> int | None:
    """Start ``args.command`` in a process group of its own (so that a loss reaches its whole
    tree), renew the lease, supervise it; its return code, or None when it could not start
    (``args.start_failure`` then says the exit status)."""
    env = dict(os.environ)
    env.update(
        FENCELOCK_FENCE=str(lease.fence), FENCELOCK_TOKEN=lease.token, FENCELOCK_KEY=lease.key
    )
    env.update(extra_env)
    try:
        child = _start(args.command, env)
    except OSError as exc:
        say(prog, f"cannot run {args.command[0]!r}: {exc.strerror or exc}")
        args.start_failure = 126 if isinstance(exc, PermissionError) else 127
        return None
    # signals queued from here on are the child's: _supervise forwards them
    lost = threading.Event()
    lease.on_lost(lambda _lease: lost.set())
    if args.on_at_risk is not None:
        lease.on_at_risk(lambda at_risk: _at_risk_hook(prog, at_risk, args.on_at_risk))
    if renew:
        try:
            lease.keep_alive()
        except LockLost:
            lost.set()  # expired already (a very short ttl): the child is stopped below
    return _supervise(prog, child, lease, lost, state, args.grace)


@dataclass
class _Child:
    """The command's process (leader of its own session and process group) and the write end
    of its watchdog's pipe (None without a watchdog)."""

    process: subprocess.Popen[bytes]
    watch: int | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def dismiss_watchdog(self) -> None:
        """The command ended while we live: tell its watchdog to leave the group alone."""
        if self.watch is None:
            return
        with contextlib.suppress(OSError):  # the watchdog is gone already (group killed)
            os.write(self.watch, b"x")
        os.close(self.watch)
        self.watch = None


def _start(command: list[str], env: dict[str, str]) -> _Child:
    """Start ``command`` in a session of its own through :data:`_LAUNCHER`, so that it and
    its whole process group die with this process, even of SIGKILL.

    Raises:
        OSError: the command could not be started (its errno: not found, not executable).
    """
    if not sys.executable:  # pragma: no cover - an embedded interpreter: no watchdog
        return _Child(subprocess.Popen(command, env=env, start_new_session=True), None)
    watch_r, watch_w = os.pipe()
    report_r, report_w = os.pipe()
    ctype = env.get("LC_CTYPE")
    launcher = [
        sys.executable, "-I", "-S", "-c", _LAUNCHER, str(watch_r), str(report_w),
        str(os.getpid()), ",".join(map(str, FATAL_SIGNALS)),
        "-" if ctype is None else f"={ctype}", *command,
    ]  # fmt: skip
    try:
        process = subprocess.Popen(
            launcher, env=env, start_new_session=True, pass_fds=(watch_r, report_w)
        )
    except BaseException:
        os.close(watch_w)
        os.close(report_r)
        raise
    finally:
        os.close(watch_r)
        os.close(report_w)
    try:
        with os.fdopen(report_r, "rb") as report:
            word = report.read()  # EOF: the exec succeeded (or the launcher died)
    except BaseException:
        os.close(watch_w)
        raise
    if word:
        process.wait()
        os.close(watch_w)
        errno = int(word) if word.isdigit() else 0
        raise OSError(errno, os.strerror(errno) if errno else "cannot start it")
    return _Child(process, watch_w)


def _at_risk_hook(prog: str, lease: Lease, command: str) -> None:
    """Run the ``--on-at-risk`` command, not waited for (it runs on a renewal thread)."""
    env = dict(os.environ)
    env.update(
        FENCELOCK_KEY=lease.key,
        FENCELOCK_FENCE=str(lease.fence),
        FENCELOCK_REMAINING=f"{lease.remaining():.3f}",
    )
    try:
        subprocess.Popen(command, shell=True, env=env)
    except OSError as exc:
        say(prog, f"--on-at-risk: cannot run {command!r}: {exc}")


def _signal_group(child: _Child, sig: int) -> None:
    """Signal the child's whole process group (it leads one of its own)."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(child.pid, sig)


def _group_alive(child: _Child) -> bool:
    try:
        os.killpg(child.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id of another user's group
        return False
    return True


def _reap_group(prog: str, child: _Child, kill_at: float) -> None:
    """After a loss the child exited: give the rest of its group until ``kill_at`` to go,
    then SIGKILL it.

    Once a probe finds the group gone, it is never probed or signalled again: its id is then
    free, and may already be another process group's.
    """
    while True:
        if not _group_alive(child):
            return
        if time.monotonic() >= kill_at:
            break
        time.sleep(POLL_INTERVAL)
    say(prog, f"process group {child.pid} still running; sending SIGKILL")
    _signal_group(child, signal.SIGKILL)


def _linger(prog: str, lease: Lease, at_least: float, state: RunState) -> None:
    """``--at-least``: keep the (renewed) lock until ``at_least`` s after the acquisition;
    a signal, or a loss, ends the wait early."""
    until = lease.acquired_at + at_least
    if until <= time.monotonic():
        return
    log.info("keeping %r for %.3f s more (--at-least)", lease.key, until - time.monotonic())
    while not state.pending and not lease.lost.is_set():
        left = until - time.monotonic()
        if left <= 0:
            return
        lease.lost.wait(min(left, POLL_INTERVAL))
    if state.pending:
        say(prog, f"interrupted by {signal_name(state.pending[0])}: releasing now")


def _supervise(
    prog: str,
    child: _Child,
    lease: Lease,
    lost: threading.Event,
    state: RunState,
    grace: float,
) -> int:
    """Wait for the child; forward queued signals to its process group; on loss SIGTERM the
    group, SIGKILL it after ``grace``; log when the lease is at risk and when it recovers.

    Every wait is at most POLL_INTERVAL seconds, so signals and the loss are acted on promptly.
    """
    term_at: float | None = None
    killed = False
    at_risk = False
    pause = FIRST_POLL_INTERVAL
    while True:
        returncode = child.poll()
        if returncode is not None:
            child.dismiss_watchdog()
            if term_at is not None and not killed:
                _reap_group(prog, child, term_at + grace)  # what the child left behind
            return returncode
        while state.pending:
            sig = state.pending.pop(0)
            log.info("forwarding %s to process group %d", signal_name(sig), child.pid)
            _signal_group(child, sig)
        if lease.at_risk.is_set() != at_risk:
            at_risk = not at_risk
            if at_risk:
                say(
                    prog,
                    f"lease on {lease.key!r} at risk: a renewal was not confirmed "
                    f"({lease.remaining():.3f} s of validity left)",
                )
            elif not lost.is_set():
                say(prog, f"lease on {lease.key!r} renewed again: no longer at risk")
        if lost.is_set() and term_at is None:
            say(
                prog,
                f"lease on {lease.key!r} lost ({lease.lost_reason}); sending SIGTERM to "
                f"process group {child.pid}, SIGKILL in {grace:g} s",
            )
            state.loss_told = True
            _signal_group(child, signal.SIGTERM)
            term_at = time.monotonic()
        if term_at is not None and not killed and time.monotonic() - term_at >= grace:
            if child.poll() is None:
                say(prog, f"pid {child.pid} still running after {grace:g} s; sending SIGKILL")
            _signal_group(child, signal.SIGKILL)
            killed = True
        if term_at is None:
            lost.wait(pause)
        else:
            time.sleep(pause)
        pause = min(pause * 2, POLL_INTERVAL)


def _release(prog: str, lease: Lease) -> bool:
    """Release after the child ended; False when the lease turned out to be lost."""
    try:
        lease.release()
    except LockLost:
        return False
    except Unavailable as exc:
        say(prog, f"warning: release not confirmed, the lock expires by its ttl: {exc}")
    return True
