"""Operator tools for one lock: look at it, free it by its token, or free it by force.

These are what ``fencelock status`` and ``fencelock release`` do, as functions. Each server is
asked with a plain redis-py client of its own: short timeouts (:data:`DEFAULT_TIMEOUT`), no
client-side retries, closed before the function returns. Servers are URLs (``redis://``,
``rediss://``, ``valkey://``, ``unix://``), one or a sequence; server names in the results are
password-free (``host:port/db``, or ``unix:/path``), as in the lock's own messages.

- :func:`status` reads (never changes) the lock's keys on every server.
- :func:`release` compare-and-deletes the lock where it still holds the given token, exactly as
  ``lease.release()`` would (waiters are woken).
- :func:`force_release` deletes the lock whoever holds it. A holder that is still running is
  not told: only fencing protects the resource from its later writes.

Bad input (no servers, a malformed URL, an empty key or token) raises
:class:`~fencelock.ConfigError` before any I/O; a server that fails is reported in the result,
never raised.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict

import redis
from redis.exceptions import NoScriptError

from ._core.keys import LockKeys, lock_keys
from ._plain_clients import describe, plain_client
from ._scripts import RELEASE
from .errors import ConfigError
from .options import HANDOFF_WINDOW, WAKE_LIFETIME, check_key, check_url, seconds

__all__ = [
    "DEFAULT_TIMEOUT",
    "FORCE_ATTEMPTS",
    "ReleaseResult",
    "ServerOutcome",
    "ServerStatus",
    "Status",
    "force_release",
    "release",
    "status",
]

#: Per-server timeout in seconds of every command here: an operator waits for a dead server
#: this long, not for redis-py's default retries (FAULTS.md F16).
DEFAULT_TIMEOUT = 1.0
#: :func:`force_release` tries this many times on a server where the lock changes hands under it.
FORCE_ATTEMPTS = 3

# release.lua's ARGV[2], ARGV[3] (hand-off window, wake-element lifetime) in ms, as a Lock's own
_RELEASE_TAIL = (round(HANDOFF_WINDOW * 1000), round(WAKE_LIFETIME * 1000))


class ServerStatus(TypedDict):
    """One server's view of a lock (a row of ``fencelock status --json``)."""

    server: str  # password-free name
    held: bool  # the lock key exists
    token_prefix: str | None  # the holder's token, first 8 characters
    ttl_s: float | None  # validity left on this server, seconds
    holder: dict[str, Any] | None  # holder metadata (host, pid, purpose...), or {"raw": text}
    fence: int | None  # this server's fence register
    error: str | None  # why the server could not be read (or its fence register is bad)


class Status(TypedDict):
    """The object ``fencelock status --json`` prints."""

    key: str
    servers: list[ServerStatus]
    fence: int | None  # the highest fence register found, None when none was
    leader: str | None  # for an election key: the leader's name (held on a majority), else None


@dataclass(frozen=True)
class ServerOutcome:
    """What :func:`release` or :func:`force_release` did on one server.

    ``outcome``: for :func:`release` ``"released"`` or ``"not-held"`` (expired, or another
    token holds it); for :func:`force_release` ``"deleted"`` (``token_prefix`` and ``holder``
    say what), ``"free"`` (nothing held) or ``"busy"`` (changed hands every time); for both
    ``"error: <type>: <message>"`` when the server did not answer.
    """

    server: str
    outcome: str
    token_prefix: str | None = None
    holder: str | None = None

    @property
    def freed(self) -> bool:
        """The lock is free of this token (release) / of every holder (force) here now."""
        return self.outcome in ("released", "deleted", "free")

    @property
    def failed(self) -> bool:
        """The server did not answer: its state is unknown."""
        return self.outcome.startswith("error")


@dataclass(frozen=True)
class ReleaseResult:
    """The outcome of :func:`release` / :func:`force_release` over every server, in order."""

    key: str
    servers: tuple[ServerOutcome, ...]

    @property
    def majority(self) -> int:
        return len(self.servers) // 2 + 1

    @property
    def freed(self) -> int:
        """How many servers were freed (see :attr:`ServerOutcome.freed`)."""
        return sum(1 for one in self.servers if one.freed)

    @property
    def failed(self) -> int:
        """How many servers did not answer."""
        return sum(1 for one in self.servers if one.failed)

    @property
    def ok(self) -> bool:
        """Freed on a majority: no one can hold the lock until a new acquire."""
        return self.freed >= self.majority


def status(servers: str | Sequence[str], key: str, *, timeout: float = DEFAULT_TIMEOUT) -> Status:
    """Who holds lock ``key`` on each server, the validity left there, and the fence registers.

    Plain reads, in parallel, nothing changes. Shape: ``{"key", "servers": [{"server",
    "held", "token_prefix", "ttl_s", "holder", "fence", "error"}, ...], "fence", "leader"}``
    (``leader``: the elected leader's name for an election key, else None).
    """
    urls, name, timeout = _check(servers, key, timeout)
    keys = lock_keys(name)
    rows = _each(urls, lambda url: _probe(url, keys, timeout))
    fences = [row["fence"] for row in rows if row["fence"] is not None]
    return {
        "key": name,
        "servers": rows,
        "fence": max(fences) if fences else None,
        "leader": _leader(rows),
    }


def _leader(rows: Sequence[ServerStatus]) -> str | None:
    """The name an elected holder announced beside the lock (``fencelock elect``,
    ``election.campaign()``), when the same holder has the lock on a majority."""
    names: dict[str | None, list[str]] = {}
    for row in rows:
        holder = row["holder"]
        if row["held"] and holder is not None and isinstance(holder.get("leader"), str):
            names.setdefault(row["token_prefix"], []).append(holder["leader"])
    for found in names.values():
        if len(found) >= len(rows) // 2 + 1:
            return found[0]
    return None


def release(
    servers: str | Sequence[str], key: str, token: str, *, timeout: float = DEFAULT_TIMEOUT
) -> ReleaseResult:
    """Compare-and-delete lock ``key`` on every server where it is held by ``token`` (the
    holder's full token, ``lease.token`` / ``$FENCELOCK_TOKEN``); wakes a waiter as a release
    does. Raises :class:`~fencelock.ConfigError` for an empty token."""
    urls, name, timeout = _check(servers, key, timeout)
    if not isinstance(token, str) or not token.strip():
        raise ConfigError("token must be a non-empty str")
    keys = lock_keys(name)
    outcomes = [_release_one(url, keys, token, timeout) for url in urls]
    return ReleaseResult(name, tuple(outcomes))


def force_release(
    servers: str | Sequence[str], key: str, *, timeout: float = DEFAULT_TIMEOUT
) -> ReleaseResult:
    """Delete lock ``key`` on every server, whoever holds it.

    On each server it reads the current token and compare-and-deletes exactly that token (so
    what is reported is what was deleted, and a waiter is woken as by a normal release),
    trying again up to :data:`FORCE_ATTEMPTS` times if the lock changes hands in between.
    """
    urls, name, timeout = _check(servers, key, timeout)
    keys = lock_keys(name)
    return ReleaseResult(name, tuple(_force_one(url, keys, timeout) for url in urls))


# -- per server -----------------------------------------------------------------------------------


def _check(servers: object, key: object, timeout: object) -> tuple[list[str], str, float]:
    if isinstance(servers, str):
        given: list[object] = [servers]
    elif isinstance(servers, Sequence):
        given = list(servers)
    else:
        raise ConfigError(f"servers must be a URL or a sequence of URLs, not {type(servers)!r}")
    if not given:
        raise ConfigError("at least one server is needed")
    urls = []
    for url in given:
        if not isinstance(url, str):
            raise ConfigError(f"each server must be a URL, not {type(url).__name__}")
        urls.append(check_url(url))
    return urls, check_key(key), seconds(timeout, "timeout")


def _client(url: str, timeout: float) -> redis.Redis:
    """A client of our own: short timeouts, no retries, no handshake extras."""
    return plain_client(url, timeout)


def _name(client: redis.Redis) -> str:
    return describe(client.connection_pool.connection_kwargs)


def _each(urls: Sequence[str], one: Callable[[str], ServerStatus]) -> list[ServerStatus]:
    if len(urls) == 1:
        return [one(urls[0])]
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        return list(pool.map(one, urls))


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _error(exc: BaseException) -> str:
    return "error: " + _one_line(f"{type(exc).__name__}: {exc}")


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _probe(url: str, keys: LockKeys, timeout: float) -> ServerStatus:
    """One server's view of the lock (plain reads with a short timeout; never raises)."""
    client = _client(url, timeout)
    row: ServerStatus = {
        "server": _name(client),
        "held": False,
        "token_prefix": None,
        "ttl_s": None,
        "holder": None,
        "fence": None,
        "error": None,
    }
    try:
        pipe = client.pipeline(transaction=False)
        pipe.get(keys.lock)
        pipe.pttl(keys.lock)
        pipe.get(keys.holder)
        pipe.get(keys.fence)
        token, pttl, holder, fence = pipe.execute()
    except Exception as exc:
        row["error"] = _error(exc).removeprefix("error: ")
        return row
    finally:
        client.close()
    token_text = _text(token)
    if token_text is not None:
        row["held"] = True
        row["token_prefix"] = token_text[:8]
        if isinstance(pttl, int) and pttl >= 0:
            row["ttl_s"] = pttl / 1000
    holder_text = _text(holder)
    if holder_text:
        try:
            parsed = json.loads(holder_text)
        except ValueError:
            parsed = None
        row["holder"] = parsed if isinstance(parsed, dict) else {"raw": holder_text}
    fence_text = _text(fence)
    if fence_text is not None:
        try:
            row["fence"] = int(fence_text)
        except ValueError:
            row["error"] = f"fence register is not an integer: {fence_text[:40]!r}"
    return row


def _run_release(client: redis.Redis, keys: LockKeys, token: str | bytes) -> bool:
    """release.lua once (EVALSHA, EVAL on NOSCRIPT): True when it deleted ``token``'s lock."""
    script_keys = (keys.lock, keys.holder, keys.waiters, keys.wake, keys.handoff)
    execute: Callable[..., Any] = client.execute_command
    try:
        reply = execute(
            "EVALSHA", RELEASE.sha, RELEASE.numkeys, *script_keys, token, *_RELEASE_TAIL
        )
    except NoScriptError:
        reply = execute(
            "EVAL", RELEASE.source, RELEASE.numkeys, *script_keys, token, *_RELEASE_TAIL
        )
    return bool(reply == 1)


def _release_one(url: str, keys: LockKeys, token: str, timeout: float) -> ServerOutcome:
    client = _client(url, timeout)
    name = _name(client)
    try:
        released = _run_release(client, keys, token)
    except Exception as exc:
        return ServerOutcome(name, _error(exc))
    finally:
        client.close()
    return ServerOutcome(name, "released" if released else "not-held")


def _force_one(url: str, keys: LockKeys, timeout: float) -> ServerOutcome:
    client = _client(url, timeout)
    name = _name(client)
    try:
        for _ in range(FORCE_ATTEMPTS):
            token, holder = client.mget([keys.lock, keys.holder])
            if token is None:
                client.delete(keys.holder)
                return ServerOutcome(name, "free")
            if _run_release(client, keys, token):
                return ServerOutcome(name, "deleted", str(_text(token))[:8], _text(holder))
        return ServerOutcome(name, "busy")
    except Exception as exc:
        return ServerOutcome(name, _error(exc))
    finally:
        client.close()
