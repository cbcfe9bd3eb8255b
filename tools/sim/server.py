"""A simulated Valkey/Redis server for the deterministic simulation (issue 22).

It runs the commands fencelock sends (and its real Lua scripts, :mod:`tools.sim.lua`) on an
in-memory key space, on a clock it is given, with no I/O, no threads and no real time:
everything is a function of the seed, the clock and the bytes fed in. The world
(``h-simworld``) moves bytes between :class:`SimSession` objects and the clients.

What it models: strings, lists, hashes and sorted sets with the commands the library uses;
key expiry on the server's own clock (lazily, on access, which is what a command can see);
``TIME``; ``EVAL``/``EVALSHA``/``SCRIPT LOAD|EXISTS|FLUSH`` with ``NOSCRIPT``; ``INFO server``
(``run_id``, ``uptime_in_seconds``, the engine's version fields), ``ROLE`` (master);
``CLIENT ID``/``CLIENT UNBLOCK``; ``BLPOP``/``BLMOVE`` blocking their connection (later
pipelined requests wait), served in blocking order, timing out on the server clock; ``WAIT``
with no replicas; crash (data kept or wiped), restart (new run id, empty script cache).

What it does not: replication, persistence timing (a crash keeps all or nothing), memory
limits and eviction, active expiry (not visible to the commands modelled), ACLs, RESP3,
MULTI/EXEC, cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from .lua import BadArity, ScriptError, Scripts, UnknownCommand
from .resp import NIL_ARRAY, OK, Err, ProtocolError, RequestParser, Status, encode

__all__ = ["SimServer", "SimSession"]

WRONGTYPE = Err("WRONGTYPE Operation against a key holding the wrong kind of value")
NOT_INT = Err("ERR value is not an integer or out of range")
NOT_FLOAT = Err("ERR value is not a valid float")
SYNTAX = Err("ERR syntax error")
_BLOCKED = object()  # a command that blocked its session: no reply yet

_VERSIONS = {
    "valkey": ("7.2.4", "8.1.8"),
    "redis": ("7.0.15", None),
}

_NOT_IN_SCRIPT = frozenset(
    {b"EVAL", b"EVALSHA", b"SCRIPT", b"BLPOP", b"BLMOVE", b"WAIT", b"AUTH", b"CLIENT"}
)


class ZSet:
    """A sorted set: member -> score, with the (score, member) order built when read."""

    __slots__ = ("_order", "scores")

    def __init__(self) -> None:
        self.scores: dict[bytes, float] = {}
        self._order: list[tuple[float, bytes]] | None = None

    def order(self) -> list[tuple[float, bytes]]:
        if self._order is None:
            self._order = sorted((score, member) for member, score in self.scores.items())
        return self._order

    def changed(self) -> None:
        self._order = None


def _int(arg: bytes) -> int | None:
    try:
        if not arg or arg != arg.strip() or (len(arg) > 1 and arg[:1] == b"+"):
            return None
        value = int(arg)
    except ValueError:
        return None
    if len(arg) > 1 and (arg[:1] == b"0" or arg[:2] == b"-0"):
        return None
    if -(2**63) <= value < 2**63:
        return value
    return None


def _float(arg: bytes) -> float | None:
    text = arg.lower()
    if text in (b"inf", b"+inf", b"infinity", b"+infinity"):
        return math.inf
    if text in (b"-inf", b"-infinity"):
        return -math.inf
    try:
        value = float(arg)
    except ValueError:
        return None
    if value != value or arg != arg.strip():
        return None
    return value


def format_double(value: float, g17: bool = False) -> bytes:
    """A score as the engine prints it: Valkey the shortest form that reads back the same,
    Redis 7.0 ``%.17g`` (``g17``)."""
    if value == math.inf:
        return b"inf"
    if value == -math.inf:
        return b"-inf"
    if value.is_integer() and abs(value) < 1e17:
        return b"%d" % int(value)
    return (b"%.17g" % value) if g17 else repr(value).encode()


def _range_bound(arg: bytes) -> tuple[float, bool] | None:
    """A ZRANGEBYSCORE bound: (value, exclusive)."""
    exclusive = arg[:1] == b"("
    value = _float(arg[1:] if exclusive else arg)
    if value is None:
        return None
    return value, exclusive


def _slice(length: int, start: int, stop: int) -> tuple[int, int]:
    if start < 0:
        start = max(length + start, 0)
    if stop < 0:
        stop = length + stop
    if stop >= length:
        stop = length - 1
    return start, stop


class SimSession:
    """The server side of one client connection."""

    __slots__ = (
        "_incarnation",
        "_out",
        "_parser",
        "block",
        "client_id",
        "closed",
        "server",
    )

    def __init__(self, server: SimServer, client_id: int) -> None:
        self.server = server
        self.client_id = client_id
        self.closed = False
        self._parser = RequestParser()
        self._out: list[bytes] = []
        # while blocked: [kind, keys, deadline_ms or None, command args]
        self.block: list[Any] | None = None
        self._incarnation = server._incarnation

    def feed(self, data: bytes) -> None:
        """Request bytes from the client (any chunking); complete requests run at once unless
        the session is blocked (then they wait their turn). Bytes fed to a closed session are
        dropped."""
        if self.closed:
            return
        self._parser.feed(data)
        if self.block is None:
            self.server._drain(self)

    def take_output(self) -> bytes:
        """The reply bytes produced so far, in order; clears them."""
        if not self._out:
            return b""
        out = b"".join(self._out)
        self._out.clear()
        return out

    def close(self) -> None:
        """The client closed the connection: a blocked command is abandoned."""
        if self.closed:
            return
        self.closed = True
        self.server._forget(self)


class SimServer:
    """One simulated server (see the module docstring).

    ``clock()`` is this server's own clock in seconds; ``TIME`` and key expiry read it.
    ``engine`` (``"valkey"`` or ``"redis"``) picks the INFO fields and the engine-specific
    error texts.
    """

    def __init__(self, *, clock: Callable[[], float], seed: int, engine: str = "valkey") -> None:
        if engine not in _VERSIONS:
            raise ValueError(f"engine must be 'valkey' or 'redis', not {engine!r}")
        self.clock = clock
        self.seed = seed
        self.engine = engine
        self._g17 = engine == "redis"
        self.up = True
        self.data: dict[bytes, Any] = {}
        self.expires: dict[bytes, int] = {}
        self._restarts = 0
        self._incarnation = 0
        self.run_id = self._make_run_id()
        self._started = clock()
        self._next_client = 1
        self._sessions: dict[int, SimSession] = {}
        self._blocked_on: dict[bytes, deque[SimSession]] = {}
        self._waiting: set[SimSession] = set()  # blocked sessions (any kind)
        self._ready: list[bytes] = []
        self._serving = False
        self._resume: list[SimSession] = []
        self._now_ms = 0
        self.commands = 0  # commands run (client commands and scripts' calls)
        # (sha, ARGV[1]) of every script run, when the world asks for it (None: not kept)
        self.ran: set[tuple[bytes, bytes]] | None = None
        # the SHAs of the acquire scripts that take a waiter id as ARGV[5] and, when the world
        # asks for it (None: not kept), the id each of their calls carried, by token (ARGV[1]
        # -> ARGV[5] without the "+" of a Lock's first attempt)
        self.waiter_shas: frozenset[bytes] = frozenset()
        self.waiter_ids: dict[bytes, bytes] | None = None
        # ... and when (``true_now()``, the world's true time) each id was last refused here,
        # which registers it (kept with ``waiter_ids``)
        self.refused_at: dict[bytes, float] = {}
        self.true_now: Any = None
        self.scripts = Scripts(self._script_call, engine=engine)
        self._table = self._build_table()

    # -- lifecycle -------------------------------------------------------------------------

    def _make_run_id(self) -> str:
        return hashlib.sha1(b"sim-run %d %d" % (self.seed, self._restarts)).hexdigest()

    def connect(self) -> SimSession:
        """A new connection (a new client id).

        Raises:
            ConnectionRefusedError: the server is down.
        """
        if not self.up:
            raise ConnectionRefusedError("simulated server is down")
        session = SimSession(self, self._next_client)
        self._next_client += 1
        self._sessions[session.client_id] = session
        return session

    def crash(self, *, wipe: bool) -> None:
        """The process dies: every session closed; ``wipe`` empties the key space (no
        persistence), else the data is kept as if persisted to the instant of the crash."""
        self.up = False
        for session in list(self._sessions.values()):
            session.close()
        self._sessions.clear()
        self._blocked_on.clear()
        self._waiting.clear()
        if wipe:
            self.data.clear()
            self.expires.clear()

    def restart(self) -> None:
        """Back up: a new run id, uptime counted from now, an empty script cache."""
        if self.up:
            self.crash(wipe=False)
        self._restarts += 1
        self._incarnation += 1
        self.run_id = self._make_run_id()
        self._started = self.clock()
        self.scripts.flush()
        self.up = True

    def flush_scripts(self) -> None:
        """``SCRIPT FLUSH``."""
        self.scripts.flush()

    def next_timer_at(self) -> float | None:
        """The earliest server-clock time (s) a blocked command times out, or None."""
        best: int | None = None
        for session in self._waiting:
            deadline = session.block[2]  # type: ignore[index]
            if deadline is not None and (best is None or deadline < best):
                best = deadline
        return None if best is None else best / 1000.0

    def advance(self) -> None:
        """Time out the blocked commands due at ``clock()``; their replies become available
        and the requests queued behind them run."""
        if not self._waiting:
            return
        now = self._ms()
        due = [
            s
            for s in self._waiting
            if s.block is not None and s.block[2] is not None and s.block[2] <= now
        ]
        due.sort(key=lambda s: (s.block[2], s.client_id))  # type: ignore[index]
        for session in due:
            kind = session.block[0]  # type: ignore[index]
            self._unblock(session)
            session._out.append(encode(0 if kind == "wait" else NIL_ARRAY))
            self._resume.append(session)
        self._run_resumed()

    # -- the loop --------------------------------------------------------------------------

    def _ms(self) -> int:
        return math.floor(self.clock() * 1000.0)

    def _drain(self, session: SimSession) -> None:
        parser = session._parser
        out = session._out
        while session.block is None and not session.closed:
            try:
                args = parser.next()
            except ProtocolError as exc:
                out.append(encode(Err(f"ERR Protocol error: {exc}")))
                session.close()
                return
            if args is None:
                break
            if not args:
                continue
            self._now_ms = self._ms()
            reply = self._execute(session, args)
            if reply is not _BLOCKED:
                out.append(encode(reply))
            if self._ready:
                self._serve_ready()
        self._run_resumed()

    def _run_resumed(self) -> None:
        if self._serving:
            return
        self._serving = True
        try:
            while self._resume:
                session = self._resume.pop(0)
                if not session.closed and session.block is None:
                    self._drain_inner(session)
        finally:
            self._serving = False

    def _drain_inner(self, session: SimSession) -> None:
        parser = session._parser
        out = session._out
        while session.block is None and not session.closed:
            try:
                args = parser.next()
            except ProtocolError as exc:
                out.append(encode(Err(f"ERR Protocol error: {exc}")))
                session.close()
                return
            if args is None:
                return
            if not args:
                continue
            self._now_ms = self._ms()
            reply = self._execute(session, args)
            if reply is not _BLOCKED:
                out.append(encode(reply))
            if self._ready:
                self._serve_ready()

    def _execute(self, session: SimSession, args: list[bytes]) -> Any:
        name = args[0].upper()
        self.commands += 1
        entry = self._table.get(name)
        if entry is None:
            shown = "".join(f"'{a.decode('utf-8', 'replace')}' " for a in args[1:])
            return Err(
                f"ERR unknown command '{args[0].decode('utf-8', 'replace')}', "
                f"with args beginning with: {shown}"
            )
        handler, arity = entry
        if (arity >= 0 and len(args) != arity) or (arity < 0 and len(args) < -arity):
            return Err(f"ERR wrong number of arguments for '{name.decode().lower()}' command")
        self._session = session
        return handler(args)

    def _script_call(self, args: list[bytes]) -> Any:
        name = args[0].upper()
        self.commands += 1
        entry = self._table.get(name)
        if entry is None:
            raise UnknownCommand
        handler, arity = entry
        if (arity >= 0 and len(args) != arity) or (arity < 0 and len(args) < -arity):
            raise BadArity
        if name in _NOT_IN_SCRIPT:
            if name == b"BLPOP" and self.engine == "valkey":
                return self._pop_now(args[1:-1], None)
            raise ScriptError("ERR This Redis command is not allowed from script")
        return handler(args)

    # -- blocking --------------------------------------------------------------------------

    def _block(self, kind: str, keys: list[bytes], timeout_ms: int, args: list[bytes]) -> Any:
        session = self._session
        deadline = None if timeout_ms == 0 else self._now_ms + timeout_ms
        session.block = [kind, keys, deadline, args]
        self._waiting.add(session)
        for key in keys:
            self._blocked_on.setdefault(key, deque()).append(session)
        return _BLOCKED

    def _unblock(self, session: SimSession) -> None:
        block = session.block
        session.block = None
        self._waiting.discard(session)
        if block is None:
            return
        for key in block[1]:
            queue = self._blocked_on.get(key)
            if queue is not None:
                with contextlib.suppress(ValueError):
                    queue.remove(session)
                if not queue:
                    del self._blocked_on[key]

    def _forget(self, session: SimSession) -> None:
        if session.block is not None:
            self._unblock(session)
        self._sessions.pop(session.client_id, None)
        session._out.clear()

    def _signal(self, key: bytes) -> None:
        if key in self._blocked_on:
            self._ready.append(key)

    def _serve_ready(self) -> None:
        while self._ready:
            key = self._ready.pop(0)
            queue = self._blocked_on.get(key)
            while queue:
                value = self.data.get(key)
                if type(value) is not list or not value or not self._live(key):
                    break
                session = queue[0]
                _kind, _keys, _deadline, args = session.block  # type: ignore[misc]
                self._unblock(session)
                self._now_ms = self._ms()
                if args[0].upper() == b"BLPOP":
                    reply: Any = self._pop_now([key], None)
                else:
                    self._session = session
                    reply = self._move(args[1], args[2], args[3].upper(), args[4].upper())
                session._out.append(encode(reply))
                self._resume.append(session)
                queue = self._blocked_on.get(key)

    # -- key space -------------------------------------------------------------------------

    def _live(self, key: bytes) -> bool:
        deadline = self.expires.get(key)
        if deadline is not None and deadline <= self._now_ms:
            del self.expires[key]
            self.data.pop(key, None)
            return False
        return key in self.data

    def _get(self, key: bytes) -> Any:
        deadline = self.expires.get(key)
        if deadline is not None and deadline <= self._now_ms:
            del self.expires[key]
            del self.data[key]
            return None
        return self.data.get(key)

    def _delete(self, key: bytes) -> bool:
        if self._get(key) is None:
            return False
        del self.data[key]
        self.expires.pop(key, None)
        return True

    # -- the command table -----------------------------------------------------------------

    def _build_table(self) -> dict[bytes, tuple[Callable[[list[bytes]], Any], int]]:
        return {
            b"PING": (self._ping, -1),
            b"ECHO": (lambda a: a[1], 2),
            b"AUTH": (lambda a: OK, -2),
            b"SELECT": (self._select, 2),
            b"INFO": (self._info, -1),
            b"ROLE": (lambda a: [b"master", 0, []], 1),
            b"TIME": (self._time, 1),
            b"CLIENT": (self._client, -2),
            b"WAIT": (self._wait, 3),
            b"EVAL": (self._eval, -3),
            b"EVALSHA": (self._evalsha, -3),
            b"SCRIPT": (self._script, -2),
            b"DBSIZE": (lambda a: len([k for k in list(self.data) if self._live(k)]), 1),
            b"FLUSHALL": (self._flushall, -1),
            b"FLUSHDB": (self._flushall, -1),
            b"GET": (self._cmd_get, 2),
            b"MGET": (self._mget, -2),
            b"SET": (self._set, -3),
            b"DEL": (self._del, -2),
            b"UNLINK": (self._del, -2),
            b"EXISTS": (self._exists, -2),
            b"TYPE": (self._type, 2),
            b"PEXPIRE": (self._pexpire, -3),
            b"EXPIRE": (self._expire, -3),
            b"PTTL": (self._pttl, 2),
            b"TTL": (self._ttl, 2),
            b"INCR": (self._incr, 2),
            b"HGET": (self._hget, 3),
            b"HSET": (self._hset, -4),
            b"HDEL": (self._hdel, -3),
            b"HGETALL": (self._hgetall, 2),
            b"RPUSH": (self._rpush, -3),
            b"LPUSH": (self._lpush, -3),
            b"LRANGE": (self._lrange, 4),
            b"LLEN": (self._llen, 2),
            b"LPOP": (self._lpop, -2),
            b"BLPOP": (self._blpop, -3),
            b"BLMOVE": (self._blmove, 6),
            b"LMOVE": (self._lmove, 5),
            b"ZADD": (self._zadd, -4),
            b"ZCARD": (self._zcard, 2),
            b"ZSCORE": (self._zscore, 3),
            b"ZREM": (self._zrem, -3),
            b"ZRANGE": (self._zrange, -4),
            b"ZRANGEBYSCORE": (self._zrangebyscore, -4),
            b"ZREMRANGEBYSCORE": (self._zremrangebyscore, 4),
        }

    # connection and server

    def _ping(self, a: list[bytes]) -> Any:
        if len(a) > 2:
            return Err("ERR wrong number of arguments for 'ping' command")
        return a[1] if len(a) == 2 else Status(b"PONG")

    def _select(self, a: list[bytes]) -> Any:
        db = _int(a[1])
        if db is None:
            return NOT_INT
        if db != 0:
            return Err("ERR DB index is out of range") if not 0 <= db < 16 else OK
        return OK

    def _info(self, a: list[bytes]) -> Any:
        uptime = int(self.clock() - self._started)
        redis_version, valkey_version = _VERSIONS[self.engine]
        lines = ["# Server", f"redis_version:{redis_version}"]
        if valkey_version is not None:
            lines += ["server_name:valkey", f"valkey_version:{valkey_version}"]
        lines += [
            "server_mode:standalone" if valkey_version else "redis_mode:standalone",
            f"process_id:{1000 + self._restarts}",
            f"run_id:{self.run_id}",
            f"server_time_usec:{math.floor(self.clock() * 1e6)}",
            f"uptime_in_seconds:{uptime}",
            f"uptime_in_days:{uptime // 86400}",
        ]
        return ("\r\n".join(lines) + "\r\n").encode()

    def _time(self, a: list[bytes]) -> Any:
        micros = math.floor(self.clock() * 1e6)
        seconds, rest = divmod(micros, 1_000_000)
        return [b"%d" % seconds, b"%d" % rest]

    def _client(self, a: list[bytes]) -> Any:
        sub = a[1].upper()
        if sub == b"ID" and len(a) == 2:
            return self._session.client_id
        if sub == b"UNBLOCK" and len(a) in (3, 4):
            target = _int(a[2])
            if target is None:
                return NOT_INT
            error = len(a) == 4 and a[3].upper() == b"ERROR"
            if len(a) == 4 and a[3].upper() not in (b"ERROR", b"TIMEOUT"):
                return Err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
            session = self._sessions.get(target)
            if session is None or session.block is None or session.block[0] != "list":
                return 0
            self._unblock(session)
            session._out.append(
                encode(Err("UNBLOCKED client unblocked via CLIENT UNBLOCK") if error else NIL_ARRAY)
            )
            self._resume.append(session)
            return 1
        if sub == b"SETNAME" and len(a) == 3:
            return OK
        return Err(f"ERR unknown subcommand '{a[1].decode('utf-8', 'replace')}'.")

    def _wait(self, a: list[bytes]) -> Any:
        replicas, timeout = _int(a[1]), _int(a[2])
        if replicas is None or timeout is None:
            return NOT_INT
        if timeout < 0:
            return Err("ERR timeout is negative")
        if replicas <= 0:
            return 0
        return self._block("wait", [], timeout, a)

    def _flushall(self, a: list[bytes]) -> Any:
        self.data.clear()
        self.expires.clear()
        return OK

    # scripts

    def _eval(self, a: list[bytes]) -> Any:
        sha = self.scripts.load(a[1])
        if type(sha) is Err:
            return sha
        return self._call_script(sha, a)  # type: ignore[arg-type]

    def _evalsha(self, a: list[bytes]) -> Any:
        sha = a[1].lower()
        if not self.scripts.exists(sha):
            if self.engine == "valkey":
                return Err("NOSCRIPT No matching script.")
            return Err("NOSCRIPT No matching script. Please use EVAL.")
        return self._call_script(sha, a)

    def _call_script(self, sha: bytes, a: list[bytes]) -> Any:
        numkeys = _int(a[2])
        if numkeys is None:
            return NOT_INT
        if numkeys < 0:
            return Err("ERR Number of keys can't be negative")
        if numkeys > len(a) - 3:
            return Err("ERR Number of keys can't be greater than number of args")
        if self.ran is not None and len(a) > 3 + numkeys:
            self.ran.add((sha, a[3 + numkeys]))
        waiter = b"-"
        if self.waiter_ids is not None and sha in self.waiter_shas and len(a) > 7 + numkeys:
            waiter = a[7 + numkeys].removeprefix(b"+")
            if waiter != b"-":
                self.waiter_ids[a[3 + numkeys]] = waiter
        result = self.scripts.run(sha, a[3 : 3 + numkeys], a[3 + numkeys :])
        if waiter != b"-" and isinstance(result, list) and result and result[0] == 0:
            self.refused_at[waiter] = self.true_now()
        return result

    def _script(self, a: list[bytes]) -> Any:
        sub = a[1].upper()
        if sub == b"LOAD" and len(a) == 3:
            return self.scripts.load(a[2])
        if sub == b"EXISTS" and len(a) >= 3:
            return [int(self.scripts.exists(sha)) for sha in a[2:]]
        if sub == b"FLUSH" and len(a) <= 3:
            self.scripts.flush()
            return OK
        return Err(f"ERR unknown subcommand '{a[1].decode('utf-8', 'replace')}'.")

    # strings and keys

    def _cmd_get(self, a: list[bytes]) -> Any:
        value = self._get(a[1])
        if value is None or type(value) is bytes:
            return value
        return WRONGTYPE

    def _mget(self, a: list[bytes]) -> Any:
        out = []
        for key in a[1:]:
            value = self._get(key)
            out.append(value if type(value) is bytes else None)
        return out

    def _set(self, a: list[bytes]) -> Any:
        key, value = a[1], a[2]
        nx = xx = keepttl = get = False
        expire_at: int | None = None
        i = 3
        n = len(a)
        while i < n:
            opt = a[i].upper()
            if opt == b"NX" and not xx:
                nx = True
            elif opt == b"XX" and not nx:
                xx = True
            elif opt == b"KEEPTTL" and expire_at is None:
                keepttl = True
            elif opt == b"GET":
                get = True
            elif opt in (b"PX", b"EX", b"PXAT", b"EXAT") and not keepttl and expire_at is None:
                if i + 1 >= n:
                    return SYNTAX
                amount = _int(a[i + 1])
                if amount is None:
                    return NOT_INT
                if amount <= 0:
                    return Err("ERR invalid expire time in 'set' command")
                if opt == b"PX":
                    expire_at = self._now_ms + amount
                elif opt == b"EX":
                    expire_at = self._now_ms + amount * 1000
                elif opt == b"PXAT":
                    expire_at = amount
                else:
                    expire_at = amount * 1000
                i += 1
            else:
                return SYNTAX
            i += 1
        old = self._get(key)
        if get and old is not None and type(old) is not bytes:
            return WRONGTYPE
        if (nx and old is not None) or (xx and old is None):
            return old if get else None
        self.data[key] = value
        if expire_at is not None:
            self.expires[key] = expire_at
        elif not keepttl:
            self.expires.pop(key, None)
        return old if get else OK

    def _del(self, a: list[bytes]) -> Any:
        return sum(1 for key in a[1:] if self._delete(key))

    def _exists(self, a: list[bytes]) -> Any:
        return sum(1 for key in a[1:] if self._get(key) is not None)

    def _type(self, a: list[bytes]) -> Any:
        value = self._get(a[1])
        kind = type(value)
        name = {bytes: b"string", list: b"list", dict: b"hash", ZSet: b"zset"}.get(kind, b"none")
        return Status(name)

    def _expire_generic(self, a: list[bytes], unit: int) -> Any:
        amount = _int(a[2])
        if amount is None:
            return NOT_INT
        flags = {arg.upper() for arg in a[3:]}
        if not flags <= {b"NX", b"XX", b"GT", b"LT"}:
            return Err(f"ERR Unsupported option {a[3].decode('utf-8', 'replace')}")
        key = a[1]
        if self._get(key) is None:
            return 0
        when = self._now_ms + amount * unit
        current = self.expires.get(key)
        if b"NX" in flags and current is not None:
            return 0
        if b"XX" in flags and current is None:
            return 0
        if b"GT" in flags and (current is None or when <= current):
            return 0
        if b"LT" in flags and current is not None and when >= current:
            return 0
        if when <= self._now_ms:
            self._delete(key)
            return 1
        self.expires[key] = when
        return 1

    def _pexpire(self, a: list[bytes]) -> Any:
        return self._expire_generic(a, 1)

    def _expire(self, a: list[bytes]) -> Any:
        return self._expire_generic(a, 1000)

    def _pttl(self, a: list[bytes]) -> Any:
        if self._get(a[1]) is None:
            return -2
        deadline = self.expires.get(a[1])
        return -1 if deadline is None else max(deadline - self._now_ms, 0)

    def _ttl(self, a: list[bytes]) -> Any:
        ms = self._pttl(a)
        return ms if ms < 0 else (ms + 500) // 1000

    def _incr(self, a: list[bytes]) -> Any:
        value = self._get(a[1])
        if value is not None and type(value) is not bytes:
            return WRONGTYPE
        number = 0 if value is None else _int(value)
        if number is None:
            return NOT_INT
        number += 1
        self.data[a[1]] = b"%d" % number
        return number

    # hashes

    def _hash(self, key: bytes, create: bool) -> Any:
        value = self._get(key)
        if value is None:
            if not create:
                return None
            value = self.data[key] = {}
        elif type(value) is not dict:
            return WRONGTYPE
        return value

    def _hget(self, a: list[bytes]) -> Any:
        h = self._hash(a[1], False)
        if h is None or h is WRONGTYPE:
            return h
        return h.get(a[2])

    def _hset(self, a: list[bytes]) -> Any:
        if len(a) % 2:
            return Err("ERR wrong number of arguments for 'hset' command")
        h = self._hash(a[1], True)
        if h is WRONGTYPE:
            return h
        added = 0
        for i in range(2, len(a), 2):
            if a[i] not in h:
                added += 1
            h[a[i]] = a[i + 1]
        return added

    def _hdel(self, a: list[bytes]) -> Any:
        h = self._hash(a[1], False)
        if h is None:
            return 0
        if h is WRONGTYPE:
            return h
        gone = sum(1 for field in a[2:] if h.pop(field, None) is not None)
        if not h:
            self._delete(a[1])
        return gone

    def _hgetall(self, a: list[bytes]) -> Any:
        h = self._hash(a[1], False)
        if h is None:
            return []
        if h is WRONGTYPE:
            return h
        return [x for pair in h.items() for x in pair]

    # lists

    def _list(self, key: bytes, create: bool) -> Any:
        value = self._get(key)
        if value is None:
            if not create:
                return None
            value = self.data[key] = []
        elif type(value) is not list:
            return WRONGTYPE
        return value

    def _rpush(self, a: list[bytes]) -> Any:
        items = self._list(a[1], True)
        if items is WRONGTYPE:
            return items
        items.extend(a[2:])
        self._signal(a[1])
        return len(items)

    def _lpush(self, a: list[bytes]) -> Any:
        items = self._list(a[1], True)
        if items is WRONGTYPE:
            return items
        for value in a[2:]:
            items.insert(0, value)
        self._signal(a[1])
        return len(items)

    def _lrange(self, a: list[bytes]) -> Any:
        start, stop = _int(a[2]), _int(a[3])
        if start is None or stop is None:
            return NOT_INT
        items = self._list(a[1], False)
        if items is None:
            return []
        if items is WRONGTYPE:
            return items
        start, stop = _slice(len(items), start, stop)
        if start > stop:
            return []
        return items[start : stop + 1]

    def _llen(self, a: list[bytes]) -> Any:
        items = self._list(a[1], False)
        if items is None:
            return 0
        return items if items is WRONGTYPE else len(items)

    def _lpop(self, a: list[bytes]) -> Any:
        if len(a) > 3:
            return SYNTAX
        items = self._list(a[1], False)
        if items is WRONGTYPE:
            return items
        if len(a) == 3:
            count = _int(a[2])
            if count is None or count < 0:
                return Err("ERR value is out of range, must be positive")
            if items is None:
                return NIL_ARRAY
            taken = items[:count]
            del items[:count]
            if not items:
                self._delete(a[1])
            return taken
        if items is None:
            return None
        value = items.pop(0)
        if not items:
            self._delete(a[1])
        return value

    def _timeout_ms(self, arg: bytes) -> int | Err:
        seconds = _float(arg)
        if seconds is None or math.isinf(seconds):
            return Err("ERR timeout is not a float or out of range")
        if seconds < 0:
            return Err("ERR timeout is negative")
        return int(seconds * 1000.0)

    def _pop_now(self, keys: list[bytes], _unused: object) -> Any:
        for key in keys:
            items = self._list(key, False)
            if items is WRONGTYPE:
                return items
            if items:
                value = items.pop(0)
                if not items:
                    self._delete(key)
                return [key, value]
        return NIL_ARRAY

    def _blpop(self, a: list[bytes]) -> Any:
        timeout = self._timeout_ms(a[-1])
        if type(timeout) is Err:
            return timeout
        keys = a[1:-1]
        reply = self._pop_now(keys, None)
        if reply is not NIL_ARRAY:
            return reply
        return self._block("list", keys, timeout, a)  # type: ignore[arg-type]

    def _move(self, source: bytes, target: bytes, where_from: bytes, where_to: bytes) -> Any:
        items = self._list(source, False)
        if items is WRONGTYPE:
            return items
        if not items:  # the engines look at the target's type only when there is an element
            return None
        dest = self._list(target, False)
        if dest is WRONGTYPE:
            return dest
        value = items.pop(0) if where_from == b"LEFT" else items.pop()
        if not items:
            self._delete(source)
        dest = self._list(target, True)
        if where_to == b"LEFT":
            dest.insert(0, value)
        else:
            dest.append(value)
        self._signal(target)
        return value

    def _lmove(self, a: list[bytes]) -> Any:
        where_from, where_to = a[3].upper(), a[4].upper()
        if where_from not in (b"LEFT", b"RIGHT") or where_to not in (b"LEFT", b"RIGHT"):
            return SYNTAX
        return self._move(a[1], a[2], where_from, where_to)

    def _blmove(self, a: list[bytes]) -> Any:
        where_from, where_to = a[3].upper(), a[4].upper()
        if where_from not in (b"LEFT", b"RIGHT") or where_to not in (b"LEFT", b"RIGHT"):
            return SYNTAX
        timeout = self._timeout_ms(a[5])
        if type(timeout) is Err:
            return timeout
        reply = self._move(a[1], a[2], where_from, where_to)
        if reply is not None:
            return reply
        return self._block("list", [a[1]], timeout, a)  # type: ignore[arg-type]

    # sorted sets

    def _zset(self, key: bytes, create: bool) -> Any:
        value = self._get(key)
        if value is None:
            if not create:
                return None
            value = self.data[key] = ZSet()
        elif type(value) is not ZSet:
            return WRONGTYPE
        return value

    def _zadd(self, a: list[bytes]) -> Any:
        i = 2
        flags: set[bytes] = set()
        while i < len(a) and a[i].upper() in (b"NX", b"XX", b"GT", b"LT", b"CH"):
            flags.add(a[i].upper())
            i += 1
        pairs = a[i:]
        if not pairs or len(pairs) % 2:
            return SYNTAX
        if b"NX" in flags and (b"XX" in flags or b"GT" in flags or b"LT" in flags):
            return Err(
                "ERR GT, LT, and/or NX options at the same time are not compatible"
                if b"XX" not in flags
                else "ERR XX and NX options at the same time are not compatible"
            )
        scores = []
        for j in range(0, len(pairs), 2):
            score = _float(pairs[j])
            if score is None:
                return NOT_FLOAT
            scores.append((score, pairs[j + 1]))
        z = self._zset(a[1], False)
        if z is WRONGTYPE:
            return z
        if z is None:
            if b"XX" in flags:
                return 0
            z = self._zset(a[1], True)
        added = changed = 0
        members = z.scores
        for score, member in scores:
            old = members.get(member)
            if old is None:
                if b"XX" in flags:
                    continue
                members[member] = score
                added += 1
            else:
                if b"NX" in flags:
                    continue
                if (b"GT" in flags and score <= old) or (b"LT" in flags and score >= old):
                    continue
                if old != score:
                    members[member] = score
                    changed += 1
        z.changed()
        if not members:
            self._delete(a[1])
        return added + changed if b"CH" in flags else added

    def _zcard(self, a: list[bytes]) -> Any:
        z = self._zset(a[1], False)
        if z is None:
            return 0
        return z if z is WRONGTYPE else len(z.scores)

    def _zscore(self, a: list[bytes]) -> Any:
        z = self._zset(a[1], False)
        if z is None or z is WRONGTYPE:
            return z
        score = z.scores.get(a[2])
        return None if score is None else format_double(score, self._g17)

    def _zrem(self, a: list[bytes]) -> Any:
        z = self._zset(a[1], False)
        if z is None:
            return 0
        if z is WRONGTYPE:
            return z
        gone = sum(1 for member in a[2:] if z.scores.pop(member, None) is not None)
        if gone:
            z.changed()
            if not z.scores:
                self._delete(a[1])
        return gone

    def _zrange(self, a: list[bytes]) -> Any:
        rest = [arg.upper() for arg in a[4:]]
        if any(opt in (b"BYSCORE", b"BYLEX", b"REV", b"LIMIT") for opt in rest):
            if rest == [b"BYSCORE"] or rest == [b"BYSCORE", b"WITHSCORES"]:
                return self._by_score(a[1], a[2], a[3], b"WITHSCORES" in rest, 0, -1)
            return Err("ERR the simulated server does not model this ZRANGE form")
        withscores = False
        for opt in rest:
            if opt == b"WITHSCORES":
                withscores = True
            else:
                return SYNTAX
        start, stop = _int(a[2]), _int(a[3])
        if start is None or stop is None:
            return NOT_INT
        z = self._zset(a[1], False)
        if z is None:
            return []
        if z is WRONGTYPE:
            return z
        order = z.order()
        start, stop = _slice(len(order), start, stop)
        if start > stop:
            return []
        return self._members(order[start : stop + 1], withscores)

    def _members(self, entries: list[tuple[float, bytes]], withscores: bool) -> list[bytes]:
        if not withscores:
            return [member for _, member in entries]
        out: list[bytes] = []
        for score, member in entries:
            out.append(member)
            out.append(format_double(score, self._g17))
        return out

    def _by_score(
        self, key: bytes, low: bytes, high: bytes, withscores: bool, offset: int, count: int
    ) -> Any:
        lo, hi = _range_bound(low), _range_bound(high)
        if lo is None or hi is None:
            return Err("ERR min or max is not a float")
        z = self._zset(key, False)
        if z is None:
            return []
        if z is WRONGTYPE:
            return z
        chosen = [
            entry
            for entry in z.order()
            if (entry[0] > lo[0] if lo[1] else entry[0] >= lo[0])
            and (entry[0] < hi[0] if hi[1] else entry[0] <= hi[0])
        ]
        if offset < 0:
            return []
        chosen = chosen[offset:] if count < 0 else chosen[offset : offset + count]
        return self._members(chosen, withscores)

    def _zrangebyscore(self, a: list[bytes]) -> Any:
        withscores = False
        offset, count = 0, -1
        i = 4
        while i < len(a):
            opt = a[i].upper()
            if opt == b"WITHSCORES":
                withscores = True
                i += 1
            elif opt == b"LIMIT" and i + 2 < len(a):
                o, c = _int(a[i + 1]), _int(a[i + 2])
                if o is None or c is None:
                    return NOT_INT
                offset, count = o, c
                i += 3
            else:
                return SYNTAX
        return self._by_score(a[1], a[2], a[3], withscores, offset, count)

    def _zremrangebyscore(self, a: list[bytes]) -> Any:
        lo, hi = _range_bound(a[2]), _range_bound(a[3])
        if lo is None or hi is None:
            return Err("ERR min or max is not a float")
        z = self._zset(a[1], False)
        if z is None:
            return 0
        if z is WRONGTYPE:
            return z
        gone = [
            member
            for score, member in z.order()
            if (score > lo[0] if lo[1] else score >= lo[0])
            and (score < hi[0] if hi[1] else score <= hi[0])
        ]
        for member in gone:
            del z.scores[member]
        if gone:
            z.changed()
            if not z.scores:
                self._delete(a[1])
        return len(gone)
