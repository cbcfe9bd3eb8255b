"""Decoding of script replies. Unknown shapes are errors, never success."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from .effects import Classify, Replicated
from .fencing import FENCE_MAX
from .quorum import Outcome

if TYPE_CHECKING:
    from .plan import LockPlan

R = TypeVar("R")


class ProtocolError(Exception):
    """A server answered something our scripts never return."""


@dataclass(frozen=True)
class AcquireReply:
    granted: bool
    fence: int  # the bumped fence register on a grant (exact, 1..FENCE_MAX), else 0
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


def _fence(value: object, script: str) -> int:
    """A fence from a script's reply (a decimal string: exact at any size), within
    1..:data:`~.fencing.FENCE_MAX`."""
    fence = _int(value)
    if not 0 < fence <= FENCE_MAX:
        raise ProtocolError(f"{script}: fence {fence} out of range 1..2^63 - 1")
    return fence


def decode_acquire(reply: object) -> AcquireReply:
    """``acquire.lua`` returns ``{1, fence}`` on a grant and ``{0, pttl_ms}`` when held."""
    if not isinstance(reply, list | tuple) or len(reply) != 2:
        raise ProtocolError(f"acquire: unexpected reply {reply!r}")
    flag = _int(reply[0])
    if flag == 1:
        return AcquireReply(True, _fence(reply[1], "acquire"), 0)
    value = _int(reply[1])
    if flag == 0:
        return AcquireReply(False, 0, value)
    raise ProtocolError(f"acquire: unknown flag {flag}")


def decode_slot_acquire(reply: object) -> AcquireReply:
    """``sem_acquire.lua`` returns ``{1, fence, slot}`` on a grant and ``{0, pttl_ms}`` when
    every slot is taken."""
    if isinstance(reply, list | tuple) and len(reply) == 3 and _int(reply[0]) == 1:
        fence, slot = _fence(reply[1], "sem_acquire"), _int(reply[2])
        if slot < 0:
            raise ProtocolError(f"sem_acquire: unexpected reply {reply!r}")
        return AcquireReply(True, fence, 0, slot)
    if isinstance(reply, list | tuple) and len(reply) == 2 and _int(reply[0]) == 0:
        return AcquireReply(False, 0, _int(reply[1]))
    raise ProtocolError(f"sem_acquire: unexpected reply {reply!r}")


@dataclass(frozen=True)
class OtherLimit:
    """``sem_acquire`` refused: permits of another ``limit`` of the same semaphore name may be
    valid on this server (``limit``: theirs, -1 when only a slot beyond ours showed it)."""

    limit: int


def classify_slot_acquire(result: object) -> tuple[Outcome, object]:
    """A vote from a sem_acquire reply (GRANTED carries the slot in its detail; an ERROR with
    an :class:`OtherLimit` detail when the server keeps another limit for the name)."""
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    if isinstance(result, list | tuple) and len(result) == 2 and result[0] == 2:
        try:
            return Outcome.ERROR, OtherLimit(_int(result[1]))
        except ProtocolError as exc:
            return Outcome.ERROR, exc
    return classify_decoded(result, decode_slot_acquire)


def decode_flag(reply: object, script: str) -> bool:
    """Scripts that answer 1 (done, it was ours) or 0 (not ours)."""
    value = _int(reply)
    if value == 1:
        return True
    if value == 0:
        return False
    raise ProtocolError(f"{script}: unexpected reply {reply!r}")


class _Decoded(Protocol):
    @property
    def granted(self) -> bool: ...


def _decoded(result: object, decode: Callable[[object], R]) -> R | BaseException:
    """What ``decode`` makes of ``result``, or the error: the one that replaced the reply, or
    the :class:`ProtocolError` saying why it is no reply."""
    if isinstance(result, BaseException):
        return result
    try:
        return decode(result)
    except ProtocolError as exc:
        return exc


def classify_decoded(
    result: object, decode: Callable[[object], _Decoded]
) -> tuple[Outcome, object]:
    """A vote from a reply that grants or refuses (or the error that replaced it): GRANTED or
    HELD with the reply ``decode`` made of it, ERROR with the error or why it is no reply."""
    reply = _decoded(result, decode)
    if isinstance(reply, BaseException):
        return Outcome.ERROR, reply
    return (Outcome.GRANTED if reply.granted else Outcome.HELD), reply


def classify_acquire(result: object) -> tuple[Outcome, object]:
    """A vote from an acquire reply (or the error that replaced it)."""
    return classify_decoded(result, decode_acquire)


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


def replica_count(role: object) -> int | None:
    """How many replicas a ``ROLE`` reply says its primary has; None when it is not a
    primary's reply (an error: an ACL without ``+role``; not asked; a replica's)."""
    if not isinstance(role, list) or len(role) < 3 or role[0] not in (b"master", "master"):
        return None
    listed = role[2]
    return len(listed) if isinstance(listed, list) else None


def replicated(
    classify: Classify, replicas: int, timeout_ms: int, *, held: bool = False
) -> Classify:
    """``classify`` for calls followed by ``WAIT replicas timeout_ms`` (and ``ROLE``): a
    GRANTED vote stands only with at least ``replicas`` acknowledgements; a refusal stands
    whatever the count (it wrote nothing); a ``WAIT`` the server refused is an ERROR vote.

    ``held``: the call is on a lease already granted (extend, release): it also stands when
    every replica the server has acknowledged it, even fewer than asked (none, say: a replica
    promoted after its primary died has none until one joins, and one that joins gets the
    write in its full sync). No failover can then lose it, which is what ``replicas`` is for;
    a new grant still needs ``replicas`` acknowledgements.
    """

    def classify_replicated(result: object) -> tuple[Outcome, object]:
        if not isinstance(result, Replicated):
            return classify(result)  # an error that replaced the call, or a bare reply
        outcome, detail = classify(result.reply)
        if outcome is not Outcome.GRANTED:
            return outcome, detail
        count = _decoded(result.acks, _int)
        if isinstance(count, BaseException):
            return Outcome.ERROR, count
        if count < replicas and not (held and count == replica_count(result.role)):
            return Outcome.ERROR, NotReplicated(count, replicas, timeout_ms)
        return outcome, detail

    return classify_replicated


#: The servers' default ``repl-timeout`` (ms): a primary lists a replica it cannot hear (a
#: partition) this long before it drops it. A lease shorter than that is lost (its extends
#: unconfirmed while the silent replica is listed) before its primary could list no replica
#: while that replica, cut off but alive, is promoted elsewhere.
REPL_TIMEOUT_MS = 60_000


def with_wait(plan: LockPlan, classify: Classify, *, held: bool = False) -> Classify:
    """``classify`` as it must be for ``plan``'s rounds that carry its ``WAIT`` (if any);
    ``held``: a round on a lease already granted (see :func:`replicated`), whose relaxed rule
    holds only for leases shorter than :data:`REPL_TIMEOUT_MS` (longer ones stay strict)."""
    wait = plan.wait
    if wait is None:
        return classify
    held = held and plan.ttl_ms < REPL_TIMEOUT_MS
    return replicated(classify, wait.replicas, wait.timeout_ms, held=held)
