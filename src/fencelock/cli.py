"""The ``fencelock`` command (also ``python -m fencelock``): a thin shell over the public API.

``main(argv) -> int`` parses the command line and maps exceptions to exit codes through one
table (:data:`EXIT_CODES`). Subcommands: ``run`` (a distributed ``flock(1)``), ``elect`` (run a
command while elected leader), ``status``, ``release``, and the lazily imported ``demo``,
``chaos``, ``bench`` and ``doctor``.

Exit codes (``sysexits.h`` where one fits):

- 0 success; for ``run`` and ``elect``: the child's own code (128 + N when it died of signal N);
- 64 usage error (bad flag, bad value, malformed URL); 69 servers unavailable;
- 72 the lease (``elect``: leadership) was lost while the command ran (or was not held by the
  token given); the command's whole process group is signalled;
- 75 not acquired in time (``run --conflict-exit-code`` changes it).

Servers: repeated ``--server URL``, else ``$FENCELOCK_SERVERS`` (comma-separated), else
``redis://127.0.0.1:6379/0`` for ``run``, ``status``, ``release`` and ``doctor`` (``bench``
starts an embedded server instead). No password from a URL is ever printed or logged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NoReturn

from . import (
    Client,
    ConfigError,
    FencelockError,
    Lease,
    Lock,
    LockLost,
    NotAcquired,
    Unavailable,
    admin,
)
from .options import DEFAULT_WAIT, check_key, check_url, seconds

log = logging.getLogger("fencelock.cli")

PROG = "fencelock"
ENV_SERVERS = "FENCELOCK_SERVERS"
DEFAULT_SERVER = "redis://127.0.0.1:6379/0"

EX_OK = 0
EX_USAGE = 64
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_LOST = 72
EX_TEMPFAIL = 75

#: The one table from exceptions to exit codes; the first matching class wins.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, EX_USAGE),
    (NotAcquired, EX_TEMPFAIL),
    (Unavailable, EX_UNAVAILABLE),
    (LockLost, EX_LOST),
)

#: Seconds ``fencelock run`` waits between looks at the child, the lost event and signals.
POLL_INTERVAL = 0.05
#: Longest single ``acquire`` call of ``fencelock run``: a signal while waiting is acted on
#: within about this long (the wait itself is ``--wait``, made of such calls).
ACQUIRE_SLICE = 0.25
#: Term lease of ``fencelock elect`` unless ``--ttl`` says otherwise (seconds): a dead leader is
#: replaced within about this long.
DEFAULT_TERM_TTL = 10.0
#: Seconds between SIGTERM and SIGKILL after a loss, unless ``--grace`` says otherwise.
DEFAULT_GRACE = 5.0
#: Per-server timeout (seconds) of the plain commands of ``status`` and ``release``.
ADMIN_TIMEOUT = admin.DEFAULT_TIMEOUT


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an exception, from :data:`EXIT_CODES` (70 if none matches)."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EX_SOFTWARE


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _say(prog: str, message: str) -> None:
    print(f"{prog}: {_one_line(message)}", file=sys.stderr, flush=True)


# -- argument parsing -----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors as one stderr line and exit status 64 (``--help`` stays 0)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EX_USAGE, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _duration(name: str, *, allow_zero: bool, allow_inf: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        try:
            return seconds(value, "value", allow_zero=allow_zero, allow_inf=allow_inf)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _int_in(name: str, low: int, high: int | None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"value must be {bound}, got {value}")
        return value

    parse.__name__ = name
    return parse


def _server_url(text: str) -> str:
    try:
        scheme, sep, rest = text.partition("://")
        if sep and scheme.lower().endswith("+cluster"):  # a whole cluster (Lock, doctor)
            check_url(f"{scheme[: -len('+cluster')]}://{rest}")
            return text
        return check_url(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _html_path(text: str) -> str:
    """``--html FILE``: a file to (over)write; its directory must exist."""
    if not text or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"not a file name: {text!r}")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"no such directory: {parent!r}")
    return text


def _fault_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("at least one fault name is needed")
    return names


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log to stderr: -v INFO, -vv DEBUG (default: WARNING)",
    )


def _add_servers(parser: argparse.ArgumentParser, default_text: str) -> None:
    parser.add_argument(
        "--server",
        dest="servers",
        action="append",
        type=_server_url,
        default=[],
        metavar="URL",
        help=f"a server URL, repeat for Redlock (else ${ENV_SERVERS}, else {default_text})",
    )


def _add_child_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grace",
        type=_duration("--grace", allow_zero=True),
        default=DEFAULT_GRACE,
        help="seconds between SIGTERM and SIGKILL to CMD's process group after the lease is "
        "lost (default: 5)",
    )
    parser.add_argument(
        "--on-at-risk",
        dest="on_at_risk",
        default=None,
        metavar="CMD",
        help="shell command run (not waited for) each time a renewal is not confirmed and the "
        "lease may soon be lost; it gets FENCELOCK_KEY, FENCELOCK_FENCE and "
        "FENCELOCK_REMAINING",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full command-line parser (every subcommand of DESIGN.md)."""
    parser = _Parser(
        prog=PROG,
        description="Distributed locks with fencing tokens on Redis and Valkey.",
        epilog="exit codes: 64 usage, 69 servers unavailable, 72 lease lost, "
        "75 not acquired in time; run: otherwise the command's own code",
    )
    parser.add_argument(
        "-v", "--verbose", dest="verbose_top", action="count", default=0, help=argparse.SUPPRESS
    )
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a command while holding the lock (a distributed flock)",
        description="Acquire the lock, run CMD holding it (renewed in the background), release "
        "it when CMD ends. CMD gets FENCELOCK_FENCE, FENCELOCK_TOKEN and FENCELOCK_KEY. If the "
        "lease is lost, CMD gets SIGTERM, then SIGKILL after --grace seconds, and the exit "
        "status is 72. SIGINT and SIGTERM are forwarded to CMD; one that arrives before CMD "
        "started releases the lock and exits 128 + the signal number.",
        usage="%(prog)s --key K [options] -- CMD [ARGS...]",
    )
    run.add_argument("--key", required=True, help="the lock name")
    run.add_argument(
        "--ttl",
        type=_duration("--ttl", allow_zero=False),
        default=None,
        help="lease length in seconds, renewed every ttl/3 (default: 30)",
    )
    waiting = run.add_mutually_exclusive_group()
    waiting.add_argument(
        "--wait",
        type=_duration("--wait", allow_zero=True, allow_inf=True),
        default=None,
        help="seconds to wait for the lock; 'inf' waits forever (default: 10)",
    )
    waiting.add_argument(
        "-n", "--nonblock", action="store_true", help="one attempt only (same as --wait 0)"
    )
    run.add_argument(
        "--conflict-exit-code",
        type=_int_in("--conflict-exit-code", 0, 255),
        default=EX_TEMPFAIL,
        metavar="N",
        help="exit status when the lock is not acquired in time (default: 75)",
    )
    run.add_argument(
        "--at-least",
        dest="at_least",
        type=_duration("--at-least", allow_zero=True),
        default=None,
        metavar="S",
        help="keep the lock until S seconds after it was acquired, even if CMD ends sooner "
        "(a short job must not run again elsewhere too soon)",
    )
    _add_child_options(run)
    run.add_argument("--purpose", default=None, help="text shown by 'fencelock status'")
    _add_servers(run, DEFAULT_SERVER)
    _add_common(run)
    run.set_defaults(handler=_cmd_run)

    elect = sub.add_parser(
        "elect",
        help="run a command while this process is the elected leader",
        description="Campaign for leadership of KEY under NAME (waiting as long as it takes), "
        "run CMD while leader (renewed in the background; CMD gets FENCELOCK_FENCE = the term "
        "number, FENCELOCK_TOKEN, FENCELOCK_KEY and FENCELOCK_LEADER), and hand leadership on "
        "at once when CMD ends (exit status: CMD's own). If leadership is lost, CMD's process "
        "group gets SIGTERM, then SIGKILL after --grace seconds, and the exit status is 72.",
        usage="%(prog)s --key K --name N [options] -- CMD [ARGS...]",
    )
    elect.add_argument("--key", required=True, help="the election name")
    elect.add_argument("--name", required=True, help="who leads, as leader() and status show")
    elect.add_argument(
        "--ttl",
        type=_duration("--ttl", allow_zero=False),
        default=None,
        help="term lease in seconds, renewed every ttl/3 (default: 10)",
    )
    _add_child_options(elect)
    _add_servers(elect, DEFAULT_SERVER)
    _add_common(elect)
    elect.set_defaults(handler=_cmd_elect)

    status = sub.add_parser(
        "status",
        help="who holds a lock, validity left per server, current fence",
        description="Read the lock's keys on every server (plain reads, nothing changes); "
        "for a semaphore its permits, for a read-write lock its readers and writer.",
    )
    status.add_argument("--key", required=True, help="the lock name")
    status.add_argument(
        "--kind",
        choices=admin.KINDS,
        default="auto",
        help="what the key is (default: auto, found by the keys present; a read-write lock "
        "held only by its writer then shows as a lock)",
    )
    status.add_argument(
        "--limit",
        type=_int_in("--limit", 1, None),
        default=None,
        help="a semaphore's limit, when known: reads its slots directly (implies --kind semaphore)",
    )
    _add_servers(status, DEFAULT_SERVER)
    status.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    _add_common(status)
    status.set_defaults(handler=_cmd_status)

    release = sub.add_parser(
        "release",
        help="free a stuck lock (by its token, or --force)",
        description="Compare-and-delete the lock on every server when it still holds TOKEN "
        "(exit 0 when released on a majority, 72 when not held by that token). --force "
        "deletes it whatever the token, and says on stderr what it removed.",
    )
    release.add_argument("--key", required=True, help="the lock name")
    which = release.add_mutually_exclusive_group(required=True)
    which.add_argument("--token", help="the holder's full token (FENCELOCK_TOKEN)")
    which.add_argument(
        "--force", action="store_true", help="delete the lock whoever holds it (loudly)"
    )
    _add_servers(release, DEFAULT_SERVER)
    _add_common(release)
    release.set_defaults(handler=_cmd_release)

    demo = sub.add_parser(
        "demo",
        help="show the classic failures, unprotected vs protected (embedded server)",
        description="Start an embedded server and show each failure, unprotected vs protected.",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    _add_common(demo)
    demo.set_defaults(handler=_cmd_demo)

    chaos = sub.add_parser(
        "chaos",
        help="fault-injection run on embedded servers",
        description="Run workers against embedded servers while injecting faults; exit 1 on a "
        "safety violation.",
    )
    chaos.add_argument(
        "--servers", type=_int_in("--servers", 1, None), default=5, help="default: 5"
    )
    chaos.add_argument(
        "--workers", type=_int_in("--workers", 1, None), default=5, help="default: 5"
    )
    chaos.add_argument(
        "--duration",
        type=_duration("--duration", allow_zero=False),
        default=30.0,
        help="seconds (default: 30)",
    )
    chaos.add_argument(
        "--faults",
        type=_fault_list,
        default=None,
        metavar="LIST",
        help="comma-separated fault names (default: all)",
    )
    chaos.add_argument(
        "--seed", type=_int_in("--seed", 0, None), default=None, help="default: random"
    )
    chaos.add_argument(
        "--primitive",
        choices=("lock", "semaphore", "rwlock"),
        default="lock",
        help="what the workers acquire (default: lock)",
    )
    chaos.add_argument(
        "--limit",
        type=_int_in("--limit", 1, None),
        default=2,
        help="the semaphore's permits with --primitive semaphore (default: 2)",
    )
    chaos.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    chaos.add_argument(
        "--html",
        type=_html_path,
        default=None,
        metavar="FILE",
        help="also write the run's picture to FILE (one self-contained HTML page)",
    )
    _add_common(chaos)
    chaos.set_defaults(handler=_cmd_chaos)

    bench = sub.add_parser(
        "bench",
        help="measure this library against raw redis-py",
        description="Measure fencelock against a raw redis-py baseline in the same run.",
    )
    _add_servers(bench, "an embedded server")
    bench.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    bench.add_argument(
        "--html",
        type=_html_path,
        default=None,
        metavar="FILE",
        help="also write the table and latency histograms to FILE (one HTML page)",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        default=None,
        help="a short smoke run (default: $FENCELOCK_BENCH_QUICK)",
    )
    _add_common(bench)
    bench.set_defaults(handler=_cmd_bench)

    doctor = sub.add_parser(
        "doctor",
        help="check the servers: eviction, persistence, clocks, independence, replicas, ACLs",
        description="Ask every server what decides whether locks and fences hold there, and "
        "say what to change (exit 0 all checks ok, 1 a check failed, 69 a server unreachable).",
    )
    _add_servers(doctor, DEFAULT_SERVER)
    doctor.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    _add_common(doctor)
    doctor.set_defaults(handler=_cmd_doctor)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split at the first ``--``: (options, command) — ``None`` when there is no ``--``.

    Done before argparse because its handling of ``--`` differs between Python versions.
    """
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a command line; usage errors exit 64 (SystemExit) with one stderr line."""
    parser = build_parser()
    options, command = _split_command(list(argv))
    args, extra = parser.parse_known_args(options)
    name = args.command_name
    if name is None:
        parser.error(
            "a command is needed: run, elect, status, release, demo, chaos, bench or doctor"
        )
    sub = _subparser(parser, name)
    if extra:
        hint = " (put the command after '--')" if name in ("run", "elect") else ""
        sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if name in ("run", "elect"):
        if not command:
            sub.error(f"a command is needed after '--': fencelock {name} --key K -- CMD [ARGS...]")
        args.command = command
    elif command is not None:
        sub.error(f"unexpected '--' and arguments: {' '.join(command)}")
    args.verbose = args.verbose + args.verbose_top
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise AssertionError("no subparsers")  # pragma: no cover


def resolve_servers(given: Sequence[str], default: Sequence[str]) -> list[str]:
    """``--server`` URLs, else ``$FENCELOCK_SERVERS`` (comma-separated), else ``default``.

    Raises :class:`ConfigError` for a malformed URL in the environment variable.
    """
    if given:
        return list(given)
    env = os.environ.get(ENV_SERVERS, "").strip()
    if env:
        urls = [part.strip() for part in env.split(",") if part.strip()]
        try:
            return [check_url(url) for url in urls]
        except ConfigError as exc:
            raise ConfigError(f"${ENV_SERVERS}: {exc}") from None
    return list(default)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, stream=sys.stderr, format="fencelock: %(levelname)s %(name)s: %(message)s"
    )


# -- run ------------------------------------------------------------------------------------------


@dataclass
class _RunState:
    """SIGINT/SIGTERM seen by ``fencelock run``: the handler only queues them, and the code
    that polls acts on them (before the command: release and exit 128 + N; while it runs:
    forward them to it). The handler never raises, so no library call is ever cut short:
    an acquire interrupted on its way back with a grant would leave the lock held to its ttl.
    """

    pending: list[int] = field(default_factory=list)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)

    def interrupted(self, prog: str) -> int:
        sig = self.pending[0]
        _say(prog, f"interrupted by {signal.Signals(sig).name} before the command started")
        return 128 + sig


def _child_exit_code(returncode: int) -> int:
    """A shell's view: a child killed by signal N gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _cmd_run(args: argparse.Namespace) -> int:
    prog = f"{PROG} run"
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    lock_kwargs: dict[str, Any] = {"purpose": args.purpose}
    if args.ttl is not None:
        lock_kwargs["ttl"] = args.ttl
    lock = Lock(servers, args.key, **lock_kwargs)  # ConfigError (64) before any I/O
    state = _RunState()
    watched = (signal.SIGINT, signal.SIGTERM)
    # installed before the acquire: from here on a signal is queued, never lost or raised
    previous = {sig: signal.signal(sig, state.handler) for sig in watched}
    try:
        return _run_locked(prog, lock, args, state)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        lock.close()


def _acquire(lock: Lock, wait: float, state: _RunState) -> Lease | None:
    """Acquire within ``wait`` seconds, in calls of at most :data:`ACQUIRE_SLICE` seconds so
    that a queued signal is seen between them: ``None`` when one came before a grant.

    Raises the last call's :class:`NotAcquired` or :class:`Unavailable` at the deadline.
    """
    deadline = time.monotonic() + wait
    while not state.pending:
        remaining = deadline - time.monotonic()
        try:
            return lock.acquire(min(max(remaining, 0.0), ACQUIRE_SLICE))
        except (NotAcquired, Unavailable):
            if time.monotonic() >= deadline:
                raise
    return None


def _run_locked(prog: str, lock: Lock, args: argparse.Namespace, state: _RunState) -> int:
    wait = 0.0 if args.nonblock else DEFAULT_WAIT if args.wait is None else args.wait
    try:
        lease = _acquire(lock, wait, state)
    except NotAcquired as exc:
        if state.pending:
            return state.interrupted(prog)
        _say(prog, f"not acquired: {exc}")
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
    returncode = _run_child(prog, lease, args, state, {})
    if returncode is None:  # it could not start
        _release(prog, lease)
        return int(args.start_failure)
    if not lease.lost.is_set() and args.at_least is not None:
        _linger(prog, lease, args.at_least, state)
    released_ok = _release(prog, lease)
    if lease.lost.is_set() or not released_ok:
        reason = lease.lost_reason or "it had expired or been taken when the command ended"
        _say(
            prog,
            f"lease on {lock.key!r} lost while the command ran ({reason}); "
            f"command exit status {_child_exit_code(returncode)}; exiting {EX_LOST}",
        )
        return EX_LOST
    return _child_exit_code(returncode)


def _run_child(
    prog: str,
    lease: Lease,
    args: argparse.Namespace,
    state: _RunState,
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
        child = subprocess.Popen(args.command, env=env, start_new_session=True)
    except OSError as exc:
        _say(prog, f"cannot run {args.command[0]!r}: {exc.strerror or exc}")
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
        _say(prog, f"--on-at-risk: cannot run {command!r}: {exc}")


def _signal_group(child: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the child's whole process group (it leads one of its own)."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(child.pid, sig)


def _group_alive(child: subprocess.Popen[bytes]) -> bool:
    try:
        os.killpg(child.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id of another user's group
        return False
    return True


def _reap_group(prog: str, child: subprocess.Popen[bytes], kill_at: float) -> None:
    """After a loss the child exited: give the rest of its group until ``kill_at`` to go,
    then SIGKILL it."""
    while _group_alive(child) and time.monotonic() < kill_at:
        time.sleep(POLL_INTERVAL)
    if _group_alive(child):
        _say(prog, f"process group {child.pid} still running; sending SIGKILL")
        _signal_group(child, signal.SIGKILL)


def _linger(prog: str, lease: Lease, at_least: float, state: _RunState) -> None:
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
        _say(prog, f"interrupted by {signal.Signals(state.pending[0]).name}: releasing now")


def _supervise(
    prog: str,
    child: subprocess.Popen[bytes],
    lease: Lease,
    lost: threading.Event,
    state: _RunState,
    grace: float,
) -> int:
    """Wait for the child; forward queued signals to its process group; on loss SIGTERM the
    group, SIGKILL it after ``grace``; log when the lease is at risk and when it recovers.

    Every wait is at most POLL_INTERVAL seconds, so signals and the loss are acted on promptly.
    """
    term_at: float | None = None
    killed = False
    at_risk = False
    while True:
        returncode = child.poll()
        if returncode is not None:
            if term_at is not None and not killed:
                _reap_group(prog, child, term_at + grace)  # what the child left behind
            return returncode
        while state.pending:
            sig = state.pending.pop(0)
            log.info("forwarding %s to process group %d", signal.Signals(sig).name, child.pid)
            _signal_group(child, sig)
        if lease.at_risk.is_set() != at_risk:
            at_risk = not at_risk
            if at_risk:
                _say(
                    prog,
                    f"lease on {lease.key!r} at risk: a renewal was not confirmed "
                    f"({lease.remaining():.3f} s of validity left)",
                )
            elif not lost.is_set():
                _say(prog, f"lease on {lease.key!r} renewed again: no longer at risk")
        if lost.is_set() and term_at is None:
            _say(
                prog,
                f"lease on {lease.key!r} lost ({lease.lost_reason}); sending SIGTERM to "
                f"process group {child.pid}, SIGKILL in {grace:g} s",
            )
            _signal_group(child, signal.SIGTERM)
            term_at = time.monotonic()
        if term_at is not None and not killed and time.monotonic() - term_at >= grace:
            if child.poll() is None:
                _say(prog, f"pid {child.pid} still running after {grace:g} s; sending SIGKILL")
            _signal_group(child, signal.SIGKILL)
            killed = True
        if term_at is None:
            lost.wait(POLL_INTERVAL)
        else:
            time.sleep(POLL_INTERVAL)


def _release(prog: str, lease: Lease) -> bool:
    """Release after the child ended; False when the lease turned out to be lost."""
    try:
        lease.release()
    except LockLost:
        return False
    except Unavailable as exc:
        _say(prog, f"warning: release not confirmed, the lock expires by its ttl: {exc}")
    return True


# -- elect ----------------------------------------------------------------------------------------


def _cmd_elect(args: argparse.Namespace) -> int:
    prog = f"{PROG} elect"
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    client = Client(servers, ttl=DEFAULT_TERM_TTL if args.ttl is None else args.ttl)
    election = client.election(args.key, name=args.name)  # ConfigError (64) before any I/O
    state = _RunState()
    watched = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, state.handler) for sig in watched}
    try:
        return _lead(prog, election, args, state)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        client.close()


def _lead(prog: str, election: Any, args: argparse.Namespace, state: _RunState) -> int:
    """Campaign (in slices, so a queued signal is seen), then run the command as leader."""
    while not state.pending:
        try:
            with election.campaign(wait=ACQUIRE_SLICE) as term:
                if state.pending:  # came with the term: hand it on at once
                    break
                _say(prog, f"{args.name} leads {args.key!r}, term {term.fence}")
                env = {"FENCELOCK_LEADER": args.name}
                returncode = _run_child(prog, term, args, state, env, renew=False)
                if returncode is None:
                    return int(args.start_failure)
        except (NotAcquired, Unavailable) as exc:
            log.debug("not leader yet: %s", exc)
            continue
        except LockLost as exc:
            _say(prog, f"leadership of {args.key!r} lost: {exc}; exiting {EX_LOST}")
            return EX_LOST
        return _child_exit_code(returncode)
    return state.interrupted(prog)


# -- status ---------------------------------------------------------------------------------------


def status_report(
    key: str, servers: Sequence[str], *, kind: str = "auto", limit: int | None = None
) -> admin.Status:
    """The ``status --json`` object for ``key`` on ``servers`` (:func:`fencelock.admin.status`)."""
    return admin.status(servers, key, timeout=ADMIN_TIMEOUT, kind=kind, limit=limit)


def _describe_holder(holder: dict[str, Any]) -> str:
    parts = []
    for field_name in ("leader", "term", "host", "pid", "purpose"):
        if field_name in holder:
            parts.append(f"{field_name}={holder[field_name]}")
    acquired = holder.get("acquired_at")
    if isinstance(acquired, int | float):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(acquired))
        parts.append(f"acquired_at={stamp} ({max(0.0, time.time() - acquired):.1f} s ago)")
    if "raw" in holder:
        parts.append(f"raw={holder['raw']!r}")
    if holder.get("handed_over"):
        parts.append("handed over by a release to the first waiter in line (no holder info)")
    return " ".join(parts)


def _describe_lessee(one: admin.Lessee, n: int) -> str:
    ttl = "unknown" if one["ttl_s"] is None else f"{one['ttl_s']:.3f} s"
    line = f"{one['token_prefix']}…, validity left {ttl}"
    if "servers_held" in one:
        line += f", on {one['servers_held']}/{n} servers"
        if not one.get("majority"):
            line += " (not a majority: not valid)"
    if one["holder"]:
        line += f"; holder {_describe_holder(one['holder'])}"
    return line


def _print_family_status(report: admin.Status) -> None:
    """The text form of a semaphore's or read-write lock's status (stdout)."""
    rows, key, kind = report["servers"], report["key"], report.get("kind")
    n = len(rows)
    for row in rows:
        if row["error"] is not None:
            print(f"  {row['server']}: error: {row['error']}")
    if kind == "semaphore":
        permits = report.get("permits", [])
        valid = sum(1 for one in permits if one.get("majority"))
        limit = report.get("limit")
        of = f"limit {limit}" if limit is not None else "limit not stored on the servers"
        print(f"semaphore {key!r}: {valid} permit(s) held on a majority of {n} ({of})")
        for one in permits:
            print(f"  slot {one.get('slot')}: {_describe_lessee(one, n)}")
    else:
        readers = report.get("readers", [])
        writer = report.get("writer")
        valid = sum(1 for one in readers if one.get("majority"))
        print(f"read-write lock {key!r}: {valid} reader(s) on a majority of {n} servers")
        for one in readers:
            print(f"  reader {_describe_lessee(one, n)}")
        print(f"  writer: {'none' if writer is None else _describe_lessee(writer, n)}")
        if report.get("writer_waiting"):
            print("  a writer is waiting: new readers are refused")
    print(f"current fence: {report['fence'] if report['fence'] is not None else 'none'}")


def _cmd_status(args: argparse.Namespace) -> int:
    key = check_key(args.key)
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    report = status_report(key, servers, kind=args.kind, limit=args.limit)
    rows = report["servers"]
    answered = [row for row in rows if row["error"] is None or row["held"]]
    if args.json:
        print(json.dumps(report, sort_keys=False))
    elif "kind" in report:
        _print_family_status(report)
    else:
        majority = len(rows) // 2 + 1
        held = sum(1 for row in rows if row["held"])
        print(f"lock {key!r}: held on {held}/{len(rows)} servers (majority {majority})")
        for row in rows:
            if row["error"] is not None and not row["held"]:
                print(f"  {row['server']}: error: {row['error']}")
                continue
            if row["held"]:
                ttl = "unknown" if row["ttl_s"] is None else f"{row['ttl_s']:.3f} s"
                line = f"  {row['server']}: held by {row['token_prefix']}…, validity left {ttl}"
            else:
                line = f"  {row['server']}: free"
            line += f", fence {row['fence'] if row['fence'] is not None else 'none'}"
            if row["holder"]:
                line += f"; holder {_describe_holder(row['holder'])}"
            print(line)
        print(f"current fence: {report['fence'] if report['fence'] is not None else 'none'}")
        if report["leader"] is not None:
            print(f"leader: {report['leader']}")
    if not answered:
        if not args.json:
            _say(f"{PROG} status", "no server answered")
        return EX_UNAVAILABLE
    return EX_OK


# -- release --------------------------------------------------------------------------------------


def _cmd_release(args: argparse.Namespace) -> int:
    prog = f"{PROG} release"
    key = check_key(args.key)
    if args.token is not None and not args.token.strip():
        raise ConfigError("--token must not be empty")
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    if args.force:
        return _force(prog, key, admin.force_release(servers, key, timeout=ADMIN_TIMEOUT))
    result = admin.release(servers, key, args.token, timeout=ADMIN_TIMEOUT)
    for one in result.servers:
        _say(prog, f"{one.server}: {one.outcome}")
    n, majority = len(result.servers), result.majority
    summary = f"{key!r}: released on {result.freed}/{n} servers, majority is {majority}"
    if result.ok:
        _say(prog, summary)
        return EX_OK
    if result.freed + result.failed >= majority:
        _say(prog, f"{summary}; too few servers answered to be sure")
        return EX_UNAVAILABLE
    _say(prog, f"{summary}: not held by token {args.token[:8]}…")
    return EX_LOST


def _force(prog: str, key: str, result: admin.ReleaseResult) -> int:
    for one in result.servers:
        if one.outcome == "deleted":
            who = f" (holder {one.holder})" if one.holder else ""
            _say(
                prog,
                f"WARNING: FORCED: deleted lock {key!r} held by token {one.token_prefix}… "
                f"on {one.server}{who}",
            )
        elif one.outcome == "free":
            _say(prog, f"{one.server}: lock {key!r} was not held; nothing deleted")
        elif one.outcome == "busy":
            _say(prog, f"{one.server}: lock {key!r} kept changing hands; NOT deleted")
        else:
            _say(prog, f"{one.server}: {one.outcome}; NOT deleted")
    n = len(result.servers)
    if result.ok:
        _say(
            prog,
            f"WARNING: lock {key!r} is free on {result.freed}/{n} servers. A holder that is still "
            "running does not know yet: only fencing protects the resource from its writes.",
        )
        return EX_OK
    _say(
        prog, f"lock {key!r} freed on only {result.freed}/{n} servers (majority {result.majority})"
    )
    return EX_UNAVAILABLE


# -- demo, chaos, bench (modules imported on demand) ----------------------------------------------


def _entry(module_name: str) -> Callable[..., Any]:
    module = importlib.import_module(module_name)
    run: Callable[..., Any] = module.run
    return run


def _lazy(module_name: str, args: argparse.Namespace, **kwargs: Any) -> int:
    try:
        run = _entry(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        _say(f"{PROG} {args.command_name}", f"not available in this installation ({exc})")
        return EX_SOFTWARE
    return int(run(**kwargs))


def _cmd_demo(args: argparse.Namespace) -> int:
    return _lazy("fencelock.demo", args, json_output=args.json)


def _cmd_chaos(args: argparse.Namespace) -> int:
    return _lazy(
        "fencelock.chaos.cli",
        args,
        servers=args.servers,
        workers=args.workers,
        duration=args.duration,
        faults=args.faults,
        seed=args.seed,
        json_output=args.json,
        html_path=args.html,
        primitive=args.primitive,
        limit=args.limit,
    )


def _cmd_bench(args: argparse.Namespace) -> int:
    servers = resolve_servers(args.servers, [])
    return _lazy(
        "fencelock.bench",
        args,
        servers=servers,
        json_output=args.json,
        html_path=args.html,
        quick=args.quick,
    )


def _cmd_doctor(args: argparse.Namespace) -> int:
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    return _lazy("fencelock.doctor", args, servers=servers, json_output=args.json)


# -- entry points ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fencelock`` command line; returns the exit status (see the module docstring)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(arguments)
    except SystemExit as exc:  # --help (0) or a usage error (64)
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    _setup_logging(args.verbose)
    prog = f"{PROG} {args.command_name}"
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except FencelockError as exc:
        code = exit_code_for(exc)
        label = "error" if code == EX_USAGE else type(exc).__name__
        _say(prog, f"{label}: {exc}")
        return code
    except KeyboardInterrupt:
        _say(prog, "interrupted")
        return 128 + signal.SIGINT


def console_main() -> None:
    """The ``fencelock`` console script."""
    sys.exit(main())


__all__ = ["EXIT_CODES", "build_parser", "console_main", "exit_code_for", "main"]
