"""The effects a flow yields, and what the driver answers to each.

A flow is a generator: it yields an effect, the driver performs it (sockets, clocks, sleeps) and
sends the answer back in. The drivers decide nothing; every choice (which servers, when to stop
a round, what a reply means) is carried by the effect itself, so one flow serves both front ends.

- ``NOW``: the driver reads the monotonic clock; answer: float seconds.
- ``Broadcast``: runs one script on every target server in parallel, recording each vote with
  ``classify`` until ``stop(tally)`` holds or the budget ends; answer: None (votes go to the
  broadcast's ``tally``).
- ``SETTLE``: waits for the last broadcast's stragglers, to its deadline; answer: None.
- ``Settle``: the same for at most ``within_s`` seconds: stragglers still silent then stay
  stragglers (no vote is recorded for them, nothing is judged); answer: None.
- ``Pause``: sleeps up to ``delay_s``, woken early by a wake element; answer: True if woken;
  with ``claim``, the element itself (``bytes``; it was moved to the ``claim`` list) or None.
  With ``stop``, the pause also ends (not woken, no element) once ``stop()`` is true, looked
  at every :data:`STOP_CHECK_S` at the least; a claim the server made meanwhile is answered.
  Only the blocking front end gives a ``stop`` (an asyncio caller cancels its task); the
  asyncio driver refuses a pause with one rather than ignore it.
  If the wait is interrupted after the server may have moved an element, the driver finds out
  (it half-closes the connection and reads what came) and raises :class:`ClaimInterrupted`
  carrying the element, so that the flow can give back what it claimed.
- ``Repeat``: repeats a script in the background on servers that did not answer, until one
  answer more than the first (or ``until_s``); answer: None.
- ``IDENTITIES``: each server's last known identity, no I/O; answer: a tuple (None: unknown).
- ``Identify``: connects, in parallel within ``budget_s``, to the servers whose identity is
  unknown and that are not suspect; answer: as for ``IDENTITIES``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .quorum import Outcome, Tally

Classify = Callable[[object], "tuple[Outcome, object]"]
StopRule = Callable[[Tally], bool]
T = TypeVar("T")


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NOW = _Marker("NOW")
SETTLE = _Marker("SETTLE")
IDENTITIES = _Marker("IDENTITIES")


@dataclass(frozen=True, slots=True)
class Settle:
    """Wait for the last broadcast's stragglers at most ``within_s`` seconds (and never past
    the round's deadline); those still silent then stay stragglers, without a vote."""

    within_s: float


@dataclass(frozen=True, slots=True)
class Identify:
    """Learn the identity of the servers not known yet (their connection handshake), so that
    the independence of N servers is judged before any lock traffic. Costs nothing once every
    server was seen, or for servers that are suspect."""

    budget_s: float


@dataclass(frozen=True, slots=True)
class Wait:
    """``WAIT replicas timeout_ms``, sent on the same connection right after a script call:
    the server answers how many of its replicas acknowledged every write before it."""

    replicas: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Replicated:
    """What ``classify`` is given for a call that carried a :class:`Wait`: the script's
    ``reply``, the ``WAIT`` reply (``acks``: an int, or the server's error) and the ``ROLE``
    reply that follows it (``role``: which replicas the server has; None when not asked)."""

    reply: object
    acks: object
    role: object = None


#: What :attr:`Broadcast.late` is given for a call whose reply can no longer be heard: its
#: outcome is unknown, so whatever it may have taken is released.
UNHEARD: object = object()


# Not frozen, unlike the other effects: a flow builds two or three per acquire and release,
# and a frozen dataclass's __init__ costs about five times a plain one's. Nothing changes a
# Broadcast once it is yielded, but for its ``land`` and ``late`` (see below).
@dataclass(slots=True)
class Broadcast:
    """Run ``script`` (a name from ``fencelock._scripts``) on ``targets`` (server indexes).

    - ``stop``: the round ends as soon as it is true (None: when every target answered);
    - ``budget_s``: the round ends at the latest this long after it started; targets still silent
      then are recorded as ``Outcome.ERROR`` with a :class:`TimeoutError`;
    - ``tally``: where the votes go (the flow may pre-record servers it does not target);
    - ``land``: a straggler that answers NOSCRIPT after the round ended runs the script in full
      anyway (a grant must land on every live server); False for rounds whose stragglers must
      not take effect late. The one field a flow may change after the yield: it turns ``land``
      off once it gives the round up (a failed or interrupted attempt, whose cleanup releases
      what landed), and the drivers read it when the NOSCRIPT comes, not when they park the
      round;
    - ``late``: what a reply that comes after the round was parked (a straggler's) calls for:
      the driver calls it with the server's index and the reply (as ``classify`` is given
      it) and hands the :class:`Repeat` it returns, if any, to the background as it does a
      flow's. None (the default): nothing. Like ``land``, a flow sets it once it gives the
      round up: a late grant of a given-up attempt is released there (see
      :func:`~fencelock._core.acquire.give_up`). Called with :data:`UNHEARD` for a call
      that ended without a reply (the asyncio driver: abandoned, its connection lost, its
      task cancelled, or its loop shut down with it still out): the ``Repeat`` then goes out
      at once and again after the driver's hearing window (its request may still land);
    - ``wait``: each call is followed by this ``WAIT`` in the same pipeline, and ``classify``
      gets a :class:`Replicated` (reply and acknowledgements) instead of the bare reply.
    """

    script: str
    targets: tuple[int, ...]
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    classify: Classify
    stop: StopRule | None
    budget_s: float
    tally: Tally
    land: bool = True
    wait: Wait | None = None
    late: Callable[[int, object], Repeat | None] | None = None


#: Longest a :class:`Pause` with a ``stop`` goes without looking at it (s): how late a
#: cancelled wait ends.
STOP_CHECK_S = 0.05


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep up to ``delay_s``; ``wake`` = (server index, list key) to block on instead;
    ``claim``: move the element to this list (``BLMOVE``) rather than pop it (``BLPOP``);
    ``stop``: end early once it returns True (the blocking request stays the one sent: a
    waiter keeps its place in the server's queue until then), answered as a pause that ran
    out, or with the element a claim got meanwhile."""

    delay_s: float
    wake: tuple[int, str] | None = None
    claim: str | None = None
    stop: Callable[[], bool] | None = None


class ClaimInterrupted(BaseException):
    """Raised by a driver into the flow when a claiming :class:`Pause` was interrupted (a
    KeyboardInterrupt, a cancellation) after the server had moved ``element`` for us; the flow
    gives the claim back and raises ``cause``."""

    def __init__(self, element: bytes, cause: BaseException) -> None:
        super().__init__(element, cause)
        self.element = element
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Repeat:
    """Repeat ``script`` on ``targets`` in the background until each answered twice, or
    ``until_s`` seconds from now (the keys have expired by then anyway); and so again from
    each later delay in ``at_s`` (s from now; a request that may still land late is outlasted
    by repeats spaced out over its lease, :func:`~.acquire.late_release`)."""

    script: str
    targets: tuple[int, ...]
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    until_s: float
    at_s: tuple[float, ...] = (0.0,)


Effect = _Marker | Broadcast | Pause | Repeat | Identify | Settle


class NotSent(ConnectionError):
    """The driver did not send the command: the server is suspect (it timed out recently and
    is being probed in the background). Nothing can have landed there."""


class Identity(Protocol):
    """What the driver knows of a server (from its connection handshake)."""

    @property
    def run_id(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def restarted_at(self) -> float | None:
        """Monotonic s when the server restarted, if this process saw its run_id change."""
        ...


Flow = Generator[Effect, Any, T]
"""A flow: yields effects, receives their answers, returns a verdict of type ``T``."""
