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
    # counts kept as votes are recorded: a round asks won/lost after every reply
    _counts: dict[Outcome, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for outcome, _ in self.votes.values():
            self._counts[outcome] = self._counts.get(outcome, 0) + 1

    @property
    def needed(self) -> int:
        return majority(self.n)

    def record(self, index: int, outcome: Outcome, detail: object = None) -> None:
        if not 0 <= index < self.n:
            raise IndexError(f"server index {index} out of range for {self.n} servers")
        if index in self.votes:
            raise ValueError(f"server {index} already voted in this round")
        self.votes[index] = (outcome, detail)
        self._counts[outcome] = self._counts.get(outcome, 0) + 1

    def count(self, outcome: Outcome) -> int:
        return self._counts.get(outcome, 0)

    @property
    def granted(self) -> int:
        return self._counts.get(Outcome.GRANTED, 0)

    @property
    def pending(self) -> int:
        return self.n - len(self.votes)

    @property
    def won(self) -> bool:
        return self.granted >= self.needed

    @property
    def lost(self) -> bool:
        return self.granted + self.pending < self.needed

    @property
    def decided(self) -> bool:
        return self.won or self.lost

    @property
    def answered(self) -> int:
        """Servers that gave a real answer (granted or held), as opposed to an error."""
        return self.granted + self.count(Outcome.HELD)

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
