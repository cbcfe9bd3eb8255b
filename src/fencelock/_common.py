"""Pieces both front ends share that are not pure algorithm: tokens, holder info, the mapping
from round results to votes and errors, and the per-context stack behind ``with lock``."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core.quorum import Outcome, Tally, summary
from ._core.replies import AcquireReply, ProtocolError, decode_acquire, decode_flag
from ._core.rounds import AcquireDecision, Status
from .errors import ConfigError, NotAcquired, ServerVote, Unavailable

TOKEN_BYTES = 20  # 160 random bits from the OS CSPRNG


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


_HOST = socket.gethostname()


_holder_prefix: dict[tuple[int, str | None], str] = {}


def holder_info(purpose: str | None) -> str:
    """What other processes see in ``fencelock status``: host, pid, purpose, wall-clock time.

    The constant part is encoded once per (pid, purpose); only the time is added per call.
    """
    pid = os.getpid()
    prefix = _holder_prefix.get((pid, purpose))
    if prefix is None:
        info: dict[str, Any] = {"host": _HOST, "pid": pid}
        if purpose:
            info["purpose"] = purpose
        prefix = json.dumps(info, separators=(",", ":"))[:-1] + ',"acquired_at":'
        _holder_prefix[(pid, purpose)] = prefix
    return f"{prefix}{time.time():.3f}}}"


def patience_ms(deadline: float, now: float) -> int:
    """How long a caller will still wait, in ms, for the acquire script (capped for infinity)."""
    return int(min(max(0.0, deadline - now), 2_000_000.0) * 1000)


def classify_acquire(result: object) -> tuple[Outcome, object]:
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    try:
        reply = decode_acquire(result)
    except ProtocolError as exc:
        return Outcome.ERROR, exc
    return (Outcome.GRANTED if reply.granted else Outcome.HELD), reply


def classify_flag(name: str) -> Any:
    def classify(result: object) -> tuple[Outcome, object]:
        if isinstance(result, BaseException):
            return Outcome.ERROR, result
        try:
            ok = decode_flag(result, name)
        except ProtocolError as exc:
            return Outcome.ERROR, exc
        return (Outcome.GRANTED if ok else Outcome.HELD), result

    return classify


def acquire_replies(tally: Tally) -> dict[int, AcquireReply]:
    return {
        i: detail
        for i, (outcome, detail) in tally.votes.items()
        if outcome is not Outcome.ERROR and isinstance(detail, AcquireReply)
    }


def votes(tally: Tally, names: Sequence[str]) -> list[ServerVote]:
    """The round's votes as evidence for errors, in server order."""
    result = []
    for index in range(tally.n):
        outcome, detail = tally.votes.get(index, (Outcome.ERROR, TimeoutError("no answer")))
        if outcome is Outcome.ERROR:
            cause = detail if isinstance(detail, BaseException) else RuntimeError(str(detail))
            result.append(ServerVote(names[index], "error", cause))
        elif outcome is Outcome.HELD:
            pttl = detail.pttl_ms if isinstance(detail, AcquireReply) else -1
            result.append(ServerVote(names[index], "held", None, pttl))
        else:
            result.append(ServerVote(names[index], "granted"))
    return result


def failure(
    key: str, decision: AcquireDecision, tally: Tally, names: Sequence[str], attempts: int
) -> NotAcquired | Unavailable:
    """The error for a failed acquire, carrying the last round's votes."""
    evidence = votes(tally, names)
    text = summary(key, tally)
    if decision.status is Status.CONTENTION:
        return NotAcquired(key, f"{text}: held by another holder", evidence, attempts)
    if decision.status is Status.TOO_SLOW:
        return Unavailable(key, f"{text}, but the round outlived the lease", evidence, attempts)
    return Unavailable(key, f"{text}: too few servers answered", evidence, attempts)


def needs_cleanup(tally: Tally) -> bool:
    """After a failed round: could our SET have landed anywhere (granted, or no clear answer)?"""
    return any(outcome is not Outcome.HELD for outcome, _ in tally.votes.values()) or (
        len(tally.votes) < tally.n
    )


# ``with lock as lease``: a stack of (lock id, lease) per thread / asyncio task. Tuples only, so
# a task that inherits its parent's context can never push onto the parent's stack.
_held: ContextVar[tuple[tuple[int, Any], ...]] = ContextVar("fencelock_held", default=())


def push_held(owner: object, lease: object) -> None:
    _held.set((*_held.get(), (id(owner), lease)))


def pop_held(owner: object) -> Any:
    stack = _held.get()
    for pos in range(len(stack) - 1, -1, -1):
        if stack[pos][0] == id(owner):
            _held.set(stack[:pos] + stack[pos + 1 :])
            return stack[pos][1]
    raise RuntimeError("__exit__ without a matching __enter__ in this thread or task")


def register_server(
    seen: dict[int, str], index: int, run_id: str, role: str, names: Sequence[str]
) -> None:
    """Record server ``index``'s identity, or raise :class:`ConfigError` if it is a replica or
    the same server as one already seen (``run_id`` catches ``localhost`` vs ``127.0.0.1``)."""
    for other, seen_id in seen.items():
        if seen_id == run_id and other != index:
            raise ConfigError(
                f"{names[index]} and {names[other]} are the same server (run_id {run_id[:8]}…)"
            )
    if role in ("slave", "replica"):
        raise ConfigError(f"{names[index]} is a replica; Redlock needs independent masters")
    seen[index] = run_id


def recheck_delay(exc: BaseException) -> float:
    """After a failed identity check, wait this long before checking that server again: a
    refused connection costs nothing and is retried at the next acquire; a timeout (a paused or
    overloaded server) costs a whole server timeout, so it is retried only after 2 s."""
    return 2.0 if isinstance(exc, TimeoutError | RedisTimeoutError) else 0.0
