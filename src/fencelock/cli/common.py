"""What every subcommand shares: exit codes and their one table, messages on stderr, the
servers a command talks to, and text made safe to print on a terminal."""

from __future__ import annotations

import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .. import (
    ConfigError,
    LockLost,
    NotAcquired,
    ServerVote,
    Unavailable,
    admin,
)

#: ``run -q``: fencelock's own stderr messages are off (set by :func:`main` per call).
quiet = False


def set_quiet(value: bool) -> None:
    """``-q``: silence :func:`say` for this call of ``main``."""
    global quiet
    quiet = value


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


#: Per-server timeout (seconds) of the plain commands of ``status`` and ``release``.
ADMIN_TIMEOUT = admin.DEFAULT_TIMEOUT


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an exception, from :data:`EXIT_CODES` (70 if none matches)."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EX_SOFTWARE


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def say(prog: str, message: str) -> None:
    if quiet:
        return
    print(f"{prog}: {one_line(message)}", file=sys.stderr, flush=True)


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
            return [admin.check_server_url(url) for url in urls]
        except ConfigError as exc:
            raise ConfigError(f"${ENV_SERVERS}: {exc}") from None
    return list(default)


def setup_logging(verbose: int) -> None:
    """-1 (``-q``): errors only; 0: warnings; 1 (``-v``): info; 2 (``-vv``): debug."""
    levels = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}
    level = levels.get(verbose, logging.DEBUG if verbose > 1 else logging.ERROR)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="fencelock: %(levelname)s %(name)s: %(message)s"
    )


# -- run ------------------------------------------------------------------------------------------


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def shown(value: object) -> str:
    """``value`` as text safe to print on a terminal: control characters (escape sequences,
    newlines that would forge lines, bidi overrides) become ``\\xNN`` / ``\\uNNNN``.
    Holder info and leader names are written by whoever may write the lock's keys."""
    text = str(value)
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable():
            out.append(char)
        else:
            code = ord(char)
            width = "x02" if code < 0x100 else "u04" if code < 0x10000 else "U08"
            out.append(f"\\{width[0]}{code:0{width[1:]}x}")
    return "".join(out)


# -- why servers fail: permanent (stop at once) or transient (keep waiting) -----------------------

#: Server replies that no retry will change: a refused password, a missing one, a user without
#: the permission, a database index the server does not have.
_PERMANENT_REPLIES: tuple[tuple[str, str], ...] = (
    ("WRONGPASS", "the password was refused"),
    ("NOAUTH", "the server needs a password"),
    ("NOPERM", "the user lacks a permission"),
    ("DB index is out of range", "no such database index"),
    ("invalid DB index", "no such database index"),
)

#: Name resolution errors that mean "no such host" (``EAI_AGAIN``, a resolver that did not
#: answer, is transient).
_UNKNOWN_HOST_ERRNOS = frozenset(
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_SERVICE", "EAI_FAIL")
    if hasattr(socket, name)
)

#: Shown for a TLS failure that a plain (non-TLS) port causes.
NOT_TLS_HINT = "TLS handshake failed: is this a TLS port?"


def permanent_reason(cause: BaseException | None, *, plain_port: bool = False) -> str | None:
    """Why ``cause`` (one server's error in a round) will not go away by retrying, or ``None``
    when it may (refused, reset, timed out, loading, a resolver that did not answer).

    ``plain_port``: the server was asked for TLS (``rediss://``) and its port was found to
    answer plain RESP: any failure there is then the wrong scheme. Pure: no I/O."""
    if cause is None:
        return None
    if plain_port:
        return NOT_TLS_HINT
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"the server's TLS certificate was not accepted ({cause.verify_message})"
    if isinstance(cause, ssl.SSLError):
        return NOT_TLS_HINT
    text = str(cause)
    if isinstance(cause, ConnectionError) and " refused: " in text:  # AUTH / SELECT / HELLO
        for marker, reason in _PERMANENT_REPLIES:
            if marker in text:
                return reason
    unresolved = isinstance(cause, OSError) and not isinstance(cause, ConnectionError)
    if unresolved and isinstance(cause, OSError) and cause.errno in _UNKNOWN_HOST_ERRNOS:
        return "unknown host"
    return None


@dataclass(frozen=True)
class FailureReading:
    """What one round's failures mean for the wait: ``servers`` voted, ``quorum`` is the
    majority, ``failing`` maps each failing server to its one-line cause, ``permanent`` to
    the reason it will stay so."""

    servers: int
    quorum: int
    failing: dict[str, str]
    permanent: dict[str, str]

    @property
    def hopeless(self) -> bool:
        """The permanent failures alone leave fewer than a majority: waiting cannot help."""
        return self.servers - len(self.permanent) < self.quorum

    def give_up_line(self) -> str:
        """One line: why no lock can be taken, per permanently failing server."""
        parts = [
            f"{name}: {reason} ({self.failing[name]})" for name, reason in self.permanent.items()
        ]
        many = len(self.permanent)
        head = (
            "no lock can be taken"
            if self.servers == 1
            else f"{many} of {self.servers} servers fail for good, a majority needs {self.quorum}"
        )
        return f"{head}: " + "; ".join(parts) + " (not retried)"

    def progress_line(self) -> str:
        """One line for ``-v``: how many servers fail and how many more failures the lock
        survives."""
        failing = len(self.failing)
        spare = self.servers - failing - self.quorum
        if spare < 0:
            outlook = "no majority now; retrying until the wait runs out"
        elif spare == 0:
            outlook = "one more failure and no lock can be taken"
        else:
            outlook = f"{spare + 1} more failures and no lock can be taken"
        first = next(iter(self.failing.items()), None)
        detail = f" ({first[0]}: {first[1]})" if first is not None else ""
        return f"{failing} of {self.servers} servers failing{detail}; {outlook}"


def read_failures(
    votes: Sequence[ServerVote], *, plain_ports: frozenset[str] = frozenset()
) -> FailureReading:
    """Classify one round's votes (``Unavailable.votes``): pure, no I/O. ``plain_ports``
    names the ``rediss://`` servers found to answer plain RESP."""
    servers = len(votes)
    failing: dict[str, str] = {}
    permanent: dict[str, str] = {}
    for vote in votes:
        if vote.outcome != "error":
            continue
        failing[vote.server] = one_line(f"{type(vote.cause).__name__}: {vote.cause}")
        reason = permanent_reason(vote.cause, plain_port=vote.server in plain_ports)
        if reason is not None:
            permanent[vote.server] = reason
    return FailureReading(servers, servers // 2 + 1, failing, permanent)
