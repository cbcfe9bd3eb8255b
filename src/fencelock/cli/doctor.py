"""``fencelock doctor``: is this set of servers fit to hold locks, and what to change if not.

Each server is asked, with a plain redis-py client of its own (short timeouts, no retries,
closed before returning), for what decides whether a lock and its fences hold there:

- ``INFO server|memory|persistence``, ``CONFIG GET appendfsync`` (when allowed), ``ROLE``;
- ``TIME`` three times, against this machine's wall clock, corrected by half the round trip;
- ``COMMAND INFO`` (when allowed) and the version: which native compare-and-set commands exist;
- the commands fencelock sends, tried harmlessly as the connecting user (``PING``, ``INFO``,
  ``ROLE``, ``EVALSHA`` of an unknown script, ``BLPOP`` with a 10 ms timeout on a key under
  ``fencelock:*``, and one ``EVAL`` whose script ``pcall``\\ s every command the lock scripts use,
  on probe keys ``fencelock:{fencelock-doctor}:*`` that it deletes again (1 s TTL anyway)).

The checks (``name``: what fails it):

- ``reachable``: a server did not answer (refused, timed out, wrong password). Exit 69.
- ``eviction_policy``: a ``maxmemory-policy`` that may evict lock keys (``allkeys-*`` evicts any
  key, ``volatile-*`` evicts keys with a TTL, which every lock key has, first).
- ``persistence``: no AOF with ``appendfsync always``; a restart then forgets grants and fence
  registers (DESIGN "Where it can still fail").
- ``clock_offsets``: server clocks apart by more than :data:`CLOCK_SPREAD_MS`.
- ``independence``: the same server (``run_id``) listed twice.
- ``replicas``: a replica listed as a node.
- ``acl``: the connecting user may not run a command fencelock needs (``NOPERM``).
- ``tls``: a ``rediss://`` URL that does not authenticate its server (``ssl_cert_reqs=none``
  or ``optional``, ``ssl_check_hostname=false``): a warning.
- ``native_commands``: informational (always ok): ``SET ... IFEQ``, ``DELIFEQ``, ``DELEX``.
- ``cluster`` (one per ``redis+cluster://`` URL, whose primaries are then checked as above):
  ``cluster_state`` not ok or slots without a primary (error), a primary without a replica
  (warning); also that the keys of one lock hash to one slot.

:func:`diagnose` returns the report (the JSON object of ``fencelock doctor --json``);
:func:`run` prints it and returns the exit code (0 no check failed, warnings allowed; 1 a
check of severity ``"error"`` failed, or with ``strict`` a warning too; 69 unreachable).

Why this module is longer than 600 lines: one check per deployment rule (eviction,
persistence, clocks, independence, replicas, ACL, TLS), each short, over one report shape.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypedDict
from urllib.parse import urlsplit, urlunsplit

import redis

from .._core.keys import lock_keys
from .._engine.address import (
    InsecureTLSWarning,
    check_any_url,
    cluster_seed_from_url,
    insecure_tls,
    is_cluster_url,
    url_tls,
)
from .._engine.plain_clients import client_name, plain_client
from ..errors import ConfigError
from ..options import check_url, redact_url, seconds

__all__ = [
    "ACL_SETUSER",
    "CLOCK_SPREAD_MS",
    "DEFAULT_TIMEOUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "Check",
    "Report",
    "ServerReport",
    "diagnose",
    "run",
]

#: Per-server timeout (s) of every command here.
DEFAULT_TIMEOUT = 1.0
#: Server clocks further apart than this fail ``clock_offsets``: fences take a floor from each
#: server's ``TIME``; after a restart without persistence, a server whose clock is behind the
#: others by more than the gap between two holders can hand out a smaller fence.
CLOCK_SPREAD_MS = 100.0
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREACHABLE = 69

#: The least-privilege user for fencelock's lock servers (documented in docs/deploying.md):
#: exactly the commands fencelock sends (``INFO``/``ROLE`` on new connections, ``EVALSHA``/
#: ``EVAL``, ``BLPOP`` / ``BLMOVE`` to wait for a release (and claim a hand-over),
#: ``CLIENT ID`` / ``CLIENT UNBLOCK`` to end an interrupted claim, ``PING`` to probe a server,
#: ``MGET`` and ``DEL`` for ``fencelock release --force``, and the reads of ``fencelock status``)
#: plus the commands its scripts call, on ``fencelock:*`` keys only. ``AUTH`` is always
#: allowed; ``SELECT`` is needed for a database other than 0. ``CLIENT UNBLOCK`` cannot be
#: limited to the user's own connections: a waiter whose wait was cut short (a timeout, a
#: cancelled task) ends its blocked ``BLMOVE`` with it from another connection and hears the
#: answer, so that a hand-over granted meanwhile is claimed, not lost until its TTL. See
#: docs/security.md for what that lets the user do. Not included: ``SCAN`` (``fencelock
#: top``, and ``status`` of a semaphore without ``--limit``), which lists every key name on
#: the server, other applications' too.
ACL_SETUSER = (
    "ACL SETUSER fencelock on >CHANGE-ME resetkeys ~fencelock:* resetchannels -@all "
    "+ping +info +role +select +eval +evalsha +blpop +blmove +client|id +client|unblock "
    "+get +mget +set +del +exists +pexpire +pttl +zadd +zrem +zcard +zremrangebyscore +rpush "
    "+time +zrange +zrangebyscore +zscore +lrange"
)

# what fencelock sends itself, and what its Lua scripts call (checked per call by the server)
_DIRECT = (
    "PING", "INFO", "ROLE", "EVAL", "EVALSHA", "BLPOP", "BLMOVE", "CLIENT|ID", "CLIENT|UNBLOCK",
    "MGET",
)  # fmt: skip
_IN_SCRIPTS = (
    "SET", "GET", "PTTL", "PEXPIRE", "EXISTS", "ZADD", "ZCARD",
    "ZREMRANGEBYSCORE", "ZREM", "RPUSH", "TIME", "DEL", "ZRANGE", "ZRANGEBYSCORE", "ZSCORE",
    "LRANGE",
)  # fmt: skip
_OPTIONAL = frozenset({"INFO", "ROLE"})  # without them: no identity checks, still works
_PROBE_BASE = "fencelock:{fencelock-doctor}"
_PROBE_KEYS = tuple(f"{_PROBE_BASE}:{kind}" for kind in ("string", "zset", "list"))
# KEYS: string, zset, list probe keys. Returns the commands refused by the ACL, each as
# "NAME=error". Every key gets a 1 s TTL as soon as it exists, and DEL removes them at the end.
_PROBE_SCRIPT = """
local denied = {}
local function try(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    local err = reply.err
    if string.find(err, 'NOPERM', 1, true) or string.find(err, 'ACL', 1, true)
        or string.find(err, 'user executing the script', 1, true) then
      table.insert(denied, (select(1, ...)) .. '=' .. err)
    end
  end
end
try('SET', KEYS[1], '1', 'PX', 1000)
try('GET', KEYS[1])
try('PTTL', KEYS[1])
try('PEXPIRE', KEYS[1], 1000)
try('EXISTS', KEYS[1])
try('ZADD', KEYS[2], 1, 'm')
try('PEXPIRE', KEYS[2], 1000)
try('ZCARD', KEYS[2])
try('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(0')
try('ZRANGE', KEYS[2], 0, -1)
try('ZRANGEBYSCORE', KEYS[2], '-inf', '+inf')
try('ZSCORE', KEYS[2], 'm')
try('ZREM', KEYS[2], 'm')
try('RPUSH', KEYS[3], 'x')
try('PEXPIRE', KEYS[3], 1000)
try('LRANGE', KEYS[3], 0, 7)
try('TIME')
try('DEL', KEYS[1], KEYS[2], KEYS[3])
return denied
"""

Severity = Literal["error", "warning", "info"]


class ServerReport(TypedDict):
    """One row of ``servers`` (None where the server did not say, or would not)."""

    server: str  # password-free name, as the lock's messages show it
    engine: str | None  # "valkey" or "redis"
    version: str | None
    role: str | None  # "master", "slave"...
    maxmemory_policy: str | None
    appendonly: bool | None
    appendfsync: str | None  # None when CONFIG is not allowed (ElastiCache, ACLs)
    native_commands: list[str]
    clock_offset_ms: float | None  # server TIME minus this machine's clock, RTT/2 corrected
    run_id: str | None


class Check(TypedDict):
    name: str
    ok: bool
    severity: Severity  # how bad it is when not ok ("info": nothing to fix)
    detail: str  # what was found; when not ok, what to change


class Report(TypedDict):
    servers: list[ServerReport]
    checks: list[Check]


class _Probe:
    """What one server told (the row, plus what the checks need beyond it)."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.row: ServerReport = {
            "server": name,
            "engine": None,
            "version": None,
            "role": None,
            "maxmemory_policy": None,
            "appendonly": None,
            "appendfsync": None,
            "native_commands": [],
            "clock_offset_ms": None,
            "run_id": None,
        }
        self.error: str | None = None  # unreachable: why
        self.clock_error_ms = 0.0  # half the best round trip of TIME
        self.maxmemory: int | None = None
        self.primary: str | None = None  # a replica's primary (host:port)
        self.denied: dict[str, str] = {}  # command -> the server's refusal
        self.unjudged: list[str] = []  # commands whose permission could not be tried
        self.user: str | None = None


# -- gathering ------------------------------------------------------------------------------------


def _client(url: str, timeout: float) -> redis.Redis:
    client = plain_client(url, timeout)
    client.set_response_callback("COMMAND", lambda reply, **_: reply)  # raw COMMAND INFO
    return client


def _execute(client: redis.Redis, *args: object) -> Any:
    execute: Any = client.execute_command  # untyped in redis-py
    return execute(*args)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _version_tuple(text: str | None) -> tuple[int, int, int]:
    parts = [int(p) for p in (text or "").split(".")[:3] if p.isdigit()]
    parts += [0] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def _is_noperm(exc: BaseException) -> bool:
    return isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in str(exc)[:12]


def native_commands(engine: str | None, version: str | None, known: set[str] | None) -> list[str]:
    """``SET ... IFEQ`` (Valkey >= 8.1, Redis >= 8.4), ``DELIFEQ`` (Valkey >= 9),
    ``DELEX`` (Redis >= 8.4); ``known``: what ``COMMAND INFO`` found (None: not allowed)."""
    v = _version_tuple(version)
    found = []
    if (engine == "valkey" and v >= (8, 1, 0)) or (engine == "redis" and v >= (8, 4, 0)):
        found.append("SET IFEQ")
    for name, by_version in (
        ("DELIFEQ", engine == "valkey" and v >= (9, 0, 0)),
        ("DELEX", engine == "redis" and v >= (8, 4, 0)),
    ):
        if (known is None and by_version) or (known is not None and name in known):
            found.append(name)
    return found


def _try(probe: _Probe, name: str, call: Any) -> Any:
    """Run ``call()``; a NOPERM is recorded against ``name`` (None returned), other reply
    errors are returned as the exception; connection errors propagate."""
    try:
        return call()
    except redis.exceptions.ResponseError as exc:
        if _is_noperm(exc):
            probe.denied[name] = _text(exc)
            return None
        return exc


def _gather(url: str, timeout: float) -> _Probe:
    client = _client(url, timeout)
    probe = _Probe(url, client_name(client, url))  # a Sentinel URL: the primary it names
    probe.user = client.connection_pool.connection_kwargs.get("username")
    try:
        _ask(client, probe)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        probe.error = " ".join(f"{type(exc).__name__}: {exc}".split())
    except redis.exceptions.ResponseError as exc:  # NOAUTH and the like
        probe.error = " ".join(f"{type(exc).__name__}: {exc}".split())
    finally:
        client.close()
    return probe


def _ask(client: redis.Redis, probe: _Probe) -> None:
    row = probe.row
    _try(probe, "PING", client.ping)
    info = _try(probe, "INFO", lambda: client.info("server"))
    if isinstance(info, dict):
        row["run_id"] = str(info.get("run_id")) if info.get("run_id") else None
        if "valkey_version" in info or info.get("server_name") == "valkey":
            row["engine"] = "valkey"
            row["version"] = str(info.get("valkey_version") or info.get("redis_version"))
        else:
            row["engine"] = "redis"
            row["version"] = str(info.get("redis_version")) if "redis_version" in info else None
        memory = _try(probe, "INFO", lambda: client.info("memory"))
        if isinstance(memory, dict):
            policy = memory.get("maxmemory_policy")
            row["maxmemory_policy"] = None if policy is None else str(policy)
            maxmemory = memory.get("maxmemory")
            probe.maxmemory = maxmemory if isinstance(maxmemory, int) else None
        persistence = _try(probe, "INFO", lambda: client.info("persistence"))
        if isinstance(persistence, dict) and "aof_enabled" in persistence:
            row["appendonly"] = bool(int(persistence["aof_enabled"]))
    try:
        fsync = client.config_get("appendfsync").get("appendfsync")
        row["appendfsync"] = None if fsync is None else str(fsync)
        if row["maxmemory_policy"] is None:
            policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
            row["maxmemory_policy"] = None if policy is None else str(policy)
    except redis.exceptions.ResponseError:
        pass  # CONFIG renamed or not allowed: unknown, said so in the checks
    role = _try(probe, "ROLE", lambda: _execute(client, "ROLE"))
    if isinstance(role, list | tuple) and role:
        row["role"] = _text(role[0])
        if row["role"] in ("slave", "replica") and len(role) >= 3:
            probe.primary = f"{_text(role[1])}:{role[2]}"
    _clock(client, probe)
    known: set[str] | None = None
    try:
        reply = _execute(client, "COMMAND", "INFO", "DELIFEQ", "DELEX")
        known = {_text(e[0]).upper() for e in reply if isinstance(e, list | tuple) and e}
    except redis.exceptions.ResponseError:
        known = None
    row["native_commands"] = native_commands(row["engine"], row["version"], known)
    _permissions(client, probe)


def _clock(client: redis.Redis, probe: _Probe) -> None:
    """The server clock's offset from ours: the sample with the shortest round trip, its
    midpoint taken as the moment the server read its clock (error at most RTT/2)."""
    best: tuple[float, float] | None = None
    for _ in range(3):
        before = time.time()
        reply = _try(probe, "TIME", lambda: _execute(client, "TIME"))
        after = time.time()
        if not isinstance(reply, list | tuple) or len(reply) != 2:
            return
        server_s = int(reply[0]) + int(reply[1]) / 1e6
        rtt = after - before
        offset_ms = (server_s - (before + rtt / 2)) * 1000.0
        if best is None or rtt < best[0]:
            best = (rtt, offset_ms)
    if best is not None:
        probe.row["clock_offset_ms"] = round(best[1], 3)
        probe.clock_error_ms = best[0] * 500.0


def _permissions(client: redis.Redis, probe: _Probe) -> None:
    """Try what fencelock sends, harmlessly, as this user (NOPERM is recorded)."""
    _try(probe, "EVALSHA", lambda: _execute(client, "EVALSHA", "0" * 40, 0))
    _try(probe, "BLPOP", lambda: _execute(client, "BLPOP", _PROBE_KEYS[2], "0.01"))
    # an empty list moved onto itself: nothing changes
    _try(
        probe,
        "BLMOVE",
        lambda: _execute(client, "BLMOVE", _PROBE_KEYS[2], _PROBE_KEYS[2], "LEFT", "RIGHT", "0.01"),
    )
    _try(probe, "CLIENT|ID", lambda: _execute(client, "CLIENT", "ID"))
    _try(probe, "CLIENT|UNBLOCK", lambda: _execute(client, "CLIENT", "UNBLOCK", "0"))
    # release --force reads the token and the holder info in one MGET (read only)
    _try(probe, "MGET", lambda: _execute(client, "MGET", _PROBE_KEYS[0], _PROBE_KEYS[0]))
    reply = _try(probe, "EVAL", lambda: client.eval(_PROBE_SCRIPT, len(_PROBE_KEYS), *_PROBE_KEYS))
    if "EVAL" in probe.denied:
        probe.unjudged = list(_IN_SCRIPTS)  # scripts cannot run at all
    elif isinstance(reply, list):
        for entry in reply:
            name, _, error = _text(entry).partition("=")
            probe.denied.setdefault(name, error)
    elif isinstance(reply, redis.exceptions.MovedError | redis.exceptions.AskError):
        pass  # a cluster node that does not own the probe keys: their owner judges
    else:  # READONLY on a replica, or another refusal: not judged
        probe.unjudged = list(_IN_SCRIPTS)


# -- checks ---------------------------------------------------------------------------------------


def _check(name: str, ok: bool, severity: Severity, detail: str) -> Check:
    return {"name": name, "ok": ok, "severity": severity, "detail": detail}


def _passed(name: str, unknown: Sequence[str], what: str, detail: str) -> Check:
    """The end of a check that found nothing wrong where it could look: a warning naming the
    ``unknown`` servers, where it could not read what it needs (``what``: what, and the change
    that lets it), else passed (``detail``)."""
    if unknown:
        return _check(name, False, "warning", f"{', '.join(unknown)}: {what}")
    return _check(name, True, "error", detail)


def _eviction(probes: Sequence[_Probe]) -> Check:
    bad, unknown = [], []
    for p in probes:
        policy = p.row["maxmemory_policy"]
        if policy is None:
            unknown.append(p.row["server"])
        elif policy != "noeviction":
            limit = "no maxmemory set yet" if not p.maxmemory else f"maxmemory {p.maxmemory} B"
            why = (
                "evicts any key, lock keys and fence registers included"
                if policy.startswith("allkeys")
                else "evicts keys with a TTL first, and every lock key has one"
            )
            bad.append(f"{p.row['server']}: {policy} ({limit}) {why}")
    if bad:
        return _check(
            "eviction_policy",
            False,
            "error",
            "; ".join(bad) + ". An evicted lock key lets a second holder in while the first is "
            "valid, an evicted fence register lets fences restart. Change: CONFIG SET "
            "maxmemory-policy noeviction (on ElastiCache/MemoryDB in the parameter group: their "
            "default volatile-lru evicts lock keys first), or give locks a server of their own "
            "with memory to spare.",
        )
    return _passed(
        "eviction_policy",
        unknown,
        "maxmemory-policy unknown (INFO memory not allowed). Change: allow INFO for this user, "
        "and make sure the policy is noeviction.",
        "noeviction everywhere: lock keys stay",
    )


def _persistence(probes: Sequence[_Probe]) -> Check:
    weak = []
    for p in probes:
        aof, fsync = p.row["appendonly"], p.row["appendfsync"]
        if aof and fsync == "always":
            continue
        if aof is None:
            state = "persistence unknown (INFO persistence not allowed)"
        elif not aof:
            state = "appendonly no"
        else:
            state = f"appendonly yes, appendfsync {fsync or 'unknown (CONFIG not allowed)'}"
        weak.append(f"{p.row['server']}: {state}")
    if not weak:
        return _check(
            "persistence",
            True,
            "warning",
            "appendonly yes, appendfsync always everywhere: a restart keeps every grant and "
            "fence register",
        )
    redlock = len(probes) > 1
    return _check(
        "persistence",
        False,
        "warning",
        "; ".join(weak) + ". A crash then forgets recent grants (a second holder can get the "
        "lock while the first is valid) and fence registers (fences fall back to the server's "
        "TIME floor, which goes backwards if that server's clock is behind the others': "
        "a stale holder's write would then be accepted). "
        + (
            "Lock(restart_delay=True), the default for several servers, keeps a restarted "
            "server from voting until its uptime exceeds the ttl, for the processes that knew "
            "it before the restart. "
            if redlock
            else ""
        )
        + "Change: CONFIG SET appendonly yes and CONFIG SET appendfsync always, or restart a "
        "crashed server only after the longest lock ttl has passed.",
    )


def _clocks(probes: Sequence[_Probe]) -> Check:
    timed = [p for p in probes if p.row["clock_offset_ms"] is not None]
    if len(probes) < 2:
        return _check("clock_offsets", True, "warning", "one server: no clocks to compare")
    if len(timed) < 2:
        return _check(
            "clock_offsets",
            False,
            "warning",
            "fewer than two servers answered TIME, so their clocks could not be compared. "
            "Change: allow TIME for this user.",
        )
    offsets = {p.row["server"]: float(p.row["clock_offset_ms"] or 0.0) for p in timed}
    error = max(p.clock_error_ms for p in timed) * 2
    spread = max(offsets.values()) - min(offsets.values())
    shown = ", ".join(f"{name} {value:+.1f} ms" for name, value in offsets.items())
    if spread - error > CLOCK_SPREAD_MS:
        return _check(
            "clock_offsets",
            False,
            "warning",
            f"server clocks are {spread:.0f} ms apart (± {error:.1f} ms; {shown}), more than "
            f"{CLOCK_SPREAD_MS:.0f} ms. Fences take a floor from each server's TIME: after a "
            "restart without persistence, a server whose clock is behind can hand out a "
            "smaller fence. Change: run NTP/chrony on every server host.",
        )
    return _check(
        "clock_offsets",
        True,
        "warning",
        f"server clocks within {spread:.1f} ms (± {error:.1f} ms) of each other: {shown}",
    )


def _independence(probes: Sequence[_Probe]) -> Check:
    seen: dict[str, str] = {}
    twice = []
    for p in probes:
        run_id = p.row["run_id"]
        if run_id is None:
            continue
        if run_id in seen:
            twice.append(f"{p.row['server']} and {seen[run_id]} (run_id {run_id[:8]}…)")
        else:
            seen[run_id] = p.row["server"]
    if twice:
        return _check(
            "independence",
            False,
            "error",
            "the same server is listed twice: " + "; ".join(twice) + ". A majority of names is "
            "then not a majority of servers. Change: list each server once (Lock refuses this "
            "list with ConfigError).",
        )
    unknown = [p.row["server"] for p in probes if p.row["run_id"] is None]
    if len(probes) == 1:
        unknown = []  # one server cannot be listed twice: its run_id is not needed
    return _passed(
        "independence",
        unknown,
        "run_id unknown (INFO not allowed), so the same server listed twice cannot be told. "
        "Change: allow INFO for this user.",
        "every server is listed once",
    )


def _replicas(probes: Sequence[_Probe]) -> Check:
    replicas = [
        f"{p.row['server']} (a replica of {p.primary or 'another server'})"
        for p in probes
        if p.row["role"] in ("slave", "replica")
    ]
    if replicas:
        return _check(
            "replicas",
            False,
            "error",
            "replicas given as lock servers: " + ", ".join(replicas) + ". A replica refuses "
            "writes, and a primary and its replica are one failure domain, not two votes. "
            "Change: list primaries only (independent ones for Redlock); to have grants "
            "acknowledged by replicas use Lock(replicas=k).",
        )
    unknown = [p.row["server"] for p in probes if p.row["role"] is None]
    return _passed(
        "replicas",
        unknown,
        "role unknown (ROLE not allowed). Change: allow ROLE.",
        "every server is a primary",
    )


def _acl(probes: Sequence[_Probe]) -> Check:
    problems, worst = [], "warning"
    for p in probes:
        if p.denied:
            names = sorted(p.denied)
            grant = " ".join(f"+{name.lower()}" for name in names)
            user = p.user or "default"
            if not all(name in _OPTIONAL for name in names):
                worst = "error"
            problems.append(
                f"{p.row['server']}: user {user!r} may not run {', '.join(names)} "
                f"(change: ACL SETUSER {user} {grant})"
            )
        if p.unjudged and "EVAL" not in p.denied:
            problems.append(
                f"{p.row['server']}: the scripts' commands could not be tried (EVAL failed "
                "for another reason, e.g. READONLY on a replica)"
            )
    if problems:
        return _check(
            "acl",
            False,
            "error" if worst == "error" else "warning",
            "; ".join(problems) + f". Least privilege for fencelock: {ACL_SETUSER}. Without "
            "INFO and ROLE locks work but the same server twice, replicas and restarts are "
            "not detected.",
        )
    return _check(
        "acl",
        True,
        "error",
        "every command fencelock sends, and every command its scripts call, is allowed "
        "on fencelock:* keys",
    )


def _tls(urls: Sequence[object]) -> Check:
    """TLS settings that leave the server unauthenticated (from the URLs; no I/O)."""
    weak: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureTLSWarning)  # reported here instead
        for url in urls:
            if not isinstance(url, str):
                continue
            settings = url_tls(url)
            what = None if settings is None else insecure_tls(*settings)
            if what is not None:
                weak.append(f"{redact_url(url)}: {what}")
    if weak:
        return _check(
            "tls",
            False,
            "warning",
            "; ".join(weak) + ". The traffic is encrypted, but a machine in the path can pose "
            "as the server and read the password and the tokens. Change: remove "
            "ssl_cert_reqs=none/optional and ssl_check_hostname=false, give ssl_ca_certs.",
        )
    return _check(
        "tls", True, "warning", "every TLS server is verified (certificate and host name)"
    )


def _natives(probes: Sequence[_Probe]) -> Check:
    shown = "; ".join(
        f"{p.row['server']}: {', '.join(p.row['native_commands']) or 'none'}" for p in probes
    )
    return _check(
        "native_commands",
        True,
        "info",
        f"native compare-and-set commands: {shown} (fencelock's Lua scripts work everywhere; "
        "SET IFEQ comes with Valkey 8.1 and Redis 8.4, DELIFEQ with Valkey 9, DELEX with "
        "Redis 8.4)",
    )


def diagnose(servers: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Ask every server (in parallel) and judge the set; never raises for a server's failure.

    Raises:
        ConfigError: no servers, or a malformed URL (before any I/O).
    """
    given = [servers] if isinstance(servers, str) else list(servers)
    if not given:
        raise ConfigError("at least one server is needed")
    clusters = [url for url in given if isinstance(url, str) and is_cluster_url(url)]
    for url in clusters:
        cluster_seed_from_url(url)  # malformed: ConfigError before any I/O
    urls = [
        check_any_url(url) if isinstance(url, str) else _not_url(url)
        for url in given
        if url not in clusters
    ]
    timeout_s = seconds(timeout, "timeout")
    cluster_checks: list[Check] = []
    for url in clusters:  # a cluster is judged by its primaries, plus a check of its own
        primaries, check, failed = _cluster(url, timeout_s)
        urls += primaries
        cluster_checks.append(check)
        if failed is not None:
            urls.append(failed)  # its seed: reported unreachable below
    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        warnings.simplefilter("ignore", InsecureTLSWarning)  # the tls check reports it
        probes = list(pool.map(lambda url: _gather(url, timeout_s), urls))
    unreachable = [p for p in probes if p.error is not None]
    reachable = [p for p in probes if p.error is None]
    checks: list[Check] = [
        _check(
            "reachable",
            not unreachable,
            "error",
            "; ".join(f"{p.row['server']}: {(p.error or '').rstrip('.')}" for p in unreachable)
            + ". Change: check the URL, the password, the network and that the server runs."
            if unreachable
            else f"{len(probes)} of {len(probes)} servers answered",
        )
    ]
    if reachable:
        checks += [
            _eviction(reachable),
            _persistence(reachable),
            _clocks(reachable),
            _independence(reachable),
            _replicas(reachable),
            _acl(reachable),
            _natives(reachable),
        ]
    checks += cluster_checks
    checks.append(_tls(given))
    return {"servers": [p.row for p in probes], "checks": checks}


def _node_url(url: str, host: str, port: int) -> str:
    """The plain URL of one node of the cluster ``url`` (its credentials, TLS and options)."""
    scheme, _, rest = url.partition("://")
    plain = check_url(f"{scheme.lower().replace('+cluster', '')}://{rest}")
    parts = urlsplit(plain)
    auth = parts.netloc.rpartition("@")[0]
    where = f"[{host}]" if ":" in host else host
    netloc = f"{auth}@{where}:{port}" if auth else f"{where}:{port}"
    return urlunsplit(parts._replace(netloc=netloc, path="/0"))


def _cluster(url: str, timeout_s: float) -> tuple[list[str], Check, str | None]:
    """Ask the seed of a cluster URL for its state and slot map: the URLs of its primaries,
    the ``cluster`` check, and the seed's URL when it could not be asked (else None)."""
    shown = redact_url(url)
    seed = cluster_seed_from_url(url)
    seed_url = _node_url(url, seed.host, seed.port)
    client = _client(seed_url, timeout_s)
    try:
        info = _text(_execute(client, "CLUSTER", "INFO"))
        ranges = _execute(client, "CLUSTER", "SLOTS")
        keys = lock_keys("fencelock-doctor}{").script_keys  # a name that would split a tag
        key_slots = {int(_execute(client, "CLUSTER", "KEYSLOT", key)) for key in keys}
    except (redis.exceptions.RedisError, OSError) as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        check = _check(
            "cluster",
            False,
            "error",
            f"{shown}: cannot read the cluster's state ({detail}). Change: give a node of a "
            "cluster-enabled server (cluster-enabled yes), with CLUSTER allowed for this user.",
        )
        return [], check, seed_url
    finally:
        client.close()
    primaries: dict[tuple[str, int], int] = {}  # primary -> replicas
    covered = 0
    for entry in ranges:
        first, last, primary = int(entry[0]), int(entry[1]), entry[2]
        covered += last - first + 1
        where = (_text(primary[0]) or seed.host, int(primary[1]))
        primaries[where] = max(primaries.get(where, 0), len(entry) - 3)
    problems = []
    if "cluster_state:ok" not in info:
        problems.append("cluster_state is not ok. Change: fix the cluster (CLUSTER INFO)")
    if covered != 16384:
        problems.append(
            f"{16384 - covered} of 16384 slots have no primary: locks there cannot be taken. "
            "Change: assign every slot (CLUSTER ADDSLOTS, or fix the failed primary)"
        )
    alone = [f"{host}:{port}" for (host, port), n in primaries.items() if n == 0]
    if alone:
        problems.append(
            f"primaries without a replica: {', '.join(sorted(alone))}: losing one loses its "
            "slots' locks until it is back. Change: give each primary a replica"
        )
    if len(key_slots) != 1:
        problems.append(f"the keys of one lock hash to {len(key_slots)} slots (a bug: report it)")
    detail = (
        f"{shown}: {len(primaries)} primaries, "
        f"{sum(primaries.values())} replicas, {covered} of 16384 slots served; the keys of one "
        "lock share one slot. A cluster is one vote; a failover can grant a lock twice "
        "(asynchronous replication): fence your writes"
    )
    if problems:
        detail = f"{shown}: " + "; ".join(problems) + "."
    urls = [_node_url(url, host, port) for host, port in primaries]
    severity: Severity = "error" if covered != 16384 or len(key_slots) != 1 else "warning"
    return urls, _check("cluster", not problems, severity, detail), None


def _not_url(value: object) -> str:
    raise ConfigError(f"each server must be a URL, not {type(value).__name__}")


def exit_code(report: Report, *, strict: bool = False) -> int:
    """69 when a server was unreachable, 1 when another check failed (a check of severity
    ``"error"``; with ``strict``, a warning too), else 0 (warnings allowed)."""
    checks = {check["name"]: check for check in report["checks"]}
    if not checks["reachable"]["ok"]:
        return EXIT_UNREACHABLE
    failing = ("error", "warning") if strict else ("error",)
    bad = [c for c in report["checks"] if not c["ok"] and c["severity"] in failing]
    return EXIT_FAILED if bad else EXIT_OK


def _human(report: Report) -> str:
    lines = []
    for row in report["servers"]:
        if row["engine"] is None and row["run_id"] is None:
            lines.append(f"{row['server']}: no answer")
            continue
        offset = row["clock_offset_ms"]
        lines.append(
            f"{row['server']}: {row['engine']} {row['version']}, {row['role']}, "
            f"maxmemory-policy {row['maxmemory_policy']}, appendonly {row['appendonly']}, "
            f"appendfsync {row['appendfsync']}, clock "
            f"{'?' if offset is None else f'{offset:+.1f} ms'}"
        )
    for check in report["checks"]:
        mark = "ok  " if check["ok"] else ("FAIL" if check["severity"] == "error" else "WARN")
        lines.append(f"[{mark}] {check['name']}: {check['detail']}")
    return "\n".join(lines)


def run(
    servers: Sequence[str],
    *,
    json_output: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    strict: bool = False,
) -> int:
    """``fencelock doctor``: print the report (one JSON object with ``json_output``) and
    return the exit code (see :func:`exit_code`; ``strict``: warnings fail too)."""
    report = diagnose(servers, timeout=timeout)
    if json_output:
        print(json.dumps(report))
    else:
        print(_human(report))
    code = exit_code(report, strict=strict)
    if code != EXIT_OK:
        failed = [c["name"] for c in report["checks"] if not c["ok"]]
        shown = ", ".join(redact_url(u) for u in servers)
        print(
            f"fencelock doctor: {len(failed)} check(s) failed ({', '.join(failed)}) for {shown}",
            file=sys.stderr,
        )
    return code
