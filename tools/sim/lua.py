"""The Lua scripting of the simulated server: the project's real scripts on Lua 5.1 (``lupa``).

Why ``lupa`` directly and not ``fakeredis``: fakeredis's key expiry and ``TIME`` read the host's
wall clock (``time.time()``) inside the library, with no hook to give each simulated server its
own clock (offset, drift, jumps) or to freeze time for a step; its server is one shared object
per "server" name without run ids, restarts that wipe or keep data, blocked-client FIFO order
under our control, or ``CLIENT UNBLOCK`` of a client we schedule. What the simulation needs
from it is only its Lua bridge, and that bridge is small: this module is that bridge, with
Redis's conversion rules checked against real Valkey 8 and Redis 7 by
``tests/sim/test_differential.py``. ``lupa.lua51`` gives Lua 5.1, the Lua both engines embed.

The rules (as both engines apply them; checked by the differential test):

- ``redis.call`` arguments: strings as they are, numbers in their shortest form (``1.5``,
  ``30000``), anything else an error (the engines word it differently).
- Command replies to Lua: integer -> number, bulk -> string, nil -> ``false``, array -> table,
  status -> ``{ok=...}``, error -> raised as ``{err=...}`` by ``redis.call``, returned by
  ``redis.pcall``.
- Script results to the client: number -> integer (truncated toward zero), string -> bulk,
  ``true`` -> 1, ``false``/nil -> nil, a table with a string ``err`` -> error, with a string
  ``ok`` -> status, any other table -> array of its elements up to the first nil.
- An error raised out of the script: ``<message> script: <sha>, on @user_script:<line>.``
  (a Lua runtime error's message gets ``ERR`` in front).
- Globals are read-only (``Attempt to modify a readonly table``); ``KEYS`` and ``ARGV``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from lupa import lua51  # type: ignore[import-untyped]

from .resp import NIL_ARRAY, Err, Status

__all__ = ["ScriptError", "Scripts", "lua_arg"]

# The Lua side: the sandbox, redis.*, the runner with the error handler.
_BOOT = r"""
local pycall, pyraise, errtext, sha1hex = ...
local allowed = {
  'assert', 'error', 'ipairs', 'next', 'pairs', 'pcall', 'rawequal', 'rawget', 'rawset',
  'select', 'tonumber', 'tostring', 'type', 'unpack', 'xpcall', 'getmetatable',
  'setmetatable',
}
local env = {}
for _, name in ipairs(allowed) do env[name] = _G[name] end
for _, lib in ipairs({'string', 'math', 'table'}) do
  local copy = {}
  for k, v in pairs(_G[lib]) do copy[k] = v end
  env[lib] = copy
end
env._G = env
local redis = {}
local function pcall_(...)
  local value, err, status = pycall(true, ...)
  if err ~= nil then return {err = err} end
  if status ~= nil then return {ok = status} end
  return value
end
-- a C-level function (a Python callable), so that `return redis.call(...)` keeps the
-- script's frame and the error names the script's line, as the engines' C redis.call does
redis.call = pyraise
redis.pcall = pcall_
redis.error_reply = function(msg)
  if type(msg) ~= 'string' then error('wrong number or type of arguments', 2) end
  if string.sub(msg, 1, 1) == '-' then msg = string.sub(msg, 2) end
  return {err = msg}
end
redis.status_reply = function(msg)
  if type(msg) ~= 'string' then error('wrong number or type of arguments', 2) end
  return {ok = msg}
end
redis.sha1hex = function(text) return sha1hex(text) end
redis.log = function() end
redis.setresp = function() end
redis.set_repl = function() end
redis.replicate_commands = function() return true end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE = 0, 1, 2
redis.REPL_REPLICA, redis.REPL_ALL = 2, 3
env.redis = redis
local readonly = {
  __newindex = function() error('Attempt to modify a readonly table', 2) end,
}
setmetatable(env, readonly)

local function compile(source)
  local f, message = loadstring(source, '@user_script')
  if not f then return nil, message end
  setfenv(f, env)
  return f, false
end

local function where(e)
  local level = 2
  while true do
    local info = debug.getinfo(level, 'Sl')
    if not info then return 0 end
    if info.source == '@user_script' then return info.currentline end
    level = level + 1
  end
end

local function handler(e)
  local line = where(e)
  if type(e) == 'userdata' then
    local message = errtext(e)
    if message then return {false, message, line} end
  end
  if type(e) == 'table' then
    if type(e.err) == 'string' then return {false, e.err, line} end
    return {false, 'ERR unknown error', line}
  end
  return {true, tostring(e), line}
end

local function run(f, nkeys, ...)
  local keys, argv = {}, {}
  local args = {...}
  for i = 1, nkeys do keys[i] = args[i] end
  for i = nkeys + 1, #args do argv[i - nkeys] = args[i] end
  rawset(env, 'KEYS', keys)
  rawset(env, 'ARGV', argv)
  return xpcall(f, handler)
end
return compile, run
"""

_ENGINE_TEXT = {
    "valkey": {
        "args": "ERR Command arguments must be strings or integers",
        "unknown": "ERR Unknown command called from script",
        "arity": "ERR Wrong number of args calling command from script",
        "noargs": "ERR Please specify at least one argument for this call",
    },
    "redis": {
        "args": "ERR Lua redis lib command arguments must be strings or integers",
        "unknown": "ERR Unknown Redis command called from script",
        "arity": "ERR Wrong number of args calling Redis command from script",
        "noargs": "ERR Please specify at least one argument for this redis lib call",
    },
}


class ScriptError(Exception):
    """A command a script called failed in a way the engine reports as a script error."""


class CallError(Exception):
    """What ``redis.call`` raises into the script: the failed command's error text."""

    def __init__(self, message: bytes) -> None:
        super().__init__(message)
        self.message = message


class UnknownCommand(Exception):
    """The command a script called does not exist."""


class BadArity(Exception):
    """The command a script called got the wrong number of arguments."""


def lua_arg(value: object, *, g17: bool = False) -> bytes | None:
    """A ``redis.call`` argument as the command sees it; None: not a string or a number.

    A non-integer number: Redis 7.0 prints ``%.17g`` (``g17``: ``0.10000000000000001``), Valkey
    the shortest form that reads back (``0.1``; below 1e-4 Valkey prints positional digits
    where Python's form has an exponent: not modelled, the library sends no such number)."""
    if type(value) is bytes:
        return value
    if type(value) is int:
        return b"%d" % value
    if type(value) is float:
        if value.is_integer() and abs(value) < 1e17:
            return b"%d" % int(value)
        return (b"%.17g" % value) if g17 else repr(value).encode()
    return None


def _to_int(number: float) -> int:
    """A Lua number as the engines reply it: a C cast to long long (truncation; out of range
    gives the minimum, as x86-64's conversion does)."""
    if number != number or number >= 9.2233720368547758e18 or number < -9.2233720368547758e18:
        return -(2**63)
    return int(number)


class Scripts:
    """Compiled scripts by SHA1 and the runtime that runs them.

    ``dispatch(args, *, script=True)`` runs one command for a script and returns its reply
    (``resp`` values); it raises :class:`UnknownCommand` / :class:`BadArity` for a command
    that does not exist / has the wrong arity, and returns :class:`~tools.sim.resp.Err` for
    any other failure.
    """

    def __init__(self, dispatch: Callable[[list[bytes]], Any], *, engine: str) -> None:
        self._dispatch = dispatch
        self._text = _ENGINE_TEXT[engine]
        self._g17 = engine == "redis"
        self._lua = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self._table_from = self._lua.table_from
        compile_, run = self._lua.execute(
            _BOOT, self._pycall, self._pyraise, self._errtext, self._sha1hex
        )
        self._compile = compile_
        self._run = run
        self._lua_type = lua51.lua_type
        self._by_sha: dict[bytes, Any] = {}

    # -- the cache -------------------------------------------------------------------------

    def load(self, source: bytes) -> bytes | Err:
        """Compile and cache ``source``; its SHA1 (lowercase hex, bytes), or the compile error."""
        sha = hashlib.sha1(source).hexdigest().encode()
        if sha in self._by_sha:
            return sha
        function, message = self._compile(source)
        if function is None or function is False:
            text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
            return Err(f"ERR Error compiling script (new function): {text}")
        self._by_sha[sha] = function
        return sha

    def exists(self, sha: bytes) -> bool:
        return sha.lower() in self._by_sha

    def flush(self) -> None:
        self._by_sha.clear()

    # -- running ---------------------------------------------------------------------------

    def run(self, sha: bytes, keys: list[bytes], args: list[bytes]) -> Any:
        """Run the cached script ``sha`` (lowercase hex) and return its reply (``resp`` values);
        None for an unknown sha is the caller's business (:meth:`exists` first)."""
        function = self._by_sha[sha]
        result = self._run(function, len(keys), *keys, *args)
        ok, value = result[0], result[1]
        if ok:
            return self._reply(value)
        is_runtime, message, line = value[1], value[2], value[3]
        text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
        if is_runtime:
            text = "ERR " + text
        return Err(f"{text} script: {sha.decode()}, on @user_script:{int(line)}.")

    def _reply(self, value: Any) -> Any:
        kind = type(value)
        if kind is bytes:
            return value
        if kind is int:
            return value
        if kind is float:
            return _to_int(value)
        if value is None or value is False:
            return None
        if value is True:
            return 1
        if self._lua_type(value) == "table":
            err = value[b"err"]
            if type(err) is bytes:
                return Err(err.decode("utf-8", "replace"))
            ok = value[b"ok"]
            if type(ok) is bytes:
                return Status(ok)
            items = []
            index = 1
            while True:
                item = value[index]
                if item is None:
                    break
                items.append(self._reply(item))
                index += 1
            return items
        return None  # functions, userdata: nil, as the engines reply them

    # -- the bridge ------------------------------------------------------------------------

    def _sha1hex(self, text: object) -> bytes:
        data = lua_arg(text)
        return hashlib.sha1(data if data is not None else b"").hexdigest().encode()

    def _pycall(self, protected: bool, *values: object) -> Any:
        if not values:
            return self._raise(protected, self._text["noargs"])
        args: list[bytes] = []
        g17 = self._g17
        for value in values:
            arg = lua_arg(value, g17=g17)
            if arg is None:
                return self._raise(protected, self._text["args"])
            args.append(arg)
        try:
            reply = self._dispatch(args)
        except UnknownCommand:
            return self._raise(protected, self._text["unknown"])
        except BadArity:
            return self._raise(protected, self._text["arity"])
        except ScriptError as exc:
            return self._raise(protected, str(exc))
        return self._to_lua(reply)

    def _raise(self, protected: bool, message: str) -> tuple[None, bytes]:
        if not protected:
            raise CallError(message.encode())
        return None, message.encode()

    def _pyraise(self, *values: object) -> Any:
        reply = self._pycall(False, *values)
        if type(reply) is tuple:
            if reply[1] is not None:
                raise CallError(reply[1])
            return self._table_from({b"ok": reply[2]})
        return reply

    @staticmethod
    def _errtext(error: object) -> bytes | bool:
        return error.message if isinstance(error, CallError) else False

    def _to_lua(self, reply: Any) -> Any:
        kind = type(reply)
        if kind is bytes or kind is int:
            return reply
        if reply is None or reply is NIL_ARRAY:
            return False
        if kind is list:
            return self._table_from([self._item(item) for item in reply])
        if kind is Status:
            return None, None, bytes(reply)
        if kind is Err:
            return None, reply.message.encode()
        raise TypeError(f"not a reply: {reply!r}")

    def _item(self, reply: Any) -> Any:
        kind = type(reply)
        if kind is bytes or kind is int:
            return reply
        if reply is None or reply is NIL_ARRAY:
            return False
        if kind is list:
            return self._table_from([self._item(item) for item in reply])
        if kind is Status:
            return self._table_from({b"ok": bytes(reply)})
        if kind is Err:
            return self._table_from({b"err": reply.message.encode()})
        raise TypeError(f"not a reply: {reply!r}")
