"""Decoding of script replies. Unknown shapes are errors, never success."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .effects import Classify, Replicated
from .quorum import Outcome

if TYPE_CHECKING:
    from .plan import LockPlan


class ProtocolError(Exception):
    """A server answered something our scripts never return."""


@dataclass(frozen=True)
class AcquireReply:
    granted: bool
    fence: int  # the bumped fence register on a grant, else 0
    pttl_ms: int  # the other holder's remaining lease on a refusal (-1 unknown), else 0
    slot: int = 0  # the semaphore slot granted (sem_acquire), else 0


def _int(value: object) -> int:
    if isinstance(value, bool):
        raise ProtocolError(f"unexpected boolean {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            raise ProtocolError(f"not an integer: {value!r}") from None
    raise ProtocolError(f"unexpected reply element {value!r}")


def decode_acquire(reply: object) -> AcquireReply:
    """``acquire.lua`` returns ``{1, fence}`` on a grant and ``{0, pttl_ms}`` when held."""
    if not isinstance(reply, list | tuple) or len(reply) != 2:
        raise ProtocolError(f"acquire: unexpected reply {reply!r}")
    flag, value = _int(reply[0]), _int(reply[1])
    if flag == 1:
        if value <= 0:
            raise ProtocolError(f"acquire: non-positive fence {value}")
        return AcquireReply(True, value, 0)
    if flag == 0:
        return AcquireReply(False, 0, value)
    raise ProtocolError(f"acquire: unknown flag {flag}")


def decode_slot_acquire(reply: object) -> AcquireReply:
    """``sem_acquire.lua`` returns ``{1, fence, slot}`` on a grant and ``{0, pttl_ms}`` when
    every slot is taken."""
    if isinstance(reply, list | tuple) and len(reply) == 3 and _int(reply[0]) == 1:
        fence, slot = _int(reply[1]), _int(reply[2])
        if fence <= 0 or slot < 0:
            raise ProtocolError(f"sem_acquire: unexpected reply {reply!r}")
        return AcquireReply(True, fence, 0, slot)
    if isinstance(reply, list | tuple) and len(reply) == 2 and _int(reply[0]) == 0:
        return AcquireReply(False, 0, _int(reply[1]))
    raise ProtocolError(f"sem_acquire: unexpected reply {reply!r}")


def classify_slot_acquire(result: object) -> tuple[Outcome, object]:
    """A vote from a sem_acquire reply (GRANTED carries the slot in its detail)."""
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    try:
        reply = decode_slot_acquire(result)
    except ProtocolError as exc:
        return Outcome.ERROR, exc
    return (Outcome.GRANTED if reply.granted else Outcome.HELD), reply


def decode_flag(reply: object, script: str) -> bool:
    """Scripts that answer 1 (done, it was ours) or 0 (not ours)."""
    value = _int(reply)
    if value == 1:
        return True
    if value == 0:
        return False
    raise ProtocolError(f"{script}: unexpected reply {reply!r}")


def classify_acquire(result: object) -> tuple[Outcome, object]:
    """A vote from an acquire reply (or the error that replaced it)."""
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    try:
        reply = decode_acquire(result)
    except ProtocolError as exc:
        return Outcome.ERROR, exc
    return (Outcome.GRANTED if reply.granted else Outcome.HELD), reply


def _flag_classifier(script: str) -> Callable[[object], tuple[Outcome, object]]:
    def classify(result: object) -> tuple[Outcome, object]:
        if isinstance(result, BaseException):
            return Outcome.ERROR, result
        try:
            ok = decode_flag(result, script)
        except ProtocolError as exc:
            return Outcome.ERROR, exc
        return (Outcome.GRANTED if ok else Outcome.HELD), result

    return classify


classify_release = _flag_classifier("release")
classify_extend = _flag_classifier("extend")
classify_commit = _flag_classifier("fence_commit")


def classify_handshake(result: object) -> tuple[Outcome, object]:
    """A vote from an ``Identify`` handshake: any reply counts as an answer."""
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    return Outcome.GRANTED, result


classify_announce = _flag_classifier("elect_announce")


class NotReplicated(Exception):
    """A server granted, but fewer of its replicas than asked acknowledged it in time: the
    grant would not survive a failover, so it does not count (and is released like any other
    leftover of a failed round)."""

    def __init__(self, acks: int, replicas: int, timeout_ms: int) -> None:
        super().__init__(
            f"WAIT: {acks} of {replicas} replica(s) acknowledged within {timeout_ms} ms"
        )
        self.acks = acks
        self.replicas = replicas


def replicated(classify: Classify, replicas: int, timeout_ms: int) -> Classify:
    """``classify`` for calls followed by ``WAIT replicas timeout_ms``: a GRANTED vote stands
    only with at least ``replicas`` acknowledgements; a refusal stands whatever the count (it
    wrote nothing); a ``WAIT`` the server refused is an ERROR vote."""

    def classify_replicated(result: object) -> tuple[Outcome, object]:
        if not isinstance(result, Replicated):
            return classify(result)  # an error that replaced the call, or a bare reply
        outcome, detail = classify(result.reply)
        if outcome is not Outcome.GRANTED:
            return outcome, detail
        acks = result.acks
        if isinstance(acks, BaseException):
            return Outcome.ERROR, acks
        try:
            count = _int(acks)
        except ProtocolError as exc:
            return Outcome.ERROR, exc
        if count < replicas:
            return Outcome.ERROR, NotReplicated(count, replicas, timeout_ms)
        return outcome, detail

    return classify_replicated


def with_wait(plan: LockPlan, classify: Classify) -> Classify:
    """``classify`` as it must be for ``plan``'s rounds that carry its ``WAIT`` (if any)."""
    wait = plan.wait
    if wait is None:
        return classify
    return replicated(classify, wait.replicas, wait.timeout_ms)
