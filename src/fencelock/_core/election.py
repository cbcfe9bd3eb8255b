"""Elections, written once: the leader is the holder of the election's lock, its term the
lock's fence.

- A new leader announces itself: its name and term go into the holder info beside the lock
  (same TTL, renewed and deleted with the lock), and every registered observer is woken.
- ``leader()`` reads the lock and its info on every server: a leader is known when one token
  holds a majority and its info names it; its ``remaining`` is what is left on the majority
  with the most time, counted from before the read (minus the drift allowance).
- An observer registers itself with each read and blocks on its own wake list on one server
  (one where a term held on a majority is not named yet, if the read found one: its
  announcement is still on its way there); announcements (and the end of a term by a
  resignation) push to every registered list. The end of a term by expiry (a killed or
  paused leader) sends nothing: the observer then wakes at the leader's ``remaining``; a poll
  at most every ``poll_s`` covers a lost wake-up (its wake server down when the change was
  announced).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import Unavailable
from .effects import NOW, Broadcast, Flow, Pause
from .holder_json import parse_holder
from .plan import LockPlan
from .quorum import Outcome, Tally, summary
from .replies import ProtocolError, classify_announce, with_wait
from .verdicts import votes

#: An observer's registration lasts this long (ms) after its last read; it reads at least
#: every poll period, so a live observer stays registered and a gone one is dropped soon.
OBSERVER_LIFETIME_MS = 30_000
#: An observer wakes this long (s) after the leader's lease would run out, to see its end.
EXPIRY_SLACK_S = 0.01


@dataclass(frozen=True, slots=True)
class Leader:
    """The current leader of an election: its ``name``, its term number ``fence`` (the lock's
    fence: strictly larger for each new leader) and the seconds its term has ``remaining``
    (as read; a live leader renews it)."""

    name: str
    fence: int
    remaining: float

    @property
    def term(self) -> tuple[str, int]:
        """What identifies a term: (name, fence); ``remaining`` changes within a term."""
        return (self.name, self.fence)


@dataclass(frozen=True, slots=True)
class HolderRead:
    """One server's answer to ``elect_read``: token ('' when free), PTTL ms, holder info."""

    token: str
    pttl_ms: int
    info: dict[str, object] | None


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    raise ProtocolError(f"elect_read: unexpected element {value!r}")


def decode_read(reply: object) -> HolderRead:
    if not isinstance(reply, list | tuple) or len(reply) != 3:
        raise ProtocolError(f"elect_read: unexpected reply {reply!r}")
    token, pttl, raw = _text(reply[0]), reply[1], _text(reply[2])
    if isinstance(pttl, bool) or not isinstance(pttl, int):
        raise ProtocolError(f"elect_read: unexpected pttl {pttl!r}")
    info: dict[str, object] | None = None
    if raw:
        info = parse_holder(raw)
    return HolderRead(token, pttl, info)


def classify_read(result: object) -> tuple[Outcome, object]:
    """Any answer counts (GRANTED = this server could be read); errors do not."""
    if isinstance(result, BaseException):
        return Outcome.ERROR, result
    try:
        return Outcome.GRANTED, decode_read(result)
    except ProtocolError as exc:
        return Outcome.ERROR, exc


def leader_info(holder: str, name: str, fence: int) -> str:
    """The holder info of a leader: its lock holder info (JSON) plus ``leader`` and ``term``."""
    info = (parse_holder(holder) if holder else None) or {}
    info["leader"] = name
    info["term"] = fence
    return json.dumps(info, separators=(",", ":"))


def _holders(tally: Tally) -> dict[str, list[HolderRead]]:
    rows: dict[str, list[HolderRead]] = {}
    for outcome, detail in tally.votes.values():
        if outcome is Outcome.GRANTED and isinstance(detail, HolderRead) and detail.token:
            rows.setdefault(detail.token, []).append(detail)
    return rows


def may_hide_leader(tally: Tally) -> bool:
    """No token holds a majority of the answers, but one could with the servers that did not
    answer: a read that cannot tell "nobody leads" from "a leader holds a majority that
    includes the silent servers" (one heard holder plus the silent ones, or, with as many
    silent servers as a majority, a holder not heard at all)."""
    rows = _holders(tally)
    silent = tally.n - tally.granted
    if any(len(held) >= tally.needed for held in rows.values()):
        return False
    best = max((len(held) for held in rows.values()), default=0)
    return best + silent >= tally.needed


def decide_leader(plan: LockPlan, tally: Tally, elapsed_ms: float) -> Leader | None:
    """The leader a read found: the token held on a majority whose info names it; None when
    no token holds a majority or the holder has not announced itself (yet)."""
    rows = _holders(tally)
    for held in rows.values():
        if len(held) < tally.needed:
            continue
        named = [row.info for row in held if row.info is not None and "leader" in row.info]
        if not named:
            return None
        info = named[0]
        name, fence = info.get("leader"), info.get("term")
        if not isinstance(name, str) or isinstance(fence, bool) or not isinstance(fence, int):
            return None
        # valid while a majority still holds it: the needed-th longest PTTL
        pttls = sorted((max(0, row.pttl_ms) for row in held), reverse=True)
        left_ms = pttls[tally.needed - 1] - elapsed_ms - plan.drift_ms(plan.ttl_ms)
        return Leader(name, fence, max(0.0, left_ms / 1000.0))
    return None


@dataclass(frozen=True, slots=True)
class LeaderView:
    """A read: ``leader`` (None: nobody leads), and a server that answered (to block on)."""

    leader: Leader | None
    answered: int


def read_leader(plan: LockPlan, observer: str = "") -> Flow[LeaderView]:
    """Read the leader on every server; raises :class:`~fencelock.Unavailable` when the
    answers cannot tell who leads: fewer than a majority answered, or no token holds a
    majority of the answers but one could with the servers that did not answer
    (:func:`may_hide_leader`: "nobody leads" would be a guess)."""
    start: float = yield NOW
    tally = Tally(plan.n)
    yield Broadcast(
        "elect_read",
        plan.everyone,
        plan.election_keys,
        (observer, OBSERVER_LIFETIME_MS),
        classify_read,
        None,
        plan.budget_s,
        tally,
        land=False,
    )
    if tally.granted < tally.needed:
        text = summary(plan.key, tally).replace("agreed", "answered")
        raise Unavailable(plan.key, f"{text}: leader unknown", votes(tally, plan.names))
    if may_hide_leader(tally):
        text = summary(plan.key, tally).replace("agreed", "answered")
        raise Unavailable(
            plan.key,
            f"{text}: leader unknown (a holder could have a majority with the servers that "
            "did not answer)",
            votes(tally, plan.names),
        )
    now: float = yield NOW
    leader = decide_leader(plan, tally, (now - start) * 1000.0)
    return LeaderView(leader, _wake_server(tally) if leader is None else tally.granted_indexes()[0])


def _wake_server(tally: Tally) -> int:
    """The server an observer that saw nobody lead blocks on: one where a token held on a
    majority is not named yet, when there is one (its announcement is on its way there and
    will wake the observer; elsewhere it may have run already, before this read got there),
    else the first that answered."""
    for token, held in _holders(tally).items():
        if len(held) < tally.needed:
            continue
        for index, (_, detail) in sorted(tally.votes.items()):
            if (
                isinstance(detail, HolderRead)
                and detail.token == token
                and (detail.info is None or "leader" not in detail.info)
            ):
                return index
    return tally.granted_indexes()[0]


def announce(plan: LockPlan, token: str, info: str) -> Flow[bool]:
    """Name the leader beside its lock on every server and wake the observers; True when a
    majority took it (False: the term is still valid, but readers may not see its name).
    With ``replicas=k`` a server took it only once ``WAIT`` saw it on k replicas (a failover
    then keeps the name beside the term, as it keeps the term)."""
    tally = Tally(plan.n)
    yield Broadcast(
        "elect_announce",
        plan.everyone,
        plan.election_keys,
        (token, info, plan.wake_ms),
        with_wait(plan, classify_announce),
        None,
        plan.budget_s,
        tally,
        wait=plan.wait,
    )
    return tally.won


def term_ended(plan: LockPlan) -> Flow[None]:
    """Wake every observer after a term ended on purpose (a resignation, a finished block)."""
    tally = Tally(plan.n)
    yield Broadcast(
        "elect_announce",
        plan.everyone,
        plan.election_keys,
        ("", "", plan.wake_ms),
        classify_announce,
        None,
        plan.budget_s,
        tally,
        land=False,
    )


@dataclass(frozen=True, slots=True)
class Change:
    """What an observer saw: a new ``leader`` (or None: nobody leads), or ``timed_out``."""

    leader: Leader | None
    timed_out: bool = False


def next_change(
    plan: LockPlan,
    observer: str,
    last: tuple[str, int] | bool | None,
    until: float,
    *,
    poll_s: float,
) -> Flow[Change]:
    """Wait for the leader to differ from ``last`` (a term, None for "nobody", False for
    "nothing seen yet") until ``until`` (monotonic s); woken by announcements.

    Raises :class:`~fencelock.Unavailable` as soon as a read cannot tell who leads (see
    :func:`read_leader`): the last value seen no longer stands, and "nobody" would be a guess.
    """
    wake_key = f"{plan.keys.observers}:{observer}"
    while True:
        view = yield from read_leader(plan, observer)
        leader = view.leader
        seen = None if leader is None else leader.term
        if last is False or seen != last:
            return Change(leader)
        delay = poll_s if leader is None else min(poll_s, leader.remaining + EXPIRY_SLACK_S)
        wake = (view.answered, wake_key)
        now: float = yield NOW
        if now >= until:
            return Change(None, timed_out=True)
        yield Pause(min(delay, until - now), wake)
