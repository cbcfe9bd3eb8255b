"""From a round's tally to what the caller sees: votes as evidence, errors that name the key and
the counts, and the independence check of N servers (the same server twice, a replica)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError, NotAcquired, ServerVote, Unavailable
from .effects import Identity, NotSent
from .quorum import Outcome, Tally, summary
from .replies import AcquireReply
from .rounds import AcquireDecision, Status


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


#: What a server says when the user's ACL refuses a command: directly (``NOPERM``), or inside
#: a script (Valkey: "ACL failure in script"; Redis 7: "The user executing the script can't
#: run this command or subcommand" / "... can't access at least one of the keys").
_ACL_REFUSALS = ("NOPERM", "ACL failure", "user executing the script can't")


def acl_refused(tally: Tally) -> bool:
    """True when some server refused the round's command for the user's ACL."""
    for outcome, detail in tally.votes.values():
        if outcome is Outcome.ERROR and isinstance(detail, BaseException):
            text = str(detail)
            if any(marker in text for marker in _ACL_REFUSALS):
                return True
    return False


ACL_HINT = (
    "the server's ACL refused a command (NOPERM): the user needs every command fencelock sends "
    "and its scripts call, on fencelock:* keys (the least-privilege ACL SETUSER line is in "
    "docs/deploying.md; `fencelock doctor` names what is missing)"
)


def outage(tally: Tally, what: str) -> str:
    """Why a round failed for want of answers: ``what``, or the ACL refusal when there is one."""
    return ACL_HINT if acl_refused(tally) else what


def acquire_failure(
    key: str, decision: AcquireDecision, tally: Tally, names: Sequence[str], attempts: int
) -> NotAcquired | Unavailable:
    """The error for a failed acquire, carrying the last round's votes."""
    evidence = votes(tally, names)
    text = summary(key, tally)
    if decision.status is Status.CONTENTION:
        return NotAcquired(key, f"{text}: held by another holder", evidence, attempts)
    if decision.status is Status.TOO_SLOW:
        return Unavailable(key, f"{text}, but the round outlived the lease", evidence, attempts)
    reason = outage(tally, "too few servers answered")
    return Unavailable(key, f"{text}: {reason}", evidence, attempts)


def may_have_landed(tally: Tally) -> tuple[int, ...]:
    """Servers where a failed round's command may have taken effect: every server that did not
    answer "held", except those it was never sent to."""
    return tuple(
        index
        for index in range(tally.n)
        if not _surely_absent(tally.votes.get(index, (Outcome.ERROR, None)))
    )


def _surely_absent(vote: tuple[Outcome, object]) -> bool:
    outcome, detail = vote
    return outcome is Outcome.HELD or isinstance(detail, NotSent)


def silent(tally: Tally) -> tuple[int, ...]:
    """Servers that gave no usable answer in the round (sent, but no reply)."""
    return tuple(
        index
        for index, (outcome, detail) in sorted(tally.votes.items())
        if outcome is Outcome.ERROR and not isinstance(detail, NotSent)
    )


def first_held(tally: Tally) -> int | None:
    """A server that answered "held": a waiter blocks on its wake list."""
    held = [i for i, (outcome, _) in tally.votes.items() if outcome is Outcome.HELD]
    return min(held) if held else None


class RestartDelay(RuntimeError):
    """A server's grant that does not count: it restarted (its ``run_id`` changed) less than
    the lock's ttl ago, so it may have forgotten a lease that is still valid elsewhere."""


def restarting(
    identities: Sequence[Identity | None], now_s: float, ttl_ms: int
) -> dict[int, float]:
    """Servers that restarted less than ``ttl_ms`` ago (index -> seconds since the restart).

    A server restarted without persistence forgot the leases it had granted, and its fence
    register; a key it grants again could form a second majority beside a lease still valid
    on the others (and, with clocks skewed, a smaller fence). Once the longest lease granted
    before the restart has run out (uptime > ttl), its votes count again (antirez's "delayed
    restart"). Only a restart this process saw (a changed run_id) is known.
    """
    result = {}
    for index, identity in enumerate(identities):
        restarted_at = None if identity is None else identity.restarted_at
        if restarted_at is not None and (now_s - restarted_at) * 1000.0 < ttl_ms:
            result[index] = max(0.0, now_s - restarted_at)
    return result


def without_restarted(
    tally: Tally, recent: dict[int, float], names: Sequence[str], ttl_ms: int
) -> Tally:
    """The tally with the grants of recently restarted servers turned into errors (a
    :class:`RestartDelay` cause): they do not count, and the cleanup still releases them."""
    counted = Tally(tally.n)
    for index, (outcome, detail) in tally.votes.items():
        if outcome is Outcome.GRANTED and index in recent:
            cause = RestartDelay(
                f"{names[index]} restarted {recent[index]:.1f} s ago: no vote until its uptime "
                f"exceeds the ttl ({ttl_ms / 1000:g} s) (restart_delay)"
            )
            counted.record(index, Outcome.ERROR, cause)
        else:
            counted.record(index, outcome, detail)
    return counted


def independence_problem(
    identities: Sequence[Identity | None], names: Sequence[str]
) -> ConfigError | None:
    """N > 1 independent masters: a :class:`ConfigError` when two names are the same server
    (same ``run_id``: ``localhost`` vs ``127.0.0.1``) or one is a replica; unknown identities
    (not connected yet, or hidden by an ACL) are not judged."""
    if len(identities) < 2:
        return None
    seen: dict[str, int] = {}
    for index, identity in enumerate(identities):
        if identity is None:
            continue
        if identity.role in ("slave", "replica"):
            return ConfigError(f"{names[index]} is a replica; Redlock needs independent masters")
        run_id = identity.run_id
        if run_id and run_id in seen:
            other = seen[run_id]
            return ConfigError(
                f"{names[index]} and {names[other]} are the same server (run_id {run_id[:8]}…)"
            )
        if run_id:
            seen[run_id] = index
    return None
