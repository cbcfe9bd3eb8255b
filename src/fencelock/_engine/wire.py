"""What both drivers send: scripts as EVALSHA where the server has them cached, else EVAL."""

from __future__ import annotations

from .._scripts import BY_NAME, Script
from .resp import ReplyError, command
from .server import Server


def script_call(
    server: Server, name: str, keys: tuple[str, ...], args: tuple[str | int, ...]
) -> tuple[Script, bytes]:
    """The encoded call of script ``name``: EVALSHA when ``server`` is known to have it,
    EVAL with the full source otherwise (which also caches it there)."""
    script = BY_NAME[name]
    if script.sha in server.loaded:
        return script, command("EVALSHA", script.sha, _numkeys(script, keys), *keys, *args)
    return script, full_call(script, keys, args)


def full_call(script: Script, keys: tuple[str, ...], args: tuple[str | int, ...]) -> bytes:
    return command("EVAL", script.source, _numkeys(script, keys), *keys, *args)


def _numkeys(script: Script, keys: tuple[str, ...]) -> int:
    return len(keys) if script.variadic else script.numkeys


def is_noscript(reply: object) -> bool:
    return isinstance(reply, ReplyError) and reply.kind == "NOSCRIPT"


def as_result(reply: object) -> object:
    """A reply as a round's result: an error reply becomes the exception it is."""
    return reply


PING = command("PING")
