"""What both drivers send: scripts as EVALSHA where the server has them cached, else EVAL."""

from __future__ import annotations

from .._core.effects import Replicated, Wait
from .._scripts import BY_NAME, Script
from .resp import ReplyError, bulks, command
from .server import Server


class Calls:
    """Encoded script calls: EVALSHA when the server is known to have the script, EVAL with the
    full source otherwise (which also caches it there); the constant part of each call
    (command, script, keys) is encoded once."""

    __slots__ = ("_prefixes",)

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, bool, tuple[str, ...], int], bytes] = {}

    def encode(
        self, server: Server, name: str, keys: tuple[str, ...], args: tuple[str | int, ...]
    ) -> tuple[Script, bytes]:
        script, head = self.head(server, name, keys, len(args))
        return script, head + bulks(args)

    def head(
        self, server: Server, name: str, keys: tuple[str, ...], nargs: int
    ) -> tuple[Script, bytes]:
        """The script and the encoded call up to its ``nargs`` arguments (which follow as
        :func:`~fencelock._engine.resp.bulks`): the same for every server that has the
        script cached, so a round encodes its arguments once."""
        script = BY_NAME[name]
        loaded = script.sha in server.loaded
        cache_key = (name, loaded, keys, nargs)
        prefix = self._prefixes.get(cache_key)
        if prefix is None:
            if len(self._prefixes) >= PREFIXES_MAX:
                self._prefixes.clear()
            head = command(
                "EVALSHA" if loaded else "EVAL",
                script.sha if loaded else script.source,
                _numkeys(script, keys),
                *keys,
            )
            # the array header counts the arguments that follow
            count = 3 + len(keys) + nargs
            prefix = b"*%d\r\n" % count + head[head.index(b"\r\n") + 2 :]
            self._prefixes[cache_key] = prefix
        return script, prefix


#: Encoded call prefixes kept, at the most (one per script, keys and server cache state).
PREFIXES_MAX = 4096

#: The process's encoder, shared by every driver.
CALLS = Calls()


def full_call(script: Script, keys: tuple[str, ...], args: tuple[str | int, ...]) -> bytes:
    return command("EVAL", script.source, _numkeys(script, keys), *keys, *args)


def _numkeys(script: Script, keys: tuple[str, ...]) -> int:
    return len(keys) if script.variadic else script.numkeys


def is_readonly(reply: object) -> bool:
    """A write refused by a replica: a Sentinel-managed master was demoted under us."""
    return isinstance(reply, ReplyError) and reply.kind == "READONLY"


def is_noscript(reply: object) -> bool:
    return isinstance(reply, ReplyError) and reply.kind == "NOSCRIPT"


PING = command("PING")
CLIENT_ID = command("CLIENT", "ID")


def client_id(reply: object) -> int | None:
    """The connection's id from a ``CLIENT ID`` reply (None: refused, e.g. by an ACL)."""
    return reply if isinstance(reply, int) and not isinstance(reply, bool) else None


_NO_TAIL = (b"", 1)


_ROLE = command("ROLE")


def wait_tail(wait: Wait | None) -> tuple[bytes, int]:
    """What follows a script call in its pipeline, and the replies the pipeline produces."""
    if wait is None:
        return _NO_TAIL
    # ROLE after the WAIT: how many replicas the server has (a lease's extend and release
    # count when every one of them acknowledged, if fewer than asked: a promoted primary)
    return command("WAIT", wait.replicas, wait.timeout_ms) + _ROLE, 3


def wake_call(key: str, claim: str | None, delay_s: float) -> bytes:
    """The blocking read a :class:`~fencelock._core.effects.Pause` waits on for a release's
    wake-up, for at most ``delay_s``: ``BLPOP`` of the wake list ``key``, or with ``claim``
    ``BLMOVE`` of its element to that list (a waiter claiming a grant handed over to it)."""
    timeout = f"{delay_s:.3f}"
    if claim is None:
        return command("BLPOP", key, timeout)
    return command("BLMOVE", key, claim, "LEFT", "RIGHT", timeout)


def answer(replies: list[object]) -> object:
    """The vote material of a script call's replies: the bare reply, or with a trailing
    ``WAIT`` both as a :class:`Replicated`."""
    if len(replies) == 3:
        return Replicated(replies[0], replies[1], replies[2])
    if len(replies) == 2:
        return Replicated(replies[0], replies[1])
    return replies[0]
