"""Who we are: random tokens, and the holder info other processes see in ``fencelock status``."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

TOKEN_BYTES = 16  # 128 random bits from the OS CSPRNG (DESIGN.md: at least 128)
_HOST = socket.gethostname()
_prefix: dict[tuple[int, str | None], str] = {}

#: Random bytes read from the OS CSPRNG at once: 256 tokens per read instead of a system call
#: per token (three per acquire + release: the token, the waiter id, a release's offer).
POOL_BYTES = 4096

#: Tokens not handed out yet; ``list.pop`` takes one atomically (threads, and a signal handler
#: that acquires or releases while new_token() runs, never get the same one).
_tokens: list[str] = []


def _after_fork_in_child() -> None:
    # the child must not hand out the tokens the parent has not used yet: they would be the
    # parent's next tokens too (two holders with one token)
    global _tokens
    _tokens = []


os.register_at_fork(after_in_child=_after_fork_in_child)


def new_token() -> str:
    """32 hex digits: 128 bits from the OS CSPRNG, read :data:`POOL_BYTES` at a time, each
    bit used once (a forked child reads its own)."""
    tokens = _tokens
    try:
        return tokens.pop()
    except IndexError:
        return _refill()


def _refill() -> str:
    global _tokens
    data = os.urandom(POOL_BYTES)
    fresh = [data[at : at + TOKEN_BYTES].hex() for at in range(0, POOL_BYTES, TOKEN_BYTES)]
    # (a refill interrupted by another, in a signal handler or a thread, drops one of the two
    # lists: unused tokens are thrown away, never handed out twice)
    _tokens = fresh
    return fresh.pop()


def holder_info(purpose: str | None) -> str:
    """Host, pid, purpose and wall-clock time as compact JSON; the constant part is encoded once
    per (pid, purpose)."""
    pid = os.getpid()
    prefix = _prefix.get((pid, purpose))
    if prefix is None:
        info: dict[str, Any] = {"host": _HOST, "pid": pid}
        if purpose:
            info["purpose"] = purpose
        prefix = json.dumps(info, separators=(",", ":"))[:-1] + ',"acquired_at":'
        _prefix[(pid, purpose)] = prefix
    return f"{prefix}{time.time():.3f}}}"
