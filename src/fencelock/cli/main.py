"""The ``fencelock`` command's arguments and dispatch: the parser of every subcommand, and
``main(argv) -> int``, which maps exceptions to exit codes through one table. The subcommands
live beside it, one module each; the heavy ones (demo, chaos, bench, doctor, top) are imported
only when asked for.

Why this module is longer than 600 lines: argparse definitions of every subcommand and
flag (the CLI contract of DESIGN.md) are long by nature; the work is in the modules beside it."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from .. import (
    ConfigError,
    FencelockError,
    admin,
)
from ..options import seconds
from .common import (
    ADMIN_TIMEOUT,
    DEFAULT_SERVER,
    ENV_SERVERS,
    EX_OK,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    PROG,
    exit_code_for,
    one_line,
    resolve_servers,
    say,
    set_quiet,
    setup_logging,
)
from .run import DEFAULT_GRACE, cmd_run

# -- argument parsing -----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors as one stderr line and exit status 64 (``--help`` stays 0)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EX_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


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
        return admin.check_server_url(text)
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


def _add_servers(parser: argparse.ArgumentParser, default_text: str = DEFAULT_SERVER) -> None:
    parser.add_argument(
        "--server",
        dest="servers",
        action="append",
        type=_server_url,
        default=[],
        metavar="URL",
        help=f"a server URL, repeat for Redlock (else ${ENV_SERVERS}, else {default_text})",
    )


def _add_json(parser: Any, help: str = "print one JSON object on stdout") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def _add_html(parser: Any, help: str) -> None:
    """``--html FILE`` (``parser`` may be a mutually exclusive group)."""
    parser.add_argument("--html", type=_html_path, default=None, metavar="FILE", help=help)


def _add_seconds(
    parser: argparse.ArgumentParser, flag: str, default: float | None, help: str
) -> None:
    """A duration option of more than 0 seconds."""
    parser.add_argument(flag, type=_duration(flag, allow_zero=False), default=default, help=help)


def _add_child_options(parser: argparse.ArgumentParser) -> None:
    """What ``run`` and ``elect`` share about CMD, once the lease is held."""
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


def _version() -> str:
    """The package's ``__version__`` (read off the package: the CLI imports public names
    only)."""
    package = sys.modules[__name__.split(".")[0]]
    return str(getattr(package, "__version__", "unknown"))


#: Each subcommand: (name, handler, its one-line help, its description, its usage or None), in
#: the order ``--help`` lists them; :func:`build_parser` adds each one's own options.
_COMMANDS: tuple[tuple[str, Callable[[argparse.Namespace], int], str, str, str | None], ...]


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
    parser.add_argument(
        "-V", "--version", action="version", version=f"%(prog)s {_version()}",
        help="print the version and exit",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")
    commands = {}
    for name, handler, summary, description, usage in _COMMANDS:
        command = sub.add_parser(name, help=summary, description=description, usage=usage)
        command.set_defaults(handler=handler)
        commands[name] = command
    _run_options(commands["run"])
    _elect_options(commands["elect"])
    _status_options(commands["status"], commands["release"])
    _top_options(commands["top"])
    _add_json(commands["demo"])
    _chaos_options(commands["chaos"])
    _bench_options(commands["bench"])
    _doctor_options(commands["doctor"])
    for command in commands.values():
        _add_common(command)
    return parser


def _run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--key", required=True, help="the lock name")
    _add_seconds(run, "--ttl", None, "lease length in seconds, renewed every ttl/3 (default: 30)")
    waiting = run.add_mutually_exclusive_group()
    waiting.add_argument(
        "-w",
        "--wait",
        type=_duration("--wait", allow_zero=True, allow_inf=True),
        default=None,
        help="seconds to wait for the lock; 'inf' waits forever (default: 10)",
    )
    waiting.add_argument(
        "-n",
        "--nonblock",
        action="store_true",
        help="one attempt only (same as --wait 0); a conflict then prints nothing unless -v",
    )
    run.add_argument(
        "-E",
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
    run.add_argument(
        "-c",
        "--command",
        dest="shell_command",
        default=None,
        metavar="CMD",
        help="run CMD through 'sh -c' (instead of '-- CMD [ARGS...]')",
    )
    run.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print none of fencelock's own messages on stderr (the exit status tells); "
        "usage errors are still printed",
    )
    _add_child_options(run)
    run.add_argument("--purpose", default=None, help="text shown by 'fencelock status'")
    _add_servers(run)


def _elect_options(elect: argparse.ArgumentParser) -> None:
    elect.add_argument("--key", required=True, help="the election name")
    elect.add_argument("--name", required=True, help="who leads, as leader() and status show")
    _add_seconds(elect, "--ttl", None, "term lease in seconds, renewed every ttl/3 (default: 10)")
    _add_child_options(elect)
    _add_servers(elect)


def _status_options(status: argparse.ArgumentParser, release: argparse.ArgumentParser) -> None:
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
    _add_servers(status)
    _add_json(status)
    release.add_argument("--key", required=True, help="the lock name")
    which = release.add_mutually_exclusive_group(required=True)
    which.add_argument("--token", help="the holder's full token (FENCELOCK_TOKEN)")
    which.add_argument(
        "--force", action="store_true", help="delete the lock whoever holds it (loudly)"
    )
    _add_servers(release)


def _top_options(top: argparse.ArgumentParser) -> None:
    top.add_argument("--prefix", default="", help="lock names starting with this (default: all)")
    top_out = top.add_mutually_exclusive_group()
    _add_json(top_out, "print one snapshot as JSON")
    _add_html(top_out, "write one snapshot as an HTML page")
    _add_seconds(top, "--interval", 2.0, "seconds between refreshes (default 2)")
    top.add_argument(
        "--iterations",
        type=_int_in("--iterations", 1, None),
        default=None,
        help="stop after this many refreshes (default: until interrupted)",
    )
    top.add_argument(
        "--max-items",
        type=_int_in("--max-items", 1, 10_000),
        default=200,
        help="lock names shown at the most per refresh (default 200)",
    )
    _add_servers(top)


def _chaos_options(chaos: argparse.ArgumentParser) -> None:
    chaos.add_argument(
        "--servers", type=_int_in("--servers", 1, None), default=5, help="default: 5"
    )
    chaos.add_argument(
        "--workers", type=_int_in("--workers", 1, None), default=5, help="default: 5"
    )
    _add_seconds(chaos, "--duration", 30.0, "seconds (default: 30)")
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
        choices=("lock", "fair", "semaphore", "rwlock", "rw", "multi", "election"),
        default="lock",
        help="what the workers acquire (default: lock; rw is rwlock)",
    )
    chaos.add_argument(
        "--front",
        choices=("sync", "asyncio"),
        default="sync",
        help="the blocking API or fencelock.asyncio (default: sync)",
    )
    chaos.add_argument(
        "--limit",
        type=_int_in("--limit", 1, None),
        default=2,
        help="the semaphore's permits with --primitive semaphore (default: 2)",
    )
    _add_json(chaos)
    _add_html(chaos, "also write the run's picture to FILE (one self-contained HTML page)")


def _bench_options(bench: argparse.ArgumentParser) -> None:
    _add_servers(bench, "an embedded server")
    _add_json(bench)
    _add_html(bench, "also write the table and latency histograms to FILE (one HTML page)")
    bench.add_argument(
        "--quick",
        action="store_true",
        default=None,
        help="a short smoke run (default: $FENCELOCK_BENCH_QUICK)",
    )


def _doctor_options(doctor: argparse.ArgumentParser) -> None:
    _add_servers(doctor)
    _add_json(doctor)
    doctor.add_argument(
        "--strict", action="store_true", help="exit 1 on a warning too (default: only a failure)"
    )


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
            "a command is needed: run, elect, status, top, release, demo, chaos, bench or doctor"
        )
    sub = _subparser(parser, name)
    if extra:
        hint = " (put the command after '--')" if name in ("run", "elect") else ""
        sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    shell_command = getattr(args, "shell_command", None)
    if shell_command is not None:
        if command is not None:
            sub.error("give the command either with -c CMD or after '--', not both")
        if not shell_command.strip():
            sub.error("-c needs a command")
        args.command = ["/bin/sh", "-c", shell_command]
    elif name in ("run", "elect"):
        if not command:
            hint = " (or -c 'CMD')" if name == "run" else ""
            sub.error(
                f"a command is needed after '--': fencelock {name} --key K -- CMD [ARGS...]{hint}"
            )
        args.command = command
    elif command is not None:
        sub.error(f"unexpected '--' and arguments: {' '.join(command)}")
    args.verbose = args.verbose + args.verbose_top
    args.quiet = bool(getattr(args, "quiet", False))
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise AssertionError("no subparsers")  # pragma: no cover


def _cmd_top(args: argparse.Namespace) -> int:
    from . import top

    servers = resolve_servers(args.servers, [DEFAULT_SERVER])

    def take() -> top.Snapshot:
        return top.snapshot(
            servers, prefix=args.prefix, timeout=ADMIN_TIMEOUT, max_items=args.max_items
        )

    if args.json:
        snap = take()
        print(json.dumps(snap))
        return EX_OK if any(r["error"] is None for r in snap["servers"]) else EX_UNAVAILABLE
    if args.html:
        snap = take()
        with open(args.html, "w", encoding="utf-8") as page:
            page.write(top.render_html(snap))
        return EX_OK if any(r["error"] is None for r in snap["servers"]) else EX_UNAVAILABLE
    done = 0
    interactive = sys.stdout.isatty()
    while args.iterations is None or done < args.iterations:
        snap = take()
        if interactive:
            sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: refresh in place
        print(top.render_text(snap), flush=True)
        done += 1
        if args.iterations is None or done < args.iterations:
            time.sleep(args.interval)
    return EX_OK


# -- elect, status, release: imported when asked for (a ``run`` starts without them; elect's
# Election brings the asyncio front end) -------------------------------------------------------


def _cmd_elect(args: argparse.Namespace) -> int:
    from .elect import cmd_elect

    return cmd_elect(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from .status import cmd_status

    return cmd_status(args)


def _cmd_release(args: argparse.Namespace) -> int:
    from .status import cmd_release

    return cmd_release(args)


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
        say(f"{PROG} {args.command_name}", f"not available in this installation ({exc})")
        return EX_SOFTWARE
    return int(run(**kwargs))


def _cmd_demo(args: argparse.Namespace) -> int:
    return _lazy("fencelock.cli.demo", args, json_output=args.json)


def _cmd_chaos(args: argparse.Namespace) -> int:
    return _lazy(
        "fencelock.cli.chaos.cli",
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
        front=args.front,
    )


def _cmd_bench(args: argparse.Namespace) -> int:
    servers = resolve_servers(args.servers, [])
    return _lazy(
        "fencelock.cli.bench",
        args,
        servers=servers,
        json_output=args.json,
        html_path=args.html,
        quick=args.quick,
    )


def _cmd_doctor(args: argparse.Namespace) -> int:
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    return _lazy(
        "fencelock.cli.doctor", args, servers=servers, json_output=args.json, strict=args.strict
    )


_COMMANDS = (
    (
        "run",
        cmd_run,
        "run a command while holding the lock (a distributed flock)",
        "Acquire the lock, run CMD holding it (renewed in the background), release it when CMD "
        "ends. CMD gets FENCELOCK_FENCE, FENCELOCK_TOKEN and FENCELOCK_KEY. If the lease is "
        "lost, CMD gets SIGTERM, then SIGKILL after --grace seconds, and the exit status is 72. "
        "SIGINT and SIGTERM are forwarded to CMD; one that arrives before CMD started releases "
        "the lock and exits 128 + the signal number.",
        "%(prog)s --key K [options] (-- CMD [ARGS...] | -c CMD)",
    ),
    (
        "elect",
        _cmd_elect,
        "run a command while this process is the elected leader",
        "Campaign for leadership of KEY under NAME (waiting as long as it takes), run CMD while "
        "leader (renewed in the background; CMD gets FENCELOCK_FENCE = the term number, "
        "FENCELOCK_TOKEN, FENCELOCK_KEY and FENCELOCK_LEADER), and hand leadership on at once "
        "when CMD ends (exit status: CMD's own). If leadership is lost, CMD's process group "
        "gets SIGTERM, then SIGKILL after --grace seconds, and the exit status is 72.",
        "%(prog)s --key K --name N [options] -- CMD [ARGS...]",
    ),
    (
        "status",
        _cmd_status,
        "who holds a lock, validity left per server, current fence",
        "Read the lock's keys on every server (plain reads, nothing changes); for a semaphore "
        "its permits, for a read-write lock its readers and writer.",
        None,
    ),
    (
        "release",
        _cmd_release,
        "free a stuck lock (by its token, or --force)",
        "Compare-and-delete the lock on every server when it still holds TOKEN (exit 0 when "
        "released on a majority, 72 when not held by that token). --force deletes it whatever "
        "the token, and says on stderr what it removed.",
        None,
    ),
    (
        "top",
        _cmd_top,
        "every lock under a prefix: holder, TTL left, fence, waiters (live)",
        "SCAN each server for fencelock's keys under --prefix (never KEYS, bounded per "
        "refresh) and show every lock, fair queue, semaphore, read-write lock and election "
        "found: holder, validity left on a majority, fence or term, waiters, permits; "
        "refreshed every --interval seconds until interrupted (or --iterations).",
        None,
    ),
    (
        "demo",
        _cmd_demo,
        "show the classic failures, unprotected vs protected (embedded server)",
        "Start an embedded server and show each failure, unprotected vs protected.",
        None,
    ),
    (
        "chaos",
        _cmd_chaos,
        "fault-injection run on embedded servers",
        "Run workers against embedded servers while injecting faults; exit 1 on a safety "
        "violation.",
        None,
    ),
    (
        "bench",
        _cmd_bench,
        "measure this library against raw redis-py",
        "Measure fencelock against a raw redis-py baseline in the same run.",
        None,
    ),
    (
        "doctor",
        _cmd_doctor,
        "check the servers: eviction, persistence, clocks, independence, replicas, ACLs",
        "Ask every server what decides whether locks and fences hold there, and say what to "
        "change (exit 0 no check failed (warnings allowed unless --strict), 1 a check failed, "
        "69 a server unreachable).",
        None,
    ),
)


# -- entry points ---------------------------------------------------------------------------------


#: Exit status when stdout's reader went away (``fencelock top | head``): that of a process
#: killed by SIGPIPE (128 + 13), as a shell reports for ``cat`` in the same place; nothing is
#: printed about it.
EX_PIPE = 128 + 13


class _WarningLines:
    """``showwarning`` for the command line: a Python warning (``InsecureTLSWarning`` for
    ``ssl_cert_reqs=none``, ...) becomes one ``fencelock: warning: ...`` line on stderr, without
    the source path and line, each distinct text once per call of :func:`main`."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = one_line(message)
        if text in self.seen:
            return
        self.seen.add(text)
        say(PROG, f"warning: {text}")


def _stdout_gone() -> int:
    """stdout's reader closed the pipe: point stdout at /dev/null, so that the interpreter's
    final flush does not complain, and say nothing."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    return EX_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fencelock`` command line; returns the exit status (see the module docstring)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(arguments)
    except SystemExit as exc:  # --help (0) or a usage error (64)
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    set_quiet(args.quiet)
    setup_logging(-1 if args.quiet else args.verbose)
    with warnings.catch_warnings():
        warnings.showwarning = _WarningLines()
        try:
            code = _dispatch(args)
            sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        except BrokenPipeError:
            return _stdout_gone()
        return code


def _dispatch(args: argparse.Namespace) -> int:
    prog = f"{PROG} {args.command_name}"
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except FencelockError as exc:
        code = exit_code_for(exc)
        label = "error" if code == EX_USAGE else type(exc).__name__
        say(prog, f"{label}: {exc}")
        return code
    except KeyboardInterrupt:
        say(prog, "interrupted")
        return 128 + signal.SIGINT


def console_main() -> None:
    """The ``fencelock`` console script."""
    sys.exit(main())
