"""Operator tools for one lock: look at it, free it by its token, or free it by force.

These are what ``fencelock status`` and ``fencelock release`` do, as functions. Each server is
asked with a plain redis-py client of its own: short timeouts (:data:`DEFAULT_TIMEOUT`), no
client-side retries, closed before the function returns. Servers are URLs (``redis://``,
``rediss://``, ``valkey://``, ``unix://``, and as for a Lock ``redis+cluster://host:port``, any
node, and ``redis+sentinel://host:port[,host:port]/service``), one or a sequence; server names
in the results are password-free (``host:port/db``, or ``unix:/path``; for a cluster the node
that owns the lock's slot, for Sentinel ``sentinel:service@hosts/db``), as in the lock's own
messages.

- :func:`status` reads (never changes) the lock's keys on every server; for a semaphore it
  also lists the permits (slot, token prefix, validity, holder) and for a read-write lock the
  readers and the writer.
- :func:`release` compare-and-deletes the lock where it still holds the given token, exactly as
  ``lease.release()`` would (waiters are woken).
- :func:`force_release` deletes the lock whoever holds it, and its hand-off marker (so that
  nobody steps aside for a woken waiter). A holder that is still running is not told: only
  fencing protects the resource from its later writes.

Bad input (no servers, a malformed URL, an empty key or token) raises
:class:`~fencelock.ConfigError` before any I/O; a server that fails is reported in the result,
never raised.

Why this module is longer than 600 lines: status reads every primitive's key layout (lock,
fair queue, semaphore, RW lock, election) from each server and merges the views; those readers
share the merge and are kept together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from ._core.handover import HANDED_PREFIX
from ._core.holder_json import parse_holder, split_lock_value
from ._core.keys import LockKeys, fair_queue_key, limit_key, lock_keys, rw_keys, slot_keys
from ._core.plan import release_keys
from ._core.semaphore import check_limit
from ._engine.address import check_any_url, url_name
from ._scripts import RELEASE
from .errors import ConfigError
from .options import HANDOFF_WINDOW, WAKE_LIFETIME, check_key, seconds

# redis-py is imported by the functions that talk to a server, so that a command that only
# checks its URLs here (``fencelock run``) starts without it
if TYPE_CHECKING:
    import redis

__all__ = [
    "DEFAULT_TIMEOUT",
    "FORCE_ATTEMPTS",
    "KINDS",
    "Lessee",
    "ReleaseResult",
    "ServerOutcome",
    "ServerStatus",
    "Status",
    "check_server_url",
    "force_release",
    "release",
    "status",
]


def check_server_url(url: str) -> str:
    """``url`` as a server of the admin paths and the commands take it, checked before any I/O:
    a plain ``redis://`` / ``rediss://`` URL (normalised as :func:`fencelock.options.check_url`
    does), or a ``redis+cluster://host:port`` / ``redis+sentinel://host:port[,...]/service``
    URL (returned as given).

    Raises:
        ConfigError: a malformed URL of any kind.
    """
    return check_any_url(url)


#: Per-server timeout in seconds of every command here: an operator waits for a dead server
#: this long, not for redis-py's default retries (FAULTS.md F16).
DEFAULT_TIMEOUT = 1.0
#: Deletes the hand-off marker (the lock key's empty value: a release woke a waiter, and
#: newcomers step aside for its window), and nothing that replaced it meanwhile.
_DELETE_MARKER = (
    "if redis.call('GET', KEYS[1]) == '' then return redis.call('DEL', KEYS[1]) end return 0"
)

#: :func:`force_release` tries this many times on a server where the lock changes hands under it.
FORCE_ATTEMPTS = 3

# release.lua's ARGV[2]..ARGV[6] (hand-off window, wake-element lifetime in ms, as a Lock's own;
# no next holder's token: a waiter is woken to try again rather than handed the lock)
_RELEASE_TAIL = (round(HANDOFF_WINDOW * 1000), round(WAKE_LIFETIME * 1000), "", 0, "-")

#: Characters of an unparsable holder info shown (``raw``), at the most.
MAX_RAW_SHOWN = 1024


#: What :func:`status` can be told (or finds) a key is: ``"auto"`` looks at the keys present.
KINDS = ("auto", "lock", "semaphore", "rwlock")
Kind = Literal["lock", "semaphore", "rwlock"]


class _LeaseView(TypedDict):
    token_prefix: str  # the holder's token, first 8 characters
    ttl_s: float | None  # validity left, seconds
    holder: dict[str, Any] | None  # as a lock's holder; readers store none (None)


class Lessee(_LeaseView, total=False):
    """One lease of a semaphore or read-write lock: a permit (with ``slot``), a reader or the
    writer. In a server row: that server's view. In the report: merged over the servers by
    token, ``servers_held`` of them hold it and ``majority`` says whether that is a majority;
    ``ttl_s`` is then the validity left on a majority (None when none holds it)."""

    slot: int  # permits only: the slot, 0..limit-1
    servers_held: int  # report only
    majority: bool  # report only


class Waiter(TypedDict):
    """A fair lock's waiter in line (report ``queue``): its id prefix and on how many servers
    it is in line."""

    waiter_prefix: str
    servers: int


class _ServerView(TypedDict):
    server: str  # password-free name
    held: bool  # the lock key exists
    token_prefix: str | None  # the holder's token, first 8 characters
    ttl_s: float | None  # validity left on this server, seconds
    # holder metadata (host, pid, purpose...), {"raw": text}, or {"handed_over": True} for a
    # lease a release handed to the first waiter in line (no holder info is written for it)
    holder: dict[str, Any] | None
    fence: int | None  # this server's fence register
    error: str | None  # why the server could not be read (or its fence register is bad)


class ServerStatus(_ServerView, total=False):
    """One server's view of a lock (a row of ``fencelock status --json``).

    For a semaphore the row also has ``permits`` and, while permits may be valid there, the
    ``limit`` the server keeps for the name; for a read-write lock ``readers`` and
    ``writer_waiting`` (a waiting writer's intent marker is set); ``held`` and the rest are
    the lock key itself (a read-write lock's writer)."""

    permits: list[Lessee]
    limit: int
    readers: list[Lessee]
    writer_waiting: bool
    queue: list[str]  # a fair lock's waiters on this server, in line order (id prefixes)
    # present while a hand-off marker is set (a release woke a waiter: newcomers step aside):
    # seconds left, or None for a marker without a TTL (stray: the next acquire deletes it)
    handoff_ttl_s: float | None


class _LockStatus(TypedDict):
    key: str
    servers: list[ServerStatus]
    fence: int | None  # the highest fence register found, None when none was
    leader: str | None  # for an election key: the leader's name (held on a majority), else None


class Status(_LockStatus, total=False):
    """The object ``fencelock status --json`` prints.

    A plain lock's object has exactly ``key``, ``servers``, ``fence``, ``leader`` (as in
    v0.1). A semaphore's or read-write lock's object adds ``kind`` and, merged over the
    servers: a semaphore's ``limit`` (as given, else the limit a majority of the servers keep
    while its permits may be valid, else None) and
    ``permits``; a read-write lock's ``readers``, ``writer`` (None when no writer holds it on
    any server) and ``writer_waiting`` (the intent marker is set on a majority)."""

    kind: Kind
    limit: int | None
    queue: list[Waiter]
    permits: list[Lessee]
    readers: list[Lessee]
    writer: Lessee | None
    writer_waiting: bool


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


def status(
    servers: str | Sequence[str],
    key: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    kind: str = "auto",
    limit: int | None = None,
) -> Status:
    """Who holds lock ``key`` on each server, the validity left there, and the fence registers;
    for a semaphore its permits, for a read-write lock its readers and writer.

    Plain reads, in parallel, nothing changes. Shape: ``{"key", "servers": [{"server",
    "held", "token_prefix", "ttl_s", "holder", "fence", "error"}, ...], "fence", "leader"}``
    (``leader``: the elected leader's name for an election key, else None), plus the fields
    :class:`Status` names for a semaphore or read-write lock.

    ``kind`` (one of :data:`KINDS`): ``"auto"`` (default) finds a semaphore by its slot keys
    (a ``SCAN`` of the server's keys for them) and a read-write lock by its readers or
    writer-intent keys; a read-write lock held only by its writer, or a semaphore with no
    permit out, then looks like a plain lock, so name the kind to see it as one. ``limit``:
    the semaphore's limit, when known (servers keep it only while permits may be valid);
    slots ``0..limit-1`` are read
    directly, without a ``SCAN``. Reading a semaphore's or read-write lock's keys needs
    ``SCAN`` (unless ``limit`` is given), ``ZRANGE`` and ``TIME``; where the server refuses
    them (a least-privilege ACL user has no ``SCAN``), ``"auto"`` reports the key as a lock,
    and a named kind says why in the row's ``error``. Raises :class:`~fencelock.ConfigError`
    for an unknown kind, a bad limit, or a limit with a kind other than ``"auto"`` /
    ``"semaphore"``.
    """
    urls, name, timeout = _check(servers, key, timeout)
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if limit is not None:
        limit = check_limit(limit)
        if kind not in ("auto", "semaphore"):
            raise ConfigError(f"limit is for a semaphore, not a {kind}")
        kind = "semaphore"
    keys = lock_keys(name)
    family = kind != "lock"
    family_name = name if family else None
    strict = kind != "auto"
    rows = _each(
        urls,
        lambda url: _probe(url, keys, timeout, family=family_name, limit=limit, strict=strict),
    )
    fences = [row["fence"] for row in rows if row["fence"] is not None]
    report: Status = {
        "key": name,
        "servers": rows,
        "fence": max(fences) if fences else None,
        "leader": _leader(rows),
    }
    if any(row.get("queue") for row in rows):
        report["queue"] = _merged_queue(rows)
    found = _kind_found(rows) if kind == "auto" else kind
    for row in rows:  # a row shows only the lists of the kind found
        if found != "semaphore":
            row.pop("permits", None)
            row.pop("limit", None)
        if found != "rwlock":
            row.pop("readers", None)
            row.pop("writer_waiting", None)
    if found == "semaphore":
        report["kind"] = "semaphore"
        report["limit"] = limit if limit is not None else _kept_limit(rows)
        report["permits"] = _merge(rows, "permits")
    elif found == "rwlock":
        report["kind"] = "rwlock"
        report["readers"] = _merge(rows, "readers")
        report["writer"] = _writer(rows)
        waiting = sum(1 for row in rows if row.get("writer_waiting"))
        report["writer_waiting"] = waiting >= len(rows) // 2 + 1
    return report


def _merged_queue(rows: Sequence[ServerStatus]) -> list[Waiter]:
    """A fair lock's line over the servers: each waiter once, in the order of its best place
    on any server, with how many servers have it in line."""
    places: dict[str, list[int]] = {}
    for row in rows:
        for place, waiter in enumerate(row.get("queue", [])):
            places.setdefault(waiter, []).append(place)
    order = sorted(places, key=lambda waiter: (min(places[waiter]), waiter))
    return [{"waiter_prefix": waiter, "servers": len(places[waiter])} for waiter in order]


def _kept_limit(rows: Sequence[ServerStatus]) -> int | None:
    """The semaphore limit a majority of the servers keep for the name, else None."""
    kept = [row["limit"] for row in rows if "limit" in row]
    for value in set(kept):
        if kept.count(value) >= len(rows) // 2 + 1:
            return value
    return None


def _kind_found(rows: Sequence[ServerStatus]) -> Kind:
    if any(row.get("permits") for row in rows):
        return "semaphore"
    if any(row.get("readers") or row.get("writer_waiting") for row in rows):
        return "rwlock"
    return "lock"


def _merged_ttl(ttls: list[float | None], majority: int) -> float | None:
    """The validity left on a majority: the majority-th longest of the servers' validities."""
    known = sorted((t for t in ttls if t is not None), reverse=True)
    return known[majority - 1] if len(known) >= majority else None


def _merge(rows: Sequence[ServerStatus], field: Literal["permits", "readers"]) -> list[Lessee]:
    """One entry per lease (token, and slot for permits) over every server that shows it."""
    majority = len(rows) // 2 + 1
    seen: dict[tuple[int, str], list[Lessee]] = {}
    for row in rows:
        for one in row.get(field, []):
            seen.setdefault((one.get("slot", -1), one["token_prefix"]), []).append(one)
    merged: list[Lessee] = []
    for (slot, token), views in sorted(seen.items()):
        entry: Lessee = {
            "token_prefix": token,
            "ttl_s": _merged_ttl([v["ttl_s"] for v in views], majority),
            "holder": next((v["holder"] for v in views if v["holder"] is not None), None),
            "servers_held": len(views),
            "majority": len(views) >= majority,
        }
        if slot >= 0:
            entry = {"slot": slot, **entry}  # slot first in the JSON
        merged.append(entry)
    return merged


def _writer(rows: Sequence[ServerStatus]) -> Lessee | None:
    """The writer (the lock key's holder) held on the most servers, or None."""
    majority = len(rows) // 2 + 1
    by_token: dict[str, list[ServerStatus]] = {}
    for row in rows:
        if row["held"] and row["token_prefix"] is not None:
            by_token.setdefault(row["token_prefix"], []).append(row)
    if not by_token:
        return None
    token, views = max(by_token.items(), key=lambda item: (len(item[1]), item[0]))
    return {
        "token_prefix": token,
        "ttl_s": _merged_ttl([v["ttl_s"] for v in views], majority),
        "holder": next((v["holder"] for v in views if v["holder"] is not None), None),
        "servers_held": len(views),
        "majority": len(views) >= majority,
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
        urls.append(check_any_url(url))
    return urls, check_key(key), seconds(timeout, "timeout")


def _client(url: str, keys: LockKeys, timeout: float) -> tuple[str, redis.Redis | str]:
    """(the server's name, a client of our own: short timeouts, no retries, no handshake
    extras; for a cluster URL, of the primary that owns the lock's slot). Instead of the
    client, the error (in :func:`_error`'s words) when a cluster URL's seed cannot say which
    node that is."""
    from ._engine.plain_clients import client_name, plain_client

    try:
        client = plain_client(url, timeout, key=keys.lock)
    except Exception as exc:  # redis-py's cluster errors are not all RedisErrors
        return str(url_name(url)), _error(exc)
    return client_name(client, url), client


def _each(urls: Sequence[str], one: Callable[[str], ServerStatus]) -> list[ServerStatus]:
    if len(urls) == 1:
        return [one(urls[0])]
    from concurrent.futures import ThreadPoolExecutor

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


def _lock_value(value: object, holder_key: object) -> tuple[bytes | None, object]:
    """The token and the holder info in a lock key's value (a GET), the info from its
    separate holder key (a GET: fencelock 0.3 and older wrote it there) when the value has
    none."""
    if not isinstance(value, bytes) or not value:  # none, or the hand-off marker
        return None, None
    token, info = split_lock_value(value)
    return token, (info if info is not None else holder_key)


def _holder(raw: object) -> dict[str, Any] | None:
    text = _text(raw)
    if not text:
        return None
    parsed = parse_holder(text)
    return parsed if parsed is not None else {"raw": text[:MAX_RAW_SHOWN]}


def _ttl_s(pttl: object) -> float | None:
    return pttl / 1000 if isinstance(pttl, int) and pttl >= 0 else None


_GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def _slot_indexes(client: redis.Redis, name: str) -> list[int]:
    """The slots of semaphore ``name`` with any key on this server (SCAN MATCH; read only)."""
    base = slot_keys(name, 0).lock.removesuffix("0")  # "fencelock:{tag}:slot:"
    found: set[int] = set()
    for raw in client.scan_iter(match=base.translate(_GLOB_SPECIAL) + "*", count=1000):
        rest = str(_text(raw))[len(base) :]
        digits = rest.split(":", 1)[0]
        if digits.isdigit():
            found.add(int(digits))
    return sorted(found)


def _family_probe(client: redis.Redis, row: ServerStatus, name: str, limit: int | None) -> None:
    """Add the semaphore's permits and the read-write lock's readers to ``row``."""
    rw = rw_keys(name)
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.zrange(rw.readers, 0, -1, withscores=True)
    pipe.exists(rw.intent)
    pipe.get(limit_key(name))
    now, readers, intent, kept = pipe.execute()
    kept_text = _text(kept)
    if kept_text is not None and kept_text.isdigit():
        row["limit"] = int(kept_text)
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    row["readers"] = [
        {"token_prefix": str(_text(member))[:8], "ttl_s": (expiry - now_ms) / 1000, "holder": None}
        for member, expiry in readers
        if expiry > now_ms
    ]
    row["writer_waiting"] = bool(intent)
    slots = list(range(limit)) if limit is not None else _slot_indexes(client, name)
    pipe = client.pipeline(transaction=False)
    for slot in slots:
        keys = slot_keys(name, slot)
        pipe.get(keys.lock)
        pipe.pttl(keys.lock)
        pipe.get(keys.holder)
    replies = pipe.execute() if slots else []
    permits: list[Lessee] = []
    for index, slot in enumerate(slots):
        value, pttl, holder_key = replies[3 * index : 3 * index + 3]
        token, holder = _lock_value(value, holder_key)
        token_text = _text(token)
        if token_text is not None:
            permits.append(
                {
                    "slot": slot,
                    "token_prefix": token_text[:8],
                    "ttl_s": _ttl_s(pttl),
                    "holder": _holder(holder),
                }
            )
    row["permits"] = permits


def _probe(
    url: str,
    keys: LockKeys,
    timeout: float,
    *,
    family: str | None = None,
    limit: int | None = None,
    strict: bool = False,
) -> ServerStatus:
    """One server's view of the lock (plain reads with a short timeout; never raises); with
    ``family`` (the key's name), also of the semaphore's slots and the read-write lock's
    readers. Where those cannot be read (e.g. an ACL user without ``SCAN``) the row has no
    lists; ``strict`` (the kind was named) also says why in ``error``."""
    name, client = _client(url, keys, timeout)
    row: ServerStatus = {
        "server": name,
        "held": False,
        "token_prefix": None,
        "ttl_s": None,
        "holder": None,
        "fence": None,
        "error": None,
    }
    if isinstance(client, str):
        row["error"] = client.removeprefix("error: ")
        return row
    try:
        pipe = client.pipeline(transaction=False)
        pipe.get(keys.lock)
        pipe.pttl(keys.lock)
        pipe.get(keys.holder)
        pipe.get(keys.fence)
        pipe.zrange(fair_queue_key(keys), 0, -1)
        pipe.pttl(keys.handoff)
        value, pttl, holder_key, fence, queue, handoff = pipe.execute()
        token, holder = _lock_value(value, holder_key)
        if value == b"":  # the hand-off marker (a release woke a waiter): nobody holds it
            handoff = pttl
        if isinstance(handoff, int) and handoff != -2:
            row["handoff_ttl_s"] = handoff / 1000 if handoff >= 0 else None
        if queue:
            row["queue"] = [str(_text(member))[:8] for member in queue]
        family_error = None
        if family is not None:
            try:
                _family_probe(client, row, family, limit)
            except Exception as exc:  # the lock's own fields above still stand
                family_error = _error(exc).removeprefix("error: ")
                for part in ("permits", "readers", "writer_waiting"):
                    row.pop(part, None)  # type: ignore[misc]
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
        parsed = parse_holder(holder_text)
        row["holder"] = parsed if parsed is not None else {"raw": holder_text[:MAX_RAW_SHOWN]}
    elif token_text is not None and token_text.startswith(HANDED_PREFIX):
        # a release handed the lock to the first waiter in line: it could not know who that
        # would be, so no holder info was written
        row["holder"] = {"handed_over": True}
    fence_text = _text(fence)
    if fence_text is not None:
        try:
            row["fence"] = int(fence_text)
        except ValueError:
            row["error"] = f"fence register is not an integer: {fence_text[:40]!r}"
    if family_error is not None and strict and row["error"] is None:
        row["error"] = f"could not read the permits / readers: {family_error}"
    return row


def _run_release(client: redis.Redis, keys: LockKeys, token: str | bytes) -> bool:
    """release.lua once (EVALSHA, EVAL on NOSCRIPT): True when it deleted ``token``'s lock."""
    from redis.exceptions import NoScriptError

    script_keys = release_keys(keys)
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
    name, client = _client(url, keys, timeout)
    if isinstance(client, str):
        return ServerOutcome(name, client)
    try:
        released = _run_release(client, keys, token)
    except Exception as exc:
        return ServerOutcome(name, _error(exc))
    finally:
        client.close()
    return ServerOutcome(name, "released" if released else "not-held")


def _force_one(url: str, keys: LockKeys, timeout: float) -> ServerOutcome:
    name, client = _client(url, keys, timeout)
    if isinstance(client, str):
        return ServerOutcome(name, client)
    try:
        for _ in range(FORCE_ATTEMPTS):
            value, holder_key = client.mget([keys.lock, keys.holder])
            if not value:  # none, or the hand-off marker (deleted only while it is one)
                if value == b"":
                    client.eval(_DELETE_MARKER, 1, keys.lock)
                client.delete(keys.holder, keys.handoff)
                return ServerOutcome(name, "free")
            token, holder = _lock_value(value, holder_key)
            if _run_release(client, keys, value):
                # newcomers need not step aside for anyone; fencelock 0.3 and older kept its
                # holder info in a key of its own
                client.delete(keys.handoff, keys.holder)
                return ServerOutcome(name, "deleted", str(_text(token))[:8], _text(holder))
        return ServerOutcome(name, "busy")
    except Exception as exc:
        return ServerOutcome(name, _error(exc))
    finally:
        client.close()
