"""Votes and the tally that decides a round, early, both ways.

A round (acquire, extend, release, fence commit) asks every server; the tally says as soon as
the majority is won or can no longer be won, so a round need not wait for stragglers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Outcome(str, Enum):
    """What one server answered in one round."""

    GRANTED = "granted"  # the operation took effect for us on this server
    HELD = "held"  # another holder has the key (acquire) / the key is not ours (extend, release)
    ERROR = "error"  # no usable answer: timeout, refused connection, unexpected reply


def majority(n: int) -> int:
    """Servers needed for a majority of ``n``: ``n // 2 + 1``."""
    if n < 1:
        raise ValueError("a round needs at least one server")
    return n // 2 + 1


@dataclass
class Tally:
    """Counts votes of one round over ``n`` servers.

    ``won`` once a majority granted; ``lost`` once the remaining servers cannot make a majority;
    ``decided`` when either holds. Votes are recorded by server index, at most once each.
    """

    n: int
    votes: dict[int, tuple[Outcome, object]] = field(default_factory=dict)
    #: Servers whose grant will not count in this round (``restart_delay``: seen restarting
    #: less than a ttl ago). Set before the round is sent: they are not healthy voters, so a
    #: round does not leave suspect servers out counting on them.
    muted: frozenset[int] = field(default_factory=frozenset, compare=False)
    # kept as votes are recorded (a round asks won/lost after every reply): the majority, and
    # the count of each outcome (plain ints: an Enum key hashes in Python)
    needed: int = field(init=False, repr=False, compare=False)
    granted: int = field(init=False, repr=False, compare=False)
    _held: int = field(init=False, repr=False, compare=False)
    _errors: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.needed = majority(self.n)
        self.granted = self._held = self._errors = 0
        for outcome, _ in self.votes.values():
            self._count(outcome)

    def _count(self, outcome: Outcome) -> None:
        if outcome is Outcome.GRANTED:
            self.granted += 1
        elif outcome is Outcome.HELD:
            self._held += 1
        else:
            self._errors += 1

    def record(self, index: int, outcome: Outcome, detail: object = None) -> None:
        if not 0 <= index < self.n:
            raise IndexError(f"server index {index} out of range for {self.n} servers")
        votes = self.votes
        if index in votes:
            raise ValueError(f"server {index} already voted in this round")
        votes[index] = (outcome, detail)
        self._count(outcome)

    def count(self, outcome: Outcome) -> int:
        if outcome is Outcome.GRANTED:
            return self.granted
        if outcome is Outcome.HELD:
            return self._held
        return self._errors

    @property
    def pending(self) -> int:
        return self.n - len(self.votes)

    @property
    def won(self) -> bool:
        return self.granted >= self.needed

    @property
    def lost(self) -> bool:
        return self.granted + self.n - len(self.votes) < self.needed

    @property
    def decided(self) -> bool:
        return self.won or self.lost

    @property
    def answered(self) -> int:
        """Servers that gave a real answer (granted or held), as opposed to an error."""
        return self.granted + self._held

    def granted_indexes(self) -> list[int]:
        return sorted(i for i, (o, _) in self.votes.items() if o is Outcome.GRANTED)

    def details(self, outcome: Outcome) -> list[object]:
        return [d for o, d in self.votes.values() if o is outcome]


def contention_or_unavailable(tally: Tally) -> str:
    """Why a lost round was lost: ``"contention"`` if enough servers answered that the lock was
    simply held, ``"unavailable"`` if too few answered at all to reach a majority."""
    return "contention" if tally.answered >= tally.needed else "unavailable"


def summary(key: str, tally: Tally) -> str:
    """Human summary, e.g. ``'invoices:42': 2/5 servers agreed, majority is 3``."""
    return f"{key!r}: {tally.granted}/{tally.n} servers agreed, majority is {tally.needed}"
