"""Per-server health: a server that failed is suspect, skipped by rounds, probed in the background.

A server that timed out (paused, black-holed, overloaded) or refused a connection would cost
every later round the same wait or the same failed connect; while it is suspect, rounds record
it at once as :class:`~fencelock._core.effects.NotSent` and a background probe checks it with
growing delays until it answers again.
"""

from __future__ import annotations

from dataclasses import dataclass

from .quorum import Tally

#: First probe this long (s) after a server became suspect; doubled up to PROBE_MAX_S.
PROBE_FIRST_S = 0.05
PROBE_MAX_S = 0.5


@dataclass(slots=True)
class Health:
    """Health of one server; every method takes ``now`` (monotonic seconds)."""

    suspect_since: float | None = None
    reason: str = ""
    next_probe_at: float = 0.0
    probe_delay_s: float = PROBE_FIRST_S

    @property
    def suspect(self) -> bool:
        return self.suspect_since is not None

    def failed(self, now: float, reason: str) -> bool:
        """A call failed (timeout, refused, reset). Returns True when it just became suspect."""
        if self.suspect_since is not None:
            return False
        self.suspect_since = now
        self.reason = reason
        self.probe_delay_s = PROBE_FIRST_S
        self.next_probe_at = now + PROBE_FIRST_S
        return True

    def answered(self) -> None:
        """A call or a probe got an answer: the server is healthy again."""
        self.suspect_since = None
        self.reason = ""

    def probe_due(self, now: float) -> bool:
        return self.suspect_since is not None and now >= self.next_probe_at

    def probe_failed(self, now: float) -> None:
        self.probe_delay_s = min(PROBE_MAX_S, self.probe_delay_s * 2)
        self.next_probe_at = now + self.probe_delay_s


def skip_suspects(tally: Tally, targets: tuple[int, ...], suspect: tuple[bool, ...]) -> bool:
    """Whether a round may leave its suspect targets out: only while the others can still
    make the majority. With a majority suspect, asking everyone costs at most one server
    timeout and is the only way the round can succeed (the servers may be back already).
    A server whose grant will not count (``tally.muted``: in its restart delay) is no healthy
    voter: counting it would leave out the suspects the round needs."""
    muted = tally.muted
    healthy = sum(1 for index in targets if not suspect[index] and index not in muted)
    return tally.granted + healthy >= tally.needed
