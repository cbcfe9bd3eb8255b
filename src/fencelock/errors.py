"""The exception hierarchy.

Every exception fencelock raises on purpose derives from :class:`FencelockError`.
The leaves carry evidence: the key, and for network outcomes each server's vote.

- :class:`ConfigError` (also a :class:`ValueError`): bad input, raised before any I/O.
- :class:`NotAcquired`: others hold the lock (contention) when the wait ran out.
- :class:`Unavailable`: too few servers answered in time to reach a majority.
- :class:`LockLost`: a lease could not be released, extended or renewed because
  it had already expired or been taken.
- :class:`StaleFence`: a storage guard refused a write carrying an older fence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class FencelockError(Exception):
    """Base class of every error fencelock raises on purpose."""


class ConfigError(FencelockError, ValueError):
    """Invalid configuration or argument; raised before anything is sent to a server."""


@dataclass(frozen=True)
class ServerVote:
    """One server's answer in one round.

    ``outcome`` is ``"granted"``, ``"held"`` (another holder has it) or ``"error"``;
    ``cause`` is the error for ``"error"`` votes, ``pttl_ms`` the holder's remaining
    lease in milliseconds for ``"held"`` votes (-1 when unknown).
    """

    server: str
    outcome: str
    cause: BaseException | None = None
    pttl_ms: int = -1

    def describe(self) -> str:
        if self.outcome == "error":
            return f"{self.server}: error ({type(self.cause).__name__}: {self.cause})"
        if self.outcome == "held":
            return f"{self.server}: held by another (expires in {self.pttl_ms} ms)"
        return f"{self.server}: {self.outcome}"


class _RoundError(FencelockError):
    """An error that carries the votes of the last round (shared by NotAcquired / Unavailable)."""

    def __init__(
        self,
        key: str,
        message: str,
        votes: Sequence[ServerVote] = (),
        attempts: int = 0,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.votes: tuple[ServerVote, ...] = tuple(votes)
        self.attempts = attempts

    def __reduce__(self) -> tuple[object, ...]:
        # picklable with its evidence (process pools, Celery's pickled results)
        return (type(self), (self.key, Exception.__str__(self), self.votes, self.attempts))

    @property
    def causes(self) -> dict[str, BaseException]:
        """Each failing server's cause, by server name (password-free)."""
        return {v.server: v.cause for v in self.votes if v.cause is not None}

    def __str__(self) -> str:
        base = super().__str__()
        if not self.votes:
            return base
        return base + "; " + "; ".join(v.describe() for v in self.votes)


class NotAcquired(_RoundError):
    """The lock is held by someone else and the wait ran out (contention, not failure)."""


class Unavailable(_RoundError):
    """Too few servers answered in time to reach a majority; :attr:`causes` says why."""


class LockLost(FencelockError):
    """The lease is no longer ours: it expired, was taken, or could not be confirmed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.key, str(self)))


class StaleFence(FencelockError):
    """A storage guard refused a write: ``offered`` is older than ``current``."""

    def __init__(self, resource: str, offered: int, current: int) -> None:
        super().__init__(
            f"{resource!r}: fence {offered} refused, a newer fence {current} was already accepted"
        )
        self.resource = resource
        self.offered = offered
        self.current = current

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.resource, self.offered, self.current))


class InsecureTLSWarning(UserWarning):
    """A ``rediss://`` URL turns off part of the server's authentication
    (``ssl_cert_reqs=none`` or ``ssl_check_hostname=false``): the traffic is encrypted, but a
    machine in the path can pose as the server and read the password and the tokens."""
